// Package clients holds what real clients send that xapi accepts, as raw
// requests against a real daemon (issue 14's wire facts).
package clients

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testdaemon"
)

// strOf reads a call's string result, failing t on an error.
func strOf(t *testing.T) func(raw json.RawMessage, err error) string {
	return func(raw json.RawMessage, err error) string {
		t.Helper()
		var s string
		if err != nil || json.Unmarshal(raw, &s) != nil {
			t.Fatalf("%s %v", raw, err)
		}
		return s
	}
}

// Xen Orchestra's disk transfers: a trailing slash after the handler's
// name (xapi matches handlers by prefix), and an empty probe PUT before
// the stream, which xapi answers 200 without writing anything.
func TestXODiskTransferForms(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	s := d.Login(t)
	str := strOf(t)
	var pbds []string
	raw, err := c.Call("PBD.get_all", s)
	if err != nil || json.Unmarshal(raw, &pbds) != nil || len(pbds) == 0 {
		t.Fatalf("PBDs: %s %v", raw, err)
	}
	sr := str(c.Call("PBD.get_SR", s, pbds[0]))
	vdi := str(c.Call("VDI.create", s, map[string]any{"name_label": "xo", "name_description": "", "SR": sr,
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}}))
	q := url.Values{"session_id": {s}, "vdi": {vdi}, "format": {"raw"}}.Encode()
	do := func(method, path string, body []byte) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, d.URL+path+"?"+q, bytes.NewReader(body))
		if body == nil {
			req.Body = nil
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
	// The probe: Content-Length 0, no task.
	if st, msg := do(http.MethodPut, "/import_raw_vdi/", []byte{}); st != http.StatusOK {
		t.Fatalf("XO's empty probe: %d %s", st, msg)
	}
	data := bytes.Repeat([]byte("xo"), 1<<19)
	if st, msg := do(http.MethodPut, "/import_raw_vdi/", data); st != http.StatusOK {
		t.Fatalf("import with a trailing slash: %d %s", st, msg)
	}
	if st, got := do(http.MethodGet, "/export_raw_vdi/", nil); st != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("export with a trailing slash: %d, %d bytes", st, len(got))
	}
	// The probe wrote nothing: a second probe leaves the data as it is.
	do(http.MethodPut, "/import_raw_vdi", []byte{})
	if _, got := do(http.MethodGet, "/export_raw_vdi", nil); !bytes.Equal(got, data) {
		t.Fatal("a probe changed the disk")
	}
	// Other paths keep their meaning: an unknown one is still 404.
	if st, _ := do(http.MethodGet, "/no_such_handler/", nil); st != http.StatusNotFound {
		t.Fatalf("unknown handler with a slash: %d", st)
	}
}

// The XenServer SDK's samples call methods with "_" for "." (xapi answers
// both): session_login_with_password, event_from, VM_get_all.
func TestUnderscoredMethodNames(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	str := strOf(t)
	s := str(c.Call("session_login_with_password", "root", d.Opts.Password, "2.0", "sdk sample"))
	if !strings.HasPrefix(s, "OpaqueRef:") {
		t.Fatalf("session: %q", s)
	}
	if raw, err := c.Call("VM_get_all", s); err != nil || !strings.HasPrefix(string(raw), "[") {
		t.Fatalf("VM_get_all: %s %v", raw, err)
	}
	if raw, err := c.Call("event_from", s, []string{"vm"}, "", 0.1); err != nil || !strings.Contains(string(raw), "token") {
		t.Fatalf("event_from: %.200s %v", raw, err)
	}
}

// host.get_servertime and get_server_localtime: Xen Orchestra's clock
// check compares them with its own clock.
func TestServerTime(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	s := d.Login(t)
	host := strOf(t)(c.Call("session.get_this_host", s, s))
	for _, m := range []string{"host.get_servertime", "host.get_server_localtime"} {
		raw, err := c.CallXML(m, s, host)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		text, _ := raw.(string)
		got, err := time.Parse("20060102T15:04:05Z", text)
		if err != nil {
			t.Fatalf("%s: %T %v, want an XML-RPC dateTime as xapi writes it", m, raw, raw)
		}
		if d := time.Since(got); m == "host.get_servertime" && (d > time.Minute || d < -time.Minute) {
			t.Fatalf("%s: %v is %v from now", m, got, d)
		}
	}
}
