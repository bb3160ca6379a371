// Xen Orchestra's own XenAPI client (npm `xen-api`, pinned in package.json)
// against a running toolstackd. Run by run.sh with E2E_URL and E2E_PASSWORD.
//
// How the transport actually used is observed: xen-api keeps its transport in
// a closure (transports/auto.mjs) with no public property saying which one is
// active. What is fixed by its code is where each transport posts:
// transports/json-rpc.mjs posts to new URL('./jsonrpc', url) and
// transports/xml-rpc.mjs to new URL('./xmlrpc', url); auto.mjs starts with
// JSON-RPC and switches to XML-RPC for good only when json-rpc.mjs throws
// UnsupportedTransport, which it does when the reply's Content-Type is not
// exactly "application/json". So every client here talks to the daemon through
// a small recording HTTP proxy in this process, and the tests assert on the
// paths, RPC method names and reply Content-Types the proxy saw.
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import { createClient } from 'xen-api'

const TARGET = new URL(process.env.E2E_URL ?? 'http://127.0.0.1:8080')
const PASSWORD = process.env.E2E_PASSWORD ?? 'secret'
// How long an API change may take to reach the client cache through event.from.
// Generous because CI machines can be slow; a healthy server needs well under
// a second.
const EVENT_WAIT = Number(process.env.E2E_EVENT_WAIT_MS ?? 10e3)

// ---------------------------------------------------------------------------
// helpers

async function withTimeout(promise, ms, what) {
  let timer
  const timeout = new Promise((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms)
  })
  try {
    return await Promise.race([promise, timeout])
  } finally {
    clearTimeout(timer)
  }
}

async function waitFor(predicate, ms, what) {
  const deadline = Date.now() + ms
  for (;;) {
    const value = await predicate()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await sleep(25)
  }
}

// A direct JSON-RPC call, bypassing xen-api, for checks the client library
// does not expose (is this session still valid? does this task still exist?).
async function rawCall(method, params) {
  const res = await fetch(new URL('/jsonrpc', TARGET), {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method, params }),
  })
  const body = await res.json()
  if (body.error != null) {
    const err = body.error
    const e = new Error(`${err.message}(${(err.data ?? []).join(', ')})`)
    e.code = err.message
    e.params = err.data
    throw e
  }
  return body.result
}

function rpcMethodOf(path, body) {
  try {
    if (path.endsWith('/jsonrpc')) return JSON.parse(body).method
    const m = /<methodName>([^<]*)<\/methodName>/.exec(body)
    return m ? m[1] : undefined
  } catch {
    return undefined
  }
}

// Forwards everything to TARGET and records one entry per request:
// { path, rpc, status, contentType, result? }. The reply body is kept only for
// Async.* calls (to learn the task ref the server handed out).
function startRecordingProxy() {
  const log = []
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', c => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks)
      const entry = { path: req.url, rpc: rpcMethodOf(req.url, body.toString('utf8')) }
      log.push(entry)
      const headers = { ...req.headers, host: TARGET.host }
      const upstream = http.request(
        { host: TARGET.hostname, port: TARGET.port, method: req.method, path: req.url, headers },
        up => {
          entry.status = up.statusCode
          entry.contentType = up.headers['content-type']
          if (entry.rpc?.startsWith('Async.')) {
            const parts = []
            up.on('data', c => parts.push(c))
            up.on('end', () => {
              entry.result = Buffer.concat(parts).toString('utf8')
            })
          }
          res.writeHead(up.statusCode, up.headers)
          up.pipe(res)
        }
      )
      upstream.on('error', err => {
        entry.status = 'proxy-error'
        entry.error = String(err)
        res.destroy(err)
      })
      upstream.end(body)
    })
  })
  return new Promise(resolve => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      resolve({
        url: `http://127.0.0.1:${port}`,
        log,
        close() {
          server.closeAllConnections()
          return new Promise(r => server.close(() => r()))
        },
      })
    })
  })
}

// xen-api reports some failures only through console.warn (a failing
// get_all_records during the initial fetch, an event.from error in the watch
// loop), so the warnings are collected and asserted empty.
function captureWarnings() {
  const warnings = []
  const original = console.warn
  console.warn = (...args) => {
    warnings.push(args.map(a => (a instanceof Error ? `${a.code ?? ''} ${a.message}` : typeof a === 'string' ? a : JSON.stringify(a))).join(' '))
    original.apply(console, args)
  }
  return {
    warnings,
    restore() {
      console.warn = original
    },
  }
}

