package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// addUser makes a local account whose subject holds one role, as
// subject.create would.
func addUser(t *testing.T, d *db.DB, name, pw, role string) {
	t.Helper()
	hash, err := api.HashPassword(pw, 1000)
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Update(func(tx *db.Tx) error {
		if _, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: name, OtherConfig: map[string]string{}, PasswordHash: hash}).Row()); err != nil {
			return err
		}
		roles := tx.ByNameLabel(dm.Role.Class, role)
		if len(roles) != 1 {
			return fmt.Errorf("role %q: %d rows", role, len(roles))
		}
		_, err := tx.Insert(dm.Subject.Class, "", (&dm.SubjectRecord{SubjectIdentifier: api.LocalSubjectID(name),
			OtherConfig: map[string]string{}, Roles: []dm.RoleRef{dm.RoleRef(roles[0].Ref)}}).Row())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// taskWriters are the task messages that change a task, with arguments
// after the task ref.
var taskWriters = []struct {
	method string
	args   []any
}{
	{"task.set_progress", []any{0.5}},
	{"task.set_status", []any{"success"}},
	{"task.set_result", []any{"<value>forged</value>"}},
	{"task.set_error_info", []any{[]string{"FORGED"}}},
	{"task.add_to_other_config", []any{"k", "v"}},
	{"task.remove_from_other_config", []any{"k"}},
	{"task.set_other_config", []any{map[string]string{"k": "v"}}},
	{"task.cancel", nil},
	{"task.destroy", nil},
}

// TestTaskOwnership: only a task's owner (a session of the same subject)
// and roles holding task.destroy/any (pool-operator and above) may change
// or end a task; read-only and vm-admin sessions are refused with xapi's
// RBAC_PERMISSION_DENIED and the task is left as it was.
func TestTaskOwnership(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	addUser(t, h.d, "ro", "ro-pw", "read-only")
	addUser(t, h.d, "va", "va-pw", "vm-admin")
	addUser(t, h.d, "po", "po-pw", "pool-operator")
	ro, va, po := h.login("ro", "ro-pw"), h.login("va", "va-pw"), h.login("po", "po-pw")

	rootTask := str(t, h.ok("task.create", root, "root's", "work"))
	h.ok("task.add_to_other_config", root, rootTask, "k", "root")
	want := []string{api.PermTaskAny, "No permission in user session. (Roles with this permission: pool-admin, pool-operator)"}
	for _, intruder := range []string{ro, va} {
		for _, w := range taskWriters {
			d := h.fails(xerr.RBACPermissionDenied, w.method, append([]any{intruder, rootTask}, w.args...)...)
			if strings.Join(d, "|") != strings.Join(want, "|") {
				t.Errorf("%s: params %q, want %q", w.method, d, want)
			}
		}
	}
	rec := taskRecord(h, root, rootTask)
	if rec["status"] != "pending" || rec["progress"] != 0.0 || rec["result"] != "" ||
		fmt.Sprint(rec["other_config"]) != "map[k:root]" || fmt.Sprint(rec["error_info"]) != "[]" {
		t.Errorf("root's task changed by others: %v", rec)
	}
	// A running Async call of root's cannot be cancelled by them either.
	async := str(t, h.ok("Async.network.create", root, map[string]any{"name_label": "a"}))
	h.fails(xerr.RBACPermissionDenied, "task.cancel", ro, async)
	h.fails(xerr.RBACPermissionDenied, "task.destroy", va, async)
	waitTask(t, h, root, async)

	// pool-operator holds task.destroy/any.
	for _, w := range taskWriters {
		task := str(t, h.ok("task.create", root, "root's", ""))
		h.ok(w.method, append([]any{po, task}, w.args...)...)
	}

	// The owner may do everything, from any of its sessions.
	ro2 := h.login("ro", "ro-pw")
	for _, w := range taskWriters {
		own := str(t, h.ok("task.create", ro, "mine", ""))
		h.ok(w.method, append([]any{ro2, own}, w.args...)...)
	}
	own := str(t, h.ok("task.create", ro, "mine", ""))
	h.ok("task.set_progress", ro, own, 0.25)
	if taskRecord(h, ro, own)["progress"] != 0.25 {
		t.Error("owner's set_progress lost")
	}
	// Another subject's session is not the owner, whatever its role below
	// pool-operator; root (the local superuser) may act on anyone's task.
	h.fails(xerr.RBACPermissionDenied, "task.set_progress", va, own, 0.5)
	h.ok("task.destroy", root, own)
	h.fails(xerr.HandleInvalid, "task.get_record", root, own)
}

