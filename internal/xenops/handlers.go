package xenops

import (
	"context"
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/planner"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

func (m *Manager) registerHandlers() {
	srv := m.srv
	api.Register(srv, m.vmStart)
	api.Register(srv, m.vmStartOn)
	powerOp(m, dm.VMOperationsCleanShutdown, func(a dm.VMCleanShutdownArgs) dm.VMRef { return a.VM }, func(o *opCtx) error { return m.cleanShutdown(o, false) })
	powerOp(m, dm.VMOperationsHardShutdown, func(a dm.VMHardShutdownArgs) dm.VMRef { return a.VM }, m.hardShutdown)
	powerOp(m, dm.VMOperationsShutdown, func(a dm.VMShutdownArgs) dm.VMRef { return a.VM }, m.shutdown)
	powerOp(m, dm.VMOperationsCleanReboot, func(a dm.VMCleanRebootArgs) dm.VMRef { return a.VM }, m.cleanReboot)
	powerOp(m, dm.VMOperationsHardReboot, func(a dm.VMHardRebootArgs) dm.VMRef { return a.VM }, func(o *opCtx) error { return m.reboot(o, 0, reasonHardReboot, true) })
	powerOp(m, dm.VMOperationsPause, func(a dm.VMPauseArgs) dm.VMRef { return a.VM }, m.pause)
	powerOp(m, dm.VMOperationsUnpause, func(a dm.VMUnpauseArgs) dm.VMRef { return a.VM }, m.unpause)
	powerOp(m, dm.VMOperationsSuspend, func(a dm.VMSuspendArgs) dm.VMRef { return a.VM }, m.suspend)
	api.Register(srv, m.vmResume)
	api.Register(srv, m.vmResumeOn)
	api.Register(srv, m.vmCheckpoint)
	api.Register(srv, m.vmSnapshot)
	api.Register(srv, m.vmClone)
	api.Register(srv, m.vmCopy)
	api.Register(srv, m.vmProvision)
	srv.Handle("VM.destroy", m.vmDestroy) // implicit: the destructor, with checks
	api.Register(srv, m.vmSetVCPUsLive)
	api.Register(srv, m.vmSetDynamicRange)
	api.Register(srv, func(c *api.Call, a dm.VMSetMemoryLimitsArgs) (dm.Void, error) {
		return m.vmSetMemory(c, a.Self, dm.VMOperationsChangingMemoryLimits, memoryLimits{a.StaticMin, a.StaticMax, a.DynamicMin, a.DynamicMax}, true)
	})
	api.Register(srv, func(c *api.Call, a dm.VMSetMemoryStaticRangeArgs) (dm.Void, error) {
		return m.vmSetMemory(c, a.Self, dm.VMOperationsChangingStaticRange, memoryLimits{staticMin: a.Min, staticMax: a.Max}, false)
	})
	api.Register(srv, func(c *api.Call, a dm.VMSetMemoryArgs) (dm.Void, error) {
		return m.vmSetMemory(c, a.Self, dm.VMOperationsChangingMemoryLimits, memoryLimits{staticMax: a.Value, dynamicMin: a.Value, dynamicMax: a.Value}, false)
	})
	api.Register(srv, m.vmAssertCanBootHere)
	api.Register(srv, func(c *api.Call, a dm.HostComputeFreeMemoryArgs) (int64, error) {
		// What placement reads: the host's metrics, which it keeps
		// current as its domains start and stop.
		snap := c.Snapshot()
		h, ok := snap.Get(dm.Host.Class, string(a.Host))
		if !ok {
			return 0, xerr.New(xerr.HandleInvalid, dm.Host.Class.Name, string(a.Host))
		}
		metrics, ok := snap.Get(dm.HostMetrics.Class, h.String(dm.Host.Metrics))
		if !ok {
			return 0, nil
		}
		free, _ := metrics.Get(dm.HostMetrics.MemoryFree).(int64)
		return free, nil
	})
	api.Register(srv, func(c *api.Call, a dm.VMGetAllowedVBDDevicesArgs) ([]string, error) {
		return m.allowedDevices(c, a.VM, dm.VM.VBDs, dm.VBD.Class, dm.VBD.Userdevice, maxVBDDevices)
	})
	api.Register(srv, func(c *api.Call, a dm.VMGetAllowedVIFDevicesArgs) ([]string, error) {
		return m.allowedDevices(c, a.VM, dm.VM.VIFs, dm.VIF.Class, dm.VIF.Device, maxVIFDevices)
	})
	api.Register(srv, m.vmAssertOperationValid)
	api.Register(srv, m.vmUpdateAllowedOperations)
	api.Register(srv, m.vmPowerStateReset)
	api.Register(srv, func(c *api.Call, a dm.VBDPlugArgs) (dm.Void, error) { return dm.Void{}, m.vbdPlug(c, string(a.Self)) })
	api.Register(srv, func(c *api.Call, a dm.VBDUnplugArgs) (dm.Void, error) {
		return dm.Void{}, m.vbdUnplug(c, string(a.Self), false)
	})
	api.Register(srv, func(c *api.Call, a dm.VBDUnplugForceArgs) (dm.Void, error) {
		return dm.Void{}, m.vbdUnplug(c, string(a.Self), true)
	})
	api.Register(srv, m.vbdInsert)
	api.Register(srv, m.vbdEject)
	api.Register(srv, func(c *api.Call, a dm.VIFPlugArgs) (dm.Void, error) { return dm.Void{}, m.vifPlug(c, string(a.Self)) })
	api.Register(srv, func(c *api.Call, a dm.VIFUnplugArgs) (dm.Void, error) {
		return dm.Void{}, m.vifUnplug(c, string(a.Self))
	})
	api.Register(srv, func(c *api.Call, a dm.VIFUnplugForceArgs) (dm.Void, error) {
		return dm.Void{}, m.vifUnplug(c, string(a.Self))
	})
	m.registerMessages14()
	m.registerEvacuation()
	m.registerMigrate()
}

// powerOp binds the handler of an operation whose only argument is the
// VM: vm picks it out of the message's arguments.
func powerOp[A any, PA interface {
	*A
	api.TypedArgs[dm.Void]
}](m *Manager, o op, vm func(A) dm.VMRef, body func(*opCtx) error) {
	api.Register[A, dm.Void, PA](m.srv, func(c *api.Call, a A) (dm.Void, error) {
		return m.vmOp(c, vm(a), o, nil, body)
	})
}

// vmOp runs operation o on vm, in its turn on the VM's queue and after
// recheck. check, when not nil, runs first, once the VM is found: the
// host checks of start and resume.
func (m *Manager) vmOp(c *api.Call, vm dm.VMRef, o op, check func() error, body func(*opCtx) error) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(vm))
	if err != nil {
		return dm.Void{}, err
	}
	if check != nil {
		if err := check(); err != nil {
			return dm.Void{}, err
		}
	}
	if err := m.withVMOp(c, row.Ref, o, m.recheck(o, body)); err != nil {
		return dm.Void{}, err
	}
	m.noteAlwaysRun(row.Ref, o)
	return dm.Void{}, nil
}

