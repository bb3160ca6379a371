package xenops

import (
	"context"
	"crypto/rand"
	"math"
	"math/big"
	"os"
	"strconv"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// The messages xe's common commands and real clients use beyond the
// power operations: VM.revert, the memory calculations
// (compute_memory_overhead, maximise_memory, host.compute_memory_overhead),
// placement questions (get_possible_hosts, assert_agile), the deprecated
// set_memory_target_live, send_sysrq and send_trigger, VIF.move,
// VDI.resize_online on a disk a VM here is using, and VBD.destroy and
// VIF.destroy with xapi's refusal of an attached device.

// Optional backend capabilities these messages use. A backend without
// one answers the message with NOT_IMPLEMENTED.

// guestSignaller sends a running guest a magic SysRq key or a hardware
// trigger (NMI, power button).
type guestSignaller interface {
	SendSysrq(ctx context.Context, uuid string, key byte) error
	SendTrigger(ctx context.Context, uuid, trigger string) error
}

// diskResizer grows a disk a running domain has open, so that the guest
// sees the new size.
type diskResizer interface {
	ResizeDisk(ctx context.Context, uuid, device string, size int64) error
}

// nicMover moves a running domain's NIC onto another bridge without the
// guest noticing.
type nicMover interface {
	MoveNIC(ctx context.Context, uuid, device, bridge string) error
}

func (m *Manager) registerMessages14() {
	srv := m.srv
	api.Register(srv, m.vmRevert)
	api.Register(srv, m.vmSendSysrq)
	api.Register(srv, m.vmSendTrigger)
	api.Register(srv, m.vmSetMemoryTargetLive)
	api.Register(srv, func(c *api.Call, a dm.VMComputeMemoryOverheadArgs) (int64, error) {
		row, err := c.Lookup(dm.VM.Class, string(a.VM))
		if err != nil {
			return 0, err
		}
		return memoryOverhead(row), nil
	})
	api.Register(srv, m.vmMaximiseMemory)
	api.Register(srv, m.vmGetPossibleHosts)
	api.Register(srv, m.vmAssertAgile)
	api.Register(srv, func(c *api.Call, a dm.HostComputeMemoryOverheadArgs) (int64, error) {
		// As xapi: the host's overhead is taken to be constant, and is
		// what its record says.
		row, err := c.Lookup(dm.Host.Class, string(a.Host))
		if err != nil {
			return 0, err
		}
		n, _ := row.Get(dm.Host.MemoryOverhead).(int64)
		return n, nil
	})
	api.Register(srv, m.vifMove)
	api.Register(srv, m.vdiResizeOnline)
	srv.Handle("VBD.destroy", m.vbdDestroy)
	srv.Handle("VIF.destroy", m.vifDestroy)
}

// --- Memory ---------------------------------------------------------

const (
	mib          = 1 << 20
	pagesPerMiB  = 256 // 4 KiB pages
	approxVCPUs  = 64  // maximise_memory's "approximate": room for more VCPUs
	pvShadowMult = 1.0
	// maxShadowMultiplier bounds a record's multiplier in the arithmetic.
	maxShadowMultiplier = 1000.0
)

// memoryModel is xapi's per-domain-type accounting of what a domain needs
// beyond its guest memory (xapi-idl's memory.ml): fixed extras, and
// shadow memory that grows with the memory and the VCPUs.
type memoryModel struct{ extraInternal, extraExternal int64 }

var (
	hvmModel   = memoryModel{1, 1}
	linuxModel = memoryModel{0, 1}
)

// divUp is a/b rounded up, for non-negative a and positive b (without
// overflowing near the top of the range).
func divUp(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// shadowMiB is the shadow memory, in MiB, of a domain with static max
// maxMiB and vcpus VCPUs.
func shadowMiB(maxMiB int64, vcpus int64, multiplier float64) int64 {
	pages := 256*vcpus + maxMiB + maxMiB
	return max(1, int64(float64(divUp(pages, pagesPerMiB))*multiplier))
}

// overheadMiB is the domain's overhead in MiB.
func (mm memoryModel) overheadMiB(maxMiB, vcpus int64, multiplier float64) int64 {
	return mm.extraInternal + mm.extraExternal + shadowMiB(maxMiB, vcpus, multiplier) + divUp(38*vcpus, pagesPerMiB)
}

// vmMemoryModel picks the model and shadow multiplier for a VM: PV guests
// use Linux's with the default multiplier; every other domain type HVM's
// with the VM's own. A VM whose domain type is unspecified is taken by its
// HVM boot policy, as xapi derives it.
func vmMemoryModel(vm *db.Row) (memoryModel, float64) {
	dt := vm.String(dm.VM.DomainType)
	if dt == "" || dt == string(dm.DomainTypeUnspecified) {
		dt = string(dm.DomainTypeHVM)
		if vm.String(dm.VM.HVMBootPolicy) == "" {
			dt = string(dm.DomainTypePV)
		}
	}
	if dt == string(dm.DomainTypePV) {
		return linuxModel, pvShadowMult
	}
	mult, _ := vm.Get(dm.VM.HVMShadowMultiplier).(float64)
	if !(mult > 0) { // also NaN
		mult = 1
	}
	return hvmModel, min(mult, maxShadowMultiplier)
}

// vcpuCount bounds VCPUs_max to what a domain can have, so that a
// hostile record cannot overflow the arithmetic.
func vcpuCount(vm *db.Row) int64 {
	n, _ := vm.Get(dm.VM.VCPUsMax).(int64)
	return min(max(n, 0), 4096)
}

// memoryOverhead is VM.compute_memory_overhead: the overhead in bytes of
// the VM's domain at its static max.
func memoryOverhead(vm *db.Row) int64 {
	sm, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	mm, mult := vmMemoryModel(vm)
	return mm.overheadMiB(divUp(max(sm, 0), mib), vcpuCount(vm), mult) * mib
}

// startMiB is what a domain of static max staticMax needs free on the
// host to start, in MiB (xapi's required_host_free at the Static_max
// policy): the guest memory plus the overhead.
func startMiB(mm memoryModel, staticMax, vcpus int64, mult float64) int64 {
	maxMiB := divUp(max(staticMax, 0), mib)
	return maxMiB + mm.overheadMiB(maxMiB, vcpus, mult)
}

// fitsIn says whether a domain needing needMiB fits in total bytes.
func fitsIn(needMiB, total int64) bool { return needMiB <= total/mib }

// vmMaximiseMemory is VM.maximise_memory: the largest static max whose
// domain fits in total bytes, rounded down to a MiB; approximate leaves
// room for up to 64 VCPUs.
func (m *Manager) vmMaximiseMemory(c *api.Call, a dm.VMMaximiseMemoryArgs) (int64, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return 0, err
	}
	vcpus := vcpuCount(row)
	if a.Approximate {
		vcpus = approxVCPUs
	}
	mm, mult := vmMemoryModel(row)
	return maximiseMemory(a.Total, func(sm int64) bool { return fitsIn(startMiB(mm, sm, vcpus, mult), a.Total) }), nil
}

// maximiseMemory bisects for the largest x in [0, total] with fits(x)
// (fits grows false with x), rounded down to a MiB.
func maximiseMemory(total int64, fits func(int64) bool) int64 {
	if total <= 0 || !fits(0) {
		return 0
	}
	lo, hi := int64(0), total // fits(lo) holds
	for lo < hi {
		mid := lo + divUp(hi-lo, 2)
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo / mib * mib
}

// vmSetMemoryTargetLive is deprecated (set_memory_dynamic_range replaces
// it) and, as in xapi, does nothing once the operation is allowed: the VM
// must be running and free for changing_memory_live.
func (m *Manager) vmSetMemoryTargetLive(c *api.Call, a dm.VMSetMemoryTargetLiveArgs) (dm.Void, error) {
	return m.vmOp(c, a.Self, dm.VMOperationsChangingMemoryLive, nil, func(*opCtx) error { return nil })
}

// --- Placement ------------------------------------------------------

// vmGetPossibleHosts lists the hosts the VM could start on now: the one
// it is scheduled on, if any; else every live enabled host that sees its
// SRs (a plugged PBD), reaches its networks (a PIF on each, or a network
// without PIFs) and has memory free for it.
func (m *Manager) vmGetPossibleHosts(c *api.Call, a dm.VMGetPossibleHostsArgs) ([]dm.HostRef, error) {
	vm, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	if h := vm.String(dm.VM.ScheduledToBeResidentOn); h != schema.NullRef {
		if _, ok := snap.Get(dm.Host.Class, h); ok {
			return []dm.HostRef{dm.HostRef(h)}, nil
		}
	}
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	srs, nets := vmSRs(snap, vm), vmNetworks(snap, vm)
	out := []dm.HostRef{}
	for _, h := range snap.All(dm.Host.Class) {
		if h.Get(dm.Host.Enabled) != true {
			continue
		}
		if h.Ref != m.host {
			if live, known := forwarding.MetricsLive(snap, h); !live || !known {
				continue
			}
		}
		if !hostSeesSRs(snap, h.Ref, srs) || !hostOnNetworks(snap, h.Ref, nets) {
			continue
		}
		if metrics, ok := snap.Get(dm.HostMetrics.Class, h.String(dm.Host.Metrics)); ok {
			if free, _ := metrics.Get(dm.HostMetrics.MemoryFree).(int64); free < need {
				continue
			}
		}
		out = append(out, dm.HostRef(h.Ref))
	}
	return out, nil
}

// vmSRs are the SRs of a VM's disks (not empty drives) and of its suspend
// image.
func vmSRs(r db.Reader, vm *db.Row) []string {
	seen := map[string]bool{}
	var out []string
	add := func(vdi string) {
		if row, ok := r.Get(dm.VDI.Class, vdi); ok {
			if sr := row.String(dm.VDI.SR); !seen[sr] {
				if _, ok := r.Get(dm.SR.Class, sr); ok {
					seen[sr] = true
					out = append(out, sr)
				}
			}
		}
	}
	add(vm.String(dm.VM.SuspendVDI))
	for _, ref := range strs(r.Value(vm, dm.VM.VBDs)) {
		if vbd, ok := r.Get(dm.VBD.Class, ref); ok && vbd.Get(dm.VBD.Empty) != true {
			add(vbd.String(dm.VBD.VDI))
		}
	}
	return out
}

// vmNetworks are the networks of a VM's VIFs.
func vmNetworks(r db.Reader, vm *db.Row) []string {
	seen := map[string]bool{}
	var out []string
	for _, ref := range strs(r.Value(vm, dm.VM.VIFs)) {
		if vif, ok := r.Get(dm.VIF.Class, ref); ok {
			if n := vif.String(dm.VIF.Network); !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out
}

// hostSeesSRs reports whether host has a plugged PBD for every SR.
func hostSeesSRs(r db.Reader, host string, srs []string) bool {
	for _, sr := range srs {
		if _, ok := r.Get(dm.SR.Class, sr); ok && !hostSeesSR(r, host, sr) {
			return false
		}
	}
	return true
}

// hostSeesSR reports whether host has a plugged PBD of sr.
func hostSeesSR(r db.Reader, host, sr string) bool {
	row, ok := r.Get(dm.SR.Class, sr)
	if !ok {
		return false
	}
	for _, p := range strs(r.Value(row, dm.SR.PBDs)) {
		if pbd, ok := r.Get(dm.PBD.Class, p); ok && pbd.String(dm.PBD.Host) == host && pbd.Get(dm.PBD.CurrentlyAttached) == true {
			return true
		}
	}
	return false
}

// whyNotOn is why vm cannot run on host as far as its devices go (xapi's
// assert_can_boot_here, memory and liveness aside): each of its SRs
// plugged there (VM_REQUIRES_SR) and each of its networks reachable from
// it (VM_REQUIRES_NETWORK). nil when it can.
func whyNotOn(r db.Reader, vm *db.Row, host string) *xerr.Error {
	for _, sr := range vmSRs(r, vm) {
		if !hostSeesSR(r, host, sr) {
			return xerr.New(xerr.VMRequiresSR, vm.Ref, sr)
		}
	}
	for _, n := range vmNetworks(r, vm) {
		if !hostOnNetwork(r, host, n) {
			return xerr.New(xerr.VMRequiresNetwork, vm.Ref, n)
		}
	}
	return nil
}

// hostOnNetworks reports whether host reaches every network: it has a PIF
// on it, or the network has none (a network inside each host).
func hostOnNetworks(r db.Reader, host string, nets []string) bool {
	for _, n := range nets {
		if !hostOnNetwork(r, host, n) {
			return false
		}
	}
	return true
}

func hostOnNetwork(r db.Reader, host, network string) bool {
	row, ok := r.Get(dm.Network.Class, network)
	if !ok {
		return true
	}
	pifs := strs(r.Value(row, dm.Network.PIFs))
	if len(pifs) == 0 {
		return true
	}
	for _, p := range pifs {
		if pif, ok := r.Get(dm.PIF.Class, p); ok && pif.String(dm.PIF.Host) == host {
			return true
		}
	}
	return false
}

// enabledHosts lists the enabled hosts.
func enabledHosts(r db.Reader) []string {
	var out []string
	for _, h := range r.All(dm.Host.Class) {
		if h.Get(dm.Host.Enabled) == true {
			out = append(out, h.Ref)
		}
	}
	return out
}

// vmAssertAgile is VM.assert_agile, as xapi's agility check: a VM is agile
// (HA may restart it on any host) when every disk is on an SR that is
// shared and plugged on every enabled host
// (HA_CONSTRAINT_VIOLATION_SR_NOT_SHARED [sr]) and every VIF is on a
// network every enabled host has a PIF on
// (HA_CONSTRAINT_VIOLATION_NETWORK_NOT_SHARED [network]). VMs with vGPUs
// or USB devices are not (VM_HAS_VGPU, VM_HAS_VUSBS).
func (m *Manager) vmAssertAgile(c *api.Call, a dm.VMAssertAgileArgs) (dm.Void, error) {
	vm, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	if len(strs(snap.Value(vm, dm.VM.VGPUs))) > 0 {
		return dm.Void{}, xerr.New(xerr.VMHasVGPU, vm.Ref)
	}
	if len(strs(snap.Value(vm, dm.VM.VUSBs))) > 0 {
		return dm.Void{}, xerr.New(xerr.VMHasVUSBs, vm.Ref)
	}
	hosts := enabledHosts(snap)
	for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if !ok || vbd.Get(dm.VBD.Empty) == true {
			continue
		}
		vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI))
		if !ok {
			continue
		}
		sr := vdi.String(dm.VDI.SR)
		srRow, ok := snap.Get(dm.SR.Class, sr)
		if !ok || srRow.Get(dm.SR.Shared) != true {
			return dm.Void{}, xerr.New(xerr.HAConstraintViolationSRNotShared, sr)
		}
		for _, h := range hosts {
			if !hostSeesSRs(snap, h, []string{sr}) {
				return dm.Void{}, xerr.New(xerr.HAConstraintViolationSRNotShared, sr)
			}
		}
	}
	for _, n := range vmNetworks(snap, vm) {
		net, ok := snap.Get(dm.Network.Class, n)
		if !ok {
			continue
		}
		for _, h := range hosts {
			has := false
			for _, p := range strs(snap.Value(net, dm.Network.PIFs)) {
				if pif, ok := snap.Get(dm.PIF.Class, p); ok && pif.String(dm.PIF.Host) == h && !validRef(snap, dm.Bond.Class, pif.String(dm.PIF.BondSlaveOf)) {
					has = true
					break
				}
			}
			if !has {
				return dm.Void{}, xerr.New(xerr.HAConstraintViolationNetworkNotShared, n)
			}
		}
	}
	return dm.Void{}, nil
}

func validRef(r db.Reader, cls *schema.Class, ref string) bool {
	_, ok := r.Get(cls, ref)
	return ok
}

// --- SysRq and triggers ---------------------------------------------

// Triggers: the names Xen's toolstack accepts, and what QEMU can do of
// them. "nmi" injects an NMI, "power" presses the ACPI power button,
// "s3resume" wakes a guest from S3. "reset", "init" and "sleep" have no
// counterpart that leaves the domain as the manager expects.
var (
	knownTriggers     = map[string]bool{"nmi": true, "reset": true, "init": true, "power": true, "sleep": true, "s3resume": true}
	supportedTriggers = map[string]bool{"nmi": true, "power": true, "s3resume": true}
)

// sysrqKey checks a send_sysrq key: one letter or digit (the keys
// Linux's magic SysRq handles that a keyboard can send).
func sysrqKey(key string) (byte, error) {
	if len(key) == 1 {
		k := key[0]
		if k >= 'A' && k <= 'Z' {
			k += 'a' - 'A'
		}
		if (k >= 'a' && k <= 'z') || (k >= '0' && k <= '9') {
			return k, nil
		}
	}
	return 0, xerr.New(xerr.InvalidValue, "key", clip(key, 64))
}

// clip shortens a hostile value for an error.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func (m *Manager) signaller() (guestSignaller, error) {
	s, ok := m.be.(guestSignaller)
	if !ok {
		return nil, xerr.New(xerr.NotImplemented, "the "+m.be.Name()+" backend cannot signal guests")
	}
	return s, nil
}

