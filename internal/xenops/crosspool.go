package xenops

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"strconv"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Cross-pool migration: VM.migrate_send with a dest map whose host is
// not in this pool (host.migrate_receive asked of another pool), as
// xapi's inter-pool storage XenMotion.
//
// The source talks to the other pool with the session the dest map
// carries: XenAPI calls to its coordinator (dest["master"]) for the
// checks, and a migration stream to the destination host's POST
// /migrate (crosspool_recv.go), authenticated by the same session.
// The destination host's address is its host.address in the other pool;
// where the URLs name no port, this host's own API port is assumed (the
// dest map's URLs name none, as xapi's hosts all listen on 80 and 443).
// With an https master the calls and the stream go over TLS, the other
// pool's hosts checked against the system's roots and the CA
// certificates installed in this pool (Config.ClientTLS).
// The steps:
//
//  1. checks (VM.assert_can_migrate does the same): the session is
//     valid there; every disk is in vdi_map, to an SR of that pool;
//     every VIF is in vif_map, to a network of that pool; the
//     destination host has room for the VM's memory;
//  2. the header carries the VM's records (xapi's metadata import with
//     restore: the VM keeps its uuid); the destination creates the VM
//     (halted, marked migrate_send), a VDI per disk on its mapped SR,
//     the VBDs and the VIFs, as the remote session, then builds the
//     incoming domain on the new VDIs and serves each as an NBD export;
//  3. the source mirrors each disk into its export through a
//     storage.Relay whose connections are more /migrate streams, then
//     sends the memory, the mirrors completing at the switchover, as in
//     a storage migration inside the pool (storagemigrate.go);
//  4. the commit: the source says go once the state is in (from then it
//     never resumes the guest); the destination records the VM running
//     on its host and says done. Without done the source asks the remote
//     pool where the VM is;
//  5. the source destroys its stopped domain, then its VM record (with
//     the VBDs and VIFs) and the old VDIs, as xapi does after a
//     cross-pool move. VM.migrate_send returns the VM's ref in the other
//     pool.
//
// Before the commit, any failure or cancel leaves the VM running here,
// and the destination destroys its domain, the VDIs it made and the VM
// record (the source also asks the remote pool to destroy a VM of that
// uuid left behind, as xapi does). A halted VM goes the same way
// without a domain: the destination serves each new VDI through
// storage's export and the source copies its VDIs into them
// (storagecopy.go's copy, over /migrate streams); go then keeps the
// imported VM, halted. Not done yet: VMs with snapshots, read-only
// disks of a running VM, CDs with a disc and options copy=true; each is
// refused with OPERATION_NOT_ALLOWED.

// crossPort is the API port assumed for the other pool's hosts when the
// dest map's URL names none (host.migrate_receive's URLs name none, as
// xapi's hosts all listen on 80 and 443): this host's own.
func (m *Manager) crossPort() string {
	if _, port, err := net.SplitHostPort(m.cfg.ListenAddr); err == nil {
		return port
	}
	return ""
}

// clientTLS is the TLS configuration for the other pool's hosts.
func (m *Manager) clientTLS() *tls.Config {
	if m.cfg.ClientTLS != nil {
		return m.cfg.ClientTLS()
	}
	return nil
}

// inThisPool reports whether dest names a host of this pool.
func inThisPool(r db.Reader, dest map[string]string) bool {
	_, ok := r.Get(dm.Host.Class, dest["host"])
	return ok
}

// crossPlan is a checked cross-pool migration.
type crossPlan struct {
	rp    *remotePool
	moves []diskMove // VDI: the source's; SR: the remote SR
	imp   *crossImport
}

