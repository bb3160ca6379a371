package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func jsonUnmarshalNumber(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	normalizeDecoded(v)
	return nil
}

// normalizeDecoded turns json.Numbers from encoding/json into int64/float64
// so results can be compared with neutral values.
func normalizeDecoded(v any) {
	switch x := v.(type) {
	case *any:
		*x, _ = normalizeJSON(*x, -1<<30)
	case *map[string]any:
		for k, el := range *x {
			(*x)[k], _ = normalizeJSON(el, -1<<30)
		}
	}
}

// equal compares neutral values, treating NaN as equal to NaN and times by
// instant.
func equal(a, b any) bool {
	switch x := a.(type) {
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !equal(v, w) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeXMLClientFixtures(t *testing.T) {
	tests := []struct {
		file   string
		method string
		params []any
	}{
		{"python_get_record.xml", "VM.get_record", []any{"OpaqueRef:abc", "OpaqueRef:9f1c"}},
		{"python_login.xml", "session.login_with_password", []any{"root", "pässwörd&<>", "2.3", "XenAPI.py"}},
		{"python_list_methods.xml", "system.listMethods", []any{}},
		{"python_all_types.xml", "test.all", []any{
			int64(1), int64(-2), int64(2147483647), 1.5, 1e20, math.NaN(), true, false, nil,
			"", "  ", "a\nb\tc", // XML turns the CR LF Python wrote raw into LF
			"é€😀&<>\"'",
			time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
			[]byte(strings.Repeat("\x00\x01binary data", 10)),
			map[string]any{"k": []any{int64(1), map[string]any{}, []any{}}, "": "e"},
			[]any{}, map[string]any{},
		}},
		{"xo_login.xml", "session.login_with_password", []any{"root", `pa&ss<w>rd"'`}},
		{"xo_event_from.xml", "event.from", []any{"OpaqueRef:s", []any{"VM", "host"}, "", 60.1}},
		{"xo_list_methods.xml", "system.listMethods", []any{}},
		{"xo_set_other_config.xml", "VM.set_other_config", []any{"OpaqueRef:s", "OpaqueRef:vm", map[string]any{
			"a": "b", "n": "42", "e": "", "t": true, "f": false, "z": nil, "l": []any{}, "o": map[string]any{},
			"d": time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), "x": 1.25,
		}}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			method, params, err := DecodeXMLRequest(bytes.NewReader(readFixture(t, tc.file)))
			if err != nil {
				t.Fatal(err)
			}
			if method != tc.method {
				t.Errorf("method %q, want %q", method, tc.method)
			}
			if !equal(params, tc.params) {
				t.Errorf("params\n got %#v\nwant %#v", params, tc.params)
			}
		})
	}
}

const callHead = `<?xml version="1.0"?><methodCall><methodName>m</methodName><params>`
const callTail = `</params></methodCall>`

func call1(value string) string { return callHead + "<param>" + value + "</param>" + callTail }

