package schema

import (
	"fmt"
	"sort"
	"strings"
)

// Qualifier says who may write a field.
type Qualifier uint8

// Field qualifiers, with the datamodel's spelling in comments.
const (
	RW        Qualifier = iota // "RW": settable through the API
	StaticRO                   // "RO/constructor": set at creation, read-only after
	DynamicRO                  // "RO/runtime": maintained by the server
)

// qualifierNames are the datamodel's spellings, by Qualifier.
var qualifierNames = [...]string{RW: "RW", StaticRO: "RO/constructor", DynamicRO: "RO/runtime"}

func (q Qualifier) String() string {
	if int(q) < len(qualifierNames) {
		return qualifierNames[q]
	}
	return "RO/runtime"
}

// ParseQualifier reads the datamodel's qualifier spelling.
func ParseQualifier(s string) (Qualifier, error) {
	if i, ok := nameIndex(qualifierNames[:], s); ok {
		return Qualifier(i), nil
	}
	return 0, fmt.Errorf("schema: unknown qualifier %q", s)
}

// nameIndex is the position of s in names: the value of an enumeration
// whose spellings names lists in order.
func nameIndex(names []string, s string) (int, bool) {
	for i, n := range names {
		if n == s {
			return i, true
		}
	}
	return 0, false
}

// Lifecycle is the release state of a class, field or message.
type Lifecycle uint8

// Lifecycle states.
const (
	Published Lifecycle = iota
	Prototyped
	Deprecated
	Removed
)

var lifecycleNames = [...]string{Published: "Published_s", Prototyped: "Prototyped_s", Deprecated: "Deprecated_s", Removed: "Removed_s"}

func (l Lifecycle) String() string { return lifecycleNames[l] }

// ParseLifecycle reads "Published_s" and friends; an empty string is Published.
func ParseLifecycle(s string) (Lifecycle, error) {
	if s == "" {
		return Published, nil
	}
	if i, ok := nameIndex(lifecycleNames[:], s); ok {
		return Lifecycle(i), nil
	}
	return 0, fmt.Errorf("schema: unknown lifecycle %q", s)
}

// Role is one of the seven static RBAC roles.
type Role uint8

// The static roles, most powerful first.
const (
	RolePoolAdmin Role = iota
	RolePoolOperator
	RoleVMPowerAdmin
	RoleVMAdmin
	RoleVMOperator
	RoleReadOnly
	RoleClientCert
	NumRoles
)

var roleNames = [NumRoles]string{"pool-admin", "pool-operator", "vm-power-admin", "vm-admin", "vm-operator", "read-only", "client-cert"}

func (r Role) String() string { return roleNames[r] }

// ParseRole reads a role name such as "vm-admin".
func ParseRole(s string) (Role, bool) {
	for i, n := range roleNames {
		if strings.EqualFold(n, s) {
			return Role(i), true
		}
	}
	return 0, false
}

// RoleSet is a set of roles as a bit mask.
type RoleSet uint8

// Has reports whether r is in the set.
func (s RoleSet) Has(r Role) bool { return s&(1<<r) != 0 }

// With returns the set plus r.
func (s RoleSet) With(r Role) RoleSet { return s | 1<<r }

// Intersects reports whether the sets share a role.
func (s RoleSet) Intersects(o RoleSet) bool { return s&o != 0 }

// Roles lists the members in role order.
func (s RoleSet) Roles() []Role {
	var out []Role
	for r := Role(0); r < NumRoles; r++ {
		if s.Has(r) {
			out = append(out, r)
		}
	}
	return out
}

// Enum is a named set of string values.
type Enum struct {
	Name   string
	Values []string
	index  map[string]struct{}
}

// Has reports whether v is one of the enum's values (case-sensitive, as on
// the wire).
func (e *Enum) Has(v string) bool { _, ok := e.index[v]; return ok }

// Match returns the enum's value that s names ignoring case (as xapi
// accepts a value from a client), and false if s names none.
func (e *Enum) Match(s string) (string, bool) {
	for _, v := range e.Values {
		if strings.EqualFold(v, s) {
			return v, true
		}
	}
	return "", false
}

