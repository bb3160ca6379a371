package events

import (
	"strings"

	"toolstackd/internal/schema"
)

// item is one parsed entry of a class list, as xapi's
// Subscription.of_string reads it: "*", a class, or class/ref.
type item struct {
	all   bool
	obj   bool   // class/ref: one object
	class string // ASCII lower case, as given (possibly no such class)
	ref   string
}

func parseItem(s string) item {
	if s == "*" {
		return item{all: true}
	}
	if cls, ref, ok := strings.Cut(s, "/"); ok {
		return item{obj: true, class: lowerASCII(cls), ref: ref}
	}
	return item{class: lowerASCII(s)}
}

func (it item) matches(c *schema.Class, ref string) bool {
	switch {
	case it.all:
		return true
	case it.obj:
		return it.class == c.Lower && it.ref == ref
	default:
		return it.class == c.Lower
	}
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// Subscription is a parsed event.from class list, resolved against a
// model's event tables. The zero value subscribes to nothing.
type Subscription struct {
	items  []item
	tables []tableSub // in class order; only tables that produce events
}

// tableSub is what a subscription wants from one table: all of it, or
// some objects.
type tableSub struct {
	class *schema.Class
	whole bool
	refs  []string // when !whole; no duplicates
}

// ParseSubscription reads an event.from class list. As in xapi, "*" is
// every class, a class name (any case) is a whole table, and "class/ref"
// (split at the first '/') is one object; the class part is matched
// case-insensitively, the ref exactly. Names of classes that do not exist
// or produce no events (session, user, secret) are accepted and select
// nothing, which is what xapi does, so the error is always nil today; it
// is kept for the RPC layer's sake (EVENT_SUBSCRIPTION_PARSE_FAILURE).
func ParseSubscription(m *schema.Model, classes []string) (Subscription, error) {
	info := infoFor(m)
	s := Subscription{items: make([]item, 0, len(classes))}
	all := false
	whole := make(map[*schema.Class]bool)
	objs := make(map[*schema.Class][]string)
	for _, name := range classes {
		it := parseItem(name)
		s.items = append(s.items, it)
		switch {
		case it.all:
			all = true
		case it.obj:
			if c := info.byLower[it.class]; c != nil {
				objs[c] = append(objs[c], it.ref)
			}
		default:
			if c := info.byLower[it.class]; c != nil {
				whole[c] = true
			}
		}
	}
	for _, c := range info.tables {
		switch {
		case all || whole[c]:
			s.tables = append(s.tables, tableSub{class: c, whole: true})
		case len(objs[c]) > 0:
			s.tables = append(s.tables, tableSub{class: c, refs: dedup(objs[c])})
		}
	}
	return s, nil
}

func dedup(refs []string) []string {
	out := refs[:0:0]
	seen := make(map[string]bool, len(refs))
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// Matches reports whether the subscription selects object ref of class c.
func (s Subscription) Matches(c *schema.Class, ref string) bool {
	for _, it := range s.items {
		if it.matches(c, ref) {
			return true
		}
	}
	return false
}

// Empty reports whether the subscription can select no event at all.
func (s Subscription) Empty() bool { return len(s.tables) == 0 }

// String shows the subscription as xapi logs it: [all,class(vm),object(vm,ref)].
func (s Subscription) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i, it := range s.items {
		if i > 0 {
			b.WriteByte(',')
		}
		switch {
		case it.all:
			b.WriteString("all")
		case it.obj:
			b.WriteString("object(" + it.class + "," + it.ref + ")")
		default:
			b.WriteString("class(" + it.class + ")")
		}
	}
	b.WriteByte(']')
	return b.String()
}

// modelInfo is what this package needs to know about a model.
type modelInfo struct {
	tables  []*schema.Class          // database tables that produce events, in class order
	byLower map[string]*schema.Class // their lower-case names
}

func infoFor(m *schema.Model) *modelInfo {
	info := &modelInfo{byLower: map[string]*schema.Class{}}
	for _, c := range m.Classes {
		if eventTable(c) {
			info.tables = append(info.tables, c)
			info.byLower[c.Lower] = c
		}
	}
	return info
}

// eventTable reports whether changes to class c's rows are events.
func eventTable(c *schema.Class) bool { return c.InDB && c.GenEvents }
