package xenops

import (
	"context"
	"os"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// VM.clone, copy, snapshot, checkpoint and destroy (provision is in
// provision.go): the VM's record and devices copied or removed, its disks
// copied through storage (DiskResolver as VDICopier, else
// VDI.clone/snapshot/copy over the XenAPI). A VM without disks (a
// template) needs no storage at all.

type copySpec struct {
	kind       string // CopyClone, CopyFull or CopySnapshot
	name       string
	sr         string             // CopyFull destination, or null
	ignore     map[string]bool    // VDIs left out of a snapshot
	power      string             // the new VM's power state
	suspendVDI string             // its memory image (checkpoint)
	uuid       string             // its uuid, when chosen beforehand
	extra      func(*db.Tx) error // more writes in the same transaction
	// afterDisks, when set, runs once the disks are copied and before
	// the records are made, and names the new VM's memory image (a
	// checkpoint saves the memory there: disks first, while the guest
	// is paused and its disks still active in the emulator).
	afterDisks func() (suspendVDI string, err error)
}

func (m *Manager) vmClone(c *api.Call, a dm.VMCloneArgs) (dm.VMRef, error) {
	return m.copyCall(c, a.VM, dm.VMOperationsClone, copySpec{kind: CopyClone, name: a.NewName})
}

func (m *Manager) vmCopy(c *api.Call, a dm.VMCopyArgs) (dm.VMRef, error) {
	sr := string(a.SR)
	if sr != "" && sr != schema.NullRef {
		if _, err := c.Lookup(dm.SR.Class, sr); err != nil {
			return "", err
		}
	}
	return m.copyCall(c, a.VM, dm.VMOperationsCopy, copySpec{kind: CopyFull, name: a.NewName, sr: sr})
}

func (m *Manager) vmSnapshot(c *api.Call, a dm.VMSnapshotArgs) (dm.VMRef, error) {
	ignore := map[string]bool{}
	for _, v := range a.IgnoreVDIs {
		ignore[string(v)] = true
	}
	return m.copyCall(c, a.VM, dm.VMOperationsSnapshot, copySpec{kind: CopySnapshot, name: a.NewName, ignore: ignore})
}

func (m *Manager) copyCall(c *api.Call, vm dm.VMRef, o op, spec copySpec) (dm.VMRef, error) {
	row, err := c.Lookup(dm.VM.Class, string(vm))
	if err != nil {
		return "", err
	}
	spec.power = psHalted
	if row.String(dm.VM.PowerState) == psSuspended && o != dm.VMOperationsSnapshot {
		spec.power = psSuspended // only snapshots may be copied suspended
	}
	var out string
	err = m.withVMOpQ(c, row.Ref, o, false, func(oc *opCtx) error {
		if spec.power == psSuspended {
			img, err := m.copySuspendImage(oc, c, row, &spec)
			if err != nil {
				return err
			}
			defer func() {
				if out == "" {
					img.discard(m)
				}
			}()
		}
		ref, err := m.copyVM(oc, c, row.Ref, spec)
		out = ref
		return err
	})
	if err != nil {
		return "", err
	}
	return dm.VMRef(out), nil
}

// copySuspendImage copies a suspended snapshot's memory image for its copy.
func (m *Manager) copySuspendImage(o *opCtx, c *api.Call, vm *db.Row, spec *copySpec) (*suspendImage, error) {
	spec.uuid = uuid.NewString()
	img := &suspendImage{vdi: schema.NullRef}
	err := o.run("copy-suspend-image", func(ctx context.Context) error {
		vdi := vm.String(dm.VM.SuspendVDI)
		if store, ok := m.disks.(SuspendStore); ok && vdi != "" && vdi != schema.NullRef {
			// A suspend VDI of the copy's own, made out to it.
			sr := schema.NullRef
			if spec.kind == CopyFull && spec.sr != "" {
				sr = spec.sr
			}
			nv, err := store.CopySuspendVDI(ctx, vdi, spec.uuid, sr)
			if err != nil {
				return err
			}
			img.vdi, spec.suspendVDI = nv, nv
			return nil
		}
		if vdi != "" && vdi != schema.NullRef {
			nv, err := m.copyVDI(ctx, c, vdi, CopyFull, schema.NullRef)
			img.vdi, spec.suspendVDI = nv, nv
			return err
		}
		spec.suspendVDI = schema.NullRef
		from, err := m.suspendPath(vm.UUID())
		if err != nil {
			return err
		}
		if img.path, err = m.suspendPath(spec.uuid); err != nil {
			return err
		}
		return backend.CopyFile(from, img.path)
	})
	return img, err
}

// copyVDI copies one VDI as a clone, snapshot or full copy.
func (m *Manager) copyVDI(ctx context.Context, c *api.Call, vdi, kind, sr string) (string, error) {
	if cp, ok := m.disks.(VDICopier); ok {
		return cp.CopyVDI(ctx, vdi, kind, sr)
	}
	if c == nil || c.Session == nil || c.Session.Ref == "" {
		return "", xerr.New(xerr.OperationNotAllowed, "copying disks needs a XenAPI session")
	}
	var ref dm.VDIRef
	var err error
	as := c.Caller()
	switch kind {
	case CopyClone:
		ref, err = (&dm.VDICloneArgs{VDI: dm.VDIRef(vdi), DriverParams: map[string]string{}}).Call(ctx, as)
	case CopySnapshot:
		ref, err = (&dm.VDISnapshotArgs{VDI: dm.VDIRef(vdi), DriverParams: map[string]string{}}).Call(ctx, as)
	default:
		if sr == "" || sr == schema.NullRef {
			if row, ok := m.db.Snapshot().Get(dm.VDI.Class, vdi); ok {
				sr = row.String(dm.VDI.SR)
			}
		}
		ref, err = (&dm.VDICopyArgs{VDI: dm.VDIRef(vdi), SR: dm.SRRef(sr)}).Call(ctx, as)
	}
	if err != nil {
		return "", err
	}
	if ref == "" || ref == schema.NullRef {
		return "", xerr.New(xerr.InternalError, "storage returned no VDI for "+kind)
	}
	return string(ref), nil
}

func (m *Manager) destroyVDI(ctx context.Context, c *api.Call, vdi string) {
	if c == nil || c.Session == nil || c.Session.Ref == "" {
		return
	}
	if _, _, err := m.srv.Invoke(context.WithoutCancel(ctx), c.Session.Ref, "VDI.destroy", vdi); err != nil {
		m.log.Warn("removing a VDI made by a failed copy", "vdi", vdi, "err", err)
	}
}

// copyVM makes the new VM: disks first, then every record in one
// transaction. The disks copied are destroyed again when it fails.
func (m *Manager) copyVM(o *opCtx, c *api.Call, srcRef string, spec copySpec) (newRef string, err error) {
	var created []string
	defer func() {
		if err != nil {
			for _, v := range created {
				m.destroyVDI(o.ctx, c, v)
			}
		}
	}()
	vbds, err := m.copyDisks(o, c, srcRef, spec, &created)
	if err != nil {
		return "", err
	}
	if spec.afterDisks != nil {
		if spec.suspendVDI, err = spec.afterDisks(); err != nil {
			return "", err
		}
	}
	err = o.run("records", func(ctx context.Context) error {
		_, err := m.db.Update(func(tx *db.Tx) error {
			newRef, err = m.insertVMCopy(tx, srcRef, spec, vbds)
			return err
		})
		return err
	})
	if err != nil {
		return "", err // the transaction left nothing behind
	}
	return newRef, nil
}

// vbdCopy is a source VBD and the VDI its copy gets.
type vbdCopy struct {
	row *db.Row
	vdi string
}

// copyDisks copies the disks of the source VM's VBDs, one step each, as
// spec.kind says: CDs, empty drives and VBDs whose VDI is gone keep their
// VDI, and the VDIs in spec.ignore are left out with their VBDs. Each new
// VDI is added to created as soon as it exists.
func (m *Manager) copyDisks(o *opCtx, c *api.Call, srcRef string, spec copySpec, created *[]string) ([]vbdCopy, error) {
	snap := m.db.Snapshot()
	src, ok := snap.Get(dm.VM.Class, srcRef)
	if !ok {
		return nil, xerr.New(xerr.HandleInvalid, "VM", srcRef)
	}
	var vbds []vbdCopy
	srcVBDs := strs(snap.Value(src, dm.VM.VBDs))
	o.window(0, 1, len(srcVBDs)+1)
	for _, ref := range srcVBDs {
		row, ok := snap.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		vdi := row.String(dm.VBD.VDI)
		if spec.ignore[vdi] {
			continue
		}
		newVDI := vdi
		_, vdiOK := snap.Get(dm.VDI.Class, vdi)
		if row.Get(dm.VBD.Empty) != true && row.String(dm.VBD.Type) != string(dm.VBDTypeCD) && vdiOK {
			if err := o.run("copy-vdi:"+row.String(dm.VBD.Userdevice), func(ctx context.Context) error {
				nv, err := m.copyVDI(ctx, c, vdi, spec.kind, spec.sr)
				if err != nil {
					return err
				}
				*created = append(*created, nv)
				newVDI = nv
				return nil
			}); err != nil {
				return nil, err
			}
		}
		vbds = append(vbds, vbdCopy{row, newVDI})
	}
	return vbds, nil
}

// insertVMCopy writes the new VM, its VBDs (on the VDIs copyDisks chose)
// and its VIFs, and returns the new VM's ref.
func (m *Manager) insertVMCopy(tx *db.Tx, srcRef string, spec copySpec, vbds []vbdCopy) (string, error) {
	src, ok := tx.Get(dm.VM.Class, srcRef)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VM", srcRef)
	}
	now := time.Now().UTC()
	metrics, err := m.newMetrics(tx, now)
	if err != nil {
		return "", err
	}
	newRef, err := tx.Insert(dm.VM.Class, "", vmCopyValues(src, spec, metrics, now))
	if err != nil {
		return "", err
	}
	snapshot := spec.kind == CopySnapshot
	if snapshot {
		if err := tx.Set(dm.VM.Parent, srcRef, newRef); err != nil {
			return "", err
		}
	}
	for _, v := range vbds {
		vals := v.row.Stored()
		vals[dm.VBD.UUID.Index] = ""
		vals[dm.VBD.VM.Index] = newRef
		vals[dm.VBD.VDI.Index] = v.vdi
		vbdRuntime.clear(vals)
		if _, err := tx.Insert(dm.VBD.Class, "", vals); err != nil {
			return "", err
		}
	}
	for _, ref := range strs(tx.Value(src, dm.VM.VIFs)) {
		row, ok := tx.Get(dm.VIF.Class, ref)
		if !ok {
			continue
		}
		vals := row.Stored()
		vifUUID := uuid.NewString()
		vals[dm.VIF.UUID.Index] = vifUUID
		vals[dm.VIF.VM.Index] = newRef
		if !snapshot && (row.Get(dm.VIF.MACAutogenerated) == true || row.String(dm.VIF.MAC) == "") {
			vals[dm.VIF.MAC.Index] = macFor(vifUUID)
		}
		vifRuntime.clear(vals)
		if _, err := tx.Insert(dm.VIF.Class, "", vals); err != nil {
			return "", err
		}
	}
	if spec.extra != nil {
		if err := spec.extra(tx); err != nil {
			return "", err
		}
	}
	return newRef, refreshVM(tx, newRef)
}

