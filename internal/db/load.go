package db

import (
	"fmt"
	"time"

	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Loader fills an empty database with stored rows at start-up.
type Loader struct {
	tx    *Tx
	max   uint64
	stamp uint64 // when set, rows get this generation instead of their own
}

// Load fills an empty database: fill adds rows with their stored
// generations, then the derived inverse sets are rebuilt and the
// generation set to gen (or the newest row's, if higher). Nothing is
// published until fill returns nil; no change feed entries are made and
// no persister is called.
func (d *DB) Load(gen uint64, fill func(l *Loader) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.work.gen != 0 || d.prepared.s.gen != 0 {
		return fmt.Errorf("db: Load into a database that is not empty")
	}
	tx := newTx(d, d.work)
	tx.Lenient = true
	l := &Loader{tx: tx, max: gen}
	if err := fill(l); err != nil {
		return err
	}
	tx.rebuildRelations()
	tx.s.gen = l.max
	tx.changes = nil
	d.work = tx.s
	snap := d.prepare(tx)
	d.pubMu.Lock()
	d.setCurrent(snap)
	d.pubMu.Unlock()
	return nil
}

// Row adds one stored row. values are canonical, indexed by field; nil
// takes the field's base value; derived sets are ignored.
func (l *Loader) Row(c *schema.Class, ref string, created, modified uint64, values []any) error {
	tx := l.tx
	t, err := tx.wtable(c)
	if err != nil {
		return err
	}
	if len(values) != len(c.Fields) {
		return fmt.Errorf("db: row %s of %s has %d values, want %d", ref, c.Name, len(values), len(c.Fields))
	}
	for i, f := range c.Fields {
		if f.Derived || values[i] == nil {
			values[i] = nil
			continue
		}
		if err := checkValue(f, values[i]); err != nil {
			return fmt.Errorf("db: %s %s: %w", c.Name, ref, err)
		}
	}
	if _, taken := tx.s.keys.Get(keyItem{key: ref}); taken {
		return xerr.New(xerr.DBUniquenessConstraintViolation, c.Name, "_ref", ref)
	}
	if l.stamp != 0 {
		created, modified = l.stamp, l.stamp
	}
	row := packRow(c, ref, created, modified, values)
	id := row.UUID()
	if c.UUID != nil {
		if _, taken := tx.s.keys.Get(keyItem{key: id}); taken {
			return xerr.New(xerr.DBUniquenessConstraintViolation, c.Name, "uuid", id)
		}
	}
	t.rows.ReplaceOrInsert(row)
	t.byMod.ReplaceOrInsert(modKey{row.Modified, ref})
	if t.byName != nil {
		t.byName.ReplaceOrInsert(nameKey{row.String(c.NameLabel), ref})
	}
	keys := tx.wkeys()
	keys.ReplaceOrInsert(keyItem{key: ref, class: int32(c.Index), isRef: true, ref: ref})
	if c.UUID != nil {
		keys.ReplaceOrInsert(keyItem{key: id, class: int32(c.Index), ref: ref})
	}
	l.max = max(l.max, created, modified)
	return nil
}

// rebuildRelations recomputes every derived inverse set from the child
// rows (parents that do not exist are skipped).
func (tx *Tx) rebuildRelations() {
	for _, r := range tx.db.model.Relations {
		if r.ManyToMany {
			continue
		}
		child, parent := r.Field, r.Inverse
		rel := tx.wrel(parent)
		tx.Ascend(child.Class, func(row *Row) bool {
			p, _ := row.Get(child).(string)
			if p != "" && p != schema.NullRef {
				if _, ok := tx.Get(parent.Class, p); ok {
					rel.ReplaceOrInsert(pair{p, row.Ref})
				}
			}
			return true
		})
	}
}

// Replacer is a Persister that can rewrite every persistent table at once
// (a restored database).
type Replacer interface {
	ReplaceAll(snap *Snapshot) error
}

// Replace swaps every persistent table for the rows fill gives (a
// restored database dump): the non-persistent tables (sessions, tasks,
// messages) stay. Every restored row is stamped with a new generation, so
// that event.from reports it to clients that keep their tokens. If fill
// fails, or the persister cannot write the new tables, the database is
// left as it was.
func (d *DB) Replace(fill func(l *Loader) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failed != nil {
		return d.failed
	}
	// Let earlier commits reach the disk first, so none lands on top.
	for {
		d.pubMu.Lock()
		n := len(d.pending)
		d.pubMu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	d.pubMu.Lock()
	if d.aborted != nil {
		d.rollback()
	}
	d.pubMu.Unlock()
	fresh := newState(d.model, d.relIndex)
	fresh.gen = d.work.gen
	for i, c := range d.model.Classes {
		if c.InDB && !c.Persist {
			fresh.tables[i] = d.work.tables[i]
			// Their rows' uuids and refs stay taken.
			fresh.tables[i].rows.Ascend(func(r *Row) bool {
				fresh.keys.ReplaceOrInsert(keyItem{key: r.Ref, class: int32(i), isRef: true, ref: r.Ref})
				if id := r.UUID(); id != "" {
					fresh.keys.ReplaceOrInsert(keyItem{key: id, class: int32(i), ref: r.Ref})
				}
				return true
			})
		}
	}
	tx := newTx(d, fresh)
	tx.Lenient = true
	gen := d.work.gen + 1
	l := &Loader{tx: tx, max: gen, stamp: gen}
	if err := fill(l); err != nil {
		return err
	}
	tx.rebuildRelations()
	tx.s.gen = gen
	for i, c := range d.model.Classes {
		if c.InDB && c.Persist && tx.s.tables[i] != nil {
			// Clients cannot be told of each old row's deletion.
			t, _ := tx.wtable(c)
			t.forgotten = gen
		}
	}
	for i := range tx.ownTable {
		tx.ownTable[i] = tx.s.tables[i] != nil
	}
	tx.ownKeys = true
	tx.ownRels = make([]bool, len(tx.s.rels))
	for i := range tx.ownRels {
		tx.ownRels[i] = true
	}
	savedWork, saved := d.work, d.prepared
	d.work, d.prepared = tx.s, &Snapshot{reader: reader{db: d, s: d.prepared.s}, done: make(chan struct{})}
	snap := d.prepare(tx)
	if r, ok := d.opts.Persister.(Replacer); ok {
		if err := r.ReplaceAll(snap); err != nil {
			// Nothing of the new tables is visible; the persister puts
			// its file back in step with the old state before its next
			// write.
			d.work, d.prepared = savedWork, saved
			return fmt.Errorf("%w: %w", ErrNotDurable, err)
		}
	}
	d.pubMu.Lock()
	d.setCurrent(snap)
	d.pubMu.Unlock()
	return nil
}
