package persist_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/schema"
)

// A database mirrored into a redo log can be rebuilt from the log alone.
func TestRecoverFromRedoLog(t *testing.T) {
	dir := t.TempDir()
	st, d := open(t, filepath.Join(dir, "state.db"), persist.Options{})
	defer st.Close()
	// Some state before the log is attached: it reaches the log as the
	// first database record.
	var vms []string
	d.Update(func(tx *db.Tx) error {
		for i := range 5 {
			ref, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint("before-", i)}).Row())
			if err != nil {
				return err
			}
			vms = append(vms, ref)
		}
		return nil
	})
	rl, err := persist.AttachRedoLog(st, d, filepath.Join(dir, "redo.log"), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	// Then deltas: creates, field writes, map edits, relations, deletes.
	for i := range 20 {
		d.Update(func(tx *db.Tx) error {
			ref, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint("after-", i)}).Row())
			if err != nil {
				return err
			}
			vms = append(vms, ref)
			if err := tx.AddToMap(dm.VM.OtherConfig, vms[i], "k", fmt.Sprint(i)); err != nil {
				return err
			}
			_, err = tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(ref), Userdevice: "0", Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk}).Row())
			return err
		})
	}
	d.Update(func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, vms[0]) })
	if err := rl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	rl.Close()

	got, rec, err := persist.RecoverFromRedoLog(filepath.Join(dir, "redo.log"), dm.Model)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovered from half %d: database at generation %d plus %d delta records", rec.Half, rec.Gen, len(rec.Deltas))
	want, have := d.Snapshot(), got.Snapshot()
	for _, c := range []*schema.Class{dm.VM.Class, dm.VBD.Class, dm.Host.Class} {
		if want.Count(c) != have.Count(c) {
			t.Errorf("%s: %d rows, want %d", c.Name, have.Count(c), want.Count(c))
		}
		want.Ascend(c, func(r *db.Row) bool {
			o, ok := have.Get(c, r.Ref)
			if !ok {
				t.Errorf("%s %s missing", c.Name, r.Ref)
				return true
			}
			a, b := want.Values(r), have.Values(o)
			for i, f := range c.Fields {
				if f.Persist && !schema.Equal(a[i], b[i]) && !(f.Derived && len(a[i].([]string)) == 0 && b[i] == nil) {
					t.Errorf("%s.%s: %v, want %v", c.Name, f.Name, b[i], a[i])
				}
			}
			return true
		})
	}
}
