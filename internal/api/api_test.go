package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

const rootPW = "secret"

type harness struct {
	t    *testing.T
	srv  *api.Server
	http *httptest.Server
	d    *db.DB
}

func newHarness(t *testing.T, tweak ...func(*api.Config)) *harness {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000 // keep logins fast in tests
	for _, f := range tweak {
		f(&cfg)
	}
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
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { srv.Close(); hs.Close() })
	return &harness{t: t, srv: srv, http: hs, d: d}
}

// rpcError is a XenAPI failure as a JSON-RPC 2.0 reply carries it.
type rpcError struct {
	Code string
	Data []string
}

func (h *harness) jsonCall(method string, params ...any) (json.RawMessage, *rpcError) {
	h.t.Helper()
	if params == nil {
		params = []any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
	resp, err := http.Post(h.http.URL+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		h.t.Fatalf("Content-Type %q", ct)
	}
	var out struct {
		Result json.RawMessage
		Error  *struct {
			Code    int
			Message string
			Data    []string
		}
		ID int
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatal(err)
	}
	if out.ID != 7 {
		h.t.Fatalf("id %d", out.ID)
	}
	if out.Error != nil {
		if out.Error.Code != 1 {
			h.t.Fatalf("error code %d", out.Error.Code)
		}
		return nil, &rpcError{out.Error.Message, out.Error.Data}
	}
	return out.Result, nil
}

func (h *harness) ok(method string, params ...any) json.RawMessage {
	h.t.Helper()
	r, e := h.jsonCall(method, params...)
	if e != nil {
		h.t.Fatalf("%s: %s %v", method, e.Code, e.Data)
	}
	return r
}

func (h *harness) fails(code string, method string, params ...any) []string {
	h.t.Helper()
	_, e := h.jsonCall(method, params...)
	if e == nil {
		h.t.Fatalf("%s succeeded, want %s", method, code)
	}
	if e.Code != code {
		h.t.Fatalf("%s: %s %v, want %s", method, e.Code, e.Data, code)
	}
	return e.Data
}

func str(t *testing.T, raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("not a string: %s", raw)
	}
	return s
}

func (h *harness) login(user, pw string) string {
	return str(h.t, h.ok("session.login_with_password", user, pw, "2.21", "test"))
}

func TestLoginLogoutAndSessionRecord(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "root", "wrong")
	h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "nobody", "x")
	var rec map[string]any
	json.Unmarshal(h.ok("session.get_record", s, s), &rec)
	if rec["is_local_superuser"] != true || rec["originator"] != "test" || !strings.HasPrefix(rec["this_host"].(string), "OpaqueRef:") {
		t.Errorf("session record %v", rec)
	}
	if str(t, h.ok("session.get_this_host", s, s)) != rec["this_host"] {
		t.Error("get_this_host")
	}
	h.ok("session.logout", s)
	if d := h.fails(xerr.SessionInvalid, "host.get_all", s); len(d) != 1 || d[0] != s {
		t.Errorf("SESSION_INVALID params %v", d)
	}
	h.fails(xerr.SessionInvalid, "host.get_all", "OpaqueRef:bogus")
}

func TestErrorsForBadCalls(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	if d := h.fails(xerr.MessageMethodUnknown, "VM.frobnicate", s); d[0] != "VM.frobnicate" {
		t.Error(d)
	}
	if d := h.fails(xerr.MessageParameterCountMismatch, "VM.get_record", s); d[0] != "VM.get_record" || d[1] != "2" || d[2] != "1" {
		t.Errorf("count mismatch params %v", d)
	}
	h.fails(xerr.FieldTypeError, "VM.get_by_uuid", s, map[string]any{"a": 1})
	if d := h.fails(xerr.HandleInvalid, "VM.get_record", s, "OpaqueRef:nope"); d[0] != "VM" || d[1] != "OpaqueRef:nope" {
		t.Error(d)
	}
	if d := h.fails(xerr.UUIDInvalid, "VM.get_by_uuid", s, "nope"); d[0] != "VM" || d[1] != "nope" {
		t.Error(d)
	}
	if d := h.fails(xerr.NotImplemented, "VM.start", s, "OpaqueRef:x", false, false); d[0] != "VM.start" {
		t.Error(d)
	}
	h.fails(xerr.MessageMethodUnknown, "Async.session.logout", s)
	h.fails(xerr.InvalidValue, "VM.get_all_records_where", s, `field "power_state" =`)
	// Class names are matched without regard to case.
	h.ok("vm.get_all", s)
}

