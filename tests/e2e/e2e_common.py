"""Shared helpers for the Python end-to-end suites (test_xenapi.py, test_flood.py).

run.sh starts a fresh toolstackd per suite and passes E2E_URL and E2E_PASSWORD.
Nothing here talks to anything but that daemon.
"""

import http.client
import importlib.util
import json
import os
import sys
import unittest
import urllib.parse
import xmlrpc.client

URL = os.environ.get("E2E_URL", "http://127.0.0.1:8080")
PASSWORD = os.environ.get("E2E_PASSWORD", "secret")
_parsed = urllib.parse.urlsplit(URL)
HOST = _parsed.hostname
PORT = _parsed.port or 80

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATAMODEL_DIR = os.path.join(REPO, "internal", "datamodel")

XENAPI_PY = "/usr/lib/python3/dist-packages/os_xenapi/client/XenAPI.py"


def load_xenapi():
    """Debian's python3-os-xenapi XenAPI.py, unmodified.

    `from os_xenapi.client import XenAPI` works when the interpreter sees
    Debian's dist-packages and pbr is installed (the package __init__ imports
    pbr). Otherwise load the file itself: it needs only the standard library.
    """
    try:
        from os_xenapi.client import XenAPI  # type: ignore

        return XenAPI
    except Exception:  # ImportError, or pbr failing inside os_xenapi/__init__
        pass
    if not os.path.exists(XENAPI_PY):
        # Not a skip: CI installs it (scripts/install-test-deps.sh), and a
        # missing client must not turn into a green run.
        raise RuntimeError("python3-os-xenapi is not installed (%s missing)" % XENAPI_PY)
    spec = importlib.util.spec_from_file_location("XenAPI", XENAPI_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_datamodel():
    with open(os.path.join(DATAMODEL_DIR, "datamodel.json")) as f:
        dm = json.load(f)
    with open(os.path.join(DATAMODEL_DIR, "errors.json")) as f:
        errors = json.load(f)
    return dm, errors


def proxy(path="/"):
    """A stdlib ServerProxy on the given path (/, /RPC2, /xmlrpc)."""
    return xmlrpc.client.ServerProxy(URL.rstrip("/") + path, allow_none=False)


def raw_login(p=None):
    p = p or proxy()
    r = p.session.login_with_password("root", PASSWORD)
    assert r.get("Status") == "Success", r
    return r["Value"]


def http_post(path, body, content_type="text/xml", timeout=30, headers=None):
    """One POST on a fresh connection; returns (status, headers dict, body bytes)."""
    if isinstance(body, str):
        body = body.encode("utf-8")
    conn = http.client.HTTPConnection(HOST, PORT, timeout=timeout)
    try:
        h = {"Content-Type": content_type} if content_type is not None else {}
        h.update(headers or {})
        conn.request("POST", path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def json_call(method, params, version="2.0", id_=1, path="/jsonrpc"):
    req = {"method": method, "params": params, "id": id_}
    if version == "2.0":
        req["jsonrpc"] = "2.0"
    status, headers, data = http_post(path, json.dumps(req), content_type="application/json")
    return status, headers, data


def main():
    """unittest.main, plus the machine-readable line run.sh reads:
    E2E-SUMMARY passed=N failed=N (errors count as failures, skips as neither)."""
    verbosity = 2 if "-v" in sys.argv else 1
    argv = [a for a in sys.argv if a != "-v"]
    prog = unittest.main(module="__main__", argv=argv, exit=False, verbosity=verbosity,
                         testRunner=unittest.TextTestRunner(stream=sys.stdout, verbosity=verbosity))
    r = prog.result

    # Count test methods, not subtests: a method with failing subtests is one
    # failure. Errors in setUpClass show up as one failure of their own.
    def tid(t):
        return getattr(t, "test_case", t).id()

    failed_ids = {tid(t) for t, _ in r.failures + r.errors} | {tid(t) for t in r.unexpectedSuccesses}
    skipped_ids = {tid(t) for t, _ in r.skipped} - failed_ids
    ran_failed = len([i for i in failed_ids if "setUpClass" not in i and "tearDownClass" not in i])
    passed = max(0, r.testsRun - ran_failed - len(skipped_ids) - len(r.expectedFailures))
    failed = len(failed_ids)
    print("E2E-SUMMARY passed=%d failed=%d" % (passed, failed), flush=True)
    sys.exit(1 if failed else 0)
