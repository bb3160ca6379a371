"""Debian's XenAPI.py (python3-os-xenapi, unmodified) against a pool of
toolstackd hosts: a login on a member fails with HOST_IS_SLAVE naming the
coordinator; swapping the URL's host for it, as os_xenapi's XenAPISession
does (swap_xapi_host), logs in on the coordinator, which lists every host;
slave_local_login_with_password reads the member's own replica.

Run by tests/pool (TestXenAPIPyFollowsTheCoordinator) with POOL_URLS (the
hosts' URLs, coordinator first, space separated) and POOL_PASSWORD.
"""

import os
import sys
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