// TestPendingTaskCap: a session over its cap of tasks not yet completed
// gets TOO_MANY_PENDING_TASKS from task.create and from Async calls;
// completing or destroying a task makes room again, and other sessions
// are not affected.
func TestPendingTaskCap(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.MaxPendingTasksPerSession = 3 })
	s := h.login("root", rootPW)
	var tasks []string
	for range 3 {
		tasks = append(tasks, str(t, h.ok("task.create", s, "t", "")))
	}
	if d := h.fails(xerr.TooManyPendingTasks, "task.create", s, "t", ""); len(d) != 0 {
		t.Errorf("params %v", d)
	}
	h.fails(xerr.TooManyPendingTasks, "Async.network.create", s, map[string]any{"name_label": "n"})
	// Cancelling is not completing.
	h.ok("task.cancel", s, tasks[0])
	h.fails(xerr.TooManyPendingTasks, "task.create", s, "t", "")
	// Another session has its own count.
	other := h.login("root", rootPW)
	h.ok("task.create", other, "t", "")
	// Completing one makes room; taking it back to pending needs room.
	h.ok("task.set_status", s, tasks[1], "success")
	fourth := str(t, h.ok("task.create", s, "t", ""))
	h.fails(xerr.TooManyPendingTasks, "task.set_status", s, tasks[1], "pending")
	h.ok("task.destroy", s, fourth)
	h.ok("task.set_status", s, tasks[1], "pending")
	h.ok("task.destroy", s, tasks[2])
	// An Async call holds its place until it ends.
	a := str(t, h.ok("Async.network.create", s, map[string]any{"name_label": "n"}))
	waitTask(t, h, s, a)
	h.ok("task.create", s, "t", "")
}

// TestSessionEndDestroysTasks: when a session ends its tasks go, running
// ones cancelled first.
func TestSessionEndDestroysTasks(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	addUser(t, h.d, "ro", "ro-pw", "read-only")
	ro := h.login("ro", "ro-pw")
	pending := str(t, h.ok("task.create", ro, "p", ""))
	done := str(t, h.ok("task.create", ro, "d", ""))
	h.ok("task.set_status", ro, done, "success")
	keep := str(t, h.ok("task.create", root, "root's", ""))
	h.ok("session.logout", ro)
	for _, task := range []string{pending, done} {
		h.fails(xerr.HandleInvalid, "task.get_record", root, task)
	}
	h.ok("task.get_record", root, keep)
}

// TestSessionEndCancelsRunningTasks drives the hook directly: a running
// Async call of an ended session is cancelled and its task destroyed.
func TestSessionEndCancelsRunningTasks(t *testing.T) {
	h := newHarness(t)
	started, stopped := make(chan struct{}), make(chan struct{})
	api.Register(h.srv, func(c *api.Call, _ dm.VMStartArgs) (dm.Void, error) {
		close(started)
		<-c.Ctx.Done()
		close(stopped)
		return dm.Void{}, c.Ctx.Err()
	})
	s := h.login("root", rootPW)
	watcher := h.login("root", rootPW)
	task := str(t, h.ok("Async.VM.start", s, "OpaqueRef:any", false, false))
	<-started
	api.EndSessionTasks(h.srv, s)
	<-stopped
	h.fails(xerr.HandleInvalid, "task.get_record", watcher, task)
	var all []string
	json.Unmarshal(h.ok("task.get_all", watcher), &all)
	if len(all) != 0 {
		t.Errorf("tasks left: %v", all)
	}
}

// TestCheckTaskOwner: the rule is available to HTTP handlers that are
// given a task ref.
func TestCheckTaskOwner(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	addUser(t, h.d, "ro", "ro-pw", "read-only")
	ro := h.login("ro", "ro-pw")
	task := str(t, h.ok("task.create", root, "root's", ""))
	if err := h.srv.CheckTaskOwner(h.srv.SessionFor(ro), task); !xerr.HasCode(err, xerr.RBACPermissionDenied) {
		t.Errorf("read-only on root's task: %v", err)
	}
	if err := h.srv.CheckTaskOwner(h.srv.SessionFor(root), task); err != nil {
		t.Errorf("owner: %v", err)
	}
	if err := h.srv.CheckTaskOwner(h.srv.SessionFor(ro), "OpaqueRef:none"); !xerr.HasCode(err, xerr.HandleInvalid) {
		t.Errorf("no task: %v", err)
	}
}
