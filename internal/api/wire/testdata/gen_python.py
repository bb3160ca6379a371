# Regenerates the python_*.xml fixtures with Python's own xmlrpc.client:
#   python3 gen_python.py
import datetime
import xmlrpc.client as x

def write(name, params, method):
    body = x.dumps(params, method, allow_none=True)
    with open(name, "w", encoding="utf-8", newline="") as f:
        f.write(body)

write("python_get_record.xml", ("OpaqueRef:abc", "OpaqueRef:9f1c"), "VM.get_record")
write("python_login.xml", ("root", "pässwörd&<>", "2.3", "XenAPI.py"), "session.login_with_password")
write("python_all_types.xml", (
    1, -2, 2**31 - 1, 1.5, 1e20, float("nan"), True, False, None,
    "", "  ", "a\r\nb\tc", "é€😀&<>\"'",
    x.DateTime(datetime.datetime(2024, 1, 2, 3, 4, 5)),
    x.Binary(b"\x00\x01binary data" * 10),
    {"k": [1, {}, []], "": "e"}, [], {},
), "test.all")
write("python_list_methods.xml", (), "system.listMethods")
