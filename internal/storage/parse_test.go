package storage

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"toolstackd/internal/xerr"
)

func TestParsePluginError(t *testing.T) {
	for _, c := range []struct {
		stdout string
		code   string
		params []string
	}{
		{`{"error": {"code": "SR_BACKEND_FAILURE_44", "params": ["", "no space", ""]}}`, "SR_BACKEND_FAILURE_44", []string{"", "no space", ""}},
		{`{"error": {"code": "VDI_IN_USE", "params": ["x", "y"]}}`, "VDI_IN_USE", []string{"x", "y"}},
		{`{"error": {"code": "MY_OWN_ERROR", "params": ["a"]}}`, "SR_BACKEND_FAILURE", []string{"1", "MY_OWN_ERROR: a", "oops"}},
		{`{"error": {"code": "lower case", "params": []}}`, "SR_BACKEND_FAILURE", nil},
		{`Traceback (most recent call last)`, "SR_BACKEND_FAILURE", []string{"1", "Traceback (most recent call last)", "oops"}},
		{``, "SR_BACKEND_FAILURE", []string{"1", "", "oops"}},
	} {
		e := parsePluginError("1", []byte(c.stdout), []byte("oops"))
		if e.Code != c.code || (c.params != nil && !reflect.DeepEqual(e.Params, c.params)) {
			t.Errorf("%q: %s %q", c.stdout, e.Code, e.Params)
		}
	}
}

func FuzzParsePluginOutput(f *testing.F) {
	f.Add([]byte(`{"error": {"code": "SR_BACKEND_FAILURE_44", "params": ["", "no space", ""]}}`))
	f.Add([]byte(`{"key": "k", "virtual_size": 10, "uri": ["samplenbd:///x"]}`))
	f.Add([]byte(`[{"key": "a"}]`))
	f.Add([]byte(`{"kind": "nbd", "uri": "nbd+unix:///vdi?socket=/x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := parsePluginError("1", b, b)
		if e == nil || !codeRE.MatchString(e.Code) {
			t.Fatalf("bad error %v", e)
		}
		for _, p := range e.Params {
			if len(p) > 4096+3 {
				t.Fatal("param not clipped")
			}
		}
		var v pluginVolume
		if parsePluginResult(b, &v) == nil {
			if vol, err := v.volume(); err == nil && (vol.Key == "" || vol.VirtualSize < 0) {
				t.Fatal("accepted a bad volume")
			}
		}
		var vs []pluginVolume
		parsePluginResult(b, &vs)
		var d Datapath
		parsePluginResult(b, &d)
		parsePluginResult(b, nil)
	})
}

func FuzzParseXferQuery(f *testing.F) {
	f.Add("vdi=OpaqueRef:3b0a5d9e-7a8c-4a55-9b6e-6f2f3c5d4e1f&format=qcow2&base=0b6e2b3c-2a44-4d5e-8f7a-1c2d3e4f5a6b")
	f.Add("vdi=0b6e2b3c-2a44-4d5e-8f7a-1c2d3e4f5a6b&format=vhd&task_id=OpaqueRef:x")
	f.Add("vdi=&format=RAW&chunked=true")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		for _, export := range []bool{false, true} {
			x, err := parseXferQuery(q, export)
			if err != nil {
				if xe := xerr.From(err); xe.Code == xerr.InternalError {
					t.Fatalf("internal error for %q", raw)
				}
				continue
			}
			if x.Format != "raw" && x.Format != "qcow2" && x.Format != "vhd" {
				t.Fatalf("format %q accepted", x.Format)
			}
			if !validID(x.VDI) {
				t.Fatalf("vdi %q accepted", x.VDI)
			}
		}
	})
}

func FuzzParseMap(f *testing.F) {
	f.Add([]byte(`[{ "start": 0, "length": 1048576, "depth": 0, "present": true, "zero": false, "data": true, "offset": 327680},
{ "start": 1048576, "length": 3145728, "depth": 1, "present": false, "zero": true, "data": false}]`), int64(4194304))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		exts, err := parseMap(b, size)
		if err != nil {
			return
		}
		var next int64
		for _, e := range exts {
			if e.Start != next || e.Length <= 0 {
				t.Fatal("accepted a gap or an empty extent")
			}
			next += e.Length
		}
	})
}

// Every error code the package raises is a published XenAPI error (or an
// SR_BACKEND_FAILURE_<n>).
func TestErrorCodesArePublished(t *testing.T) {
	b, err := os.ReadFile("../datamodel/errors.json")
	if err != nil {
		t.Skip(err)
	}
	var published map[string]any
	json.Unmarshal(b, &published)
	re := regexp.MustCompile(`(?:xerr\.New|errorCode)\(\s*"([A-Z_0-9]+)"|err[A-Z][A-Za-z]+\s*=\s*"([A-Z_0-9]+)"`)
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, _ := os.ReadFile(f)
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			code := m[1] + m[2]
			if _, ok := published[code]; !ok {
				t.Errorf("%s: %s is not in errors.json", f, code)
			}
		}
	}
}