function taskRefFromReply(entry) {
  const m = /OpaqueRef:[0-9a-fA-F-]+/.exec(entry.result ?? '')
  return m ? m[0] : undefined
}

// ---------------------------------------------------------------------------

for (const transport of ['json-rpc', 'xml-rpc', 'auto']) {
  describe(`xen-api over transport ${transport}`, () => {
    const expectedPath = transport === 'xml-rpc' ? '/xmlrpc' : '/jsonrpc'
    let proxy
    let xapi
    let warn
    let connected = false

    before(async () => {
      proxy = await startRecordingProxy()
      warn = captureWarnings()
    })

    after(async () => {
      warn.restore()
      if (xapi !== undefined && xapi.status !== 'disconnected') {
        await xapi.disconnect().catch(() => {})
      }
      // Cuts the client's pending event.from long poll so the process can exit.
      await proxy.close()
    })

    function requireConnected() {
      assert.ok(connected, 'the client did not connect (see the first failure of this transport)')
    }

    test('connects with root credentials', async () => {
      xapi = createClient({
        url: proxy.url,
        auth: { user: 'root', password: PASSWORD },
        allowUnauthorized: true,
        transport,
        // after an event.from error, retry soon instead of after a minute
        eventPollDelay: 500,
      })
      await withTimeout(xapi.connect(), 20e3, 'xapi.connect()')
      assert.equal(xapi.status, 'connected')
      assert.match(xapi.sessionId, /^OpaqueRef:/)
      connected = true
    })

    test(`stays on ${transport === 'xml-rpc' ? 'XML-RPC' : 'JSON-RPC'} (no transport fallback)`, () => {
      requireConnected()
      assert.ok(proxy.log.length > 0, 'the proxy saw no request')
      const wrongPath = proxy.log.filter(e => e.path !== expectedPath)
      assert.deepEqual(
        wrongPath.map(e => `${e.path} ${e.rpc}`),
        [],
        `requests not on ${expectedPath}; a JSON-RPC reply whose Content-Type is not exactly application/json makes xen-api fall back`
      )
      const okTypes = transport === 'xml-rpc' ? ['text/xml', 'application/xml'] : ['application/json']
      const badType = proxy.log.filter(e => e.status !== undefined && !okTypes.includes(e.contentType))
      assert.deepEqual(
        badType.map(e => `${e.rpc} -> HTTP ${e.status} Content-Type ${JSON.stringify(e.contentType)}`),
        [],
        `xen-api requires the reply Content-Type to be exactly one of ${okTypes.join(', ')}`
      )
      const non2xx = proxy.log.filter(e => typeof e.status === 'number' && (e.status < 200 || e.status > 299))
      assert.deepEqual(non2xx.map(e => `${e.rpc} -> HTTP ${e.status}`), [])
      const seen = proxy.log.map(e => e.rpc)
      for (const m of ['session.login_with_password', 'pool.get_all_records', 'system.listMethods']) {
        assert.ok(seen.includes(m), `connect sequence did not call ${m}; saw ${seen.join(', ')}`)
      }
    })

    test('objectsFetched resolves; pool and its master host are in the cache', async () => {
      requireConnected()
      await withTimeout(xapi.objectsFetched, 30e3, 'xapi.objectsFetched')
      const seen = proxy.log.map(e => e.rpc)
      assert.ok(seen.includes('event.inject'), 'the client never called event.inject')

      const pool = xapi.pool
      assert.ok(pool, 'xapi.pool is not set')
      assert.match(pool.$ref, /^OpaqueRef:/)
      const cachedPool = xapi.getObjectByRef(pool.$ref, undefined)
      assert.ok(cachedPool, `pool ${pool.$ref} is not in the object cache`)
      assert.equal(cachedPool.$type, 'pool')

      assert.match(pool.master, /^OpaqueRef:/, 'pool.master is not a ref')
      const master = xapi.getObjectByRef(pool.master, undefined)
      assert.ok(master, `master host ${pool.master} is not in the object cache`)
      assert.equal(master.$type, 'host')
      assert.equal(typeof master.name_label, 'string')
      assert.equal(Number(master.API_version_major), 2)
      assert.ok(Number(master.API_version_minor) >= 21, `API_version_minor ${master.API_version_minor}`)
      for (const k of ['xapi', 'product_version', 'platform_version']) {
        assert.ok(k in master.software_version, `host.software_version lacks ${k}`)
      }
      assert.equal(xapi.pool.$master, master, 'xapi.pool.$master does not resolve to the cached host')

      const all = Object.values(xapi.objects.all)
      const dom0 = all.filter(o => o.$type === 'VM' && o.is_control_domain === true)
      assert.equal(dom0.length, 1, 'expected one control-domain VM in the cache')
      const tmpl = all.filter(o => o.$type === 'VM' && o.is_a_template === true && o.name_label === 'Other install media')
      assert.equal(tmpl.length, 1, 'template "Other install media" not in the cache')
      assert.ok(all.some(o => o.$type === 'network'), 'no network in the cache')
      assert.ok(all.some(o => o.$type === 'PIF'), 'no PIF in the cache')
    })

    let warningsAfterFetch = 0
    test('every advertised get_all_records worked during the initial fetch', () => {
      requireConnected()
      // _refreshCachedRecords only console.warn()s a failing type (the type is
      // what precedes the first dot of each "*.get_all_records" name that
      // system.listMethods returned).
      warningsAfterFetch = warn.warnings.length
      assert.deepEqual(warn.warnings, [])
      assert.equal(xapi.watchEventsError, undefined)
    })

    test('an object created, changed and destroyed through the API reaches the cache through events', async () => {
      requireConnected()
      const label = `e2e-${transport}-${Date.now()}`
      const ref = await withTimeout(
        xapi.call('network.create', { name_label: label, name_description: '', MTU: 1500, other_config: {} }),
        10e3,
        'network.create'
      )
      assert.match(ref, /^OpaqueRef:/)
      const added = await waitFor(() => xapi.getObjectByRef(ref, undefined), EVENT_WAIT, `network ${ref} in the cache (add event)`)
      assert.equal(added.$type, 'network')
      assert.equal(added.name_label, label)
      assert.equal(Number(added.MTU), 1500)

      await xapi.call('network.set_name_description', ref, 'changed by e2e')
      await waitFor(
        () => xapi.getObjectByRef(ref, undefined)?.name_description === 'changed by e2e',
        EVENT_WAIT,
        'name_description change in the cache (mod event)'
      )

      await xapi.call('network.add_to_other_config', ref, 'e2e-key', 'e2e-value')
      await waitFor(
        () => xapi.getObjectByRef(ref, undefined)?.other_config['e2e-key'] === 'e2e-value',
        EVENT_WAIT,
        'other_config change in the cache (mod event)'
      )

      await xapi.call('network.destroy', ref)
      await waitFor(() => xapi.getObjectByRef(ref, undefined) === undefined, EVENT_WAIT, `network ${ref} leaving the cache (del event)`)

      // A class whose XenAPI name is not lowercase: xen-api subscribes with
      // "VM" and maps the lowercase event class back to "VM".
      const tmpl = Object.values(xapi.objects.all).find(o => o.$type === 'VM' && o.name_label === 'Other install media')
      assert.ok(tmpl, 'template not in the cache')
      const oldDesc = tmpl.name_description
      const desc = `e2e ${transport} ${Date.now()}`
      await xapi.call('VM.set_name_description', tmpl.$ref, desc)
      try {
        const updated = await waitFor(
          () => {
            const o = xapi.getObjectByRef(tmpl.$ref, undefined)
            return o?.name_description === desc && o
          },
          EVENT_WAIT,
          'VM name_description change in the cache'
        )
        assert.equal(updated.$type, 'VM')
      } finally {
        await xapi.call('VM.set_name_description', tmpl.$ref, oldDesc)
      }
    })

    test('callAsync resolves through task events and the task is destroyed afterwards', async () => {
      requireConnected()
      const label = `e2e-async-${transport}-${Date.now()}`
      const before = proxy.log.length
      const ref = await withTimeout(
        xapi.callAsync('network.create', { name_label: label, name_description: '', MTU: 1500, other_config: {} }),
        15e3,
        'callAsync(network.create)'
      )
      assert.match(ref, /^OpaqueRef:/, `task result parsed by xen-api: ${JSON.stringify(ref)}`)
      assert.equal(await xapi.call('network.get_name_label', ref), label)

      const asyncCall = proxy.log.slice(before).find(e => e.rpc === 'Async.network.create')
      assert.ok(asyncCall, 'the proxy did not see Async.network.create')
      const taskRef = taskRefFromReply(asyncCall)
      assert.ok(taskRef, `Async.network.create did not return a task ref: ${asyncCall.result}`)

      // xen-api calls task.destroy once the task settled; the task must then
      // leave the server and, through a del event, the cache.
      await waitFor(() => proxy.log.slice(before).some(e => e.rpc === 'task.destroy'), EVENT_WAIT, 'the client to call task.destroy')
      await waitFor(
        async () => !(await rawCall('task.get_all', [xapi.sessionId])).includes(taskRef),
        EVENT_WAIT,
        `task ${taskRef} to be gone from task.get_all`
      )
      await waitFor(() => xapi.getObjectByRef(taskRef, undefined) === undefined, EVENT_WAIT, `task ${taskRef} to leave the cache`)

      // The same for a void result: Async.network.destroy.
      const res = await withTimeout(xapi.callAsync('network.destroy', ref), 15e3, 'callAsync(network.destroy)')
      assert.equal(res, '', `void task result as parsed by xen-api: ${JSON.stringify(res)}`)
      await waitFor(() => xapi.getObjectByRef(ref, undefined) === undefined, EVENT_WAIT, `network ${ref} leaving the cache`)
    })

    test('a failing async call rejects with the XenAPI error', async () => {
      requireConnected()
      const bogus = 'OpaqueRef:00000000-0000-0000-0000-00000000e2e0'
      await assert.rejects(
        withTimeout(xapi.callAsync('network.destroy', bogus), 15e3, 'callAsync(network.destroy, bogus)'),
        err => {
          assert.equal(err.code, 'HANDLE_INVALID', String(err))
          return true
        }
      )
    })

    test('barrier() returns', async () => {
      requireConnected()
      await withTimeout(xapi.barrier(), 10e3, 'xapi.barrier()')
      const pool = await withTimeout(xapi.barrier(xapi.pool.$ref), 10e3, 'xapi.barrier(poolRef)')
      assert.equal(pool.$ref, xapi.pool.$ref)
      // barrier removes its other_config key afterwards (remove_from_other_config)
      await waitFor(
        async () => {
          const oc = await rawCall('pool.get_other_config', [xapi.sessionId, xapi.pool.$ref])
          return !Object.keys(oc).some(k => k.startsWith('xo:barrier:'))
        },
        EVENT_WAIT,
        'the xo:barrier: keys to be removed from pool.other_config'
      )
    })

    test('no warnings from the client since the initial fetch and the event loop is healthy', () => {
      requireConnected()
      assert.deepEqual(warn.warnings.slice(warningsAfterFetch), [])
      assert.equal(xapi.watchEventsError, undefined)
      assert.ok(proxy.log.some(e => e.rpc === 'event.from'), 'the client never called event.from')
      // xen-api refetches every task whenever valid_ref_counts.task differs
      // from the number of tasks it holds; a count that disagrees with
      // task.get_all_records makes it refetch after every batch.
      const refetches = proxy.log.filter(e => e.rpc === 'task.get_all_records').length
      assert.ok(refetches <= 3, `task.get_all_records called ${refetches} times: valid_ref_counts.task disagrees with the tasks`)
    })

    test('recovers when its session is destroyed behind its back', async () => {
      requireConnected()
      // xen-api logs in again on SESSION_INVALID and restarts its event loop
      // (event.from answering SESSION_INVALID, per xapi, once the session is
      // gone); the cache must keep following changes.
      const old = xapi.sessionId
      await rawCall('session.logout', [old])
      const pools = await withTimeout(xapi.call('pool.get_all'), 15e3, 'pool.get_all after the session was destroyed')
      assert.deepEqual(pools, [xapi.pool.$ref])
      assert.notEqual(xapi.sessionId, old, 'the client did not log in again')
      const label = `e2e-relogin-${transport}-${Date.now()}`
      const ref = await xapi.call('network.create', { name_label: label, name_description: '', MTU: 1500, other_config: {} })
      try {
        await waitFor(() => xapi.getObjectByRef(ref, undefined), EVENT_WAIT, 'an add event after the re-login')
      } finally {
        await xapi.call('network.destroy', ref)
      }
    })

    test('disconnects cleanly and the session is logged out', async () => {
      requireConnected()
      const sessionId = xapi.sessionId
      await withTimeout(xapi.disconnect(), 10e3, 'xapi.disconnect()')
      assert.equal(xapi.status, 'disconnected')
      await waitFor(() => proxy.log.some(e => e.rpc === 'session.logout' && e.status === 200), EVENT_WAIT, 'session.logout')
      await assert.rejects(rawCall('pool.get_all', [sessionId]), err => {
        assert.equal(err.code, 'SESSION_INVALID', String(err))
        return true
      })
    })
  })
}

