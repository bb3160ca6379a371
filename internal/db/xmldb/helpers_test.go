package xmldb

import (
	"bytes"
	"fmt"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

func mustUpdate(t testing.TB, d *db.DB, fn func(tx *db.Tx) error) {
	t.Helper()
	if _, err := d.Update(fn); err != nil {
		t.Fatalf("update: %v", err)
	}
}

func encode(t testing.TB, m *schema.Model, snap *db.Snapshot) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, m, snap); err != nil {
		t.Fatalf("encode: %v", err)
	}
	return b.Bytes()
}

func decode(t testing.TB, data []byte) *Dump {
	t.Helper()
	d, err := Decode(bytes.NewReader(data), dm.Model)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return d
}

// byRef indexes a table's rows.
func byRef(rows []Row) map[string]*Row {
	out := make(map[string]*Row, len(rows))
	for i := range rows {
		out[rows[i].Ref] = &rows[i]
	}
	return out
}

// load puts a dump into a fresh database, as a loader would: rows first
// with their relation fields empty, then the relation fields, so that
// derived sets come out whatever the table order. Missing values take
// their defaults.
func load(t testing.TB, m *schema.Model, dump *Dump) *db.DB {
	t.Helper()
	d, err := tryLoad(m, dump)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return d
}

func tryLoad(m *schema.Model, dump *Dump) (*db.DB, error) {
	d := db.New(m, db.Options{})
	_, err := d.Update(func(tx *db.Tx) error {
		tx.Lenient = true
		for _, c := range m.Classes {
			for _, r := range dump.Tables[c] {
				vals := append([]any(nil), r.Values...)
				for _, f := range c.Fields {
					if f.Inverse != nil && !f.Derived {
						vals[f.Index] = nil
					}
				}
				if _, err := tx.Insert(c, r.Ref, vals); err != nil {
					return fmt.Errorf("%s %s: %w", c.Name, r.Ref, err)
				}
			}
		}
		for _, c := range m.Classes {
			for _, r := range dump.Tables[c] {
				for _, f := range c.Fields {
					if f.Inverse != nil && !f.Derived && r.Values[f.Index] != nil {
						if err := tx.Set(f, r.Ref, r.Values[f.Index]); err != nil {
							return fmt.Errorf("%s %s %s: %w", c.Name, r.Ref, f.Name, err)
						}
					}
				}
			}
		}
		return nil
	})
	return d, err
}

// sameStored reports whether two values have the same stored form: the
// equality a round trip through the file can promise (floats keep 12
// digits, datetimes whole seconds).
func sameStored(t *schema.Type, a, b any) bool {
	return schema.FormatDB(t, a) == schema.FormatDB(t, b)
}

// compareDumps checks that two dumps hold the same rows and values.
func compareDumps(t testing.TB, m *schema.Model, a, b *Dump) {
	t.Helper()
	for _, c := range m.Classes {
		ra, rb := a.Tables[c], b.Tables[c]
		if len(ra) != len(rb) {
			t.Fatalf("%s: %d rows, then %d", c.Name, len(ra), len(rb))
		}
		ib := byRef(rb)
		for _, r := range ra {
			s, ok := ib[r.Ref]
			if !ok {
				t.Fatalf("%s: row %s lost", c.Name, r.Ref)
			}
			if r.Created != s.Created || r.Modified != s.Modified {
				t.Fatalf("%s %s: generations %d/%d then %d/%d", c.Name, r.Ref, r.Created, r.Modified, s.Created, s.Modified)
			}
			for _, f := range c.Fields {
				va, vb := r.Values[f.Index], s.Values[f.Index]
				if (va == nil) != (vb == nil) || va != nil && !sameStored(f.Type, va, vb) {
					t.Fatalf("%s %s %s: %#v then %#v", c.Name, r.Ref, f.Column, va, vb)
				}
			}
		}
	}
}