// vmCopyValues is the new VM's record: the source's, with a new identity
// and name, no runtime state, and, for a snapshot, the snapshot's links.
func vmCopyValues(src *db.Row, spec copySpec, metrics string, now time.Time) []any {
	vals := src.Stored()
	set := func(f *schema.Field, v any) { vals[f.Index] = v }
	id := spec.uuid
	if id == "" {
		id = uuid.NewString()
	}
	oc := map[string]string{}
	if x, ok := src.Get(dm.VM.OtherConfig).(map[string]string); ok {
		for k, v := range x {
			oc[k] = v
		}
	}
	delete(oc, "default_template")
	snapshot := spec.kind == CopySnapshot
	set(dm.VM.UUID, id)
	set(dm.VM.NameLabel, spec.name)
	set(dm.VM.AllowedOperations, []string{})
	set(dm.VM.CurrentOperations, map[string]string{})
	set(dm.VM.PowerState, spec.power)
	set(dm.VM.SuspendVDI, schema.NullRef)
	if spec.suspendVDI != "" {
		set(dm.VM.SuspendVDI, spec.suspendVDI)
	}
	set(dm.VM.ResidentOn, schema.NullRef)
	set(dm.VM.ScheduledToBeResidentOn, schema.NullRef)
	set(dm.VM.Domid, int64(-1))
	set(dm.VM.Metrics, metrics)
	set(dm.VM.GuestMetrics, schema.NullRef)
	set(dm.VM.IsDefaultTemplate, false)
	set(dm.VM.OtherConfig, oc)
	set(dm.VM.IsASnapshot, snapshot)
	set(dm.VM.Blobs, map[string]string{})
	set(dm.VM.RequiresReboot, false)
	set(dm.VM.Appliance, schema.NullRef)
	set(dm.VM.ProtectionPolicy, schema.NullRef)
	set(dm.VM.SnapshotSchedule, schema.NullRef)
	set(dm.VM.SnapshotInfo, map[string]string{})
	set(dm.VM.SnapshotMetadata, "")
	set(dm.VM.TransportableSnapshotID, "")
	if snapshot {
		set(dm.VM.IsATemplate, true)
		set(dm.VM.SnapshotOf, src.Ref)
		set(dm.VM.SnapshotTime, now)
		set(dm.VM.Parent, src.String(dm.VM.Parent))
	} else {
		set(dm.VM.SnapshotOf, schema.NullRef)
		set(dm.VM.SnapshotTime, schema.Epoch)
		set(dm.VM.Parent, schema.NullRef)
	}
	return vals
}

