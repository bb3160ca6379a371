package xenops

import (
	"context"
	"errors"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// VDI.pool_migrate: a disk of a running VM moves to another SR of the
// VM's host while the guest keeps using it (xapi's "live VDI migration",
// which xapi runs as a storage migration of the VM to its own host).
//
// The call runs on the VM's host (route vm_resident), marked mirror on
// the VDI and migrate_send on the VM, on the VM's queue, in these steps:
//
//  1. checks, as xapi makes them: the VDI has a VBD
//     (VDI_NEEDS_VM_FOR_MIGRATE), is no CBT metadata
//     (VDI_INCOMPATIBLE_TYPE), has CBT off (VDI_CBT_ENABLED), is not
//     encrypted (VDI_IS_ENCRYPTED) nor reset on boot
//     (VDI_ON_BOOT_MODE_INCOMPATIBLE_WITH_OPERATION); its VM runs here
//     (VM_BAD_POWER_STATE, VM_NOT_RESIDENT_HERE); the SR is plugged on
//     this host (VM_REQUIRES_SR). Ours besides (OPERATION_NOT_ALLOWED):
//     the VBD is a read-write disk (xapi copies CDs and read-only disks
//     rather than mirroring them) and plugged. A VDI already on the SR
//     is returned as it is, as xapi leaves such a VDI where it is.
//  2. the VDI's snapshots move with it, as xapi's storage migration
//     moves a disk's snapshots: copied to the SR oldest first as a
//     chain (storagechain.go: the oldest whole into a new VDI, each
//     later one as what changed since, written into a clone of the one
//     before), through storage's exports on this host;
//     then a new VDI on the SR through storage (VDI.create as the
//     caller: the same virtual size, type and sharing, with the old
//     one's name, description, other_config, xenstore_data and tags; or,
//     where the disk reads as its newest snapshot with its own top over
//     it, a clone of that snapshot's copy, which the mirror then fills
//     with the top alone), attached for the VM as its disks are
//     (DiskResolver.Attach);
//  3. the mirror (backend.DiskMirrorer): the domain's disk is copied
//     into the new VDI while the guest writes to both, the task's
//     progress following the copy; the target is the image as storage
//     attached it, opened by the emulator itself (an NBD datapath is
//     mirrored over NBD), so that the domain never depends on a
//     process of the daemon's for its disk;
//  4. the pivot (CompleteMirror with pivot): from now on the domain
//     reads and writes the new VDI and the backend records it as the
//     disk (a restarted daemon sees it so);
//  5. the record: VBD.VDI names the new VDI, the snapshots' VBDs their
//     copies, which take the old VDIs' names and snapshot fields (one
//     database write); the old VDIs are detached and destroyed
//     (VDI.destroy as the caller).
//
// Before the pivot, a failure or task.cancel cancels the mirror and
// destroys the new VDIs: the guest runs on the old one as if nothing
// happened. From the pivot on the move is done; an old VDI that cannot
// be destroyed is logged and left (the call still returns the new VDI).
//
// Options: xapi's "dest-img-format" is not used (the SR's driver picks
// its format); other keys are ignored. Tuning: the VM's
// other_config:migration_bandwidth (bytes per second), which holds a
// pool migration's stream, caps the mirror's bulk copy too.

func (m *Manager) registerVDIMigrate() { api.Register(m.srv, m.vdiPoolMigrate) }

// vdiMove is what a VDI.pool_migrate works on, once checked.
type vdiMove struct {
	vdi, sr   string // the VDI and the SR it goes to
	vbd, vm   string
	device    string
	virtual   int64
	alreadyOn bool // the VDI is on the SR already
	vdiRecord *db.Row
}

// vdiPivotTimeout bounds the pivot and the record, which are not
// cancelled with the task: the move must not stop half-way.
const vdiPivotTimeout = 2 * time.Minute

// vdiPoolMigrate is VDI.pool_migrate on the host of the VDI's VM.
func (m *Manager) vdiPoolMigrate(c *api.Call, a dm.VDIPoolMigrateArgs) (dm.VDIRef, error) {
	vdi, err := c.Lookup(dm.VDI.Class, string(a.VDI))
	if err != nil {
		return "", err
	}
	if _, err := c.Lookup(dm.SR.Class, string(a.SR)); err != nil {
		return "", err
	}
	mv, err := m.checkVDIMove(c.Snapshot(), vdi, string(a.SR))
	if err != nil {
		return "", err
	}
	if mv.alreadyOn {
		return a.VDI, nil
	}
	unmark, err := m.markVDIMirror(c, vdi.Ref)
	if err != nil {
		return "", err
	}
	defer unmark()
	var out string
	o := dm.VMOperationsMigrateSend
	err = m.withVMOp(c, mv.vm, o, m.recheck(o, func(oc *opCtx) error {
		// Checked again on the queue: what ran before may have changed
		// the VM or the disk.
		row, ok := m.db.Snapshot().Get(dm.VDI.Class, mv.vdi)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VDI", mv.vdi)
		}
		again, err := m.checkVDIMove(m.db.Snapshot(), row, mv.sr)
		if err != nil {
			return err
		}
		if again.alreadyOn {
			out = mv.vdi
			return nil
		}
		out, err = m.moveVDI(oc, c, again, unmark)
		return err
	}))
	if err != nil {
		return "", err
	}
	return dm.VDIRef(out), nil
}

