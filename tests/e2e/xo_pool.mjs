// Xen Orchestra's npm `xen-api` client against a pool of toolstackd hosts:
// pointed at a member, it follows HOST_IS_SLAVE to the coordinator; after
// pool.designate_new_master hands the pool to another host, its next calls
// reach the new coordinator (the old one ended its sessions: SESSION_INVALID,
// a new login, HOST_IS_SLAVE).
//
// Run by tests/pool (TestXOFollowsTheCoordinator) with
//   POOL_URLS      the hosts' URLs, coordinator first, space separated
//   POOL_PASSWORD  root's password
// It prints one line per check and exits non-zero on the first failure.
import assert from 'node:assert/strict'
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

await xapi.disconnect().catch(() => {})
// xen-api's event loop may sit in a long event.from poll after disconnect:
// end the process rather than wait for it.
process.exit(0)
