package api

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Limits bounds the strings a call may carry, so that no client can fill
// the database (and every event watcher's replies) with a few huge values.
// xapi sets no such bounds; its request size is the only limit. Every
// argument of every message is checked once, after decoding and before the
// handler runs, whether the call comes over the wire (Dispatch) or from
// inside the daemon on a client's behalf (Invoke, used by the xe CLI
// server). A value over its limit is refused with INVALID_VALUE [field,
// value]: the type is right, the value is not acceptable, which is what
// INVALID_VALUE means (FIELD_TYPE_ERROR is kept for values of the wrong
// type). The first parameter names the field the argument writes
// (name_label for VM.set_name_label's value) or else the parameter; the
// second is the start of the value and its size against the limit.
//
// A limit of 0 or less is no limit.
type Limits struct {
	// NameBytes bounds names: the name_label field (in a constructor
	// record or through set_name_label) and the label and new_name
	// parameters (task.create, VM.clone, ...).
	NameBytes int
	// StringBytes bounds every other string: a string argument or record
	// field (name_description included), each element of a set, each key
	// and each value of a map (other_config, xenstore_data, ...).
	StringBytes int
	// BlobBytes bounds the few arguments that carry whole documents:
	// certificates, keys and CRLs, licence files, sysprep unattend files,
	// NVRAM contents and task results (see blobArgs).
	BlobBytes int
	// CollectionBytes bounds the sum of the strings (keys and values) in
	// one map or set argument or field; blob fields use BlobBytes.
	CollectionBytes int
}

// DefaultLimits returns the limits used unless told otherwise.
func DefaultLimits() Limits {
	return Limits{NameBytes: 1 << 10, StringBytes: 64 << 10, BlobBytes: 4 << 20, CollectionBytes: 1 << 20}
}

// nameArgs are the fields and parameters held to NameBytes.
var nameArgs = map[string]bool{"name_label": true, "label": true, "new_name": true}

// blobArgs are the fields and parameters held to BlobBytes.
var blobArgs = map[string]bool{
	"cert": true, "certificate": true, "certificate_chain": true, "private_key": true, "remote_certificate": true,
	"contents": true, "unattend": true, "NVRAM": true, "result": true,
}

// accessorPrefixes are the message name prefixes of field accessors, the
// longer ones first.
var accessorPrefixes = []string{"set_", "add_to_", "remove_from_", "add_", "remove_"}

// argLabel is the name a limit and its error use for parameter i of m:
// the field it writes for a field accessor (set_name_label's value is a
// name_label), otherwise the parameter's own name.
func argLabel(m *schema.Message, i int) string {
	if i >= 2 {
		for _, p := range accessorPrefixes {
			if name, ok := strings.CutPrefix(m.Name, p); ok {
				if f := m.Class.Field(name); f != nil {
					return f.Name
				}
			}
		}
	}
	return m.Params[i].Name
}

// checkArgs checks a call's decoded arguments (args[j] is parameter
// first+j of m) against the server's limits.
func (s *Server) checkArgs(m *schema.Message, first int, args []any) error {
	l := s.Cfg.Limits
	if l == (Limits{}) {
		return nil
	}
	for j, v := range args {
		if v == nil {
			continue
		}
		i := first + j
		if i >= len(m.Params) {
			break
		}
		label := argLabel(m, i)
		if _, err := l.check(m.Params[i].Type, v, label); err != nil {
			return err
		}
	}
	return nil
}

// tooLong is the error for a value over its limit.
func tooLong(label, what string, size, limit int) *xerr.Error {
	return xerr.New(xerr.InvalidValue, label, fmt.Sprintf("%s (%d bytes; the limit is %d)", what, size, limit))
}

// preview is the start of a long string, cut on a character boundary.
func preview(s string) string {
	const n = 32
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

func (l Limits) stringLimit(label string) int {
	switch {
	case nameArgs[label]:
		return l.NameBytes
	case blobArgs[label]:
		return l.BlobBytes
	}
	return l.StringBytes
}

func (l Limits) collectionLimit(label string) int {
	if blobArgs[label] {
		return l.BlobBytes
	}
	return l.CollectionBytes
}

// str checks one string against max.
func str(label, s string, max int) (int, error) {
	if max > 0 && len(s) > max {
		return 0, tooLong(label, preview(s), len(s), max)
	}
	return len(s), nil
}

// total checks the sum of a collection's strings.
func (l Limits) total(label string, n int) (int, error) {
	if max := l.collectionLimit(label); max > 0 && n > max {
		return 0, tooLong(label, "a map or set", n, max)
	}
	return n, nil
}

// check walks a canonical value of type t and returns the bytes of string
// it holds, or the error for the first value over its limit.
func (l Limits) check(t *schema.Type, v any, label string) (int, error) {
	max := l.stringLimit(label)
	switch x := v.(type) {
	case nil:
		return 0, nil
	case string:
		return str(label, x, max)
	case []string:
		n := 0
		for _, e := range x {
			k, err := str(label, e, max)
			if err != nil {
				return 0, err
			}
			n += k
		}
		return l.total(label, n)
	case map[string]string:
		n := 0
		for k, e := range x {
			a, err := str(label, k, max)
			if err != nil {
				return 0, err
			}
			b, err := str(label, e, max)
			if err != nil {
				return 0, err
			}
			n += a + b
		}
		return l.total(label, n)
	case []any:
		var elem *schema.Type
		if t != nil {
			elem = t.Elem
		}
		n := 0
		for _, e := range x {
			k, err := l.check(elem, e, label)
			if err != nil {
				return 0, err
			}
			n += k
		}
		return l.total(label, n)
	case map[string]any:
		if t != nil && t.Kind == schema.KRecord && t.Class != nil {
			// A constructor record: each field by its own name and type.
			n := 0
			for k, e := range x {
				f := t.Class.Field(k)
				if f == nil {
					continue
				}
				a, err := l.check(f.Type, e, f.Name)
				if err != nil {
					return 0, err
				}
				n += a
			}
			return n, nil
		}
		var elem *schema.Type
		if t != nil {
			elem = t.Elem
		}
		n := 0
		for k, e := range x {
			a, err := str(label, k, max)
			if err != nil {
				return 0, err
			}
			b, err := l.check(elem, e, label)
			if err != nil {
				return 0, err
			}
			n += a + b
		}
		return l.total(label, n)
	}
	// Other canonical forms (numbers, times, maps with non-string values)
	// carry strings only as map keys.
	return l.keys(label, v, max)
}

// keys checks the keys of maps whose values hold no strings.
func (l Limits) keys(label string, v any, max int) (int, error) {
	n := 0
	add := func(k string) error {
		a, err := str(label, k, max)
		n += a
		return err
	}
	var err error
	switch x := v.(type) {
	case map[string]int64:
		for k := range x {
			if err = add(k); err != nil {
				return 0, err
			}
		}
	case map[string]float64:
		for k := range x {
			if err = add(k); err != nil {
				return 0, err
			}
		}
	case map[string][]string:
		for k, e := range x {
			if err = add(k); err != nil {
				return 0, err
			}
			for _, s := range e {
				if err = add(s); err != nil {
					return 0, err
				}
			}
		}
	default:
		return 0, nil
	}
	return l.total(label, n)
}