func (m *Manager) vmSendSysrq(c *api.Call, a dm.VMSendSysrqArgs) (dm.Void, error) {
	if _, err := c.Lookup(dm.VM.Class, string(a.VM)); err != nil {
		return dm.Void{}, err
	}
	key, err := sysrqKey(a.Key)
	if err != nil {
		return dm.Void{}, err
	}
	s, err := m.signaller()
	if err != nil {
		return dm.Void{}, err
	}
	o := dm.VMOperationsSendSysrq
	return dm.Void{}, m.withVMOp(c, string(a.VM), o, m.recheck(o, func(oc *opCtx) error {
		return oc.run("sysrq", func(ctx context.Context) error { return s.SendSysrq(ctx, oc.uuid, key) })
	}))
}

func (m *Manager) vmSendTrigger(c *api.Call, a dm.VMSendTriggerArgs) (dm.Void, error) {
	if _, err := c.Lookup(dm.VM.Class, string(a.VM)); err != nil {
		return dm.Void{}, err
	}
	if !knownTriggers[a.Trigger] {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "trigger", clip(a.Trigger, 64))
	}
	if !supportedTriggers[a.Trigger] {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "trigger "+a.Trigger+" is not supported by this host; use nmi, power or s3resume")
	}
	s, err := m.signaller()
	if err != nil {
		return dm.Void{}, err
	}
	o := dm.VMOperationsSendTrigger
	return dm.Void{}, m.withVMOp(c, string(a.VM), o, m.recheck(o, func(oc *opCtx) error {
		return oc.run("trigger", func(ctx context.Context) error { return s.SendTrigger(ctx, oc.uuid, a.Trigger) })
	}))
}

