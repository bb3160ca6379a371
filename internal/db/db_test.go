package db_test

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

func newDB(t testing.TB) *db.DB { return db.New(dm.Model, db.Options{}) }

func mustUpdate(t testing.TB, d *db.DB, fn func(tx *db.Tx) error) uint64 {
	t.Helper()
	g, err := d.Update(fn)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	return g
}

func createVM(t testing.TB, d *db.DB, name string) string {
	t.Helper()
	var ref string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name}).Row())
		return err
	})
	return ref
}

func wantCode(t *testing.T, err error, code string, params ...string) {
	t.Helper()
	var xe *xerr.Error
	if !errors.As(err, &xe) {
		t.Fatalf("error %v is not a XenAPI error, want %s", err, code)
	}
	if xe.Code != code {
		t.Fatalf("error %v, want code %s", xe, code)
	}
	if params != nil && !slices.Equal(xe.Params, params) {
		t.Fatalf("error params %q, want %q", xe.Params, params)
	}
}

func TestCreateFillsDefaultsAndChecksRequired(t *testing.T) {
	d := newDB(t)
	var ref string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		ref, err = tx.Create(dm.Network.Class, "", map[string]any{"name_label": "net", "other_config": map[string]string{}})
		return
	})
	s := d.Snapshot()
	row, ok := s.Get(dm.Network.Class, ref)
	if !ok {
		t.Fatal("row missing")
	}
	if row.Get(dm.Network.MTU) != int64(1500) || row.Get(dm.Network.NameDescription) != "" ||
		row.Get(dm.Network.Managed) != true || row.Get(dm.Network.NameLabel) != "net" {
		t.Errorf("defaults not filled: %v", row.Stored())
	}
	id := row.Get(dm.Network.UUID).(string)
	if len(id) != 36 {
		t.Errorf("uuid %q not made", id)
	}
	if r2, ok := s.ByUUID(dm.Network.Class, id); !ok || r2 != row {
		t.Error("by uuid")
	}
	if _, ok := s.ByUUID(dm.Host.Class, id); ok {
		t.Error("uuid found in the wrong class")
	}
	if r2, ok := s.Lookup(ref); !ok || r2 != row {
		t.Error("lookup by ref")
	}
	// other_config has no default.
	_, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Create(dm.Network.Class, "", map[string]any{"name_label": "x"})
		return err
	})
	wantCode(t, err, xerr.FieldTypeError, "other_config")
	// Duplicate uuid and ref.
	_, err = d.Update(func(tx *db.Tx) error {
		_, err := tx.Create(dm.Network.Class, "", map[string]any{"uuid": id, "other_config": map[string]string{}})
		return err
	})
	wantCode(t, err, xerr.DBUniquenessConstraintViolation, "network", "uuid", id)
	_, err = d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.Host.Class, ref, (&dm.HostRecord{}).Row())
		return err
	})
	wantCode(t, err, xerr.DBUniquenessConstraintViolation)
	// A typed record with empty enums takes the defaults.
	vm := createVM(t, d, "vm")
	r, _ := d.Snapshot().Get(dm.VM.Class, vm)
	if r.Get(dm.VM.PowerState) != "Halted" || r.Get(dm.VM.Affinity) != schema.NullRef {
		t.Errorf("typed insert defaults: %v %v", r.Get(dm.VM.PowerState), r.Get(dm.VM.Affinity))
	}
}

