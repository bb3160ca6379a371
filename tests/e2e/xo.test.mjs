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