func TestImplicitMessages(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	net := str(t, h.ok("network.create", s, map[string]any{"name_label": "n1", "name_description": "d", "MTU": "9000", "other_config": map[string]any{"a": "b"}}))
	var rec map[string]any
	json.Unmarshal(h.ok("network.get_record", s, net), &rec)
	if rec["name_label"] != "n1" || rec["MTU"] != float64(9000) || rec["other_config"].(map[string]any)["a"] != "b" {
		t.Errorf("created record %v", rec)
	}
	h.ok("network.set_name_label", s, net, "n2")
	if str(t, h.ok("network.get_name_label", s, net)) != "n2" {
		t.Error("set/get name_label")
	}
	h.ok("network.add_to_other_config", s, net, "k", "v")
	h.fails(xerr.MapDuplicateKey, "network.add_to_other_config", s, net, "k", "w")
	h.ok("network.remove_from_other_config", s, net, "missing")
	h.ok("network.add_tags", s, net, "t1")
	h.ok("network.add_tags", s, net, "t1")
	var tags []string
	json.Unmarshal(h.ok("network.get_tags", s, net), &tags)
	if len(tags) != 1 {
		t.Errorf("tags %v", tags)
	}
	var refs []string
	json.Unmarshal(h.ok("network.get_by_name_label", s, "n2"), &refs)
	if len(refs) != 1 || refs[0] != net {
		t.Errorf("by name %v", refs)
	}
	json.Unmarshal(h.ok("VM.get_all_where", s, `field "is_a_template" = "true" and field "name__label" = "Other install media"`), &refs)
	if len(refs) != 1 {
		t.Errorf("where: %v", refs)
	}
	h.ok("network.destroy", s, net)
	h.fails(xerr.HandleInvalid, "network.get_record", s, net)
	// The first-boot pool is whole.
	var pools map[string]map[string]any
	json.Unmarshal(h.ok("pool.get_all_records", s), &pools)
	for _, p := range pools {
		var host map[string]any
		json.Unmarshal(h.ok("host.get_record", s, p["master"]), &host)
		sv := host["software_version"].(map[string]any)
		if sv["xapi"] == nil || sv["product_version"] == nil || sv["platform_version"] == nil || host["API_version_major"] != float64(2) {
			t.Errorf("host %v", host)
		}
	}
}

func TestReadOnlySessionCannotWrite(t *testing.T) {
	h := newHarness(t)
	hash, _ := api.HashPassword("ro-pw", 1000)
	_, err := h.d.Update(func(tx *db.Tx) error {
		if _, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: "ro", OtherConfig: map[string]string{}, PasswordHash: hash}).Row()); err != nil {
			return err
		}
		role := tx.ByNameLabel(dm.Role.Class, "read-only")[0].Ref
		_, err := tx.Insert(dm.Subject.Class, "", (&dm.SubjectRecord{SubjectIdentifier: api.LocalSubjectID("ro"),
			OtherConfig: map[string]string{}, Roles: []dm.RoleRef{dm.RoleRef(role)}}).Row())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s := h.login("ro", "ro-pw")
	var vms []string
	json.Unmarshal(h.ok("VM.get_all", s), &vms)
	if d := h.fails(xerr.RBACPermissionDenied, "VM.set_name_label", s, vms[0], "x"); d[0] != "vm.set_name_label" {
		t.Errorf("RBAC params %v", d)
	}
	h.fails(xerr.RBACPermissionDenied, "network.create", s, map[string]any{"other_config": map[string]any{}})
	h.fails(xerr.RBACPermissionDenied, "Async.VM.destroy", s, vms[0])
	// A user without a subject cannot log in at all.
	h.d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: "lone", OtherConfig: map[string]string{}, PasswordHash: hash}).Row())
		return err
	})
	h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "lone", "ro-pw")
}

