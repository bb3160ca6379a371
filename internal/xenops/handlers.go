package xenops

import (
	"context"
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

func (m *Manager) registerHandlers() {
	h := m.srv.Handle
	h("VM.start", m.vmStart)
	h("VM.start_on", m.vmStartOn)
	h("VM.clean_shutdown", m.vmPowerOp(dm.VMOperationsCleanShutdown, func(o *opCtx) error { return m.cleanShutdown(o, false) }))
	h("VM.hard_shutdown", m.vmPowerOp(dm.VMOperationsHardShutdown, m.hardShutdown))
	h("VM.shutdown", m.vmPowerOp(dm.VMOperationsShutdown, m.shutdown))
	h("VM.clean_reboot", m.vmPowerOp(dm.VMOperationsCleanReboot, m.cleanReboot))
	h("VM.hard_reboot", m.vmPowerOp(dm.VMOperationsHardReboot, func(o *opCtx) error { return m.reboot(o, 0, reasonHardReboot, true) }))
	h("VM.pause", m.vmPowerOp(dm.VMOperationsPause, m.pause))
	h("VM.unpause", m.vmPowerOp(dm.VMOperationsUnpause, m.unpause))
	h("VM.suspend", m.vmPowerOp(dm.VMOperationsSuspend, m.suspend))
	h("VM.resume", m.vmResume)
	h("VM.resume_on", m.vmResumeOn)
	h("VM.checkpoint", m.vmCheckpoint)
	h("VM.snapshot", m.vmSnapshot)
	h("VM.clone", m.vmClone)
	h("VM.copy", m.vmCopy)
	h("VM.provision", m.vmProvision)
	h("VM.destroy", m.vmDestroy)
	h("VM.set_VCPUs_number_live", m.vmSetVCPUsLive)
	h("VM.set_memory_dynamic_range", m.vmSetDynamicRange)
	h("VM.set_memory_limits", m.vmSetMemory("limits"))
	h("VM.set_memory_static_range", m.vmSetMemory("static"))
	h("VM.set_memory", m.vmSetMemory("all"))
	h("VM.assert_can_boot_here", m.vmAssertCanBootHere)
	h("VM.get_allowed_VBD_devices", m.vmAllowedVBDDevices)
	h("VM.get_allowed_VIF_devices", m.vmAllowedVIFDevices)
	h("VM.assert_operation_valid", m.vmAssertOperationValid)
	h("VM.update_allowed_operations", m.vmUpdateAllowedOperations)
	h("VM.power_state_reset", m.vmPowerStateReset)
	h("VBD.plug", m.vbdPlug)
	h("VBD.unplug", m.vbdUnplug(false))
	h("VBD.unplug_force", m.vbdUnplug(true))
	h("VBD.insert", m.vbdInsert)
	h("VBD.eject", m.vbdEject)
	h("VIF.plug", m.vifPlug)
	h("VIF.unplug", m.vifUnplug)
	h("VIF.unplug_force", m.vifUnplug)
}

// vmPowerOp makes the handler of an operation whose only argument is the
// VM.
func (m *Manager) vmPowerOp(o op, body func(*opCtx) error) api.Handler {
	return func(c *api.Call) (any, error) {
		row, err := c.Row(0, dm.VM.Class)
		if err != nil {
			return nil, err
		}
		return nil, m.withVMOp(c, row.Ref, o, m.recheck(o, body))
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

func boolArg(c *api.Call, i int) bool { b, _ := c.Args[i].(bool); return b }

func (m *Manager) vmStart(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	if err := m.assertHostUsable(c.Snapshot(), m.host, true); err != nil {
		return nil, err
	}
	paused := boolArg(c, 1)
	return nil, m.withVMOp(c, row.Ref, dm.VMOperationsStart, m.recheck(dm.VMOperationsStart, func(o *opCtx) error {
		return m.boot(o, 0, 1, paused, "")
	}))
}

// assertThisHost: start_on and resume_on run here; the pool layer
// forwards calls meant for other hosts.
func (m *Manager) assertThisHost(c *api.Call, i int) error {
	host, err := c.Row(i, dm.Host.Class)
	if err != nil {
		return err
	}
	if host.Ref != m.host {
		return xerr.New(xerr.VMIncompatibleWithThisHost, c.String(0), host.Ref, "VMs start on the host that receives the call; send it to that host")
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

func (m *Manager) vmStartOn(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	if err := m.assertThisHost(c, 1); err != nil {
		return nil, err
	}
	paused := boolArg(c, 2)
	return nil, m.withVMOp(c, row.Ref, dm.VMOperationsStartOn, m.recheck(dm.VMOperationsStartOn, func(o *opCtx) error {
		return m.boot(o, 0, 1, paused, "")
	}))
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

func (m *Manager) vmResume(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	paused := boolArg(c, 1)
	return nil, m.withVMOp(c, row.Ref, dm.VMOperationsResume, m.recheck(dm.VMOperationsResume, func(o *opCtx) error {
		return m.resume(o, paused)
	}))
}

func (m *Manager) vmResumeOn(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	if err := m.assertThisHost(c, 1); err != nil {
		return nil, err
	}
	paused := boolArg(c, 2)
	return nil, m.withVMOp(c, row.Ref, dm.VMOperationsResumeOn, m.recheck(dm.VMOperationsResumeOn, func(o *opCtx) error {
		return m.resume(o, paused)
	}))
}

func (m *Manager) vmSetVCPUsLive(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	n, _ := c.Args[1].(int64)
	max, _ := row.Get(dm.VM.VCPUsMax).(int64)
	if n < 1 || n > max {
		return nil, xerr.New(xerr.InvalidValue, "nvcpu", strconv.FormatInt(n, 10))
	}
	return nil, m.withVMOp(c, row.Ref, dm.VMOperationsChangingVCPUsLive, m.recheck(dm.VMOperationsChangingVCPUsLive, func(o *opCtx) error {
		if err := o.run("set-vcpus", func(ctx context.Context) error { return m.be.SetVCPUs(ctx, o.uuid, int(n)) }); err != nil {
			return err
		}
		info, _ := m.be.Info(o.uuid)
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VM.VCPUsAtStartup, o.vm, n); err != nil {
				return err
			}
			vm, _ := tx.Get(dm.VM.Class, o.vm)
			if mr := vm.String(dm.VM.Metrics); mr != "" {
				if _, ok := tx.Get(dm.VMMetrics.Class, mr); ok {
					if err := tx.Set(dm.VMMetrics.VCPUsNumber, mr, int64(info.VCPUs)); err != nil {
						return err
					}
				}
			}
			return nil
		})
		return err
	}))
}

func (m *Manager) vmSetDynamicRange(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	lo, _ := c.Args[1].(int64)
	hi, _ := c.Args[2].(int64)
	sMin, _ := row.Get(dm.VM.MemoryStaticMin).(int64)
	sMax, _ := row.Get(dm.VM.MemoryStaticMax).(int64)
	if err := checkMemory(sMin, lo, hi, sMax); err != nil {
		return nil, err
	}
	o := dm.VMOperationsChangingDynamicRange
	return nil, m.withVMOp(c, row.Ref, o, m.recheck(o, func(oc *opCtx) error {
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
				if mr := vm.String(dm.VM.Metrics); mr != "" {
					if _, ok := tx.Get(dm.VMMetrics.Class, mr); ok {
						if err := tx.Set(dm.VMMetrics.MemoryActual, mr, hi); err != nil {
							return err
						}
					}
				}
			}
			return nil
		})
		return err
	}))
}

