package xva

import (
	"fmt"
	"time"

	"toolstackd/internal/api"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// Records move between the database and ova.xml in two directions:
// snapshotOf writes a row as XML-RPC's neutral values with references
// rewritten to archive ids, and recordOf reads an archive's record back
// into the canonical values a constructor takes, keeping only the fields
// the constructor may be given.

// snapshotOf is row as an archive record: every public field, with a
// reference to an exported object written as its id and any other
// reference as the null ref (sets of references keep only the exported).
func snapshotOf(snap db.Reader, cls *schema.Class, row *db.Row, ids map[string]string) map[string]any {
	out := make(map[string]any, len(cls.Fields))
	for _, f := range cls.Fields {
		if f.Internal {
			continue
		}
		v := snap.Value(row, f)
		if f.Name == "uuid" {
			v = row.UUID()
		}
		if n := neutral(f.Type, v, ids); n != nil {
			out[f.Name] = n
		}
	}
	return out
}

// neutral is a canonical value as a neutral one; nil when it has none
// (an empty option).
func neutral(t *schema.Type, v any, ids map[string]string) any {
	if v == nil {
		if t.Kind == schema.KOption || t.Kind == schema.KRecord {
			return nil
		}
		v = schema.Zero(t)
	}
	switch t.Kind {
	case schema.KString, schema.KEnum:
		s, _ := v.(string)
		return s
	case schema.KRef:
		s, _ := v.(string)
		if id, ok := ids[s]; ok {
			return id
		}
		return schema.NullRef
	case schema.KInt:
		n, _ := v.(int64)
		return n
	case schema.KFloat:
		f, _ := v.(float64)
		return f
	case schema.KBool:
		b, _ := v.(bool)
		return b
	case schema.KDateTime:
		tm, _ := v.(time.Time)
		return tm
	case schema.KOption:
		return neutral(t.Elem, v, ids)
	case schema.KSet:
		out := []any{}
		add := func(x any) {
			if t.Elem.Kind == schema.KRef {
				if id, ok := ids[x.(string)]; ok {
					out = append(out, id)
				}
				return
			}
			if n := neutral(t.Elem, x, ids); n != nil {
				out = append(out, n)
			}
		}
		switch xs := v.(type) {
		case []string:
			for _, x := range xs {
				add(x)
			}
		case []int64:
			for _, x := range xs {
				add(x)
			}
		case []any:
			for _, x := range xs {
				add(x)
			}
		}
		return out
	case schema.KMap:
		out := map[string]any{}
		for k, x := range schema.MapEntries(v) {
			if t.Elem.Kind == schema.KRef {
				if id, ok := ids[x.(string)]; ok {
					out[k] = id
				}
				continue
			}
			if n := neutral(t.Elem, x, ids); n != nil {
				out[k] = n
			}
		}
		return out
	}
	return nil
}

// recordOf reads an archive record for cls's constructor: fields the
// class does not have, keeps to itself or sets at run time are dropped,
// as are references (the caller sets those it maps). An enum value this
// model lacks leaves the field to its default; any other value of the
// wrong type is an error naming the field.
func recordOf(cls *schema.Class, snap map[string]any) (map[string]any, error) {
	out := make(map[string]any, len(snap))
	for k, x := range snap {
		f := cls.Field(k)
		if f == nil || f.Internal || f.Derived || f.Qualifier == schema.DynamicRO || f.Name == "uuid" || hasRef(f.Type) {
			continue
		}
		v, err := api.DecodeValue(f.Type, x, f.Name)
		if err != nil {
			if f.Type.Kind == schema.KEnum {
				continue
			}
			return nil, fmt.Errorf("field %s of %s: %v", f.Name, cls.Name, err)
		}
		out[f.Name] = v
	}
	return out, nil
}

func hasRef(t *schema.Type) bool {
	for ; t != nil; t = t.Elem {
		if t.Kind == schema.KRef || t.Kind == schema.KRecord {
			return true
		}
	}
	return false
}