// crossFields is a record's fields a create takes, as database text;
// references are left out (the other pool's come from the maps).
func crossFields(r db.Reader, c *schema.Class, row *db.Row) map[string]string {
	out := map[string]string{}
	for _, f := range c.Fields {
		if f.Derived || f.Internal || f.Qualifier == schema.DynamicRO || f == c.UUID || f.Type.Kind == schema.KRef ||
			(f.Type.Kind == schema.KSet && f.Type.Elem.Kind == schema.KRef) {
			continue
		}
		out[f.Name] = schema.FormatDB(f.Type, r.Value(row, f))
	}
	return out
}

// checkCrossPool is xapi's checks of a migration to another pool, and
// what the header will carry.
func (m *Manager) checkCrossPool(ctx context.Context, r db.Reader, vm *db.Row, dest map[string]string,
	vdiMap map[dm.VDIRef]dm.SRRef, vifMap map[dm.VIFRef]dm.NetworkRef, options map[string]string) (*crossPlan, error) {
	if b, err := strconv.ParseBool(options["copy"]); err == nil && b {
		return nil, xerr.New(xerr.OperationNotAllowed, "copy=true to another pool is not supported")
	}
	power := vm.String(dm.VM.PowerState)
	if power != psRunning && power != psPaused && power != psHalted {
		return nil, xerr.New(xerr.VMBadPowerState, vm.Ref, powerName(psRunning), powerName(power))
	}
	if len(strs(r.Value(vm, dm.VM.Snapshots))) > 0 {
		return nil, xerr.New(xerr.OperationNotAllowed, "a VM with snapshots cannot be migrated to another pool yet")
	}
	if pcis := strs(r.Value(vm, dm.VM.AttachedPCIs)); len(pcis) > 0 {
		return nil, xerr.New(xerr.VMHasPCIAttached, vm.Ref)
	}
	rp, err := newRemotePool(dest, m.crossPort(), m.clientTLS())
	if err != nil {
		return nil, err
	}
	cp := &crossPlan{rp: rp, imp: &crossImport{VM: crossFields(r, dm.VM.Class, vm)}}
	fail := func(err error) (*crossPlan, error) { rp.close(); return nil, err }
	// The session first: every later answer depends on it.
	if _, err := rp.call(ctx, "host.get_uuid", rp.host); err != nil {
		return fail(err)
	}
	for _, vbd := range strs(r.Value(vm, dm.VM.VBDs)) {
		row, ok := r.Get(dm.VBD.Class, vbd)
		if !ok || row.Get(dm.VBD.Empty) == true {
			continue
		}
		vdi := row.String(dm.VBD.VDI)
		if row.String(dm.VBD.Type) == string(dm.VBDTypeCD) {
			return fail(xerr.New(xerr.OperationNotAllowed, "eject the VM's CDs before a migration to another pool"))
		}
		sr, mapped := vdiMap[dm.VDIRef(vdi)]
		if !mapped {
			return fail(xerr.New(xerr.VDINotInMap, vdi))
		}
		vrow, ok := r.Get(dm.VDI.Class, vdi)
		if !ok {
			return fail(xerr.New(xerr.VDIMissing, schema.NullRef, vdi))
		}
		if power != psHalted && (row.String(dm.VBD.Mode) == string(dm.VBDModeRO) || vrow.Get(dm.VDI.ReadOnly) == true) {
			return fail(xerr.New(xerr.OperationNotAllowed, "a read-only disk of a running VM cannot be migrated to another pool yet"))
		}
		if vrow.String(dm.VDI.OnBoot) == string(dm.OnBootReset) {
			return fail(xerr.New(xerr.VDIOnBootModeIncompatibleWithOperation))
		}
		if _, err := rp.call(ctx, "SR.get_uuid", string(sr)); err != nil {
			return fail(err)
		}
		vf := crossFields(r, dm.VDI.Class, vrow)
		vf["SR"] = string(sr)
		cp.moves = append(cp.moves, diskMove{VBD: vbd, VDI: vdi, SR: string(sr), Copy: power == psHalted})
		cp.imp.Disks = append(cp.imp.Disks, crossDisk{VBD: crossFields(r, dm.VBD.Class, row), VDI: vf, Source: vbd})
	}
	for _, vif := range strs(r.Value(vm, dm.VM.VIFs)) {
		row, ok := r.Get(dm.VIF.Class, vif)
		if !ok {
			continue
		}
		net, mapped := vifMap[dm.VIFRef(vif)]
		if !mapped {
			return fail(xerr.New(xerr.VIFNotInMap, vif))
		}
		if _, err := rp.call(ctx, "network.get_uuid", string(net)); err != nil {
			return fail(err)
		}
		nf := crossFields(r, dm.VIF.Class, row)
		nf["network"] = string(net)
		cp.imp.NICs = append(cp.imp.NICs, nf)
	}
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	if power == psHalted {
		return cp, nil // a halted VM needs no memory there
	}
	if metrics, err := rp.str(ctx, "host.get_metrics", rp.host); err == nil {
		raw, err := rp.call(ctx, "host_metrics.get_memory_free", metrics)
		var free json.Number
		if err == nil && json.Unmarshal(raw, &free) == nil {
			if n, err := strconv.ParseInt(string(free), 10, 64); err == nil && need > n {
				return fail(xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(n, 0), 10)))
			}
		}
	}
	return cp, nil
}