// checkVDIMove makes the checks of step 1.
func (m *Manager) checkVDIMove(r db.Reader, vdi *db.Row, sr string) (vdiMove, error) {
	vbds := strs(r.Value(vdi, dm.VDI.VBDs))
	if len(vbds) == 0 {
		return vdiMove{}, xerr.New(xerr.VDINeedsVMForMigrate, vdi.Ref)
	}
	if dm.VDIType(vdi.String(dm.VDI.Type)) == dm.VDITypeCbtMetadata {
		return vdiMove{}, xerr.New(xerr.VDIIncompatibleType, vdi.Ref, string(dm.VDITypeCbtMetadata))
	}
	if vdi.Get(dm.VDI.CbtEnabled) == true {
		return vdiMove{}, xerr.New(xerr.VDICBTEnabled, vdi.Ref)
	}
	if smc, _ := vdi.Get(dm.VDI.SMConfig).(map[string]string); smc["key_hash"] != "" {
		return vdiMove{}, xerr.New(xerr.VDIIsEncrypted, vdi.Ref)
	}
	vbd, ok := r.Get(dm.VBD.Class, vbds[0])
	if !ok {
		return vdiMove{}, xerr.New(xerr.VBDMissing)
	}
	vm, ok := r.Get(dm.VM.Class, vbd.String(dm.VBD.VM))
	if !ok {
		return vdiMove{}, xerr.New(xerr.VBDMissing)
	}
	if p := vm.String(dm.VM.PowerState); p != psRunning {
		return vdiMove{}, xerr.New(xerr.VMBadPowerState, vm.Ref, powerName(psRunning), powerName(p))
	}
	if h := vm.String(dm.VM.ResidentOn); h != m.host {
		return vdiMove{}, xerr.New(xerr.VMNotResidentHere, vm.Ref, m.host)
	}
	if dm.OnBoot(vdi.String(dm.VDI.OnBoot)) == dm.OnBootReset {
		return vdiMove{}, xerr.New(xerr.VDIOnBootModeIncompatibleWithOperation)
	}
	mv := vdiMove{vdi: vdi.Ref, sr: sr, vbd: vbd.Ref, vm: vm.Ref, device: vbd.String(dm.VBD.Userdevice), vdiRecord: vdi}
	mv.virtual, _ = vdi.Get(dm.VDI.VirtualSize).(int64)
	if vdi.String(dm.VDI.SR) == sr {
		mv.alreadyOn = true
		return mv, nil
	}
	switch {
	case dm.VBDType(vbd.String(dm.VBD.Type)) == dm.VBDTypeCD:
		return vdiMove{}, xerr.New(xerr.OperationNotAllowed, "VDI.pool_migrate moves disks; VBD "+vbd.Ref+" is a CD drive")
	case dm.VBDMode(vbd.String(dm.VBD.Mode)) != dm.VBDModeRW:
		return vdiMove{}, xerr.New(xerr.OperationNotAllowed, "VDI.pool_migrate mirrors disks the VM writes; VBD "+vbd.Ref+" is read-only")
	case vbd.Get(dm.VBD.CurrentlyAttached) != true:
		return vdiMove{}, xerr.New(xerr.OperationNotAllowed, "VBD "+vbd.Ref+" is not plugged; VDI.pool_migrate mirrors a disk the VM uses")
	}
	if !hostSeesSR(r, m.host, sr) {
		return vdiMove{}, xerr.New(xerr.VMRequiresSR, vm.Ref, sr)
	}
	return mv, nil
}

