#!/usr/bin/env python3
"""Malformed, oversized and odd requests against a running toolstackd, then a
normal XenAPI.py login that must still work. run.sh gives this suite its own
daemon.

Every request must get an HTTP answer within REQUEST_TIMEOUT: garbage is a
client error (4xx, or 200 with an XML-RPC/JSON-RPC failure), never a hang, a
dropped connection or a 5xx. Bodies over the server's size limit must be
refused with an HTTP error (413 expected) instead of being read forever.
"""

import concurrent.futures
import http.client
import json
import random
import socket
import time
import unittest

import e2e_common as c

socket.setdefaulttimeout(60)

XenAPI = c.load_xenapi()

REQUEST_TIMEOUT = 15
HUGE = 64 << 20  # 64 MiB


def post(path, body, content_type="text/xml", headers=None):
    """Returns (status, body) or raises (timeout, reset...)."""
    status, _, data = c.http_post(path, body, content_type=content_type, timeout=REQUEST_TIMEOUT, headers=headers)
    return status, data


def malformed_requests():
    """(name, path, body, content_type) for a few hundred bad requests."""
    reqs = []
    xml_paths = ["/", "/RPC2", "/xmlrpc"]
    garbage = [
        b"",
        b"garbage",
        b"\x00\x01\x02\xff\xfe" * 50,
        b"<",
        b"<?xml version='1.0'?>",
        b"<methodCall>",
        b"<methodCall><methodName>session.login_with_password</methodName><params><param><value>root",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><struct><member>",
        b"<methodCall><methodName></methodName><params/></methodCall>",
        b"<methodCall><params/></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><i4>notanint</i4></value></param></params></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><double>x</double></value></param></params></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><boolean>7</boolean></value></param></params></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><dateTime.iso8601>never</dateTime.iso8601></value></param></params></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><base64>!!!</base64></value></param></params></methodCall>",
        b"<methodCall><methodName>host.get_all</methodName><params><param><value><nosuchtype>1</nosuchtype></value></param></params></methodCall>",
        b"<methodCall><methodName>a</methodName></methodCall><methodCall>",
        b"<!DOCTYPE x [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\"><!ENTITY c \"&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;\">]><methodCall><methodName>&c;</methodName></methodCall>",
        b"{\"method\": \"session.login_with_password\"}",
        "<methodCall><methodName>h\u00e9\u00e9</methodName></methodCall>".encode("latin-1"),
    ]
    # Deep nesting, under the daemon's 4 MiB body limit (about 1.7 MB here)
    # but deep enough to hurt a recursive decoder.
    depth = 40000
    garbage.append(b"<methodCall><methodName>host.get_all</methodName><params><param>"
                   + b"<value><array><data>" * depth + b"</data></array></value>" * depth
                   + b"</param></params></methodCall>")
    garbage.append(b"<methodCall><methodName>host.get_all</methodName><params><param>"
                   + b"<value><array><data>" * depth)
    for i, g in enumerate(garbage):
        for p in xml_paths:
            reqs.append(("xml garbage #%d on %s" % (i, p), p, g, "text/xml"))
    # Truncations of a valid call at every few bytes.
    valid = ("<?xml version='1.0'?><methodCall><methodName>session.login_with_password</methodName>"
             "<params><param><value><string>root</string></value></param>"
             "<param><value><string>%s</string></value></param></params></methodCall>" % c.PASSWORD).encode()
    for cut in range(0, len(valid) - 1, 7):
        reqs.append(("truncated xml at %d" % cut, "/", valid[:cut], "text/xml"))
    # Wrong or missing Content-Type on both kinds of endpoint.
    for ct in (None, "application/json", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
               "text/plain", "image/png", "text/xml; charset=ebcdic"):
        reqs.append(("xml body with Content-Type %s" % ct, "/", valid, ct))
        reqs.append(("json body with Content-Type %s" % ct, "/jsonrpc",
                     json.dumps({"jsonrpc": "2.0", "id": 1, "method": "host.get_all", "params": ["x"]}).encode(), ct))
    # Invalid JSON and JSON-RPC shapes.
    jsons = [
        b"", b"{", b"}", b"[", b"null", b"42", b"\"str\"", b"[]", b"{}", b"[1,2,3]",
        b"{\"jsonrpc\":\"2.0\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":42,\"params\":[]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":\"notalist\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":{\"a\":1}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":{\"x\":1},\"method\":\"host.get_all\",\"params\":[]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"host.get_all\",\"params\":[]}",
        b"{\"jsonrpc\":\"3.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[1e999999]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[\"\\ud800\"]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[NaN]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[]}trailing",
        b"\xff\xfe{\"jsonrpc\":\"2.0\"}",
        b"[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"host.get_all\",\"params\":[]}]",
        b"[" * 100000 + b"]" * 100000,
        b"{\"a\":" * 100000 + b"1" + b"}" * 100000,
    ]
    for i, j in enumerate(jsons):
        reqs.append(("bad json #%d" % i, "/jsonrpc", j, "application/json"))
    # JSON-RPC without an id (a notification), v1 and v2.
    for m, params in (("session.login_with_password", ["root", c.PASSWORD]), ("host.get_all", ["x"]),
                      ("system.listMethods", [])):
        reqs.append(("json-rpc 2.0 without id: %s" % m, "/jsonrpc",
                     json.dumps({"jsonrpc": "2.0", "method": m, "params": params}).encode(), "application/json"))
        reqs.append(("json-rpc 1.0 without id: %s" % m, "/jsonrpc",
                     json.dumps({"method": m, "params": params}).encode(), "application/json"))
        reqs.append(("json-rpc null id: %s" % m, "/jsonrpc",
                     json.dumps({"jsonrpc": "2.0", "id": None, "method": m, "params": params}).encode(),
                     "application/json"))
    # Seeded mutations of valid XML-RPC and JSON-RPC calls: flipped, dropped
    # and duplicated bytes, plus plain random bytes.
    rng = random.Random(20261120)
    valid_json = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "session.login_with_password",
                             "params": ["root", c.PASSWORD]}).encode()
    for i in range(200):
        path, base, ct = rng.choice([("/", valid, "text/xml"), ("/RPC2", valid, "text/xml"),
                                     ("/jsonrpc", valid_json, "application/json")])
        b = bytearray(base)
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif kind == 1:
            lo = rng.randrange(len(b))
            del b[lo: lo + rng.randint(1, 40)]
        elif kind == 2:
            lo = rng.randrange(len(b))
            b[lo:lo] = b[lo: lo + rng.randint(1, 60)] * rng.randint(2, 50)
        else:
            b = bytearray(rng.randbytes(rng.randint(1, 4096)))
        reqs.append(("mutation #%d (%d) on %s" % (i, kind, path), path, bytes(b), ct))
    # Odd paths.
    for p in ("/nope", "/jsonrpc/extra", "/RPC2/../jsonrpc", "//", "/%00", "/" + "a" * 4000):
        reqs.append(("path %s" % p[:40], p, valid, "text/xml"))
    return reqs


