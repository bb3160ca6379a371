package storage

import (
	"context"
	"slices"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Operation locking, as xapi's with_vdi_marked / with_sr_marked: an
// operation is checked against those already running on the object, put
// in its current_operations under the task's ref, and the advisory
// allowed_operations is recomputed; both are undone when it ends. A
// conflicting operation waits (up to Config.OpWait, for the running one to
// finish) and then fails with OTHER_OPERATION_IN_PROGRESS.

// srExclusive are SR operations that run alone.
var srExclusive = map[string]bool{"destroy": true, "forget": true, "plug": true, "unplug": true, "pbd_create": true, "pbd_destroy": true}

func srCompatible(running, op string) bool {
	return !srExclusive[running] && !srExclusive[op]
}

// vdiShared are VDI operations that read the VDI and may overlap.
var vdiShared = map[string]bool{"copy": true, "clone": true, "snapshot": true}

func vdiCompatible(running, op string) bool {
	return vdiShared[running] && vdiShared[op]
}

func compatible(cls *schema.Class, running, op string) bool {
	if cls == dm.SR.Class {
		return srCompatible(running, op)
	}
	return vdiCompatible(running, op)
}

// opKey is the current_operations key of a call: its task, or a fresh
// ref for a synchronous call.
func opKey(c *api.Call) string {
	if c != nil && c.Task != "" {
		return c.Task
	}
	return db.NewRef()
}

type marked struct {
	cls *schema.Class
	ref string
	key string
}

// mark adds op to the current operations of each object, atomically, or
// waits for conflicting operations to finish. The returned function
// removes them again.
func (s *Service) mark(ctx context.Context, key string, objs ...marked) (func(), error) {
	objs, err := publishedMarks(objs)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(s.cfg.OpWait)
	for {
		snap := s.db.Snapshot()
		var conflict *xerr.Error
		_, err := s.db.Update(func(tx *db.Tx) error {
			for _, o := range objs {
				row, ok := tx.Get(o.cls, o.ref)
				if !ok {
					return xerr.New(xerr.HandleInvalid, o.cls.Name, o.ref)
				}
				cur, _ := row.Get(o.cls.Field("current_operations")).(map[string]string)
				for task, running := range cur {
					if !compatible(o.cls, running, o.key) {
						conflict = xerr.New(xerr.OtherOperationInProgress, o.cls.Name, o.ref, running, task)
						return conflict
					}
				}
			}
			for _, o := range objs {
				if err := tx.AddToMap(o.cls.Field("current_operations"), o.ref, key, o.key); err != nil {
					return err
				}
				if err := s.refresh(tx, o.cls, o.ref); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			return func() { s.unmark(key, objs) }, nil
		}
		if conflict == nil {
			return nil, err
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return nil, conflict
		}
		t := time.NewTimer(min(wait, 2*time.Second))
		select {
		case <-snap.Done():
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, xerr.New(xerr.TaskCancelled, "")
		}
		t.Stop()
	}
}

// srMarkAs says how an SR is marked for a VDI operation whose own name is
// no value xapi writes in SR.current_operations. A copy makes a VDI on
// its destination (xapi's copy goes through VDI.create, which marks the
// SR vdi_create), and vdi_create goes with the same SR operations as
// vdi_copy did, so its locking is unchanged. VDI.forget and VDI.update
// mark only the VDI, as xapi's do: they no longer hold off an SR's
// destroy, forget or unplug, which they need not (forget removes a
// record that the SR's forget removes as well; update fails with the
// SR's error when the SR goes meanwhile).
var srMarkAs = map[string]string{"vdi_copy": "vdi_create", "vdi_forget": "", "vdi_update": ""}

// publishedMarks returns the marks an operation takes, as xapi records
// them; a mark xapi never writes is a bug here, refused with
// INTERNAL_ERROR rather than shown to clients that would reject it.
func publishedMarks(objs []marked) ([]marked, error) {
	out := make([]marked, 0, len(objs))
	for _, o := range objs {
		if as, ok := srMarkAs[o.key]; ok && o.cls == dm.SR.Class {
			if as == "" {
				continue
			}
			o.key = as
		}
		if !dm.PublishedCurrentOp(o.cls.Name, o.key) {
			return nil, xerr.New(xerr.InternalError, o.cls.Name+" operation "+o.key+" is not one xapi records")
		}
		out = append(out, o)
	}
	return out, nil
}

// unmark runs when an operation ends, which reports its own outcome: a
// failure to unmark is logged (start-up clears stale marks).
func (s *Service) unmark(key string, objs []marked) {
	if _, err := s.db.Update(func(tx *db.Tx) error {
		for _, o := range objs {
			if _, ok := tx.Get(o.cls, o.ref); !ok {
				continue
			}
			if err := tx.RemoveFromMap(o.cls.Field("current_operations"), o.ref, key); err != nil {
				return err
			}
			if err := s.refresh(tx, o.cls, o.ref); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		s.log.Error("cannot unmark a storage operation", "task_ref", key, "objects", len(objs), "err", err)
	}
}

func (s *Service) refresh(tx *db.Tx, cls *schema.Class, ref string) error {
	if cls == dm.SR.Class {
		return s.refreshSR(tx, ref)
	}
	return s.refreshVDI(tx, ref)
}

func boolField(r *db.Row, f *schema.Field) bool { b, _ := r.Get(f).(bool); return b }

func mapField(r *db.Row, f *schema.Field) map[string]string {
	m, _ := r.Get(f).(map[string]string)
	return m
}

// srPlugged reports whether any PBD of the SR is plugged.
func srPlugged(tx db.Reader, srRef string) bool {
	for _, p := range pbdsOf(tx, srRef) {
		if boolField(p, dm.PBD.CurrentlyAttached) {
			return true
		}
	}
	return false
}

func pbdsOf(tx db.Reader, srRef string) []*db.Row {
	return rowsWhere(tx, dm.PBD.Class, dm.PBD.SR, srRef)
}

func vdisOf(tx db.Reader, srRef string) []*db.Row {
	return rowsWhere(tx, dm.VDI.Class, dm.VDI.SR, srRef)
}

func vbdsOf(tx db.Reader, vdiRef string) []*db.Row {
	return rowsWhere(tx, dm.VBD.Class, dm.VBD.VDI, vdiRef)
}

// rowsWhere is the rows of class whose reference field points at ref.
func rowsWhere(tx db.Reader, class *schema.Class, field *schema.Field, ref string) []*db.Row {
	var out []*db.Row
	for _, r := range tx.All(class) {
		if r.String(field) == ref {
			out = append(out, r)
		}
	}
	return out
}

// vdiBusy reports whether a VDI is attached by this host's datapaths or by
// a plugged VBD.
func (s *Service) vdiBusy(tx db.Reader, vdiRef string) bool {
	if s.attachedDPs(vdiRef) > 0 {
		return true
	}
	for _, vbd := range vbdsOf(tx, vdiRef) {
		if boolField(vbd, dm.VBD.CurrentlyAttached) {
			return true
		}
	}
	return false
}

func (s *Service) driverInfo(srType string) (DriverInfo, bool) {
	d := s.driver(srType)
	if d == nil {
		return DriverInfo{}, false
	}
	return d.Info(), true
}

// refreshSR recomputes an SR's allowed_operations.
func (s *Service) refreshSR(tx *db.Tx, ref string) error {
	row, ok := tx.Get(dm.SR.Class, ref)
	if !ok {
		return nil
	}
	info, _ := s.driverInfo(row.String(dm.SR.Type))
	var ops []string
	if srPlugged(tx, ref) {
		ops = slices.Clone(srPluggedOps)
		for op, cap := range srCapOps {
			if info.Has(cap) {
				ops = append(ops, op)
			}
		}
	} else {
		ops = slices.Clone(srUnpluggedOps)
	}
	return setAllowed(tx, dm.SR.AllowedOperations, ref, ops, mapField(row, dm.SR.CurrentOperations), srCompatible)
}

// The operations an SR's allowed_operations is made of: those of a
// plugged SR, those its driver must have a capability for, and those of
// an unplugged one. Only values xapi lists (its all_ops): VDI.copy,
// VDI.forget and VDI.update are allowed on any plugged SR but have no
// entry there.
var (
	srPluggedOps   = []string{"scan", "update", "unplug", "pbd_create", "pbd_destroy", "vdi_introduce"}
	srUnpluggedOps = []string{"plug", "forget", "destroy", "pbd_create", "pbd_destroy"}
	srCapOps       = map[string]string{"vdi_create": "VDI_CREATE", "vdi_destroy": "VDI_DELETE", "vdi_resize": "VDI_RESIZE",
		"vdi_clone": "VDI_CLONE", "vdi_snapshot": "VDI_SNAPSHOT", "vdi_set_on_boot": "VDI_RESET_ON_BOOT"}
)

// The operations a VDI's allowed_operations is made of, as for SRs. xapi
// lists set_on_boot nowhere (the value came after the set it keeps to),
// so it is not here although VDI.set_on_boot may run.
var (
	vdiPluggedOps = []string{"copy", "update", "generate_config"}
	vdiCapOps     = map[string]string{"clone": "VDI_CLONE", "snapshot": "VDI_SNAPSHOT"}
	vdiIdleCapOps = map[string]string{"destroy": "VDI_DELETE", "resize": "VDI_RESIZE"}
)

// refreshVDI recomputes a VDI's allowed_operations.
func (s *Service) refreshVDI(tx *db.Tx, ref string) error {
	row, ok := tx.Get(dm.VDI.Class, ref)
	if !ok {
		return nil
	}
	srRef := row.String(dm.VDI.SR)
	sr, _ := tx.Get(dm.SR.Class, srRef)
	var info DriverInfo
	if sr != nil {
		info, _ = s.driverInfo(sr.String(dm.SR.Type))
	}
	ops := []string{"forget"}
	if srPlugged(tx, srRef) {
		ops = append(ops, vdiPluggedOps...)
		busy := s.vdiBusy(tx, ref)
		for op, cap := range vdiCapOps {
			if info.Has(cap) {
				ops = append(ops, op)
			}
		}
		if !busy {
			for op, cap := range vdiIdleCapOps {
				if info.Has(cap) {
					ops = append(ops, op)
				}
			}
		} else {
			ops = slices.DeleteFunc(ops, func(op string) bool { return op == "forget" })
		}
	}
	return setAllowed(tx, dm.VDI.AllowedOperations, ref, ops, mapField(row, dm.VDI.CurrentOperations), vdiCompatible)
}

// setAllowed records as an object's allowed_operations (sorted) those of
// ops that xapi lists for the class (datamodel.PublishableAllowed) and
// that go with every operation running on it (compatible(running, op)).
func setAllowed(tx *db.Tx, field *schema.Field, ref string, ops []string, running map[string]string,
	compatible func(running, op string) bool) error {
	ops = slices.DeleteFunc(dm.PublishableAllowed(field.Class.Name, ops), func(op string) bool {
		for _, r := range running {
			if !compatible(r, op) {
				return true
			}
		}
		return false
	})
	slices.Sort(ops)
	return setIfChanged(tx, field, ref, ops)
}

func setIfChanged(tx *db.Tx, f *schema.Field, ref string, ops []string) error {
	if ops == nil {
		ops = []string{}
	}
	row, _ := tx.Get(f.Class, ref)
	if old, _ := row.Get(f).([]string); slices.Equal(old, ops) {
		return nil
	}
	return tx.Set(f, ref, ops)
}

// refreshSRAll recomputes an SR and all of its VDIs.
func (s *Service) refreshSRAll(tx *db.Tx, srRef string) error {
	if err := s.refreshSR(tx, srRef); err != nil {
		return err
	}
	for _, v := range vdisOf(tx, srRef) {
		if err := s.refreshVDI(tx, v.Ref); err != nil {
			return err
		}
	}
	return nil
}

// overprovision reports whether an SR may promise more than its free
// space (sm_config:overprovision=true): thin VDIs larger than the free
// space are then allowed, up to the SR's physical size.
func overprovision(sr *db.Row) bool {
	v := strings.ToLower(mapField(sr, dm.SR.SMConfig)["overprovision"])
	return v == "true" || v == "1" || v == "yes"
}
