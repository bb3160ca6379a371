package wire

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// xmlCall encodes a methodCall with the package's own value encoder.
func xmlCall(method string, params []any) []byte {
	var b bytes.Buffer
	e := NewXMLEncoder(&b)
	e.raw(`<?xml version="1.0"?><methodCall><methodName>`)
	e.buf = appendXMLText(e.buf, method)
	e.raw(`</methodName><params>`)
	for _, p := range params {
		e.raw(`<param>`)
		Encode(e, p)
		e.raw(`</param>`)
	}
	e.raw(`</params></methodCall>`)
	if err := e.Flush(); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// xmlView is what v reads back as after an XML-RPC trip: int64 travels as a
// bare string (xapi's rule), so it comes back as a string.
func xmlView(v any) any {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10)
	case []any:
		out := make([]any, len(x))
		for i, el := range x {
			out[i] = xmlView(el)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, el := range x {
			out[k] = xmlView(el)
		}
		return out
	}
	return v
}

// jsonCall encodes a JSON-RPC 2.0 call with the package's own encoder.
func jsonCall(method string, params []any) []byte {
	var b bytes.Buffer
	e := NewJSONEncoder(&b)
	e.raw(`{"jsonrpc":"2.0","method":`)
	e.buf = appendJSONString(e.buf, method)
	e.raw(`,"params":`)
	Encode(e, params)
	e.raw(`,"id":0}`)
	if err := e.Flush(); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// roundTripValues are neutral values that survive both encodings.
var roundTripValues = []any{
	"", "plain", "  spaced  ", "\n", "tab\tnew\nline\r\ncr\r", `<&>"'`, "é€😀\u2028",
	"OpaqueRef:NULL", "123", "true",
	int64(0), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), int64(1 << 53),
	0.0, 1.0, -2.5, sum03, 1e20, 1e-300, math.MaxFloat64, 5e-324, 60.1, 1.0 / 3,
	true, false, nil,
	[]any{}, []any{"a", int64(1), []any{nil, false}},
	map[string]any{}, map[string]any{"": "", "k": map[string]any{"x": []any{1.5}}},
	map[string]any{"<tag>": "&", "a\nb": "c"},
}

func TestRoundTripXML(t *testing.T) {
	values := append([]any{
		math.NaN(), math.Inf(1), math.Inf(-1),
		date, time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		[]byte{}, []byte("\x00\xff binary"),
		map[string]any{"t": date, "b": []byte("x")},
	}, roundTripValues...)
	_, params, err := DecodeXMLRequest(bytes.NewReader(xmlCall("VM.get_record", values)))
	if err != nil {
		t.Fatal(err)
	}
	if len(params) != len(values) {
		t.Fatalf("got %d params, want %d", len(params), len(values))
	}
	for i := range values {
		if want := xmlView(values[i]); !equal(params[i], want) {
			t.Errorf("%d: got %#v, want %#v", i, params[i], want)
		}
	}
}

func TestRoundTripJSON(t *testing.T) {
	req, err := DecodeJSONRequest(jsonCall("VM.get_record", roundTripValues))
	if err != nil {
		t.Fatal(err)
	}
	if !equal(req.Params, roundTripValues) {
		t.Errorf("\n got %#v\nwant %#v", req.Params, roundTripValues)
	}
	// Int32, dates, bytes and special floats turn into other neutral values.
	req, err = DecodeJSONRequest(jsonCall("m", []any{Int32(7), date, []byte("hi"), math.NaN(), math.Inf(-1)}))
	if err != nil {
		t.Fatal(err)
	}
	want := []any{int64(7), "20240102T03:04:05Z", "aGk=", "NaN", "-Infinity"}
	if !equal(req.Params, want) {
		t.Errorf("\n got %#v\nwant %#v", req.Params, want)
	}
}