class T1_Malformed(unittest.TestCase):
    def test_malformed_requests_get_answers(self):
        reqs = malformed_requests()
        self.assertGreater(len(reqs), 200)
        problems = []
        no_id_success = []

        def one(req):
            name, path, body, ct = req
            t0 = time.monotonic()
            try:
                status, data = post(path, body, content_type=ct)
            except Exception as e:
                return name, None, "%s: %s after %.1f s" % (type(e).__name__, e, time.monotonic() - t0), b""
            return name, status, None, data

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            for name, status, err, data in pool.map(one, reqs):
                if err is not None:
                    problems.append("%s: no HTTP answer (%s)" % (name, err))
                elif status >= 500:
                    problems.append("%s: HTTP %d %r" % (name, status, data[:120]))
                elif "without id" in name or "null id" in name:
                    # xapi rejects JSON-RPC notifications; a notification must
                    # not be executed and answered like a call.
                    try:
                        r = json.loads(data) if data else None
                    except ValueError:
                        r = None
                    if isinstance(r, dict) and r.get("result") is not None and r.get("error") is None:
                        no_id_success.append("%s: answered %r" % (name, data[:120]))
        self.assertEqual(problems, [], "%d of %d malformed requests were mishandled" % (len(problems), len(reqs)))
        self.assertEqual(no_id_success, [], "JSON-RPC requests without an id were executed")

    def test_get_and_other_methods(self):
        problems = []
        for method in ("GET", "PUT", "DELETE", "PATCH", "TRACE"):
            for path in ("/", "/jsonrpc", "/RPC2"):
                conn = http.client.HTTPConnection(c.HOST, c.PORT, timeout=REQUEST_TIMEOUT)
                try:
                    conn.request(method, path, body=b"x" if method in ("PUT", "PATCH") else None)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status >= 500:
                        problems.append("%s %s: HTTP %d" % (method, path, resp.status))
                except Exception as e:
                    problems.append("%s %s: %s" % (method, path, e))
                finally:
                    conn.close()
        self.assertEqual(problems, [])


