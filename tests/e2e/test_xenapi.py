#!/usr/bin/env python3
"""The classic XenAPI.py (Debian python3-os-xenapi, unmodified) and the stdlib
xmlrpc.client against a running toolstackd, plus raw JSON-RPC and XML-RPC
wire checks. run.sh passes E2E_URL and E2E_PASSWORD.

Error parameters are checked against internal/datamodel/errors.json and
the parameter counts against datamodel.json.
"""

import concurrent.futures
import json
import re
import socket
import threading
import time
import unittest
import uuid as uuidlib
import xmlrpc.client

import e2e_common as c

# Nothing in here should wait longer than this for one HTTP exchange.
socket.setdefaulttimeout(60)

XenAPI = c.load_xenapi()
DATAMODEL, ERRORS = c.load_datamodel()
CLASSES = {cl["name"]: cl for cl in DATAMODEL["classes"]}

BOGUS_REF = "OpaqueRef:00000000-0000-0000-0000-0000000e2e01"
SEVEN_ROLES = ["pool-admin", "pool-operator", "vm-power-admin", "vm-admin",
               "vm-operator", "read-only", "client-cert"]


def message(cls, name):
    for m in CLASSES[cls]["messages"]:
        if m["name"] == name:
            return m
    raise KeyError("%s.%s" % (cls, name))


def event_from(x, classes, token, timeout):
    # `from` is a Python keyword, hence getattr.
    return getattr(x.event, "from")(classes, token, timeout)


def network_rec(label, mtu=1500):
    return {"name_label": label, "name_description": "", "MTU": mtu, "other_config": {}}


class ErrorAsserts:
    def assertFailure(self, result, code, params=None):
        """result is a raw {Status, Value|ErrorDescription} struct."""
        self.assertIsInstance(result, dict, "reply is not a struct: %r" % (result,))
        self.assertEqual(result.get("Status"), "Failure", "expected failure %s, got %r" % (code, result))
        desc = result.get("ErrorDescription")
        self.assertIsInstance(desc, list, result)
        self.checkDescription(desc, code, params)

    def checkDescription(self, desc, code, params=None):
        self.assertGreaterEqual(len(desc), 1, desc)
        self.assertEqual(desc[0], code, "expected %s, got %r" % (code, desc))
        for p in desc[1:]:
            self.assertIsInstance(p, str, "error parameters travel as strings: %r" % (desc,))
        names = ERRORS.get(code)
        self.assertIsNotNone(names, "%s is not a XenAPI error code" % code)
        if names:  # errors.json lists the parameters of this code
            self.assertEqual(len(desc) - 1, len(names),
                             "%s takes %d parameters %s, got %r" % (code, len(names), names, desc[1:]))
        if params is not None:
            self.assertEqual(desc[1:], params, "parameters of %s" % code)


# ---------------------------------------------------------------------------


class T1_Login(unittest.TestCase, ErrorAsserts):
    def test_login_passes_api_version_probe(self):
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        try:
            self.assertRegex(s.handle, r"^OpaqueRef:")
            major, minor = s.API_version.split(".")
            self.assertEqual(major, "2", s.API_version)
            self.assertGreaterEqual(int(minor), 21, s.API_version)
        finally:
            s.xenapi.session.logout()

    def test_login_with_version_and_originator(self):
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD, "2.21", "toolstackd-e2e")
        try:
            self.assertTrue(s.xenapi.pool.get_all())
        finally:
            s.xenapi.session.logout()

    def test_wrong_password(self):
        for user, pw in (("root", c.PASSWORD + "x"), ("root", ""), ("nosuchuser", c.PASSWORD)):
            with self.subTest(user=user, pw=pw):
                s = XenAPI.Session(c.URL)
                with self.assertRaises(XenAPI.Failure) as cm:
                    s.xenapi.login_with_password(user, pw)
                self.checkDescription(cm.exception.details, "SESSION_AUTHENTICATION_FAILED")

    def test_logout_then_session_invalid(self):
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        handle = s.handle
        self.assertTrue(s.xenapi.host.get_all())
        s.xenapi.session.logout()
        # XenAPI.py logs in again on SESSION_INVALID, so ask with a raw proxy.
        p = c.proxy()
        self.assertFailure(p.host.get_all(handle), "SESSION_INVALID", [handle])
        # And with a session that logged out through the raw protocol.
        sess = c.raw_login(p)
        r = p.session.logout(sess)
        self.assertEqual(r.get("Status"), "Success", r)
        self.assertFailure(p.pool.get_all(sess), "SESSION_INVALID", [sess])