// Field is one column of a class.
type Field struct {
	Class       *Class
	Index       int    // position in Class.Fields and in database rows
	Name        string // API name, namespaces flattened with "_": "name_label"
	Column      string // database column, namespaces joined with "__": "name__label"
	Type        *Type
	Qualifier   Qualifier
	Lifecycle   Lifecycle
	HasDefault  bool
	DefaultText string // the datamodel's spelling of the default
	Default     any    // the default as a canonical value (see value.go)
	Internal    bool   // held in the database but not part of the public API
	// Persist is false where the value is not written to disk: fields of
	// non-persistent classes and derived inverse sets.
	Persist bool
	// Relation links, set by Build from the relations list.
	// For a one-to-many child ref field (VBD.VM) Inverse is the parent's
	// set (VM.VBDs); for the set Inverse is the child field and Derived is
	// true. For a many-to-many pair each side's Inverse is the other side.
	Inverse    *Field
	Derived    bool
	ManyToMany bool
}

// Zero is the field's "empty" value (used where no default exists).
func (f *Field) Zero() any { return Zero(f.Type) }

// Class is one XenAPI class.
type Class struct {
	Index     int
	Name      string // "VM"
	Lower     string // "vm": the class as it appears in events
	Lifecycle Lifecycle
	Persist   bool // rows written to disk
	GenEvents bool // changes are visible to event.from
	InDB      bool // a database table
	Fields    []*Field
	Messages  []*Message
	UUID      *Field // nil when the class has no uuid field
	NameLabel *Field // nil when the class has no name_label field

	HasGetAllRecords bool
	// Base holds each field's default, or its empty value where it has no
	// default (nil for derived sets): what a field is when nothing is said.
	Base        []any
	fieldByName map[string]*Field
}

// Field finds a field by API name or database column name.
func (c *Class) Field(name string) *Field { return c.fieldByName[name] }

// FieldBytes is Field for a name still in a decoder's buffer (no copy of
// it is made).
func (c *Class) FieldBytes(name []byte) *Field { return c.fieldByName[string(name)] }

// Param is one parameter of a message.
type Param struct {
	Name     string
	Type     *Type
	Required bool
}

// Message is one XenAPI call.
type Message struct {
	Class     *Class
	Name      string // "start"
	Wire      string // "VM.start"
	Params    []Param
	Result    *Type
	Errors    []string
	Roles     RoleSet
	Implicit  bool
	Lifecycle Lifecycle
	// Extra is true for messages xapi serves that the datamodel dump leaves
	// out (get_all_where and get_all_records_where).
	Extra bool
	// Async is true where xapi also serves "Async.<Wire>".
	Async bool
	// TakesSession is true when the first parameter is session_id.
	TakesSession bool
}

// Relation pairs a field with the inverse it keeps in step.
type Relation struct {
	Field, Inverse *Field
	ManyToMany     bool
}

// Model is a whole datamodel.
type Model struct {
	SchemaMajor, SchemaMinor int
	Classes                  []*Class
	Enums                    []*Enum
	Relations                []Relation
	Messages                 []*Message // datamodel order, extras after their class's messages

	classByName   map[string]*Class
	classByLower  map[string]*Class
	enumByName    map[string]*Enum
	messageByWire map[string]*Message
}

// Class finds a class by exact name ("VM").
func (m *Model) Class(name string) *Class { return m.classByName[name] }

// ClassFold finds a class by name ignoring case ("vm", "Vm").
func (m *Model) ClassFold(name string) *Class { return m.classByLower[strings.ToLower(name)] }

// Enum finds an enum by name.
func (m *Model) Enum(name string) *Enum { return m.enumByName[name] }

// Message finds a message by its wire name ("VM.start"); Async variants are
// not listed here (see Message.Async).
func (m *Model) Message(wire string) *Message { return m.messageByWire[wire] }

// Specs: the plain data a generated package hands to Build.

// ClassSpec describes a class.
type ClassSpec struct {
	Name                     string
	Lifecycle                string
	Persist, GenEvents, InDB bool
	Fields                   []FieldSpec
	Messages                 []MessageSpec
}

// FieldSpec describes a field.
type FieldSpec struct {
	Name, Type, Qualifier, Lifecycle string
	Column                           string // empty: same as Name
	HasDefault                       bool
	Default                          string
	Internal                         bool
}

// MessageSpec describes a message.
type MessageSpec struct {
	Name      string
	Implicit  bool
	Extra     bool
	Async     bool
	Result    string
	Params    []ParamSpec
	Errors    []string
	Roles     []string
	Lifecycle string
}

// ParamSpec describes a parameter.
type ParamSpec struct {
	Name, Type string
	Required   bool
}

