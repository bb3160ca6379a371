package storage_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func (h *harness) ctx() context.Context { return context.Background() }

// legacyUpload sends an HTTP/1.0 PUT with neither Content-Length nor
// chunking, writes data and, when finish, closes its side so the server
// sees the end. It returns the task the server names.
func (h *harness) legacyUpload(vdi string, data []byte, finish bool) string {
	h.t.Helper()
	u, _ := url.Parse(h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "format": {"raw"}}))
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		h.t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n", u.RequestURI(), u.Host)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("legacy upload: %s %s", resp.Status, b)
	}
	task := resp.Header.Get("Task-Id")
	if _, err := conn.Write(data); err != nil {
		h.t.Fatal(err)
	}
	if finish {
		conn.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, br)
	}
	return task
}

// suiteHalfUpload: an upload that stops halfway fails its task and leaves
// the VDI consistent, usable and with nothing attached.
func suiteHalfUpload(h *harness, sr string) {
	t := h.t
	const size = 64 << 20
	vdi := h.createVDI(sr, size)
	first := randomBytes(size)
	h.importRaw(vdi, first)
	task := h.str(h.ok("task.create", "upload", ""))
	u, _ := url.Parse(h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "format": {"raw"}, "task_id": {task}}))
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", u.RequestURI(), u.Host, size)
	second := randomBytes(size)
	conn.Write(second[:20<<20])
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	r := h.waitTask(task)
	if r["status"] != "failure" {
		t.Fatalf("task after a broken upload: %v", r)
	}
	if info := fmt.Sprint(r["error_info"]); !strings.Contains(info, "IMPORT_ERROR_PREMATURE_EOF") {
		t.Fatalf("error_info %s", info)
	}
	// Consistent: detached, no operations, a clean image that holds the
	// new data up to where it stopped, or the old.
	if n := len(h.svc.Datapaths()); n != 0 {
		t.Fatalf("datapaths left: %v", h.svc.Datapaths())
	}
	if ops := h.record("VDI", vdi)["current_operations"].(map[string]any); len(ops) != 0 {
		t.Fatalf("current_operations %v", ops)
	}
	if p := h.vdiImage(sr, vdi); p != "" {
		run(t, "qemu-img", "check", "-q", p)
	}
	got := h.export(vdi, nil)
	for off := 0; off < size; off += 1 << 20 {
		blk := got[off : off+1<<20]
		if !bytes.Equal(blk, first[off:off+1<<20]) && !bytes.Equal(blk, second[off:off+1<<20]) {
			t.Fatalf("MiB %d is neither the old nor the new data", off>>20)
		}
		if off >= 20<<20 && !bytes.Equal(blk, first[off:off+1<<20]) {
			t.Fatalf("MiB %d changed beyond what was sent", off>>20)
		}
	}
	h.importRaw(vdi, second)
	sameDisk(t, h.export(vdi, nil), second, size)
	h.ok("VDI.destroy", vdi)

	// The same into a new, empty VDI (written directly, not through
	// qemu-nbd): what arrived is there, the rest reads as zeroes.
	fresh := h.createVDI(sr, size)
	task = h.str(h.ok("task.create", "upload", ""))
	u, _ = url.Parse(h.xferURL("/import_raw_vdi", url.Values{"vdi": {fresh}, "format": {"raw"}, "task_id": {task}}))
	if conn, err = net.Dial("tcp", u.Host); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", u.RequestURI(), u.Host, size)
	conn.Write(second[:20<<20])
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	if r := h.waitTask(task); r["status"] != "failure" || !strings.Contains(fmt.Sprint(r["error_info"]), "IMPORT_ERROR_PREMATURE_EOF") {
		t.Fatalf("task after a broken upload into a new VDI: %v", r)
	}
	if p := h.vdiImage(sr, fresh); p != "" {
		run(t, "qemu-img", "check", "-q", p)
	}
	got = h.export(fresh, nil)
	for off := 0; off < size; off += 1 << 20 {
		blk := got[off : off+1<<20]
		if !isZero(blk) && (off >= 20<<20 || !bytes.Equal(blk, second[off:off+1<<20])) {
			t.Fatalf("MiB %d of the new VDI holds neither what was sent nor zeroes", off>>20)
		}
	}
	h.waitNoDatapaths()
	h.ok("VDI.destroy", fresh)
}

