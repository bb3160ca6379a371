package xenops

import (
	"context"
	"encoding/xml"
	"os"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// VM.clone, copy, snapshot, checkpoint, provision and destroy: the VM's
// record and devices copied or removed, its disks copied through storage
// (DiskResolver as VDICopier, else VDI.clone/snapshot/copy over the
// XenAPI). A VM without disks (a template) needs no storage at all.

type copySpec struct {
	kind       string // CopyClone, CopyFull or CopySnapshot
	name       string
	sr         string             // CopyFull destination, or null
	ignore     map[string]bool    // VDIs left out of a snapshot
	power      string             // the new VM's power state
	suspendVDI string             // its memory image (checkpoint)
	uuid       string             // its uuid, when chosen beforehand
	extra      func(*db.Tx) error // more writes in the same transaction
}

func (m *Manager) vmClone(c *api.Call) (any, error) {
	return m.copyCall(c, dm.VMOperationsClone, copySpec{kind: CopyClone, name: c.String(1)})
}

func (m *Manager) vmCopy(c *api.Call) (any, error) {
	sr := c.String(2)
	if sr != "" && sr != schema.NullRef {
		if _, err := c.Row(2, dm.SR.Class); err != nil {
			return nil, err
		}
	}
	return m.copyCall(c, dm.VMOperationsCopy, copySpec{kind: CopyFull, name: c.String(1), sr: sr})
}

func (m *Manager) vmSnapshot(c *api.Call) (any, error) {
	ignore := map[string]bool{}
	if len(c.Args) > 2 {
		for _, v := range strs(c.Args[2]) {
			ignore[v] = true
		}
	}
	return m.copyCall(c, dm.VMOperationsSnapshot, copySpec{kind: CopySnapshot, name: c.String(1), ignore: ignore})
}

func (m *Manager) copyCall(c *api.Call, o op, spec copySpec) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	return out, nil
}

// copySuspendImage copies a suspended snapshot's memory image for its copy.
func (m *Manager) copySuspendImage(o *opCtx, c *api.Call, vm *db.Row, spec *copySpec) (*suspendImage, error) {
	spec.uuid = newUUID()
	img := &suspendImage{vdi: schema.NullRef}
	err := o.run("copy-suspend-image", func(ctx context.Context) error {
		vdi := vm.String(dm.VM.SuspendVDI)
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
	var v any
	var err error
	switch kind {
	case CopyClone:
		v, _, err = m.srv.Invoke(ctx, c.Session.Ref, "VDI.clone", vdi, map[string]string{})
	case CopySnapshot:
		v, _, err = m.srv.Invoke(ctx, c.Session.Ref, "VDI.snapshot", vdi, map[string]string{})
	default:
		if sr == "" || sr == schema.NullRef {
			if row, ok := m.db.Snapshot().Get(dm.VDI.Class, vdi); ok {
				sr = row.String(dm.VDI.SR)
			}
		}
		v, _, err = m.srv.Invoke(ctx, c.Session.Ref, "VDI.copy", vdi, sr)
	}
	if err != nil {
		return "", err
	}
	ref, _ := v.(string)
	if ref == "" {
		if row, ok := v.(*db.Row); ok {
			ref = row.Ref
		}
	}
	if ref == "" {
		return "", xerr.New(xerr.InternalError, "storage returned no VDI for "+kind)
	}
	return ref, nil
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
// transaction.
func (m *Manager) copyVM(o *opCtx, c *api.Call, srcRef string, spec copySpec) (newRef string, err error) {
	snap := m.db.Snapshot()
	src, ok := snap.Get(dm.VM.Class, srcRef)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VM", srcRef)
	}
	type vbdCopy struct {
		row *db.Row
		vdi string
	}
	var vbds []vbdCopy
	var created []string
	defer func() {
		if err != nil {
			for _, v := range created {
				m.destroyVDI(o.ctx, c, v)
			}
		}
	}()
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
				created = append(created, nv)
				newVDI = nv
				return nil
			}); err != nil {
				return "", err
			}
		}
		vbds = append(vbds, vbdCopy{row, newVDI})
	}
	err = o.run("records", func(ctx context.Context) error {
		_, err := m.db.Update(func(tx *db.Tx) error {
			src, ok := tx.Get(dm.VM.Class, srcRef)
			if !ok {
				return xerr.New(xerr.HandleInvalid, "VM", srcRef)
			}
			now := time.Now().UTC()
			metrics, err := m.newMetrics(tx, now)
			if err != nil {
				return err
			}
			vals := src.Stored()
			set := func(f *schema.Field, v any) { vals[f.Index] = v }
			id := spec.uuid
			if id == "" {
				id = newUUID()
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
				set(dm.VM.SnapshotOf, srcRef)
				set(dm.VM.SnapshotTime, now)
				set(dm.VM.Parent, src.String(dm.VM.Parent))
			} else {
				set(dm.VM.SnapshotOf, schema.NullRef)
				set(dm.VM.SnapshotTime, schema.Epoch)
				set(dm.VM.Parent, schema.NullRef)
			}
			newRef, err = tx.Insert(dm.VM.Class, "", vals)
			if err != nil {
				return err
			}
			if snapshot {
				if err := tx.Set(dm.VM.Parent, srcRef, newRef); err != nil {
					return err
				}
			}
			for _, v := range vbds {
				vals := v.row.Stored()
				set := func(f *schema.Field, x any) { vals[f.Index] = x }
				set(dm.VBD.UUID, "")
				set(dm.VBD.VM, newRef)
				set(dm.VBD.VDI, v.vdi)
				set(dm.VBD.AllowedOperations, []string{})
				set(dm.VBD.CurrentOperations, map[string]string{})
				set(dm.VBD.CurrentlyAttached, false)
				set(dm.VBD.StatusCode, int64(0))
				set(dm.VBD.StatusDetail, "")
				set(dm.VBD.RuntimeProperties, map[string]string{})
				set(dm.VBD.Metrics, schema.NullRef)
				if _, err := tx.Insert(dm.VBD.Class, "", vals); err != nil {
					return err
				}
			}
			for _, ref := range strs(tx.Value(src, dm.VM.VIFs)) {
				row, ok := tx.Get(dm.VIF.Class, ref)
				if !ok {
					continue
				}
				vals := row.Stored()
				set := func(f *schema.Field, x any) { vals[f.Index] = x }
				vifUUID := newUUID()
				set(dm.VIF.UUID, vifUUID)
				set(dm.VIF.VM, newRef)
				if !snapshot && (row.Get(dm.VIF.MACAutogenerated) == true || row.String(dm.VIF.MAC) == "") {
					set(dm.VIF.MAC, macFor(vifUUID))
				}
				set(dm.VIF.AllowedOperations, []string{})
				set(dm.VIF.CurrentOperations, map[string]string{})
				set(dm.VIF.CurrentlyAttached, false)
				set(dm.VIF.StatusCode, int64(0))
				set(dm.VIF.StatusDetail, "")
				set(dm.VIF.RuntimeProperties, map[string]string{})
				set(dm.VIF.Metrics, schema.NullRef)
				if _, err := tx.Insert(dm.VIF.Class, "", vals); err != nil {
					return err
				}
			}
			if spec.extra != nil {
				if err := spec.extra(tx); err != nil {
					return err
				}
			}
			return refreshVM(tx, newRef)
		})
		return err
	})
	return newRef, err
}