func TestTypeErrors(t *testing.T) {
	d := newDB(t)
	ref := createVM(t, d, "vm")
	cases := []struct {
		f    *schema.Field
		v    any
		code string
	}{
		{dm.VM.NameLabel, 5, xerr.FieldTypeError},
		{dm.VM.MemoryStaticMax, "1024", xerr.FieldTypeError},
		{dm.VM.PowerState, "Exploded", xerr.InvalidValue},
		{dm.VM.Affinity, "not-a-ref", xerr.InvalidValue},
		{dm.VM.OtherConfig, map[string]int64{"a": 1}, xerr.FieldTypeError},
		{dm.VM.Tags, []int64{1}, xerr.FieldTypeError},
	}
	for _, c := range cases {
		_, err := d.Update(func(tx *db.Tx) error { return tx.Set(c.f, ref, c.v) })
		wantCode(t, err, c.code)
	}
	_, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, "OpaqueRef:nope", "x") })
	wantCode(t, err, xerr.HandleInvalid, "VM", "OpaqueRef:nope")
	_, err = d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.VBDs, ref, []string{}) })
	wantCode(t, err, xerr.InternalError)
}

func TestGenerations(t *testing.T) {
	d := newDB(t)
	g0 := d.Generation()
	ref := createVM(t, d, "a")
	g1 := d.Generation()
	if g1 != g0+1 {
		t.Fatalf("create: generation %d -> %d", g0, g1)
	}
	row, _ := d.Snapshot().Get(dm.VM.Class, ref)
	if row.Created != g1 || row.Modified != g1 {
		t.Errorf("row gens %d/%d, want %d", row.Created, row.Modified, g1)
	}
	// Every write bumps; an unchanged value does not.
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, ref, "b") })
	g2 := d.Generation()
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, ref, "b") })
	if d.Generation() != g2 || g2 != g1+1 {
		t.Errorf("no-op write bumped the generation: %d %d %d", g1, g2, d.Generation())
	}
	mustUpdate(t, d, func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.NameDescription, ref, "x"); err != nil {
			return err
		}
		return tx.Set(dm.VM.UserVersion, ref, int64(7))
	})
	if d.Generation() != g2+2 {
		t.Errorf("two writes in one transaction: %d, want %d", d.Generation(), g2+2)
	}
	row, _ = d.Snapshot().Get(dm.VM.Class, ref)
	if row.Created != g1 || row.Modified != g2+2 {
		t.Errorf("row gens %d/%d", row.Created, row.Modified)
	}
	// ModifiedSince sees the row once, at its latest generation.
	var seen []string
	d.Snapshot().ModifiedSince(dm.VM.Class, g1, func(r *db.Row) bool { seen = append(seen, r.Ref); return true })
	if len(seen) != 1 || seen[0] != ref {
		t.Errorf("modified since: %v", seen)
	}
	// Deletion is remembered with its generations.
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, ref) })
	gd := d.Generation()
	dels := d.Snapshot().DeletedSince(dm.VM.Class, g1)
	if len(dels) != 1 || dels[0].Ref != ref || dels[0].Created != g1 || dels[0].Deleted != gd {
		t.Errorf("deletions: %+v", dels)
	}
	if len(d.Snapshot().DeletedSince(dm.VM.Class, gd)) != 0 {
		t.Error("deletion reported after its own generation")
	}
	// Touch stamps without changing values.
	ref2 := createVM(t, d, "c")
	var tg uint64
	mustUpdate(t, d, func(tx *db.Tx) (err error) { tg, err = tx.Touch(dm.VM.Class, ref2); return })
	row, _ = d.Snapshot().Get(dm.VM.Class, ref2)
	if row.Modified != tg || tg != d.Generation() {
		t.Errorf("touch: row %d, touch %d, db %d", row.Modified, tg, d.Generation())
	}
}

func TestDeletedWindowIsBounded(t *testing.T) {
	d := db.New(dm.Model, db.Options{DeletedWindow: 16})
	var refs []string
	for i := range 40 {
		refs = append(refs, createVM(t, d, fmt.Sprint(i)))
	}
	for _, r := range refs {
		mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, r) })
	}
	s := d.Snapshot()
	dels := s.DeletedSince(dm.VM.Class, 0)
	if len(dels) > 16 || len(dels) == 0 {
		t.Fatalf("kept %d deletions, bound 16", len(dels))
	}
	if dels[len(dels)-1].Ref != refs[len(refs)-1] {
		t.Error("newest deletion not kept")
	}
	if f := s.ForgottenDeletions(dm.VM.Class); f == 0 || f >= dels[0].Deleted {
		t.Errorf("forgotten generation %d, oldest kept %d", f, dels[0].Deleted)
	}
}