// vdiImage is the qcow2 file of a VDI on a directory SR, or "".
func (h *harness) vdiImage(sr, vdi string) string {
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	dc := h.record("PBD", pbds[0])["device_config"].(map[string]any)
	dir, _ := dc["location"].(string)
	if dir == "" {
		dir, _ = dc["path"].(string)
	}
	p := filepath.Join(dir, h.field("VDI", vdi, "location").(string)+".qcow2")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func suiteBadInput(h *harness, sr string) {
	t := h.t
	dir := h.srDir(sr)
	before := listDir(t, dir)
	// Bigger than the SR can hold (even overprovisioned: its whole size).
	h.fails("SR_FULL", "VDI.create", map[string]any{"SR": sr, "virtual_size": fmt.Sprint(int64(60) << 40), "name_label": "x",
		"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}})
	h.fails("INVALID_VALUE", "VDI.create", map[string]any{"SR": sr, "virtual_size": "-1", "name_label": "x",
		"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}})
	if after := listDir(t, dir); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("stray files: %v, before %v", after, before)
	}
	vdi := h.createVDI(sr, 4<<20)
	// Uploads that do not fit, or name nothing, or are not what they say.
	resp, body := h.upload(vdi, "raw", bytes.NewReader(make([]byte, 5<<20)), 5<<20)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.HasPrefix(body, "VDI_TOO_SMALL") {
		t.Fatalf("oversized upload: %s %s", resp.Status, body)
	}
	resp, body = h.upload(vdi, "raw", bytes.NewReader(make([]byte, 5<<20)), -1)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.HasPrefix(body, "VDI_TOO_SMALL") {
		t.Fatalf("oversized chunked upload: %s %s", resp.Status, body)
	}
	resp, body = h.upload(vdi, "qcow2", strings.NewReader("not an image at all"), 19)
	if resp.StatusCode != http.StatusBadRequest || !strings.HasPrefix(body, "IMPORT_ERROR") {
		t.Fatalf("garbage qcow2: %s %s", resp.Status, body)
	}
	for _, c := range []struct {
		q    url.Values
		code int
		err  string
	}{
		{url.Values{"vdi": {"OpaqueRef:00000000-0000-0000-0000-000000000000"}}, 404, "HANDLE_INVALID"},
		{url.Values{"vdi": {"00000000-0000-0000-0000-000000000000"}}, 404, "UUID_INVALID"},
		{url.Values{"vdi": {"nonsense"}}, 404, "UUID_INVALID"},
		{url.Values{}, 400, "INVALID_VALUE"},
		{url.Values{"vdi": {vdi}, "format": {"tar"}}, 400, "VALUE_NOT_SUPPORTED"},
		{url.Values{"vdi": {vdi}, "base": {vdi}}, 400, "VALUE_NOT_SUPPORTED"},
	} {
		q := c.q
		q.Set("session_id", h.sess)
		resp, err := http.Get(h.http.URL + "/export_raw_vdi?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.HasPrefix(string(b), c.err) {
			t.Errorf("export %v: %s %s, want %d %s", c.q, resp.Status, b, c.code, c.err)
		}
	}
	// Authentication as xapi: a session, or basic auth; nothing else.
	resp, _ = http.Get(h.http.URL + "/export_raw_vdi?vdi=" + vdi)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no credentials: %s", resp.Status)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodGet, h.http.URL+"/export_raw_vdi?vdi="+vdi, nil)
	req.SetBasicAuth("root", rootPW)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("basic auth: %v %v", resp, err)
	} else {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	h.fails("VDI_TOO_SMALL", "VDI.resize", vdi, fmt.Sprint(1<<20))
	h.fails("HANDLE_INVALID", "VDI.destroy", "OpaqueRef:00000000-0000-0000-0000-000000000000")
	h.ok("VDI.destroy", vdi)
	if after := listDir(t, dir); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("stray files: %v, before %v", after, before)
	}
}

func (h *harness) srDir(sr string) string {
	var pbds []string
	json.Unmarshal(h.ok("SR.get_PBDs", sr), &pbds)
	dc := h.record("PBD", pbds[0])["device_config"].(map[string]any)
	if d, _ := dc["location"].(string); d != "" {
		return d
	}
	d, _ := dc["path"].(string)
	return d
}

func TestSRCreateBadLocation(t *testing.T) {
	h := newHarness(t)
	file := filepath.Join(t.TempDir(), "plain-file")
	os.WriteFile(file, nil, 0o600)
	for _, typ := range []string{"file", "sharedfs"} {
		for _, c := range []struct {
			dc   map[string]string
			code string
		}{
			{map[string]string{}, "SR_BACKEND_FAILURE_94"},
			{map[string]string{"location": "/no/such/dir"}, "SR_BACKEND_FAILURE_47"},
			{map[string]string{"location": "relative/dir"}, "SR_BACKEND_FAILURE_1"},
			{map[string]string{"location": file}, "SR_BACKEND_FAILURE_47"},
		} {
			data := h.fails(c.code, "SR.create", h.host, c.dc, "0", "bad", "", typ, "user", false, map[string]string{})
			if len(data) != 3 || data[1] == "" {
				t.Errorf("%s %v: params %v carry no message", typ, c.dc, data)
			}
		}
	}
	// System directories are refused outright (TestSRLocationRefused has
	// the rest).
	h.fails("INVALID_VALUE", "SR.create", h.host, map[string]string{"location": "/proc"}, "0", "bad", "", "file", "user", false, map[string]string{})
	unwritable := t.TempDir()
	os.Chmod(unwritable, 0o500)
	if os.Geteuid() != 0 {
		h.fails("SR_BACKEND_FAILURE_61", "SR.create", h.host, map[string]string{"location": unwritable}, "0", "bad", "", "file", "user", false, map[string]string{})
	}
	h.fails("SR_BACKEND_FAILURE_47", "SR.create", h.host, map[string]string{"path": "/no/such/dir"}, "0", "bad", "", "sample", "user", false, map[string]string{})
	h.fails("SR_UNKNOWN_DRIVER", "SR.create", h.host, map[string]string{}, "0", "bad", "", "nfs-ish", "user", false, map[string]string{})
	// Creating over an existing SR is refused; the SR stays intact.
	dir := t.TempDir()
	sr := h.createSR("file", map[string]string{"location": dir}, nil)
	h.fails("SR_BACKEND_FAILURE_42", "SR.create", h.host, map[string]string{"location": dir}, "0", "again", "", "file", "user", false, map[string]string{})
	h.ok("SR.scan", sr)
}

// A thin VDI bigger than the free space is refused unless the SR allows
// overprovisioning.
func TestSRFull(t *testing.T) {
	h := newHarness(t)
	sr := h.createSR("file", map[string]string{"location": t.TempDir()}, nil)
	free := h.int("SR", sr, "physical_size") - h.int("SR", sr, "physical_utilisation")
	data := h.fails("SR_FULL", "VDI.create", map[string]any{"SR": sr, "virtual_size": fmt.Sprint(free + 1<<30), "name_label": "x",
		"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}})
	if len(data) != 2 {
		t.Fatalf("SR_FULL params %v", data)
	}
	h.ok("SR.add_to_sm_config", sr, "overprovision", "true")
	v := h.createVDI(sr, free+1<<30)
	h.ok("VDI.destroy", v)
}

// waitNoDatapaths waits for transfers that have sent their last byte to
// let go of their VDIs.
func (h *harness) waitNoDatapaths() {
	h.t.Helper()
	for range 500 {
		if len(h.svc.Datapaths()) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("datapaths left: %v", h.svc.Datapaths())
}
