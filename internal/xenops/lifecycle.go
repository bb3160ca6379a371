package xenops

import (
	"slices"
	"sort"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Which VM operations may run, in which power states and next to which
// others: xapi's rules (xapi_vm_lifecycle.ml), so that allowed_operations
// and the errors clients get match what they know.

type op = dm.VMOperations

const (
	psHalted    = string(dm.VMPowerStateHalted)
	psPaused    = string(dm.VMPowerStatePaused)
	psRunning   = string(dm.VMPowerStateRunning)
	psSuspended = string(dm.VMPowerStateSuspended)
)

var allPowerStates = []string{psHalted, psPaused, psSuspended, psRunning}

// allowedPowerStates is where an operation may start.
func allowedPowerStates(o op, isSnapshot bool) []string {
	switch o {
	case dm.VMOperationsImport:
		return nil
	case dm.VMOperationsChangingVCPUs, dm.VMOperationsChangingStaticRange, dm.VMOperationsChangingMemoryLimits,
		dm.VMOperationsChangingShadowMemory, dm.VMOperationsMakeIntoTemplate, dm.VMOperationsProvision,
		dm.VMOperationsStart, dm.VMOperationsStartOn:
		return []string{psHalted}
	case dm.VMOperationsUnpause:
		return []string{psPaused}
	case dm.VMOperationsCsvm, dm.VMOperationsResume, dm.VMOperationsResumeOn:
		return []string{psSuspended}
	case dm.VMOperationsAwaitingMemoryLive, dm.VMOperationsCallPlugin, dm.VMOperationsCleanReboot,
		dm.VMOperationsCleanShutdown, dm.VMOperationsChangingMemoryLive, dm.VMOperationsChangingShadowMemoryLive,
		dm.VMOperationsChangingVCPUsLive, dm.VMOperationsDataSourceOp, dm.VMOperationsPause,
		dm.VMOperationsPoolMigrate, dm.VMOperationsSendSysrq, dm.VMOperationsSendTrigger,
		dm.VMOperationsSnapshotWithQuiesce, dm.VMOperationsSuspend:
		return []string{psRunning}
	case dm.VMOperationsChangingDynamicRange:
		return []string{psHalted, psRunning}
	case dm.VMOperationsClone, dm.VMOperationsCopy:
		if isSnapshot {
			return []string{psHalted, psSuspended}
		}
		return []string{psHalted}
	case dm.VMOperationsCreateTemplate, dm.VMOperationsDestroy, dm.VMOperationsExport:
		return []string{psHalted, psSuspended}
	case dm.VMOperationsHardReboot:
		return []string{psPaused, psRunning}
	case dm.VMOperationsCheckpoint, dm.VMOperationsGetBootRecord, dm.VMOperationsShutdown, dm.VMOperationsHardShutdown:
		return []string{psPaused, psSuspended, psRunning}
	case dm.VMOperationsMigrateSend:
		return []string{psHalted, psSuspended, psRunning}
	}
	return allPowerStates
}

// allowedConcurrently says whether o may start while current runs.
func allowedConcurrently(o op, current []op) bool {
	within := func(set ...op) bool {
		if !slices.Contains(set, o) {
			return false
		}
		for _, c := range current {
			if !slices.Contains(set, c) {
				return false
			}
		}
		return true
	}
	if within(dm.VMOperationsClone, dm.VMOperationsCopy, dm.VMOperationsExport) ||
		within(dm.VMOperationsSnapshot, dm.VMOperationsCheckpoint) ||
		within(dm.VMOperationsGetBootRecord) {
		return true
	}
	switch o {
	case dm.VMOperationsHardShutdown:
		return !slices.Contains(current, o)
	case dm.VMOperationsHardReboot:
		return !slices.Contains(current, dm.VMOperationsHardShutdown) && !slices.Contains(current, dm.VMOperationsHardReboot)
	}
	if len(current) == 1 {
		switch [2]op{current[0], o} {
		case [2]op{dm.VMOperationsSnapshotWithQuiesce, dm.VMOperationsSnapshot},
			[2]op{dm.VMOperationsMigrateSend, dm.VMOperationsMetadataExport},
			[2]op{dm.VMOperationsMigrateSend, dm.VMOperationsCleanShutdown},
			[2]op{dm.VMOperationsMigrateSend, dm.VMOperationsCleanReboot},
			[2]op{dm.VMOperationsMigrateSend, dm.VMOperationsStart},
			[2]op{dm.VMOperationsMigrateSend, dm.VMOperationsStartOn}:
			return true
		}
	}
	return false
}

// powerName is a power state as xapi writes it in errors: lower case.
func powerName(ps string) string { return strings.ToLower(ps) }

// vmCheck is what the rules need to know about a VM.
type vmCheck struct {
	ref        string
	power      string
	current    map[string]string // task -> op
	template   bool
	snapshot   bool
	control    bool
	dom0       bool
	defaultTpl bool
	blocked    map[string]string
	acpi       bool
}

// vmOpsInputs are the VM fields vmStale reads (vmCheckOf's among them):
// a change to any other field of a VM cannot leave its allowed_operations,
// or its devices', stale, and watchDB passes over it. (Most writes are
// of such fields: names, descriptions, other_config's keys of clients.)
// TestVMOpsInputsComplete checks the list against the code.
var vmOpsInputs = []*schema.Field{
	dm.VM.OtherConfig, dm.VM.Platform, dm.VM.CurrentOperations, dm.VM.BlockedOperations,
	dm.VM.PowerState, dm.VM.IsATemplate, dm.VM.IsASnapshot, dm.VM.IsControlDomain,
	dm.VM.IsDefaultTemplate, dm.VM.Domid, dm.VM.VBDs, dm.VM.VIFs,
}

// vmOpsInputChanged says whether a change to a VM may touch one of
// vmOpsInputs: a new row, a write of one of them, or a whole row (as a
// pool's members apply them) that differs in one.
func vmOpsInputChanged(ch *db.Change) bool {
	if ch.Old == nil || ch.Row == nil {
		return true
	}
	if ch.Field != nil {
		return slices.Contains(vmOpsInputs, ch.Field)
	}
	for _, f := range vmOpsInputs {
		if !schema.Equal(ch.Old.Get(f), ch.Row.Get(f)) {
			return true
		}
	}
	return false
}

func vmCheckOf(r db.Reader, row *db.Row) vmCheck {
	oc, _ := row.Get(dm.VM.OtherConfig).(map[string]string)
	plat, _ := row.Get(dm.VM.Platform).(map[string]string)
	cur, _ := row.Get(dm.VM.CurrentOperations).(map[string]string)
	blocked, _ := row.Get(dm.VM.BlockedOperations).(map[string]string)
	c := vmCheck{
		ref: row.Ref, power: row.String(dm.VM.PowerState), current: cur,
		template:   row.Get(dm.VM.IsATemplate) == true,
		snapshot:   row.Get(dm.VM.IsASnapshot) == true,
		control:    row.Get(dm.VM.IsControlDomain) == true,
		defaultTpl: row.Get(dm.VM.IsDefaultTemplate) == true || oc["default_template"] == "true",
		blocked:    blocked,
		acpi:       backend.PlatformTrue(plat, "acpi", true),
	}
	if c.control && row.Get(dm.VM.Domid) == int64(0) {
		c.dom0 = true
	}
	return c
}

// currentOps lists the operations in progress, sorted by task.
func (v *vmCheck) currentOps() (tasks []string, ops []op) {
	for t := range v.current {
		tasks = append(tasks, t)
	}
	sort.Strings(tasks)
	for _, t := range tasks {
		ops = append(ops, op(v.current[t]))
	}
	return tasks, ops
}

// otherOperationInProgress is OTHER_OPERATION_IN_PROGRESS for a class:
// [class, ref, operation(s), task(s)], several written {a,b}.
func otherOperationInProgress(class, ref string, tasks []string, ops []string) *xerr.Error {
	join := func(xs []string) string {
		if len(xs) == 1 {
			return xs[0]
		}
		return "{" + strings.Join(xs, ",") + "}"
	}
	return xerr.New(xerr.OtherOperationInProgress, class, ref, join(ops), join(tasks))
}

// checkOp returns the error that stops operation o, or nil. strict is
// for allowed_operations, which asks more of the guest than a call does.
func (v *vmCheck) checkOp(o op, strict bool) *xerr.Error {
	if why, ok := v.blocked[string(o)]; ok {
		return xerr.New(xerr.OperationBlocked, v.ref, why)
	}
	if allowed := allowedPowerStates(o, v.snapshot); !slices.Contains(allowed, v.power) {
		names := make([]string, len(allowed))
		for i, p := range allowed {
			names[i] = powerName(p)
		}
		return xerr.New(xerr.VMBadPowerState, v.ref, strings.Join(names, ", "), powerName(v.power))
	}
	if len(v.current) > 0 {
		tasks, ops := v.currentOps()
		if !allowedConcurrently(o, ops) {
			names := make([]string, len(ops))
			for i, x := range ops {
				names[i] = string(x)
			}
			return otherOperationInProgress("VM", v.ref, tasks, names)
		}
	}
	if v.template && !v.snapshot {
		switch o {
		case dm.VMOperationsChangingDynamicRange, dm.VMOperationsChangingStaticRange, dm.VMOperationsChangingMemoryLimits,
			dm.VMOperationsChangingShadowMemory, dm.VMOperationsChangingVCPUs, dm.VMOperationsClone, dm.VMOperationsCopy,
			dm.VMOperationsExport, dm.VMOperationsMetadataExport, dm.VMOperationsProvision:
		case dm.VMOperationsDestroy, dm.VMOperationsMigrateSend:
			if v.defaultTpl {
				return xerr.New(xerr.VMIsTemplate, v.ref, string(o))
			}
		default:
			return xerr.New(xerr.VMIsTemplate, v.ref, string(o))
		}
	}
	if v.snapshot {
		switch o {
		case dm.VMOperationsRevert, dm.VMOperationsClone, dm.VMOperationsCopy, dm.VMOperationsExport,
			dm.VMOperationsDestroy, dm.VMOperationsHardShutdown, dm.VMOperationsMetadataExport:
		default:
			return xerr.New(xerr.VMIsSnapshot, v.ref, string(o))
		}
	}
	if o == dm.VMOperationsProvision && !v.template {
		return xerr.New(xerr.ProvisionOnlyAllowedOnTemplate)
	}
	if (o == dm.VMOperationsChangingVCPUs || o == dm.VMOperationsDestroy) && v.dom0 {
		return xerr.New(xerr.OperationNotAllowed, "This operation is not allowed on dom0")
	}
	if v.control {
		switch o {
		case dm.VMOperationsDataSourceOp, dm.VMOperationsChangingMemoryLive, dm.VMOperationsAwaitingMemoryLive,
			dm.VMOperationsMetadataExport, dm.VMOperationsChangingDynamicRange, dm.VMOperationsChangingMemoryLimits,
			dm.VMOperationsChangingStaticRange, dm.VMOperationsStart, dm.VMOperationsStartOn,
			dm.VMOperationsChangingVCPUs, dm.VMOperationsDestroy:
		default:
			return xerr.New(xerr.OperationNotAllowed, "This operation is not allowed on a control domain")
		}
	}
	// A guest that cannot be asked (no ACPI) cannot be shut down cleanly.
	if strict && v.power == psRunning && !v.acpi && (o == dm.VMOperationsCleanShutdown || o == dm.VMOperationsCleanReboot) {
		return xerr.New(xerr.VMLacksFeature, v.ref)
	}
	if o == dm.VMOperationsSnapshotWithQuiesce && v.power == psRunning {
		return xerr.New(xerr.VMSnapshotWithQuiesceNotSupported, v.ref, "quiesced snapshots need a guest agent")
	}
	return nil
}

// listedVMOps are the operations allowed_operations is made of (xapi's
// list).
var listedVMOps = []op{
	dm.VMOperationsSnapshot, dm.VMOperationsCopy, dm.VMOperationsClone, dm.VMOperationsRevert, dm.VMOperationsCheckpoint,
	dm.VMOperationsSnapshotWithQuiesce, dm.VMOperationsStart, dm.VMOperationsStartOn, dm.VMOperationsPause,
	dm.VMOperationsUnpause, dm.VMOperationsCleanShutdown, dm.VMOperationsCleanReboot, dm.VMOperationsHardShutdown,
	dm.VMOperationsHardReboot, dm.VMOperationsSuspend, dm.VMOperationsResume, dm.VMOperationsResumeOn,
	dm.VMOperationsExport, dm.VMOperationsDestroy, dm.VMOperationsProvision, dm.VMOperationsChangingVCPUsLive,
	dm.VMOperationsMakeIntoTemplate, dm.VMOperationsChangingStaticRange, dm.VMOperationsChangingShadowMemory,
	dm.VMOperationsChangingDynamicRange, dm.VMOperationsPoolMigrate, dm.VMOperationsMigrateSend,
}

// allowedVMOps computes allowed_operations.
func allowedVMOps(v vmCheck) []string {
	out := []string{}
	for _, o := range listedVMOps {
		if o == dm.VMOperationsRevert && !v.snapshot {
			continue
		}
		if v.checkOp(o, true) == nil {
			out = append(out, string(o))
		}
	}
	// Only what xapi lists: clients with an older enum refuse the rest.
	return dm.PublishableAllowed(dm.VM.Class.Name, out)
}

// VBD and VIF operations (xapi_vbd_helpers, xapi_vif_helpers).

type devCheck struct {
	class    string // "VBD" or "VIF"
	ref      string
	vm       string
	vmPower  string
	attached bool
	current  map[string]string
	// VBD only
	cd          bool
	empty       bool
	unpluggable bool
}

func (d *devCheck) checkOp(o string) *xerr.Error {
	if len(d.current) > 0 {
		var tasks, ops []string
		for t := range d.current {
			tasks = append(tasks, t)
		}
		sort.Strings(tasks)
		for _, t := range tasks {
			ops = append(ops, d.current[t])
		}
		return otherOperationInProgress(d.class, d.ref, tasks, ops)
	}
	switch o {
	case "plug", "unplug", "unplug_force":
		if d.vmPower != psRunning {
			return xerr.New(xerr.VMBadPowerState, d.vm, powerName(psRunning), powerName(d.vmPower))
		}
	}
	switch o {
	case "plug":
		if d.attached {
			return xerr.New(xerr.DeviceAlreadyAttached, d.ref)
		}
	case "unplug", "unplug_force":
		if !d.attached {
			return xerr.New(xerr.DeviceAlreadyDetached, d.ref)
		}
		if o == "unplug" && d.class == "VBD" && !d.unpluggable {
			return xerr.New(xerr.VBDNotUnpluggable, d.ref)
		}
	case "insert", "eject":
		if !d.cd {
			return xerr.New(xerr.VBDNotRemovableMedia, d.ref)
		}
		if d.vmPower == psPaused || d.vmPower == psSuspended {
			return xerr.New(xerr.VMBadPowerState, d.vm, powerName(psRunning)+", "+powerName(psHalted), powerName(d.vmPower))
		}
		if o == "insert" && !d.empty {
			return xerr.New(xerr.VBDNotEmpty, d.ref)
		}
		if o == "eject" && d.empty {
			return xerr.New(xerr.VBDIsEmpty, d.ref)
		}
	}
	return nil
}

func devCheckOf(r db.Reader, row *db.Row) devCheck {
	var d devCheck
	if row.Class == dm.VBD.Class {
		cur, _ := row.Get(dm.VBD.CurrentOperations).(map[string]string)
		d = devCheck{class: "VBD", ref: row.Ref, vm: row.String(dm.VBD.VM), attached: row.Get(dm.VBD.CurrentlyAttached) == true,
			current: cur, cd: row.String(dm.VBD.Type) == string(dm.VBDTypeCD), empty: row.Get(dm.VBD.Empty) == true,
			unpluggable: row.Get(dm.VBD.Unpluggable) == true}
	} else {
		cur, _ := row.Get(dm.VIF.CurrentOperations).(map[string]string)
		d = devCheck{class: "VIF", ref: row.Ref, vm: row.String(dm.VIF.VM), attached: row.Get(dm.VIF.CurrentlyAttached) == true, current: cur}
	}
	d.vmPower = psHalted
	if vm, ok := r.Get(dm.VM.Class, d.vm); ok {
		d.vmPower = vm.String(dm.VM.PowerState)
	}
	return d
}

func (d *devCheck) allowed() []string {
	ops := []string{"plug", "unplug"}
	if d.class == "VBD" {
		ops = append(ops, "unplug_force", "insert", "eject")
	}
	out := []string{}
	if !d.attached {
		out = append(out, "attach")
	}
	for _, o := range ops {
		if d.checkOp(o) == nil {
			out = append(out, o)
		}
	}
	return dm.PublishableAllowed(d.class, out)
}
