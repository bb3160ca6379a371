package db

import (
	"toolstackd/internal/db/where"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// reader is the read side shared by Snapshot and Tx.
type reader struct {
	db *DB
	s  *state
}

// Reader is what Snapshot and Tx both offer for reading.
type Reader interface {
	Generation() uint64
	Get(c *schema.Class, ref string) (*Row, bool)
	Lookup(ref string) (*Row, bool)
	ByUUID(c *schema.Class, uuid string) (*Row, bool)
	ByNameLabel(c *schema.Class, name string) []*Row
	All(c *schema.Class) []*Row
	Ascend(c *schema.Class, fn func(*Row) bool)
	Count(c *schema.Class) int
	Value(row *Row, f *schema.Field) any
	Values(row *Row) []any
	Where(c *schema.Class, expr string) ([]*Row, error)
}

var (
	_ Reader = (*Snapshot)(nil)
	_ Reader = (*Tx)(nil)
)

// Generation is the generation this view was taken at.
func (r *reader) Generation() uint64 { return r.s.gen }

func (r *reader) table(c *schema.Class) *table {
	if c == nil || c.Index >= len(r.s.tables) {
		return nil
	}
	return r.s.tables[c.Index]
}

// Get finds a row of class c by ref.
func (r *reader) Get(c *schema.Class, ref string) (*Row, bool) {
	t := r.table(c)
	if t == nil {
		return nil, false
	}
	return t.rows.Get(&Row{Ref: ref})
}

// Lookup finds a row of any class by ref.
func (r *reader) Lookup(ref string) (*Row, bool) {
	k, ok := r.s.keys.Get(keyItem{key: ref})
	if !ok || !k.isRef {
		return nil, false
	}
	return r.Get(r.db.model.Classes[k.class], ref)
}

// ByUUID finds a row of class c by uuid.
func (r *reader) ByUUID(c *schema.Class, uuid string) (*Row, bool) {
	k, ok := r.s.keys.Get(keyItem{key: uuid})
	if !ok || k.isRef || c == nil || int(k.class) != c.Index {
		return nil, false
	}
	return r.Get(c, k.ref)
}

// ByNameLabel finds the rows of class c with a name_label, from an index.
func (r *reader) ByNameLabel(c *schema.Class, name string) []*Row {
	t := r.table(c)
	if t == nil || t.byName == nil {
		return nil
	}
	var out []*Row
	t.byName.AscendGreaterOrEqual(nameKey{name: name}, func(k nameKey) bool {
		if k.name != name {
			return false
		}
		if row, ok := t.rows.Get(&Row{Ref: k.ref}); ok {
			out = append(out, row)
		}
		return true
	})
	return out
}

// Ascend calls fn for each row of class c in ref order until fn returns
// false.
func (r *reader) Ascend(c *schema.Class, fn func(*Row) bool) {
	if t := r.table(c); t != nil {
		t.rows.Ascend(fn)
	}
}

// All returns every row of class c in ref order.
func (r *reader) All(c *schema.Class) []*Row {
	t := r.table(c)
	if t == nil {
		return nil
	}
	out := make([]*Row, 0, t.rows.Len())
	t.rows.Ascend(func(row *Row) bool { out = append(out, row); return true })
	return out
}

// Count is the number of rows of class c.
func (r *reader) Count(c *schema.Class) int {
	if t := r.table(c); t != nil {
		return t.rows.Len()
	}
	return 0
}

// Value reads one field of a row; derived inverse sets come from the
// relation index.
func (r *reader) Value(row *Row, f *schema.Field) any {
	if f.Derived {
		return r.children(f, row.Ref)
	}
	return row.At(f.Index)
}

func (r *reader) children(f *schema.Field, parent string) []string {
	idx, ok := r.db.relIndex[f]
	if !ok {
		return nil
	}
	var out []string
	r.s.rels[idx].AscendGreaterOrEqual(pair{parent: parent}, func(p pair) bool {
		if p.parent != parent {
			return false
		}
		out = append(out, p.child)
		return true
	})
	return out
}

// Values returns a copy of a row's values with derived sets filled in: a
// whole record, ready for a typed record's FromRow or for the wire.
func (r *reader) Values(row *Row) []any {
	out := row.Stored()
	for _, f := range row.Class.Fields {
		if f.Derived {
			out[f.Index] = r.children(f, row.Ref)
		}
	}
	return out
}

// FieldString is a field's value in xapi's stored string form, the form
// where-expressions compare.
func (r *reader) FieldString(row *Row, f *schema.Field) string {
	return schema.FormatDB(f.Type, r.Value(row, f))
}

// Where returns the rows of class c matching a get_all_records_where
// expression, in ref order. A malformed expression or an unknown column is
// INVALID_VALUE ["expr", reason].
func (r *reader) Where(c *schema.Class, expr string) ([]*Row, error) {
	prog, err := Compile(c, expr)
	if err != nil {
		return nil, err
	}
	var out []*Row
	if prog.IsTrue() {
		return r.All(c), nil
	}
	fields := c.Fields
	r.Ascend(c, func(row *Row) bool {
		if prog.Eval(func(col int) string { return r.FieldString(row, fields[col]) }) {
			out = append(out, row)
		}
		return true
	})
	return out, nil
}

// Compile parses a where-expression and binds it to class c's columns.
// Columns may be named as xapi stores them (name__label) or by their API
// name (name_label).
func Compile(c *schema.Class, expr string) (*where.Program, error) {
	e, err := where.Parse(expr)
	if err != nil {
		return nil, xerr.New(xerr.InvalidValue, "expr", err.Error())
	}
	prog, err := where.Bind(e, func(col string) (int, bool) {
		f := c.Field(col)
		if f == nil || f.Internal {
			return 0, false
		}
		return f.Index, true
	})
	if err != nil {
		return nil, xerr.New(xerr.InvalidValue, "expr", err.Error())
	}
	return prog, nil
}

// ModifiedSince calls fn, in generation order, for each row of class c
// created or modified after generation gen.
func (r *reader) ModifiedSince(c *schema.Class, gen uint64, fn func(*Row) bool) {
	t := r.table(c)
	if t == nil {
		return
	}
	t.byMod.AscendGreaterOrEqual(modKey{gen: gen + 1}, func(k modKey) bool {
		row, ok := t.rows.Get(&Row{Ref: k.ref})
		if !ok {
			return true
		}
		return fn(row)
	})
}

// DeletedSince lists the remembered deletions of class c after generation
// gen, oldest first.
func (r *reader) DeletedSince(c *schema.Class, gen uint64) []Deletion {
	t := r.table(c)
	if t == nil {
		return nil
	}
	d := t.deleted
	lo, hi := 0, len(d)
	for lo < hi { // deletions are in generation order
		mid := (lo + hi) / 2
		if d[mid].Deleted <= gen {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return d[lo:]
}

// ForgottenDeletions is the generation of the newest deletion of class c
// that is no longer remembered (0 if none was forgotten): event.from
// cannot report deletions at or before it.
func (r *reader) ForgottenDeletions(c *schema.Class) uint64 {
	if t := r.table(c); t != nil {
		return t.forgotten
	}
	return 0
}