func TestChangePassword(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	h.fails(xerr.SessionAuthenticationFailed, "session.change_password", s, "wrong", "new")
	h.ok("session.change_password", s, rootPW, "new-pw")
	h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "root", rootPW)
	h.login("root", "new-pw")
}

func TestSessionLimits(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.MaxSessionsPerOriginator = 2 })
	a := h.login("root", rootPW)
	b := h.login("root", rootPW)
	c := h.login("root", rootPW)
	h.fails(xerr.SessionInvalid, "host.get_all", a)
	h.ok("host.get_all", b)
	h.ok("host.get_all", c)
	// The evicted session's record is gone too.
	if _, ok := h.d.Snapshot().Get(dm.Session.Class, a); ok {
		t.Error("evicted session still in the database")
	}
}

func TestLocalSocketIsSuperuser(t *testing.T) {
	h := newHarness(t)
	local := httptest.NewServer(api.LocalHandler(h.srv.Handler()))
	defer local.Close()
	body := `<?xml version="1.0"?><methodCall><methodName>session.login_with_password</methodName><params><param><value>anyone</value></param><param><value>no-password</value></param></params></methodCall>`
	resp, err := http.Post(local.URL+"/", "text/xml", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte("<value>Success</value>")) || resp.Header.Get("Content-Type") != "text/xml" {
		t.Errorf("local login: %s", b)
	}
	// The same request over TCP fails.
	resp, _ = http.Post(h.http.URL+"/", "text/xml", strings.NewReader(body))
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte("SESSION_AUTHENTICATION_FAILED")) {
		t.Errorf("remote login without password: %s", b)
	}
}

func taskRecord(h *harness, s, task string) map[string]any {
	var rec map[string]any
	json.Unmarshal(h.ok("task.get_record", s, task), &rec)
	return rec
}

