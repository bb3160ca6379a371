package db

import (
	"github.com/google/btree"

	"toolstackd/internal/schema"
)

// Deletion remembers a deleted row for event.from.
type Deletion struct {
	Ref     string
	Created uint64
	Deleted uint64
}

type nameKey struct{ name, ref string }
type modKey struct {
	gen uint64
	ref string
}
type keyItem struct {
	key   string // a ref or a uuid
	class int32  // class index
	isRef bool
	ref   string // the row's ref
}
type pair struct{ parent, child string }

const degree = 16

func rowLess(a, b *Row) bool { return a.Ref < b.Ref }
func nameLess(a, b nameKey) bool {
	if a.name != b.name {
		return a.name < b.name
	}
	return a.ref < b.ref
}
func modLess(a, b modKey) bool {
	if a.gen != b.gen {
		return a.gen < b.gen
	}
	return a.ref < b.ref
}
func keyLess(a, b keyItem) bool { return a.key < b.key }
func pairLess(a, b pair) bool {
	if a.parent != b.parent {
		return a.parent < b.parent
	}
	return a.child < b.child
}

// table is one class's rows and indexes. Its trees are copy-on-write: a
// clone is O(1) and later writes copy only the nodes they touch.
type table struct {
	class     *schema.Class
	rows      *btree.BTreeG[*Row]
	byName    *btree.BTreeG[nameKey] // nil when the class has no name_label
	byMod     *btree.BTreeG[modKey]
	deleted   []Deletion // oldest first
	forgotten uint64     // generation of the newest deletion dropped from deleted
}

func newTable(c *schema.Class) *table {
	t := &table{class: c, rows: btree.NewG(degree, rowLess), byMod: btree.NewG(degree, modLess)}
	if c.NameLabel != nil {
		t.byName = btree.NewG(degree, nameLess)
	}
	return t
}

func (t *table) clone() *table {
	c := &table{class: t.class, rows: t.rows.Clone(), byMod: t.byMod.Clone(), deleted: t.deleted, forgotten: t.forgotten}
	if t.byName != nil {
		c.byName = t.byName.Clone()
	}
	return c
}

// state is a whole database at one generation: the part a Snapshot shares
// with readers and a Tx changes privately.
type state struct {
	gen    uint64
	tables []*table               // by class index; nil for classes not in the database
	keys   *btree.BTreeG[keyItem] // every ref and uuid
	rels   []*btree.BTreeG[pair]  // by relation index: (parent, child) of one-to-many relations
}

func (s *state) clone() *state {
	c := &state{gen: s.gen, tables: make([]*table, len(s.tables)), keys: s.keys.Clone(), rels: make([]*btree.BTreeG[pair], len(s.rels))}
	for i, t := range s.tables {
		if t != nil {
			c.tables[i] = t.clone()
		}
	}
	for i, r := range s.rels {
		c.rels[i] = r.Clone()
	}
	return c
}

func newState(m *schema.Model, relIndex map[*schema.Field]int) *state {
	s := &state{tables: make([]*table, len(m.Classes)), keys: btree.NewG(degree, keyLess), rels: make([]*btree.BTreeG[pair], len(relIndex))}
	for i, c := range m.Classes {
		if c.InDB {
			s.tables[i] = newTable(c)
		}
	}
	for i := range s.rels {
		s.rels[i] = btree.NewG(degree, pairLess)
	}
	return s
}
