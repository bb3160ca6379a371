package wire

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// point is a Marshaler used to check the streaming seam.
type point struct {
	Name string
	X, Y int64
	Tags []string
}

func (p point) MarshalXenAPI(e Encoder) {
	e.BeginStruct()
	e.Member("name")
	e.String(p.Name)
	e.Member("x")
	e.Int(p.X)
	e.Member("y")
	e.Int(p.Y)
	e.Member("tags")
	e.BeginArray()
	for _, t := range p.Tags {
		e.String(t)
	}
	e.EndArray()
	e.EndStruct()
}

func jsonValue(v any) string {
	var b bytes.Buffer
	e := NewJSONEncoder(&b)
	Encode(e, v)
	if err := e.Flush(); err != nil {
		panic(err)
	}
	return b.String()
}

var (
	cet     = time.FixedZone("CET", 3600)
	date    = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	dateCET = time.Date(2024, 1, 2, 4, 4, 5, 999, cet) // same instant, sub-second dropped

	// Computed at run time: the constant expression 0.1 + 0.2 is exactly 0.3.
	pointOne, pointTwo = 0.1, 0.2
	sum03              = pointOne + pointTwo
)

// encodeCases are golden outputs for every type, in both encodings.
var encodeCases = []struct {
	name string
	v    any
	xml  string
	json string
}{
	{"string", "OpaqueRef:abc", `<value>OpaqueRef:abc</value>`, `"OpaqueRef:abc"`},
	{"empty string", "", `<value></value>`, `""`},
	{"escapes", `a&b<c>d"e'f`, `<value>a&amp;b&lt;c&gt;d&quot;e'f</value>`, `"a&b<c>d\"e'f"`},
	{"whitespace kept", " a\tb\nc ", "<value> a\tb\nc </value>", `" a\tb\nc "`},
	{"CR", "a\r\nb", `<value>a&#13;` + "\n" + `b</value>`, `"a\r\nb"`},
	{"controls", "a\x00b\x01c\x1fd\x7f", "<value>abcd\x7f</value>", `"a\u0000b\u0001c\u001fd` + "\x7f" + `"`},
	{"backslash", `a\b`, `<value>a\b</value>`, `"a\\b"`},
	{"unicode", "é€😀", `<value>é€😀</value>`, `"é€😀"`},
	{"invalid UTF-8", "a\xffb\xc3", "<value>a\uFFFDb\uFFFD</value>", `"a\ufffdb\ufffd"`},
	{"non-characters", "a\uFFFEb\uFFFF", "<value>a\uFFFDb\uFFFD</value>", "\"a\uFFFEb\uFFFF\""},
	{"line separators", "a\u2028b\u2029", "<value>a\u2028b\u2029</value>", `"a\u2028b\u2029"`},
	{"int64", int64(123), `<value>123</value>`, `123`},
	{"int64 negative", int64(-42), `<value>-42</value>`, `-42`},
	{"int64 max", int64(math.MaxInt64), `<value>9223372036854775807</value>`, `9223372036854775807`},
	{"int64 min", int64(math.MinInt64), `<value>-9223372036854775808</value>`, `-9223372036854775808`},
	{"int", 7, `<value>7</value>`, `7`},
	{"Int32", Int32(5), `<value><i4>5</i4></value>`, `5`},
	{"Int32 min", Int32(math.MinInt32), `<value><i4>-2147483648</i4></value>`, `-2147483648`},
	{"float", 1.5, `<value><double>1.5</double></value>`, `1.5`},
	{"float integral", 100.0, `<value><double>100</double></value>`, `100.0`},
	{"float zero", 0.0, `<value><double>0</double></value>`, `0.0`},
	{"float negative zero", math.Copysign(0, -1), `<value><double>-0</double></value>`, `-0.0`},
	{"float 0.3", 0.3, `<value><double>0.3</double></value>`, `0.3`},
	{"float needs 17 digits", sum03, `<value><double>0.30000000000000004</double></value>`, `0.30000000000000004`},
	{"float 1e15", 1e15, `<value><double>1000000000000000</double></value>`, `1000000000000000.0`},
	{"float 1e16", 1e16, `<value><double>1e+16</double></value>`, `1e+16`},
	{"float 1e20", 1e20, `<value><double>1e+20</double></value>`, `1e+20`},
	// %.16g would print 1.234567890123457e+17, which reads back as another float.
	{"float big", 123456789012345678.0, `<value><double>1.2345678901234568e+17</double></value>`, `1.2345678901234568e+17`},
	{"float 16 digits", 1234567890123456.0, `<value><double>1234567890123456</double></value>`, `1234567890123456.0`},
	{"float 17 digits", 12345678901234568.0, `<value><double>12345678901234568</double></value>`, `12345678901234568.0`},
	{"float small", 1e-5, `<value><double>1e-05</double></value>`, `1e-05`},
	{"float 60.1", 60.1, `<value><double>60.1</double></value>`, `60.1`},
	{"float max", math.MaxFloat64, `<value><double>1.7976931348623157e+308</double></value>`, `1.7976931348623157e+308`},
	{"float min subnormal", 5e-324, `<value><double>4.940656458412465e-324</double></value>`, `4.940656458412465e-324`},
	{"NaN", math.NaN(), `<value><double>NaN</double></value>`, `"NaN"`},
	{"+Inf", math.Inf(1), `<value><double>Infinity</double></value>`, `"Infinity"`},
	{"-Inf", math.Inf(-1), `<value><double>-Infinity</double></value>`, `"-Infinity"`},
	{"true", true, `<value><boolean>1</boolean></value>`, `true`},
	{"false", false, `<value><boolean>0</boolean></value>`, `false`},
	{"time", date, `<value><dateTime.iso8601>20240102T03:04:05Z</dateTime.iso8601></value>`, `"20240102T03:04:05Z"`},
	{"time other zone", dateCET, `<value><dateTime.iso8601>20240102T03:04:05Z</dateTime.iso8601></value>`, `"20240102T03:04:05Z"`},
	{"time epoch", time.Unix(0, 0), `<value><dateTime.iso8601>19700101T00:00:00Z</dateTime.iso8601></value>`, `"19700101T00:00:00Z"`},
	{"bytes", []byte("\x00\x01hi"), `<value><base64>AAFoaQ==</base64></value>`, `"AAFoaQ=="`},
	{"bytes empty", []byte{}, `<value><base64></base64></value>`, `""`},
	{"nil", nil, `<value><nil/></value>`, `null`},
	{"array", []any{"a", int64(1), true}, `<value><array><data><value>a</value><value>1</value><value><boolean>1</boolean></value></data></array></value>`, `["a",1,true]`},
	{"array empty", []any{}, `<value><array><data></data></array></value>`, `[]`},
	{"array nil", []any(nil), `<value><array><data></data></array></value>`, `[]`},
	{"strings", []string{"x", "y"}, `<value><array><data><value>x</value><value>y</value></data></array></value>`, `["x","y"]`},
	{"strings nil", []string(nil), `<value><array><data></data></array></value>`, `[]`},
	{"struct sorted", map[string]any{"b": int64(2), "a": "x", "c": nil},
		`<value><struct><member><name>a</name><value>x</value></member><member><name>b</name><value>2</value></member><member><name>c</name><value><nil/></value></member></struct></value>`,
		`{"a":"x","b":2,"c":null}`},
	{"struct empty", map[string]any{}, `<value><struct></struct></value>`, `{}`},
	{"struct nil", map[string]any(nil), `<value><struct></struct></value>`, `{}`},
	{"string map", map[string]string{"k<": "v&", "": ""},
		`<value><struct><member><name></name><value></value></member><member><name>k&lt;</name><value>v&amp;</value></member></struct></value>`,
		`{"":"","k<":"v&"}`},
	{"nested", map[string]any{"l": []any{map[string]any{}, []any{[]string{}}}, "m": map[string]string{"a": "b"}},
		`<value><struct><member><name>l</name><value><array><data><value><struct></struct></value><value><array><data><value><array><data></data></array></value></data></array></value></data></array></value></member><member><name>m</name><value><struct><member><name>a</name><value>b</value></member></struct></value></member></struct></value>`,
		`{"l":[{},[[]]],"m":{"a":"b"}}`},
	{"valid_ref_counts", map[string]any{"vm": Int32(3), "task": Int32(0)},
		`<value><struct><member><name>task</name><value><i4>0</i4></value></member><member><name>vm</name><value><i4>3</i4></value></member></struct></value>`,
		`{"task":0,"vm":3}`},
	{"marshaler", point{"p", 1, -2, []string{"t"}},
		`<value><struct><member><name>name</name><value>p</value></member><member><name>x</name><value>1</value></member><member><name>y</name><value>-2</value></member><member><name>tags</name><value><array><data><value>t</value></data></array></value></member></struct></value>`,
		`{"name":"p","x":1,"y":-2,"tags":["t"]}`},
	{"marshaler in array", []any{point{Name: "q"}, nil},
		`<value><array><data><value><struct><member><name>name</name><value>q</value></member><member><name>x</name><value>0</value></member><member><name>y</name><value>0</value></member><member><name>tags</name><value><array><data></data></array></value></member></struct></value><value><nil/></value></data></array></value>`,
		`[{"name":"q","x":0,"y":0,"tags":[]},null]`},
}

