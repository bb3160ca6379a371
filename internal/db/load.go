package db

import (
	"fmt"

	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Loader fills an empty database with stored rows at start-up.
type Loader struct {
	tx  *Tx
	max uint64
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
	old := d.cur.Load()
	d.cur.Store(snap)
	close(old.done)
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
