package suite

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// SharedVM makes a VM with a 4 MiB disk on sr; oc goes into its
// other_config.
func SharedVM(r RPC, sr, name string, oc map[string]string) string {
	r.T.Helper()
	rec := testdaemon.VMRecord(name)
	if oc != nil {
		rec["other_config"] = oc
	}
	vm := r.Str("VM.create", rec)
	vdi := r.Str("VDI.create", map[string]any{"name_label": name, "name_description": "", "SR": sr,
		"virtual_size": 4 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	return vm
}

// WantRefusal fails the test unless err is the XenAPI error code with
// params (nil params: not checked).
func WantRefusal(t *testing.T, what string, err error, code string, params ...string) {
	t.Helper()
	var e *testdaemon.Error
	if pooltest.Code(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	if params != nil && AsXenError(err, &e) && !slices.Equal(e.Params, params) {
		t.Fatalf("%s: %s %v, want %v", what, code, e.Params, params)
	}
}

// AsXenError is errors.As for a XenAPI error.
func AsXenError(err error, e **testdaemon.Error) bool {
	x, ok := err.(*testdaemon.Error) //nolint:errorlint // the client returns it bare
	if ok {
		*e = x
	}
	return ok
}

// VMState is where the database says a VM is.
type VMState struct {
	Power, On string
	Domid     int64
	Ops       map[string]string
}

// VMWhere is where a VM is and what it is doing.
func VMWhere(r RPC, vm string) VMState {
	r.T.Helper()
	var rec struct {
		PowerState string            `json:"power_state"`
		ResidentOn string            `json:"resident_on"`
		Domid      int64             `json:"domid"`
		CurOps     map[string]string `json:"current_operations"`
	}
	if err := json.Unmarshal(r.Call("VM.get_record", vm), &rec); err != nil {
		r.T.Fatal(err)
	}
	return VMState{rec.PowerState, rec.ResidentOn, rec.Domid, rec.CurOps}
}

// WaitUntil polls cond until it holds, failing the test after bound.
func WaitUntil(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitTask waits for a task to end and returns its status and error. The
// tasks the pool tests wait for are migrations and evacuations that take
// seconds on a quiet machine, a simulator delay included; the bound is for
// a busy one.
func WaitTask(t *testing.T, r RPC, task string) (string, []string) {
	t.Helper()
	var st string
	WaitUntil(t, 3*time.Minute, "the task to end", func() bool {
		st = r.Str("task.get_status", task)
		return st != "pending" && st != "cancelling"
	})
	var info []string
	_ = json.Unmarshal(r.Call("task.get_error_info", task), &info)
	return st, info
}