// deviceRuntime names a device class's fields that hold the state of a
// plugged device rather than its configuration: a copied VBD or VIF starts
// without it.
type deviceRuntime struct {
	allowedOps, currentOps, attached, statusCode, statusDetail, runtime, metrics *schema.Field
}

var (
	vbdRuntime = deviceRuntime{dm.VBD.AllowedOperations, dm.VBD.CurrentOperations, dm.VBD.CurrentlyAttached,
		dm.VBD.StatusCode, dm.VBD.StatusDetail, dm.VBD.RuntimeProperties, dm.VBD.Metrics}
	vifRuntime = deviceRuntime{dm.VIF.AllowedOperations, dm.VIF.CurrentOperations, dm.VIF.CurrentlyAttached,
		dm.VIF.StatusCode, dm.VIF.StatusDetail, dm.VIF.RuntimeProperties, dm.VIF.Metrics}
)

// clear resets those fields in a row's values to an unplugged device's.
func (f deviceRuntime) clear(vals []any) {
	vals[f.allowedOps.Index] = []string{}
	vals[f.currentOps.Index] = map[string]string{}
	vals[f.attached.Index] = false
	vals[f.statusCode.Index] = int64(0)
	vals[f.statusDetail.Index] = ""
	vals[f.runtime.Index] = map[string]string{}
	vals[f.metrics.Index] = schema.NullRef
}