// vmMigrateSendRemote is VM.migrate_send to another pool.
func (m *Manager) vmMigrateSendRemote(c *api.Call, a dm.VMMigrateSendArgs, row *db.Row) (dm.VMRef, error) {
	snap := c.Snapshot()
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return "", err
	}
	if r := row.String(dm.VM.ResidentOn); r != m.host && row.String(dm.VM.PowerState) != psHalted {
		return "", xerr.New(xerr.VMNotResidentHere, row.Ref, m.host)
	}
	cp, err := m.checkCrossPool(c.Ctx, snap, row, a.Dest, a.VDIMap, a.VIFMap, a.Options)
	if err != nil {
		return "", err
	}
	defer cp.rp.close()
	done, err := m.storageSlot()
	if err != nil {
		return "", err
	}
	defer done()
	var newVM string
	err = m.withVMOp(c, row.Ref, dm.VMOperationsMigrateSend, m.recheck(dm.VMOperationsMigrateSend, func(o *opCtx) error {
		var err error
		if row.String(dm.VM.PowerState) == psHalted {
			newVM, err = m.crossCopyOut(o, cp, a.Options)
		} else {
			newVM, err = m.crossOut(o, cp, a.Options)
		}
		return err
	}))
	if err != nil {
		return "", err
	}
	m.forgetMovedVM(c.Ctx, row.Ref, oldVDIs(cp.moves))
	return dm.VMRef(newVM), nil
}

