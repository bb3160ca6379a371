// Package replica turns committed database batches into replication
// entries and applies entries to a member's database: the unit of the
// pool's replicated database, without raft.
//
// An entry carries, in commit order, the changes of one or more batches
// to persistent classes (sessions, tasks and other in-memory classes stay
// on the coordinator, as xapi keeps them). Within an entry only the last
// change to each row matters, as in persist's group commit: a created or
// modified row travels whole, as the persistent columns that differ from
// their defaults in xapi's stored string form (times with every digit);
// a deleted row as its ref.
//
// Layout (all integers unsigned varints, strings length-prefixed):
//
//	version (1), count, then per row: op (0 put, 1 delete), class name,
//	ref, and for a put the number of columns and (column, value) pairs.
//
// Decode treats its input as hostile: any malformed entry is an error
// wrapping ErrCorrupt, never a panic, and sizes are bounded.
//
// Apply makes a member's database hold what the coordinator's held after
// the entry: one transaction that inserts, rewrites or deletes each row.
// References to rows the member does not hold (in-memory classes) are
// kept as they are, as a loaded database keeps them.
package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// Version is the entry format's version.
const Version = 1

// Bounds on a decoded entry.
const (
	maxRows    = 1 << 20
	maxString  = 64 << 20
	maxColumns = 1 << 12
)

// ErrCorrupt is wrapped by every decoding error.
var ErrCorrupt = errors.New("replica: corrupt entry")

// Op is what an entry does to a row.
type Op uint8

// Row operations.
const (
	OpPut Op = iota
	OpDelete
)

// Row is one row's change in an entry: for OpPut its whole persistent
// state, as canonical values indexed by field (nil: the column's
// default).
type Row struct {
	Op     Op
	Class  *schema.Class
	Ref    string
	Values []any
}

// Encode makes one entry of the persistent changes in batches; ok is
// false when they hold none (nothing to replicate).
func Encode(batches []*db.Batch) (entry []byte, ok bool) {
	changes := db.LastPersistentChanges(batches)
	if len(changes) == 0 {
		return nil, false
	}
	buf := binary.AppendUvarint(nil, Version)
	buf = binary.AppendUvarint(buf, uint64(len(changes)))
	for _, ch := range changes {
		op := OpPut
		if ch.Op == db.OpDelete {
			op = OpDelete
		}
		buf = binary.AppendUvarint(buf, uint64(op))
		buf = appendString(buf, ch.Class.Name)
		buf = appendString(buf, ch.Ref)
		if op == OpPut {
			buf = appendColumns(buf, ch.Row)
		}
	}
	return buf, true
}

// appendColumns writes a row's persistent columns that differ from their
// defaults.
func appendColumns(buf []byte, r *db.Row) []byte {
	c := r.Class
	var cols []int
	for _, f := range c.Fields {
		if f.Persist && !f.Derived && !schema.Equal(r.At(f.Index), c.Base[f.Index]) {
			cols = append(cols, f.Index)
		}
	}
	buf = binary.AppendUvarint(buf, uint64(len(cols)))
	for _, i := range cols {
		f := c.Fields[i]
		buf = appendString(buf, f.Column)
		buf = appendString(buf, formatValue(f.Type, r.At(i)))
	}
	return buf
}

// formatValue is xapi's stored form, except that times keep every digit
// (the stored form has whole seconds, and a member must hold what the
// coordinator holds).
func formatValue(t *schema.Type, v any) string {
	if tm, ok := v.(time.Time); ok && t.Kind == schema.KDateTime {
		return tm.UTC().Format(time.RFC3339Nano)
	}
	return schema.FormatDB(t, v)
}

func parseValue(t *schema.Type, s string) (any, error) {
	if t.Kind == schema.KDateTime {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, err
		}
		return tm.UTC(), nil
	}
	return schema.ParseDB(t, s)
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// reader reads an entry, remembering the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
}

func (r *reader) uvarint(what string, limit uint64) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated %s", what)
		return 0
	}
	if v > limit {
		r.fail("%s %d over %d", what, v, limit)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) string(what string) string {
	n := r.uvarint(what+" length", maxString)
	if r.err != nil {
		return ""
	}
	if uint64(len(r.b)) < n {
		r.fail("truncated %s", what)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// Decode reads an entry against a model.
func Decode(m *schema.Model, entry []byte) ([]Row, error) {
	r := &reader{b: entry}
	if v := r.uvarint("version", 1<<20); r.err == nil && v != Version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, v, Version)
	}
	n := r.uvarint("row count", maxRows)
	rows := make([]Row, 0, min(n, 1024))
	for i := uint64(0); i < n && r.err == nil; i++ {
		row, err := decodeRow(m, r)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last row", ErrCorrupt, len(r.b))
	}
	return rows, nil
}

func decodeRow(m *schema.Model, r *reader) (Row, error) {
	op := Op(r.uvarint("op", uint64(OpDelete)))
	name := r.string("class")
	ref := r.string("ref")
	if r.err != nil {
		return Row{}, r.err
	}
	c := m.Class(name)
	if c == nil || !c.Persist {
		return Row{}, fmt.Errorf("%w: class %q is not a persistent class", ErrCorrupt, name)
	}
	if !schema.IsRef(ref) {
		return Row{}, fmt.Errorf("%w: %q is not a ref", ErrCorrupt, ref)
	}
	row := Row{Op: op, Class: c, Ref: ref}
	if op == OpDelete {
		return row, nil
	}
	row.Values = make([]any, len(c.Fields))
	cols := r.uvarint("column count", maxColumns)
	for j := uint64(0); j < cols && r.err == nil; j++ {
		col, val := r.string("column"), r.string("value")
		if r.err != nil {
			break
		}
		f := c.Field(col)
		if f == nil || f.Derived || !f.Persist {
			return Row{}, fmt.Errorf("%w: %s has no stored column %q", ErrCorrupt, c.Name, col)
		}
		v, err := parseValue(f.Type, val)
		if err != nil {
			return Row{}, fmt.Errorf("%w: %s.%s: %v", ErrCorrupt, c.Name, col, err)
		}
		row.Values[f.Index] = v
	}
	return row, r.err
}

// Apply makes d hold the rows of an entry, in one transaction. A put of
// a row d lacks inserts it; of a row it holds, rewrites the columns that
// differ (relations kept in step); a delete of a row it lacks is a no-op.
func Apply(d *db.DB, rows []Row) error {
	_, err := d.Update(func(tx *db.Tx) error {
		tx.Lenient = true
		for _, row := range rows {
			if err := applyRow(tx, row); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func applyRow(tx *db.Tx, row Row) error {
	c := row.Class
	cur, have := tx.Get(c, row.Ref)
	switch {
	case row.Op == OpDelete && !have:
		return nil
	case row.Op == OpDelete:
		return tx.Delete(c, row.Ref)
	case !have:
		_, err := tx.Insert(c, row.Ref, row.Values)
		return err
	}
	for _, f := range c.Fields {
		if f.Derived || !f.Persist {
			continue
		}
		v := row.Values[f.Index]
		if v == nil {
			v = c.Base[f.Index]
		}
		if !schema.Equal(cur.Get(f), v) {
			if err := tx.Set(f, row.Ref, v); err != nil {
				return err
			}
		}
	}
	return nil
}
