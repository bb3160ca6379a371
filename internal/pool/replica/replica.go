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
//	version (1), count, then per row: op (0 put, 1 delete, 2 patch), class name,
//	ref, and for a put or patch the number of columns and (column, value) pairs;
//	in a patch a set or map column's pair is followed by its value before the
//	change (column, value, before).
//
// A patch never reaches raft's log (the coordinator applies it and
// replicates whole rows), so its layout can change with the build. A set
// or map column in a patch is merged into the coordinator's value
// (schema.Merge3): the member's change is what before became after, so a
// member whose copy lagged behind does not undo what another host added
// to or removed from the same set or map meanwhile (a VM's
// current_operations, other_config keys), as xapi's add_to_ and
// remove_from_ calls on the coordinator do not. Any other column is set
// to the member's value (the later write wins).
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
	// OpPatch sets the columns it carries and leaves the others alone:
	// a member's own change, sent to the coordinator as what it changed
	// (see EncodeDelta), so that it cannot undo a concurrent change to
	// another field of the same row.
	OpPatch
)

// Row is one row's change in an entry: for OpPut its whole persistent
// state, as canonical values indexed by field (nil: the column's
// default); for OpPatch the columns to set (nil: leave alone), and in
// Before, for the set and map columns among them, their values before
// the change.
type Row struct {
	Op     Op
	Class  *schema.Class
	Ref    string
	Values []any
	Before []any
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
			buf = appendColumns(buf, ch.Row, nil)
		}
	}
	return buf, true
}

// EncodeDelta makes one entry of what batches changed in persistent rows:
// a row they created travels whole (OpPut), a row they deleted as its ref,
// and a row they modified as the columns that differ between its state
// before the first batch and after the last (OpPatch). ok is false when
// nothing persistent changed.
func EncodeDelta(batches []*db.Batch) (entry []byte, ok bool) {
	buf := binary.AppendUvarint(nil, Version)
	var body []byte
	n := 0
	for _, rc := range db.PersistentRowChanges(batches) {
		ch, old := rc.Last, rc.Before
		switch {
		case ch.Op == db.OpDelete && old == nil:
			continue // made and gone within the batches
		case ch.Op == db.OpDelete:
			body = binary.AppendUvarint(body, uint64(OpDelete))
			body = appendString(body, ch.Class.Name)
			body = appendString(body, ch.Ref)
		case old == nil:
			body = binary.AppendUvarint(body, uint64(OpPut))
			body = appendString(body, ch.Class.Name)
			body = appendString(body, ch.Ref)
			body = appendColumns(body, ch.Row, nil)
		default:
			if !changed(old, ch.Row) {
				continue
			}
			body = binary.AppendUvarint(body, uint64(OpPatch))
			body = appendString(body, ch.Class.Name)
			body = appendString(body, ch.Ref)
			body = appendColumns(body, ch.Row, old)
		}
		n++
	}
	if n == 0 {
		return nil, false
	}
	buf = binary.AppendUvarint(buf, uint64(n))
	return append(buf, body...), true
}

// EncodeState makes one entry holding every persistent row of a snapshot
// (a raft snapshot of the database); Replace applies it.
func EncodeState(m *schema.Model, s *db.Snapshot) []byte {
	var rows []*db.Row
	for _, c := range m.Classes {
		if c.InDB && c.Persist {
			rows = append(rows, s.All(c)...)
		}
	}
	return EncodeRows(rows)
}

// EncodeRows makes one entry that puts the given rows (of persistent
// classes) whole.
func EncodeRows(rows []*db.Row) []byte {
	buf := binary.AppendUvarint(nil, Version)
	buf = binary.AppendUvarint(buf, uint64(len(rows)))
	for _, r := range rows {
		buf = binary.AppendUvarint(buf, uint64(OpPut))
		buf = appendString(buf, r.Class.Name)
		buf = appendString(buf, r.Ref)
		buf = appendColumns(buf, r, nil)
	}
	return buf
}

// changed reports whether a row's stored columns differ between two
// states of it.
func changed(old, cur *db.Row) bool {
	for _, f := range cur.Class.Fields {
		if f.Persist && !f.Derived && !schema.Equal(old.At(f.Index), cur.At(f.Index)) {
			return true
		}
	}
	return false
}

