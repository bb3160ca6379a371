package schema

import (
	"fmt"
	"iter"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Canonical values. Every layer holds XenAPI values in one Go form per type,
// so that the database, the codecs and the CLI agree without conversions:
//
//	string, enum, ref          string (the null ref is NullRef)
//	int                        int64
//	float                      float64
//	bool                       bool
//	datetime                   time.Time, UTC
//	set of string/enum/ref     []string
//	set of int                 []int64
//	map                        keys as strings (int keys in decimal); values:
//	                             string/enum/ref -> map[string]string
//	                             int             -> map[string]int64
//	                             float           -> map[string]float64
//	                             set of strings  -> map[string][]string
//	option                     nil, or the value
//	record                     map[string]any of canonical values
//	anything else              []any / map[string]any
//
// Empty sets and maps may be nil. Values are treated as immutable once they
// are handed to another layer: copy before changing.

// NullRef is the null reference.
const NullRef = "OpaqueRef:NULL"

// TimeLayout is xapi's form of a datetime, on the wire and on disk.
const TimeLayout = "20060102T15:04:05Z"

// Epoch is the zero datetime as xapi writes it.
var Epoch = time.Unix(0, 0).UTC()

// TypeError says a value does not fit a type.
type TypeError struct {
	Type  *Type
	Value any
	Msg   string
}

func (e *TypeError) Error() string {
	if e.Msg != "" {
		return fmt.Sprintf("value %v does not fit type %s: %s", e.Value, e.Type, e.Msg)
	}
	return fmt.Sprintf("value %v (%T) does not fit type %s", e.Value, e.Value, e.Type)
}

// Zero returns the empty value of t: "", 0, 0.0, false, the epoch, the first
// enum value, the null ref, an empty set or map, a missing option.
func Zero(t *Type) any {
	switch t.Kind {
	case KString:
		return ""
	case KInt:
		return int64(0)
	case KFloat:
		return float64(0)
	case KBool:
		return false
	case KDateTime:
		return Epoch
	case KEnum:
		if t.Enum != nil && len(t.Enum.Values) > 0 {
			return t.Enum.Values[0]
		}
		return ""
	case KRef:
		return NullRef
	case KSet:
		switch {
		case t.Elem.StringLike():
			return []string(nil)
		case t.Elem.Kind == KInt:
			return []int64(nil)
		}
		return []any(nil)
	case KMap:
		switch {
		case t.Elem.StringLike():
			return map[string]string(nil)
		case t.Elem.Kind == KInt:
			return map[string]int64(nil)
		case t.Elem.Kind == KFloat:
			return map[string]float64(nil)
		case t.Elem.Kind == KSet && t.Elem.Elem.StringLike():
			return map[string][]string(nil)
		}
		return map[string]any(nil)
	case KRecord:
		return map[string]any(nil)
	}
	return nil
}

// Check reports whether v is a canonical value of t, including enum
// membership and the shape of refs.
func Check(t *Type, v any) error {
	bad := func(msg string) error { return &TypeError{Type: t, Value: v, Msg: msg} }
	switch t.Kind {
	case KString:
		if _, ok := v.(string); !ok {
			return bad("")
		}
	case KEnum:
		s, ok := v.(string)
		if !ok {
			return bad("")
		}
		if t.Enum != nil && !t.Enum.Has(s) {
			return bad("not a value of enum " + t.Name)
		}
	case KRef:
		s, ok := v.(string)
		if !ok {
			return bad("")
		}
		if !IsRef(s) {
			return bad("not a reference")
		}
	case KInt:
		if _, ok := v.(int64); !ok {
			return bad("")
		}
	case KFloat:
		if _, ok := v.(float64); !ok {
			return bad("")
		}
	case KBool:
		if _, ok := v.(bool); !ok {
			return bad("")
		}
	case KDateTime:
		tm, ok := v.(time.Time)
		if !ok {
			return bad("")
		}
		// xapi's form has a four-digit year.
		if y := tm.UTC().Year(); y < 0 || y > 9999 {
			return bad("year out of range")
		}
	case KSet:
		return checkSet(t, v)
	case KMap:
		return checkMap(t, v)
	case KOption:
		if v == nil {
			return nil
		}
		return Check(t.Elem, v)
	case KRecord:
		if _, ok := v.(map[string]any); !ok {
			return bad("")
		}
	default:
		return bad("no values of this kind")
	}
	return nil
}

// checkSet is Check for the set type t.
func checkSet(t *Type, v any) error {
	switch s := v.(type) {
	case []string:
		if !t.Elem.StringLike() {
			return &TypeError{Type: t, Value: v}
		}
		for _, e := range s {
			if err := Check(t.Elem, e); err != nil {
				return err
			}
		}
	case []int64:
		if t.Elem.Kind != KInt {
			return &TypeError{Type: t, Value: v}
		}
	case []any:
		for _, e := range s {
			if err := Check(t.Elem, e); err != nil {
				return err
			}
		}
	default:
		return &TypeError{Type: t, Value: v}
	}
	return nil
}

// checkMap is Check for the map type t.
func checkMap(t *Type, v any) error {
	switch mv := v.(type) {
	case map[string]string:
		if !t.Elem.StringLike() {
			return &TypeError{Type: t, Value: v}
		}
		return checkEntries(t, mv, true)
	case map[string]int64:
		if t.Elem.Kind != KInt {
			return &TypeError{Type: t, Value: v}
		}
		return checkEntries(t, mv, false)
	case map[string]float64:
		if t.Elem.Kind != KFloat {
			return &TypeError{Type: t, Value: v}
		}
		return checkEntries(t, mv, false)
	case map[string][]string:
		if t.Elem.Kind != KSet || !t.Elem.Elem.StringLike() {
			return &TypeError{Type: t, Value: v}
		}
		return checkEntries(t, mv, false)
	case map[string]any:
		return checkEntries(t, mv, true)
	}
	return &TypeError{Type: t, Value: v}
}

// checkEntries checks every key of a map of type t and, with values,
// every value too (the callers check the elements' kind once where the
// Go type already fixes it).
func checkEntries[V any](t *Type, m map[string]V, values bool) error {
	for k, e := range m {
		if err := checkKey(t.Key, k); err != nil {
			return err
		}
		if values {
			if err := Check(t.Elem, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkKey checks a map key held in string form.
func checkKey(t *Type, k string) error {
	switch t.Kind {
	case KInt:
		if _, err := strconv.ParseInt(k, 10, 64); err != nil {
			return &TypeError{Type: t, Value: k, Msg: "map key is not an int"}
		}
		return nil
	case KString, KEnum, KRef:
		return Check(t, k)
	}
	return &TypeError{Type: t, Value: k, Msg: "unsupported map key type"}
}

// IsRef reports whether s looks like a XenAPI reference.
func IsRef(s string) bool { return strings.HasPrefix(s, "OpaqueRef:") }

// Equal reports whether two canonical values of one type are the same.
// Empty and nil sets and maps are equal; sets compare in order.
func Equal(a, b any) bool {
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		return ok && x == y
	case int64:
		y, ok := b.(int64)
		return ok && x == y
	case float64:
		y, ok := b.(float64)
		return ok && floatEqual(x, y)
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case time.Time:
		y, ok := b.(time.Time)
		return ok && x.Equal(y)
	case []string:
		return sliceEqual(x, b, func(p, q string) bool { return p == q })
	case []int64:
		return sliceEqual(x, b, func(p, q int64) bool { return p == q })
	case []any:
		return sliceEqual(x, b, Equal)
	case map[string]string:
		return mapEqual(x, b, func(p, q string) bool { return p == q })
	case map[string]int64:
		return mapEqual(x, b, func(p, q int64) bool { return p == q })
	case map[string]float64:
		return mapEqual(x, b, floatEqual)
	case map[string][]string:
		return mapEqual(x, b, func(p, q []string) bool { return Equal(p, q) })
	case map[string]any:
		return mapEqual(x, b, Equal)
	case nil:
		return b == nil
	}
	return false
}

func floatEqual(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) }

// sliceEqual compares a canonical set with b, which must have the same
// form; empty and nil are equal.
func sliceEqual[E any](x []E, b any, eq func(E, E) bool) bool {
	y, ok := b.([]E)
	if !ok || len(x) != len(y) {
		return false
	}
	for i := range x {
		if !eq(x[i], y[i]) {
			return false
		}
	}
	return true
}

// mapEqual compares a canonical map with b, which must have the same form.
func mapEqual[V any](x map[string]V, b any, eq func(V, V) bool) bool {
	y, ok := b.(map[string]V)
	if !ok || len(x) != len(y) {
		return false
	}
	for k, v := range x {
		if w, ok := y[k]; !ok || !eq(v, w) {
			return false
		}
	}
	return true
}

// FormatTime writes a datetime in xapi's form.
func FormatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

var timeLayouts = []string{
	TimeLayout,
	"20060102T15:04:05",
	"20060102T150405Z",
	"20060102T15:04:05.999999999Z",
	time.RFC3339Nano,
	"2006-01-02T15:04:05",
	"2006-01-02T15:04:05Z",
	"20060102T15:04:05-07:00",
	"20060102T15:04:05.999999999-07:00",
}

// ParseTime reads a datetime in xapi's form or RFC 3339 (times without a zone
// are UTC).
func ParseTime(s string) (time.Time, error) {
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("not a datetime: %q", s)
}

// FormatFloat writes a float in xapi's stored style (OCaml's spelling: a
// trailing "." when the result looks like an integer, "1e+20" exponents),
// but with as many digits as the value needs to read back exactly, where
// OCaml's string_of_float stops at 12 and loses the rest.
func FormatFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".e") {
		s += "."
	}
	return s
}

// ParseFloat reads floats in OCaml's, Go's and C's spellings.
func ParseFloat(s string) (float64, error) {
	switch strings.ToLower(s) {
	case "nan", "-nan":
		return math.NaN(), nil
	case "inf", "infinity":
		return math.Inf(1), nil
	case "-inf", "-infinity":
		return math.Inf(-1), nil
	}
	return strconv.ParseFloat(strings.TrimSuffix(s, "."), 64)
}

// FormatDB writes a canonical value in xapi's database string form: scalars
// as text, sets and maps as S-expressions. The where-expression language
// compares these strings.
func FormatDB(t *Type, v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return FormatFloat(x)
	case bool:
		if x {
			return "true"
		}
		return "false"
	case time.Time:
		return FormatTime(x)
	case nil:
		if t.Kind == KSet || t.Kind == KMap {
			return "()"
		}
		return ""
	}
	var b strings.Builder
	writeSexprValue(&b, t, v)
	return b.String()
}