// noteAlwaysRun keeps ha_always_run as xapi does for a VM HA protects:
// set when a client starts or resumes it, cleared when a client shuts it
// down or suspends it, so that HA restarts a protected VM that stopped on
// its own (or was killed by its host's fencing) but not one a client
// stopped.
func (m *Manager) noteAlwaysRun(ref string, o op) {
	var want bool
	switch o {
	case dm.VMOperationsStart, dm.VMOperationsStartOn, dm.VMOperationsResume, dm.VMOperationsResumeOn:
		want = true
	case dm.VMOperationsCleanShutdown, dm.VMOperationsHardShutdown, dm.VMOperationsShutdown, dm.VMOperationsSuspend:
	default:
		return
	}
	row, ok := m.db.Snapshot().Get(dm.VM.Class, ref)
	if !ok || row.Get(dm.VM.HAAlwaysRun) == want {
		return
	}
	if want && !planner.Priority(row.String(dm.VM.HARestartPriority)).Protected() {
		return // set only for a VM HA protects; clearing is always right
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VM.Class, ref); !ok {
			return nil
		}
		return tx.Set(dm.VM.HAAlwaysRun, ref, want)
	}); err != nil {
		m.log.Warn("cannot record ha_always_run", m.logRef("vm", dm.VM.Class, ref), "err", err)
	}
}