func TestEncodeGolden(t *testing.T) {
	for _, tc := range encodeCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := XMLValueFragment(tc.v); got != tc.xml {
				t.Errorf("XML\n got %q\nwant %q", got, tc.xml)
			}
			if got := jsonValue(tc.v); got != tc.json {
				t.Errorf("JSON\n got %q\nwant %q", got, tc.json)
			}
		})
	}
}

func TestXMLNeverEmitsForbiddenTags(t *testing.T) {
	for _, tc := range encodeCases {
		got := XMLValueFragment(tc.v)
		for _, bad := range []string{"<string", "<i8", "<int>", "\n<", ">\n "} {
			if strings.Contains(got, bad) {
				t.Errorf("%s: output contains %q: %s", tc.name, bad, got)
			}
		}
	}
}

func TestXMLReplies(t *testing.T) {
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
		want  string
	}{
		{"success string", func(b *bytes.Buffer) error { return WriteXMLSuccess(b, "OpaqueRef:abc") },
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value>OpaqueRef:abc</value></member></struct></value></param></params></methodResponse>`},
		{"success struct", func(b *bytes.Buffer) error {
			return WriteXMLSuccess(b, map[string]any{"uuid": "u", "VCPUs_max": int64(2)})
		},
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value><struct><member><name>VCPUs_max</name><value>2</value></member><member><name>uuid</name><value>u</value></member></struct></value></member></struct></value></param></params></methodResponse>`},
		{"success nil", func(b *bytes.Buffer) error { return WriteXMLSuccess(b, nil) },
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value><nil/></value></member></struct></value></param></params></methodResponse>`},
		{"success empty string", func(b *bytes.Buffer) error { return WriteXMLSuccess(b, "") },
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value></value></member></struct></value></param></params></methodResponse>`},
		{"failure", func(b *bytes.Buffer) error {
			return WriteXMLFailure(b, "HANDLE_INVALID", []string{"VM", "OpaqueRef:x"})
		},
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Failure</value></member><member><name>ErrorDescription</name><value><array><data><value>HANDLE_INVALID</value><value>VM</value><value>OpaqueRef:x</value></data></array></value></member></struct></value></param></params></methodResponse>`},
		{"failure no params", func(b *bytes.Buffer) error { return WriteXMLFailure(b, "SESSION_INVALID", nil) },
			`<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Failure</value></member><member><name>ErrorDescription</name><value><array><data><value>SESSION_INVALID</value></data></array></value></member></struct></value></param></params></methodResponse>`},
		{"raw listMethods", func(b *bytes.Buffer) error {
			return WriteXMLRaw(b, []string{"VM.get_all_records", "system.listMethods"})
		},
			`<?xml version="1.0"?><methodResponse><params><param><value><array><data><value>VM.get_all_records</value><value>system.listMethods</value></data></array></value></param></params></methodResponse>`},
		{"fault", func(b *bytes.Buffer) error { return WriteXMLFault(b, -32700, "parse error: <bad>") },
			`<?xml version="1.0"?><methodResponse><fault><value><struct><member><name>faultCode</name><value><i4>-32700</i4></value></member><member><name>faultString</name><value>parse error: &lt;bad&gt;</value></member></struct></value></fault></methodResponse>`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestJSONReplies(t *testing.T) {
	v2 := &JSONRequest{Method: "m", ID: []byte(`0`), V2: true}
	v2str := &JSONRequest{Method: "m", ID: []byte(`"abc"`), V2: true}
	v1 := &JSONRequest{Method: "m", ID: []byte(`17`)}
	tests := []struct {
		name  string
		write func(*bytes.Buffer) error
		want  string
	}{
		{"v2 success", func(b *bytes.Buffer) error { return WriteJSONSuccess(b, v2, "OpaqueRef:abc") },
			`{"jsonrpc":"2.0","result":"OpaqueRef:abc","id":0}`},
		{"v2 success string id", func(b *bytes.Buffer) error { return WriteJSONSuccess(b, v2str, map[string]any{"a": int64(1)}) },
			`{"jsonrpc":"2.0","result":{"a":1},"id":"abc"}`},
		{"v2 success nil", func(b *bytes.Buffer) error { return WriteJSONSuccess(b, v2, nil) },
			`{"jsonrpc":"2.0","result":null,"id":0}`},
		{"v2 failure", func(b *bytes.Buffer) error {
			return WriteJSONFailure(b, v2, "HANDLE_INVALID", []string{"VM", "OpaqueRef:x"})
		},
			`{"jsonrpc":"2.0","error":{"code":1,"message":"HANDLE_INVALID","data":["VM","OpaqueRef:x"]},"id":0}`},
		{"v2 failure no params", func(b *bytes.Buffer) error { return WriteJSONFailure(b, v2str, "SESSION_INVALID", nil) },
			`{"jsonrpc":"2.0","error":{"code":1,"message":"SESSION_INVALID","data":[]},"id":"abc"}`},
		{"v1 success", func(b *bytes.Buffer) error { return WriteJSONSuccess(b, v1, []string{"a"}) },
			`{"result":["a"],"error":null,"id":17}`},
		{"v1 failure", func(b *bytes.Buffer) error {
			return WriteJSONFailure(b, v1, "HANDLE_INVALID", []string{"VM", "OpaqueRef:x"})
		},
			`{"result":null,"error":["HANDLE_INVALID","VM","OpaqueRef:x"],"id":17}`},
		{"parse failure", func(b *bytes.Buffer) error {
			return WriteJSONParseFailure(b, "INTERNAL_ERROR", []string{"bad \"json\""})
		},
			`{"jsonrpc":"2.0","error":{"code":1,"message":"INTERNAL_ERROR","data":["bad \"json\""]},"id":0}`},
		{"nil request", func(b *bytes.Buffer) error { return WriteJSONSuccess(b, nil, true) },
			`{"jsonrpc":"2.0","result":true,"id":0}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b); err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != tc.want {
				t.Errorf("\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestJSONRepliesEchoDecodedID checks that ids go back exactly as they came.
func TestJSONRepliesEchoDecodedID(t *testing.T) {
	for _, id := range []string{`0`, `-5`, `9007199254740993`, `"x"`, `"a\"b\u00e9"`, `""`} {
		req, err := DecodeJSONRequest([]byte(`{"jsonrpc":"2.0","method":"m","params":[],"id":` + id + `}`))
		if err != nil {
			t.Fatalf("id %s: %v", id, err)
		}
		var b bytes.Buffer
		if err := WriteJSONSuccess(&b, req, nil); err != nil {
			t.Fatal(err)
		}
		var back map[string]any
		if err := jsonUnmarshalNumber(b.Bytes(), &back); err != nil {
			t.Fatalf("id %s: reply %s is not JSON: %v", id, b.String(), err)
		}
		var want any
		if err := jsonUnmarshalNumber([]byte(id), &want); err != nil {
			t.Fatal(err)
		}
		if back["id"] != want {
			t.Errorf("id %s came back as %v", id, back["id"])
		}
	}
}

// recorder is a writer that remembers each Write and can fail.
type recorder struct {
	writes [][]byte
	fail   error
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.fail != nil {
		return 0, r.fail
	}
	r.writes = append(r.writes, bytes.Clone(p))
	return len(p), nil
}

func TestStreamingFlushesInChunks(t *testing.T) {
	big := make([]any, 20000)
	for i := range big {
		big[i] = point{Name: "vm", X: int64(i)}
	}
	var r recorder
	if err := WriteXMLSuccess(&r, big); err != nil {
		t.Fatal(err)
	}
	if len(r.writes) < 10 {
		t.Fatalf("only %d writes; want streaming in chunks", len(r.writes))
	}
	for i, w := range r.writes[:len(r.writes)-1] {
		if len(w) < flushAt || len(w) > bufSize {
			t.Fatalf("write %d has %d bytes", i, len(w))
		}
	}
	var whole bytes.Buffer
	if err := WriteXMLSuccess(&whole, big); err != nil {
		t.Fatal(err)
	}
	if got := bytes.Join(r.writes, nil); !bytes.Equal(got, whole.Bytes()) {
		t.Fatal("chunked output differs from buffered output")
	}
}

func TestWriteErrorsPropagate(t *testing.T) {
	boom := errors.New("boom")
	big := make([]string, 10000)
	for i := range big {
		big[i] = "OpaqueRef:0123456789abcdef"
	}
	for name, write := range map[string]func(*recorder) error{
		"xml success": func(r *recorder) error { return WriteXMLSuccess(r, big) },
		"xml failure": func(r *recorder) error { return WriteXMLFailure(r, "X", nil) },
		"xml raw":     func(r *recorder) error { return WriteXMLRaw(r, big) },
		"xml fault":   func(r *recorder) error { return WriteXMLFault(r, 1, "x") },
		"json":        func(r *recorder) error { return WriteJSONSuccess(r, nil, big) },
		"json fail":   func(r *recorder) error { return WriteJSONFailure(r, nil, "X", nil) },
	} {
		if err := write(&recorder{fail: boom}); !errors.Is(err, boom) {
			t.Errorf("%s: got %v, want %v", name, err, boom)
		}
	}
}

func TestEncoderMisusePanics(t *testing.T) {
	cases := map[string]func(Encoder){
		"value in struct without Member": func(e Encoder) { e.BeginStruct(); e.String("x") },
		"Member outside struct":          func(e Encoder) { e.Member("x") },
		"Member in array":                func(e Encoder) { e.BeginArray(); e.Member("x") },
		"Member twice":                   func(e Encoder) { e.BeginStruct(); e.Member("a"); e.Member("b") },
		"EndStruct closes array":         func(e Encoder) { e.BeginArray(); e.EndStruct() },
		"EndArray closes struct":         func(e Encoder) { e.BeginStruct(); e.EndArray() },
		"EndArray at top":                func(e Encoder) { e.EndArray() },
		"EndStruct after Member":         func(e Encoder) { e.BeginStruct(); e.Member("a"); e.EndStruct() },
		"unsupported type":               func(e Encoder) { Encode(e, struct{}{}) },
		"unsupported uint":               func(e Encoder) { Encode(e, uint(1)) },
	}
	for name, f := range cases {
		for _, e := range []Encoder{NewXMLEncoder(nil), NewJSONEncoder(nil)} {
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("%s (%T): no panic", name, e)
					}
				}()
				f(e)
			}()
		}
	}
}