// A lenient transaction (a replicated batch, a joining host's rows) may
// bring a child before its parent: the parent's derived set holds the
// child once the parent arrives, in the same transaction or a later one.
func TestLenientChildBeforeParent(t *testing.T) {
	d := newDB(t)
	vm := db.NewRef()
	vbd := func(parent string) []any {
		row := (&dm.VBDRecord{VM: dm.VMRef(parent), VDI: schema.NullRef, Userdevice: "0", Mode: "RW", Type: "Disk", Metrics: schema.NullRef}).Row()
		return row
	}
	var child string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		tx.Lenient = true
		child, err = tx.Insert(dm.VBD.Class, "", vbd(vm))
		return err
	})
	mustUpdate(t, d, func(tx *db.Tx) error {
		_, err := tx.Insert(dm.VM.Class, vm, (&dm.VMRecord{NameLabel: "late parent"}).Row())
		return err
	})
	s := d.Snapshot()
	row, _ := s.Get(dm.VM.Class, vm)
	if got, _ := s.Value(row, dm.VM.VBDs).([]string); !slices.Equal(got, []string{child}) {
		t.Fatalf("the parent that came second has VBDs %v, want [%s]", got, child)
	}
}

func TestOneToManyRelation(t *testing.T) {
	d := newDB(t)
	vm1, vm2 := createVM(t, d, "vm1"), createVM(t, d, "vm2")
	vbdFields := func(vm string) map[string]any {
		return map[string]any{"VM": vm, "VDI": schema.NullRef, "userdevice": "0", "bootable": true,
			"mode": "RW", "type": "Disk", "empty": false, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
			"storage_lock": false, "other_config": map[string]string{}, "currently_attached": false, "status_code": int64(0),
			"status_detail": "", "runtime_properties": map[string]string{}, "qos_supported_algorithms": []string{}, "metrics": schema.NullRef,
			"device": "", "unpluggable": true}
	}
	before := d.Generation()
	var vbd string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		vbd, err = tx.Create(dm.VBD.Class, "", vbdFields(vm1))
		return
	})
	s := d.Snapshot()
	v1, _ := s.Get(dm.VM.Class, vm1)
	if got := s.Value(v1, dm.VM.VBDs); !slices.Equal(got.([]string), []string{vbd}) {
		t.Fatalf("vm1.VBDs = %v", got)
	}
	if v1.Modified <= before {
		t.Error("creating a VBD did not modify its VM")
	}
	if vals := s.Values(v1); !slices.Equal(vals[dm.VM.VBDs.Index].([]string), []string{vbd}) {
		t.Error("Values misses the derived set")
	}
	// The filter language sees the derived set too.
	rows, err := s.Where(dm.VM.Class, fmt.Sprintf(`field "VBDs" = "('%s')"`, vbd))
	if err != nil || len(rows) != 1 || rows[0].Ref != vm1 {
		t.Errorf("where on derived set: %v %v", rows, err)
	}
	// Re-point: both parents change.
	g := mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VBD.VM, vbd, vm2) })
	s = d.Snapshot()
	v1, _ = s.Get(dm.VM.Class, vm1)
	v2, _ := s.Get(dm.VM.Class, vm2)
	if len(s.Value(v1, dm.VM.VBDs).([]string)) != 0 || !slices.Equal(s.Value(v2, dm.VM.VBDs).([]string), []string{vbd}) {
		t.Errorf("re-point: vm1 %v vm2 %v", s.Value(v1, dm.VM.VBDs), s.Value(v2, dm.VM.VBDs))
	}
	if v1.Modified != g || v2.Modified != g {
		t.Errorf("re-point: parents at %d/%d, want %d", v1.Modified, v2.Modified, g)
	}
	// A dangling parent is refused and nothing changes.
	_, err = d.Update(func(tx *db.Tx) error { return tx.Set(dm.VBD.VM, vbd, "OpaqueRef:gone") })
	wantCode(t, err, xerr.HandleInvalid, "VM", "OpaqueRef:gone")
	_, err = d.Update(func(tx *db.Tx) error { _, err := tx.Create(dm.VBD.Class, "", vbdFields("OpaqueRef:gone")); return err })
	wantCode(t, err, xerr.HandleInvalid)
	// Null is allowed and detaches.
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VBD.VM, vbd, schema.NullRef) })
	s = d.Snapshot()
	v2, _ = s.Get(dm.VM.Class, vm2)
	if len(s.Value(v2, dm.VM.VBDs).([]string)) != 0 {
		t.Error("null did not detach")
	}
	// Delete the child: the parent loses it and is modified.
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VBD.VM, vbd, vm2) })
	g = mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VBD.Class, vbd) })
	s = d.Snapshot()
	v2, _ = s.Get(dm.VM.Class, vm2)
	if len(s.Value(v2, dm.VM.VBDs).([]string)) != 0 || v2.Modified != g {
		t.Errorf("delete child: %v at %d", s.Value(v2, dm.VM.VBDs), v2.Modified)
	}
	// Delete the parent: children keep the dangling ref, as in xapi.
	mustUpdate(t, d, func(tx *db.Tx) (err error) { vbd, err = tx.Create(dm.VBD.Class, "", vbdFields(vm1)); return })
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, vm1) })
	s = d.Snapshot()
	if r, _ := s.Get(dm.VBD.Class, vbd); r.Get(dm.VBD.VM) != vm1 {
		t.Error("child's ref changed on parent delete")
	}
}

