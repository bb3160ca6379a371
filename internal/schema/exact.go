package schema

import "time"

// FormatExact is FormatDB except that a datetime keeps every digit
// (RFC 3339 with nanoseconds): xapi's form has whole seconds, and the
// host's own file and the pool's replicas must hold exactly what the
// database holds in memory.
func FormatExact(t *Type, v any) string {
	if tm, ok := v.(time.Time); ok && t.Kind == KDateTime {
		return tm.UTC().Format(time.RFC3339Nano)
	}
	return FormatDB(t, v)
}

// ParseExact reads FormatExact's form, and FormatDB's (files written
// before times kept their digits).
func ParseExact(t *Type, s string) (any, error) {
	if t.Kind == KDateTime {
		if tm, err := time.Parse(time.RFC3339Nano, s); err == nil {
			return tm.UTC(), nil
		}
	}
	return ParseDB(t, s)
}