func waitTask(t *testing.T, h *harness, s, task string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		rec := taskRecord(h, s, task)
		if st := rec["status"]; st != "pending" && st != "cancelling" {
			return rec
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("task did not finish")
	return nil
}

func TestAsyncTasks(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	task := str(t, h.ok("Async.network.create", s, map[string]any{"name_label": "async", "other_config": map[string]any{}}))
	rec := waitTask(t, h, s, task)
	if rec["status"] != "success" || !strings.HasPrefix(rec["result"].(string), "<value>OpaqueRef:") || rec["progress"] != 1.0 {
		t.Errorf("task %v", rec)
	}
	// A failing Async call records the error.
	task = str(t, h.ok("Async.network.destroy", s, "OpaqueRef:gone"))
	rec = waitTask(t, h, s, task)
	if rec["status"] != "failure" || fmt.Sprint(rec["error_info"]) != "[HANDLE_INVALID network OpaqueRef:gone]" {
		t.Errorf("failed task %v", rec)
	}
	h.ok("task.destroy", s, task)
	h.fails(xerr.HandleInvalid, "task.get_record", s, task)
}

func TestTaskCancelReachesTheWork(t *testing.T) {
	h := newHarness(t)
	started := make(chan struct{})
	var sawCancel sync.WaitGroup
	sawCancel.Add(1)
	api.Register(h.srv, func(c *api.Call, _ dm.VMStartArgs) (dm.Void, error) {
		close(started)
		<-c.Ctx.Done()
		sawCancel.Done()
		return dm.Void{}, c.Ctx.Err()
	})
	s := h.login("root", rootPW)
	task := str(t, h.ok("Async.VM.start", s, "OpaqueRef:any", false, false))
	<-started
	h.ok("task.cancel", s, task)
	sawCancel.Wait()
	rec := waitTask(t, h, s, task)
	if rec["status"] != "cancelled" || fmt.Sprint(rec["error_info"]) != "[TASK_CANCELLED "+task+"]" {
		t.Errorf("cancelled task %v", rec)
	}
	// Cancelling a finished task is harmless.
	h.ok("task.cancel", s, task)
}

func TestEventFromOverHTTP(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	type batch struct {
		Events []struct {
			ID, Class, Operation, Ref string
			Snapshot                  map[string]any
		}
		ValidRefCounts map[string]int `json:"valid_ref_counts"`
		Token          string
	}
	var b batch
	json.Unmarshal(h.ok("event.from", s, []string{"VM"}, "", 0.1), &b)
	if len(b.Events) < 5 || b.Events[0].Operation != "add" || b.Events[0].Class != "vm" || b.Events[0].Snapshot["uuid"] == nil {
		t.Fatalf("initial sync %+v", b.Events)
	}
	if b.ValidRefCounts["vm"] != len(b.Events) || b.ValidRefCounts["host"] != 1 {
		t.Errorf("valid_ref_counts %v", b.ValidRefCounts)
	}
	vm := b.Events[0].Ref
	done := make(chan batch)
	go func() {
		var nb batch
		json.Unmarshal(h.ok("event.from", s, []string{"vm"}, b.Token, 10.0), &nb)
		done <- nb
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	h.ok("VM.set_name_description", s, vm, "changed")
	nb := <-done
	if len(nb.Events) != 1 || nb.Events[0].Operation != "mod" || nb.Events[0].Snapshot["name_description"] != "changed" {
		t.Errorf("mod event %+v", nb.Events)
	}
	t.Logf("write to event over HTTP: %v", time.Since(start))
	h.fails(xerr.EventFromTokenParseFailure, "event.from", s, []string{"vm"}, "garbage", 0.1)
	// Logging out ends a waiting event.from with SESSION_INVALID.
	s2 := h.login("root", rootPW)
	errc := make(chan *rpcError)
	go func() { _, e := h.jsonCall("event.from", s2, []string{"vm"}, nb.Token, 30.0); errc <- e }()
	time.Sleep(50 * time.Millisecond)
	h.ok("session.logout", s2)
	select {
	case e := <-errc:
		if e == nil || e.Code != xerr.SessionInvalid {
			t.Errorf("waiting event.from after logout: %v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("event.from did not end at logout")
	}
	// inject gives a token that sees the injected mod.
	tok := str(t, h.ok("event.inject", s, "vm", vm))
	json.Unmarshal(h.ok("event.from", s, []string{"vm"}, tok, 1.0), &nb)
	if len(nb.Events) != 1 || nb.Events[0].Ref != vm {
		t.Errorf("after inject %+v", nb.Events)
	}
}

func TestWireFormats(t *testing.T) {
	h := newHarness(t)
	post := func(path, ct, body string) (*http.Response, string) {
		resp, err := http.Post(h.http.URL+path, ct, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	// system.listMethods is unwrapped, on every XML-RPC path.
	for _, p := range []string{"/", "/RPC2", "/xmlrpc"} {
		resp, b := post(p, "text/xml", `<?xml version="1.0"?><methodCall><methodName>system.listMethods</methodName><params></params></methodCall>`)
		if resp.Header.Get("Content-Type") != "text/xml" || !strings.Contains(b, "<value>VM.get_all_records</value>") || strings.Contains(b, "Status") {
			t.Errorf("%s listMethods: %.200s", p, b)
		}
	}
	// JSON-RPC 1.0 error shape.
	_, b := post("/jsonrpc", "application/json", `{"method":"session.login_with_password","params":["root","x"],"id":"abc"}`)
	if b != `{"result":null,"error":["SESSION_AUTHENTICATION_FAILED","root","Authentication failure"],"id":"abc"}` {
		t.Errorf("v1 failure: %s", b)
	}
	// int64 as a bare string in XML-RPC, valid_ref_counts as <i4>.
	s := h.login("root", rootPW)
	_, b = post("/", "text/xml", `<?xml version="1.0"?><methodCall><methodName>pool.get_all_records</methodName><params><param><value><string>`+s+`</string></value></param></params></methodCall>`)
	if !strings.Contains(b, "<member><name>ha_host_failures_to_tolerate</name><value>0</value></member>") || strings.Contains(b, "<i8>") || strings.Contains(b, "<string") {
		t.Errorf("int64 encoding: %.300s", b)
	}
	_, b = post("/", "text/xml", `<methodCall><methodName>event.from</methodName><params><param><value>`+s+`</value></param><param><value><array><data><value>pool</value></data></array></value></param><param><value></value></param><param><value><double>0</double></value></param></params></methodCall>`)
	if !strings.Contains(b, "<name>host</name><value><i4>1</i4></value>") {
		t.Errorf("valid_ref_counts encoding: %.300s", b)
	}
	// CORS preflight.
	req, _ := http.NewRequest(http.MethodOptions, h.http.URL+"/jsonrpc", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("OPTIONS: %v %v", resp, err)
	}
}

// TestFloodOfBadRequests sends malformed and oversized requests, then
// checks that the server still serves a login.
func TestFloodOfBadRequests(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.MaxBodyBytes = 1 << 20 })
	bad := []struct{ path, ct, body string }{
		{"/", "text/xml", "garbage"},
		{"/", "text/xml", "<methodCall><methodName>x</methodName><params><param><value><struct>"},
		{"/", "text/xml", strings.Repeat("<a>", 100000)},
		{"/", "text/xml", "<methodCall><methodName>VM.get_record</methodName><params><param><value><base64>!!!</base64></value></param></params></methodCall>"},
		{"/jsonrpc", "application/json", "{"},
		{"/jsonrpc", "application/json", `{"jsonrpc":"2.0","method":"host.get_all","params":[]}`},
		{"/jsonrpc", "application/json", `{"jsonrpc":"2.0","method":5,"params":[],"id":1}`},
		{"/jsonrpc", "text/plain", "\x00\x01\x02"},
		{"/RPC2", "text/xml", `<methodCall><methodName>session.login_with_password</methodName><params><param><value><array><data><value><struct><member><name>a</name><value><nil/></value></member></struct></value></data></array></value></param><param><value>x</value></param></params></methodCall>`},
	}
	var wg sync.WaitGroup
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func(b struct{ path, ct, body string }) {
			defer wg.Done()
			resp, err := http.Post(h.http.URL+b.path, b.ct, strings.NewReader(b.body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && !strings.Contains(b.body, "methodName") {
				t.Errorf("%q answered 200", b.body)
			}
		}(bad[i%len(bad)])
	}
	wg.Wait()
	// Oversized: 413, not a hang.
	resp, err := http.Post(h.http.URL+"/", "text/xml", io.LimitReader(zeros{}, 8<<20))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized body: %d", resp.StatusCode)
	}
	s := h.login("root", rootPW)
	h.ok("host.get_all", s)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

func TestHousekeeping(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.FinishedTaskTTL = 0 })
	s := h.login("root", rootPW)
	task := str(t, h.ok("Async.network.create", s, map[string]any{"other_config": map[string]any{}}))
	waitTask(t, h, s, task)
	api.Housekeep(h.srv, time.Now().Add(time.Second))
	h.fails(xerr.HandleInvalid, "task.get_record", s, task)
	api.Housekeep(h.srv, time.Now().Add(25*time.Hour))
	h.fails(xerr.SessionInvalid, "host.get_all", s)
	_ = context.Background
}

func TestNetworkAndVIFChecks(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	net := str(t, h.ok("network.create", s, map[string]any{"name_label": "n", "other_config": map[string]any{}}))
	if b := str(t, h.ok("network.get_bridge", s, net)); b != "xapi0" {
		t.Errorf("bridge %q", b)
	}
	var vms []string
	json.Unmarshal(h.ok("VM.get_all", s), &vms)
	vif := str(t, h.ok("VIF.create", s, map[string]any{"device": "0", "network": net, "VM": vms[0], "MTU": "1500",
		"other_config": map[string]any{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]any{}}))
	mac := str(t, h.ok("VIF.get_MAC", s, vif))
	var auto bool
	json.Unmarshal(h.ok("VIF.get_MAC_autogenerated", s, vif), &auto)
	if len(mac) != 17 || !auto {
		t.Errorf("generated MAC %q", mac)
	}
	h.fails("NETWORK_CONTAINS_VIF", "network.destroy", s, net)
	h.fails("MAC_INVALID", "VIF.create", s, map[string]any{"MAC": "nope", "device": "1", "network": net, "VM": vms[0]})
	h.ok("VIF.destroy", s, vif)
	h.ok("network.destroy", s, net)
}