func writeSexprValue(b *strings.Builder, t *Type, v any) {
	switch x := v.(type) {
	case []string:
		writeList(b, len(x), func(i int) string { return x[i] })
	case []int64:
		writeList(b, len(x), func(i int) string { return strconv.FormatInt(x[i], 10) })
	case []any:
		writeList(b, len(x), func(i int) string { return FormatDB(t.Elem, x[i]) })
	case map[string]string:
		writePairs(b, SortedKeys(x), func(k string) { writeAtom(b, x[k]) })
	case map[string]int64:
		writePairs(b, SortedKeys(x), func(k string) { writeAtom(b, strconv.FormatInt(x[k], 10)) })
	case map[string]float64:
		writePairs(b, SortedKeys(x), func(k string) { writeAtom(b, FormatFloat(x[k])) })
	case map[string][]string:
		writePairs(b, SortedKeys(x), func(k string) { writeSexprValue(b, t.Elem, x[k]) })
	case map[string]any:
		writePairs(b, SortedKeys(x), func(k string) {
			et := String
			if t != nil && t.Elem != nil {
				et = t.Elem
			}
			writeAtom(b, FormatDB(et, x[k]))
		})
	default:
		writeAtom(b, fmt.Sprint(v))
	}
}

// writeList writes a set: the n atoms atom gives, in order.
func writeList(b *strings.Builder, n int, atom func(i int) string) {
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		writeAtom(b, atom(i))
	}
	b.WriteByte(')')
}