class T2_Records(unittest.TestCase, ErrorAsserts):
    @classmethod
    def setUpClass(cls):
        cls.s = XenAPI.Session(c.URL)
        cls.s.xenapi.login_with_password("root", c.PASSWORD)
        cls.x = cls.s.xenapi
        cls.methods = c.proxy().system.listMethods()
        cls.types = [m[: -len(".get_all_records")] for m in cls.methods
                     if isinstance(m, str) and m.endswith(".get_all_records") and m.count(".") == 1]

    @classmethod
    def tearDownClass(cls):
        cls.s.xenapi.session.logout()

    def records_or_none(self, t):
        # A failing get_all_records is reported by
        # test_get_all_records_and_get_record_for_every_class; not again here.
        try:
            return getattr(self.x, t).get_all_records()
        except XenAPI.Failure:
            return None

    def test_list_methods_is_unwrapped(self):
        # xapi answers system.listMethods with a plain array, no {Status, Value}.
        self.assertIsInstance(self.methods, list, repr(self.methods)[:200])
        for m in self.methods:
            self.assertIsInstance(m, str)
        for m in ("session.login_with_password", "session.logout", "event.from", "event.inject",
                  "pool.get_all_records", "host.get_all_records", "VM.get_all_records",
                  "pool.add_to_other_config", "pool.remove_from_other_config", "task.destroy"):
            self.assertIn(m, self.methods)
        # The same through the other two XML-RPC paths.
        for path in ("/", "/xmlrpc"):
            self.assertEqual(sorted(c.proxy(path).system.listMethods()), sorted(self.methods), path)

    def test_get_all_records_names_are_classes(self):
        # xen-api takes what precedes the first dot of every listed name ending
        # in ".get_all_records" as a class to fetch and watch; so
        # "Async.X.get_all_records" would make it fetch a class "Async".
        odd = [m for m in self.methods if m.endswith(".get_all_records") and m.count(".") != 1]
        self.assertEqual(odd, [])
        unknown = sorted(set(self.types) - set(CLASSES))
        self.assertEqual(unknown, [], "get_all_records advertised for classes not in the datamodel")

    def test_every_class_with_get_all_records_is_advertised(self):
        want = sorted(name for name, cl in CLASSES.items() if cl["lifecycle"] != "Removed_s" and any(
            m["name"] == "get_all_records" and m["lifecycle"] != "Removed_s" for m in cl["messages"]))
        missing = sorted(set(want) - set(self.types))
        self.assertEqual(missing, [], "classes with get_all_records in the datamodel that listMethods does not advertise")

    def test_get_all_records_and_get_record_for_every_class(self):
        self.assertIn("VM", self.types)
        for t in self.types:
            with self.subTest(cls=t):
                api = getattr(self.x, t)
                recs = api.get_all_records()
                self.assertIsInstance(recs, dict)
                refs = api.get_all()
                self.assertIsInstance(refs, list)
                self.assertEqual(sorted(refs), sorted(recs), "%s.get_all vs get_all_records" % t)
                for ref, rec in list(recs.items())[:200]:
                    self.assertRegex(ref, r"^OpaqueRef:", t)
                    self.assertIsInstance(rec, dict)
                    one = api.get_record(ref)
                    self.assertEqual(sorted(one), sorted(rec), "%s.get_record(%s) fields" % (t, ref))
                    if "uuid" in rec:
                        self.assertEqual(one["uuid"], rec["uuid"])

    def test_record_fields_match_datamodel(self):
        for t in self.types:
            if t not in CLASSES:
                continue
            with self.subTest(cls=t):
                recs = self.records_or_none(t)
                if recs is None:
                    continue
                if not recs:
                    continue
                rec = next(iter(recs.values()))
                fields = CLASSES[t]["fields"]
                published = {f["name"] for f in fields if f["lifecycle"] != "Removed_s"}
                known = {f["name"] for f in fields}
                self.assertEqual(sorted(published - set(rec)), [], "%s record lacks datamodel fields" % t)
                self.assertEqual(sorted(set(rec) - known), [], "%s record has fields the datamodel does not publish" % t)

    def test_get_by_uuid_round_trip(self):
        for t in self.types:
            with self.subTest(cls=t):
                recs = self.records_or_none(t)
                if recs is None:
                    continue
                for ref, rec in list(recs.items())[:3]:
                    if "uuid" not in rec:
                        continue
                    self.assertEqual(getattr(self.x, t).get_by_uuid(rec["uuid"]), ref)
                    self.assertEqual(getattr(self.x, t).get_uuid(ref), rec["uuid"])

    def test_get_all_records_where(self):
        recs = self.x.VM.get_all_records_where('field "is_control_domain" = "true"')
        self.assertEqual(len(recs), 1, list(recs))
        self.assertIs(next(iter(recs.values()))["is_control_domain"], True)
        refs = self.x.VM.get_all_where('field "name__label" = "Other install media"')
        self.assertEqual(refs, self.x.VM.get_by_name_label("Other install media"))

    def test_first_boot_pool(self):
        pools = self.x.pool.get_all_records()
        self.assertEqual(len(pools), 1)
        pool = next(iter(pools.values()))
        hosts = self.x.host.get_all_records()
        self.assertEqual(len(hosts), 1)
        self.assertIn(pool["master"], hosts)
        host = hosts[pool["master"]]
        self.assertEqual(int(host["API_version_major"]), 2)
        self.assertGreaterEqual(int(host["API_version_minor"]), 21)
        for k in ("xapi", "product_version", "platform_version"):
            self.assertIn(k, host["software_version"])
        self.assertIs(self.x.host_metrics.get_live(host["metrics"]), True)
        cpus = [r for r in self.x.host_cpu.get_all_records().values() if r["host"] == pool["master"]]
        self.assertGreater(len(cpus), 0, "no host_cpu rows for the host")
        vms = self.x.VM.get_all_records()
        dom0 = [r for r in vms.values() if r["is_control_domain"]]
        self.assertEqual(len(dom0), 1, "control domains")
        tmpl = self.x.VM.get_by_name_label("Other install media")
        self.assertEqual(len(tmpl), 1)
        self.assertIs(self.x.VM.get_is_a_template(tmpl[0]), True)
        pifs = self.x.PIF.get_all_records()
        self.assertTrue(any(p["management"] and p["host"] == pool["master"] for p in pifs.values()),
                        "no management PIF on the master")
        for name in SEVEN_ROLES:
            with self.subTest(role=name):
                self.assertEqual(len(self.x.role.get_by_name_label(name)), 1, name)