// recheck verifies, once the operation's turn has come on the VM's queue,
// that the VM is still in a state the operation accepts: the guest may
// have stopped while it waited.
func (m *Manager) recheck(o op, body func(*opCtx) error) func(*opCtx) error {
	return func(oc *opCtx) error {
		row, ok := m.db.Snapshot().Get(dm.VM.Class, oc.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", oc.vm)
		}
		v := vmCheckOf(m.db.Snapshot(), row)
		v.current = nil
		if err := v.checkOp(o, false); err != nil {
			return err
		}
		return body(oc)
	}
}

func (m *Manager) vmStart(c *api.Call, a dm.VMStartArgs) (dm.Void, error) {
	return m.vmOp(c, a.VM, dm.VMOperationsStart,
		func() error { return m.assertHostUsable(c.Snapshot(), m.host, true) },
		func(o *opCtx) error { return m.boot(o, 0, 1, a.StartPaused, "") })
}

// assertThisHost: start_on and resume_on run here; the pool layer
// forwards calls meant for other hosts.
func (m *Manager) assertThisHost(c *api.Call, vm dm.VMRef, hostRef dm.HostRef) error {
	host, err := c.Lookup(dm.Host.Class, string(hostRef))
	if err != nil {
		return err
	}
	if host.Ref != m.host {
		return xerr.New(xerr.VMIncompatibleWithThisHost, string(vm), host.Ref, "VMs start on the host that receives the call; send it to that host")
	}
	return m.assertHostUsable(c.Snapshot(), host.Ref, false)
}

func (m *Manager) assertHostUsable(r db.Reader, host string, anyHost bool) error {
	h, ok := r.Get(dm.Host.Class, host)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "host", host)
	}
	if h.Get(dm.Host.Enabled) != true {
		if anyHost {
			return xerr.New(xerr.NoHostsAvailable)
		}
		return xerr.New(xerr.HostDisabled, host)
	}
	return nil
}

func (m *Manager) vmStartOn(c *api.Call, a dm.VMStartOnArgs) (dm.Void, error) {
	return m.vmOp(c, a.VM, dm.VMOperationsStartOn,
		func() error { return m.assertThisHost(c, a.VM, a.Host) },
		func(o *opCtx) error { return m.boot(o, 0, 1, a.StartPaused, "") })
}

func (m *Manager) shutdown(o *opCtx) error {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if ok && row.String(dm.VM.PowerState) == psRunning {
		return m.cleanShutdown(o, true)
	}
	return m.hardShutdown(o)
}

func (m *Manager) cleanReboot(o *opCtx) error {
	clean, err := m.requestStop(o, false)
	if err != nil {
		return err
	}
	reason := reasonCleanReboot
	if !clean {
		reason = reasonHardReboot
	}
	return m.reboot(o, 0.5, reason, !clean)
}

func (m *Manager) pause(o *opCtx) error {
	if err := o.run("pause", func(ctx context.Context) error { return m.be.Pause(ctx, o.uuid) }); err != nil {
		return err
	}
	return m.recordLive(o, psPaused)
}

func (m *Manager) unpause(o *opCtx) error {
	if err := o.run("unpause", func(ctx context.Context) error { return m.be.Unpause(ctx, o.uuid) }); err != nil {
		return err
	}
	return m.recordLive(o, psRunning)
}

func (m *Manager) recordLive(o *opCtx, power string) error {
	info, ok := m.be.Info(o.uuid)
	if !ok {
		return xerr.New(xerr.VMBadPowerState, o.vm, powerName(power), powerName(psHalted))
	}
	_, err := m.db.Update(func(tx *db.Tx) error {
		if err := o.release(tx); err != nil {
			return err
		}
		return m.setLive(tx, o.vm, info, power)
	})
	return err
}

