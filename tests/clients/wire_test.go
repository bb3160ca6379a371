// Package clients holds what real clients send that xapi accepts, as raw
// requests against a real daemon (issue 14's wire facts).
package clients

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
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

// rawDate is an XML-RPC dateTime written as given.
type rawDate string

// xmlValue writes v as an XML-RPC value (what a client's library does).
func xmlValue(b *strings.Builder, v any) {
	if m, ok := v.(map[string]string); ok {
		v = anyMap(m)
	}
	b.WriteString("<value>")
	switch x := v.(type) {
	case string:
		b.WriteString("<string>")
		_ = xml.EscapeText(b, []byte(x))
		b.WriteString("</string>")
	case rawDate:
		b.WriteString("<dateTime.iso8601>" + string(x) + "</dateTime.iso8601>")
	case int:
		b.WriteString("<string>" + strconv.Itoa(x) + "</string>") // XenAPI ints travel as strings
	case float64:
		b.WriteString("<double>" + strconv.FormatFloat(x, 'g', -1, 64) + "</double>")
	case bool:
		if x {
			b.WriteString("<boolean>1</boolean>")
		} else {
			b.WriteString("<boolean>0</boolean>")
		}
	case []string:
		b.WriteString("<array><data>")
		for _, e := range x {
			xmlValue(b, e)
		}
		b.WriteString("</data></array>")
	case map[string]any:
		b.WriteString("<struct>")
		for k, e := range x {
			b.WriteString("<member><name>" + k + "</name>")
			xmlValue(b, e)
			b.WriteString("</member>")
		}
		b.WriteString("</struct>")
	default:
		panic(fmt.Sprintf("xmlValue: %T", v))
	}
	b.WriteString("</value>")
}

// The Go SDK (terraform's client) sends whole records to constructors:
// runtime fields hold values no constructor reads (a dateTime it writes
// as 111T0:0:0, an empty enum), which xapi ignores.
func TestGoSDKWholeRecords(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	s := d.Login(t)
	call := func(method string, params ...any) string {
		t.Helper()
		var b strings.Builder
		b.WriteString("<?xml version=\"1.0\"?><methodCall><methodName>" + method + "</methodName><params>")
		for _, p := range params {
			b.WriteString("<param>")
			xmlValue(&b, p)
			b.WriteString("</param>")
		}
		b.WriteString("</params></methodCall>")
		resp, err := http.Post(d.URL+"/", "text/xml", strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<name>Status</name><value>Success</value>") {
			t.Fatalf("%s: %d %s", method, resp.StatusCode, body)
		}
		i := strings.Index(string(body), "OpaqueRef:")
		return strings.SplitN(string(body)[i:], "<", 2)[0]
	}
	rec := map[string]any{}
	for k, v := range testdaemon.VMRecord("go sdk") {
		switch x := v.(type) {
		case int:
			rec[k] = x
		case float64, string, bool, []string, map[string]string:
			rec[k] = x
		}
	}
	rec["snapshot_time"] = rawDate("111T0:0:0")
	rec["power_state"] = "Halted"
	vm := call("VM.create", s, rec)
	var nets []string
	raw, err := d.Client().Call("network.get_all", s)
	if err != nil || json.Unmarshal(raw, &nets) != nil || len(nets) == 0 {
		t.Fatalf("networks: %s %v", raw, err)
	}
	call("VIF.create", s, map[string]any{"device": "0", "network": nets[0], "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
		"locking_mode": "network_default", "ipv4_allowed": []string{}, "ipv6_allowed": []string{},
		"ipv4_configuration_mode": "", "ipv6_configuration_mode": "", "ipv4_addresses": []string{}, "currently_attached": false})
}

func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