// vmCheckpoint is a snapshot with the memory: the guest is paused, its
// disks snapshotted, its memory saved into the snapshot's suspend image,
// and it runs on.
func (m *Manager) vmCheckpoint(c *api.Call, a dm.VMCheckpointArgs) (dm.VMRef, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return "", err
	}
	name := a.NewName
	var out string
	o := dm.VMOperationsCheckpoint
	err = m.withVMOp(c, row.Ref, o, m.recheck(o, func(oc *opCtx) error {
		vm, ok := m.db.Snapshot().Get(dm.VM.Class, oc.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", oc.vm)
		}
		spec := copySpec{kind: CopySnapshot, name: name, power: psSuspended}
		if vm.String(dm.VM.PowerState) == psSuspended {
			img, err := m.copySuspendImage(oc, c, vm, &spec)
			if err != nil {
				return err
			}
			ref, err := m.copyVM(oc, c, oc.vm, spec)
			if err != nil {
				img.discard(m)
				return err
			}
			out = ref
			return nil
		}
		// A running guest is paused for the whole checkpoint, so that its
		// disks and its memory are of the same instant. The disks are
		// snapshotted first, while the emulator still has them active
		// (saving the memory hands them over, as for a migration, and a
		// snapshot taken after that leaves the guest unable to take its
		// disks back); then the memory is saved, then the records made.
		wasRunning := vm.String(dm.VM.PowerState) == psRunning
		if wasRunning {
			if err := oc.run("pause", func(ctx context.Context) error { return m.be.Pause(ctx, oc.uuid) }); err != nil {
				return err
			}
		}
		spec.uuid = uuid.NewString()
		oc.window(0, 0.1, 1)
		img, err := m.newSuspendImage(oc, vm, spec.uuid)
		if err != nil {
			m.unpauseAfterCheckpoint(oc, wasRunning)
			return err
		}
		ran, saved := false, false
		spec.afterDisks = func() (string, error) {
			ran = true
			if err := m.saveMemory(oc, img, 0.4, 0.9); err != nil {
				if xerr.HasCode(err, xerr.TaskCancelled) {
					return "", err
				}
				m.log.Warn("checkpoint: saving memory", "vm", oc.uuid, "err", err)
				return "", xerr.New(xerr.VMCheckpointSuspendFailed, oc.vm)
			}
			saved = true
			img.release(m)
			return img.vdi, nil
		}
		ref, cerr := m.copyVM(oc, c, oc.vm, spec)
		if cerr != nil && (saved || !ran) {
			img.discard(m) // (a failed save discarded it already)
		}
		if !m.unpauseAfterCheckpoint(oc, wasRunning) {
			if cerr == nil {
				out = ref
			}
			return xerr.New(xerr.VMCheckpointResumeFailed, oc.vm)
		}
		if cerr != nil {
			return cerr
		}
		out = ref
		return nil
	}))
	if err != nil {
		return "", err
	}
	return dm.VMRef(out), nil
}

