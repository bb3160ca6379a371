package api

import (
	"math"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/api/wire"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// DecodeValue reads a neutral value (as the wire codecs or an XVA's
// ova.xml give it) as type t, exactly as a call's argument is read: other
// modules that take XenAPI values from outside use it, so that they accept
// what the API accepts and nothing more. name is what FIELD_TYPE_ERROR
// reports.
func DecodeValue(t *schema.Type, v any, name string) (any, error) { return decodeValue(t, v, name) }

// decodeValue turns a neutral wire value into the canonical value of type
// t, accepting the spellings real clients send (ints as strings, dates as
// strings, ...). name is what FIELD_TYPE_ERROR reports.
func decodeValue(t *schema.Type, v any, name string) (any, error) {
	switch t.Kind {
	case schema.KString:
		switch x := v.(type) {
		case string:
			return x, nil
		case nil:
			return "", nil
		}
		return nil, fieldTypeError(name)
	case schema.KRef:
		switch x := v.(type) {
		case string:
			if x == "" {
				return schema.NullRef, nil
			}
			return x, nil
		case nil:
			return schema.NullRef, nil
		}
		return nil, fieldTypeError(name)
	case schema.KEnum:
		return decodeEnum(t, v, name)
	case schema.KInt:
		return decodeInt(v, name)
	case schema.KFloat:
		return decodeFloat(v, name)
	case schema.KBool:
		return decodeBool(v, name)
	case schema.KDateTime:
		return decodeDateTime(v, name)
	case schema.KSet:
		return decodeSet(t, v, name)
	case schema.KMap:
		return decodeMap(t, v, name)
	case schema.KOption:
		if v == nil {
			return nil, nil
		}
		return decodeValue(t.Elem, v, name)
	case schema.KRecord:
		return decodeRecord(t, v, name)
	}
	return nil, fieldTypeError(name)
}

// fieldTypeError is FIELD_TYPE_ERROR for the value called name.
func fieldTypeError(name string) error { return xerr.New(xerr.FieldTypeError, name) }

// decodeEnum decodes a value of the enum type t: a string naming one of
// its values, in any case.
func decodeEnum(t *schema.Type, v any, name string) (any, error) {
	s, ok := v.(string)
	if !ok {
		return nil, fieldTypeError(name)
	}
	if t.Enum != nil && !t.Enum.Has(s) {
		// xapi matches enum values without regard to case.
		for _, e := range t.Enum.Values {
			if strings.EqualFold(e, s) {
				return e, nil
			}
		}
		return nil, xerr.New(xerr.InvalidValue, name, s)
	}
	return s, nil
}

// decodeInt decodes an int: an integer, a string holding one, or a
// float with no fraction.
func decodeInt(v any, name string) (any, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err != nil {
			return nil, fieldTypeError(name)
		}
		return n, nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<63 {
			return int64(x), nil
		}
	}
	return nil, fieldTypeError(name)
}

// decodeFloat decodes a float: a float, an integer or a string holding
// one.
func decodeFloat(v any, name string) (any, error) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case int64:
		return float64(x), nil
	case string:
		f, err := schema.ParseFloat(strings.TrimSpace(x))
		if err != nil {
			return nil, fieldTypeError(name)
		}
		return f, nil
	}
	return nil, fieldTypeError(name)
}

// decodeBool decodes a bool: a bool, "true", "false", "1" or "0" in any
// case, or an integer (true unless 0).
func decodeBool(v any, name string) (any, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		switch strings.ToLower(x) {
		case "true", "1":
			return true, nil
		case "false", "0":
			return false, nil
		}
	case int64:
		return x != 0, nil
	}
	return nil, fieldTypeError(name)
}

// decodeDateTime decodes a date and time, in UTC: a time, a string in
// one of the forms schema.ParseTime reads, or seconds since the epoch.
func decodeDateTime(v any, name string) (any, error) {
	switch x := v.(type) {
	case time.Time:
		return x.UTC(), nil
	case string:
		tm, err := schema.ParseTime(x)
		if err != nil {
			return nil, fieldTypeError(name)
		}
		return tm, nil
	case float64:
		return time.Unix(0, int64(x*1e9)).UTC(), nil
	case int64:
		return time.Unix(x, 0).UTC(), nil
	}
	return nil, fieldTypeError(name)
}

// decodeSet decodes a set: an array (or a list of strings).
func decodeSet(t *schema.Type, v any, name string) (any, error) {
	items, ok := v.([]any)
	if !ok {
		if v == nil {
			items = nil
		} else if s, isStrs := v.([]string); isStrs {
			for _, e := range s {
				items = append(items, e)
			}
		} else {
			return nil, xerr.New(xerr.FieldTypeError, name)
		}
	}
	switch {
	case t.Elem.StringLike():
		return decodeElems[string](t.Elem, items, name)
	case t.Elem.Kind == schema.KInt:
		return decodeElems[int64](t.Elem, items, name)
	}
	return decodeElems[any](t.Elem, items, name)
}

// decodeMap decodes a map: a struct whose member names are the keys.
func decodeMap(t *schema.Type, v any, name string) (any, error) {
	m, ok := v.(map[string]any)
	if !ok && v != nil {
		return nil, xerr.New(xerr.FieldTypeError, name)
	}
	out := schema.EmptyMap(t)
	for k, x := range m {
		if t.Key.Kind == schema.KInt {
			if _, err := strconv.ParseInt(k, 10, 64); err != nil {
				return nil, xerr.New(xerr.FieldTypeError, name)
			}
		}
		e, err := decodeValue(t.Elem, x, name)
		if err != nil {
			return nil, err
		}
		out = schema.MapPut(out, k, e)
	}
	return out, nil
}