// --- Devices --------------------------------------------------------

// vbdDestroy removes a VBD record and its metrics, refusing while it is
// attached, as xapi does (OPERATION_NOT_ALLOWED: unplug it first).
func (m *Manager) vbdDestroy(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VBD.Class)
	if err != nil {
		return nil, err
	}
	return nil, c.Update(func(tx *db.Tx) error {
		vbd, ok := tx.Get(dm.VBD.Class, row.Ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VBD.Class.Name, row.Ref)
		}
		if vbd.Get(dm.VBD.CurrentlyAttached) == true {
			vmUUID := ""
			if vm, ok := tx.Get(dm.VM.Class, vbd.String(dm.VBD.VM)); ok {
				vmUUID = vm.UUID()
			}
			return xerr.New(xerr.OperationNotAllowed, "VBD '"+vbd.UUID()+"' still attached to '"+vmUUID+"'")
		}
		if _, ok := tx.Get(dm.VBDMetrics.Class, vbd.String(dm.VBD.Metrics)); ok {
			if err := tx.Delete(dm.VBDMetrics.Class, vbd.String(dm.VBD.Metrics)); err != nil {
				return err
			}
		}
		return tx.Delete(dm.VBD.Class, vbd.Ref)
	})
}

// vifDestroy removes a VIF record and its metrics, refusing while it is
// attached to a VM with a domain, as xapi does.
func (m *Manager) vifDestroy(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VIF.Class)
	if err != nil {
		return nil, err
	}
	return nil, c.Update(func(tx *db.Tx) error {
		vif, ok := tx.Get(dm.VIF.Class, row.Ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VIF.Class.Name, row.Ref)
		}
		if vm, ok := tx.Get(dm.VM.Class, vif.String(dm.VIF.VM)); ok && vm.Get(dm.VM.Domid) != int64(-1) &&
			vif.Get(dm.VIF.CurrentlyAttached) == true {
			return xerr.New(xerr.OperationNotAllowed, "VIF currently attached to a running VM")
		}
		if _, ok := tx.Get(dm.VIFMetrics.Class, vif.String(dm.VIF.Metrics)); ok {
			if err := tx.Delete(dm.VIFMetrics.Class, vif.String(dm.VIF.Metrics)); err != nil {
				return err
			}
		}
		return tx.Delete(dm.VIF.Class, vif.Ref)
	})
}