// TestJSONOutputIsStandard checks encoder output against encoding/json.
func TestJSONOutputIsStandard(t *testing.T) {
	for _, tc := range encodeCases {
		var v any
		if err := json.Unmarshal([]byte(jsonValue(tc.v)), &v); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	for _, s := range []string{"a\xffb", "\x00\x1f\x7f", "\u2028\u2029", "\"\\/", "\xed\xa0\x80"} {
		got := jsonValue(s)
		var back string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Errorf("%q -> %s: %v", s, got, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); s != "\xed\xa0\x80" && back != want {
			t.Errorf("%q -> %s -> %q, want %q", s, got, back, want)
		}
	}
}

// TestPythonParsesOutput feeds replies to Python's xmlrpc.client and json,
// parsers nobody here wrote. Skipped when python3 is not installed.
func TestPythonParsesOutput(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	value := map[string]any{
		"s": "a&b<c>\"d'\r\n\tz\x01\xff", "i": int64(math.MaxInt64), "i4": Int32(-5),
		"f": sum03, "nan": math.NaN(), "inf": math.Inf(1), "b": true, "t": date,
		"bin": []byte("\x00hi"), "nil": nil, "l": []any{}, "m": map[string]any{},
		"vrc": map[string]any{"vm": Int32(3)},
	}
	var x, j bytes.Buffer
	if err := WriteXMLSuccess(&x, value); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSONSuccess(&j, &JSONRequest{ID: []byte(`"i"`), V2: true}, value); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	xf, jf := filepath.Join(dir, "r.xml"), filepath.Join(dir, "r.json")
	if err := os.WriteFile(xf, x.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jf, j.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `
import sys, json, math, xmlrpc.client
# XenAPI.py uses ServerProxy's defaults: DateTime and Binary wrappers.
(r,), m = xmlrpc.client.loads(open(sys.argv[1], "rb").read())
assert m is None and r["Status"] == "Success", r
v = r["Value"]
assert v["s"] == "a&b<c>\"d'\r\n\tz\ufffd", repr(v["s"])
assert v["i"] == "9223372036854775807" and v["i4"] == -5, v
assert v["f"] == 0.30000000000000004 and math.isnan(v["nan"]) and v["inf"] == math.inf, v
assert v["b"] is True and v["t"].value == "20240102T03:04:05Z" and v["bin"].data == b"\x00hi", v
assert v["nil"] is None and v["l"] == [] and v["m"] == {} and v["vrc"] == {"vm": 3}, v
j = json.load(open(sys.argv[2], "rb"))
assert j["jsonrpc"] == "2.0" and j["id"] == "i", j
v = j["result"]
assert v["s"] == "a&b<c>\"d'\r\n\tz\x01\ufffd" and v["i"] == 9223372036854775807, v
assert v["f"] == 0.30000000000000004 and type(v["f"]) is float and v["nan"] == "NaN", v
assert v["t"] == "20240102T03:04:05Z" and v["bin"] == "AGhp" and v["vrc"] == {"vm": 3}, v
(r,), m = xmlrpc.client.loads(open(sys.argv[3], "rb").read())
assert r == ["system.listMethods"], r
try:
    xmlrpc.client.loads(open(sys.argv[4], "rb").read())
    assert False
except xmlrpc.client.Fault as f:
    assert f.faultCode == -32700 and f.faultString == "bad <xml>", f
print("ok")
`
	rf, ff := filepath.Join(dir, "raw.xml"), filepath.Join(dir, "fault.xml")
	var raw, fault bytes.Buffer
	_ = WriteXMLRaw(&raw, []string{"system.listMethods"})
	_ = WriteXMLFault(&fault, -32700, "bad <xml>")
	_ = os.WriteFile(rf, raw.Bytes(), 0o600)
	_ = os.WriteFile(ff, fault.Bytes(), 0o600)
	out, err := exec.Command(py, "-c", script, xf, jf, rf, ff).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("python: %v\n%s\nXML: %s\nJSON: %s", err, out, x.String(), j.String())
	}
}

// TestXenOrchestraParsesOutput parses replies with the XML-RPC and JSON code
// paths of Xen Orchestra's xen-api client (@vates/xml parseXml with its
// default options, @vates/xml-rpc's parser, JSON.parse). It needs those npm
// packages: set WIRE_XO_NODE_MODULES to a node_modules directory holding
// @vates/xml-rpc@1.0.0 and @vates/xml@2.0.0; without it, tests/e2e's is
// used when its run.sh has installed them there (npm ci, from its lock).
func TestXenOrchestraParsesOutput(t *testing.T) {
	modules := os.Getenv("WIRE_XO_NODE_MODULES")
	if modules == "" {
		e2e, _ := filepath.Abs(filepath.Join("..", "..", "..", "tests", "e2e", "node_modules"))
		if _, err := os.Stat(filepath.Join(e2e, "@vates", "xml-rpc", "parser.js")); err != nil {
			t.Skip("needs Xen Orchestra's @vates/xml-rpc@1.0.0 and @vates/xml@2.0.0: set WIRE_XO_NODE_MODULES to a node_modules holding them, or install tests/e2e's (npm ci there)")
		}
		modules = e2e
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node: not installed")
	}
	value := map[string]any{
		"s": "a&b<c>\"d'\tz\x01\xff", "empty": "", "space": " ", "i": int64(42), "i4": Int32(-5),
		"f": sum03, "nan": math.NaN(), "inf": math.Inf(-1), "b": true, "t": date,
		"bin": []byte("\x00hi"), "nil": nil, "l": []any{}, "m": map[string]any{},
		"vrc": map[string]any{"task": Int32(3)},
	}
	var x, j, f, raw bytes.Buffer
	_ = WriteXMLSuccess(&x, value)
	_ = WriteJSONSuccess(&j, &JSONRequest{ID: []byte(`0`), V2: true}, value)
	_ = WriteXMLFailure(&f, "SESSION_INVALID", []string{"OpaqueRef:x"})
	_ = WriteXMLRaw(&raw, []string{"VM.get_all_records"})
	dir := t.TempDir()
	files := []string{}
	for i, b := range [][]byte{x.Bytes(), j.Bytes(), f.Bytes(), raw.Bytes()} {
		name := filepath.Join(dir, strconv.Itoa(i))
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
	}
	script := `
const fs = require('fs'), assert = require('assert')
const { parseXml } = require('@vates/xml/parse')
const { xmlRpcParser } = require('@vates/xml-rpc/parser')
const xml = n => xmlRpcParser.parse(parseXml(fs.readFileSync(process.argv[n], 'utf8'))).params[0]
let r = xml(1)
assert.strictEqual(r.Status, 'Success')
let v = r.Value
assert.strictEqual(v.s, 'a&b<c>"d\' z\ufffd') // parseXml normalises whitespace by default
assert.strictEqual(v.empty, ''); assert.strictEqual(v.i, '42'); assert.strictEqual(v.i4, -5)
assert.strictEqual(v.f, 0.30000000000000004); assert.ok(Number.isNaN(v.nan)); assert.strictEqual(v.inf, -Infinity)
assert.strictEqual(v.b, true); assert.strictEqual(v.t.toISOString(), '2024-01-02T03:04:05.000Z')
assert.deepStrictEqual([...v.bin], [0, 104, 105]); assert.strictEqual(v.nil, null)
assert.deepStrictEqual(v.l, []); assert.deepStrictEqual({ ...v.m }, {}); assert.strictEqual(v.vrc.task, 3)
const j = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'))
assert.strictEqual(j.jsonrpc, '2.0'); assert.strictEqual(j.id, 0)
v = j.result
assert.strictEqual(v.s, 'a&b<c>"d\'\tz\x01\ufffd'); assert.strictEqual(v.i, 42); assert.strictEqual(v.nan, 'NaN')
assert.strictEqual(v.t, '20240102T03:04:05Z'); assert.strictEqual(v.vrc.task, 3)
r = xml(3)
assert.strictEqual(r.Status, 'Failure'); assert.deepStrictEqual(r.ErrorDescription, ['SESSION_INVALID', 'OpaqueRef:x'])
assert.deepStrictEqual(xml(4), ['VM.get_all_records'])
console.log('ok')
`
	cmd := exec.Command(node, append([]string{"-e", script}, files...)...)
	cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("node: %v\n%s\nXML: %s", err, out, x.String())
	}
}
