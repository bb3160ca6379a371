package db

import (
	"fmt"
	"maps"
	"slices"

	"github.com/google/btree"
	"github.com/google/uuid"

	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Tx is a write transaction. It is only valid inside the function given
// to DB.Update.
type Tx struct {
	reader
	base     *state
	ownTable []bool
	ownKeys  bool
	ownRels  []bool
	changes  []Change
	// Tag, if set, travels with the transaction's batch (Batch.Tag) to the
	// persister: the pool marks there the batches that apply replicated
	// entries, which must not be replicated again.
	Tag any
	// Lenient skips the dangling-reference check on relation fields; used
	// when loading a database that may already hold dangling references.
	Lenient bool
}

func newTx(d *DB, base *state) *Tx {
	s := &state{gen: base.gen, tables: slices.Clone(base.tables), keys: base.keys, rels: slices.Clone(base.rels)}
	return &Tx{reader: reader{db: d, s: s}, base: base, ownTable: make([]bool, len(base.tables))}
}

// NewRef makes a fresh opaque reference.
func NewRef() string { return "OpaqueRef:" + uuid.NewString() }

// wtable returns class c's table, cloned for writing on first use.
func (tx *Tx) wtable(c *schema.Class) (*table, error) {
	if c == nil || c.Index >= len(tx.s.tables) || tx.s.tables[c.Index] == nil {
		name := "<nil>"
		if c != nil {
			name = c.Name
		}
		return nil, xerr.New(xerr.InternalError, "class "+name+" is not a database table")
	}
	if !tx.ownTable[c.Index] {
		tx.s.tables[c.Index] = tx.base.tables[c.Index].clone()
		tx.ownTable[c.Index] = true
	}
	return tx.s.tables[c.Index], nil
}

func (tx *Tx) wkeys() *btree.BTreeG[keyItem] {
	if !tx.ownKeys {
		tx.s.keys = tx.base.keys.Clone()
		tx.ownKeys = true
	}
	return tx.s.keys
}

func (tx *Tx) wrel(f *schema.Field) *btree.BTreeG[pair] {
	i := tx.db.relIndex[f]
	if tx.ownRels == nil {
		tx.ownRels = make([]bool, len(tx.s.rels))
	}
	if !tx.ownRels[i] {
		tx.s.rels[i] = tx.base.rels[i].Clone()
		tx.ownRels[i] = true
	}
	return tx.s.rels[i]
}

func (tx *Tx) next() uint64 {
	tx.s.gen++
	return tx.s.gen
}

func handleInvalid(c *schema.Class, ref string) error {
	return xerr.New(xerr.HandleInvalid, c.Name, ref)
}

// mustGet finds a row for writing or fails with HANDLE_INVALID.
func (tx *Tx) mustGet(c *schema.Class, ref string) (*table, *Row, error) {
	t, err := tx.wtable(c)
	if err != nil {
		return nil, nil, err
	}
	row, ok := t.rows.Get(&Row{Ref: ref})
	if !ok {
		return nil, nil, handleInvalid(c, ref)
	}
	return t, row, nil
}

// put stores a new version of a row, keeping the name and generation
// indexes in step, and records the change.
func (tx *Tx) put(t *table, old, row *Row, op Op) {
	t.rows.ReplaceOrInsert(row)
	if old != nil {
		t.byMod.Delete(modKey{old.Modified, old.Ref})
	}
	t.byMod.ReplaceOrInsert(modKey{row.Modified, row.Ref})
	if t.byName != nil {
		nf := t.class.NameLabel
		if old == nil {
			t.byName.ReplaceOrInsert(nameKey{row.String(nf), row.Ref})
		} else if on, nn := old.String(nf), row.String(nf); on != nn {
			t.byName.Delete(nameKey{on, row.Ref})
			t.byName.ReplaceOrInsert(nameKey{nn, row.Ref})
		}
	}
	tx.changes = append(tx.changes, Change{Op: op, Class: t.class, Ref: row.Ref, Gen: row.Modified, Row: row, Old: old})
}

// touchRow marks a row modified at generation gen without changing values
// (the parent side of a relation, or event.inject).
func (tx *Tx) touchRow(c *schema.Class, ref string, gen uint64) {
	t, err := tx.wtable(c)
	if err != nil {
		return
	}
	old, ok := t.rows.Get(&Row{Ref: ref})
	if !ok || old.Modified == gen {
		return
	}
	tx.put(t, old, old.touched(gen), OpModify)
}

// Create adds a row of class c. ref may be empty to have one made. Fields
// are given by API or column name; omitted fields take their default, and
// an omitted field without a default is FIELD_TYPE_ERROR, except uuid,
// which is made when omitted. Derived inverse sets cannot be given.
func (tx *Tx) Create(c *schema.Class, ref string, fields map[string]any) (string, error) {
	if _, err := tx.wtable(c); err != nil {
		return "", err
	}
	values := make([]any, len(c.Fields))
	given := make([]bool, len(c.Fields))
	for name, v := range fields {
		f := c.Field(name)
		if f == nil {
			return "", xerr.New(xerr.InternalError, fmt.Sprintf("class %s has no field %s", c.Name, name))
		}
		if f.Derived {
			return "", xerr.New(xerr.InternalError, fmt.Sprintf("%s.%s is derived from %s.%s and cannot be written", c.Name, f.Name, f.Inverse.Class.Name, f.Inverse.Name))
		}
		values[f.Index], given[f.Index] = v, true
	}
	for i, f := range c.Fields {
		switch {
		case given[i] || f.Derived:
		case f.HasDefault:
			values[i] = f.Default
		case f == c.UUID:
			values[i] = uuid.NewString()
		default:
			return "", xerr.New(xerr.FieldTypeError, f.Name)
		}
	}
	return tx.insert(c, ref, values)
}

// Insert adds a row of class c from a whole row of values (as a typed
// record's Row gives); nil values and empty enums take their default or
// empty value, and an empty uuid is made.
func (tx *Tx) Insert(c *schema.Class, ref string, row []any) (string, error) {
	if _, err := tx.wtable(c); err != nil {
		return "", err
	}
	if len(row) != len(c.Fields) {
		return "", xerr.New(xerr.InternalError, fmt.Sprintf("row for %s has %d values, want %d", c.Name, len(row), len(c.Fields)))
	}
	values := slices.Clone(row)
	for i, f := range c.Fields {
		if f.Type.Kind == schema.KEnum && values[i] == "" {
			values[i] = nil // a zero-valued typed record leaves enums empty
		}
		switch {
		case f.Derived:
			values[i] = nil
		case values[i] != nil:
		case f.HasDefault:
			values[i] = f.Default
		default:
			values[i] = f.Zero()
		}
	}
	if c.UUID != nil && values[c.UUID.Index] == "" {
		values[c.UUID.Index] = uuid.NewString()
	}
	return tx.insert(c, ref, values)
}

func (tx *Tx) insert(c *schema.Class, ref string, values []any) (string, error) {
	if ref == "" {
		ref = NewRef()
	}
	if !schema.IsRef(ref) {
		return "", xerr.New(xerr.InvalidValue, "ref", ref)
	}
	for i, f := range c.Fields {
		if f.Derived {
			continue
		}
		if err := checkValue(f, values[i]); err != nil {
			return "", err
		}
	}
	if _, taken := tx.s.keys.Get(keyItem{key: ref}); taken {
		return "", xerr.New(xerr.DBUniquenessConstraintViolation, c.Name, "_ref", ref)
	}
	var id string
	if c.UUID != nil {
		id = values[c.UUID.Index].(string)
		if _, taken := tx.s.keys.Get(keyItem{key: id}); taken {
			return "", xerr.New(xerr.DBUniquenessConstraintViolation, c.Name, "uuid", id)
		}
	}
	// Check every related parent before changing anything.
	for i, f := range c.Fields {
		if f.Inverse != nil {
			if err := tx.checkTargets(f, values[i]); err != nil {
				return "", err
			}
		}
	}
	gen := tx.next()
	t, _ := tx.wtable(c)
	row := packRow(c, ref, gen, gen, values)
	tx.put(t, nil, row, OpCreate)
	keys := tx.wkeys()
	keys.ReplaceOrInsert(keyItem{key: ref, class: int32(c.Index), isRef: true, ref: ref})
	if c.UUID != nil {
		keys.ReplaceOrInsert(keyItem{key: id, class: int32(c.Index), ref: ref})
	}
	for i, f := range c.Fields {
		if f.Inverse != nil {
			tx.relate(f, ref, nil, values[i], gen)
		}
	}
	return ref, nil
}

func checkValue(f *schema.Field, v any) error {
	if err := schema.Check(f.Type, v); err != nil {
		if te, ok := err.(*schema.TypeError); ok && te.Msg != "" {
			return xerr.New(xerr.InvalidValue, f.Name, fmt.Sprint(te.Value))
		}
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	return nil
}

// targets lists the refs a relation field points at.
func targets(f *schema.Field, v any) []string {
	switch x := v.(type) {
	case string:
		if x == schema.NullRef || x == "" {
			return nil
		}
		return []string{x}
	case []string:
		return x
	}
	return nil
}

// checkTargets fails with HANDLE_INVALID when a relation field points at
// a row that does not exist.
func (tx *Tx) checkTargets(f *schema.Field, v any) error {
	if tx.Lenient {
		return nil
	}
	tc := f.Inverse.Class
	for _, ref := range targets(f, v) {
		if _, ok := tx.Get(tc, ref); !ok {
			return handleInvalid(tc, ref)
		}
	}
	return nil
}

// relate keeps the other side of relation field f of row ref in step with
// a change of its value from old to now, and marks the rows on the other
// side modified at gen.
func (tx *Tx) relate(f *schema.Field, ref string, old, now any, gen uint64) {
	if f.Derived {
		return // the parent side of a one-to-many relation: nothing stored here
	}
	before, after := targets(f, old), targets(f, now)
	removed := difference(before, after)
	added := difference(after, before)
	inv := f.Inverse
	for _, p := range removed {
		if f.ManyToMany {
			tx.editPartnerSet(inv, p, ref, false, gen)
		} else {
			tx.wrel(inv).Delete(pair{p, ref})
			tx.touchRow(inv.Class, p, gen)
		}
	}
	for _, p := range added {
		if f.ManyToMany {
			tx.editPartnerSet(inv, p, ref, true, gen)
		} else {
			// Kept even while the parent is missing (a lenient load or a
			// replicated batch may bring a child before its parent): the
			// parent's set is right the moment it arrives.
			tx.wrel(inv).ReplaceOrInsert(pair{p, ref})
			if _, ok := tx.Get(inv.Class, p); ok {
				tx.touchRow(inv.Class, p, gen)
			}
		}
	}
}

// editPartnerSet adds or removes ref in the set field f of row partner.
func (tx *Tx) editPartnerSet(f *schema.Field, partner, ref string, add bool, gen uint64) {
	t, err := tx.wtable(f.Class)
	if err != nil {
		return
	}
	old, ok := t.rows.Get(&Row{Ref: partner})
	if !ok {
		return
	}
	set, _ := old.Get(f).([]string)
	has := slices.Contains(set, ref)
	if has == add {
		return
	}
	var next []string
	if add {
		next = append(slices.Clip(set), ref)
	} else {
		next = slices.DeleteFunc(slices.Clone(set), func(s string) bool { return s == ref })
	}
	tx.put(t, old, old.with(f.Index, next, gen), OpModify)
	tx.changes[len(tx.changes)-1].Field = f
}

func difference(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// Set writes one field. Writing the value a field already has is a no-op:
// no new generation, no event.
func (tx *Tx) Set(f *schema.Field, ref string, v any) error {
	c := f.Class
	t, old, err := tx.mustGet(c, ref)
	if err != nil {
		return err
	}
	if f.Derived {
		return xerr.New(xerr.InternalError, fmt.Sprintf("%s.%s is derived from %s.%s and cannot be written", c.Name, f.Name, f.Inverse.Class.Name, f.Inverse.Name))
	}
	if err := checkValue(f, v); err != nil {
		return err
	}
	prev := old.Get(f)
	if schema.Equal(prev, v) {
		return nil
	}
	if f.Inverse != nil {
		if err := tx.checkTargets(f, v); err != nil {
			return err
		}
	}
	if f == c.UUID {
		if _, taken := tx.s.keys.Get(keyItem{key: v.(string)}); taken {
			return xerr.New(xerr.DBUniquenessConstraintViolation, c.Name, "uuid", v.(string))
		}
		keys := tx.wkeys()
		keys.Delete(keyItem{key: prev.(string)})
		keys.ReplaceOrInsert(keyItem{key: v.(string), class: int32(c.Index), ref: ref})
	}
	gen := tx.next()
	tx.put(t, old, old.with(f.Index, v, gen), OpModify)
	tx.changes[len(tx.changes)-1].Field = f
	if f.Inverse != nil {
		tx.relate(f, ref, prev, v, gen)
	}
	return nil
}

// Delete removes a row. Rows that point at it keep their (now dangling)
// references, as in xapi; the sets that listed it lose it.
func (tx *Tx) Delete(c *schema.Class, ref string) error {
	t, old, err := tx.mustGet(c, ref)
	if err != nil {
		return err
	}
	gen := tx.next()
	t.rows.Delete(old)
	t.byMod.Delete(modKey{old.Modified, ref})
	if t.byName != nil {
		t.byName.Delete(nameKey{old.String(c.NameLabel), ref})
	}
	keys := tx.wkeys()
	keys.Delete(keyItem{key: ref})
	if c.UUID != nil {
		keys.Delete(keyItem{key: old.UUID()})
	}
	t.deleted = append(t.deleted, Deletion{Ref: ref, Created: old.Created, Deleted: gen})
	if w := tx.db.opts.DeletedWindow; len(t.deleted) > w {
		keep := w / 2
		drop := len(t.deleted) - keep
		t.forgotten = t.deleted[drop-1].Deleted
		t.deleted = slices.Clone(t.deleted[drop:])
	}
	tx.changes = append(tx.changes, Change{Op: OpDelete, Class: c, Ref: ref, Gen: gen, Old: old})
	for _, f := range c.Fields {
		switch {
		case f.Derived:
			// This row was a parent: forget its children in the index.
			rel := tx.wrel(f)
			for _, child := range tx.children(f, ref) {
				rel.Delete(pair{ref, child})
			}
		case f.Inverse != nil:
			tx.relate(f, ref, old.Get(f), nil, gen)
		}
	}
	return nil
}

// Touch marks a row modified without changing it (event.inject) and
// returns the generation it was stamped with.
func (tx *Tx) Touch(c *schema.Class, ref string) (uint64, error) {
	if _, _, err := tx.mustGet(c, ref); err != nil {
		return 0, err
	}
	gen := tx.next()
	tx.touchRow(c, ref, gen)
	return gen, nil
}

// AddToSet adds an element to a set field; adding one already there is a
// no-op.
func (tx *Tx) AddToSet(f *schema.Field, ref string, elem any) error {
	return tx.editSet(f, ref, elem, true)
}

// RemoveFromSet removes an element from a set field; removing one that is
// not there is a no-op.
func (tx *Tx) RemoveFromSet(f *schema.Field, ref string, elem any) error {
	return tx.editSet(f, ref, elem, false)
}

func (tx *Tx) editSet(f *schema.Field, ref string, elem any, add bool) error {
	if f.Type.Kind != schema.KSet {
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	if err := schema.Check(f.Type.Elem, elem); err != nil {
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	_, row, err := tx.mustGet(f.Class, ref)
	if err != nil {
		return err
	}
	var next any
	switch set := tx.Value(row, f).(type) {
	case []string:
		n, changed := withMember(set, elem.(string), add)
		if !changed {
			return nil
		}
		next = n
	case []int64:
		n, changed := withMember(set, elem.(int64), add)
		if !changed {
			return nil
		}
		next = n
	default:
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	return tx.Set(f, ref, next)
}

// withMember is a copy of set with e added (add) or removed, and whether
// that changes it: adding a member already there or removing one that is
// not leaves the set as it is. set itself is never modified.
func withMember[T comparable](set []T, e T, add bool) ([]T, bool) {
	if slices.Contains(set, e) == add {
		return set, false
	}
	if add {
		return append(slices.Clone(set), e), true
	}
	return slices.DeleteFunc(slices.Clone(set), func(x T) bool { return x == e }), true
}

// AddToMap adds a key to a map field. Adding a key that is there with the
// same value is a no-op; with a different value it is MAP_DUPLICATE_KEY.
func (tx *Tx) AddToMap(f *schema.Field, ref, key string, v any) error {
	if f.Type.Kind != schema.KMap {
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	if key == "" && f.Type.Key.Kind == schema.KString {
		return xerr.New(xerr.InvalidValue, f.Name, "empty map key")
	}
	_, row, err := tx.mustGet(f.Class, ref)
	if err != nil {
		return err
	}
	cur := row.Get(f)
	if old, ok := mapGet(cur, key); ok {
		if schema.Equal(old, v) {
			return nil
		}
		id := ""
		if f.Class.UUID != nil {
			id = row.UUID()
		}
		return xerr.New(xerr.MapDuplicateKey, f.Class.Name, f.Name, id, key)
	}
	next := schema.MapPut(mapClone(cur, f.Type), key, v)
	return tx.Set(f, ref, next)
}

// RemoveFromMap removes a key from a map field; a missing key is a no-op.
func (tx *Tx) RemoveFromMap(f *schema.Field, ref, key string) error {
	if f.Type.Kind != schema.KMap {
		return xerr.New(xerr.FieldTypeError, f.Name)
	}
	_, row, err := tx.mustGet(f.Class, ref)
	if err != nil {
		return err
	}
	cur := row.Get(f)
	if _, ok := mapGet(cur, key); !ok {
		return nil
	}
	next := mapClone(cur, f.Type)
	switch m := next.(type) {
	case map[string]string:
		delete(m, key)
	case map[string]int64:
		delete(m, key)
	case map[string]float64:
		delete(m, key)
	case map[string][]string:
		delete(m, key)
	case map[string]any:
		delete(m, key)
	}
	return tx.Set(f, ref, next)
}

func mapGet(m any, key string) (any, bool) {
	switch x := m.(type) {
	case map[string]string:
		v, ok := x[key]
		return v, ok
	case map[string]int64:
		v, ok := x[key]
		return v, ok
	case map[string]float64:
		v, ok := x[key]
		return v, ok
	case map[string][]string:
		v, ok := x[key]
		return v, ok
	case map[string]any:
		v, ok := x[key]
		return v, ok
	}
	return nil, false
}

// mapClone copies a canonical map (or makes an empty one of t's form).
func mapClone(m any, t *schema.Type) any {
	switch x := m.(type) {
	case map[string]string:
		return cloneOrMake(x)
	case map[string]int64:
		return cloneOrMake(x)
	case map[string]float64:
		return cloneOrMake(x)
	case map[string][]string:
		return cloneOrMake(x)
	case map[string]any:
		return cloneOrMake(x)
	}
	return schema.Zero(t)
}

func cloneOrMake[V any](m map[string]V) map[string]V {
	if m == nil {
		return map[string]V{}
	}
	return maps.Clone(m)
}