// vifMove puts a VIF on another network. A VIF plugged into a running VM
// moves at once, its tap going to the new network's bridge without the
// guest noticing; the host must reach the network
// (HOST_CANNOT_ATTACH_NETWORK [host, network]).
func (m *Manager) vifMove(c *api.Call, a dm.VIFMoveArgs) (dm.Void, error) {
	vif, err := c.Lookup(dm.VIF.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	net, err := c.Lookup(dm.Network.Class, string(a.Network))
	if err != nil {
		return dm.Void{}, err
	}
	vmRef := vif.String(dm.VIF.VM)
	queue := vmRef
	if _, ok := c.Snapshot().Get(dm.VM.Class, vmRef); !ok {
		queue = vif.Ref
	}
	j := &job{ctx: context.WithoutCancel(c.Ctx), name: "VIF.move", run: func(ctx context.Context) error {
		snap := m.db.Snapshot()
		vif, ok := snap.Get(dm.VIF.Class, vif.Ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VIF.Class.Name, string(a.Self))
		}
		vm, vmOK := snap.Get(dm.VM.Class, vmRef)
		active := vmOK && vif.Get(dm.VIF.CurrentlyAttached) == true && vm.Get(dm.VM.Domid) != int64(-1)
		if active {
			host := vm.String(dm.VM.ResidentOn)
			if !hostOnNetwork(snap, host, net.Ref) {
				return xerr.New(xerr.HostCannotAttachNetwork, host, net.Ref)
			}
			if err := m.moveNIC(ctx, vm, vif, net); err != nil {
				return err
			}
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VIF.Class, vif.Ref); !ok {
				return xerr.New(xerr.HandleInvalid, dm.VIF.Class.Name, vif.Ref)
			}
			if _, ok := tx.Get(dm.Network.Class, net.Ref); !ok {
				return xerr.New(xerr.HandleInvalid, dm.Network.Class.Name, net.Ref)
			}
			return tx.Set(dm.VIF.Network, vif.Ref, net.Ref)
		})
		return err
	}}
	m.q.submit(queue, j)
	return dm.Void{}, j.wait()
}

// moveNIC moves a plugged VIF's NIC in this host's domain onto the
// network's bridge.
func (m *Manager) moveNIC(ctx context.Context, vm, vif, net *db.Row) error {
	info, ok := m.be.Info(vm.UUID())
	if !ok {
		return nil
	}
	for _, n := range info.NICs {
		if n.VIF != vif.Ref {
			continue
		}
		mv, ok := m.be.(nicMover)
		if !ok {
			return xerr.New(xerr.NotImplemented, "the "+m.be.Name()+" backend cannot move a plugged VIF")
		}
		bridge := net.String(dm.Network.Bridge)
		if m.cfg.Networks != nil {
			var err error
			if bridge, err = m.cfg.Networks.MoveVIF(ctx, vif.Ref, net.Ref); err != nil {
				return err
			}
		}
		return mv.MoveNIC(ctx, vm.UUID(), n.Device, bridge)
	}
	return nil
}

// --- VDI.resize_online ------------------------------------------------

// liveDisk is a VDI as a running domain on this host has it open.
type liveDisk struct {
	vm, uuid, device string
}