// markVDIMirror puts mirror in the VDI's current_operations, refusing
// (OTHER_OPERATION_IN_PROGRESS) while any operation but a copy runs on
// it, as xapi's VDI checks do. The returned function removes it; it
// may be called more than once.
func (m *Manager) markVDIMirror(c *api.Call, ref string) (func(), error) {
	key := c.Task
	if key == "" {
		key = db.NewRef()
	}
	f := dm.VDI.CurrentOperations
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VDI.Class, ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VDI", ref)
		}
		cur, _ := row.Get(f).(map[string]string)
		for k, op := range cur {
			if op != "copy" {
				return xerr.New(xerr.OtherOperationInProgress, "VDI", ref, op, k)
			}
		}
		return tx.AddToMap(f, ref, key, string(dm.VDIOperationsMirror))
	}); err != nil {
		return nil, err
	}
	return sync.OnceFunc(func() {
		if _, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VDI.Class, ref); !ok {
				return nil
			}
			return tx.RemoveFromMap(f, ref, key)
		}); err != nil {
			m.log.Error("cannot unmark a VDI's mirror", "vdi", ref, "err", err)
		}
	}), nil
}

// moveVDI runs steps 2 to 5 on the VM's queue and returns the new VDI.
func (m *Manager) moveVDI(o *opCtx, c *api.Call, mv vdiMove, unmark func()) (string, error) {
	mir, disk, err := m.mirroredDisk(o, mv)
	if err != nil {
		return "", err
	}
	bg := context.WithoutCancel(o.ctx)
	o.prog.Progress(0.01)

	// 2. The new VDI, attached for the VM.
	pivoted := false
	var made []string // the snapshots' copies
	defer func() {
		if !pivoted {
			for _, v := range made {
				m.destroyVDI(bg, c, v)
			}
		}
	}()
	chain, err := m.copyVDISnapshots(o, c, mv, &made)
	if err != nil {
		return "", vdiMoveFailed(o, mv, err)
	}
	newRef, tg, undoTarget, err := m.mirrorTarget(o, c, mv, chain)
	if err != nil {
		return "", vdiMoveFailed(o, mv, err)
	}
	chain[0].New = newRef
	defer func() {
		if !pivoted {
			undoTarget()
		}
	}()

	// 3. The mirror.
	if err := mir.StartMirror(o.ctx, o.uuid, disk.Device, tg); err != nil {
		return "", vdiMoveFailed(o, mv, err)
	}
	started := time.Now()
	defer func() {
		if pivoted {
			return
		}
		cctx, cancel := context.WithTimeout(bg, vdiPivotTimeout)
		defer cancel()
		if cerr := mir.CancelMirror(cctx, o.uuid, disk.Device); cerr != nil {
			m.log.Error("VDI.pool_migrate: cancelling the mirror", "vm", o.uuid, "device", disk.Device, "err", cerr)
		}
	}()
	if err := waitVDIMirror(o, mv, mir, disk.Device, len(chain)); err != nil {
		return "", err
	}

	// 4. The pivot: the commit point.
	pctx, cancel := context.WithTimeout(bg, vdiPivotTimeout)
	defer cancel()
	if err := mir.CompleteMirror(pctx, o.uuid, disk.Device, true); err != nil {
		return "", vdiMoveFailed(o, mv, err)
	}
	pivoted = true
	m.log.Info("VDI.pool_migrate: the disk is on its new VDI", "vm", o.uuid, "device", disk.Device,
		"vdi", newRef, "sr", mv.sr, "mirror", time.Since(started))
	if err := m.finishVDIMove(pctx, o, c, mv, chain, newRef, unmark); err != nil {
		return "", err
	}
	return newRef, nil
}