// unpauseAfterCheckpoint runs a guest the checkpoint paused again; false
// when it cannot.
func (m *Manager) unpauseAfterCheckpoint(oc *opCtx, wasRunning bool) bool {
	if !wasRunning {
		return true
	}
	if err := m.be.Unpause(context.WithoutCancel(oc.ctx), oc.uuid); err != nil {
		m.log.Error("checkpoint: resuming the guest", "vm", oc.uuid, "err", err)
		return false
	}
	return true
}

// createVDI asks storage for a new VDI through the XenAPI, filling the
// fields VDI.create requires that the caller left out.
func (m *Manager) createVDI(ctx context.Context, c *api.Call, rec map[string]any) (string, error) {
	if c == nil || c.Session == nil || c.Session.Ref == "" {
		return "", xerr.New(xerr.OperationNotAllowed, "creating disks needs a XenAPI session")
	}
	for _, f := range dm.VDI.Class.Fields {
		if _, given := rec[f.Name]; given || f.Derived || f.HasDefault || f.Qualifier == schema.DynamicRO || f == dm.VDI.UUID {
			continue
		}
		rec[f.Name] = f.Zero()
	}
	v, _, err := m.srv.Invoke(ctx, c.Session.Ref, "VDI.create", rec)
	if err != nil {
		return "", err
	}
	ref, _ := v.(string)
	if ref == "" {
		return "", xerr.New(xerr.InternalError, "VDI.create returned no VDI")
	}
	return ref, nil
}

// vmDestroy removes a halted or suspended VM's record and its devices'
// (not its disks: VDIs belong to storage), and its memory image.
func (m *Manager) vmDestroy(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	o := dm.VMOperationsDestroy
	return nil, m.withVMOp(c, row.Ref, o, m.recheck(o, func(oc *opCtx) error {
		vm, ok := m.db.Snapshot().Get(dm.VM.Class, oc.vm)
		if !ok {
			return nil
		}
		if info, ok := m.be.Info(oc.uuid); ok {
			m.cleanupDomain(oc.ctx, info) // a leftover; the VM is not live
		}
		if vm.String(dm.VM.PowerState) == psSuspended {
			if err := m.discardSuspendImage(oc.ctx, vm); err != nil && !os.IsNotExist(err) {
				m.log.Warn("removing suspend image", "vm", oc.uuid, "err", err)
			}
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			vm, ok := tx.Get(dm.VM.Class, oc.vm)
			if !ok {
				return nil
			}
			del := func(cls *schema.Class, refs ...string) error {
				for _, r := range refs {
					if _, ok := tx.Get(cls, r); ok {
						if err := tx.Delete(cls, r); err != nil {
							return err
						}
					}
				}
				return nil
			}
			if err := del(dm.VBD.Class, strs(tx.Value(vm, dm.VM.VBDs))...); err != nil {
				return err
			}
			if err := del(dm.VIF.Class, strs(tx.Value(vm, dm.VM.VIFs))...); err != nil {
				return err
			}
			if err := del(dm.Console.Class, strs(tx.Value(vm, dm.VM.Consoles))...); err != nil {
				return err
			}
			if err := del(dm.VMMetrics.Class, vm.String(dm.VM.Metrics)); err != nil {
				return err
			}
			if err := del(dm.VMGuestMetrics.Class, vm.String(dm.VM.GuestMetrics)); err != nil {
				return err
			}
			// Its children take its parent, as xapi rebases them, so
			// that no VM is left naming a parent that is gone.
			parent := vm.String(dm.VM.Parent)
			if _, ok := tx.Get(dm.VM.Class, parent); !ok || parent == oc.vm {
				parent = schema.NullRef
			}
			for _, child := range strs(tx.Value(vm, dm.VM.Children)) {
				if _, ok := tx.Get(dm.VM.Class, child); ok && child != oc.vm {
					if err := tx.Set(dm.VM.Parent, child, parent); err != nil {
						return err
					}
				}
			}
			return tx.Delete(dm.VM.Class, oc.vm)
		})
		if err == nil {
			m.mu.Lock()
			delete(m.restarts, oc.vm)
			m.mu.Unlock()
		}
		return err
	}))
}