// findLiveDisk finds the running or paused VM on this host that has vdi
// open read-write.
func (m *Manager) findLiveDisk(r db.Reader, vdi *db.Row) (liveDisk, bool) {
	for _, ref := range strs(r.Value(vdi, dm.VDI.VBDs)) {
		vbd, ok := r.Get(dm.VBD.Class, ref)
		if !ok || vbd.Get(dm.VBD.CurrentlyAttached) != true {
			continue
		}
		vm, ok := r.Get(dm.VM.Class, vbd.String(dm.VBD.VM))
		if !ok || vm.String(dm.VM.ResidentOn) != m.host {
			continue
		}
		if p := vm.String(dm.VM.PowerState); p != psRunning && p != psPaused {
			continue
		}
		info, ok := m.be.Info(vm.UUID())
		if !ok {
			continue
		}
		for _, d := range info.Disks {
			if d.VDI == vdi.Ref && !d.ReadOnly {
				return liveDisk{vm: vm.Ref, uuid: vm.UUID(), device: d.Device}, true
			}
		}
	}
	return liveDisk{}, false
}

// vdiResizeOnline grows a VDI. When a VM running here has it open, the
// VM's emulator grows the disk (QEMU's block_resize), so that the guest
// sees the new size at once; otherwise the disk is resized through
// storage, as VDI.resize (xapi's resize_online takes the same storage
// path). Disks only grow.
func (m *Manager) vdiResizeOnline(c *api.Call, a dm.VDIResizeOnlineArgs) (dm.Void, error) {
	vdi, err := c.Lookup(dm.VDI.Class, string(a.VDI))
	if err != nil {
		return dm.Void{}, err
	}
	live, ok := m.findLiveDisk(c.Snapshot(), vdi)
	if !ok {
		_, err := (&dm.VDIResizeArgs{VDI: a.VDI, Size: a.Size}).Call(c.Ctx, c.Caller())
		return dm.Void{}, err
	}
	cur, _ := vdi.Get(dm.VDI.VirtualSize).(int64)
	if a.Size < cur {
		return dm.Void{}, xerr.New(xerr.VDITooSmall, vdi.Ref, strconv.FormatInt(cur, 10))
	}
	if a.Size > imageformat.MaxVirtualSize {
		return dm.Void{}, xerr.New(xerr.VDITooLarge, vdi.Ref, strconv.FormatInt(imageformat.MaxVirtualSize, 10))
	}
	if vdi.Get(dm.VDI.ReadOnly) == true {
		return dm.Void{}, xerr.New(xerr.VDIReadonly, vdi.Ref)
	}
	if a.Size == cur {
		return dm.Void{}, nil
	}
	rz, ok := m.be.(diskResizer)
	if !ok {
		return dm.Void{}, xerr.New(xerr.NotImplemented, "the "+m.be.Name()+" backend cannot resize disks in use")
	}
	j := &job{ctx: context.WithoutCancel(c.Ctx), name: "VDI.resize_online", run: func(ctx context.Context) error {
		// The VM may have stopped, or let go of the disk, while this waited.
		row, ok := m.db.Snapshot().Get(dm.VDI.Class, vdi.Ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VDI.Class.Name, vdi.Ref)
		}
		now, ok := m.findLiveDisk(m.db.Snapshot(), row)
		if !ok || now != live {
			return xerr.New(xerr.VDINotAvailable, vdi.Ref)
		}
		if err := rz.ResizeDisk(ctx, live.uuid, live.device, a.Size); err != nil {
			return err
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VDI.Class, vdi.Ref); !ok {
				return nil
			}
			return tx.Set(dm.VDI.VirtualSize, vdi.Ref, a.Size)
		})
		return err
	}}
	m.q.submit(live.vm, j)
	return dm.Void{}, j.wait()
}

// --- VM.revert --------------------------------------------------------

// revertKeeps are the VM fields a revert leaves as they are: identity,
// runtime state, the links that belong to the VM rather than to a point
// in its history, the devices (replaced separately), and those a snapshot
// record holds as a snapshot rather than as the VM was (its name, flags,
// appliance, blobs, snapshot bookkeeping). Everything else comes back
// from the snapshot (xapi's list for snapshots without stored metadata).
var revertKeeps = map[string]bool{
	"uuid": true, "suspend_VDI": true, "power_state": true, "parent": true, "current_operations": true,
	"allowed_operations": true, "metrics": true, "guest_metrics": true, "resident_on": true, "domid": true,
	"protection_policy": true, "snapshot_schedule": true, "scheduled_to_be_resident_on": true, "snapshots": true,
	"tags": true, "affinity": true, "groups": true, "consoles": true, "VBDs": true, "VIFs": true, "VGPUs": true,
	"VUSBs": true, "VTPMs": true, "attached_PCIs": true,
	"name_label": true, "is_a_snapshot": true, "is_a_template": true, "is_default_template": true,
	"snapshot_of": true, "snapshot_time": true, "transportable_snapshot_id": true, "children": true,
	"appliance": true, "blobs": true, "snapshot_info": true, "snapshot_metadata": true,
}

// markVMOp marks operation o on a VM, under the rules, outside the VM's
// queue; the returned function unmarks it.
func (m *Manager) markVMOp(c *api.Call, ref string, o op, extra func(v *vmCheck) error) (func(), error) {
	key := c.Task
	if key == "" {
		key = db.NewRef()
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, ref)
		}
		v := vmCheckOf(tx, row)
		if err := v.checkOp(o, false); err != nil {
			return err
		}
		if extra != nil {
			if err := extra(&v); err != nil {
				return err
			}
		}
		if err := tx.AddToMap(dm.VM.CurrentOperations, ref, key, string(o)); err != nil {
			return err
		}
		return refreshVM(tx, ref)
	}); err != nil {
		return nil, err
	}
	return func() { m.unmarkVMOp(ref, key, o) }, nil
}