// mirroredDisk checks that the backend can mirror disks and that mv's
// VBD is plugged on mv's VDI; it returns the backend's mirrorer and the
// domain's disk.
func (m *Manager) mirroredDisk(o *opCtx, mv vdiMove) (backend.DiskMirrorer, backend.Disk, error) {
	mir, ok := m.be.(backend.DiskMirrorer)
	if !ok {
		return nil, backend.Disk{}, xerr.New(xerr.OperationNotAllowed, "the "+m.be.Name()+" backend cannot mirror disks")
	}
	disk, ok := m.attachedDisk(o.uuid, mv.vbd)
	if !ok || disk.VDI != mv.vdi {
		return nil, backend.Disk{}, xerr.New(xerr.OperationNotAllowed, "VBD "+mv.vbd+" is not plugged; VDI.pool_migrate mirrors a disk the VM uses")
	}
	return mir, disk, nil
}

// vdiMoveFailed is the error of a VDI.pool_migrate of mv that failed
// with err before its pivot: the task's cancellation, an API error as it
// is, else MIRROR_FAILED.
func vdiMoveFailed(o *opCtx, mv vdiMove, err error) error {
	if o.ctx.Err() != nil {
		return cancelledErr(o.task)
	}
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return xe
	}
	return xerr.New(xerr.MirrorFailed, mv.vdi)
}

// waitVDIMirror waits for the mirror of the VM's disk device to be in
// step, progress going to 0.95 from after the copies of the chainLen-1
// snapshots' disks.
func waitVDIMirror(o *opCtx, mv vdiMove, mir backend.DiskMirrorer, device string, chainLen int) error {
	lo := 0.02 // after the snapshots' copies (copyVDISnapshots: up to 0.31)
	if chainLen > 1 {
		lo = 0.32
	}
	if err := mir.WaitMirrorReady(o.ctx, o.uuid, device, func(p float64) { o.prog.Progress(lo + (0.95-lo)*p) }); err != nil {
		return vdiMoveFailed(o, mv, err)
	}
	if o.ctx.Err() != nil {
		return cancelledErr(o.task)
	}
	return nil
}

// finishVDIMove is step 5, once the disk is on its new VDI: the move is
// recorded (newRef the new VDI), the old VDI detached and unmarked, and
// the old chain destroyed (a failure there is logged).
func (m *Manager) finishVDIMove(pctx context.Context, o *opCtx, c *api.Call, mv vdiMove, chain []diskMove, newRef string, unmark func()) error {
	if err := m.recordVDIMove(mv, chain); err != nil {
		m.log.Error("VDI.pool_migrate: the domain uses the new VDI but the VBD cannot be recorded", "vbd", mv.vbd, "vdi", newRef, "err", err)
		return err
	}
	o.prog.Progress(0.97)
	if err := m.disks.Detach(pctx, o.uuid, mv.vdi); err != nil {
		m.log.Warn("VDI.pool_migrate: detaching the old VDI", "vdi", mv.vdi, "err", err)
	}
	unmark()
	if c.Session != nil && c.Session.Ref != "" {
		for _, x := range chain {
			if _, _, err := m.srv.Invoke(pctx, c.Session.Ref, "VDI.destroy", x.VDI); err != nil {
				m.log.Warn("VDI.pool_migrate: an old VDI is left", "vdi", x.VDI, "err", err)
			}
		}
	}
	o.prog.Progress(1)
	return nil
}

