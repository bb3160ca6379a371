package wire

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// seedFixtures adds every testdata/*.xml request to a fuzz corpus.
func seedFixtures(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.xml"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// sendable reports whether the encoder can write v so that it reads back
// unchanged (after xmlView): dates need a four-digit year and whole seconds.
func sendable(v any) bool {
	switch x := v.(type) {
	case time.Time:
		return x.Year() >= 0 && x.Year() <= 9999 && x.Nanosecond() == 0
	case InvalidDateTime:
		// Kept for a handler to refuse (FIELD_TYPE_ERROR), never sent.
		return false
	case []any:
		for _, el := range x {
			if !sendable(el) {
				return false
			}
		}
	case map[string]any:
		for _, el := range x {
			if !sendable(el) {
				return false
			}
		}
	}
	return true
}

func FuzzDecodeXMLRequest(f *testing.F) {
	seedFixtures(f)
	f.Add([]byte(call1(`<value><struct><member><name>k</name><value><array><data><value><i4>1</i4></value></data></array></value></member></struct></value>`)))
	f.Add([]byte(call1(`<value><dateTime.iso8601>2024-01-02T04:04:05.5+01:00</dateTime.iso8601></value>`)))
	f.Add([]byte(call1(`<value><base64>AAFo aQ</base64></value><value/>`)))
	f.Add([]byte(call1("<value>\n <double>-1e-7</double>\n</value>")))
	f.Add([]byte(`<methodCall><methodName>m</methodName><params><param><value><![CDATA[x]]>&#13;</value></param></params></methodCall>`))
	f.Fuzz(func(t *testing.T, body []byte) {
		method, params, err := DecodeXMLRequest(bytes.NewReader(body))
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
			}
			return
		}
		if method == "" {
			t.Fatal("empty method accepted")
		}
		if !sendable(params) {
			return
		}
		// What we decode, we can send back, and it reads the same.
		method2, params2, err := DecodeXMLRequest(bytes.NewReader(xmlCall(method, params)))
		if err != nil {
			t.Fatalf("re-encoded request rejected: %v\n%s", err, xmlCall(method, params))
		}
		if method2 != method || !equal(params2, xmlView(params)) {
			t.Fatalf("round trip changed the request:\n%q %#v\n%q %#v", method, params, method2, params2)
		}
	})
}

func FuzzDecodeJSONRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":0,"jsonrpc":"2.0","method":"session.login_with_password","params":["root","pw"]}`,
		`{"jsonrpc":"2.0","method":"event.from","params":["s",["VM","host"],"",60.1],"id":0}`,
		`{"method":"VM.get_record","params":["s","r"],"id":"x"}`,
		`{"jsonrpc":"2.0","method":"m","params":{"a":[1,-0,1.0,1e3,null,true,{"b":"\u2028"}]},"id":-1}`,
		`{"jsonrpc":"2.0","method":"m","params":[9223372036854775807,1e-400,"\ud800"],"id":0}`,
		`{"jsonrpc":"2.0","method":"m","id":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeJSONRequest(body)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v (%T) is not a *DecodeError", err, err)
			}
			return
		}
		if req.Method == "" || len(req.ID) == 0 || req.Params == nil {
			t.Fatalf("incomplete request accepted: %+v", req)
		}
		// Replies to it are valid JSON-RPC, id included.
		var b bytes.Buffer
		if err := WriteJSONSuccess(&b, req, req.Params); err != nil {
			t.Fatal(err)
		}
		var reply map[string]any
		if err := jsonUnmarshalNumber(b.Bytes(), &reply); err != nil {
			t.Fatalf("reply is not JSON: %v\n%s", err, b.Bytes())
		}
		if !equal(reply["result"], req.Params) {
			t.Fatalf("reply changed the params:\n%#v\n%#v", req.Params, reply["result"])
		}
		// And the request can be sent again unchanged.
		req2, err := DecodeJSONRequest(jsonCall(req.Method, req.Params))
		if err != nil {
			t.Fatalf("re-encoded request rejected: %v\n%s", err, jsonCall(req.Method, req.Params))
		}
		if req2.Method != req.Method || !equal(req2.Params, req.Params) {
			t.Fatalf("round trip changed the request:\n%#v\n%#v", req.Params, req2.Params)
		}
	})
}
