package xmldb

import (
	"slices"
	"strings"
	"sync"

	"toolstackd/internal/schema"
)

// layout is what both directions work out once per model: the database
// tables in file order, and for each class the encoder's columns in file
// order and the decoder's index of columns by name. Models are immutable
// once built, so a layout is cached for the life of the process.
type layout struct {
	tables []*schema.Class      // database classes, by name
	enc    [][]column           // by class index
	dec    []map[string]colInfo // by class index
}

// column is one attribute of a row as the encoder writes it: a field, or
// _ref when field is nil.
type column struct {
	attr  []byte // ` name="`
	field *schema.Field
}

// colInfo is what the decoder knows about one column of a class.
type colInfo struct {
	field *schema.Field
	check bool           // the parsed value must also pass schema.Check
	skip  bool           // read but not kept: derived or otherwise not persisted
	enum  map[string]any // for an enum column: each value, boxed once
}

var layouts sync.Map // *schema.Model -> *layout

func layoutOf(m *schema.Model) *layout {
	if l, ok := layouts.Load(m); ok {
		return l.(*layout)
	}
	l, _ := layouts.LoadOrStore(m, buildLayout(m))
	return l.(*layout)
}

func buildLayout(m *schema.Model) *layout {
	l := &layout{enc: make([][]column, len(m.Classes)), dec: make([]map[string]colInfo, len(m.Classes))}
	enums := map[*schema.Enum]map[string]any{}
	for _, c := range m.Classes {
		if !c.InDB {
			continue
		}
		l.tables = append(l.tables, c)
		l.enc[c.Index] = encColumns(c)
		dec := make(map[string]colInfo, len(c.Fields))
		for _, f := range c.Fields {
			ci := colInfo{field: f, check: needsCheck(f.Type), skip: f.Derived || !f.Persist}
			if e := f.Type.Enum; f.Type.Kind == schema.KEnum && e != nil {
				if enums[e] == nil {
					boxed := make(map[string]any, len(e.Values))
					for _, v := range e.Values {
						boxed[v] = v
					}
					enums[e] = boxed
				}
				ci.enum = enums[e]
			}
			dec[f.Column] = ci
		}
		l.dec[c.Index] = dec
	}
	slices.SortFunc(l.tables, func(a, b *schema.Class) int { return strings.Compare(a.Name, b.Name) })
	return l
}

// encColumns lists class c's attributes in byte order of their names,
// _ref among them.
func encColumns(c *schema.Class) []column {
	type named struct {
		name  string
		field *schema.Field
	}
	ns := []named{{name: "_ref"}}
	for _, f := range c.Fields {
		ns = append(ns, named{f.Column, f})
	}
	slices.SortStableFunc(ns, func(a, b named) int { return strings.Compare(a.name, b.name) })
	cols := make([]column, len(ns))
	for i, n := range ns {
		a := append([]byte(" "), n.name...)
		cols[i] = column{attr: append(a, `="`...), field: n.field}
	}
	return cols
}

// needsCheck reports whether values of t that ParseDB accepts may still
// be wrong: enums outside their enum, refs that are not refs.
func needsCheck(t *schema.Type) bool {
	switch t.Kind {
	case schema.KEnum, schema.KRef:
		return true
	case schema.KSet, schema.KOption:
		return needsCheck(t.Elem)
	case schema.KMap:
		return needsCheck(t.Key) || needsCheck(t.Elem)
	}
	return false
}