// mirrorTarget makes the VDI the disk chain[0] is mirrored to, attached
// for the VM: a clone of the newest snapshot's copy when the chain has
// one (only the top is mirrored then), else a new VDI. undo detaches and
// destroys it.
func (m *Manager) mirrorTarget(o *opCtx, c *api.Call, mv vdiMove, chain []diskMove) (string, backend.MirrorTarget, func(), error) {
	bg := context.WithoutCancel(o.ctx)
	var newRef string
	var err error
	tg := backend.MirrorTarget{}
	if j := baseOf(chain, chain[0]); j >= 0 {
		newRef, err = m.cloneSized(o.ctx, callerInvoker(m, c), chain[j].New, mv.virtual)
		tg.Sync = backend.MirrorTop
	} else {
		newRef, err = m.createVDI(o.ctx, c, newVDIRecord(mv))
	}
	if err != nil {
		if newRef != "" {
			m.destroyVDI(bg, c, newRef)
		}
		return "", tg, nil, err
	}
	src, err := m.disks.Attach(o.ctx, o.uuid, newRef, false)
	if err != nil {
		m.destroyVDI(bg, c, newRef)
		return "", tg, nil, err
	}
	undo := func() {
		if derr := m.disks.Detach(bg, o.uuid, newRef); derr != nil {
			m.log.Warn("VDI.pool_migrate: detaching the new VDI", "vdi", newRef, "err", derr)
		}
		m.destroyVDI(bg, c, newRef)
	}
	tg.VDI = newRef
	if vm, ok := m.db.Snapshot().Get(dm.VM.Class, mv.vm); ok {
		tg.Bandwidth = migrateOptions(vm).Bandwidth
	}
	if src.Kind == DiskNBD {
		tg.URI = src.NBDURI
	} else {
		tg.Path, tg.Format = src.Path, src.Format
	}
	return newRef, tg, undo, nil
}

// newVDIRecord is the record of the VDI a disk moves to: the old one's
// names, type and maps on the new SR, writable, with no SM data.
func newVDIRecord(mv vdiMove) map[string]any {
	old := mv.vdiRecord
	rec := map[string]any{
		"SR": mv.sr, "name_label": old.String(dm.VDI.NameLabel), "name_description": old.String(dm.VDI.NameDescription),
		"virtual_size": mv.virtual, "type": old.String(dm.VDI.Type), "sharable": old.Get(dm.VDI.Sharable) == true,
		"read_only": false, "other_config": mapOf(old.Get(dm.VDI.OtherConfig)),
		"xenstore_data": mapOf(old.Get(dm.VDI.XenstoreData)), "sm_config": map[string]string{}, "tags": old.Get(dm.VDI.Tags),
	}
	if rec["tags"] == nil {
		rec["tags"] = []string{}
	}
	return rec
}

// recordVDIMove records a pivoted move: the new VDIs take the old ones'
// fields (carryVDIFields), the VM's VBD and the VBDs of the snapshots'
// disks point at the new VDIs (chain[0] is the disk's, chain[1:] its
// snapshots').
func (m *Manager) recordVDIMove(mv vdiMove, chain []diskMove) error {
	_, err := m.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VBD.Class, mv.vbd); !ok {
			return xerr.New(xerr.HandleInvalid, "VBD", mv.vbd)
		}
		if err := carryVDIFields(tx, chain); err != nil {
			return err
		}
		for _, s := range chain[1:] {
			old, ok := tx.Get(dm.VDI.Class, s.VDI)
			if !ok {
				return xerr.New(xerr.HandleInvalid, "VDI", s.VDI)
			}
			for _, vbd := range strs(tx.Value(old, dm.VDI.VBDs)) {
				if err := tx.Set(dm.VBD.VDI, vbd, s.New); err != nil {
					return err
				}
			}
		}
		return tx.Set(dm.VBD.VDI, mv.vbd, chain[0].New)
	})
	return err
}