// crossOut sends the VM to the other pool; it returns the VM's ref
// there.
func (m *Manager) crossOut(o *opCtx, cp *crossPlan, options map[string]string) (string, error) {
	t0 := time.Now()
	rp := cp.rp
	mig, ok := m.be.(backend.Migrator)
	if !ok {
		return "", xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the "+m.be.Name()+" backend cannot migrate live")
	}
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	power := row.String(dm.VM.PowerState)
	info, ok := m.be.Info(o.uuid)
	if !ok || info.State.Stopped() {
		return "", xerr.New(xerr.VMBadPowerState, o.vm, powerName(psRunning), powerName(psHalted))
	}
	o.prog.Progress(0.01)
	xs, err := m.crossOpen(o, cp, power, options)
	if err != nil {
		return "", err
	}
	defer xs.close()
	mc := xs.mc
	failed := func(err error) (string, error) { return "", m.crossFailed(o, rp, err) }
	newVM := xs.ready.NewVM
	o.prog.Progress(0.1)
	mopts := migrateOptions(row)
	memLo := 0.1
	var mirrorTime time.Duration
	if len(xs.moves) > 0 {
		tm := time.Now()
		th := xs.hdr.migrateHeader
		th.VM = newVM
		sm, err := m.startMirrors(o, rp.host, info, xs.moves, th, xs.dial, mopts.Bandwidth)
		if err != nil {
			return failed(err)
		}
		defer sm.cancel(o.ctx)
		o.prog.Progress(0.15) // the mirrors run
		if err := sm.wait(o, 0.15, 0.5); err != nil {
			return failed(err)
		}
		mirrorTime = time.Since(tm)
		mopts.BeforeSwitchover = sm.complete
		memLo = 0.5
	}
	cw, send, err := m.sendMemory(o, mig, mc, mopts, memLo)
	if err != nil {
		return failed(err)
	}
	m.journal(journal.Stop, o.uuid)
	rollback := func(cause error) (string, error) {
		xs.abort()
		m.resumeAfterFailedMove(o, power)
		return failed(cause)
	}
	if err := cw.Close(); err != nil {
		return rollback(err)
	}
	if _, err := mc.recvMsg(stepReceived, migrateRecvTimeout); err != nil {
		return rollback(err)
	}
	if o.ctx.Err() != nil || !xs.unhook() {
		return rollback(context.Canceled)
	}
	// The commit point: go. From here the guest never runs here again
	// unless the other pool says it does not have it.
	_ = mc.c.SetDeadline(time.Time{})
	committed := false
	if err := mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout); err == nil {
		committed = m.sendRRD(o, mc) == nil
	}
	if !committed {
		switch moved, known := m.remoteHas(o.ctx, rp, newVM); {
		case !known:
			m.log.Error("cannot tell whether the other pool took the VM: the guest stays stopped here", "vm", o.uuid)
			return "", xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination pool did not confirm the move")
		case !moved:
			return rollback(xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination did not take the VM"))
		}
	}
	o.prog.Progress(0.95)
	m.removeMovedDomain(o, info)
	total := time.Since(t0)
	m.mig.last.Store(&MigrationTimes{Total: total, Send: send, Mirror: mirrorTime})
	m.log.Info("VM migrated to another pool", "vm", o.uuid, "dest", rp.host, "total", total, "send", send, "mirror", mirrorTime)
	return newVM, nil
}

// remoteHas asks the other pool whether newVM runs on the destination
// host (the final word once go may have been lost): known is false when
// it cannot be asked. It waits for the destination to settle first.
func (m *Manager) remoteHas(ctx context.Context, rp *remotePool, newVM string) (moved, known bool) {
	bg := context.WithoutCancel(ctx)
	deadline := time.Now().Add(migrateGoTimeout + migrateMsgTimeout)
	for time.Now().Before(deadline) {
		p, err := rp.str(bg, "VM.get_power_state", newVM)
		if xerr.HasCode(err, xerr.HandleInvalid) {
			return false, true
		}
		if err == nil && (p == psRunning || p == psPaused) {
			on, err := rp.str(bg, "VM.get_resident_on", newVM)
			if err == nil {
				return on == rp.host, true
			}
		}
		time.Sleep(time.Second)
	}
	return false, false
}

// cleanRemote destroys a VM of uuid the other pool may hold after a
// failed migration, as xapi does (the destination removes it itself
// when it sees the failure; this is the second try).
func (m *Manager) cleanRemote(ctx context.Context, rp *remotePool, uuid string) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), remoteCallTimeout)
	defer cancel()
	ref, err := rp.str(bg, "VM.get_by_uuid", uuid)
	if err != nil {
		return
	}
	if p, err := rp.str(bg, "VM.get_power_state", ref); err == nil && p == psHalted {
		if _, err := rp.call(bg, "VM.destroy", ref); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) &&
			!xerr.HasCode(err, xerr.OtherOperationInProgress) {
			m.log.Warn("cannot destroy a VM left in the other pool", "vm", uuid, "err", err)
		}
	}
}

