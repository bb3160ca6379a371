package storage_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// smallQcow2 is a qcow2 image of size bytes, as qemu-img makes it, read
// into memory.
func smallQcow2(t *testing.T, size int64) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "img.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", p, strconv.FormatInt(size, 10))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// uploadAs PUTs data to /import_raw_vdi under a task made for it and
// returns the response, its body and the task's record once it ends.
func (h *harness) uploadAs(vdi, format string, data []byte) (*http.Response, string, map[string]any) {
	h.t.Helper()
	task := h.str(h.ok("task.create", "upload", ""))
	req, _ := http.NewRequest(http.MethodPut, h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "format": {format}, "task_id": {task}}),
		bytes.NewReader(data))
	req.ContentLength = int64(len(data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body), h.waitTask(task)
}

// Issue 29, finding 9: a qcow2 upload whose header declares a virtual
// size past what an int64 holds (2^63+4096 read as an int64 is
// negative, and passed the check against the VDI's size) is refused as
// too big, VDI_TOO_SMALL with the size the header declares, before
// anything is written; so are sizes that fit an int64 but no disk.
func TestQcow2UploadHugeVirtualSize(t *testing.T) {
	h := newHarness(t)
	sr := h.localSR()
	const size = 4 << 20
	vdi := h.createVDI(sr, size)
	data := randomBytes(1 << 20)
	h.importRaw(vdi, data)
	img := smallQcow2(t, size)
	for _, virt := range []uint64{1<<63 + 4096, 1 << 63, math.MaxUint64 &^ 511, 1<<62 + 4096, size + 512} {
		b := slices.Clone(img)
		binary.BigEndian.PutUint64(b[24:], virt) // the header's virtual size
		resp, body, task := h.uploadAs(vdi, "qcow2", b)
		want := "VDI_TOO_SMALL " + vdi + " " + strconv.FormatUint(virt, 10)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || strings.TrimSpace(body) != want {
			t.Errorf("virtual size %d: %s %q, want 413 %q", virt, resp.Status, body, want)
		}
		if task["status"] != "failure" || fmt.Sprint(task["error_info"]) != fmt.Sprint(strings.Fields(want)) {
			t.Errorf("virtual size %d: task %v %v", virt, task["status"], task["error_info"])
		}
	}
	h.waitNoDatapaths()
	sameDisk(t, h.export(vdi, nil), data, size)
	if left := listDir(t, filepath.Join(h.dataDir, "storage", "spool")); len(left) != 0 {
		t.Fatalf("spool files left: %v", left)
	}
}

// Issue 29, finding 9: what a failed import tells its client (the HTTP
// body, the task's error_info) names no file of the host: not the spool
// file an upload is staged in, nor a volume, nor the data dir.
func TestImportFailureHidesHostPaths(t *testing.T) {
	h := newHarness(t)
	sr := h.localSR()
	vdi := h.createVDI(sr, 4<<20)
	leaks := func(what, s string) {
		t.Helper()
		for _, p := range []string{h.dataDir, os.TempDir() + "/", "spool", "import-", ".qcow2"} {
			if strings.Contains(s, p) {
				t.Errorf("%s shows %q: %s", what, p, s)
			}
		}
	}
	// A qcow2 image this host's header check takes and qemu-img refuses
	// (its L1 table is not where a cluster starts).
	img := smallQcow2(t, 4<<20)
	binary.BigEndian.PutUint64(img[40:], binary.BigEndian.Uint64(img[40:])+8)
	resp, body, task := h.uploadAs(vdi, "qcow2", img)
	if resp.StatusCode == http.StatusOK || !strings.HasPrefix(body, "IMPORT_ERROR ") {
		t.Errorf("qcow2 that qemu-img refuses: %s %q", resp.Status, body)
	}
	leaks("the refused qcow2's answer", body)
	leaks("the refused qcow2's task", fmt.Sprint(task["error_info"]))

	// The spool cannot be made (a file where its directory goes): the
	// answer says what failed, not where.
	spool := filepath.Join(h.dataDir, "storage", "spool")
	if err := os.RemoveAll(spool); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spool, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	resp, body, task = h.uploadAs(vdi, "qcow2", smallQcow2(t, 4<<20))
	if resp.StatusCode == http.StatusOK {
		t.Errorf("qcow2 without a spool: %s %q", resp.Status, body)
	}
	leaks("the spool failure's answer", body)
	leaks("the spool failure's task", fmt.Sprint(task["error_info"]))
	if err := os.Remove(spool); err != nil {
		t.Fatal(err)
	}

	// A VDI whose volume went from under the SR: the failure is the
	// storage's, without the volume's path.
	gone := h.createVDI(sr, 4<<20)
	p := h.vdiImage(sr, gone)
	if p == "" {
		t.Fatal("no volume file for the VDI")
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"raw", "qcow2", "vhd"} {
		resp, body, task = h.uploadAs(gone, format, img)
		if resp.StatusCode == http.StatusOK {
			t.Errorf("%s into a VDI without a volume: %s %q", format, resp.Status, body)
		}
		leaks(format+" into a VDI without a volume: answer", body)
		leaks(format+" into a VDI without a volume: task", fmt.Sprint(task["error_info"]))
	}
}