class T3_Errors(unittest.TestCase, ErrorAsserts):
    @classmethod
    def setUpClass(cls):
        cls.p = c.proxy()
        cls.sess = c.raw_login(cls.p)

    @classmethod
    def tearDownClass(cls):
        cls.p.session.logout(cls.sess)

    def test_session_invalid(self):
        self.assertFailure(self.p.host.get_all(BOGUS_REF), "SESSION_INVALID", [BOGUS_REF])
        self.assertFailure(self.p.VM.get_all_records("not-a-session"), "SESSION_INVALID", ["not-a-session"])

    def test_authentication_failed(self):
        self.assertFailure(self.p.session.login_with_password("root", "wrong"), "SESSION_AUTHENTICATION_FAILED")

    def test_method_unknown(self):
        self.assertFailure(self.p.host.no_such_message(self.sess), "MESSAGE_METHOD_UNKNOWN", ["host.no_such_message"])
        self.assertFailure(self.p.nosuchclass.get_all(self.sess), "MESSAGE_METHOD_UNKNOWN", ["nosuchclass.get_all"])
        # Through XenAPI.py: the Failure carries the description.
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        try:
            with self.assertRaises(XenAPI.Failure) as cm:
                s.xenapi.VM.no_such_message()
            self.checkDescription(cm.exception.details, "MESSAGE_METHOD_UNKNOWN", ["VM.no_such_message"])
        finally:
            s.xenapi.session.logout()

    def test_parameter_count_mismatch(self):
        expected = str(len(message("host", "get_record")["params"]))  # session_id + self
        self.assertEqual(expected, "2")
        self.assertFailure(self.p.host.get_record(self.sess), "MESSAGE_PARAMETER_COUNT_MISMATCH",
                           ["host.get_record", expected, "1"])
        host = self.p.host.get_all(self.sess)["Value"][0]
        self.assertFailure(self.p.host.get_record(self.sess, host, "extra"), "MESSAGE_PARAMETER_COUNT_MISMATCH",
                           ["host.get_record", expected, "3"])
        n = str(len(message("network", "set_name_label")["params"]))
        self.assertFailure(self.p.network.set_name_label(self.sess, BOGUS_REF), "MESSAGE_PARAMETER_COUNT_MISMATCH",
                           ["network.set_name_label", n, "2"])

    def test_handle_invalid(self):
        self.assertFailure(self.p.VM.get_record(self.sess, BOGUS_REF), "HANDLE_INVALID", ["VM", BOGUS_REF])
        self.assertFailure(self.p.host.get_name_label(self.sess, BOGUS_REF), "HANDLE_INVALID", ["host", BOGUS_REF])
        self.assertFailure(self.p.network.set_name_label(self.sess, BOGUS_REF, "x"), "HANDLE_INVALID",
                           ["network", BOGUS_REF])
        # A ref of another class is not a handle of this one.
        host = self.p.host.get_all(self.sess)["Value"][0]
        self.assertFailure(self.p.VM.get_record(self.sess, host), "HANDLE_INVALID", ["VM", host])
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        try:
            with self.assertRaises(XenAPI.Failure) as cm:
                s.xenapi.VM.get_record(BOGUS_REF)
            self.checkDescription(cm.exception.details, "HANDLE_INVALID", ["VM", BOGUS_REF])
        finally:
            s.xenapi.session.logout()

    def test_uuid_invalid(self):
        for bad in ("not-a-uuid", str(uuidlib.UUID(int=0xe2e))):
            with self.subTest(uuid=bad):
                self.assertFailure(self.p.VM.get_by_uuid(self.sess, bad), "UUID_INVALID", ["VM", bad])
                self.assertFailure(self.p.host.get_by_uuid(self.sess, bad), "UUID_INVALID", ["host", bad])