// forgetMovedVM removes a VM that moved to another pool from this one:
// its record (halted first, with its VBDs, VIFs and metrics, as VM.destroy
// does) and then its old VDIs.
func (m *Manager) forgetMovedVM(ctx context.Context, vm string, vdis []string) {
	bg := context.WithoutCancel(ctx)
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, vm)
		if !ok {
			return nil
		}
		for f, v := range map[*schema.Field]any{dm.VM.PowerState: psHalted, dm.VM.ResidentOn: schema.NullRef,
			dm.VM.Domid: int64(-1), dm.VM.CurrentOperations: map[string]string{}} {
			if err := tx.Set(f, vm, v); err != nil {
				return err
			}
		}
		for _, vbd := range strs(tx.Value(row, dm.VM.VBDs)) {
			if _, ok := tx.Get(dm.VBD.Class, vbd); ok {
				if err := tx.Set(dm.VBD.CurrentlyAttached, vbd, false); err != nil {
					return err
				}
			}
		}
		return m.noteFreeMemory(tx)
	}); err != nil {
		m.log.Error("cannot reset a VM that moved to another pool", "vm", vm, "err", err)
		return
	}
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		m.log.Error("cannot remove a VM that moved to another pool", "vm", vm, "err", err)
		return
	}
	defer end()
	snap := m.db.Snapshot()
	if row, ok := snap.Get(dm.VM.Class, vm); ok {
		for _, vbd := range strs(snap.Value(row, dm.VM.VBDs)) {
			if _, err := caller.InvokeArgs(bg, "VBD.destroy", []any{vbd}); err != nil {
				m.log.Warn("cannot destroy a moved VM's VBD", "vbd", vbd, "err", err)
			}
		}
		for _, vif := range strs(snap.Value(row, dm.VM.VIFs)) {
			if _, err := caller.InvokeArgs(bg, "VIF.destroy", []any{vif}); err != nil {
				m.log.Warn("cannot destroy a moved VM's VIF", "vif", vif, "err", err)
			}
		}
	}
	if _, err := caller.InvokeArgs(bg, "VM.destroy", []any{vm}); err != nil {
		m.log.Error("cannot destroy a VM that moved to another pool", "vm", vm, "err", err)
	}
	m.destroyVDIs(bg, vdis, "a cross-pool migration moved away from")
}

// assertCanMigrateRemote is VM.assert_can_migrate for a destination in
// another pool: the checks of checkCrossPool.
func (m *Manager) assertCanMigrateRemote(c *api.Call, row *db.Row, a dm.VMAssertCanMigrateArgs) error {
	snap := c.Snapshot()
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return err
	}
	cp, err := m.checkCrossPool(c.Ctx, snap, row, a.Dest, a.VDIMap, a.VIFMap, a.Options)
	if err != nil {
		return err
	}
	cp.rp.close()
	return nil
}

// crossStream is a migration stream to the other pool's destination
// host, past the destination's ready.
type crossStream struct {
	*outStream
	hdr   crossHeader // the header sent
	ready crossReply
	moves []diskMove // the plan's, with the destination's VDIs and export tokens
}

