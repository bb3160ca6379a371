package db

import (
	"math/bits"

	"toolstackd/internal/schema"
)

// Row is one object: its ref, the generations at which it was created and
// last modified, and its field values in canonical form (schema/value.go).
// Rows are immutable: a write makes a new Row.
//
// A row stores only the values that differ from the class's Base (default
// or empty value); a bit mask says which. A VM has 92 fields and most sit
// at their defaults, so this keeps a row a fraction of a full slice.
// Derived inverse sets (VM.VBDs) are never stored: read them with
// Reader.Value, which computes them from the relation index.
type Row struct {
	Class    *schema.Class
	Ref      string
	Created  uint64
	Modified uint64
	mask     [2]uint64
	vals     []any // the stored values, in field order
}

const maxFields = 128

func (r *Row) has(i int) bool { return r.mask[i>>6]&(1<<(i&63)) != 0 }

// slot is the position of field i's value in vals, if stored.
func (r *Row) slot(i int) int {
	w, b := i>>6, uint(i&63)
	n := bits.OnesCount64(r.mask[w] & (1<<b - 1))
	if w == 1 {
		n += bits.OnesCount64(r.mask[0])
	}
	return n
}

// At is the value of the field at index i (derived sets read as nil).
func (r *Row) At(i int) any {
	if r.has(i) {
		return r.vals[r.slot(i)]
	}
	return r.Class.Base[i]
}

// Get is the value of field f (derived sets read as nil: use
// Reader.Value).
func (r *Row) Get(f *schema.Field) any { return r.At(f.Index) }

// String is a string-like field's value.
func (r *Row) String(f *schema.Field) string { s, _ := r.At(f.Index).(string); return s }

// UUID is the row's uuid, or "" for classes without one.
func (r *Row) UUID() string {
	if r.Class.UUID == nil {
		return ""
	}
	return r.String(r.Class.UUID)
}

// Stored returns the row's values as a full slice (derived sets nil).
func (r *Row) Stored() []any {
	out := make([]any, len(r.Class.Fields))
	for i := range out {
		out[i] = r.At(i)
	}
	return out
}

// packRow makes a row from a full slice of values.
func packRow(c *schema.Class, ref string, created, modified uint64, values []any) *Row {
	r := &Row{Class: c, Ref: ref, Created: created, Modified: modified}
	n := 0
	for i, v := range values {
		if v != nil && !c.Fields[i].Derived && !schema.Equal(v, c.Base[i]) {
			r.mask[i>>6] |= 1 << (i & 63)
			n++
		}
	}
	if n > 0 {
		r.vals = make([]any, 0, n)
		for i, v := range values {
			if r.has(i) {
				r.vals = append(r.vals, v)
			}
		}
	}
	return r
}

// with returns a copy of r, modified at gen, with field i set to v.
func (r *Row) with(i int, v any, gen uint64) *Row {
	out := &Row{Class: r.Class, Ref: r.Ref, Created: r.Created, Modified: gen, mask: r.mask}
	isBase := schema.Equal(v, r.Class.Base[i])
	switch {
	case r.has(i) && !isBase:
		out.vals = append([]any(nil), r.vals...)
		out.vals[r.slot(i)] = v
	case r.has(i): // back to the base value: drop the slot
		s := r.slot(i)
		out.mask[i>>6] &^= 1 << (i & 63)
		out.vals = make([]any, 0, len(r.vals)-1)
		out.vals = append(append(out.vals, r.vals[:s]...), r.vals[s+1:]...)
	case !isBase:
		s := r.slot(i)
		out.mask[i>>6] |= 1 << (i & 63)
		out.vals = make([]any, 0, len(r.vals)+1)
		out.vals = append(append(append(out.vals, r.vals[:s]...), v), r.vals[s:]...)
	default:
		out.vals = r.vals // unchanged and immutable: share
	}
	return out
}

// touched returns a copy of r marked modified at gen.
func (r *Row) touched(gen uint64) *Row {
	out := *r
	out.Modified = gen
	return &out
}
