// Package storage_test exercises the storage layer end to end: a XenAPI
// server with the storage service registered, driven over JSON-RPC and
// HTTP like any client, with real qemu-img images under t.TempDir().
package storage_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage"
)

const rootPW = "secret"

type harness struct {
	t       *testing.T
	srv     *api.Server
	svc     *storage.Service
	http    *httptest.Server
	d       *db.DB
	sess    string
	dataDir string
	host    string
}

func needTools(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"qemu-img", "qemu-nbd", "qemu-io"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (scripts/install-test-deps.sh installs qemu-utils)", tool)
		}
	}
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// pluginDir installs the sample plugin (scripts/storage-plugin-sample)
// into a fresh directory.
func pluginDir(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	dir := t.TempDir()
	out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "storage-plugin-sample"), "--install", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("installing the sample plugin: %v %s", err, out)
	}
	return dir
}

func newHarness(t *testing.T, tweak ...func(*storage.Config)) *harness {
	t.Helper()
	needTools(t)
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	hash, err := api.HashPassword(rootPW, cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	srv := api.New(d, cfg, nil)
	router := mux.NewRouter()
	srv.Routes(router)
	dataDir := t.TempDir()
	// A small disk reserve, so that the suite runs on a fairly full disk
	// too (the default, max(1 GiB, 5%), is tested on its own).
	scfg := storage.Config{DataDir: dataDir, HostRef: host, FirstBoot: true, PluginDirs: []string{pluginDir(t)}, OpWait: 2 * time.Second,
		ReserveBytes: 64 << 20, ReservePercent: -1}
	for _, f := range tweak {
		f(&scfg)
	}
	svc, err := storage.Register(srv, router, scfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(router)
	h := &harness{t: t, srv: srv, svc: svc, http: hs, d: d, dataDir: dataDir, host: host}
	t.Cleanup(func() { hs.Close(); svc.Close(); srv.Close() })
	h.sess = h.str(h.ok("session.login_with_password", "root", rootPW, "1.0", "test"))
	return h
}

type rpcError struct {
	Code string
	Data []string
}

func (e *rpcError) Error() string { return e.Code + " " + strings.Join(e.Data, " ") }

func (h *harness) call(method string, params ...any) (json.RawMessage, *rpcError) {
	h.t.Helper()
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post(h.http.URL+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage
		Error  *struct {
			Message string
			Data    []string
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatal(err)
	}
	if out.Error != nil {
		return nil, &rpcError{out.Error.Message, out.Error.Data}
	}
	return out.Result, nil
}

// ok calls a method with the session first and fails the test on error.
func (h *harness) ok(method string, params ...any) json.RawMessage {
	h.t.Helper()
	if !strings.HasPrefix(method, "session.login") {
		params = append([]any{h.sess}, params...)
	}
	r, e := h.call(method, params...)
	if e != nil {
		h.t.Fatalf("%s: %s %v", method, e.Code, e.Data)
	}
	return r
}

// fails calls a method with the session and wants a given error code.
func (h *harness) fails(code, method string, params ...any) []string {
	h.t.Helper()
	_, e := h.call(method, append([]any{h.sess}, params...)...)
	if e == nil {
		h.t.Fatalf("%s succeeded, want %s", method, code)
	}
	if e.Code != code {
		h.t.Fatalf("%s: %s %v, want %s", method, e.Code, e.Data, code)
	}
	return e.Data
}

func (h *harness) str(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		h.t.Fatalf("not a string: %s", raw)
	}
	return s
}

func (h *harness) record(class, ref string) map[string]any {
	h.t.Helper()
	var m map[string]any
	json.Unmarshal(h.ok(class+".get_record", ref), &m)
	return m
}

func (h *harness) field(class, ref, f string) any { return h.record(class, ref)[f] }

func (h *harness) int(class, ref, f string) int64 {
	h.t.Helper()
	var n int64
	switch v := h.field(class, ref, f).(type) {
	case string:
		fmt.Sscan(v, &n)
	case float64:
		n = int64(v)
	}
	return n
}

// localSR is the first-boot "Local storage" SR.
func (h *harness) localSR() string {
	h.t.Helper()
	var refs []string
	json.Unmarshal(h.ok("SR.get_by_name_label", "Local storage"), &refs)
	if len(refs) != 1 {
		h.t.Fatalf("Local storage SRs: %v", refs)
	}
	return refs[0]
}

func (h *harness) createSR(typ string, dc map[string]string, sm map[string]string) string {
	h.t.Helper()
	if sm == nil {
		sm = map[string]string{}
	}
	return h.str(h.ok("SR.create", h.host, dc, "0", typ+" SR", "", typ, "user", false, sm))
}

func (h *harness) createVDI(sr string, size int64) string {
	h.t.Helper()
	return h.str(h.ok("VDI.create", map[string]any{"SR": sr, "virtual_size": fmt.Sprint(size), "name_label": "disk",
		"name_description": "", "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}}))
}

func (h *harness) xferURL(path string, q url.Values) string {
	q.Set("session_id", h.sess)
	return h.http.URL + path + "?" + q.Encode()
}

// upload PUTs data to /import_raw_vdi; length < 0 sends it chunked.
func (h *harness) upload(vdi, format string, data io.Reader, length int64) (*http.Response, string) {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPut, h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "format": {format}}), data)
	req.ContentLength = length
	if length < 0 {
		req.TransferEncoding = []string{"chunked"}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func (h *harness) importRaw(vdi string, data []byte) {
	h.t.Helper()
	resp, body := h.upload(vdi, "raw", bytes.NewReader(data), int64(len(data)))
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("import: %s %s", resp.Status, body)
	}
}

func (h *harness) export(vdi string, q url.Values) []byte {
	h.t.Helper()
	if q == nil {
		q = url.Values{}
	}
	q.Set("vdi", vdi)
	resp, err := http.Get(h.xferURL("/export_raw_vdi", q))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		h.t.Fatalf("export: %s %s", resp.Status, b)
	}
	// Into one buffer the size the server announced: io.ReadAll's growing
	// and copying costs more than the transfer under the race detector.
	var buf bytes.Buffer
	if cl := resp.ContentLength; cl > 0 && cl <= 1<<30 {
		buf.Grow(int(cl) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		h.t.Fatal(err)
	}
	b := buf.Bytes()
	if cl := resp.ContentLength; cl >= 0 && cl != int64(len(b)) {
		h.t.Fatalf("export: Content-Length %d, got %d bytes", cl, len(b))
	}
	return b
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:8]) }

// sameDisk compares an export with the expected content, which may be
// shorter than the disk (the rest reads as zeroes).
func sameDisk(t *testing.T, got, want []byte, size int64) {
	t.Helper()
	if int64(len(got)) != size {
		t.Fatalf("exported %d bytes, disk is %d", len(got), size)
	}
	if !bytes.Equal(got[:len(want)], want) {
		t.Fatalf("content differs: got %s want %s", digest(got[:len(want)]), digest(want))
	}
	if !isZero(got[len(want):]) {
		t.Fatal("the rest of the disk is not zero")
	}
}

var zeroMiB = make([]byte, 1<<20)

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroMiB))
		if !bytes.Equal(b[:n], zeroMiB[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func (h *harness) waitTask(task string) map[string]any {
	h.t.Helper()
	for range 1000 {
		r := h.record("task", task)
		if r["status"] != "pending" && r["status"] != "cancelling" {
			return r
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatal("task did not finish")
	return nil
}

func ioPipe() (*io.PipeReader, *io.PipeWriter) { return io.Pipe() }

// uploadQuiet streams r to /import_raw_vdi under a given task and ignores
// the outcome (the task tells it).
func (h *harness) uploadQuiet(vdi, task string, r io.Reader) {
	req, _ := http.NewRequest(http.MethodPut, h.xferURL("/import_raw_vdi", url.Values{"vdi": {vdi}, "task_id": {task}}), r)
	req.TransferEncoding = []string{"chunked"}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
