package clients

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// What Xen Orchestra's npm client (xen-api 4.7.6, putResource) sends for a
// disk stream whose length it does not know, as raw requests: every
// request declares Content-Length 1125899906842624 (1 PiB). First the
// probe (no task_id, no data), which it closes as soon as the answer's
// header arrives; then the upload with task_id, whose data it sends
// before closing its side without reading further. xapi answers an
// import before reading it and takes the end of the connection as the
// end of the data.
const xoUnknownLength = "1125899906842624"

// xoPut opens a connection and sends a PUT's header with the given
// Content-Length; it returns the connection and a reader of the answer.
func xoPut(t *testing.T, addr, target, length string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %s\r\nConnection: keep-alive\r\n\r\n", target, addr, length); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// statusLine reads an answer's status line and headers, and says how long
// the answer took from start.
func statusLine(t *testing.T, br *bufio.Reader, start time.Time) (string, time.Duration) {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("no answer after %v: %v", time.Since(start), err)
	}
	took := time.Since(start)
	for {
		h, err := br.ReadString('\n')
		if err != nil || h == "\r\n" {
			break
		}
	}
	return strings.TrimSpace(line), took
}

// uploadOfUnknownLength PUTs body to path as xen-api sends a stream of
// unknown length (1 PiB declared; the data ends with the connection),
// with a task of its own, and waits for the task to succeed: the answer
// must come at once, before the body.
func uploadOfUnknownLength(t *testing.T, c *testdaemon.Client, s, addr, path string, q url.Values, body []byte) string {
	t.Helper()
	str := strOf(t)
	task := str(c.Call("task.create", s, "xo upload", ""))
	q.Set("task_id", task)
	start := time.Now()
	conn, br := xoPut(t, addr, path+"?"+q.Encode(), xoUnknownLength)
	defer conn.Close()
	if line, took := statusLine(t, br, start); !strings.Contains(line, " 200 ") || took > 5*time.Second {
		t.Fatalf("upload to %s: %q after %v", path, line, took)
	}
	if _, err := conn.Write(body); err != nil {
		t.Fatal(err)
	}
	_ = conn.(*net.TCPConn).CloseWrite()
	deadline := time.Now().Add(20 * time.Second)
	for {
		status := str(c.Call("task.get_status", s, task))
		if status == "success" {
			return task
		}
		if status != "pending" || time.Now().After(deadline) {
			raw, _ := c.Call("task.get_error_info", s, task)
			t.Fatalf("upload task to %s: %s %s", path, status, raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestXOUploadOfUnknownLength(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	s := d.Login(t)
	str := strOf(t)
	var pools []string
	if raw, err := c.Call("pool.get_all", s); err != nil || json.Unmarshal(raw, &pools) != nil || len(pools) != 1 {
		t.Fatalf("pool.get_all: %s %v", raw, err)
	}
	sr := str(c.Call("pool.get_default_SR", s, pools[0]))
	const size = 4 << 20
	vdi := str(c.Call("VDI.create", s, map[string]any{"name_label": "xo-unknown-length", "name_description": "", "SR": sr,
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}}))
	addr := strings.TrimPrefix(d.URL, "http://")
	q := url.Values{"session_id": {s}, "vdi": {vdi}, "format": {"raw"}}

	// The probe is answered 200 before any data, and nothing is written:
	// the client closes it on the answer.
	start := time.Now()
	conn, br := xoPut(t, addr, "/import_raw_vdi/?"+q.Encode(), xoUnknownLength)
	if line, took := statusLine(t, br, start); !strings.Contains(line, " 200 ") || took > 5*time.Second {
		t.Fatalf("probe: %q after %v", line, took)
	}
	_ = conn.Close()

	// The upload, right after: the probe must not hold the VDI.
	data := bytes.Repeat([]byte("unknown length "), size/16)
	uploadOfUnknownLength(t, c, s, addr, "/import_raw_vdi/", q, data)

	resp, err := http.Get(d.URL + "/export_raw_vdi/?" + url.Values{"session_id": {s}, "vdi": {vdi}, "format": {"raw"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(got) != size || !bytes.Equal(got[:len(data)], data) {
		t.Fatalf("export: %d, %d bytes, %v", resp.StatusCode, len(got), err)
	}
	if !bytes.Equal(got[len(data):], make([]byte, size-len(data))) {
		t.Fatal("the rest of the disk is not zero")
	}

	// An honest length that does not fit is still refused up front.
	start = time.Now()
	q.Del("task_id")
	_, br = xoPut(t, addr, "/import_raw_vdi/?"+q.Encode(), fmt.Sprint(size+1))
	if line, took := statusLine(t, br, start); !strings.Contains(line, " 413 ") || took > 5*time.Second {
		t.Fatalf("oversized upload: %q after %v", line, took)
	}
}

// An upload (disk or VM) refused before its body is read is answered at
// once while the client still holds the body back, as Xen Orchestra's
// probe does, not after the server's read deadline (60 s): net/http
// reads what is left of a body before answering unless the connection is
// to be closed.
func TestImportErrorBeforeBodyIsImmediate(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	s := d.Login(t)
	addr := strings.TrimPrefix(d.URL, "http://")
	for _, target := range []string{
		"/import_raw_vdi/?format=raw&vdi=x&session_id=OpaqueRef:bad",
		"/import_raw_vdi?format=raw&vdi=OpaqueRef:00000000-0000-0000-0000-00000000e2e1&session_id=" + s,
		"/import_raw_vdi?format=bogus&vdi=OpaqueRef:00000000-0000-0000-0000-00000000e2e1&session_id=" + s,
		"/import/?sr_id=OpaqueRef:00000000-0000-0000-0000-00000000e2e3&session_id=" + s,
	} {
		for _, length := range []string{"100", xoUnknownLength} {
			start := time.Now()
			_, br := xoPut(t, addr, target, length)
			line, took := statusLine(t, br, start)
			if strings.Contains(line, " 200 ") || took > 5*time.Second {
				t.Errorf("%s (Content-Length %s): %q after %v", target, length, line, took)
			}
		}
	}
}

// The same for a VM import (PUT /import/, an XVA), which Xen Orchestra
// streams with the 1 PiB declaration whenever the archive's length is
// unknown (an upload from a browser, a URL without a length).
func TestXOVMImportOfUnknownLength(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	s := d.Login(t)
	str := strOf(t)
	var tmpls []string
	if raw, err := c.Call("VM.get_by_name_label", s, "Other install media"); err != nil || json.Unmarshal(raw, &tmpls) != nil || len(tmpls) != 1 {
		t.Fatalf("template: %s %v", raw, err)
	}
	vm := str(c.Call("VM.clone", s, tmpls[0], "xo-xva-source"))
	if _, err := c.Call("VM.set_is_a_template", s, vm, false); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(d.URL + "/export/?" + url.Values{"session_id": {s}, "ref": {vm}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	xva, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(xva) == 0 {
		t.Fatalf("export: %d, %d bytes, %v", resp.StatusCode, len(xva), err)
	}
	addr := strings.TrimPrefix(d.URL, "http://")
	q := url.Values{"session_id": {s}}

	start := time.Now()
	conn, br := xoPut(t, addr, "/import/?"+q.Encode(), xoUnknownLength)
	if line, took := statusLine(t, br, start); !strings.Contains(line, " 200 ") || took > 5*time.Second {
		t.Fatalf("probe: %q after %v", line, took)
	}
	_ = conn.Close()

	task := uploadOfUnknownLength(t, c, s, addr, "/import/", q, xva)
	result := str(c.Call("task.get_result", s, task))
	if !strings.Contains(result, "OpaqueRef:") {
		t.Fatalf("import task result %q names no VM", result)
	}
	var vms []string
	if raw, err := c.Call("VM.get_by_name_label", s, "xo-xva-source"); err != nil || json.Unmarshal(raw, &vms) != nil || len(vms) != 2 {
		t.Fatalf("after the import, VMs named xo-xva-source: %s %v", raw, err)
	}
}