func TestDecodeXMLValues(t *testing.T) {
	tests := []struct {
		name, value string
		want        any
	}{
		{"bare", `<value>abc</value>`, "abc"},
		{"bare untrimmed", `<value>  a b  </value>`, "  a b  "},
		{"bare whitespace only", `<value>  </value>`, "  "},
		{"bare newline only", "<value>\n</value>", "\n"},
		{"empty", `<value></value>`, ""},
		{"self-closed", `<value/>`, ""},
		{"string", `<value><string>abc</string></value>`, "abc"},
		{"string untrimmed", `<value><string> abc </string></value>`, " abc "},
		{"string empty", `<value><string></string></value>`, ""},
		{"string self-closed", `<value><string/></value>`, ""},
		{"string entities", `<value><string>&lt;&amp;&gt;&quot;&apos;&#233;&#xe9;&#13;</string></value>`, "<&>\"'éé\r"},
		{"CDATA", `<value><![CDATA[a<b]]></value>`, "a<b"},
		{"CDATA mixed", `<value>x<![CDATA[<y>]]>z</value>`, "x<y>z"},
		{"comment in string", `<value>a<!-- c -->b</value>`, "ab"},
		{"CRLF normalised", "<value>a\r\nb</value>", "a\nb"},
		{"pretty typed", "<value>\n  <string>x</string>\n</value>", "x"},
		{"pretty int", "<value>\t<int>5</int> </value>", int64(5)},
		{"int", `<value><int>-12</int></value>`, int64(-12)},
		{"int plus", `<value><int>+12</int></value>`, int64(12)},
		{"int padded", `<value><int> 12 </int></value>`, int64(12)},
		{"i4", `<value><i4>2147483647</i4></value>`, int64(2147483647)},
		{"i8", `<value><i8>9223372036854775807</i8></value>`, int64(math.MaxInt64)},
		{"int as string (XO)", `<value>42</value>`, "42"},
		{"double", `<value><double>60.1</double></value>`, 60.1},
		{"double exp", `<value><double>1e+20</double></value>`, 1e20},
		{"double int", `<value><double>3</double></value>`, 3.0},
		{"double NaN", `<value><double>NaN</double></value>`, math.NaN()},
		{"double nan (Python/xapi)", `<value><double>nan</double></value>`, math.NaN()},
		{"double Infinity", `<value><double>Infinity</double></value>`, math.Inf(1)},
		{"double -inf", `<value><double>-inf</double></value>`, math.Inf(-1)},
		{"double underflow", `<value><double>1e-400</double></value>`, 0.0},
		{"boolean 1", `<value><boolean>1</boolean></value>`, true},
		{"boolean 0", `<value><boolean>0</boolean></value>`, false},
		{"boolean true", `<value><boolean>true</boolean></value>`, true},
		{"boolean False", `<value><boolean> False </boolean></value>`, false},
		{"date xapi", `<value><dateTime.iso8601>20240102T03:04:05Z</dateTime.iso8601></value>`, date},
		{"date python", `<value><dateTime.iso8601>20240102T03:04:05</dateTime.iso8601></value>`, date},
		{"date XO", `<value><dateTime.iso8601>2024-01-02T03:04:05.000Z</dateTime.iso8601></value>`, date},
		{"date offset", `<value><dateTime.iso8601>2024-01-02T04:04:05+01:00</dateTime.iso8601></value>`, date},
		{"base64", `<value><base64>AAFoaQ==</base64></value>`, []byte("\x00\x01hi")},
		{"base64 lines", "<value><base64>\nAAFo\naQ==\n</base64></value>", []byte("\x00\x01hi")},
		{"base64 unpadded", `<value><base64>AAFoaQ</base64></value>`, []byte("\x00\x01hi")},
		{"base64 empty", `<value><base64></base64></value>`, []byte{}},
		{"nil", `<value><nil/></value>`, nil},
		{"nil spaced (XO)", `<value><nil /></value>`, nil},
		{"nil open-close", `<value><nil></nil></value>`, nil},
		{"nil prefixed (Apache)", `<value><ex:nil xmlns:ex="http://ws.apache.org/xmlrpc/namespaces/extensions"/></value>`, nil},
		{"array", `<value><array><data><value>a</value><value><int>1</int></value></data></array></value>`, []any{"a", int64(1)}},
		{"array pretty", "<value><array>\n <data>\n  <value>a</value>\n  <value></value>\n </data>\n</array></value>", []any{"a", ""}},
		{"array data self-closed", `<value><array><data/></array></value>`, []any{}},
		{"array self-closed", `<value><array/></value>`, []any{}},
		{"struct", `<value><struct><member><name>k</name><value>v</value></member></struct></value>`, map[string]any{"k": "v"}},
		{"struct pretty", "<value><struct>\n<member>\n<name> k </name>\n<value><int>1</int></value>\n</member>\n</struct></value>", map[string]any{" k ": int64(1)}},
		{"struct self-closed", `<value><struct/></value>`, map[string]any{}},
		{"struct empty name", `<value><struct><member><name/><value/></member></struct></value>`, map[string]any{"": ""}},
		{"struct duplicate key", `<value><struct><member><name>k</name><value>1</value></member><member><name>k</name><value>2</value></member></struct></value>`, map[string]any{"k": "2"}},
		{"attributes ignored", `<value a="b"><string c="d">x</string></value>`, "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method, params, err := DecodeXMLRequest(strings.NewReader(call1(tc.value)))
			if err != nil {
				t.Fatal(err)
			}
			if method != "m" || len(params) != 1 || !equal(params[0], tc.want) {
				t.Errorf("got %q %#v, want %#v", method, params, tc.want)
			}
		})
	}
}