func TestManyToManyRelation(t *testing.T) {
	d := newDB(t)
	vm := createVM(t, d, "vm")
	var g1, g2 string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		if g1, err = tx.Create(dm.VMGroup.Class, "", map[string]any{"name_label": "g1", "placement": "normal", "VMs": []string{}}); err != nil {
			return
		}
		g2, err = tx.Create(dm.VMGroup.Class, "", map[string]any{"name_label": "g2", "placement": "normal", "VMs": []string{}})
		return
	})
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.Groups, vm, []string{g1, g2}) })
	s := d.Snapshot()
	for _, g := range []string{g1, g2} {
		r, _ := s.Get(dm.VMGroup.Class, g)
		if !slices.Equal(s.Value(r, dm.VMGroup.VMs).([]string), []string{vm}) {
			t.Errorf("%s.VMs = %v", g, s.Value(r, dm.VMGroup.VMs))
		}
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.RemoveFromSet(dm.VM.Groups, vm, g1) })
	s = d.Snapshot()
	r, _ := s.Get(dm.VMGroup.Class, g1)
	if len(s.Value(r, dm.VMGroup.VMs).([]string)) != 0 {
		t.Error("remove did not reach the partner")
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VMGroup.Class, g2) })
	s = d.Snapshot()
	v, _ := s.Get(dm.VM.Class, vm)
	if len(v.Get(dm.VM.Groups).([]string)) != 0 {
		t.Error("deleting a group left it in VM.groups")
	}
}

