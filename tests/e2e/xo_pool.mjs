// Xen Orchestra's npm `xen-api` client against a pool of toolstackd hosts:
// pointed at a member, it follows HOST_IS_SLAVE to the coordinator; after
// pool.designate_new_master hands the pool to another host, its next calls
// reach the new coordinator (the old one ended its sessions: SESSION_INVALID,
// a new login, HOST_IS_SLAVE); after the coordinator is killed, a client
// opened on a surviving host reaches the one raft elected.
//
// Run by tests/pool (TestXOFollowsTheCoordinator) with
//   POOL_URLS      the hosts' URLs, coordinator first, space separated
//   POOL_PASSWORD  root's password
// It prints KILL THE COORDINATOR when the test must kill the coordinator and
// write back the index of the host it killed. It prints one line per check and exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { createClient } from 'xen-api'

const urls = process.env.POOL_URLS.split(' ')
const password = process.env.POOL_PASSWORD

async function retrying(what, fn, ms = 30e3) {
  const deadline = Date.now() + ms
  for (;;) {
    try {
      return await fn()
    } catch (error) {
      if (Date.now() > deadline) throw new Error(`${what}: ${error.code ?? ''} ${error.message}`)
      await sleep(200)
    }
  }
}

// askToKill tells the test to kill the coordinator and returns the index
// (in POOL_URLS) of the host it killed.
async function askToKill() {
  console.log('KILL THE COORDINATOR')
  for await (const line of createInterface({ input: process.stdin })) {
    return Number(line)
  }
  throw new Error('the test closed stdin without killing')
}

function hostOf(url) {
  return new URL(url).hostname
}

const xapi = createClient({ url: urls[1], auth: { user: 'root', password }, allowUnauthorized: true, transport: 'json-rpc' })
await xapi.connect()
assert.equal(xapi._url.hostname, hostOf(urls[0]), 'the client followed HOST_IS_SLAVE to the coordinator')
console.log('ok connect through a member follows HOST_IS_SLAVE')

const hosts = await xapi.call('host.get_all')
assert.equal(hosts.length, urls.length)
console.log('ok the coordinator lists every host')

// Hand the pool to host 1 (by its address).
let next
for (const h of hosts) {
  if ((await xapi.call('host.get_address', h)) === hostOf(urls[1])) next = h
}
assert.ok(next, 'found host 1')
await xapi.call('pool.designate_new_master', next)
const name = await retrying('a call after the transfer', async () => {
  await xapi.call('pool.set_name_description', (await xapi.call('pool.get_all'))[0], 'after transfer')
  return xapi.call('pool.get_name_description', (await xapi.call('pool.get_all'))[0])
})
assert.equal(name, 'after transfer')
assert.equal(xapi._url.hostname, hostOf(urls[1]), `the client now talks to the new coordinator (it talks to ${xapi._url.hostname}; urls ${urls})`)
console.log('ok calls reach the new coordinator after pool.designate_new_master')

// The coordinator is killed (kill -9) by the test: a client opened on any
// surviving host follows HOST_IS_SLAVE to the coordinator raft elected,
// where a write and its read succeed.
await xapi.disconnect().catch(() => {})
const killed = await askToKill()
let after
const survivor = await retrying('a client after the coordinator was killed', async () => {
  for (const [i, url] of urls.entries()) {
    if (i === killed) continue
    const c = createClient({ url, auth: { user: 'root', password }, allowUnauthorized: true, transport: 'json-rpc' })
    try {
      await c.connect()
      const pool = (await c.call('pool.get_all'))[0]
      await c.call('pool.set_name_description', pool, 'after a kill')
      after = await c.call('pool.get_name_description', pool)
      return c
    } catch (error) {
      await c.disconnect().catch(() => {})
      throw error
    }
  }
}, 60e3)
assert.equal(after, 'after a kill')
assert.notEqual(survivor._url.hostname, hostOf(urls[killed]), 'the client reached a live coordinator')
console.log('ok a client reaches the new coordinator after the old one was killed')
await survivor.disconnect().catch(() => {})

// xen-api's event loop may sit in a long event.from poll after disconnect:
// end the process rather than wait for it.
process.exit(0)