// ---------------------------------------------------------------------------
// Disk content through xen-api's own HTTP helpers, called the way Xen
// Orchestra's VDI import/export calls them: putResource(stream,
// '/import_raw_vdi/', { query: { format, vdi } }) and getResource(
// '/export_raw_vdi/', { query: { format, vdi } }). Both paths carry a
// trailing slash; putResource with a stream first sends an empty PUT without
// task_id to the same URL (a probe for a redirect to another host) and only
// then the data; both make a task (events are watched) and wait for its
// result.

// A deterministic, incompressible-looking pattern of n bytes.
function pattern(n, seed) {
  const buf = Buffer.allocUnsafe(n)
  let x = seed >>> 0 || 1
  for (let i = 0; i < n; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    buf[i] = x & 0xff
  }
  return buf
}

// A stream of buf in 64 KiB pieces; with knownLength the stream carries a
// length property, as XO sets it when it knows the size.
function streamOf(buf, knownLength) {
  const pieces = []
  for (let off = 0; off < buf.length; off += 64 << 10) pieces.push(buf.subarray(off, off + (64 << 10)))
  const s = Readable.from(pieces, { objectMode: false })
  if (knownLength) s.length = buf.length
  return s
}

describe('xen-api HTTP transfers (putResource/getResource)', () => {
  const SIZE = 8 << 20
  let proxy
  let xapi
  let warn
  let connected = false
  const vdis = []

  before(async () => {
    proxy = await startRecordingProxy()
    warn = captureWarnings()
    xapi = createClient({
      url: proxy.url,
      auth: { user: 'root', password: PASSWORD },
      allowUnauthorized: true,
      eventPollDelay: 500,
    })
    await withTimeout(xapi.connect(), 20e3, 'xapi.connect()')
    await withTimeout(xapi.objectsFetched, 30e3, 'xapi.objectsFetched')
    connected = true
  })

  after(async () => {
    warn.restore()
    for (const ref of vdis) await rawCall('VDI.destroy', [xapi.sessionId, ref]).catch(() => {})
    if (xapi !== undefined && xapi.status !== 'disconnected') await xapi.disconnect().catch(() => {})
    await proxy.close()
  })

  async function newVDI(label) {
    assert.ok(connected, 'the client did not connect')
    const sr = xapi.pool.default_SR
    assert.match(sr, /^OpaqueRef:/, 'the pool has no default SR')
    const ref = await xapi.call('VDI.create', {
      name_label: label,
      name_description: '',
      SR: sr,
      virtual_size: String(SIZE),
      type: 'user',
      sharable: false,
      read_only: false,
      other_config: {},
    })
    vdis.push(ref)
    return ref
  }

  async function exportRaw(ref) {
    const response = await withTimeout(
      xapi.getResource('/export_raw_vdi/', { query: { format: 'raw', vdi: ref } }),
      30e3,
      'getResource(/export_raw_vdi/)'
    )
    const body = Buffer.from(await withTimeout(response.body.arrayBuffer(), 60e3, 'reading the export'))
    await withTimeout(response.task, 30e3, 'the export task result')
    return body
  }

  test('a stream with a known length is imported and exported back byte for byte', async () => {
    const ref = await newVDI(`e2e-xo-import-${Date.now()}`)
    const data = pattern(SIZE, 0x5eed)
    const before = proxy.log.length
    await withTimeout(
      xapi.putResource(streamOf(data, true), '/import_raw_vdi/', { query: { format: 'raw', vdi: ref } }),
      60e3,
      'putResource(/import_raw_vdi/)'
    )
    const puts = proxy.log.slice(before).filter(e => e.path.startsWith('/import_raw_vdi/'))
    assert.equal(puts.length, 2, `expected the empty probe PUT and the upload: ${JSON.stringify(puts)}`)
    assert.ok(!puts[0].path.includes('task_id='), `the probe carries no task_id: ${puts[0].path}`)
    assert.ok(puts[1].path.includes('task_id='), `the upload carries the task: ${puts[1].path}`)
    for (const p of puts) assert.equal(p.status, 200, `${p.path} -> ${p.status}`)

    const back = await exportRaw(ref)
    assert.equal(back.length, SIZE)
    assert.ok(back.equals(data), 'the exported bytes differ from the imported ones')
    const gets = proxy.log.slice(before).filter(e => e.path.startsWith('/export_raw_vdi/'))
    assert.equal(gets.length, 1)
    assert.equal(gets[0].status, 200)
  })

  test('a VHD export imported into another disk gives the same bytes (the backup path)', async () => {
    // Xen Orchestra's backups export a disk as VHD and restore by importing
    // that stream; the stream's length is the export's Content-Length when
    // the server sends one.
    const src = await newVDI(`e2e-xo-vhd-src-${Date.now()}`)
    const data = Buffer.alloc(SIZE)
    pattern(1 << 20, 0xc0de).copy(data, 0)
    pattern(1 << 20, 0xface).copy(data, 5 << 20)
    await withTimeout(xapi.putResource(data, '/import_raw_vdi/', { query: { format: 'raw', vdi: src } }), 60e3, 'raw import')
    const response = await withTimeout(
      xapi.getResource('/export_raw_vdi/', { query: { format: 'vhd', vdi: src } }),
      30e3,
      'getResource(format vhd)'
    )
    const vhd = Buffer.from(await withTimeout(response.body.arrayBuffer(), 60e3, 'reading the VHD export'))
    await withTimeout(response.task, 30e3, 'the VHD export task result')
    // A dynamic VHD ends with its 512-byte footer, cookie "conectix".
    assert.equal(vhd.subarray(vhd.length - 512, vhd.length - 504).toString('latin1'), 'conectix')
    assert.ok(vhd.length < SIZE, `a VHD of 2 MiB of data in 8 MiB is ${vhd.length} bytes`)
    const dst = await newVDI(`e2e-xo-vhd-dst-${Date.now()}`)
    await withTimeout(
      xapi.putResource(streamOf(vhd, true), '/import_raw_vdi/', { query: { format: 'vhd', vdi: dst } }),
      60e3,
      'putResource(format vhd)'
    )
    const back = await exportRaw(dst)
    assert.ok(back.equals(data), 'the disk restored from the VHD differs')
  })

  test('a buffer shorter than the disk leaves the rest zero', async () => {
    const ref = await newVDI(`e2e-xo-short-${Date.now()}`)
    const data = pattern(SIZE / 4 + 4096, 0xbeef)
    // A Buffer is not a stream: putResource sends it at once, with no probe.
    await withTimeout(
      xapi.putResource(data, '/import_raw_vdi/', { query: { format: 'raw', vdi: ref } }),
      60e3,
      'putResource(buffer)'
    )
    const back = await exportRaw(ref)
    assert.equal(back.length, SIZE)
    assert.ok(back.subarray(0, data.length).equals(data), 'the imported prefix differs')
    assert.ok(back.subarray(data.length).every(b => b === 0), 'the rest of the disk is not zero')
  })

  test('a stream of unknown length (the 1 PiB Content-Length) is imported whole', async () => {
    // With no length on the stream, putResource declares a Content-Length
    // of 1 PiB on the probe and on the upload, sends the data and closes the
    // connection once its request is finished, without reading further.
    // It drops what it still holds in its own buffers at that point, so
    // this stream, like one read from a remote, ends a moment after its
    // last piece has gone out.
    const ref = await newVDI(`e2e-xo-unknown-${Date.now()}`)
    const data = pattern(SIZE - 64 * 1024, 0xf00d)
    async function* pieces() {
      for (let off = 0; off < data.length; off += 64 << 10) yield data.subarray(off, off + (64 << 10))
      await sleep(300)
    }
    const warningsBefore = warn.warnings.length
    const before = proxy.log.length
    // Straight to the daemon: the recording proxy waits for the end of a
    // request body, which a 1 PiB declaration never reaches.
    const direct = createClient({
      url: TARGET.href,
      auth: { user: 'root', password: PASSWORD },
      allowUnauthorized: true,
      eventPollDelay: 500,
    })
    try {
      await withTimeout(direct.connect(), 20e3, 'direct connect()')
      await withTimeout(direct.objectsFetched, 30e3, 'direct objectsFetched')
      const t0 = Date.now()
      await withTimeout(
        direct.putResource(Readable.from(pieces(), { objectMode: false }), '/import_raw_vdi/', {
          query: { format: 'raw', vdi: ref },
        }),
        30e3,
        'putResource(stream without length)'
      )
      // Not the server's read deadline (60 s): the probe is answered at once.
      assert.ok(Date.now() - t0 < 15e3, `the upload took ${Date.now() - t0} ms`)
    } finally {
      await direct.disconnect().catch(() => {})
    }
    assert.ok(!proxy.log.slice(before).some(e => e.path.startsWith('/import_raw_vdi')), 'the direct client went through the proxy')
    const newWarnings = warn.warnings.slice(warningsBefore)
    assert.ok(
      newWarnings.length === 1 && newWarnings[0].includes('missing length'),
      `expected only xen-api's "missing length" warning: ${JSON.stringify(newWarnings)}`
    )
    warn.warnings.splice(warningsBefore, 1)
    const back = await exportRaw(ref)
    assert.equal(back.length, SIZE)
    assert.ok(back.subarray(0, data.length).equals(data), 'the exported bytes differ from the imported ones')
    assert.ok(back.subarray(data.length).every(b => b === 0), 'the rest of the disk is not zero')
  })

  test('a VM exported as XVA comes back through /import/, with and without a length', async () => {
    // Xen Orchestra's VM export and import: getResource('/export/', { query:
    // { ref, use_compression } }) and putResource(stream, '/import/', {
    // query: { sr_id } }), whose task result is the new VM's ref.
    const tmpl = Object.values(xapi.objects.all).find(o => o.$type === 'VM' && o.name_label === 'Other install media')
    assert.ok(tmpl, 'template not in the cache')
    const label = `e2e-xo-xva-${Date.now()}`
    const vm = await xapi.call('VM.clone', tmpl.$ref, label)
    const created = [vm]
    try {
      await xapi.call('VM.set_is_a_template', vm, false)
      const response = await withTimeout(
        xapi.getResource('/export/', { query: { ref: vm, use_compression: 'false' } }),
        30e3,
        'getResource(/export/)'
      )
      const xva = Buffer.from(await withTimeout(response.body.arrayBuffer(), 60e3, 'reading the XVA'))
      await withTimeout(response.task, 30e3, 'the export task result')
      assert.ok(xva.length > 0)
      const warningsBefore = warn.warnings.length
      for (const knownLength of [true, false]) {
        async function* pieces() {
          for (let off = 0; off < xva.length; off += 64 << 10) yield xva.subarray(off, off + (64 << 10))
          await sleep(300)
        }
        const stream = Readable.from(pieces(), { objectMode: false })
        if (knownLength) stream.length = xva.length
        // The 1 PiB declaration cannot go through the recording proxy.
        const client = knownLength
          ? xapi
          : createClient({ url: TARGET.href, auth: { user: 'root', password: PASSWORD }, allowUnauthorized: true })
        try {
          if (!knownLength) {
            await withTimeout(client.connect(), 20e3, 'direct connect()')
            await withTimeout(client.objectsFetched, 30e3, 'direct objectsFetched')
          }
          const t0 = Date.now()
          const result = await withTimeout(
            client.putResource(stream, '/import/', { query: { sr_id: xapi.pool.default_SR } }),
            30e3,
            `putResource(/import/, knownLength=${knownLength})`
          )
          assert.ok(Date.now() - t0 < 15e3, `the import took ${Date.now() - t0} ms`)
          const refs = Array.isArray(result) ? result : [result]
          assert.equal(refs.length, 1, `task result ${JSON.stringify(result)}`)
          assert.match(refs[0], /^OpaqueRef:/)
          created.push(refs[0])
          assert.equal(await xapi.call('VM.get_name_label', refs[0]), label)
        } finally {
          if (!knownLength) await client.disconnect().catch(() => {})
        }
      }
      // Besides "missing length", the client may log that the server closed
      // the connection before its stream ended: the import ends with the
      // archive, while this stream lingers, and the client (ignoring a
      // premature close by default) only logs it.
      const newWarnings = warn.warnings.slice(warningsBefore)
      assert.ok(
        newWarnings.some(w => w.includes('missing length')) &&
          newWarnings.every(w => w.includes('missing length') || w.includes('ERR_STREAM_PREMATURE_CLOSE')),
        `expected only xen-api's "missing length" and premature-close warnings: ${JSON.stringify(newWarnings)}`
      )
      warn.warnings.splice(warningsBefore, newWarnings.length)
    } finally {
      for (const ref of created) await rawCall('VM.destroy', [xapi.sessionId, ref]).catch(() => {})
    }
  })

  test('an import into a VDI that does not exist is refused with HTTP 404', async () => {
    assert.ok(connected, 'the client did not connect')
    const bogus = 'OpaqueRef:00000000-0000-0000-0000-00000000e2e1'
    await assert.rejects(
      withTimeout(
        xapi.putResource(Buffer.alloc(512), '/import_raw_vdi/', { query: { format: 'raw', vdi: bogus } }),
        30e3,
        'putResource(bogus vdi)'
      ),
      err => {
        assert.equal(err.response?.statusCode, 404, String(err))
        return true
      }
    )
  })

  test('an export of a VDI that does not exist is refused with HTTP 404', async () => {
    assert.ok(connected, 'the client did not connect')
    const bogus = 'OpaqueRef:00000000-0000-0000-0000-00000000e2e2'
    await assert.rejects(
      withTimeout(xapi.getResource('/export_raw_vdi/', { query: { format: 'raw', vdi: bogus } }), 30e3, 'getResource(bogus vdi)'),
      err => {
        assert.equal(err.response?.statusCode, 404, String(err))
        return true
      }
    )
  })

  // Xen Orchestra's stats (xo-server's xapi-stats) read the metrics this
  // way: getResource('/rrd_updates', { query: { cf: 'AVERAGE', host:
  // 'true', interval, json: 'true', start } }) on the client's own
  // connection settings, then parse the body as JSON and index values by
  // legend entries such as AVERAGE:host:<uuid>:cpu0.
  test('stats: /rrd_updates with json=true, as XO asks for it', async () => {
    assert.ok(connected, 'the client did not connect')
    const hostUUID = Object.values(xapi.objects.all).find(o => o.$type === 'host')?.uuid
    assert.ok(hostUUID, 'no host in the client cache')
    const before = proxy.log.length
    // The daemon samples every 5 s: wait for a few rows.
    const json = await waitFor(
      async () => {
        const response = await withTimeout(
          xapi.getResource('/rrd_updates', {
            query: { cf: 'AVERAGE', host: 'true', interval: 5, json: 'true', start: Math.floor(Date.now() / 1e3) - 300 },
          }),
          30e3,
          'getResource(/rrd_updates)'
        )
        const text = Buffer.from(await response.body.arrayBuffer()).toString('utf8')
        const parsed = JSON.parse(text)
        return parsed.data.length >= 2 ? parsed : undefined
      },
      30e3,
      'two rows of host metrics'
    )
    const legend = json.meta.legend
    for (const ds of ['cpu0', 'cpu_avg', 'memory_total_kib', 'memory_free_kib', 'loadavg']) {
      assert.ok(legend.includes(`AVERAGE:host:${hostUUID}:${ds}`), `legend lacks ${ds}: ${legend.join(' ')}`)
    }
    assert.equal(Number(json.meta.step), 5)
    assert.ok(Math.abs(Number(json.meta.end) - Date.now() / 1e3) < 60, `meta.end ${json.meta.end} is far from now`)
    const total = legend.indexOf(`AVERAGE:host:${hostUUID}:memory_total_kib`)
    for (const row of json.data) {
      assert.equal(row.values.length, legend.length)
    }
    assert.ok(Number(json.data[0].values[total]) > 0, `memory_total_kib ${json.data[0].values[total]}`)
    assert.ok(Number(json.data[0].t) > Number(json.data[1].t), 'rows are newest first')
    const gets = proxy.log.slice(before).filter(e => e.path.startsWith('/rrd_updates'))
    assert.ok(gets.length > 0 && gets.every(e => e.status === 200), JSON.stringify(gets))
  })

  test('no warnings from the client during the transfers', () => {
    assert.deepEqual(warn.warnings, [])
    assert.equal(xapi.watchEventsError, undefined)
  })
})
