package xenops

import (
	"slices"
	"testing"

	dm "toolstackd/internal/datamodel"
)

func TestCheckOp(t *testing.T) {
	vm := func(power string, current map[string]string) vmCheck {
		return vmCheck{ref: "OpaqueRef:vm", power: power, current: current, acpi: true}
	}
	cases := []struct {
		name   string
		v      vmCheck
		op     op
		code   string
		params []string
	}{
		{"start halted", vm(psHalted, nil), dm.VMOperationsStart, "", nil},
		{"start running", vm(psRunning, nil), dm.VMOperationsStart, "VM_BAD_POWER_STATE", []string{"OpaqueRef:vm", "halted", "running"}},
		{"hard_shutdown halted", vm(psHalted, nil), dm.VMOperationsHardShutdown, "VM_BAD_POWER_STATE",
			[]string{"OpaqueRef:vm", "paused, suspended, running", "halted"}},
		{"pause during clean_shutdown", vm(psRunning, map[string]string{"OpaqueRef:t": "clean_shutdown"}), dm.VMOperationsPause,
			"OTHER_OPERATION_IN_PROGRESS", []string{"VM", "OpaqueRef:vm", "clean_shutdown", "OpaqueRef:t"}},
		{"hard_shutdown during clean_shutdown", vm(psRunning, map[string]string{"OpaqueRef:t": "clean_shutdown"}), dm.VMOperationsHardShutdown, "", nil},
		{"hard_shutdown during hard_shutdown", vm(psRunning, map[string]string{"OpaqueRef:t": "hard_shutdown"}), dm.VMOperationsHardShutdown,
			"OTHER_OPERATION_IN_PROGRESS", nil},
		{"hard_reboot during hard_shutdown", vm(psRunning, map[string]string{"OpaqueRef:t": "hard_shutdown"}), dm.VMOperationsHardReboot,
			"OTHER_OPERATION_IN_PROGRESS", nil},
		{"two clones", vm(psHalted, map[string]string{"OpaqueRef:t": "clone"}), dm.VMOperationsClone, "", nil},
		{"clone during start", vm(psHalted, map[string]string{"OpaqueRef:t": "start"}), dm.VMOperationsClone, "OTHER_OPERATION_IN_PROGRESS", nil},
		{"two ops in progress", vm(psHalted, map[string]string{"OpaqueRef:a": "clone", "OpaqueRef:b": "copy"}), dm.VMOperationsStart,
			"OTHER_OPERATION_IN_PROGRESS", []string{"VM", "OpaqueRef:vm", "{clone,copy}", "{OpaqueRef:a,OpaqueRef:b}"}},
	}
	for _, c := range cases {
		err := c.v.checkOp(c.op, false)
		switch {
		case c.code == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.code != "" && (err == nil || err.Code != c.code):
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		case c.params != nil && !slices.Equal(err.Params, c.params):
			t.Errorf("%s: params %v, want %v", c.name, err.Params, c.params)
		}
	}
	tpl := vm(psHalted, nil)
	tpl.template = true
	if err := tpl.checkOp(dm.VMOperationsStart, false); err == nil || err.Code != "VM_IS_TEMPLATE" || !slices.Equal(err.Params, []string{"OpaqueRef:vm", "start"}) {
		t.Errorf("template start: %v", err)
	}
	if err := tpl.checkOp(dm.VMOperationsClone, false); err != nil {
		t.Errorf("template clone: %v", err)
	}
	if err := tpl.checkOp(dm.VMOperationsDestroy, false); err != nil {
		t.Errorf("user template destroy: %v", err)
	}
	tpl.defaultTpl = true
	if err := tpl.checkOp(dm.VMOperationsDestroy, false); err == nil || err.Code != "VM_IS_TEMPLATE" {
		t.Errorf("default template destroy: %v", err)
	}
	noACPI := vm(psRunning, nil)
	noACPI.acpi = false
	if ops := allowedVMOps(noACPI); slices.Contains(ops, "clean_shutdown") || !slices.Contains(ops, "hard_shutdown") {
		t.Errorf("no ACPI: %v", ops)
	}
	if err := noACPI.checkOp(dm.VMOperationsCleanShutdown, false); err != nil {
		t.Errorf("a call is let through when only the advisory list refuses: %v", err)
	}
	blocked := vm(psHalted, nil)
	blocked.blocked = map[string]string{"start": "maintenance"}
	if err := blocked.checkOp(dm.VMOperationsStart, false); err == nil || err.Code != "OPERATION_BLOCKED" {
		t.Errorf("blocked: %v", err)
	}
}

func TestAllowedOps(t *testing.T) {
	halted := allowedVMOps(vmCheck{ref: "r", power: psHalted, acpi: true})
	for _, o := range []string{"start", "start_on", "clone", "copy", "destroy", "snapshot", "export", "changing_dynamic_range"} {
		if !slices.Contains(halted, o) {
			t.Errorf("halted lacks %s: %v", o, halted)
		}
	}
	for _, o := range []string{"pause", "hard_shutdown", "resume", "provision", "revert"} {
		if slices.Contains(halted, o) {
			t.Errorf("halted has %s", o)
		}
	}
	suspended := allowedVMOps(vmCheck{ref: "r", power: psSuspended, acpi: true})
	if !slices.Contains(suspended, "resume") || !slices.Contains(suspended, "hard_shutdown") || slices.Contains(suspended, "clone") {
		t.Errorf("suspended: %v", suspended)
	}
}

func TestDevCheck(t *testing.T) {
	d := devCheck{class: "VBD", ref: "OpaqueRef:vbd", vm: "OpaqueRef:vm", vmPower: psHalted, unpluggable: true}
	if err := d.checkOp("plug"); err == nil || err.Code != "VM_BAD_POWER_STATE" {
		t.Errorf("plug on halted: %v", err)
	}
	d.vmPower = psRunning
	if err := d.checkOp("unplug"); err == nil || err.Code != "DEVICE_ALREADY_DETACHED" {
		t.Errorf("unplug detached: %v", err)
	}
	d.attached = true
	if err := d.checkOp("plug"); err == nil || err.Code != "DEVICE_ALREADY_ATTACHED" {
		t.Errorf("plug attached: %v", err)
	}
	if err := d.checkOp("insert"); err == nil || err.Code != "VBD_NOT_REMOVABLE_MEDIA" {
		t.Errorf("insert on a disk: %v", err)
	}
	d.cd, d.empty = true, true
	if err := d.checkOp("eject"); err == nil || err.Code != "VBD_IS_EMPTY" {
		t.Errorf("eject empty: %v", err)
	}
	if got := d.allowed(); !slices.Equal(got, []string{"unplug", "unplug_force", "insert"}) {
		t.Errorf("allowed %v", got)
	}
}