func writePairs(b *strings.Builder, keys []string, val func(k string)) {
	b.WriteByte('(')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('(')
		writeAtom(b, k)
		b.WriteByte(' ')
		val(k)
		b.WriteByte(')')
	}
	b.WriteByte(')')
}

func writeAtom(b *strings.Builder, s string) {
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == '\'' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('\'')
}

// SortedKeys returns a map's keys in byte order: the order maps are
// written in, on the wire (internal/api/wire) and on disk.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ParseScalar reads the text form of an int, float or datetime value,
// which is the same in the database and in an xe argument: a decimal
// integer, a float as ParseFloat reads it, a time as ParseTime reads it.
// Any other kind is an error.
func ParseScalar(k Kind, s string) (any, error) {
	var v any
	var err error
	switch k {
	case KInt:
		v, err = strconv.ParseInt(s, 10, 64)
	case KFloat:
		v, err = ParseFloat(s)
	case KDateTime:
		v, err = ParseTime(s)
	default:
		return nil, fmt.Errorf("schema: no scalar text form for %s", k)
	}
	if err != nil {
		return nil, err
	}
	return v, nil
}

// scalarNouns says what a value of each ParseScalar kind is, for
// TypeError messages.
var scalarNouns = map[Kind]string{KInt: "an int", KFloat: "a float", KDateTime: "a datetime"}

