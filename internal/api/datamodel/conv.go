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
	if s == nil {
		return nil
	}
	out := make([]T, len(s))
	for i, e := range s {
		out[i] = T(e)
	}
	return out
}

func fromSlice[T ~string](s []T) []string {
	if s == nil {
		return nil
	}
	out := make([]string, len(s))
	for i, e := range s {
		out[i] = string(e)
	}
	return out
}

func toMap[K ~string, V ~string](m map[string]string) map[K]V {
	if m == nil {
		return nil
	}
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[K(k)] = V(v)
	}
	return out
}

func fromMap[K ~string, V ~string](m map[K]V) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[string(k)] = string(v)
	}
	return out
}

func rekey[K ~string, V any](m map[string]V) map[K]V {
	if m == nil {
		return nil
	}
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[K(k)] = v
	}
	return out
}

func unkey[K ~string, V any](m map[K]V) map[string]V {
	if m == nil {
		return nil
	}
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

func intKeys[V any](m map[string]V) map[int64]V {
	if m == nil {
		return nil
	}
	out := make(map[int64]V, len(m))
	for k, v := range m {
		n, _ := strconv.ParseInt(k, 10, 64)
		out[n] = v
	}
	return out
}

func strKeys[V any](m map[int64]V) map[string]V {
	if m == nil {
		return nil
	}
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[strconv.FormatInt(k, 10)] = v
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
