"""Debian's XenAPI.py (python3-os-xenapi, unmodified) against a pool of
toolstackd hosts: a login on a member fails with HOST_IS_SLAVE naming the
coordinator; swapping the URL's host for it, as os_xenapi's XenAPISession
does (swap_xapi_host), logs in on the coordinator, which lists every host;
slave_local_login_with_password reads the member's own replica. Then the
test kills the coordinator (the script prints KILL THE COORDINATOR and reads
back the index of the host killed): a login on a surviving host is sent to
the coordinator raft elected, where a write succeeds.

Run by tests/pool (TestXenAPIPyFollowsTheCoordinator) with POOL_URLS (the
hosts' URLs, coordinator first, space separated) and POOL_PASSWORD.
"""

import os
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(__file__))
import e2e_common  # noqa: E402

XenAPI = e2e_common.load_xenapi()
urls = os.environ["POOL_URLS"].split()
password = os.environ["POOL_PASSWORD"]

member = XenAPI.Session(urls[1])
try:
    member.xenapi.login_with_password("root", password, "1.0", "xenapi_pool.py")
    sys.exit("a member accepted a login")
except XenAPI.Failure as e:
    assert e.details[0] == "HOST_IS_SLAVE", e.details
    master = e.details[1]
print("ok a member answers HOST_IS_SLAVE", master)

url = urls[1].replace(urllib.parse.urlparse(urls[1]).hostname, master)
coordinator = XenAPI.Session(url)
coordinator.xenapi.login_with_password("root", password, "1.0", "xenapi_pool.py")
hosts = coordinator.xenapi.host.get_all()
assert len(hosts) == len(urls), hosts
print("ok the coordinator it names lists", len(hosts), "hosts")

local = XenAPI.Session(urls[1])
local.slave_local_login_with_password("root", password)
assert len(local.xenapi.host.get_all()) == len(urls)
print("ok slave_local_login_with_password reads the member's replica")
coordinator.xenapi.session.logout()


def follow(url):
    """Logs in through url, following HOST_IS_SLAVE once."""
    s = XenAPI.Session(url)
    try:
        s.xenapi.login_with_password("root", password, "1.0", "xenapi_pool.py")
        return s
    except XenAPI.Failure as e:
        if e.details[0] != "HOST_IS_SLAVE" or not e.details[1]:
            raise
        s = XenAPI.Session(url.replace(urllib.parse.urlparse(url).hostname, e.details[1]))
        s.xenapi.login_with_password("root", password, "1.0", "xenapi_pool.py")
        return s


print("KILL THE COORDINATOR", flush=True)
killed = int(sys.stdin.readline())
deadline = time.time() + 60
while True:
    try:
        for i, u in enumerate(urls):
            if i == killed:
                continue
            s = follow(u)
            pool = s.xenapi.pool.get_all()[0]
            s.xenapi.pool.set_name_description(pool, "after a kill")
            assert s.xenapi.pool.get_name_description(pool) == "after a kill"
            break
        break
    except Exception as e:  # noqa: BLE001 (an election in progress: any failure, try again)
        if time.time() > deadline:
            raise
        time.sleep(0.2)
print("ok a login on a surviving host reaches the new coordinator after a kill")