func TestSetAndMapSemantics(t *testing.T) {
	d := newDB(t)
	ref := createVM(t, d, "vm")
	get := func(f *schema.Field) any {
		r, _ := d.Snapshot().Get(dm.VM.Class, ref)
		return r.Get(f)
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToSet(dm.VM.Tags, ref, "a") })
	g := d.Generation()
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToSet(dm.VM.Tags, ref, "a") })
	if !slices.Equal(get(dm.VM.Tags).([]string), []string{"a"}) || d.Generation() != g {
		t.Errorf("add to set is not idempotent: %v", get(dm.VM.Tags))
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.RemoveFromSet(dm.VM.Tags, ref, "missing") })
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.RemoveFromSet(dm.VM.Tags, ref, "a") })
	if len(get(dm.VM.Tags).([]string)) != 0 {
		t.Error("remove from set")
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToMap(dm.VM.OtherConfig, ref, "k", "v") })
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToMap(dm.VM.OtherConfig, ref, "k", "v") })
	_, err := d.Update(func(tx *db.Tx) error { return tx.AddToMap(dm.VM.OtherConfig, ref, "k", "w") })
	r, _ := d.Snapshot().Get(dm.VM.Class, ref)
	wantCode(t, err, xerr.MapDuplicateKey, "VM", "other_config", r.Get(dm.VM.UUID).(string), "k")
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.RemoveFromMap(dm.VM.OtherConfig, ref, "absent") })
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.RemoveFromMap(dm.VM.OtherConfig, ref, "k") })
	if len(get(dm.VM.OtherConfig).(map[string]string)) != 0 {
		t.Error("remove from map")
	}
	// Maps with typed values.
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToMap(dm.VM.BlockedOperations, ref, "start", "reason") })
	_, err = d.Update(func(tx *db.Tx) error { return tx.AddToMap(dm.VM.OtherConfig, ref, "", "v") })
	wantCode(t, err, xerr.InvalidValue)
}

func TestNameLabelIndex(t *testing.T) {
	d := newDB(t)
	a, b := createVM(t, d, "same"), createVM(t, d, "same")
	c := createVM(t, d, "other")
	refs := func(rows []*db.Row) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Ref)
		}
		slices.Sort(out)
		return out
	}
	want := []string{a, b}
	slices.Sort(want)
	if got := refs(d.Snapshot().ByNameLabel(dm.VM.Class, "same")); !slices.Equal(got, want) {
		t.Errorf("by name: %v", got)
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, a, "renamed") })
	if got := refs(d.Snapshot().ByNameLabel(dm.VM.Class, "same")); !slices.Equal(got, []string{b}) {
		t.Errorf("after rename: %v", got)
	}
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, c) })
	if len(d.Snapshot().ByNameLabel(dm.VM.Class, "other")) != 0 {
		t.Error("deleted row still indexed")
	}
}

func TestWhere(t *testing.T) {
	d := newDB(t)
	mk := func(name, state string, tmpl bool) string {
		var ref string
		mustUpdate(t, d, func(tx *db.Tx) (err error) {
			ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name, PowerState: dm.VMPowerState(state), IsATemplate: tmpl}).Row())
			return
		})
		return ref
	}
	a := mk("a", "Running", false)
	b := mk("b", "Halted", false)
	c := mk("c", "Halted", true)
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.AddToMap(dm.VM.OtherConfig, a, "k", "v w") })
	s := d.Snapshot()
	q := func(expr string) []string {
		t.Helper()
		rows, err := s.Where(dm.VM.Class, expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.Get(dm.VM.NameLabel).(string))
		}
		slices.Sort(out)
		return out
	}
	cases := map[string][]string{
		`true`:                                   {"a", "b", "c"},
		`false`:                                  nil,
		`field "power_state" = "Running"`:        {"a"},
		`field "name__label" = "b"`:              {"b"},
		`field "name_label" = "b"`:               {"b"},
		`field "is_a_template" = "true"`:         {"c"},
		`field "other_config" = "(('k' 'v w'))"`: {"a"},
		`field "power_state" = "Halted" and not (field "is_a_template" = "true")`: {"b"},
		// and/or have equal precedence, left-associative:
		// (a or b) and c, not a or (b and c).
		`field "name__label" = "a" or field "name__label" = "b" and field "is_a_template" = "true"`: nil,
		`field "name__label" = "c" or field "name__label" = "b" and field "power_state" = "Halted"`: {"b", "c"},
		`not field "power_state" = "Halted"`: {"a"},
		`"x" = "x"`:                          {"a", "b", "c"},
	}
	for expr, want := range cases {
		if got := q(expr); !slices.Equal(got, want) {
			t.Errorf("%s: got %v, want %v", expr, got, want)
		}
	}
	_ = b
	_ = c
	for _, bad := range []string{``, `field "power_state" =`, `field "nope" = "x"`, `(true`, `field power_state = "x"`, `true and`} {
		_, err := s.Where(dm.VM.Class, bad)
		wantCode(t, err, xerr.InvalidValue)
	}
}