// ParseDB reads a value in xapi's database string form.
func ParseDB(t *Type, s string) (any, error) {
	switch t.Kind {
	case KString, KEnum:
		return s, nil
	case KRef:
		if s == "" {
			return NullRef, nil
		}
		return s, nil
	case KInt, KFloat, KDateTime:
		v, err := ParseScalar(t.Kind, s)
		if err != nil {
			return nil, &TypeError{Type: t, Value: s, Msg: "not " + scalarNouns[t.Kind]}
		}
		return v, nil
	case KBool:
		switch strings.ToLower(s) {
		case "true":
			return true, nil
		case "false":
			return false, nil
		}
		return nil, &TypeError{Type: t, Value: s, Msg: "not a bool"}
	case KOption:
		if s == "" {
			return nil, nil
		}
		return ParseDB(t.Elem, s)
	case KSet, KMap:
		n, err := parseSexpr(s)
		if err != nil {
			return nil, &TypeError{Type: t, Value: s, Msg: err.Error()}
		}
		return fromSexpr(t, n)
	}
	return nil, &TypeError{Type: t, Value: s, Msg: "no stored form"}
}

// fromSexpr turns a parsed S-expression into a canonical set or map.
func fromSexpr(t *Type, n sexpr) (any, error) {
	if n.list == nil && !n.isList {
		return nil, &TypeError{Type: t, Value: n.atom, Msg: "expected a list"}
	}
	switch t.Kind {
	case KSet:
		atoms := make([]string, 0, len(n.list))
		for _, e := range n.list {
			if e.isList {
				return nil, &TypeError{Type: t, Value: e, Msg: "nested list in a set"}
			}
			atoms = append(atoms, e.atom)
		}
		return collect(t, atoms, func(et *Type, a string) (any, error) { return ParseDB(et, a) })
	case KMap:
		out := Zero(t)
		for _, p := range n.list {
			if !p.isList || len(p.list) != 2 || p.list[0].isList {
				return nil, &TypeError{Type: t, Value: p, Msg: "expected a (key value) pair"}
			}
			k := p.list[0].atom
			if err := checkKey(t.Key, k); err != nil {
				return nil, err
			}
			var val any
			var err error
			if t.Elem.Kind == KSet {
				val, err = fromSexpr(t.Elem, p.list[1])
			} else if p.list[1].isList {
				err = &TypeError{Type: t, Value: p, Msg: "unexpected list value"}
			} else {
				val, err = ParseDB(t.Elem, p.list[1].atom)
			}
			if err != nil {
				return nil, err
			}
			out = MapPut(out, k, val)
		}
		return out, nil
	}
	return nil, &TypeError{Type: t, Msg: "not a set or map"}
}

// collect builds a canonical set from element texts.
func collect(t *Type, elems []string, parse func(*Type, string) (any, error)) (any, error) {
	var out any
	var err error
	switch {
	case t.Elem.StringLike():
		out, err = collectAs[string](t.Elem, elems, parse)
	case t.Elem.Kind == KInt:
		out, err = collectAs[int64](t.Elem, elems, parse)
	default:
		out, err = collectAs[any](t.Elem, elems, parse)
	}
	if err != nil {
		return nil, err // a nil interface, not a nil slice in one
	}
	return out, nil
}

// collectAs parses each element text as elem, into a set of the Go type
// T that elem's canonical values have.
func collectAs[T any](elem *Type, elems []string, parse func(*Type, string) (any, error)) ([]T, error) {
	out := make([]T, 0, len(elems))
	for _, e := range elems {
		v, err := parse(elem, e)
		if err != nil {
			return nil, err
		}
		x, ok := v.(T)
		if !ok && v != nil {
			return nil, &TypeError{Type: elem, Value: e, Msg: "element parsed to the wrong form"}
		}
		out = append(out, x)
	}
	return out, nil
}