// mapOf is a string map field's value, never nil.
func mapOf(v any) map[string]string {
	if mm, ok := v.(map[string]string); ok && mm != nil {
		return mm
	}
	return map[string]string{}
}

// copyVDISnapshots copies mv's VDI's snapshots to mv's SR as a chain
// (step 2), each after its Base (copyOrder), and returns the moves: the
// VDI itself first, with its Base where it can be mirrored by its top
// alone onto a clone of the newest copy, then its snapshots. made gets
// each VDI made.
func (m *Manager) copyVDISnapshots(o *opCtx, c *api.Call, mv vdiMove, made *[]string) ([]diskMove, error) {
	snap := m.db.Snapshot()
	leaf := diskMove{VBD: mv.vbd, VDI: mv.vdi, SR: mv.sr}
	moves := []diskMove{leaf}
	for _, s := range strs(snap.Value(mv.vdiRecord, dm.VDI.Snapshots)) {
		// Keyed by the VDI: a snapshot's disk need not have a VBD.
		moves = append(moves, diskMove{VBD: s, VDI: s, SR: mv.sr, Copy: true})
	}
	if len(moves) == 1 {
		return moves, nil
	}
	mover, ok := m.disks.(DiskMover)
	if !ok {
		return nil, xerr.New(xerr.OperationNotAllowed, "this host's storage cannot copy the VDI's snapshots")
	}
	moves = m.chainMoves(o.ctx, snap, moves)
	n := float64(len(moves) - 1)
	order, err := copyOrder(moves)
	if err != nil {
		return nil, err
	}
	for k, i := range order {
		x := moves[i]
		old, ok := snap.Get(dm.VDI.Class, x.VDI)
		if !ok {
			return nil, xerr.New(xerr.HandleInvalid, "VDI", x.VDI)
		}
		size, _ := old.Get(dm.VDI.VirtualSize).(int64)
		var err error
		if j := baseOf(moves, x); j >= 0 {
			moves[i].New, err = m.cloneSized(o.ctx, callerInvoker(m, c), moves[j].New, size)
		} else {
			moves[i].New, err = m.createVDI(o.ctx, c, map[string]any{
				"SR": mv.sr, "name_label": old.String(dm.VDI.NameLabel), "name_description": old.String(dm.VDI.NameDescription),
				"virtual_size": size, "type": old.String(dm.VDI.Type), "sharable": false, "read_only": false,
				"other_config": mapOf(old.Get(dm.VDI.OtherConfig)), "xenstore_data": map[string]string{},
				"sm_config": map[string]string{}, "tags": []string{},
			})
		}
		if moves[i].New != "" {
			*made = append(*made, moves[i].New)
		}
		if err != nil {
			return nil, err
		}
		lo := 0.01 + 0.3*float64(k)/n
		progress := func(f float64) { o.prog.Progress(lo + 0.3/n*f) }
		if err := copyLocal(o.ctx, mover, x.VDI, moves[i].New, x.Base != "", x.diff, progress); err != nil {
			return nil, err
		}
	}
	return moves, nil
}

// copyLocal copies VDI from into VDI to, both on this host, through
// storage's exports: only the extents diff into a clone of from's base
// (based), else everything but runs of zeroes.
func copyLocal(ctx context.Context, mover DiskMover, from, to string, based bool, diff []storage.Extent, progress func(float64)) error {
	src, err := mover.ExportVDIReadOnly(ctx, from)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	dst, err := mover.ExportVDI(ctx, to)
	if err != nil {
		return err
	}
	defer func() { _ = dst.Close() }()
	if based {
		return copyExtents(ctx, src.URI(), dst.URI(), diff, progress)
	}
	return copyNBD(ctx, src.URI(), dst.URI(), progress)
}