func TestSnapshotIsolationAndRollback(t *testing.T) {
	d := newDB(t)
	ref := createVM(t, d, "before")
	old := d.Snapshot()
	mustUpdate(t, d, func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.NameLabel, ref, "after"); err != nil {
			return err
		}
		// The transaction sees its own write.
		r, _ := tx.Get(dm.VM.Class, ref)
		if r.Get(dm.VM.NameLabel) != "after" {
			t.Error("tx does not see its own write")
		}
		if len(tx.ByNameLabel(dm.VM.Class, "after")) != 1 {
			t.Error("tx does not see its own index")
		}
		return nil
	})
	select {
	case <-old.Done():
	default:
		t.Error("old snapshot's Done not closed after a commit")
	}
	r, _ := old.Get(dm.VM.Class, ref)
	if r.Get(dm.VM.NameLabel) != "before" || len(old.ByNameLabel(dm.VM.Class, "after")) != 0 {
		t.Error("old snapshot changed")
	}
	// A failing transaction leaves nothing behind.
	g := d.Generation()
	_, err := d.Update(func(tx *db.Tx) error {
		tx.Set(dm.VM.NameLabel, ref, "doomed")
		tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "doomed"}).Row())
		tx.Delete(dm.VM.Class, ref)
		return errors.New("no")
	})
	if err == nil || d.Generation() != g {
		t.Fatal("rollback")
	}
	s := d.Snapshot()
	if r, ok := s.Get(dm.VM.Class, ref); !ok || r.Get(dm.VM.NameLabel) != "after" || len(s.ByNameLabel(dm.VM.Class, "doomed")) != 0 || s.Count(dm.VM.Class) != 1 {
		t.Error("rolled-back writes are visible")
	}
	if d.Snapshot() != s {
		t.Error("a failed transaction published a snapshot")
	}
}

func TestTypedRecords(t *testing.T) {
	d := newDB(t)
	rec := &dm.VMRecord{NameLabel: "typed", PowerState: dm.VMPowerStateHalted, MemoryStaticMax: 1 << 30,
		ActionsAfterShutdown: dm.OnNormalExitDestroy, ActionsAfterReboot: dm.OnNormalExitRestart,
		ActionsAfterCrash: dm.OnCrashBehaviourRestart, ActionsAfterSoftreboot: dm.OnSoftrebootBehaviorSoftReboot,
		DomainType: dm.DomainTypeHVM, SecurebootCertificatesState: dm.VMSecurebootCertificatesStateOk,
		OtherConfig: map[string]string{"a": "b"}}
	var ref string
	mustUpdate(t, d, func(tx *db.Tx) (err error) { ref, err = tx.Insert(dm.VM.Class, "", rec.Row()); return })
	s := d.Snapshot()
	row, _ := s.Get(dm.VM.Class, ref)
	var back dm.VMRecord
	back.FromRow(s.Values(row))
	if back.NameLabel != "typed" || back.MemoryStaticMax != 1<<30 || back.OtherConfig["a"] != "b" || back.UUID == "" {
		t.Errorf("typed round trip: %+v", back)
	}
}

// memPersister records batches and makes them durable when told.
type memPersister struct {
	mu      sync.Mutex
	batches []*db.Batch
	d       *db.DB
	auto    bool
}

func (p *memPersister) Append(b *db.Batch) {
	p.mu.Lock()
	p.batches = append(p.batches, b)
	auto := p.auto
	p.mu.Unlock()
	if auto {
		go p.d.Durable(b.To)
	}
}