func (m *Manager) vmResume(c *api.Call, a dm.VMResumeArgs) (dm.Void, error) {
	return m.vmOp(c, a.VM, dm.VMOperationsResume, nil, func(o *opCtx) error { return m.resume(o, a.StartPaused) })
}

func (m *Manager) vmResumeOn(c *api.Call, a dm.VMResumeOnArgs) (dm.Void, error) {
	return m.vmOp(c, a.VM, dm.VMOperationsResumeOn,
		func() error { return m.assertThisHost(c, a.VM, a.Host) },
		func(o *opCtx) error { return m.resume(o, a.StartPaused) })
}

func (m *Manager) vmSetVCPUsLive(c *api.Call, a dm.VMSetVCPUsNumberLiveArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	n := a.Nvcpu
	max, _ := row.Get(dm.VM.VCPUsMax).(int64)
	if n < 1 || n > max {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "nvcpu", strconv.FormatInt(n, 10))
	}
	return dm.Void{}, m.withVMOp(c, row.Ref, dm.VMOperationsChangingVCPUsLive, m.recheck(dm.VMOperationsChangingVCPUsLive, func(o *opCtx) error {
		if err := o.run("set-vcpus", func(ctx context.Context) error { return m.be.SetVCPUs(ctx, o.uuid, int(n)) }); err != nil {
			return err
		}
		info, _ := m.be.Info(o.uuid)
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VM.VCPUsAtStartup, o.vm, n); err != nil {
				return err
			}
			vm, _ := tx.Get(dm.VM.Class, o.vm)
			_, err := setMetrics(tx, vm.String(dm.VM.Metrics), map[*schema.Field]any{dm.VMMetrics.VCPUsNumber: int64(info.VCPUs)})
			return err
		})
		return err
	}))
}

func (m *Manager) vmSetDynamicRange(c *api.Call, a dm.VMSetMemoryDynamicRangeArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	lo, hi := a.Min, a.Max
	sMin, _ := row.Get(dm.VM.MemoryStaticMin).(int64)
	sMax, _ := row.Get(dm.VM.MemoryStaticMax).(int64)
	if err := checkMemory(sMin, lo, hi, sMax); err != nil {
		return dm.Void{}, err
	}
	o := dm.VMOperationsChangingDynamicRange
	return dm.Void{}, m.withVMOp(c, row.Ref, o, m.recheck(o, func(oc *opCtx) error {
		vm, ok := m.db.Snapshot().Get(dm.VM.Class, oc.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", oc.vm)
		}
		live := vm.String(dm.VM.PowerState) == psRunning
		if live {
			if err := oc.run("balloon", func(ctx context.Context) error { return m.be.SetMemoryTarget(ctx, oc.uuid, hi) }); err != nil {
				return err
			}
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VM.MemoryDynamicMin, oc.vm, lo); err != nil {
				return err
			}
			if err := tx.Set(dm.VM.MemoryDynamicMax, oc.vm, hi); err != nil {
				return err
			}
			if live {
				if err := tx.Set(dm.VM.MemoryTarget, oc.vm, hi); err != nil {
					return err
				}
				if _, err := setMetrics(tx, vm.String(dm.VM.Metrics), map[*schema.Field]any{dm.VMMetrics.MemoryActual: hi}); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	}))
}

// memoryLimits are a VM's four memory limits.
type memoryLimits struct{ staticMin, staticMax, dynamicMin, dynamicMax int64 }

// vmSetMemory serves the calls that change a halted VM's memory limits:
// set_memory_limits (all four, all true), set_memory_static_range (the
// static pair) and set_memory (static max and the dynamic range to one
// value). Limits left 0 keep the VM's, except the static max, which
// every form sets.
func (m *Manager) vmSetMemory(c *api.Call, vm dm.VMRef, o op, l memoryLimits, all bool) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(vm))
	if err != nil {
		return dm.Void{}, err
	}
	get := func(f *schema.Field) int64 { v, _ := row.Get(f).(int64); return v }
	if !all {
		if o == dm.VMOperationsChangingStaticRange {
			l.dynamicMin, l.dynamicMax = get(dm.VM.MemoryDynamicMin), get(dm.VM.MemoryDynamicMax)
		} else {
			l.staticMin = get(dm.VM.MemoryStaticMin)
		}
	}
	if err := checkMemory(l.staticMin, l.dynamicMin, l.dynamicMax, l.staticMax); err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, m.withVMOpQ(c, row.Ref, o, false, func(oc *opCtx) error {
		_, err := m.db.Update(func(tx *db.Tx) error {
			for f, v := range map[*schema.Field]int64{dm.VM.MemoryStaticMin: l.staticMin, dm.VM.MemoryStaticMax: l.staticMax,
				dm.VM.MemoryDynamicMin: l.dynamicMin, dm.VM.MemoryDynamicMax: l.dynamicMax, dm.VM.MemoryTarget: l.dynamicMax} {
				if err := tx.Set(f, oc.vm, v); err != nil {
					return err
				}
			}
			return nil
		})
		return err
	})
}

