package schema

import (
	"errors"
	"fmt"
	"strings"
)

// sexpr is a parsed S-expression in xapi's stored form: atoms in single
// quotes with backslash escapes, lists in parentheses.
type sexpr struct {
	isList bool
	atom   string
	list   []sexpr
}

func (n sexpr) String() string {
	if !n.isList {
		return fmt.Sprintf("%q", n.atom)
	}
	parts := make([]string, len(n.list))
	for i, e := range n.list {
		parts[i] = e.String()
	}
	return "(" + strings.Join(parts, " ") + ")"
}

const maxSexprDepth = 32

var errSexprDepth = errors.New("s-expression nested too deeply")

// parseSexpr reads one S-expression that must take the whole input.
func parseSexpr(s string) (sexpr, error) {
	p := sexprParser{s: s}
	n, err := p.value(0)
	if err != nil {
		return sexpr{}, err
	}
	p.space()
	if p.i != len(p.s) {
		return sexpr{}, fmt.Errorf("trailing text at offset %d", p.i)
	}
	return n, nil
}

type sexprParser struct {
	s string
	i int
}

func (p *sexprParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

func (p *sexprParser) value(depth int) (sexpr, error) {
	if depth > maxSexprDepth {
		return sexpr{}, errSexprDepth
	}
	p.space()
	if p.i >= len(p.s) {
		return sexpr{}, errors.New("unexpected end of s-expression")
	}
	switch c := p.s[p.i]; c {
	case '(':
		p.i++
		n := sexpr{isList: true, list: []sexpr{}}
		for {
			p.space()
			if p.i >= len(p.s) {
				return sexpr{}, errors.New("unterminated list")
			}
			if p.s[p.i] == ')' {
				p.i++
				return n, nil
			}
			e, err := p.value(depth + 1)
			if err != nil {
				return sexpr{}, err
			}
			n.list = append(n.list, e)
		}
	case '\'', '"':
		p.i++
		// Most atoms have no escapes: they are a slice of the input.
		start := p.i
		for p.i < len(p.s) && p.s[p.i] != c && p.s[p.i] != '\\' {
			p.i++
		}
		if p.i < len(p.s) && p.s[p.i] == c {
			p.i++
			return sexpr{atom: p.s[start : p.i-1]}, nil
		}
		var b strings.Builder
		b.WriteString(p.s[start:p.i])
		for p.i < len(p.s) {
			ch := p.s[p.i]
			switch {
			case ch == '\\' && p.i+1 < len(p.s):
				b.WriteByte(p.s[p.i+1])
				p.i += 2
			case ch == c:
				p.i++
				return sexpr{atom: b.String()}, nil
			default:
				b.WriteByte(ch)
				p.i++
			}
		}
		return sexpr{}, errors.New("unterminated atom")
	default:
		// A bare atom runs to the next space or parenthesis.
		start := p.i
		for p.i < len(p.s) && !strings.ContainsRune(" \t\n\r()", rune(p.s[p.i])) {
			p.i++
		}
		if p.i == start {
			return sexpr{}, fmt.Errorf("unexpected %q at offset %d", p.s[p.i], p.i)
		}
		return sexpr{atom: p.s[start:p.i]}, nil
	}
}