def send_huge(path, content_type, chunked):
    """Streams HUGE bytes of a never-ending string parameter. Returns
    (status or None, how many body bytes were sent, seconds, note)."""
    head = {
        "text/xml": b"<methodCall><methodName>session.login_with_password</methodName><params><param><value><string>",
        "application/json": b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"session.login_with_password\",\"params\":[\"",
    }[content_type]
    s = socket.create_connection((c.HOST, c.PORT), timeout=REQUEST_TIMEOUT)
    t0 = time.monotonic()
    sent = 0
    note = ""
    try:
        hdr = "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n" % (path, c.HOST, c.PORT, content_type)
        hdr += "Transfer-Encoding: chunked\r\n\r\n" if chunked else "Content-Length: %d\r\n\r\n" % HUGE
        s.sendall(hdr.encode())
        chunk = b"A" * (1 << 20)
        body_total = HUGE
        first = True
        try:
            while sent < body_total:
                piece = (head + chunk[len(head):]) if first else chunk
                first = False
                piece = piece[: body_total - sent]
                if chunked:
                    s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                else:
                    s.sendall(piece)
                sent += len(piece)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError) as e:
            note = "server stopped reading after %d bytes (%s)" % (sent, type(e).__name__)
        except socket.timeout:
            note = "send blocked for %d s after %d bytes" % (REQUEST_TIMEOUT, sent)
        # Read whatever status line the server wrote.
        data = b""
        try:
            while b"\r\n" not in data:
                more = s.recv(4096)
                if not more:
                    break
                data += more
        except (ConnectionResetError, socket.timeout) as e:
            note += "; reading the reply: %s" % type(e).__name__
        status = None
        if data.startswith(b"HTTP/1."):
            try:
                status = int(data.split(b" ", 2)[1])
            except (ValueError, IndexError):
                pass
        return status, sent, time.monotonic() - t0, note
    finally:
        s.close()


class T2_Huge(unittest.TestCase):
    def test_64MiB_bodies_are_refused(self):
        results = []
        for path, ct in (("/", "text/xml"), ("/jsonrpc", "application/json")):
            for chunked in (False, True):
                with self.subTest(path=path, chunked=chunked):
                    status, sent, secs, note = send_huge(path, ct, chunked)
                    results.append((path, chunked, status, sent, secs, note))
                    self.assertIsNotNone(status, "64 MiB to %s (chunked=%s): no HTTP status; %s" % (path, chunked, note))
                    self.assertTrue(400 <= status < 500,
                                    "64 MiB to %s (chunked=%s): HTTP %s, expected 413" % (path, chunked, status))
                    self.assertLess(secs, 30)
        for r in results:
            print("  huge body %s chunked=%s -> HTTP %s after %d bytes, %.1f s %s" % r)


class T3_StillWorks(unittest.TestCase):
    def test_login_and_host_get_all_after_the_flood(self):
        s = XenAPI.Session(c.URL)
        s.xenapi.login_with_password("root", c.PASSWORD)
        try:
            hosts = s.xenapi.host.get_all()
            self.assertEqual(len(hosts), 1)
            self.assertRegex(hosts[0], r"^OpaqueRef:")
            status, headers, data = c.json_call("session.login_with_password", ["root", c.PASSWORD])
            self.assertEqual(status, 200)
            self.assertRegex(json.loads(data)["result"], r"^OpaqueRef:")
        finally:
            s.xenapi.session.logout()


if __name__ == "__main__":
    c.main()
