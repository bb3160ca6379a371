package datamodel

import (
	"strconv"
	"time"

	"toolstackd/internal/schema"
)

// Conversions between canonical values (schema/value.go) and typed record
// fields, used by the generated FromRow and Row methods. Values are copied
// so that a typed record never aliases a database row.

func as[T any](v any) T {
	x, _ := v.(T)
	return x
}

func cloneSlice[T any](s []T) []T {
	if s == nil {
		return nil
	}
	return append(make([]T, 0, len(s)), s...)
}

func toSlice[T ~string](s []string) []T {
	return convertSlice(s, func(e string) T { return T(e) })
}

func fromSlice[T ~string](s []T) []string {
	return convertSlice(s, func(e T) string { return string(e) })
}

// convertSlice copies s with each element converted; nil stays nil.
func convertSlice[T1, T2 any](s []T1, conv func(T1) T2) []T2 {
	if s == nil {
		return nil
	}
	out := make([]T2, len(s))
	for i, e := range s {
		out[i] = conv(e)
	}
	return out
}

func toMap[K, V ~string](m map[string]string) map[K]V {
	return convertMap(m, func(k, v string) (K, V) { return K(k), V(v) })
}

func fromMap[K, V ~string](m map[K]V) map[string]string {
	return convertMap(m, func(k K, v V) (string, string) { return string(k), string(v) })
}

func rekey[K ~string, V any](m map[string]V) map[K]V {
	return convertMap(m, func(k string, v V) (K, V) { return K(k), v })
}

func unkey[K ~string, V any](m map[K]V) map[string]V {
	return convertMap(m, func(k K, v V) (string, V) { return string(k), v })
}

// intKeys and strKeys convert the keys of a map whose keys are ints: a
// decimal string in a canonical value (a key that is not one becomes 0).
func intKeys[V any](m map[string]V) map[int64]V {
	return convertMap(m, func(k string, v V) (int64, V) {
		n, _ := strconv.ParseInt(k, 10, 64)
		return n, v
	})
}

func strKeys[V any](m map[int64]V) map[string]V {
	return convertMap(m, func(k int64, v V) (string, V) { return strconv.FormatInt(k, 10), v })
}

// convertMap copies m with each entry converted; nil stays nil.
func convertMap[K1, K2 comparable, V1, V2 any](m map[K1]V1, conv func(K1, V1) (K2, V2)) map[K2]V2 {
	if m == nil {
		return nil
	}
	out := make(map[K2]V2, len(m))
	for k, v := range m {
		k2, v2 := conv(k, v)
		out[k2] = v2
	}
	return out
}

// timeOrEpoch maps the zero time of a zero-valued record to xapi's empty
// datetime, the Unix epoch.
func timeOrEpoch(t time.Time) time.Time {
	if t.IsZero() {
		return schema.Epoch
	}
	return t.UTC()
}

// refOrNull maps the empty ref of a zero-valued record to the null ref.
func refOrNull[T ~string](r T) string {
	if r == "" {
		return schema.NullRef
	}
	return string(r)
}

func optPtr[T any](v any) *T {
	x, ok := v.(T)
	if !ok {
		return nil
	}
	return &x
}

func optVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func optRecord[R interface{ Map() map[string]any }](r R) any {
	m := r.Map()
	if m == nil {
		return nil
	}
	return m
}

func rowToMap(c *schema.Class, row []any) map[string]any {
	m := make(map[string]any, len(row))
	for i, f := range c.Fields {
		m[f.Name] = row[i]
	}
	return m
}

// mapToRow turns a canonical record into a row; missing fields take their
// default, or the empty value of their type.
func mapToRow(c *schema.Class, m map[string]any) []any {
	row := make([]any, len(c.Fields))
	for i, f := range c.Fields {
		if v, ok := m[f.Name]; ok {
			row[i] = v
		} else if f.HasDefault {
			row[i] = f.Default
		} else {
			row[i] = f.Zero()
		}
	}
	return row
}