func TestParseDateTime(t *testing.T) {
	want := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	good := map[string]time.Time{
		"20240102T03:04:05Z":             want,
		"20240102T03:04:05":              want,
		"20240102T030405":                want,
		"20240102T030405Z":               want,
		"2024-01-02T03:04:05Z":           want,
		"2024-01-02T03:04:05":            want,
		"2024-01-02T03:04:05.000Z":       want,
		"2024-01-02t03:04:05z":           want,
		"2024-01-02T04:04:05+01:00":      want,
		"2024-01-02T04:04:05+0100":       want,
		"2024-01-02T04:04:05+01":         want,
		"20240101T23:04:05-04:00":        want,
		"2024-01-02T03:04:05.25Z":        want.Add(250 * time.Millisecond),
		"2024-01-02T03:04:05,123456789Z": want.Add(123456789),
		"2024-02-29T00:00:00Z":           time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC),
	}
	for s, w := range good {
		got, ok := parseDateTime(s)
		if !ok || !got.Equal(w) || got.Location() != time.UTC {
			t.Errorf("%q: got %v %v, want %v", s, got, ok, w)
		}
	}
	for _, s := range []string{
		"", "2024", "20240102", "2024-01-02", "20240102T03:04", "2024-0102T03:04:05",
		"20240102T03:0405", "20240102 03:04:05", "20241302T03:04:05", "20240230T03:04:05",
		"20240102T24:00:00", "20240102T03:60:00", "20240102T03:04:60", "20240102T03:04:05.",
		"20240102T03:04:05+1", "20240102T03:04:05+25:00", "20240102T03:04:05Zjunk",
		"2023-02-29T00:00:00Z", "x0240102T03:04:05", "20240102T03:04:05 ",
	} {
		if got, ok := parseDateTime(s); ok {
			t.Errorf("%q: accepted as %v", s, got)
		}
	}
}

func TestPreencodedMatchesDirectEncoding(t *testing.T) {
	v := map[string]any{"a": []any{"x", int64(1), Int32(2)}, "b": true}
	for _, mk := range []func(w *bytes.Buffer) Preencoder{
		func(w *bytes.Buffer) Preencoder { return NewXMLEncoder(w) },
		func(w *bytes.Buffer) Preencoder { return NewJSONEncoder(w) },
	} {
		var direct, viaCache bytes.Buffer
		d := mk(&direct)
		d.BeginArray()
		Encode(d, v)
		Encode(d, v)
		d.EndArray()
		c := mk(&viaCache)
		b := c.EncodeAlone(v)
		c.BeginArray()
		c.Preencoded(b)
		c.Preencoded(b)
		c.EndArray()
		d.(interface{ Flush() error }).Flush()
		c.(interface{ Flush() error }).Flush()
		if direct.String() != viaCache.String() {
			t.Errorf("%s: %s != %s", c.Kind(), direct.String(), viaCache.String())
		}
	}
}
