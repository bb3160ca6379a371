package api

import (
	"context"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Each stage of the call pipeline on its own, on a real server over a
// real (in-memory) database.

const stagePW = "stage-pw"

func stageServer(t *testing.T) (*Server, *Session) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	hash, err := HashPassword(stagePW, cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	host, err := FirstBoot(d, ProbeHost(), BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	s := New(d, cfg, nil)
	t.Cleanup(s.Close)
	ref, _, err := s.Invoke(context.Background(), "", "session.login_with_password", "root", stagePW, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	return s, s.SessionFor(ref.(string))
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !xerr.HasCode(err, code) {
		t.Fatalf("got %v, want %s", err, code)
	}
}

func TestStageLookup(t *testing.T) {
	s, _ := stageServer(t)
	for _, c := range []struct {
		method, wire string
		async        bool
		code         string
	}{
		{"VM.start", "VM.start", false, ""},
		{"Async.VM.start", "VM.start", true, ""},
		{"vm.get_record", "VM.get_record", false, ""}, // classes without regard to case
		{"VM.no_such", "", false, xerr.MessageMethodUnknown},
		{"Async.session.login_with_password", "", false, xerr.MessageMethodUnknown}, // no Async form
		// "_" for ".", as xapi answers too (the SDK's samples).
		{"event_from", "event.from", false, ""},
		{"session_get_this_host", "session.get_this_host", false, ""},
		{"VM_get_all", "VM.get_all", false, ""},
		{"VM_guest_metrics_get_all", "VM_guest_metrics.get_all", false, ""},
		{"Async.VM_start", "VM.start", true, ""},
		{"VM_no_such", "", false, xerr.MessageMethodUnknown},
		{"_", "", false, xerr.MessageMethodUnknown},
	} {
		r := &request{method: c.method}
		err := s.lookup(r)
		if c.code != "" {
			wantCode(t, err, c.code)
			continue
		}
		if err != nil || r.msg.Wire != c.wire || r.async != c.async || r.first != 1 {
			t.Errorf("%s: %v %+v", c.method, err, r)
		}
	}
}

func TestStageDecode(t *testing.T) {
	s, sess := stageServer(t)
	r := &request{method: "VM.set_name_label"}
	wantCode(t, s.decodeWire(r, []any{sess.Ref, "OpaqueRef:x"}), xerr.MessageParameterCountMismatch)
	r = &request{method: "VM.set_name_label"}
	if err := s.decodeWire(r, []any{sess.Ref, "OpaqueRef:x", "web"}); err != nil || r.sessRef != sess.Ref {
		t.Fatalf("%v %q", err, r.sessRef)
	}
	// Internal calls: canonical arguments without the session, at most
	// as many as the message has.
	r = &request{method: "VM.set_name_label"}
	wantCode(t, s.decodeInternal(r, []any{"a", "b", "c"}), xerr.MessageParameterCountMismatch)
	r = &request{method: "VM.set_name_label"}
	if err := s.decodeInternal(r, []any{"OpaqueRef:x"}); err != nil || len(r.args) != 2 || r.args[1] != nil {
		t.Fatalf("%v %v", err, r.args)
	}
}

func TestStageAuthenticate(t *testing.T) {
	s, sess := stageServer(t)
	r := &request{method: "VM.get_all"}
	if err := s.lookup(r); err != nil {
		t.Fatal(err)
	}
	r.sessRef = "OpaqueRef:gone"
	wantCode(t, s.authenticate(r), xerr.SessionInvalid)
	r.sessRef = sess.Ref
	if err := s.authenticate(r); err != nil || r.sess != sess {
		t.Fatal(err)
	}
	// A message without a session (login) needs none.
	r = &request{method: "session.login_with_password"}
	if err := s.lookup(r); err != nil {
		t.Fatal(err)
	}
	if err := s.authenticate(r); err != nil || r.sess != nil {
		t.Fatal(err)
	}
}

func TestStageAuthorize(t *testing.T) {
	s, _ := stageServer(t)
	ro := &Session{Ref: "OpaqueRef:ro", Roles: schema.RoleSet(0).With(schema.RoleReadOnly)}
	r := &request{method: "VM.start", sess: ro}
	if err := s.lookup(r); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.authorize(r), xerr.RBACPermissionDenied)
	r = &request{method: "VM.get_all", sess: ro}
	if err := s.lookup(r); err != nil {
		t.Fatal(err)
	}
	if err := s.authorize(r); err != nil {
		t.Fatal(err)
	}
}

func TestStageArguments(t *testing.T) {
	s, sess := stageServer(t)
	r := &request{method: "VM.start"}
	if err := s.decodeWire(r, []any{sess.Ref, "OpaqueRef:x", "yes please", false}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.convertArgs(r, []any{sess.Ref, "OpaqueRef:x", "yes please", false}), xerr.FieldTypeError)
	// Spellings real clients send are accepted and made canonical.
	if err := s.convertArgs(r, []any{sess.Ref, "OpaqueRef:x", "true", int64(0)}); err != nil || r.args[1] != true || r.args[2] != false {
		t.Fatalf("%v %v", err, r.args)
	}
	r = &request{method: "VM.set_name_label"}
	if err := s.decodeInternal(r, []any{"OpaqueRef:x", strings.Repeat("n", 2000)}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.limitArgs(r), xerr.InvalidValue)
}

func TestStageBind(t *testing.T) {
	s, _ := stageServer(t)
	for _, c := range []struct {
		method string
		code   string
	}{
		{"VM.set_name_label", ""},               // implicit
		{"VM.add_to_other_config", ""},          // explicit, shaped as an accessor
		{"session.logout", ""},                  // registered
		{"VM.call_plugin", xerr.NotImplemented}, // explicit, no handler
	} {
		r := &request{method: c.method}
		if err := s.lookup(r); err != nil {
			t.Fatal(err)
		}
		err := s.bind(r)
		if c.code != "" {
			wantCode(t, err, c.code)
		} else if err != nil || r.handler == nil {
			t.Errorf("%s: %v", c.method, err)
		}
	}
}

func TestStageRoute(t *testing.T) {
	s, _ := stageServer(t)
	r := &request{method: "VM.start"}
	if err := s.decodeInternal(r, []any{"OpaqueRef:vm", false, false}); err != nil {
		t.Fatal(err)
	}
	if err := s.route(r); err != nil {
		t.Fatal(err)
	}
	if r.target.Host() != s.Cfg.HostRef {
		t.Errorf("one host: ran on %s, not here", r.target.Host())
	}
	var hostMark bool
	for _, m := range r.target.Marks {
		if m.Class == dm.Host.Class && m.Ref == s.Cfg.HostRef && m.Op == "vm_start" {
			hostMark = true
		}
	}
	if !hostMark {
		t.Errorf("VM.start does not mark its host: %+v", r.target.Marks)
	}
}

func hostOps(s *Server) map[string]string {
	row, _ := s.DB.Snapshot().Get(dm.Host.Class, s.Cfg.HostRef)
	m, _ := row.Get(dm.Host.CurrentOperations).(map[string]string)
	return m
}

func TestStageAdmit(t *testing.T) {
	s, _ := stageServer(t)
	host := s.Cfg.HostRef
	call := func() *Call { return &Call{Ctx: context.Background(), Server: s, Msg: s.Model.Message("host.reboot")} }
	mark := func(op string) []forwarding.Mark {
		return []forwarding.Mark{{Class: dm.Host.Class, Ref: host, Op: op}}
	}
	// Two VM starts on one host run side by side...
	rel1, err := s.admit(call(), mark("vm_start"))
	if err != nil {
		t.Fatal(err)
	}
	rel2, err := s.admit(call(), mark("vm_start"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(hostOps(s)); n != 2 {
		t.Fatalf("%d marks, want 2", n)
	}
	// ...a reboot waits for neither: it is refused while they run.
	_, err = s.admit(call(), mark("reboot"))
	wantCode(t, err, xerr.OtherOperationInProgress)
	rel1()
	rel2()
	if n := len(hostOps(s)); n != 0 {
		t.Fatalf("%d marks left", n)
	}
	// A reboot runs alone.
	rel, err := s.admit(call(), mark("reboot"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.admit(call(), mark("vm_start"))
	wantCode(t, err, xerr.OtherOperationInProgress)
	rel()
	// Classes whose module takes its own marks are left alone.
	rel, err = s.admit(call(), []forwarding.Mark{{Class: dm.VM.Class, Ref: "OpaqueRef:vm", Op: "start"}})
	if err != nil {
		t.Fatal(err)
	}
	rel()
}

// An Async call holds its marks, keyed by its task, while it runs, and
// drops them when it ends.
func TestStageRunAsyncHoldsMarks(t *testing.T) {
	s, sess := stageServer(t)
	started, release := make(chan string), make(chan struct{})
	Register(s, func(c *Call, a dm.HostRebootArgs) (dm.Void, error) {
		started <- c.Task
		<-release
		return dm.Void{}, nil
	})
	v, _, err := s.Invoke(context.Background(), sess.Ref, "Async.host.reboot", s.Cfg.HostRef)
	if err != nil {
		t.Fatal(err)
	}
	task := v.(string)
	if got := <-started; got != task {
		t.Fatalf("ran as task %q, want %q", got, task)
	}
	if ops := hostOps(s); ops[task] != "reboot" {
		t.Errorf("host marks while running: %v", ops)
	}
	// A second reboot meanwhile is refused with the first's task named.
	_, _, err = s.Invoke(context.Background(), sess.Ref, "host.reboot", s.Cfg.HostRef)
	wantCode(t, err, xerr.OtherOperationInProgress)
	if e := xerr.From(err); e.Params[3] != task {
		t.Errorf("refusal names %v", e.Params)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for len(hostOps(s)) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ops := hostOps(s); len(ops) != 0 {
		t.Errorf("marks left after the call: %v", ops)
	}
}

// A typed handler gets its arguments as the generated struct, and a
// typed internal call goes through the whole pipeline as the caller.
func TestTypedRegisterAndCall(t *testing.T) {
	s, sess := stageServer(t)
	var got dm.VMCloneArgs
	Register(s, func(c *Call, a dm.VMCloneArgs) (dm.VMRef, error) {
		got = a
		return "OpaqueRef:new", nil
	})
	ref, err := (&dm.VMCloneArgs{VM: "OpaqueRef:vm", NewName: "copy"}).Call(context.Background(), s.As(sess))
	if err != nil || ref != "OpaqueRef:new" || got.VM != "OpaqueRef:vm" || got.NewName != "copy" {
		t.Fatalf("%v %q %+v", err, ref, got)
	}
	// The caller's roles apply to internal calls too.
	ro := &Session{Ref: "OpaqueRef:ro", Roles: schema.RoleSet(0).With(schema.RoleReadOnly)}
	ro.ctx, ro.cancel = context.WithCancel(context.Background())
	s.sessions.mu.Lock()
	s.sessions.byRef[ro.Ref] = ro
	s.sessions.mu.Unlock()
	_, err = (&dm.VMCloneArgs{VM: "OpaqueRef:vm", NewName: "copy"}).Call(context.Background(), s.As(ro))
	wantCode(t, err, xerr.RBACPermissionDenied)
	// Limits apply as on the wire.
	_, err = (&dm.VMCloneArgs{VM: "OpaqueRef:vm", NewName: strings.Repeat("x", 5000)}).Call(context.Background(), s.As(sess))
	wantCode(t, err, xerr.InvalidValue)
}

// Task progress is coalesced: a burst of updates costs a few writes and
// the last value is the one recorded.
func TestTaskProgressCoalesced(t *testing.T) {
	s, sess := stageServer(t)
	task, err := s.StartTask(context.Background(), sess, "burst", "")
	if err != nil {
		t.Fatal(err)
	}
	before, start := s.DB.Generation(), time.Now()
	for i := 1; i <= 1000; i++ {
		task.Progress(float64(i) / 1000)
	}
	task.Finish(schema.Void, nil, nil)
	// About one write per interval, plus a few around the start and the
	// end (the first value, the newest at Finish, the outcome), however
	// slow a loaded machine makes the loop: never one per update.
	bound := uint64(8 + 2*(time.Since(start)/progressInterval))
	row, _ := s.DB.Snapshot().Get(dm.Task.Class, task.Ref)
	if row.String(dm.Task.Status) != "success" || row.Get(dm.Task.Progress).(float64) != 1 {
		t.Fatalf("task %v", row)
	}
	if writes := s.DB.Generation() - before; writes > bound {
		t.Errorf("%d writes for 1000 progress updates", writes)
	}
	// The newest value is written even when the task ends before the
	// interval has passed.
	task, err = s.StartTask(context.Background(), sess, "fails", "")
	if err != nil {
		t.Fatal(err)
	}
	task.Progress(0.1)
	task.Progress(0.42)
	task.Finish(schema.Void, nil, xerr.New(xerr.InternalError, "no"))
	row, _ = s.DB.Snapshot().Get(dm.Task.Class, task.Ref)
	if row.String(dm.Task.Status) != "failure" || row.Get(dm.Task.Progress).(float64) != 0.42 {
		t.Fatalf("failed task %v", row)
	}
}

// task.cancel reaches work on an adopted task through its context, and
// the outcome is cancelled; the caller going away is not a cancellation.
func TestAdoptedTaskCancel(t *testing.T) {
	s, sess := stageServer(t)
	ref, err := s.CreateTask(sess, "client task", "")
	if err != nil {
		t.Fatal(err)
	}
	task, err := s.AdoptTask(context.Background(), sess, ref)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AdoptTask(context.Background(), sess, ref); !xerr.HasCode(err, xerr.OperationNotAllowed) {
		t.Errorf("adopted twice: %v", err)
	}
	if _, _, err := s.Invoke(context.Background(), sess.Ref, "task.cancel", ref); err != nil {
		t.Fatal(err)
	}
	select {
	case <-task.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("task.cancel did not reach the work")
	}
	task.Finish(schema.Void, nil, task.Context().Err())
	row, _ := s.DB.Snapshot().Get(dm.Task.Class, ref)
	if row.String(dm.Task.Status) != "cancelled" {
		t.Errorf("status %s", row.String(dm.Task.Status))
	}

	ctx, stop := context.WithCancel(context.Background())
	task, err = s.StartTask(ctx, sess, "caller leaves", "")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	<-task.Context().Done()
	task.Finish(schema.Void, nil, xerr.New(xerr.InternalError, "client went away"))
	row, _ = s.DB.Snapshot().Get(dm.Task.Class, task.Ref)
	if row.String(dm.Task.Status) != "failure" {
		t.Errorf("status %s", row.String(dm.Task.Status))
	}
}

// An explicit message can only be bound with its typed arguments.
func TestHandleRefusesExplicitMessages(t *testing.T) {
	s, _ := stageServer(t)
	defer func() {
		if recover() == nil {
			t.Error("Handle bound VM.start by name")
		}
	}()
	s.Handle("VM.start", func(c *Call) (any, error) { return nil, nil })
}