func TestDecodeXMLEnvelope(t *testing.T) {
	tests := []struct {
		name, body, method string
		params             []any
	}{
		{"no params element", `<methodCall><methodName>system.listMethods</methodName></methodCall>`, "system.listMethods", []any{}},
		{"params self-closed", `<methodCall><methodName>m</methodName><params/></methodCall>`, "m", []any{}},
		{"no declaration", `<methodCall><methodName>m</methodName><params><param><value>x</value></param></params></methodCall>`, "m", []any{"x"}},
		{"declaration with encoding", `<?xml version="1.0" encoding="utf-8"?><methodCall><methodName>m</methodName></methodCall>`, "m", []any{}},
		{"ascii encoding", `<?xml version="1.0" encoding="US-ASCII"?><methodCall><methodName>m</methodName></methodCall>`, "m", []any{}},
		{"method name trimmed", "<methodCall><methodName>\n VM.get_record \n</methodName></methodCall>", "VM.get_record", []any{}},
		{"comments and PI", `<?xml version="1.0"?><!-- hi --><?pi x?><methodCall><!-- c --><methodName>m</methodName><!-- c --></methodCall><!-- trailing -->` + "\n", "m", []any{}},
		{"doctype", `<?xml version="1.0"?><!DOCTYPE methodCall><methodCall><methodName>m</methodName></methodCall>`, "m", []any{}},
		{"pretty", "<?xml version='1.0'?>\n<methodCall>\n  <methodName>m</methodName>\n  <params>\n    <param>\n      <value><string>a</string></value>\n    </param>\n    <param>\n      <value>b</value>\n    </param>\n  </params>\n</methodCall>\n", "m", []any{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			method, params, err := DecodeXMLRequest(strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if method != tc.method || !equal(params, tc.params) {
				t.Errorf("got %q %#v, want %q %#v", method, params, tc.method, tc.params)
			}
		})
	}
}

func nested(open, close string, n int, inner string) string {
	return strings.Repeat(open, n) + inner + strings.Repeat(close, n)
}

func TestDecodeXMLRejects(t *testing.T) {
	arr := func(n int) string {
		return call1(nested("<value><array><data>", "</data></array></value>", n, ""))
	}
	st := func(n int) string {
		return call1(nested("<value><struct><member><name>k</name>", "</member></struct></value>", n-1,
			"<value><struct></struct></value>"))
	}
	// The limits themselves are fine.
	for _, ok := range []string{arr(MaxDepth), st(MaxDepth)} {
		if _, _, err := DecodeXMLRequest(strings.NewReader(ok)); err != nil {
			t.Fatalf("depth %d rejected: %v", MaxDepth, err)
		}
	}
	bad := map[string]string{
		"empty":                   ``,
		"whitespace":              "  \n",
		"not XML":                 `hello`,
		"JSON":                    `{"method":"m"}`,
		"truncated":               `<methodCall><methodName>m</methodName><params><param><value>`,
		"wrong root":              `<methodResponse><params/></methodResponse>`,
		"no methodName":           `<methodCall><params/></methodCall>`,
		"empty methodName":        `<methodCall><methodName> </methodName></methodCall>`,
		"element in methodName":   `<methodCall><methodName><b>m</b></methodName></methodCall>`,
		"unknown type":            call1(`<value><i2>1</i2></value>`),
		"unknown type ex:i8":      call1(`<value><ex:foo>1</ex:foo></value>`),
		"too deep array":          arr(MaxDepth + 1),
		"too deep struct":         st(MaxDepth + 1),
		"bad int":                 call1(`<value><int>1.5</int></value>`),
		"empty int":               call1(`<value><int/></value>`),
		"int overflow":            call1(`<value><i8>9223372036854775808</i8></value>`),
		"bad double":              call1(`<value><double>abc</double></value>`),
		"double overflow":         call1(`<value><double>1e400</double></value>`),
		"bad boolean":             call1(`<value><boolean>2</boolean></value>`),
		"bad base64":              call1(`<value><base64>!!!!</base64></value>`),
		"text in nil":             call1(`<value><nil>x</nil></value>`),
		"text before type":        call1(`<value>x<int>1</int></value>`),
		"text after type":         call1(`<value><int>1</int>x</value>`),
		"two types":               call1(`<value><int>1</int><int>2</int></value>`),
		"element in string":       call1(`<value><string><b/></string></value>`),
		"array without data":      call1(`<value><array><value>x</value></array></value>`),
		"array text":              call1(`<value><array><data>x</data></array></value>`),
		"struct without member":   call1(`<value><struct><name>k</name><value/></struct></value>`),
		"member without name":     call1(`<value><struct><member><value/></member></struct></value>`),
		"member without value":    call1(`<value><struct><member><name>k</name></member></struct></value>`),
		"member value first":      call1(`<value><struct><member><value/><name>k</name></member></struct></value>`),
		"param without value":     call1(``),
		"param two values":        call1(`<value/><value/>`),
		"param bare text":         call1(`x`),
		"mismatched end":          call1(`<value><string>x</int></value>`),
		"unknown entity":          call1(`<value>&nbsp;</value>`),
		"illegal char ref":        call1(`<value>&#1;</value>`),
		"illegal char":            call1("<value>\x01</value>"),
		"invalid UTF-8":           call1("<value>\xff</value>"),
		"non-character":           call1("<value>\uFFFE</value>"),
		"trailing element":        `<methodCall><methodName>m</methodName></methodCall><methodCall/>`,
		"trailing text":           `<methodCall><methodName>m</methodName></methodCall>x`,
		"junk in params":          `<methodCall><methodName>m</methodName><params><foo/></params></methodCall>`,
		"junk after params":       `<methodCall><methodName>m</methodName><params/><foo/></methodCall>`,
		"latin1":                  `<?xml version="1.0" encoding="ISO-8859-1"?><methodCall><methodName>m</methodName></methodCall>`,
		"unclosed methodCall":     `<methodCall><methodName>m</methodName>`,
		"params after methodCall": `<methodCall><methodName>m</methodName></methodCall><params/>`,
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			method, params, err := DecodeXMLRequest(strings.NewReader(body))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("got %q %#v, err %v; want a *DecodeError", method, params, err)
			}
			if method != "" || params != nil {
				t.Errorf("results not zero on error: %q %#v", method, params)
			}
			if !strings.HasPrefix(de.Error(), "wire: ") || de.Msg == "" {
				t.Errorf("bad message %q", de.Error())
			}
		})
	}
}