// EnumSpec describes an enum.
type EnumSpec struct {
	Name   string
	Values []string
}

// RelationSpec names a field and its inverse.
type RelationSpec struct {
	Class, Field, InverseClass, InverseField string
}

// Build checks and links a datamodel described by specs.
func Build(major, minor int, classes []ClassSpec, enums []EnumSpec, relations []RelationSpec) (*Model, error) {
	m := &Model{
		SchemaMajor:   major,
		SchemaMinor:   minor,
		classByName:   map[string]*Class{},
		classByLower:  map[string]*Class{},
		enumByName:    map[string]*Enum{},
		messageByWire: map[string]*Message{},
	}
	for _, es := range enums {
		e := &Enum{Name: es.Name, Values: es.Values, index: map[string]struct{}{}}
		for _, v := range es.Values {
			e.index[v] = struct{}{}
		}
		m.Enums = append(m.Enums, e)
		m.enumByName[e.Name] = e
	}
	// Classes first, so that types can be resolved against them.
	for i, cs := range classes {
		lc, err := ParseLifecycle(cs.Lifecycle)
		if err != nil {
			return nil, err
		}
		c := &Class{Index: i, Name: cs.Name, Lower: strings.ToLower(cs.Name), Lifecycle: lc,
			Persist: cs.Persist, GenEvents: cs.GenEvents, InDB: cs.InDB, fieldByName: map[string]*Field{}}
		if m.classByName[c.Name] != nil || m.classByLower[c.Lower] != nil {
			return nil, fmt.Errorf("schema: duplicate class %s", c.Name)
		}
		m.Classes = append(m.Classes, c)
		m.classByName[c.Name] = c
		m.classByLower[c.Lower] = c
	}
	for i, cs := range classes {
		c := m.Classes[i]
		for j, fs := range cs.Fields {
			f, err := m.buildField(c, j, fs)
			if err != nil {
				return nil, err
			}
			c.Fields = append(c.Fields, f)
			if c.fieldByName[f.Name] != nil {
				return nil, fmt.Errorf("schema: duplicate field %s.%s", c.Name, f.Name)
			}
			c.fieldByName[f.Name] = f
			c.fieldByName[f.Column] = f
		}
		c.UUID = c.fieldByName["uuid"]
		c.NameLabel = c.fieldByName["name_label"]
		for _, ms := range cs.Messages {
			msg, err := m.buildMessage(c, ms)
			if err != nil {
				return nil, err
			}
			if m.messageByWire[msg.Wire] != nil {
				return nil, fmt.Errorf("schema: duplicate message %s", msg.Wire)
			}
			c.Messages = append(c.Messages, msg)
			m.Messages = append(m.Messages, msg)
			m.messageByWire[msg.Wire] = msg
			if msg.Name == "get_all_records" {
				c.HasGetAllRecords = true
			}
		}
	}
	for _, rs := range relations {
		if err := m.addRelation(rs); err != nil {
			return nil, err
		}
	}
	for _, c := range m.Classes {
		c.Base = make([]any, len(c.Fields))
		for i, f := range c.Fields {
			switch {
			case f.Derived:
			case f.HasDefault:
				c.Base[i] = f.Default
			default:
				c.Base[i] = f.Zero()
			}
		}
	}
	return m, nil
}

func (m *Model) resolve(t *Type) error {
	switch t.Kind {
	case KEnum:
		t.Enum = m.enumByName[t.Name]
		if t.Enum == nil {
			return fmt.Errorf("schema: unknown enum %q", t.Name)
		}
	case KRef, KRecord:
		t.Class = m.classByName[t.Name]
		if t.Class == nil && t.Name != "<class>" {
			return fmt.Errorf("schema: unknown class %q in %q", t.Name, t.Text)
		}
	case KSet, KOption:
		return m.resolve(t.Elem)
	case KMap:
		if err := m.resolve(t.Key); err != nil {
			return err
		}
		return m.resolve(t.Elem)
	}
	return nil
}

func (m *Model) parseType(s string) (*Type, error) {
	t, err := ParseType(s)
	if err != nil {
		return nil, err
	}
	// Basic types are shared singletons and need no resolution.
	if err := m.resolve(t); err != nil {
		return nil, err
	}
	return t, nil
}