// vmSetMemory serves the calls that change a halted VM's memory limits:
// set_memory_limits (all four), set_memory_static_range (the static
// pair) and set_memory (static max and the dynamic range to one value).
func (m *Manager) vmSetMemory(which string) api.Handler {
	return func(c *api.Call) (any, error) {
		row, err := c.Row(0, dm.VM.Class)
		if err != nil {
			return nil, err
		}
		get := func(f *schema.Field) int64 { v, _ := row.Get(f).(int64); return v }
		arg := func(i int) int64 { v, _ := c.Args[i].(int64); return v }
		var sMax int64 // every form of the call sets the static max
		sMin, dMin, dMax := get(dm.VM.MemoryStaticMin), get(dm.VM.MemoryDynamicMin), get(dm.VM.MemoryDynamicMax)
		o := dm.VMOperationsChangingMemoryLimits
		switch which {
		case "limits":
			sMin, sMax, dMin, dMax = arg(1), arg(2), arg(3), arg(4)
		case "static":
			sMin, sMax = arg(1), arg(2)
			o = dm.VMOperationsChangingStaticRange
		default:
			sMax, dMin, dMax = arg(1), arg(1), arg(1)
		}
		if err := checkMemory(sMin, dMin, dMax, sMax); err != nil {
			return nil, err
		}
		return nil, m.withVMOpQ(c, row.Ref, o, false, func(oc *opCtx) error {
			_, err := m.db.Update(func(tx *db.Tx) error {
				for f, v := range map[*schema.Field]int64{dm.VM.MemoryStaticMin: sMin, dm.VM.MemoryStaticMax: sMax,
					dm.VM.MemoryDynamicMin: dMin, dm.VM.MemoryDynamicMax: dMax, dm.VM.MemoryTarget: dMax} {
					if err := tx.Set(f, oc.vm, v); err != nil {
						return err
					}
				}
				return nil
			})
			return err
		})
	}
}

