// Package xenops_test exercises the VM lifecycle over the XenAPI, on the
// simulator and on real QEMU.
package xenops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xenops"
)

const rootPW = "xenops-test"

func TestMain(m *testing.M) {
	code := m.Run()
	if guestRoot != "" {
		os.RemoveAll(guestRoot)
	}
	testdaemon.RemoveBuilds()
	os.Exit(code)
}

// env is a toolstackd in the test process: database, API server, xenops.
type env struct {
	t     *testing.T
	dir   string
	d     *db.DB
	store *persist.Store
	srv   *api.Server
	http  *httptest.Server
	url   string
	m     *xenops.Manager
	host  string
	sess  string
	cfg   xenops.Config
}

type envOptions struct {
	persist bool // a durable database, as the daemon has
	dir     string
	quiet   bool
}

func testLogger(t *testing.T, quiet bool) *slog.Logger {
	level := slog.LevelInfo
	switch {
	case quiet || os.Getenv("XENOPS_TEST_VERBOSE") == "":
		level = slog.LevelError
	case os.Getenv("XENOPS_TEST_VERBOSE") == "debug":
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newEnv starts a toolstackd with xenops configured by cfg (DataDir,
// HostRef, Log are filled in).
func newEnv(t *testing.T, cfg xenops.Config, opts envOptions) *env {
	t.Helper()
	dir := opts.dir
	if dir == "" {
		dir = shortTempDir(t)
	}
	e := &env{t: t, dir: dir}
	var pers db.Persister
	if opts.persist {
		st, err := persist.Open(filepath.Join(dir, "toolstackd.db"), dm.Model, persist.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e.store = st
		pers = st
	}
	first := e.store == nil || e.store.Empty()
	e.d = db.New(dm.Model, db.Options{Persister: pers})
	if e.store != nil {
		if err := e.store.Load(e.d); err != nil {
			t.Fatal(err)
		}
	}
	acfg := api.DefaultConfig()
	acfg.PasswordIterations = 1000
	if first {
		hash, _ := api.HashPassword(rootPW, acfg.PasswordIterations)
		host, err := api.FirstBoot(e.d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
		if err != nil {
			t.Fatal(err)
		}
		e.host = host
		os.WriteFile(filepath.Join(dir, "host-ref"), []byte(host), 0o600)
	} else {
		b, err := os.ReadFile(filepath.Join(dir, "host-ref"))
		if err != nil {
			t.Fatal(err)
		}
		e.host = string(b)
		if err := api.StartupReset(e.d, e.host, api.ProbeHost()); err != nil {
			t.Fatal(err)
		}
	}
	acfg.HostRef = e.host
	e.srv = api.New(e.d, acfg, testLogger(t, opts.quiet))
	e.srv.Start()
	router := mux.NewRouter()
	e.srv.Routes(router)
	cfg.DataDir, cfg.HostRef = dir, e.host
	if cfg.Log == nil {
		cfg.Log = testLogger(t, opts.quiet)
	}
	m, err := xenops.Register(e.srv, router, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m, e.cfg = m, cfg
	e.http = httptest.NewServer(router)
	e.url = e.http.URL
	e.sess = e.str(e.call("session.login_with_password", "root", rootPW, "2.21", "xenops-test"))
	t.Cleanup(e.close)
	return e
}

// close stops the toolstackd; domains stay as they are.
func (e *env) close() {
	if e.http == nil {
		return
	}
	e.http.Close()
	e.srv.Close()
	e.m.Close()
	if e.store != nil {
		e.store.Close()
	}
	e.http = nil
}

// shortTempDir is a temporary directory with a short path: QEMU's Unix
// sockets live under it.
func shortTempDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "xo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// xapiError is a XenAPI failure.
type xapiError = testdaemon.Error

// rpcTimeout bounds one call: VM.start on real QEMU and a storm of a
// thousand of them take a while.
const rpcTimeout = 5 * time.Minute

// client is a JSON-RPC client for the env's server.
func (e *env) client() *testdaemon.Client {
	return &testdaemon.Client{URL: e.url, Timeout: rpcTimeout}
}

// rpc makes a JSON-RPC call.
func (e *env) rpc(method string, params ...any) (json.RawMessage, *xapiError) {
	e.t.Helper()
	r, err := e.client().Call(method, params...)
	if x, ok := testdaemon.AsError(err); ok {
		return nil, x
	}
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	return r, nil
}

// call makes a call with the session that must succeed.
func (e *env) call(method string, params ...any) json.RawMessage {
	e.t.Helper()
	if e.sess != "" {
		params = append([]any{e.sess}, params...)
	}
	r, x := e.rpc(method, params...)
	if x != nil {
		e.t.Fatalf("%s: %s %v", method, x.Code, x.Params)
	}
	return r
}

// try makes a call with the session and returns its error.
func (e *env) try(method string, params ...any) *xapiError {
	e.t.Helper()
	_, x := e.rpc(method, append([]any{e.sess}, params...)...)
	return x
}

// fails makes a call that must fail with code; it returns the params.
func (e *env) fails(code, method string, params ...any) []string {
	e.t.Helper()
	x := e.try(method, params...)
	if x == nil {
		e.t.Fatalf("%s succeeded, want %s", method, code)
	}
	if x.Code != code {
		e.t.Fatalf("%s: %s %v, want %s", method, x.Code, x.Params, code)
	}
	return x.Params
}

func (e *env) str(raw json.RawMessage) string {
	e.t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		e.t.Fatalf("not a string: %s", raw)
	}
	return s
}

func (e *env) record(class, ref string) map[string]any {
	e.t.Helper()
	var r map[string]any
	json.Unmarshal(e.call(class+".get_record", ref), &r)
	return r
}

func (e *env) field(class, ref, f string) any { return e.record(class, ref)[f] }

func (e *env) power(vm string) string { return e.field("VM", vm, "power_state").(string) }

// template finds a built-in template.
func (e *env) template(name string) string {
	var refs []string
	json.Unmarshal(e.call("VM.get_by_name_label", name), &refs)
	if len(refs) != 1 {
		e.t.Fatalf("template %q: %v", name, refs)
	}
	return refs[0]
}

// newVM makes a VM with VM.create from a record based on a template's.
func (e *env) newVM(name string, tweak map[string]any) string {
	e.t.Helper()
	rec := testdaemon.VMRecord(name)
	for k, v := range tweak {
		rec[k] = v
	}
	return e.str(e.call("VM.create", rec))
}

// network is the management network first boot made.
func (e *env) network() string {
	var refs []string
	json.Unmarshal(e.call("network.get_all"), &refs)
	if len(refs) == 0 {
		e.t.Fatal("no network")
	}
	return refs[0]
}

func (e *env) addVIF(vm, device string) string {
	return e.str(e.call("VIF.create", map[string]any{
		"device": device, "network": e.network(), "VM": vm, "MAC": "", "MTU": 1500, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}, "locking_mode": "network_default",
		"ipv4_allowed": []string{}, "ipv6_allowed": []string{},
	}))
}

// addVDI makes a VDI record whose location is path.
func (e *env) addVDI(name, path string, size int64) string {
	var ref string
	_, err := e.d.Update(func(tx *db.Tx) (err error) {
		rec := &dm.VDIRecord{NameLabel: name, Location: path, VirtualSize: size, Type: dm.VDITypeUser, SR: "OpaqueRef:NULL",
			OtherConfig: map[string]string{}, XenstoreData: map[string]string{}, SMConfig: map[string]string{}, Managed: true}
		ref, err = tx.Insert(dm.VDI.Class, "", rec.Row())
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ref
}

func (e *env) addVBD(vm, vdi, device, typ, mode string) string {
	empty := vdi == "OpaqueRef:NULL"
	return e.str(e.call("VBD.create", map[string]any{
		"VM": vm, "VDI": vdi, "userdevice": device, "bootable": device == "0", "mode": mode, "type": typ,
		"unpluggable": true, "empty": empty, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{},
	}))
}

// async starts an Async call and returns its task.
func (e *env) async(method string, params ...any) string {
	e.t.Helper()
	return e.str(e.call("Async."+method, params...))
}

// wait waits for a task to finish and returns its status and error.
func (e *env) wait(task string, timeout time.Duration) (string, []string) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		rec := e.record("task", task)
		if st := rec["status"].(string); st != "pending" && st != "cancelling" {
			var info []string
			for _, x := range rec["error_info"].([]any) {
				info = append(info, x.(string))
			}
			return st, info
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("task %s did not finish in %v", task, timeout)
	return "", nil
}

// eventually polls cond until it holds.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func strSet(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// resolver is a DiskResolver over files, counting attachments.
type resolver struct {
	mu       sync.Mutex
	files    map[string]string // VDI -> path
	attached map[string]int
	attaches int
	fail     error
}

func newResolver() *resolver {
	return &resolver{files: map[string]string{}, attached: map[string]int{}}
}

func (r *resolver) add(vdi, path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.files[vdi] = path
}

func (r *resolver) Attach(ctx context.Context, vm, vdi string, ro bool) (xenops.DiskSource, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return xenops.DiskSource{}, r.fail
	}
	p, ok := r.files[vdi]
	if !ok {
		return xenops.DiskSource{}, fmt.Errorf("no file for %s", vdi)
	}
	r.attached[vdi]++
	r.attaches++
	format := "raw"
	if strings.HasSuffix(p, ".qcow2") {
		format = "qcow2"
	}
	return xenops.DiskSource{Kind: xenops.DiskFile, Path: p, Format: format}, nil
}

func (r *resolver) Detach(ctx context.Context, vm, vdi string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attached[vdi] > 0 {
		r.attached[vdi]--
	}
	return nil
}

func (r *resolver) inUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.attached {
		n += c
	}
	return n
}

var _ io.Writer = testWriter{}

var (
	vmClass    = dm.VM.Class
	powerField = dm.VM.PowerState
)

// setOC sets other_config:key on a VM.
func (e *env) setOC(vm, key, value string) {
	e.call("VM.remove_from_other_config", vm, key)
	e.call("VM.add_to_other_config", vm, key, value)
}

// post makes a JSON-RPC call from any goroutine, without failing the
// test; it reports only a call that was not answered.
func (e *env) post(method string, params ...any) error {
	_, err := e.client().Call(method, params...)
	if _, ok := testdaemon.AsError(err); ok {
		return nil
	}
	return err
}
