// Regenerates the xo_*.xml fixtures the way Xen Orchestra's xen-api 4.x
// formats calls (@vates/xml-rpc + @vates/xml, integers sent as strings):
//   npm install @vates/xml-rpc@1.0.0 @vates/xml@2.0.0 && node gen_xo.js
const fs = require('fs')
const { formatXml } = require('@vates/xml/format')
const { xmlRpcFormatter } = require('@vates/xml-rpc/formatter')

function prepare(param) {
  if (Number.isInteger(param)) return String(param)
  if (typeof param !== 'object' || param === null) return param
  if (Array.isArray(param)) return param.map(prepare)
  if (param instanceof Date || Buffer.isBuffer(param)) return param
  const values = {}
  for (const k of Object.keys(param)) if (param[k] !== undefined) values[k] = prepare(param[k])
  return values
}
function write(name, method, args) {
  const xml = formatXml(xmlRpcFormatter.format_methodCall({ methodName: method, params: prepare(args) }), { indent: 0 })
  fs.writeFileSync(name, xml)
}
write('xo_login.xml', 'session.login_with_password', ['root', 'pa&ss<w>rd"\''])
write('xo_event_from.xml', 'event.from', ['OpaqueRef:s', ['VM', 'host'], '', 60.1])
write('xo_set_other_config.xml', 'VM.set_other_config', ['OpaqueRef:s', 'OpaqueRef:vm', {
  a: 'b', n: 42, e: '', t: true, f: false, z: null, l: [], o: {},
  d: new Date(Date.UTC(2024, 0, 2, 3, 4, 5)), x: 1.25,
}])
write('xo_list_methods.xml', 'system.listMethods', [])
