package schema

import (
	"fmt"
	"strings"
)

// Kind is the shape of a XenAPI type.
type Kind uint8

// The XenAPI kinds.
const (
	KString Kind = iota
	KInt
	KFloat
	KBool
	KDateTime
	KEnum
	KRef
	KSet
	KMap
	KRecord
	KOption
	KVoid
	KEventBatch // the result of event.from
)

var kindNames = [...]string{"string", "int", "float", "bool", "datetime", "enum", "ref", "set", "map", "record", "option", "void", "event batch"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Type is a XenAPI type. Types are immutable once parsed.
type Type struct {
	Kind  Kind
	Name  string // enum name for KEnum, class name for KRef and KRecord
	Elem  *Type  // element of KSet and KOption, value of KMap
	Key   *Type  // key of KMap
	Text  string // the datamodel's own spelling, e.g. "(string -> string) map"
	Enum  *Enum  // resolved enum for KEnum, once bound to a Model
	Class *Class // resolved class for KRef and KRecord, once bound to a Model
}

func (t *Type) String() string { return t.Text }

// StringLike reports whether values of t are held as Go strings
// (string, enum and ref).
func (t *Type) StringLike() bool {
	return t.Kind == KString || t.Kind == KEnum || t.Kind == KRef
}

// Basic types shared by every model.
var (
	String   = &Type{Kind: KString, Text: "string"}
	Int      = &Type{Kind: KInt, Text: "int"}
	Float    = &Type{Kind: KFloat, Text: "float"}
	Bool     = &Type{Kind: KBool, Text: "bool"}
	DateTime = &Type{Kind: KDateTime, Text: "datetime"}
	Void     = &Type{Kind: KVoid, Text: "void"}
)

// ParseType reads the datamodel's spelling of a type:
// string, int, float, bool, datetime, void, "enum X", "C ref", "C record",
// "T set", "T option", "(K -> V) map", "an event batch".
func ParseType(s string) (*Type, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "string":
		return String, nil
	case "int":
		return Int, nil
	case "float":
		return Float, nil
	case "bool":
		return Bool, nil
	case "datetime":
		return DateTime, nil
	case "void":
		return Void, nil
	case "an event batch":
		return &Type{Kind: KEventBatch, Text: s}, nil
	}
	if strings.HasPrefix(s, "(") && strings.HasSuffix(s, ") map") {
		inner := s[1 : len(s)-len(") map")]
		k, v, ok := splitArrow(inner)
		if !ok {
			return nil, fmt.Errorf("schema: bad map type %q", s)
		}
		kt, err := ParseType(k)
		if err != nil {
			return nil, err
		}
		vt, err := ParseType(v)
		if err != nil {
			return nil, err
		}
		return &Type{Kind: KMap, Key: kt, Elem: vt, Text: s}, nil
	}
	if rest, ok := strings.CutPrefix(s, "enum "); ok && !strings.Contains(rest, " ") {
		return &Type{Kind: KEnum, Name: rest, Text: s}, nil
	}
	for _, suf := range []struct {
		suffix string
		kind   Kind
	}{{" set", KSet}, {" option", KOption}} {
		if inner, ok := strings.CutSuffix(s, suf.suffix); ok {
			et, err := ParseType(inner)
			if err != nil {
				return nil, err
			}
			return &Type{Kind: suf.kind, Elem: et, Text: s}, nil
		}
	}
	if name, ok := strings.CutSuffix(s, " ref"); ok && !strings.Contains(name, " ") {
		return &Type{Kind: KRef, Name: name, Text: s}, nil
	}
	if name, ok := strings.CutSuffix(s, " record"); ok && !strings.Contains(name, " ") {
		return &Type{Kind: KRecord, Name: name, Text: s}, nil
	}
	return nil, fmt.Errorf("schema: unknown type %q", s)
}

// splitArrow splits "K -> V" at the top-level arrow (K may itself be
// parenthesised).
func splitArrow(s string) (string, string, bool) {
	depth := 0
	for i := 0; i+1 < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case '-':
			if depth == 0 && s[i+1] == '>' {
				return strings.TrimSpace(s[:i]), strings.TrimSpace(s[i+2:]), true
			}
		}
	}
	return "", "", false
}