// decodeRecord decodes a record: members the class does not know, or
// keeps to itself, are ignored as xapi ignores them.
func decodeRecord(t *schema.Type, v any, name string) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, xerr.New(xerr.FieldTypeError, name)
	}
	if t.Class == nil {
		return m, nil
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		f := t.Class.Field(k)
		if f == nil || f.Internal {
			continue
		}
		e, err := decodeValue(f.Type, x, f.Name)
		if err != nil {
			if f.Qualifier == schema.DynamicRO {
				// A runtime field is the server's: constructors do not
				// take it, so a value it could not hold is dropped, not
				// refused, as xapi does (the Go SDK sends whole records,
				// ipv4_configuration_mode "" and snapshot_time 111T0:0:0
				// included).
				continue
			}
			return nil, err
		}
		out[f.Name] = e
	}
	return out, nil
}

// typed is a canonical value with its type, ready to be written by a wire
// encoder. Rows are written as records, reading derived sets through snap.
type typed struct {
	t    *schema.Type
	v    any
	snap db.Reader
	rows *rowCache // encoded records to reuse; nil: none
}

func (tv typed) MarshalXenAPI(e wire.Encoder) { tv.rows.value(e, tv.t, tv.v, tv.snap) }

// value writes a canonical value of type t; records come from the cache c.
func (c *rowCache) value(e wire.Encoder, t *schema.Type, v any, snap db.Reader) {
	switch x := v.(type) {
	case *db.Row:
		c.row(e, snap, x)
		return
	case wire.Marshaler:
		x.MarshalXenAPI(e)
		return
	}
	switch t.Kind {
	case schema.KString, schema.KEnum, schema.KRef:
		s, _ := v.(string)
		if t.Kind == schema.KRef && s == "" {
			s = schema.NullRef
		}
		e.String(s)
	case schema.KInt:
		n, _ := v.(int64)
		e.Int(n)
	case schema.KFloat:
		f, _ := v.(float64)
		e.Float(f)
	case schema.KBool:
		b, _ := v.(bool)
		e.Bool(b)
	case schema.KDateTime:
		tm, _ := v.(time.Time)
		e.Time(tm)
	case schema.KSet:
		c.setValue(e, t, v, snap)
	case schema.KMap:
		c.mapValue(e, t, v, snap)
	case schema.KRecord:
		c.recordValue(e, t, v, snap)
	case schema.KOption:
		if v == nil {
			e.Nil()
			return
		}
		c.value(e, t.Elem, v, snap)
	case schema.KVoid:
		e.String("")
	default:
		wire.Encode(e, v)
	}
}

// setValue writes a canonical value of the set type t.
func (c *rowCache) setValue(e wire.Encoder, t *schema.Type, v any, snap db.Reader) {
	e.BeginArray()
	switch s := v.(type) {
	case []string:
		for _, it := range s {
			e.String(it)
		}
	case []int64:
		for _, it := range s {
			e.Int(it)
		}
	case []any:
		for _, it := range s {
			c.value(e, t.Elem, it, snap)
		}
	case []*db.Row:
		for _, it := range s {
			c.row(e, snap, it)
		}
	}
	e.EndArray()
}

// mapValue writes a canonical value of the map type t, its keys in
// order; rows are written as a map from their refs to their records.
func (c *rowCache) mapValue(e wire.Encoder, t *schema.Type, v any, snap db.Reader) {
	e.BeginStruct()
	switch m := v.(type) {
	case map[string]string:
		for _, k := range schema.SortedKeys(m) {
			e.Member(k)
			e.String(m[k])
		}
	case map[string]int64:
		for _, k := range schema.SortedKeys(m) {
			e.Member(k)
			e.Int(m[k])
		}
	case map[string]float64:
		for _, k := range schema.SortedKeys(m) {
			e.Member(k)
			e.Float(m[k])
		}
	case map[string][]string:
		for _, k := range schema.SortedKeys(m) {
			e.Member(k)
			c.value(e, t.Elem, m[k], snap)
		}
	case map[string]any:
		for _, k := range schema.SortedKeys(m) {
			e.Member(k)
			c.value(e, t.Elem, m[k], snap)
		}
	case []*db.Row: // ref -> record maps from get_all_records
		for _, r := range m {
			e.Member(r.Ref)
			c.row(e, snap, r)
		}
	}
	e.EndStruct()
}

// recordValue writes a canonical value of the record type t: its
// class's fields but the internal ones, in order, those missing with
// their defaults (a record of no class as it is).
func (c *rowCache) recordValue(e wire.Encoder, t *schema.Type, v any, snap db.Reader) {
	m, _ := v.(map[string]any)
	if t.Class == nil {
		wire.Encode(e, m)
		return
	}
	e.BeginStruct()
	for _, f := range t.Class.Fields {
		if f.Internal {
			continue
		}
		e.Member(f.Name)
		fv, ok := m[f.Name]
		if !ok {
			fv = t.Class.Base[f.Index]
		}
		c.value(e, f.Type, fv, snap)
	}
	e.EndStruct()
}

// decodeElems decodes a set's elements into their canonical slice.
func decodeElems[T any](t *schema.Type, items []any, name string) ([]T, error) {
	out := make([]T, 0, len(items))
	for _, it := range items {
		e, err := decodeValue(t, it, name)
		if err != nil {
			return nil, err
		}
		out = append(out, e.(T))
	}
	return out, nil
}