func TestDecodeJSON(t *testing.T) {
	tests := []struct {
		name, body string
		want       JSONRequest
	}{
		{"XO v2", `{"id":0,"jsonrpc":"2.0","method":"session.login_with_password","params":["root","pw"]}`,
			JSONRequest{Method: "session.login_with_password", Params: []any{"root", "pw"}, ID: []byte(`0`), V2: true}},
		{"Go SDK v2", `{"jsonrpc":"2.0","method":"VM.get_all","params":["OpaqueRef:s"],"id":0}`,
			JSONRequest{Method: "VM.get_all", Params: []any{"OpaqueRef:s"}, ID: []byte(`0`), V2: true}},
		{"v1", `{"method":"VM.get_record","params":["s","r"],"id":5}`,
			JSONRequest{Method: "VM.get_record", Params: []any{"s", "r"}, ID: []byte(`5`)}},
		{"v1 string id", ` {"method":"m","params":[],"id":"a\u00e9"} `,
			JSONRequest{Method: "m", Params: []any{}, ID: []byte(`"aé"`)}},
		{"v2 no params", `{"jsonrpc":"2.0","method":"system.listMethods","id":1}`,
			JSONRequest{Method: "system.listMethods", Params: []any{}, ID: []byte(`1`), V2: true}},
		{"v2 null params", `{"jsonrpc":"2.0","method":"m","params":null,"id":1}`,
			JSONRequest{Method: "m", Params: []any{}, ID: []byte(`1`), V2: true}},
		{"v2 object params", `{"jsonrpc":"2.0","method":"m","params":{"a":1},"id":-1}`,
			JSONRequest{Method: "m", Params: []any{map[string]any{"a": int64(1)}}, ID: []byte(`-1`), V2: true}},
		{"event.from", `{"jsonrpc":"2.0","method":"event.from","params":["s",["VM","host"],"",60.1],"id":0}`,
			JSONRequest{Method: "event.from", Params: []any{"s", []any{"VM", "host"}, "", 60.1}, ID: []byte(`0`), V2: true}},
		{"numbers", `{"jsonrpc":"2.0","method":"m","params":[1,-0,1.0,1e3,1E-2,9223372036854775807,-9223372036854775808,9007199254740993,1e-400],"id":0}`,
			JSONRequest{Method: "m", Params: []any{int64(1), int64(0), 1.0, 1000.0, 0.01, int64(math.MaxInt64), int64(math.MinInt64), int64(9007199254740993), 0.0}, ID: []byte(`0`), V2: true}},
		{"types", `{"jsonrpc":"2.0","method":"m","params":[true,false,null,"",{"k":[{"n":2}]},[]],"id":0}`,
			JSONRequest{Method: "m", Params: []any{true, false, nil, "", map[string]any{"k": []any{map[string]any{"n": int64(2)}}}, []any{}}, ID: []byte(`0`), V2: true}},
		{"invalid UTF-8 replaced", "{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":[\"a\xffb\"],\"id\":0}",
			JSONRequest{Method: "m", Params: []any{"a\uFFFDb"}, ID: []byte(`0`), V2: true}},
		{"extra fields ignored", `{"jsonrpc":"2.0","method":"m","params":[],"id":0,"x":1}`,
			JSONRequest{Method: "m", Params: []any{}, ID: []byte(`0`), V2: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeJSONRequest([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Method != tc.want.Method || got.V2 != tc.want.V2 || string(got.ID) != string(tc.want.ID) || !equal(got.Params, tc.want.Params) {
				t.Errorf("\n got %+v (id %s)\nwant %+v (id %s)", *got, got.ID, tc.want, tc.want.ID)
			}
		})
	}
}

func TestDecodeJSONRejects(t *testing.T) {
	deep := func(n int) string {
		return `{"jsonrpc":"2.0","method":"m","params":[` + nested("[", "]", n, "") + `],"id":0}`
	}
	if _, err := DecodeJSONRequest([]byte(deep(MaxDepth))); err != nil {
		t.Fatalf("depth %d rejected: %v", MaxDepth, err)
	}
	bad := map[string]string{
		"empty":              ``,
		"not JSON":           `hello`,
		"XML":                `<methodCall/>`,
		"null":               `null`,
		"array":              `[{"method":"m","params":[],"id":0}]`,
		"string":             `"m"`,
		"trailing":           `{"method":"m","params":[],"id":0} {}`,
		"trailing junk":      `{"method":"m","params":[],"id":0}x`,
		"truncated":          `{"method":"m","params":[`,
		"no method":          `{"params":[],"id":0}`,
		"method not string":  `{"method":1,"params":[],"id":0}`,
		"method null":        `{"method":null,"params":[],"id":0}`,
		"empty method":       `{"method":"","params":[],"id":0}`,
		"jsonrpc 1.0":        `{"jsonrpc":"1.0","method":"m","params":[],"id":0}`,
		"jsonrpc number":     `{"jsonrpc":2.0,"method":"m","params":[],"id":0}`,
		"jsonrpc null":       `{"jsonrpc":null,"method":"m","params":[],"id":0}`,
		"v1 no params":       `{"method":"m","id":0}`,
		"v1 null params":     `{"method":"m","params":null,"id":0}`,
		"v1 object params":   `{"method":"m","params":{},"id":0}`,
		"params string":      `{"jsonrpc":"2.0","method":"m","params":"x","id":0}`,
		"no id (v2)":         `{"jsonrpc":"2.0","method":"m","params":[]}`,
		"no id (v1)":         `{"method":"m","params":[]}`,
		"null id":            `{"jsonrpc":"2.0","method":"m","params":[],"id":null}`,
		"float id":           `{"jsonrpc":"2.0","method":"m","params":[],"id":1.5}`,
		"float integral id":  `{"jsonrpc":"2.0","method":"m","params":[],"id":1.0}`,
		"exp id":             `{"jsonrpc":"2.0","method":"m","params":[],"id":1e2}`,
		"huge id":            `{"jsonrpc":"2.0","method":"m","params":[],"id":99999999999999999999}`,
		"bool id":            `{"jsonrpc":"2.0","method":"m","params":[],"id":true}`,
		"array id":           `{"jsonrpc":"2.0","method":"m","params":[],"id":[1]}`,
		"int overflow":       `{"jsonrpc":"2.0","method":"m","params":[9223372036854775808],"id":0}`,
		"int overflow deep":  `{"jsonrpc":"2.0","method":"m","params":[{"a":[-9223372036854775809]}],"id":0}`,
		"float overflow":     `{"jsonrpc":"2.0","method":"m","params":[1e400],"id":0}`,
		"NaN literal":        `{"jsonrpc":"2.0","method":"m","params":[NaN],"id":0}`,
		"too deep":           deep(MaxDepth + 1),
		"too deep object":    `{"jsonrpc":"2.0","method":"m","params":` + nested(`{"a":`, "}", MaxDepth+1, "1") + `,"id":0}`,
		"single quotes":      `{'method':'m','params':[],'id':0}`,
		"comments":           `{"method":"m",/*x*/"params":[],"id":0}`,
		"unescaped control":  "{\"method\":\"m\x01\",\"params\":[],\"id\":0}",
		"very deep for json": deep(20000),
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			req, err := DecodeJSONRequest([]byte(body))
			var de *DecodeError
			if !errors.As(err, &de) || req != nil {
				t.Fatalf("got %+v, err %v; want a *DecodeError", req, err)
			}
		})
	}
}