func (m *Model) buildField(c *Class, idx int, fs FieldSpec) (*Field, error) {
	t, err := m.parseType(fs.Type)
	if err != nil {
		return nil, fmt.Errorf("%s.%s: %w", c.Name, fs.Name, err)
	}
	q, err := ParseQualifier(fs.Qualifier)
	if err != nil {
		return nil, err
	}
	lc, err := ParseLifecycle(fs.Lifecycle)
	if err != nil {
		return nil, err
	}
	f := &Field{Class: c, Index: idx, Name: fs.Name, Column: fs.Column, Type: t, Qualifier: q,
		Lifecycle: lc, Internal: fs.Internal, Persist: c.Persist, HasDefault: fs.HasDefault, DefaultText: fs.Default}
	if f.Column == "" {
		f.Column = f.Name
	}
	if fs.HasDefault {
		v, err := ParseDefault(t, fs.Default)
		if err != nil {
			return nil, fmt.Errorf("%s.%s default: %w", c.Name, fs.Name, err)
		}
		f.Default = v
	}
	return f, nil
}

func (m *Model) buildMessage(c *Class, ms MessageSpec) (*Message, error) {
	lc, err := ParseLifecycle(ms.Lifecycle)
	if err != nil {
		return nil, err
	}
	msg := &Message{Class: c, Name: ms.Name, Wire: c.Name + "." + ms.Name, Implicit: ms.Implicit,
		Extra: ms.Extra, Async: ms.Async, Lifecycle: lc, Errors: ms.Errors}
	if msg.Result, err = m.parseType(ms.Result); err != nil {
		return nil, fmt.Errorf("%s result: %w", msg.Wire, err)
	}
	for _, ps := range ms.Params {
		t, err := m.parseType(ps.Type)
		if err != nil {
			return nil, fmt.Errorf("%s param %s: %w", msg.Wire, ps.Name, err)
		}
		msg.Params = append(msg.Params, Param{Name: ps.Name, Type: t, Required: ps.Required})
	}
	msg.TakesSession = len(msg.Params) > 0 && msg.Params[0].Name == "session_id" && msg.Params[0].Type.Kind == KRef
	for _, r := range ms.Roles {
		role, ok := ParseRole(r)
		if !ok {
			return nil, fmt.Errorf("%s: unknown role %q", msg.Wire, r)
		}
		msg.Roles = msg.Roles.With(role)
	}
	return msg, nil
}

func (m *Model) addRelation(rs RelationSpec) error {
	c, ic := m.classByName[rs.Class], m.classByName[rs.InverseClass]
	if c == nil || ic == nil {
		return fmt.Errorf("schema: relation %s.%s <-> %s.%s: unknown class", rs.Class, rs.Field, rs.InverseClass, rs.InverseField)
	}
	f, inv := c.fieldByName[rs.Field], ic.fieldByName[rs.InverseField]
	if f == nil || inv == nil {
		return fmt.Errorf("schema: relation %s.%s <-> %s.%s: unknown field", rs.Class, rs.Field, rs.InverseClass, rs.InverseField)
	}
	if f == inv {
		// A set related to itself (subject.roles, role.subroles) is a plain
		// stored set: there is nothing to keep in step.
		return nil
	}
	isRefSetOf := func(x *Field, class *Class) bool {
		return x.Type.Kind == KSet && x.Type.Elem.Kind == KRef && x.Type.Elem.Class == class
	}
	switch {
	case f.Type.Kind == KRef && f.Type.Class == ic && isRefSetOf(inv, c):
		f.Inverse, inv.Inverse = inv, f
		inv.Derived = true
		inv.Persist = false
		m.Relations = append(m.Relations, Relation{Field: f, Inverse: inv})
	case isRefSetOf(f, ic) && isRefSetOf(inv, c):
		f.Inverse, inv.Inverse = inv, f
		f.ManyToMany, inv.ManyToMany = true, true
		m.Relations = append(m.Relations, Relation{Field: f, Inverse: inv, ManyToMany: true})
	default:
		return fmt.Errorf("schema: relation %s.%s (%s) <-> %s.%s (%s): types do not pair", c.Name, f.Name, f.Type, ic.Name, inv.Name, inv.Type)
	}
	return nil
}

// SortedClassNames lists class names in byte order (the order xapi's
// database files use).
func (m *Model) SortedClassNames() []string {
	out := make([]string, 0, len(m.Classes))
	for _, c := range m.Classes {
		out = append(out, c.Name)
	}
	sort.Strings(out)
	return out
}