// crossOpen opens o's migration stream to the other pool's destination
// host, sends the header (the VM's records, power its power state) and
// waits for ready: the new VM there, and a VDI and export per disk. A
// failure is crossFailed's.
func (m *Manager) crossOpen(o *opCtx, cp *crossPlan, power string, options map[string]string) (*crossStream, error) {
	rp := cp.rp
	addr, err := rp.hostAddr(o.ctx)
	if err != nil {
		return nil, err
	}
	out, err := m.openStream(o, rp.host, func(ctx context.Context) (net.Conn, error) { return rp.dialMigrate(ctx, addr) })
	if err != nil {
		return nil, err
	}
	xs := &crossStream{outStream: out, hdr: crossHeader{migrateHeader: migrateHeader{Version: migrateVersion,
		VM: o.vm, UUID: o.uuid, Source: newToken(), Dest: rp.host, Power: power, Options: options}, Import: cp.imp}}
	failed := func(err error) (*crossStream, error) {
		err = m.crossFailed(o, rp, err)
		out.close()
		return nil, err
	}
	if err := out.mc.send(xs.hdr, migrateMsgTimeout); err != nil {
		return failed(err)
	}
	if err := out.mc.recv(&xs.ready, migratePrepTimeout); err != nil {
		return failed(err)
	}
	if xs.ready.Step == stepFailed {
		return failed(xs.ready.asError())
	}
	if xs.ready.Step != stepReady || !schema.IsRef(xs.ready.NewVM) || len(xs.ready.Disks) != len(cp.moves) {
		return failed(xerr.New(xerr.InternalError, "migration: an unexpected answer from the destination"))
	}
	xs.moves = append([]diskMove(nil), cp.moves...)
	for i := range xs.moves {
		xs.moves[i].New, xs.moves[i].Token = xs.ready.Disks[i].New, xs.ready.Disks[i].Token
	}
	return xs, nil
}

// crossFailed is the error of a cross-pool migration that failed before
// its commit (the task's cancellation when that ended it), once the
// other pool is asked to destroy a VM left behind.
func (m *Manager) crossFailed(o *opCtx, rp *remotePool, err error) error {
	if o.ctx.Err() != nil {
		err = cancelledErr(o.task)
	}
	m.cleanRemote(o.ctx, rp, o.uuid)
	return m.migrateFailed(o, rp.host, err)
}

// crossCopyOut sends a halted VM to the other pool: its records, then
// its disks copied into the new VDIs there; it returns the VM's ref
// there.
func (m *Manager) crossCopyOut(o *opCtx, cp *crossPlan, options map[string]string) (string, error) {
	rp := cp.rp
	if _, ok := m.disks.(DiskMover); !ok && len(cp.moves) > 0 {
		return "", xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "this host's storage cannot serve copies")
	}
	xs, err := m.crossOpen(o, cp, psHalted, options)
	if err != nil {
		return "", err
	}
	defer xs.close()
	mc := xs.mc
	failed := func(err error) (string, error) { return "", m.crossFailed(o, rp, err) }
	o.prog.Progress(0.05)
	th := xs.hdr.migrateHeader
	th.VM = xs.ready.NewVM
	if err := m.copyMovedDisks(o, rp.host, th, xs.moves, xs.dial, 0.05, 0.95); err != nil {
		return failed(err)
	}
	if !xs.unhook() {
		return failed(context.Canceled)
	}
	// The commit point: go; the destination keeps the VM.
	_ = mc.c.SetDeadline(time.Time{})
	err = mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout)
	if err == nil {
		_, err = mc.recvMsg(stepDone, migrateMsgTimeout)
	}
	if err != nil {
		if kept, known := m.remoteKept(o.ctx, rp, xs.ready.NewVM); !known || !kept {
			return failed(xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination pool did not confirm the move"))
		}
	}
	m.log.Info("halted VM moved to another pool", "vm", o.uuid, "dest", rp.host, "disks", len(cp.moves))
	return xs.ready.NewVM, nil
}

// remoteKept asks the other pool whether a halted VM it imported is
// kept (its migration mark cleared) or dropped.
func (m *Manager) remoteKept(ctx context.Context, rp *remotePool, newVM string) (kept, known bool) {
	bg := context.WithoutCancel(ctx)
	deadline := time.Now().Add(migrateGoTimeout)
	for time.Now().Before(deadline) {
		raw, err := rp.call(bg, "VM.get_current_operations", newVM)
		if xerr.HasCode(err, xerr.HandleInvalid) {
			return false, true
		}
		var ops map[string]string
		if err == nil && json.Unmarshal(raw, &ops) == nil && len(ops) == 0 {
			return true, true
		}
		time.Sleep(time.Second)
	}
	return false, false
}