// vmRevert is VM.revert(snapshot): the VM the snapshot was taken of (made
// again from the snapshot when it is gone) is shut down hard if it runs,
// loses the disks the snapshot has copies of, gets clones of the
// snapshot's disks, its VIFs, metrics and fields, and ends in the
// snapshot's power state: Halted, or Suspended with a copy of a
// checkpoint's memory image (VM.resume then runs it from that point).
// A failure leaves the VM Halted and is VM_REVERT_FAILED [snapshot, vm],
// as xapi raises it. The snapshot is marked revert, the VM reverting.
func (m *Manager) vmRevert(c *api.Call, a dm.VMRevertArgs) (dm.Void, error) {
	snapRow, err := c.Lookup(dm.VM.Class, string(a.Snapshot))
	if err != nil {
		return dm.Void{}, err
	}
	unmark, err := m.markVMOp(c, snapRow.Ref, dm.VMOperationsRevert, func(v *vmCheck) error {
		if !v.snapshot {
			return xerr.New(xerr.RevertOnlyAllowedOnSnapshot)
		}
		return nil
	})
	if err != nil {
		return dm.Void{}, err
	}
	defer unmark()
	vmRef := snapRow.String(dm.VM.SnapshotOf)
	if _, ok := m.db.Snapshot().Get(dm.VM.Class, vmRef); !ok {
		if vmRef, err = m.vmFromSnapshot(snapRow.Ref); err != nil {
			m.log.Error("revert: making the VM again from its snapshot", "snapshot", snapRow.UUID(), "err", err)
			return dm.Void{}, xerr.New(xerr.VMRevertFailed, snapRow.Ref, snapRow.String(dm.VM.SnapshotOf))
		}
	}
	o := dm.VMOperationsReverting
	return dm.Void{}, m.withVMOp(c, vmRef, o, func(oc *opCtx) error {
		// Destructive and quick: a cancelled revert would leave a broken
		// VM, so it runs to the end, as xapi's does.
		oc.ctx = context.WithoutCancel(oc.ctx)
		err := m.revert(oc, c, snapRow.Ref)
		if err == nil {
			return nil
		}
		m.log.Error("revert failed", "vm", oc.uuid, "snapshot", snapRow.UUID(), "err", err)
		if _, herr := m.db.Update(func(tx *db.Tx) error { return m.setHalted(tx, oc.vm) }); herr != nil {
			m.log.Error("revert: recording the VM Halted", "vm", oc.uuid, "err", herr)
		}
		// As xapi, a full SR (SM's error 44), a chain too long (109) and
		// a VDI of the wrong type are passed on as they are.
		if e := xerr.From(err); e.Code == xerr.VDIIncompatibleType || e.Code == xerr.SRBackendFailure+"_44" || e.Code == xerr.SRBackendFailure+"_109" {
			return err
		}
		return xerr.New(xerr.VMRevertFailed, snapRow.Ref, oc.vm)
	})
}

// vmFromSnapshot makes a VM again from a snapshot whose VM was destroyed:
// the snapshot's record, Halted, no longer a snapshot or template, without
// devices (the revert gives it the snapshot's); the snapshots of the old
// VM become the new one's.
func (m *Manager) vmFromSnapshot(snapRef string) (string, error) {
	var ref string
	_, err := m.db.Update(func(tx *db.Tx) error {
		s, ok := tx.Get(dm.VM.Class, snapRef)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, snapRef)
		}
		old := s.String(dm.VM.SnapshotOf)
		now := time.Now().UTC()
		metrics, err := m.newMetrics(tx, now)
		if err != nil {
			return err
		}
		vals := vmCopyValues(s, copySpec{kind: CopyClone, name: s.String(dm.VM.NameLabel), power: psHalted}, metrics, now)
		vals[dm.VM.IsATemplate.Index] = false
		if ref, err = tx.Insert(dm.VM.Class, "", vals); err != nil {
			return err
		}
		if old != "" && old != schema.NullRef {
			for _, r := range tx.All(dm.VM.Class) {
				if r.String(dm.VM.SnapshotOf) == old {
					if err := tx.Set(dm.VM.SnapshotOf, r.Ref, ref); err != nil {
						return err
					}
				}
			}
		}
		return refreshVM(tx, ref)
	})
	return ref, err
}

// revert does the work of VM.revert on the VM's queue.
func (m *Manager) revert(o *opCtx, c *api.Call, snapRef string) error {
	snap := m.db.Snapshot()
	vm, ok := snap.Get(dm.VM.Class, o.vm)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, o.vm)
	}
	s, ok := snap.Get(dm.VM.Class, snapRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, snapRef)
	}
	o.window(0, 1, 5)
	if err := m.stopForRevert(o, vm); err != nil {
		return err
	}
	plan := revertPlanOf(m.db.Snapshot(), o.vm, snapRef)
	// The VM's disks the snapshot has copies of, and its memory image,
	// go first, to make room; the VBDs of the others go too (their disks
	// stay, detached).
	if err := o.run("remove-disks", func(ctx context.Context) error {
		return m.removeRevertedDisks(ctx, c, plan)
	}); err != nil {
		return err
	}
	// Then clones of the snapshot's disks, and of its memory image.
	rc := &revertCopies{clones: map[string]string{}, suspendVDI: schema.NullRef}
	fail := func(err error) error {
		for _, v := range rc.created {
			m.destroyVDI(o.ctx, c, v)
		}
		return err
	}
	if err := o.run("clone-disks", func(ctx context.Context) error {
		return m.cloneForRevert(ctx, c, snap, vm, s, plan, rc)
	}); err != nil {
		return fail(err)
	}
	err := o.run("records", func(ctx context.Context) error {
		_, err := m.db.Update(func(tx *db.Tx) error { return m.recordRevert(tx, o.vm, snapRef, plan, rc.clones, rc.suspendVDI) })
		return err
	})
	if err != nil {
		if s.String(dm.VM.PowerState) == psSuspended && rc.suspendVDI == schema.NullRef {
			if p, perr := m.suspendPath(vm.UUID()); perr == nil {
				_ = os.Remove(p)
			}
		}
		return fail(err)
	}
	return nil
}

// stopForRevert stops o's VM (vm its row) before a revert, as by
// hard_shutdown (its own mark stays: the copy of the context releases
// nothing); a VM halted already only has the step recorded.
func (m *Manager) stopForRevert(o *opCtx, vm *db.Row) error {
	if p := vm.String(dm.VM.PowerState); p != psHalted {
		hard := *o
		hard.key = ""
		return m.hardShutdown(&hard)
	}
	return o.run("halted", func(context.Context) error { return nil })
}