// appendColumns writes a row's persistent columns: with old nil those
// that differ from their defaults (a whole row), otherwise those that
// differ from old (a patch).
func appendColumns(buf []byte, r *db.Row, old *db.Row) []byte {
	c := r.Class
	var cols []int
	for _, f := range c.Fields {
		if !f.Persist || f.Derived {
			continue
		}
		base := c.Base[f.Index]
		if old != nil {
			base = old.At(f.Index)
		}
		if !schema.Equal(r.At(f.Index), base) {
			cols = append(cols, f.Index)
		}
	}
	buf = binary.AppendUvarint(buf, uint64(len(cols)))
	for _, i := range cols {
		f := c.Fields[i]
		buf = appendString(buf, f.Column)
		buf = appendString(buf, schema.FormatExact(f.Type, r.At(i)))
		if old != nil && merged(f) {
			buf = appendString(buf, schema.FormatExact(f.Type, old.At(i)))
		}
	}
	return buf
}

// merged reports whether a patch merges f's value (a set or a map) into
// the row's current one rather than setting it.
func merged(f *schema.Field) bool {
	return f.Type.Kind == schema.KSet || f.Type.Kind == schema.KMap
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

func (r *reader) string(what string) string { return string(r.bytes(what)) }

// bytes is a length-prefixed string left in the entry's buffer.
func (r *reader) bytes(what string) []byte {
	if r.err != nil {
		return nil
	}
	n, k := binary.Uvarint(r.b)
	switch {
	case k <= 0:
		r.fail("truncated %s length", what)
		return nil
	case n > maxString:
		r.fail("%s length %d over %d", what, n, maxString)
		return nil
	}
	r.b = r.b[k:]
	if uint64(len(r.b)) < n {
		r.fail("truncated %s", what)
		return nil
	}
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
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
	op := Op(r.uvarint("op", uint64(OpPatch)))
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
		col := r.bytes("column")
		val := r.string("value")
		if r.err != nil {
			break
		}
		f := c.FieldBytes(col)
		if f == nil || f.Derived || !f.Persist {
			return Row{}, fmt.Errorf("%w: %s has no stored column %q", ErrCorrupt, c.Name, col)
		}
		v, err := schema.ParseExact(f.Type, val)
		if err != nil {
			return Row{}, fmt.Errorf("%w: %s.%s: %v", ErrCorrupt, c.Name, col, err)
		}
		row.Values[f.Index] = v
		if op == OpPatch && merged(f) {
			if row.Before == nil {
				row.Before = make([]any, len(c.Fields))
			}
			was := r.string("value before")
			if r.err != nil {
				break
			}
			if row.Before[f.Index], err = schema.ParseExact(f.Type, was); err != nil {
				return Row{}, fmt.Errorf("%w: %s.%s before: %v", ErrCorrupt, c.Name, col, err)
			}
		}
	}
	return row, r.err
}

// Apply makes d hold the rows of an entry, in one transaction. A put of
// a row d lacks inserts it; of a row it holds, rewrites the columns that
// differ (relations kept in step); a patch sets the columns it carries
// on a row d holds, merging sets and maps (see the package
// documentation), and is a no-op on a row d lacks (deleted meanwhile); a
// delete of a row it lacks is a no-op.
func Apply(d *db.DB, rows []Row) error {
	_, err := d.Update(func(tx *db.Tx) error { return ApplyTx(tx, rows) })
	return err
}

// ApplyTx is Apply within a transaction the caller runs (several entries
// in one commit).
func ApplyTx(tx *db.Tx, rows []Row) error {
	tx.Lenient = true
	for _, row := range rows {
		if err := applyRow(tx, row); err != nil {
			return err
		}
	}
	return nil
}

// Replace makes d hold exactly the persistent rows of a state entry (see
// EncodeState), through db.Replace: in-memory classes are left alone,
// relations are rebuilt, and clients see every row as new.
func Replace(d *db.DB, rows []Row) error {
	return d.Replace(func(l *db.Loader) error {
		for _, r := range rows {
			if r.Op != OpPut {
				return fmt.Errorf("%w: a state entry holds a %d of %s", ErrCorrupt, r.Op, r.Ref)
			}
			if err := l.Row(r.Class, r.Ref, 0, 0, r.Values); err != nil {
				return err
			}
		}
		return nil
	})
}

func applyRow(tx *db.Tx, row Row) error {
	c := row.Class
	cur, have := tx.Get(c, row.Ref)
	switch {
	case !have && row.Op != OpPut:
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
			if row.Op == OpPatch {
				continue
			}
			v = c.Base[f.Index]
		}
		if row.Op == OpPatch && row.Before != nil && merged(f) {
			v = schema.Merge3(f.Type, row.Before[f.Index], v, cur.Get(f))
		}
		if !schema.Equal(cur.Get(f), v) {
			if err := tx.Set(f, row.Ref, v); err != nil {
				return err
			}
		}
	}
	return nil
}