func (m *Manager) vmAssertCanBootHere(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	host, err := c.Row(1, dm.Host.Class)
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	if err := m.assertHostUsable(snap, host.Ref, false); err != nil {
		return nil, err
	}
	if host.Ref != m.host {
		return nil, xerr.New(xerr.VMIncompatibleWithThisHost, row.Ref, host.Ref, "this host only knows its own resources")
	}
	p, err := m.plan(snap, row.Ref)
	if err != nil {
		return nil, err
	}
	if err := m.be.Check(p.spec); err != nil {
		return nil, err
	}
	if avail := m.availableMemory(); p.spec.Memory > avail {
		return nil, xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(p.spec.Memory, 10), strconv.FormatInt(max(avail, 0), 10))
	}
	return nil, nil
}

func (m *Manager) vmAllowedVBDDevices(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	used := map[string]bool{}
	for _, ref := range strs(snap.Value(row, dm.VM.VBDs)) {
		if v, ok := snap.Get(dm.VBD.Class, ref); ok {
			used[v.String(dm.VBD.Userdevice)] = true
		}
	}
	return freeDevices(maxVBDDevices, used), nil
}

func (m *Manager) vmAllowedVIFDevices(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	used := map[string]bool{}
	for _, ref := range strs(snap.Value(row, dm.VM.VIFs)) {
		if v, ok := snap.Get(dm.VIF.Class, ref); ok {
			used[v.String(dm.VIF.Device)] = true
		}
	}
	return freeDevices(maxVIFDevices, used), nil
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

func (m *Manager) vmAssertOperationValid(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	v := vmCheckOf(c.Snapshot(), row)
	if err := v.checkOp(op(c.String(1)), false); err != nil {
		return nil, err
	}
	return nil, nil
}

func (m *Manager) vmUpdateAllowedOperations(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	return nil, c.Update(func(tx *db.Tx) error { return refreshVM(tx, row.Ref) })
}

// vmPowerStateReset forces a VM's record to Halted, for VMs whose host
// died. A VM with a live domain here is refused: it really runs.
func (m *Manager) vmPowerStateReset(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	if row.Get(dm.VM.IsControlDomain) == true {
		return nil, xerr.New(xerr.OperationNotAllowed, "This operation is not allowed on a control domain")
	}
	if info, ok := m.be.Info(row.UUID()); ok && info.State != backend.DomainGone {
		return nil, xerr.New(xerr.OperationNotAllowed, "the VM has a domain on this host; shut it down instead")
	}
	return nil, c.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.CurrentOperations, row.Ref, map[string]string{}); err != nil {
			return err
		}
		return m.setHalted(tx, row.Ref)
	})
}