// vmCheckpoint is a snapshot with the memory: the guest is paused, its
// memory saved into the snapshot's suspend image, its disks snapshotted,
// and it runs on.
func (m *Manager) vmCheckpoint(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	name := c.String(1)
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
		wasRunning := vm.String(dm.VM.PowerState) == psRunning
		spec.uuid = newUUID()
		oc.window(0, 0.1, 1)
		img, err := m.newSuspendImage(oc, vm, spec.uuid)
		if err != nil {
			return err
		}
		oc.window(0.1, 0.7, 1)
		if err := oc.run("save-memory", func(ctx context.Context) error {
			return m.be.Suspend(ctx, oc.uuid, img.path, func(f float64) { oc.prog.set(0.1 + 0.6*f) })
		}); err != nil {
			img.discard(m)
			if xerr.HasCode(err, xerr.TaskCancelled) {
				return err
			}
			m.log.Warn("checkpoint: saving memory", "vm", oc.uuid, "err", err)
			return xerr.New(xerr.VMCheckpointSuspendFailed, oc.vm)
		}
		img.release(m)
		spec.suspendVDI = img.vdi
		ref, cerr := m.copyVM(oc, c, oc.vm, spec)
		if wasRunning {
			if err := m.be.Unpause(context.WithoutCancel(oc.ctx), oc.uuid); err != nil {
				m.log.Error("checkpoint: resuming the guest", "vm", oc.uuid, "err", err)
				if cerr == nil {
					out = ref
				}
				return xerr.New(xerr.VMCheckpointResumeFailed, oc.vm)
			}
		}
		if cerr != nil {
			img.discard(m)
			return cerr
		}
		out = ref
		return nil
	}))
	if err != nil {
		return nil, err
	}
	return out, nil
}