// MapEntries yields the entries of a map value in any canonical form, in
// no particular order; any other value yields none.
func MapEntries(m any) iter.Seq2[string, any] {
	return func(yield func(string, any) bool) {
		switch x := m.(type) {
		case map[string]string:
			yieldEntries(x, yield)
		case map[string]int64:
			yieldEntries(x, yield)
		case map[string]float64:
			yieldEntries(x, yield)
		case map[string][]string:
			yieldEntries(x, yield)
		case map[string]any:
			yieldEntries(x, yield)
		}
	}
}

func yieldEntries[V any](m map[string]V, yield func(string, any) bool) {
	for k, v := range m {
		if !yield(k, v) {
			return
		}
	}
}

// MapPut returns m with k set to v, for any canonical map form; a nil map
// of the right form is made. The map is changed in place: copy first where
// it is shared.
func MapPut(m any, k string, v any) any {
	switch x := m.(type) {
	case map[string]string:
		if x == nil {
			x = map[string]string{}
		}
		x[k] = v.(string)
		return x
	case map[string]int64:
		if x == nil {
			x = map[string]int64{}
		}
		x[k] = v.(int64)
		return x
	case map[string]float64:
		if x == nil {
			x = map[string]float64{}
		}
		x[k] = v.(float64)
		return x
	case map[string][]string:
		if x == nil {
			x = map[string][]string{}
		}
		x[k] = v.([]string)
		return x
	case map[string]any:
		if x == nil {
			x = map[string]any{}
		}
		x[k] = v
		return x
	}
	panic(fmt.Sprintf("schema: MapPut on %T", m))
}

// ParseDefault reads a default as the datamodel spells it: quoted strings,
// "Null" for the null ref, "{}" and "{a, b}" sets, "{"k" -> "v"}" maps.
func ParseDefault(t *Type, s string) (any, error) {
	switch t.Kind {
	case KString:
		if uq, err := strconv.Unquote(s); err == nil {
			return uq, nil
		}
		return s, nil
	case KRef:
		if s == "Null" || s == "" {
			return NullRef, nil
		}
		return s, nil
	case KEnum:
		if t.Enum != nil && !t.Enum.Has(s) {
			return nil, &TypeError{Type: t, Value: s, Msg: "default is not an enum value"}
		}
		return s, nil
	case KSet:
		items, err := splitBraces(s)
		if err != nil {
			return nil, err
		}
		return collect(t, items, ParseDefault)
	case KMap:
		items, err := splitBraces(s)
		if err != nil {
			return nil, err
		}
		out := Zero(t)
		if len(items) > 0 {
			out = emptyMapLike(out)
		}
		for _, it := range items {
			k, v, ok := strings.Cut(it, " -> ")
			if !ok {
				return nil, fmt.Errorf("bad map default entry %q", it)
			}
			kv, err := ParseDefault(t.Key, strings.TrimSpace(k))
			if err != nil {
				return nil, err
			}
			vv, err := ParseDefault(t.Elem, strings.TrimSpace(v))
			if err != nil {
				return nil, err
			}
			out = MapPut(out, FormatDB(t.Key, kv), vv)
		}
		return out, nil
	}
	return ParseDB(t, s)
}

// EmptyMap returns a new, empty, non-nil map in the canonical form of map
// type t.
func EmptyMap(t *Type) any { return emptyMapLike(Zero(t)) }

func emptyMapLike(m any) any {
	switch m.(type) {
	case map[string]string:
		return map[string]string{}
	case map[string]int64:
		return map[string]int64{}
	case map[string]float64:
		return map[string]float64{}
	case map[string][]string:
		return map[string][]string{}
	}
	return map[string]any{}
}

// splitBraces splits "{a, b}" at top-level commas, respecting quotes.
func splitBraces(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return nil, fmt.Errorf("expected {...}, got %q", s)
	}
	inner := strings.TrimSpace(s[1 : len(s)-1])
	if inner == "" {
		return nil, nil
	}
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(inner); i++ {
		switch inner[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, strings.TrimSpace(inner[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(inner[start:])), nil
}