func TestChangeFeedAndPersister(t *testing.T) {
	p := &memPersister{auto: true}
	d := db.New(dm.Model, db.Options{FeedLength: 4, Persister: p})
	p.d = d
	ref := createVM(t, d, "a")
	mustUpdate(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, ref, "b") })
	batches, err := d.ChangesSince(0)
	if err != nil || len(batches) != 2 {
		t.Fatalf("feed: %v %v", batches, err)
	}
	if c := batches[0].Changes[0]; c.Op != db.OpCreate || c.Ref != ref {
		t.Errorf("first change %+v", c)
	}
	if c := batches[1].Changes[0]; c.Op != db.OpModify || c.Field != dm.VM.NameLabel || c.Old == nil {
		t.Errorf("second change %+v", c)
	}
	if len(p.batches) != 2 || p.batches[1] != batches[1] {
		t.Error("persister did not see the batches in order")
	}
	for i := range 10 {
		createVM(t, d, fmt.Sprint(i))
	}
	if _, err := d.ChangesSince(0); !errors.Is(err, db.ErrFeedTruncated) {
		t.Errorf("truncated feed: %v", err)
	}
	if b, err := d.ChangesSince(d.Generation() - 1); err != nil || len(b) != 1 {
		t.Errorf("recent feed: %v %v", b, err)
	}
}

// Readers never see a commit before it is durable, writers pipeline
// behind a slow sync, and a failed sync stops writes without exposing
// what failed.
func TestCommitsBecomeVisibleOnlyWhenDurable(t *testing.T) {
	p := &memPersister{}
	d := db.New(dm.Model, db.Options{Persister: p})
	p.d = d
	results := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := d.Update(func(tx *db.Tx) error {
				_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint(i)}).Row())
				return err
			})
			results <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		n := len(p.batches)
		p.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writers did not pipeline: only", n, "batches appended")
		}
		time.Sleep(time.Millisecond)
	}
	if d.Snapshot().Count(dm.VM.Class) != 0 || d.Generation() != 0 {
		t.Fatal("a commit is visible before it is durable")
	}
	snap := d.Snapshot()
	d.Durable(p.batches[1].To) // the first two
	if err, err2 := <-results, <-results; err != nil || err2 != nil {
		t.Fatal(err, err2)
	}
	if d.Snapshot().Count(dm.VM.Class) != 2 {
		t.Errorf("after durable: %d VMs", d.Snapshot().Count(dm.VM.Class))
	}
	select {
	case <-snap.Done():
	default:
		t.Error("waiters not woken at publication")
	}
	d.Fail(errors.New("disk full"))
	if err := <-results; !errors.Is(err, db.ErrFailed) {
		t.Errorf("pending writer got %v", err)
	}
	if d.Snapshot().Count(dm.VM.Class) != 2 {
		t.Error("a failed commit became visible")
	}
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, "x", "y") }); !errors.Is(err, db.ErrFailed) {
		t.Errorf("write after failure: %v", err)
	}
}