// provisionSpec is the template's other_config:disks.
type provisionSpec struct {
	XMLName xml.Name `xml:"provision"`
	Disks   []struct {
		Device   string `xml:"device,attr"`
		Size     string `xml:"size,attr"`
		SR       string `xml:"sr,attr"`
		Bootable string `xml:"bootable,attr"`
		Type     string `xml:"type,attr"`
	} `xml:"disk"`
}

// vmProvision turns a template copy into a VM: it creates the disks the
// template's other_config:disks describes and clears is_a_template.
func (m *Manager) vmProvision(c *api.Call) (any, error) {
	row, err := c.Row(0, dm.VM.Class)
	if err != nil {
		return nil, err
	}
	o := dm.VMOperationsProvision
	return nil, m.withVMOpQ(c, row.Ref, o, false, func(oc *opCtx) error {
		snap := m.db.Snapshot()
		vm, ok := snap.Get(dm.VM.Class, oc.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", oc.vm)
		}
		other, _ := vm.Get(dm.VM.OtherConfig).(map[string]string)
		var spec provisionSpec
		if s := strings.TrimSpace(other["disks"]); s != "" {
			if err := xml.Unmarshal([]byte(s), &spec); err != nil {
				return xerr.New(xerr.InvalidValue, "other_config:disks", s)
			}
		}
		type newDisk struct {
			vdi, device string
			bootable    bool
		}
		var disks []newDisk
		ok = false
		defer func() {
			if !ok {
				for _, d := range disks {
					m.destroyVDI(oc.ctx, c, d.vdi)
				}
			}
		}()
		oc.window(0, 1, len(spec.Disks)+1)
		for _, d := range spec.Disks {
			if err := oc.run("create-disk:"+d.Device, func(ctx context.Context) error {
				sr, err := m.provisionSR(snap, d.SR)
				if err != nil {
					return err
				}
				size, err := strconv.ParseInt(d.Size, 10, 64)
				if err != nil || size <= 0 {
					return xerr.New(xerr.InvalidValue, "size", d.Size)
				}
				typ := d.Type
				if typ == "" {
					typ = "user"
				}
				vdi, err := m.createVDI(ctx, c, map[string]any{
					"name_label": vm.String(dm.VM.NameLabel) + " " + d.Device, "name_description": "Created by template provisioner",
					"SR": sr, "virtual_size": size, "type": typ,
				})
				if err != nil {
					return err
				}
				disks = append(disks, newDisk{vdi, d.Device, d.Bootable == "true"})
				return nil
			}); err != nil {
				return err
			}
		}
		err := oc.run("records", func(ctx context.Context) error {
			_, err := m.db.Update(func(tx *db.Tx) error {
				for _, d := range disks {
					rec := &dm.VBDRecord{VM: dm.VMRef(oc.vm), VDI: dm.VDIRef(d.vdi), Userdevice: d.device, Bootable: d.bootable,
						Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk, Unpluggable: true, OtherConfig: map[string]string{"owner": "true"},
						QosAlgorithmParams: map[string]string{}, RuntimeProperties: map[string]string{}, CurrentOperations: map[string]dm.VBDOperations{}}
					if _, err := tx.Insert(dm.VBD.Class, "", rec.Row()); err != nil {
						return err
					}
				}
				if err := tx.RemoveFromMap(dm.VM.OtherConfig, oc.vm, "disks"); err != nil {
					return err
				}
				if err := tx.Set(dm.VM.IsATemplate, oc.vm, false); err != nil {
					return err
				}
				vm, _ := tx.Get(dm.VM.Class, oc.vm)
				if mr := vm.String(dm.VM.Metrics); mr != "" {
					if _, ok := tx.Get(dm.VMMetrics.Class, mr); ok {
						return tx.Set(dm.VMMetrics.InstallTime, mr, time.Now().UTC())
					}
				}
				mr, err := m.newMetrics(tx, time.Now().UTC())
				if err != nil {
					return err
				}
				return tx.Set(dm.VM.Metrics, oc.vm, mr)
			})
			return err
		})
		if err == nil {
			ok = true
		}
		return err
	})
}

func (m *Manager) provisionSR(r db.Reader, uuid string) (string, error) {
	if uuid != "" {
		row, ok := r.ByUUID(dm.SR.Class, uuid)
		if !ok {
			return "", xerr.New(xerr.UUIDInvalid, "SR", uuid)
		}
		return row.Ref, nil
	}
	if pools := r.All(dm.Pool.Class); len(pools) > 0 { // the one pool
		sr := pools[0].String(dm.Pool.DefaultSR)
		if _, ok := r.Get(dm.SR.Class, sr); ok {
			return sr, nil
		}
		return "", xerr.New(xerr.DefaultSRNotFound, sr)
	}
	return "", xerr.New(xerr.DefaultSRNotFound, schema.NullRef)
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
