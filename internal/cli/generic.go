package cli

import (
	"slices"
	"strings"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// filterKind is how a filter compares.
type filterKind uint8

const (
	filterPlain filterKind = iota // field=value
	filterMap                     // map-field:key=value
	filterSet                     // set-field:contains=value
)

type filter struct {
	fv   *fieldView
	kind filterKind
	key  string
	val  string
}

// parseFilter reads a filter argument as xapi does: a field name; or
// "field:key" on a map or "field:contains" on a set; or the old form
// "map-field-key", matched against the longest map (then set) field
// whose name prefixes it.
func (v *classView) parseFilter(k, val string) (filter, error) {
	if fv := v.lookup(k); fv != nil {
		return filter{fv: fv, val: val}, nil
	}
	if name, key, ok := strings.Cut(k, ":"); ok {
		fv := v.lookup(name)
		switch {
		case fv == nil:
			return filter{}, failf("Unknown field '%s'", k)
		case fv.isMap():
			return filter{fv: fv, kind: filterMap, key: key, val: val}, nil
		case fv.isSet():
			if key != "contains" {
				return filter{}, failf("Invalid syntax for set filtering (should be set-param:contains=key)")
			}
			return filter{fv: fv, kind: filterSet, val: val}, nil
		}
		return filter{}, failf("Field '%s' is not a set or map", fv.name)
	}
	var best *fieldView
	for _, want := range []func(*fieldView) bool{(*fieldView).isMap, (*fieldView).isSet} {
		for _, fv := range v.fields {
			if want(fv) && strings.HasPrefix(k, fv.name+"-") && (best == nil || len(fv.name) > len(best.name)) {
				best = fv
			}
		}
		if best != nil {
			break
		}
	}
	switch {
	case best == nil:
		return filter{}, failf("Unknown field '%s'", k)
	case best.isMap():
		return filter{fv: best, kind: filterMap, key: k[len(best.name)+1:], val: val}, nil
	}
	if k[len(best.name)+1:] != "contains" {
		return filter{}, failf("Invalid syntax for set filtering (should be set-param:contains=key)")
	}
	return filter{fv: best, kind: filterSet, val: val}, nil
}

// match reports whether a row passes a filter. Enumerations compare
// without regard to case.
func (f filter) match(fm formatter, row *db.Row) bool {
	fold := f.fv.f.Type.Kind == schema.KEnum ||
		(f.fv.f.Type.Elem != nil && f.fv.f.Type.Elem.Kind == schema.KEnum)
	eq := func(a, b string) bool {
		if fold {
			return strings.EqualFold(a, b)
		}
		return a == b
	}
	switch f.kind {
	case filterMap:
		for _, e := range fm.entries(f.fv.f.Type, fm.snap.Value(row, f.fv.f)) {
			if e.k == f.key {
				return eq(e.v, f.val)
			}
		}
		return false
	case filterSet:
		for _, it := range fm.items(f.fv.f.Type, fm.snap.Value(row, f.fv.f)) {
			if eq(it, f.val) {
				return true
			}
		}
		return false
	}
	return eq(fm.get(row, f.fv), f.val)
}

// isFilterParam reports whether a parameter of a list or selector
// command is a filter (and not a setting of the command).
func isFilterParam(k string, own map[string]bool) bool {
	stem, _, _ := strings.Cut(k, ":")
	return !standardParams[k] && !standardParams[stem] && !own[k] && !own[stem] && !own[stem+":"] && k != "params" &&
		!strings.HasPrefix(k, "database:") && k != "session_id"
}

// filterRows keeps the rows that pass the view's own filters and the
// filter parameters.
func (c *Ctx) filterRows(v *classView, fm formatter, rows []*db.Row, own map[string]bool) ([]*db.Row, error) {
	var fs []filter
	for _, p := range v.filters {
		f, err := v.parseFilter(p.k, p.v)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	for _, p := range c.params {
		if !isFilterParam(p.k, own) {
			continue
		}
		f, err := v.parseFilter(p.k, p.v)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	if len(fs) == 0 {
		return rows, nil
	}
	out := rows[:0:0]
	for _, r := range rows {
		ok := true
		for _, f := range fs {
			if !f.match(fm, r) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// allRows is every row of a view's class, read through the API so that
// the session's roles apply.
func (c *Ctx) allRows(v *classView) ([]*db.Row, error) {
	res, err := c.call(v.class.Name + ".get_all_records")
	if err != nil {
		return nil, err
	}
	rows, _ := res.([]*db.Row)
	return rows, nil
}

// rowByUUID finds an object of a view's class by uuid, through the API.
func (c *Ctx) rowByUUID(v *classView, uuid string) (*db.Row, formatter, error) {
	res, err := c.call(v.class.Name+".get_by_uuid", uuid)
	if err != nil {
		return nil, formatter{}, err
	}
	snap := c.s.api.DB.Snapshot()
	row, ok := snap.Get(v.class, res.(string))
	if !ok {
		return nil, formatter{}, xerr.New(xerr.UUIDInvalid, v.class.Name, uuid)
	}
	return row, formatter{snap}, nil
}

// selectFields is the set of fields to print: params=all, params=a,b, or
// the view's defaults (nil means every field).
func (c *Ctx) selectFields(v *classView) map[string]bool {
	names := v.defaults
	if p, ok := c.param("params"); ok {
		if p == "all" {
			return nil
		}
		names = strings.Split(p, ",")
	}
	if len(names) == 0 {
		return nil
	}
	only := make(map[string]bool, len(names))
	for _, n := range names {
		n = strings.TrimSpace(n)
		if fv := v.lookup(n); fv != nil {
			only[fv.name] = true
		}
	}
	return only
}

func (c *Ctx) noOtherDatabase() error {
	for _, p := range c.params {
		if strings.HasPrefix(p.k, "database:") {
			return failf("reading another database (%s) is not supported by toolstackd", p.k)
		}
	}
	return nil
}

// listCmd is <class>-list.
func listCmd(v *classView) func(*Ctx) error {
	return func(c *Ctx) error {
		if err := c.noOtherDatabase(); err != nil {
			return err
		}
		rows, err := c.allRows(v)
		if err != nil {
			return err
		}
		fm := formatter{c.s.api.DB.Snapshot()}
		all, err := c.boolParam("all")
		if err != nil {
			return err
		}
		// Filters are checked even with --all, which then prints every
		// record regardless (as xapi does).
		kept, err := c.filterRows(v, fm, rows, nil)
		if err != nil {
			return err
		}
		if all {
			kept = rows
		}
		only := c.selectFields(v)
		recs := make([][]field, len(kept))
		for i, r := range kept {
			recs[i] = fm.record(v, r, only)
		}
		c.out.table(recs)
		return nil
	}
}

// paramListCmd is <class>-param-list.
func paramListCmd(v *classView) func(*Ctx) error {
	return func(c *Ctx) error {
		if err := c.noOtherDatabase(); err != nil {
			return err
		}
		row, fm, err := c.rowByUUID(v, c.require("uuid"))
		if err != nil {
			return err
		}
		c.out.table([][]field{fm.record(v, row, nil)})
		return nil
	}
}

// fieldOf finds the field a param-name names; xapi reports an unknown
// one as the error "Missing parameter".
func fieldOf(v *classView, name string) (*fieldView, error) {
	fv := v.lookup(name)
	if fv == nil {
		return nil, xerr.New(xerr.MissingParameter, name)
	}
	return fv, nil
}

// onField makes a <class>-param-get/add/remove/clear command: run works
// on the object named by uuid= and its field named by param-name=.
func onField(v *classView, run func(c *Ctx, row *db.Row, fm formatter, fv *fieldView) error) func(*Ctx) error {
	return func(c *Ctx) error {
		row, fm, err := c.rowByUUID(v, c.require("uuid"))
		if err != nil {
			return err
		}
		fv, err := fieldOf(v, c.require("param-name"))
		if err != nil {
			return err
		}
		return run(c, row, fm, fv)
	}
}

// paramGetCmd is <class>-param-get.
func paramGetCmd(v *classView) func(*Ctx) error {
	get := onField(v, (*Ctx).paramGet)
	return func(c *Ctx) error {
		if err := c.noOtherDatabase(); err != nil {
			return err
		}
		return get(c)
	}
}

func (c *Ctx) paramGet(row *db.Row, fm formatter, fv *fieldView) error {
	if key, ok := c.param("param-key"); ok && fv.isMap() {
		for _, e := range fm.entries(fv.f.Type, fm.snap.Value(row, fv.f)) {
			if e.k == key {
				c.out.list(e.v)
				return nil
			}
		}
		return failf("Key %s not found in map", key)
	}
	c.out.list(fm.get(row, fv))
	return nil
}

// mapKey reads a map key typed on the command line.
func (c *Ctx) mapKey(fv *fieldView, key string) (any, error) {
	k, err := c.parseValue(fv.f.Type.Key, key, fv.name)
	if err != nil {
		return nil, err
	}
	return schema.FormatDB(fv.f.Type.Key, k), nil
}

// hasKey reports whether a map field of a row holds a key (given in
// canonical form).
func hasKey(fm formatter, row *db.Row, fv *fieldView, key string) bool {
	for _, e := range fm.entries(fv.f.Type, fm.snap.Value(row, fv.f)) {
		if e.k == key || e.k == fm.scalar(fv.f.Type.Key, key) {
			return true
		}
	}
	return false
}

// paramSetCmd is <class>-param-set: each field=value or map:key=value.
func paramSetCmd(v *classView) func(*Ctx) error {
	return func(c *Ctx) error {
		row, fm, err := c.rowByUUID(v, c.require("uuid"))
		if err != nil {
			return err
		}
		for _, p := range c.params {
			if p.k == "uuid" || standardParams[p.k] {
				continue
			}
			if err := c.setOne(v, fm, row, p.k, p.v); err != nil {
				return err
			}
		}
		return nil
	}
}

func (c *Ctx) setOne(v *classView, fm formatter, row *db.Row, k, val string) error {
	f, err := v.parseFilter(k, val)
	if err != nil {
		return err
	}
	fv := f.fv
	switch f.kind {
	case filterSet:
		return failf("Cannot param-set on set fields")
	case filterMap:
		if fv.adder == "" {
			return failf("Map field '%s' is read-only.", fv.name)
		}
		key, err := c.mapKey(fv, f.key)
		if err != nil {
			return err
		}
		elem, err := c.parseValue(fv.f.Type.Elem, val, fv.name)
		if err != nil {
			return err
		}
		if hasKey(fm, row, fv, key.(string)) {
			if _, err := c.call(fv.remover, row.Ref, key); err != nil {
				return err
			}
		}
		_, err = c.call(fv.adder, row.Ref, key, elem)
		return err
	}
	if fv.isSet() {
		return failf("Cannot param-set on set fields")
	}
	if fv.setter == "" || fv.isMap() {
		if fv.isMap() {
			return failf("Field '%s' is a map or set. use the 'name:key=value' syntax.", k)
		}
		return failf("Field '%s' is read-only.", k)
	}
	x, err := c.parseValue(fv.f.Type, val, k)
	if err != nil {
		return err
	}
	_, err = c.call(fv.setter, row.Ref, x)
	return err
}

// paramAddCmd is <class>-param-add: param-key to a set, or key=value
// pairs to a map.
func paramAddCmd(v *classView) func(*Ctx) error { return onField(v, (*Ctx).paramAdd) }

func (c *Ctx) paramAdd(row *db.Row, _ formatter, fv *fieldView) error {
	switch {
	case fv.isSet() && fv.adder != "":
		key, ok := c.param("param-key")
		if !ok {
			return failf("When adding a key to a set, use the syntax: *-param-add param-name=<name> param-key=<key>")
		}
		x, err := c.parseValue(fv.f.Type.Elem, key, fv.name)
		if err != nil {
			return err
		}
		_, err = c.call(fv.adder, row.Ref, x)
		return err
	case fv.isMap() && fv.adder != "":
		for _, p := range c.params {
			switch p.k {
			case "uuid", "param-name", "param-key":
				continue
			}
			if standardParams[p.k] {
				continue
			}
			key, err := c.mapKey(fv, p.k)
			if err != nil {
				return err
			}
			elem, err := c.parseValue(fv.f.Type.Elem, p.v, fv.name)
			if err != nil {
				return err
			}
			if _, err := c.call(fv.adder, row.Ref, key, elem); err != nil {
				return err
			}
		}
		return nil
	case fv.isSet() || fv.isMap():
		return failf("Parameter is read-only")
	}
	return failf("Can only add to parameters of type Set or Map")
}

// paramRemoveCmd is <class>-param-remove: a member of a set or a key of
// a map.
func paramRemoveCmd(v *classView) func(*Ctx) error { return onField(v, (*Ctx).paramRemove) }

func (c *Ctx) paramRemove(row *db.Row, fm formatter, fv *fieldView) error {
	key := c.require("param-key")
	switch {
	case fv.isSet() && fv.remover != "":
		if !slices.Contains(fm.items(fv.f.Type, fm.snap.Value(row, fv.f)), key) {
			return failf("Key %s is not in the set", key)
		}
		x, err := c.parseValue(fv.f.Type.Elem, key, fv.name)
		if err != nil {
			return err
		}
		_, err = c.call(fv.remover, row.Ref, x)
		return err
	case fv.isMap() && fv.remover != "":
		k, err := c.mapKey(fv, key)
		if err != nil {
			return err
		}
		if !hasKey(fm, row, fv, k.(string)) {
			return failf("Key %s is not in map", key)
		}
		_, err = c.call(fv.remover, row.Ref, k)
		return err
	case fv.isSet() || fv.isMap():
		return failf("Cannot remove parameters from read-only map")
	}
	return failf("Can only remove from parameters of type Set or Map")
}

// paramClearCmd is <class>-param-clear: empties a set or map, or sets a
// plain field to its empty value.
func paramClearCmd(v *classView) func(*Ctx) error { return onField(v, (*Ctx).paramClear) }

func (c *Ctx) paramClear(row *db.Row, fm formatter, fv *fieldView) error {
	val := fm.snap.Value(row, fv.f)
	switch {
	case fv.isSet() && fv.remover != "":
		items := c.rawItems(val)
		for _, it := range items {
			if _, err := c.call(fv.remover, row.Ref, it); err != nil {
				return err
			}
		}
		return nil
	case fv.isMap() && fv.setter != "":
		_, err := c.call(fv.setter, row.Ref, schema.EmptyMap(fv.f.Type))
		return err
	case fv.isMap() && fv.remover != "":
		for _, k := range mapKeys(val) {
			if _, err := c.call(fv.remover, row.Ref, k); err != nil {
				return err
			}
		}
		return nil
	case fv.setter != "" && !fv.isSet() && !fv.isMap():
		x, err := c.parseValue(fv.f.Type, "", fv.name)
		if err != nil {
			return failf("Cannot clear this parameter")
		}
		_, err = c.call(fv.setter, row.Ref, x)
		return err
	}
	return failf("Can only clear RW parameters")
}

// rawItems lists a canonical set's members as canonical values.
func (c *Ctx) rawItems(v any) []any {
	var out []any
	switch x := v.(type) {
	case []string:
		for _, e := range x {
			out = append(out, e)
		}
	case []int64:
		for _, e := range x {
			out = append(out, e)
		}
	case []any:
		out = append(out, x...)
	}
	return out
}

func mapKeys(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]string:
		out = schema.SortedKeys(x)
	case map[string]int64:
		out = schema.SortedKeys(x)
	case map[string]float64:
		out = schema.SortedKeys(x)
	case map[string][]string:
		out = schema.SortedKeys(x)
	case map[string]any:
		out = schema.SortedKeys(x)
	}
	return out
}