// A persister that cannot write now but may later (a full disk) aborts:
// the pending commits fail and are undone, later writes start from the
// durable state, and a commit that needs no disk is run again.
func TestAbortUndoesPendingCommitsAndWritesGoOn(t *testing.T) {
	p := &memPersister{}
	d := db.New(dm.Model, db.Options{Persister: p})
	p.d = d
	waitBatches := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			p.mu.Lock()
			got := len(p.batches)
			p.mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d batches appended, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	insert := func(c *schema.Class, row []any) chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := d.Update(func(tx *db.Tx) error {
				_, err := tx.Insert(c, "", row)
				return err
			})
			ch <- err
		}()
		return ch
	}
	a := insert(dm.VM.Class, (&dm.VMRecord{NameLabel: "a"}).Row())
	waitBatches(1)
	d.Durable(p.batches[0].To)
	if err := <-a; err != nil {
		t.Fatal(err)
	}
	durable := d.Generation()

	b := insert(dm.VM.Class, (&dm.VMRecord{NameLabel: "b"}).Row())
	waitBatches(2)
	c := insert(dm.VM.Class, (&dm.VMRecord{NameLabel: "c"}).Row())
	waitBatches(3)
	d.Abort(errors.New("no space left on device"), nil)
	for _, ch := range []chan error{b, c} {
		if err := <-ch; !errors.Is(err, db.ErrNotDurable) || !strings.Contains(err.Error(), "no space left") {
			t.Errorf("pending writer got %v", err)
		}
	}
	if d.Snapshot().Count(dm.VM.Class) != 1 || d.Generation() != durable {
		t.Fatal("an aborted commit is visible")
	}
	// The next commit starts from the durable state.
	e := insert(dm.VM.Class, (&dm.VMRecord{NameLabel: "e"}).Row())
	waitBatches(4)
	if got := p.batches[3]; got.From != durable || len(got.Changes) != 1 {
		t.Errorf("commit after abort spans %d..%d with %d changes, want from %d with 1", got.From, got.To, len(got.Changes), durable)
	}
	d.Durable(p.batches[3].To)
	if err := <-e; err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range d.Snapshot().All(dm.VM.Class) {
		names = append(names, r.String(dm.VM.NameLabel))
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "a,e" {
		t.Errorf("VMs after abort and a new commit: %v", names)
	}

	// A session queued behind a failing VM is made again, not failed.
	f := insert(dm.VM.Class, (&dm.VMRecord{NameLabel: "f"}).Row())
	waitBatches(5)
	sess := insert(dm.Session.Class, (&dm.SessionRecord{}).Row())
	waitBatches(6)
	d.Abort(errors.New("no space left on device"), nil)
	if err := <-f; !errors.Is(err, db.ErrNotDurable) {
		t.Errorf("pending VM writer got %v", err)
	}
	waitBatches(7)
	d.Durable(p.batches[6].To)
	if err := <-sess; err != nil {
		t.Errorf("session writer: %v", err)
	}
	if d.Snapshot().Count(dm.Session.Class) != 1 || d.Snapshot().Count(dm.VM.Class) != 2 {
		t.Errorf("after the retried session: %d sessions, %d VMs", d.Snapshot().Count(dm.Session.Class), d.Snapshot().Count(dm.VM.Class))
	}
}

// Many readers and one writer at once: run with -race.
func TestConcurrentReadersAndWriter(t *testing.T) {
	d := newDB(t)
	var refs []string
	for i := range 200 {
		refs = append(refs, createVM(t, d, fmt.Sprint(i)))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := d.Snapshot()
				// A snapshot is consistent: every VM's name is its index or
				// its index with the same generation suffix as the others
				// written in that transaction.
				n := s.Count(dm.VM.Class)
				if n < 200 {
					t.Errorf("reader %d saw %d rows", r, n)
					return
				}
				row, ok := s.Get(dm.VM.Class, refs[i%len(refs)])
				if !ok {
					t.Errorf("row vanished")
					return
				}
				_ = s.Values(row)
				s.ByNameLabel(dm.VM.Class, "0")
			}
		}()
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		mustUpdate(t, d, func(tx *db.Tx) error {
			for _, ref := range refs[:10] {
				if err := tx.Set(dm.VM.NameDescription, ref, fmt.Sprint(i)); err != nil {
					return err
				}
			}
			_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "extra"}).Row())
			return err
		})
		// All ten descriptions move together in every snapshot.
		s := d.Snapshot()
		first, _ := s.Get(dm.VM.Class, refs[0])
		for _, ref := range refs[1:10] {
			r, _ := s.Get(dm.VM.Class, ref)
			if r.Get(dm.VM.NameDescription) != first.Get(dm.VM.NameDescription) {
				t.Fatal("snapshot saw half a transaction")
			}
		}
	}
	close(stop)
	wg.Wait()
}