func (m *Manager) vmAssertCanBootHere(c *api.Call, a dm.VMAssertCanBootHereArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	host, err := c.Lookup(dm.Host.Class, string(a.Host))
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	if err := m.assertHostUsable(snap, host.Ref, false); err != nil {
		return dm.Void{}, err
	}
	if host.Ref != m.host {
		return dm.Void{}, xerr.New(xerr.VMIncompatibleWithThisHost, row.Ref, host.Ref, "this host only knows its own resources")
	}
	p, err := m.plan(snap, row.Ref)
	if err != nil {
		return dm.Void{}, err
	}
	if err := m.be.Check(p.spec); err != nil {
		return dm.Void{}, err
	}
	if avail := m.availableMemory(); p.spec.Memory > avail {
		return dm.Void{}, xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(p.spec.Memory, 10), strconv.FormatInt(max(avail, 0), 10))
	}
	return dm.Void{}, nil
}

// allowedDevices lists the device numbers below n that none of a VM's
// devices (its VBDs or VIFs) uses.
func (m *Manager) allowedDevices(c *api.Call, vm dm.VMRef, devs *schema.Field, cls *schema.Class, number *schema.Field, n int) ([]string, error) {
	row, err := c.Lookup(dm.VM.Class, string(vm))
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	used := map[string]bool{}
	for _, ref := range strs(snap.Value(row, devs)) {
		if v, ok := snap.Get(cls, ref); ok {
			used[v.String(number)] = true
		}
	}
	return freeDevices(n, used), nil
}

func freeDevices(n int, used map[string]bool) []string {
	out := []string{}
	for i := range n {
		if s := strconv.Itoa(i); !used[s] {
			out = append(out, s)
		}
	}
	return out
}

func (m *Manager) vmAssertOperationValid(c *api.Call, a dm.VMAssertOperationValidArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	v := vmCheckOf(c.Snapshot(), row)
	if err := v.checkOp(a.Op, false); err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, nil
}

func (m *Manager) vmUpdateAllowedOperations(c *api.Call, a dm.VMUpdateAllowedOperationsArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return refreshVM(tx, row.Ref) })
}

// vmPowerStateReset forces a VM's record to Halted, for VMs whose host
// died. A VM with a live domain here is refused: it really runs.
func (m *Manager) vmPowerStateReset(c *api.Call, a dm.VMPowerStateResetArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return dm.Void{}, err
	}
	if row.Get(dm.VM.IsControlDomain) == true {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "This operation is not allowed on a control domain")
	}
	if info, ok := m.be.Info(row.UUID()); ok && info.State != backend.DomainGone {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "the VM has a domain on this host; shut it down instead")
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.CurrentOperations, row.Ref, map[string]string{}); err != nil {
			return err
		}
		return m.setHalted(tx, row.Ref)
	})
}
