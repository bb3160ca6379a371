#!/usr/bin/env python3
"""State that survives a restart. run.sh runs this twice on one data
directory: `phase1` against a fresh daemon, then stops it with SIGTERM, starts
it again with a *different* TOOLSTACKD_ROOT_PASSWORD (E2E_NEW_PASSWORD), and
runs `phase2`. E2E_STATE names a file phase1 leaves for phase2.

Per xapi: the database persists (refs and uuids included); sessions and tasks
do not; the root password given in the environment applies only when the data
directory is first initialised.
"""

import json
import os
import socket
import sys
import unittest

import e2e_common as c

socket.setdefaulttimeout(60)

XenAPI = c.load_xenapi()
STATE = os.environ.get("E2E_STATE", "/tmp/toolstackd-e2e-restart.json")
NEW_PASSWORD = os.environ.get("E2E_NEW_PASSWORD", c.PASSWORD + "-changed")
PHASE = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1].startswith("phase") else "phase1"


def login(pw=c.PASSWORD):
    s = XenAPI.Session(c.URL)
    s.xenapi.login_with_password("root", pw)
    return s


def census(x):
    vms = x.VM.get_all_records().values()
    return {
        "pools": len(x.pool.get_all()),
        "hosts": len(x.host.get_all()),
        "control_domains": sum(1 for v in vms if v["is_control_domain"]),
        "templates": sum(1 for v in vms if v["is_a_template"]),
        "networks": len(x.network.get_all()),
        "roles": sorted(x.role.get_name_label(r) for r in x.role.get_all()),
    }


@unittest.skipUnless(PHASE == "phase1", "phase1 only")
class Phase1(unittest.TestCase):
    def test_write_state(self):
        s = login()
        x = s.xenapi
        net = x.network.create({"name_label": "e2e-persist", "name_description": "kept across restarts",
                                "MTU": 1500, "other_config": {"e2e": "yes"}})
        pool = x.pool.get_all()[0]
        x.pool.set_name_label(pool, "e2e-pool")
        state = {
            "network_ref": net,
            "network_uuid": x.network.get_uuid(net),
            "pool_ref": pool,
            "host_ref": x.host.get_all()[0],
            "session": s.handle,
            "census": census(x),
        }
        # Deliberately no logout: the session must not survive the restart.
        with open(STATE, "w") as f:
            json.dump(state, f)


@unittest.skipUnless(PHASE == "phase2", "phase2 only")
class Phase2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(STATE) as f:
            cls.state = json.load(f)

    def test_original_password_still_works(self):
        login().xenapi.session.logout()

    def test_environment_password_ignored_after_first_boot(self):
        s = XenAPI.Session(c.URL)
        with self.assertRaises(XenAPI.Failure) as cm:
            s.xenapi.login_with_password("root", NEW_PASSWORD)
        self.assertEqual(cm.exception.details[0], "SESSION_AUTHENTICATION_FAILED")

    def test_sessions_do_not_survive(self):
        p = c.proxy()
        r = p.pool.get_all(self.state["session"])
        self.assertEqual(r.get("Status"), "Failure", r)
        self.assertEqual(r["ErrorDescription"][0], "SESSION_INVALID", r)

    def test_objects_survive_with_their_refs_and_uuids(self):
        s = login()
        x = s.xenapi
        try:
            st = self.state
            self.assertEqual(x.network.get_by_uuid(st["network_uuid"]), st["network_ref"])
            rec = x.network.get_record(st["network_ref"])
            self.assertEqual(rec["name_label"], "e2e-persist")
            self.assertEqual(rec["name_description"], "kept across restarts")
            self.assertEqual(rec["other_config"], {"e2e": "yes"})
            self.assertEqual(x.pool.get_all(), [st["pool_ref"]])
            self.assertEqual(x.pool.get_name_label(st["pool_ref"]), "e2e-pool")
            self.assertEqual(x.pool.get_master(st["pool_ref"]), st["host_ref"])
        finally:
            s.xenapi.session.logout()

    def test_first_boot_objects_not_created_twice(self):
        s = login()
        try:
            self.assertEqual(census(s.xenapi), self.state["census"])
        finally:
            s.xenapi.session.logout()


if __name__ == "__main__":
    c.main()