// removeRevertedDisks deletes the VBDs a revert drops and destroys the
// VM's disks that the snapshot has copies of.
func (m *Manager) removeRevertedDisks(ctx context.Context, c *api.Call, plan revertPlan) error {
	if _, err := m.db.Update(func(tx *db.Tx) error {
		for _, ref := range plan.dropVBDs {
			if _, ok := tx.Get(dm.VBD.Class, ref); ok {
				if err := tx.Delete(dm.VBD.Class, ref); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for _, vdi := range plan.dropVDIs {
		if err := m.destroyVDIStrict(ctx, c, vdi); err != nil {
			return err
		}
	}
	// A suspended VM's memory image went with hard_shutdown above.
	return nil
}

// revertCopies are the copies a revert makes of a snapshot's disks and
// memory image for the VM.
type revertCopies struct {
	created    []string          // the VDIs made, destroyed if the revert fails
	clones     map[string]string // snapshot VBD -> VDI for the VM's copy
	suspendVDI string            // the copy of the snapshot's suspend VDI, or NullRef
}

// cloneForRevert clones the snapshot s's disks in plan for the VM vm
// and, when s is suspended, copies its memory image; what it makes goes
// in rc as it is made. snap is the database as the revert began.
func (m *Manager) cloneForRevert(ctx context.Context, c *api.Call, snap *db.Snapshot, vm, s *db.Row, plan revertPlan, rc *revertCopies) error {
	for _, v := range plan.cloneVBDs {
		nv, err := m.copyVDI(ctx, c, v.vdi, CopyClone, schema.NullRef)
		if err != nil {
			return err
		}
		rc.created = append(rc.created, nv)
		rc.clones[v.vbd] = nv
	}
	if s.String(dm.VM.PowerState) != psSuspended {
		return nil
	}
	if sv := s.String(dm.VM.SuspendVDI); validRef(snap, dm.VDI.Class, sv) {
		// A suspend image belongs to one VM: storage copies it for
		// this one.
		var nv string
		var err error
		if store, ok := m.disks.(SuspendStore); ok {
			nv, err = store.CopySuspendVDI(ctx, sv, vm.UUID(), schema.NullRef)
		} else {
			nv, err = m.copyVDI(ctx, c, sv, CopyClone, schema.NullRef)
		}
		if err != nil {
			return err
		}
		rc.created = append(rc.created, nv)
		rc.suspendVDI = nv
		return nil
	}
	from, err := m.suspendPath(s.UUID())
	if err != nil {
		return err
	}
	to, err := m.suspendPath(vm.UUID())
	if err != nil {
		return err
	}
	return backend.CopyFile(from, to)
}

// revertPlan is what a revert removes and copies.
type revertPlan struct {
	dropVBDs  []string     // the VM's VBDs that go
	dropVDIs  []string     // the VM's VDIs that go (they have copies in the snapshot)
	cloneVBDs []vbdAndVDI  // the snapshot's disk VBDs, whose VDIs are cloned for the VM
	cdVBDs    []string     // the snapshot's CD VBDs, copied on the same VDI
	snapOf    []snapshotOf // VDIs whose snapshot_of moves to a clone
}

type vbdAndVDI struct{ vbd, vdi string }

// snapshotOf: the snapshot VDIs of a VM disk that a revert replaces; they
// become snapshots of the clone made from the snapshot VBD's VDI.
type snapshotOf struct {
	vbd   string   // the snapshot's VBD whose clone they follow
	snaps []string // VDIs whose snapshot_of named the replaced disk
}

// revertPlanOf works out, as xapi does, which of the VM's disks a revert
// replaces (those the snapshot has snapshots of), which VBDs go (those
// on replaced disks, those on disks the snapshot does not know, and CD
// drives) and which of the snapshot's disks are cloned.
func revertPlanOf(r db.Reader, vmRef, snapRef string) revertPlan {
	var p revertPlan
	vm, _ := r.Get(dm.VM.Class, vmRef)
	s, _ := r.Get(dm.VM.Class, snapRef)
	snapshotOfs := map[string]bool{} // the VM disks the snapshot's disks are snapshots of
	for _, ref := range strs(r.Value(s, dm.VM.VBDs)) {
		vbd, ok := r.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		vdi := vbd.String(dm.VBD.VDI)
		if vbd.String(dm.VBD.Type) != string(dm.VBDTypeDisk) || vbd.Get(dm.VBD.Empty) == true || !validRef(r, dm.VDI.Class, vdi) {
			p.cdVBDs = append(p.cdVBDs, ref)
			continue
		}
		p.cloneVBDs = append(p.cloneVBDs, vbdAndVDI{ref, vdi})
		row, _ := r.Get(dm.VDI.Class, vdi)
		of := row.String(dm.VDI.SnapshotOf)
		snapshotOfs[of] = true
		if ofRow, ok := r.Get(dm.VDI.Class, of); ok {
			p.snapOf = append(p.snapOf, snapshotOf{vbd: ref, snaps: strs(r.Value(ofRow, dm.VDI.Snapshots))})
		}
	}
	dropped := map[string]bool{}
	for _, ref := range strs(r.Value(vm, dm.VM.VBDs)) {
		vbd, ok := r.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		vdi := vbd.String(dm.VBD.VDI)
		if vbd.String(dm.VBD.Type) != string(dm.VBDTypeDisk) {
			p.dropVBDs = append(p.dropVBDs, ref) // CD drives come from the snapshot
			continue
		}
		p.dropVBDs = append(p.dropVBDs, ref)
		if snapshotOfs[vdi] && !dropped[vdi] {
			dropped[vdi] = true
			p.dropVDIs = append(p.dropVDIs, vdi)
		}
	}
	return p
}

// recordRevert writes the reverted VM: its new VBDs and VIFs, metrics,
// fields from the snapshot, parent, and its power state.
func (m *Manager) recordRevert(tx *db.Tx, vmRef, snapRef string, p revertPlan, clones map[string]string, suspendVDI string) error {
	vm, ok := tx.Get(dm.VM.Class, vmRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, vmRef)
	}
	s, ok := tx.Get(dm.VM.Class, snapRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, snapRef)
	}
	// The snapshots of the replaced disks follow their replacements.
	for _, so := range p.snapOf {
		for _, v := range so.snaps {
			if _, ok := tx.Get(dm.VDI.Class, v); ok {
				if err := tx.Set(dm.VDI.SnapshotOf, v, clones[so.vbd]); err != nil {
					return err
				}
			}
		}
	}
	if err := recordRevertVBDs(tx, vmRef, p, clones); err != nil {
		return err
	}
	if err := recordRevertVIFs(tx, vmRef, vm, s); err != nil {
		return err
	}
	if err := m.recordRevertMetrics(tx, vmRef, vm, s); err != nil {
		return err
	}
	if err := recordRevertFields(tx, vmRef, snapRef, s); err != nil {
		return err
	}
	if s.String(dm.VM.PowerState) == psSuspended {
		return m.setSuspended(tx, vmRef, suspendVDI)
	}
	return m.setHalted(tx, vmRef)
}

// recordRevertVBDs gives the VM vmRef copies of the snapshot's VBDs in
// p: its disks on their clones, its CD drives on the same VDIs.
func recordRevertVBDs(tx *db.Tx, vmRef string, p revertPlan, clones map[string]string) error {
	copyVBD := func(ref, vdi string) error {
		row, ok := tx.Get(dm.VBD.Class, ref)
		if !ok {
			return nil
		}
		vals := row.Stored()
		vals[dm.VBD.UUID.Index] = ""
		vals[dm.VBD.VM.Index] = vmRef
		vals[dm.VBD.VDI.Index] = vdi
		vbdRuntime.clear(vals)
		_, err := tx.Insert(dm.VBD.Class, "", vals)
		return err
	}
	for _, v := range p.cloneVBDs {
		if err := copyVBD(v.vbd, clones[v.vbd]); err != nil {
			return err
		}
	}
	for _, ref := range p.cdVBDs {
		if row, ok := tx.Get(dm.VBD.Class, ref); ok {
			if err := copyVBD(ref, row.String(dm.VBD.VDI)); err != nil {
				return err
			}
		}
	}
	return nil
}

// recordRevertVIFs replaces the VIFs of the VM vmRef (vm its row) with
// copies of the snapshot s's, with their MACs.
func recordRevertVIFs(tx *db.Tx, vmRef string, vm, s *db.Row) error {
	for _, ref := range strs(tx.Value(vm, dm.VM.VIFs)) {
		if row, ok := tx.Get(dm.VIF.Class, ref); ok {
			if _, ok := tx.Get(dm.VIFMetrics.Class, row.String(dm.VIF.Metrics)); ok {
				if err := tx.Delete(dm.VIFMetrics.Class, row.String(dm.VIF.Metrics)); err != nil {
					return err
				}
			}
			if err := tx.Delete(dm.VIF.Class, ref); err != nil {
				return err
			}
		}
	}
	for _, ref := range strs(tx.Value(s, dm.VM.VIFs)) {
		row, ok := tx.Get(dm.VIF.Class, ref)
		if !ok {
			continue
		}
		vals := row.Stored()
		vals[dm.VIF.UUID.Index] = uuid.NewString()
		vals[dm.VIF.VM.Index] = vmRef
		vifRuntime.clear(vals)
		if _, err := tx.Insert(dm.VIF.Class, "", vals); err != nil {
			return err
		}
	}
	return nil
}

// recordRevertMetrics replaces the metrics and guest metrics of the VM
// vmRef (vm its row) with copies of the snapshot s's; a VM whose
// snapshot has no metrics gets new ones.
func (m *Manager) recordRevertMetrics(tx *db.Tx, vmRef string, vm, s *db.Row) error {
	for _, mf := range []struct {
		field *schema.Field
		cls   *schema.Class
	}{{dm.VM.Metrics, dm.VMMetrics.Class}, {dm.VM.GuestMetrics, dm.VMGuestMetrics.Class}} {
		if old := vm.String(mf.field); validRef(tx, mf.cls, old) {
			if err := tx.Delete(mf.cls, old); err != nil {
				return err
			}
		}
		nv := schema.NullRef
		if from, ok := tx.Get(mf.cls, s.String(mf.field)); ok {
			vals := from.Stored()
			vals[mf.cls.UUID.Index] = uuid.NewString()
			var err error
			if nv, err = tx.Insert(mf.cls, "", vals); err != nil {
				return err
			}
		} else if mf.cls == dm.VMMetrics.Class {
			var err error
			if nv, err = m.newMetrics(tx, time.Now().UTC()); err != nil {
				return err
			}
		}
		if err := tx.Set(mf.field, vmRef, nv); err != nil {
			return err
		}
	}
	return nil
}

// recordRevertFields sets the VM vmRef's fields from the snapshot s
// (snapRef), makes the snapshot its parent and gives it a fresh
// generation ID when the snapshot has one.
func recordRevertFields(tx *db.Tx, vmRef, snapRef string, s *db.Row) error {
	for _, f := range dm.VM.Class.Fields {
		if f.Derived || f.Internal || revertKeeps[f.Name] {
			continue
		}
		v := s.Get(f)
		switch f {
		case dm.VM.HAAlwaysRun:
			v = false
		case dm.VM.DomainType:
			if dt, _ := v.(string); dt == "" || dt == string(dm.DomainTypeUnspecified) {
				v = string(dm.DomainTypeHVM)
				if s.String(dm.VM.HVMBootPolicy) == "" {
					v = string(dm.DomainTypePV)
				}
			}
		}
		if err := tx.Set(f, vmRef, v); err != nil {
			return err
		}
	}
	if err := tx.Set(dm.VM.Parent, vmRef, snapRef); err != nil {
		return err
	}
	// A guest that reads its generation ID (Windows) must see that it
	// went back in time: a VM that has one gets a fresh one.
	if s.String(dm.VM.GenerationID) != "" {
		if err := tx.Set(dm.VM.GenerationID, vmRef, freshGenerationID()); err != nil {
			return err
		}
	}
	return nil
}

// freshGenerationID is a new VM generation ID in xapi's form: two
// random non-negative 63-bit numbers, "A:B".
func freshGenerationID() string {
	n := func() int64 {
		v, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
		if err != nil {
			return time.Now().UnixNano() & math.MaxInt64
		}
		return v.Int64()
	}
	return strconv.FormatInt(n(), 10) + ":" + strconv.FormatInt(n(), 10)
}

// destroyVDIStrict destroys a VDI through the XenAPI as the caller,
// reporting a failure.
func (m *Manager) destroyVDIStrict(ctx context.Context, c *api.Call, vdi string) error {
	if c == nil || c.Session == nil || c.Session.Ref == "" {
		return xerr.New(xerr.OperationNotAllowed, "destroying disks needs a XenAPI session")
	}
	if _, ok := m.db.Snapshot().Get(dm.VDI.Class, vdi); !ok {
		return nil
	}
	_, _, err := m.srv.Invoke(ctx, c.Session.Ref, "VDI.destroy", vdi)
	return err
}
