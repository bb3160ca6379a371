package storage

import (
	"context"
	"slices"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
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
		s.log.Error("cannot unmark a storage operation", "task", key, "objects", len(objs), "err", err)
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
		ops = []string{"scan", "update", "unplug", "pbd_create", "pbd_destroy", "vdi_introduce", "vdi_forget", "vdi_copy", "vdi_update"}
		for op, cap := range map[string]string{"vdi_create": "VDI_CREATE", "vdi_destroy": "VDI_DELETE", "vdi_resize": "VDI_RESIZE",
			"vdi_clone": "VDI_CLONE", "vdi_snapshot": "VDI_SNAPSHOT", "vdi_set_on_boot": "VDI_RESET_ON_BOOT"} {
			if info.Has(cap) {
				ops = append(ops, op)
			}
		}
	} else {
		ops = []string{"plug", "forget", "destroy", "pbd_create", "pbd_destroy"}
	}
	return setAllowed(tx, dm.SR.AllowedOperations, ref, ops, mapField(row, dm.SR.CurrentOperations), srCompatible)
}

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
		ops = append(ops, "copy", "update", "generate_config")
		busy := s.vdiBusy(tx, ref)
		for op, cap := range map[string]string{"clone": "VDI_CLONE", "snapshot": "VDI_SNAPSHOT"} {
			if info.Has(cap) {
				ops = append(ops, op)
			}
		}
		if !busy {
			for op, cap := range map[string]string{"destroy": "VDI_DELETE", "resize": "VDI_RESIZE", "set_on_boot": "VDI_RESET_ON_BOOT"} {
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
// ops that go with every operation running on it (compatible(running,
// op)).
func setAllowed(tx *db.Tx, field *schema.Field, ref string, ops []string, running map[string]string,
	compatible func(running, op string) bool) error {
	ops = slices.DeleteFunc(ops, func(op string) bool {
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