class T4_Wire(unittest.TestCase, ErrorAsserts):
    """The stdlib xmlrpc.client sends <string> and <int> tags; xapi's own
    clients send bare strings and int64 as strings. Both must work."""

    @classmethod
    def setUpClass(cls):
        cls.p = c.proxy()
        cls.sess = c.raw_login(cls.p)

    @classmethod
    def tearDownClass(cls):
        cls.p.session.logout(cls.sess)

    def ok(self, r):
        self.assertIsInstance(r, dict, r)
        self.assertEqual(r.get("Status"), "Success", r)
        return r["Value"]

    def raw_xml(self, method, *params_xml, path="/"):
        body = ("<?xml version='1.0'?><methodCall><methodName>%s</methodName><params>%s</params></methodCall>"
                % (method, "".join("<param>%s</param>" % v for v in params_xml)))
        status, headers, data = c.http_post(path, body)
        self.assertEqual(status, 200, data[:300])
        (value,), _ = xmlrpc.client.loads(data)
        return value

    def test_login_on_every_xml_path(self):
        for path in ("/", "/RPC2", "/xmlrpc"):
            with self.subTest(path=path):
                p = c.proxy(path)
                sess = self.ok(p.session.login_with_password("root", c.PASSWORD))
                self.assertRegex(sess, r"^OpaqueRef:")
                self.ok(p.session.logout(sess))

    def test_tagged_int_and_string(self):
        p, s = self.p, self.sess
        label = "e2e-wire-ünïcødé-✓ <&> \"q\""
        ref = self.ok(p.network.create(s, network_rec(label, 1500)))  # <string> and <int> tags
        try:
            self.assertEqual(self.ok(p.network.get_name_label(s, ref)), label)
            self.assertEqual(int(self.ok(p.network.get_MTU(s, ref))), 1500)
            self.ok(p.network.set_MTU(s, ref, 9000))  # <int>
            self.assertEqual(int(self.ok(p.network.get_MTU(s, ref))), 9000)
            self.ok(p.network.set_MTU(s, ref, "1400"))  # int64 as a string, as xapi's clients send it
            self.assertEqual(int(self.ok(p.network.get_MTU(s, ref))), 1400)
            self.ok(p.network.set_other_config(s, ref, {"a": "1", "b": "two"}))
            self.assertEqual(self.ok(p.network.get_other_config(s, ref)), {"a": "1", "b": "two"})
            self.ok(p.network.set_tags(s, ref, ["t1", "t2"]))
            self.assertEqual(sorted(self.ok(p.network.get_tags(s, ref))), ["t1", "t2"])
        finally:
            self.ok(p.network.destroy(s, ref))

    def test_int64_travels_as_a_string(self):
        # xapi encodes int64 as a bare string <value>1500</value>; <i4> is for int32 only.
        net = self.ok(self.p.network.get_all(self.sess))[0]
        mtu = self.ok(self.p.network.get_MTU(self.sess, net))
        self.assertIsInstance(mtu, str, "int64 should arrive as a string, got %r" % (mtu,))
        self.assertEqual(mtu, str(int(mtu)))
        host = self.ok(self.p.host.get_all(self.sess))[0]
        major = self.ok(self.p.host.get_API_version_major(self.sess, host))
        self.assertEqual(major, "2")

    def test_hand_written_encodings(self):
        s = self.sess
        ref = self.ok(self.p.network.create(s, network_rec("e2e-raw")))
        try:
            for tag, v in (("i8", 1300), ("i4", 1200), ("int", 1100)):
                with self.subTest(tag=tag):
                    r = self.raw_xml("network.set_MTU", "<value>%s</value>" % s, "<value>%s</value>" % ref,
                                     "<value><%s>%d</%s></value>" % (tag, v, tag))
                    self.ok(r)
                    self.assertEqual(int(self.ok(self.p.network.get_MTU(s, ref))), v)
            # bare string, empty bare string, empty <string/>
            for xml, want in (("<value>e2e-bare</value>", "e2e-bare"), ("<value/>", ""),
                              ("<value><string></string></value>", ""), ("<value><string>tagged</string></value>", "tagged")):
                with self.subTest(value=xml):
                    self.ok(self.raw_xml("network.set_name_description", "<value>%s</value>" % s,
                                         "<value>%s</value>" % ref, xml))
                    self.assertEqual(self.ok(self.p.network.get_name_description(s, ref)), want)
        finally:
            self.ok(self.p.network.destroy(s, ref))

    def test_boolean(self):
        pool = self.ok(self.p.pool.get_all(self.sess))[0]
        old = self.ok(self.p.pool.get_policy_no_vendor_device(self.sess, pool))
        try:
            for v in (True, False, True):
                self.ok(self.p.pool.set_policy_no_vendor_device(self.sess, pool, v))
                self.assertIs(self.ok(self.p.pool.get_policy_no_vendor_device(self.sess, pool)), v)
        finally:
            self.ok(self.p.pool.set_policy_no_vendor_device(self.sess, pool, old))

    def test_xml_replies_follow_xo_parser_rules(self):
        # @vates/xml-rpc (Xen Orchestra) crashes on <i8> and on whitespace
        # between tags, and loses empty <string></string>.
        for method in ("host.get_all_records", "VM.get_all_records", "pool.get_all_records",
                       "network.get_all_records", "host_cpu.get_all_records"):
            with self.subTest(method=method):
                body = xmlrpc.client.dumps((self.sess,), methodname=method)
                status, headers, data = c.http_post("/xmlrpc", body)
                self.assertEqual(status, 200)
                self.assertIn(headers.get("content-type"), ("text/xml", "application/xml"))
                self.assertNotIn(b"<i8>", data)
                self.assertNotIn(b"<string></string>", data)
                self.assertNotIn(b"<string/>", data)
                self.assertIsNone(re.search(rb">\r?\n[ \t]*<", data), "pretty-printed XML")
                (value,), _ = xmlrpc.client.loads(data)
                self.assertEqual(value["Status"], "Success")

    def test_json_rpc_v2_and_v1(self):
        status, headers, data = c.json_call("session.login_with_password", ["root", c.PASSWORD], id_=5)
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("content-type"), "application/json",
                         "xen-api requires exactly application/json (no charset)")
        r = json.loads(data)
        self.assertEqual(r.get("jsonrpc"), "2.0", r)
        self.assertEqual(r.get("id"), 5)
        sess = r["result"]
        self.assertRegex(sess, r"^OpaqueRef:")
        # v2 failure: error {code: int, message: CODE, data: [params]}
        status, headers, data = c.json_call("host.get_all", [BOGUS_REF], id_="str-id")
        self.assertEqual(status, 200)
        r = json.loads(data)
        self.assertEqual(r.get("id"), "str-id")
        err = r.get("error")
        self.assertIsInstance(err, dict, r)
        self.assertIsInstance(err.get("code"), int, r)
        self.assertEqual(err.get("message"), "SESSION_INVALID", r)
        self.assertEqual(err.get("data"), [BOGUS_REF], r)
        # v1 (no jsonrpc member): result and error; error is [code, params...]
        status, headers, data = c.json_call("host.get_all", [sess], version="1.0", id_=9)
        self.assertEqual(status, 200)
        r = json.loads(data)
        self.assertEqual(r.get("id"), 9)
        self.assertIsNone(r.get("error"), r)
        self.assertEqual(len(r.get("result")), 1, r)
        status, headers, data = c.json_call("host.get_all", [BOGUS_REF], version="1.0", id_=10)
        r = json.loads(data)
        self.assertIsNone(r.get("result"), r)
        self.checkDescription(r.get("error"), "SESSION_INVALID", [BOGUS_REF])
        # int64 is a JSON number on this transport
        net = json.loads(c.json_call("network.get_all", [sess])[2])["result"][0]
        mtu = json.loads(c.json_call("network.get_MTU", [sess, net])[2])["result"]
        self.assertIsInstance(mtu, int, mtu)
        c.json_call("session.logout", [sess])


class T5_Events(unittest.TestCase, ErrorAsserts):
    @classmethod
    def setUpClass(cls):
        cls.s = XenAPI.Session(c.URL)
        cls.s.xenapi.login_with_password("root", c.PASSWORD)
        cls.x = cls.s.xenapi
        cls.tmpl = cls.x.VM.get_by_name_label("Other install media")[0]

    @classmethod
    def tearDownClass(cls):
        cls.s.xenapi.session.logout()

    def check_batch(self, r):
        self.assertIsInstance(r, dict)
        for k in ("events", "valid_ref_counts", "token"):
            self.assertIn(k, r)
        self.assertIsInstance(r["token"], str)
        self.assertIsInstance(r["events"], list)
        for k, v in r["valid_ref_counts"].items():
            self.assertIsInstance(v, int, "valid_ref_counts[%s]" % k)
        # xen-api reads valid_ref_counts.task on every batch.
        self.assertIn("task", r["valid_ref_counts"])
        for ev in r["events"]:
            for k in ("id", "class", "operation", "ref"):
                self.assertIn(k, ev, ev)
            self.assertIn(ev["operation"], ("add", "mod", "del"))
            if ev["operation"] != "del":
                self.assertIsInstance(ev.get("snapshot"), dict, ev)
        return r

    def test_initial_batch_is_adds_with_snapshots(self):
        refs = set(self.x.VM.get_all())
        r = self.check_batch(event_from(self.x, ["vm"], "", 1.0))
        evs = r["events"]
        self.assertEqual(sorted(e["ref"] for e in evs), sorted(refs), "one event per VM")
        for e in evs:
            self.assertEqual(e["class"], "vm")
            self.assertEqual(e["operation"], "add")
            self.assertEqual(e["snapshot"]["uuid"], self.x.VM.get_uuid(e["ref"]))
        self.assertEqual(r["valid_ref_counts"].get("vm"), len(refs))
        self.assertNotEqual(r["token"], "")

    def test_class_names_are_case_insensitive(self):
        a = event_from(self.x, ["vm"], "", 1.0)
        b = self.check_batch(event_from(self.x, ["VM"], "", 1.0))
        self.assertEqual(sorted(e["ref"] for e in a["events"]), sorted(e["ref"] for e in b["events"]))

    def test_star_subscribes_to_everything(self):
        r = self.check_batch(event_from(self.x, ["*"], "", 1.0))
        classes = {e["class"] for e in r["events"]}
        for cl in ("vm", "host", "pool", "network", "pif"):
            self.assertIn(cl, classes)

    def test_write_then_mod(self):
        tok = event_from(self.x, ["vm"], "", 1.0)["token"]
        old = self.x.VM.get_name_description(self.tmpl)
        # VM.add_to_other_config is an explicit message in xapi; the implicit
        # name_description setter is the plainest write there is.
        desc = "e2e-%d" % time.time_ns()
        self.x.VM.set_name_description(self.tmpl, desc)
        try:
            t0 = time.monotonic()
            r = self.check_batch(event_from(self.x, ["vm"], tok, 10.0))
            self.assertLess(time.monotonic() - t0, 5.0)
            mods = [e for e in r["events"] if e["ref"] == self.tmpl]
            self.assertEqual(len(mods), 1, r["events"])
            self.assertEqual(mods[0]["operation"], "mod")
            self.assertEqual(mods[0]["snapshot"]["name_description"], desc)
            self.assertEqual([e for e in r["events"] if e["operation"] == "add"], [], "old VMs came back as add")
            self.assertNotEqual(r["token"], tok)
        finally:
            self.x.VM.set_name_description(self.tmpl, old)

    def test_blocks_until_a_change(self):
        tok = event_from(self.x, ["vm"], "", 1.0)["token"]
        out = {}

        def watch():
            s = XenAPI.Session(c.URL)
            s.xenapi.login_with_password("root", c.PASSWORD)
            try:
                out["r"] = event_from(s.xenapi, ["vm"], tok, 20.0)
                out["t"] = time.monotonic()
            except Exception as e:  # reported below
                out["e"] = e
            finally:
                s.xenapi.session.logout()

        th = threading.Thread(target=watch, daemon=True)
        th.start()
        time.sleep(1.5)
        self.assertTrue(th.is_alive() or out.get("r", {}).get("events"),
                        "event.from returned an empty batch before its timeout: %r" % (out,))
        old = self.x.VM.get_name_description(self.tmpl)
        t_write = time.monotonic()
        self.x.VM.set_name_description(self.tmpl, "e2e-block-%d" % time.time_ns())
        try:
            th.join(10)
            self.assertFalse(th.is_alive(), "event.from did not wake up within 10 s of a change")
            self.assertNotIn("e", out, out.get("e"))
            self.assertLess(out["t"] - t_write, 5.0)
            self.assertIn(self.tmpl, [e["ref"] for e in out["r"]["events"]])
        finally:
            self.x.VM.set_name_description(self.tmpl, old)

    def test_timeout_returns_empty_batch(self):
        r = event_from(self.x, ["vm"], "", 1.0)
        tok = r["token"]
        t0 = time.monotonic()
        r = self.check_batch(event_from(self.x, ["vm"], tok, 1.0))
        dt = time.monotonic() - t0
        self.assertEqual(r["events"], [])
        self.assertGreaterEqual(dt, 0.5, "returned at once instead of waiting for the timeout")
        self.assertLess(dt, 6.0)

    def test_add_and_del(self):
        tok = event_from(self.x, ["network"], "", 1.0)["token"]
        label = "e2e-ev-%d" % time.time_ns()
        ref = self.x.network.create(network_rec(label))
        r = self.check_batch(event_from(self.x, ["network"], tok, 10.0))
        ev = [e for e in r["events"] if e["ref"] == ref]
        self.assertEqual(len(ev), 1, r["events"])
        self.assertEqual(ev[0]["operation"], "add")
        self.assertEqual(ev[0]["class"], "network")
        self.assertEqual(ev[0]["snapshot"]["name_label"], label)
        tok = r["token"]
        self.x.network.destroy(ref)
        r = self.check_batch(event_from(self.x, ["network"], tok, 10.0))
        ev = [e for e in r["events"] if e["ref"] == ref]
        self.assertEqual([e["operation"] for e in ev], ["del"], r["events"])

    def test_single_object_subscription(self):
        r = self.check_batch(event_from(self.x, ["vm/" + self.tmpl], "", 1.0))
        self.assertEqual([(e["ref"], e["operation"]) for e in r["events"]], [(self.tmpl, "add")])

    def test_bad_token(self):
        with self.assertRaises(XenAPI.Failure) as cm:
            event_from(self.x, ["vm"], "not-a-token", 1.0)
        self.checkDescription(cm.exception.details, "EVENT_FROM_TOKEN_PARSE_FAILURE", ["not-a-token"])

    def test_inject(self):
        pool = self.x.pool.get_all()[0]
        tok = self.x.event.inject("pool", pool)
        self.assertIsInstance(tok, str)
        t0 = time.monotonic()
        r = self.check_batch(event_from(self.x, ["pool"], tok, 10.0))
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertIn((pool, "mod"), [(e["ref"], e["operation"]) for e in r["events"]])

    def test_async_task(self):
        label = "e2e-async-%d" % time.time_ns()
        task = self.x.Async.network.create(network_rec(label))
        self.assertRegex(task, r"^OpaqueRef:")
        deadline = time.monotonic() + 10
        while self.x.task.get_status(task) == "pending":
            self.assertLess(time.monotonic(), deadline, "task still pending after 10 s")
            time.sleep(0.05)
        rec = self.x.task.get_record(task)
        self.assertEqual(rec["status"], "success", rec)
        m = re.fullmatch(r"<value>(OpaqueRef:[^<]+)</value>", rec["result"])
        self.assertIsNotNone(m, "task.result should be an XML-RPC value: %r" % rec["result"])
        net = m.group(1)
        self.assertEqual(self.x.network.get_name_label(net), label)
        self.x.task.destroy(task)
        with self.assertRaises(XenAPI.Failure) as cm:
            self.x.task.get_record(task)
        self.checkDescription(cm.exception.details, "HANDLE_INVALID", ["task", task])
        self.x.network.destroy(net)


class T6_Concurrency(unittest.TestCase):
    """Many Async calls at once while several event.from watchers run."""

    N = 100

    def test_parallel_async_calls_and_watchers(self):
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        x = s.xenapi
        tok = event_from(x, ["network"], "", 1.0)["token"]
        prefix = "e2e-par-%d-" % time.time_ns()
        stop = threading.Event()
        seen = [set() for _ in range(4)]
        errors = []

        def watcher(i):
            ws = XenAPI.Session(c.URL)
            ws.xenapi.login_with_password("root", c.PASSWORD)
            t = tok
            try:
                while not stop.is_set():
                    r = event_from(ws.xenapi, ["network"], t, 1.0)
                    t = r["token"]
                    for e in r["events"]:
                        if e["operation"] == "add" and e["snapshot"]["name_label"].startswith(prefix):
                            seen[i].add(e["ref"])
            except Exception as e:
                errors.append("watcher %d: %r" % (i, e))
            finally:
                ws.xenapi.session.logout()

        def create(i):
            p = c.proxy()
            sess = c.raw_login(p)
            try:
                r = p.Async.network.create(sess, network_rec(prefix + str(i)))
                self.assertEqual(r.get("Status"), "Success", r)
                task = r["Value"]
                deadline = time.monotonic() + 30
                while True:
                    st = p.task.get_status(sess, task)["Value"]
                    if st != "pending":
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError("task %s pending after 30 s" % task)
                    time.sleep(0.05)
                rec = p.task.get_record(sess, task)["Value"]
                self.assertEqual(st, "success", rec)
                p.task.destroy(sess, task)
                return re.fullmatch(r"<value>(OpaqueRef:[^<]+)</value>", rec["result"]).group(1)
            finally:
                p.session.logout(sess)

        watchers = [threading.Thread(target=watcher, args=(i,), daemon=True) for i in range(len(seen))]
        for w in watchers:
            w.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
                refs = list(pool.map(create, range(self.N)))
            self.assertEqual(len(set(refs)), self.N)
            names = {x.network.get_name_label(r) for r in refs}
            self.assertEqual(names, {prefix + str(i) for i in range(self.N)})
            deadline = time.monotonic() + 15
            while any(len(sv) < self.N for sv in seen) and time.monotonic() < deadline and not errors:
                time.sleep(0.1)
            self.assertEqual(errors, [])
            for i, sv in enumerate(seen):
                self.assertEqual(sv, set(refs), "watcher %d saw %d of %d adds" % (i, len(sv & set(refs)), self.N))
        finally:
            stop.set()
            for w in watchers:
                w.join(10)
            for ref, rec in x.network.get_all_records().items():
                if rec["name_label"].startswith(prefix):
                    x.network.destroy(ref)
            s.xenapi.session.logout()


if __name__ == "__main__":
    c.main()
