package where

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on what Parse accepts. xapi has none, but no sane filter comes
// near them, and they bound the parser's recursion and the depth of the
// trees that String, Columns and Bind walk.
const (
	// MaxLen is the longest input, in bytes.
	MaxLen = 64 << 10
	// MaxDepth is the deepest nesting of '(' and 'not'.
	MaxDepth = 200
)

// SyntaxError reports input that xapi would reject, or that exceeds
// MaxLen or MaxDepth. Pos is a byte offset into the input.
type SyntaxError struct {
	Pos int
	Msg string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("where: syntax error at offset %d: %s", e.Pos, e.Msg)
}

type tokKind uint8

const (
	tEOF tokKind = iota
	tLit
	tEq
	tLParen
	tRParen
	tTrue
	tFalse
	tField
	tAnd
	tOr
	tNot
	tBadWord      // a run of letters, digits and '_' that is no keyword
	tBadChar      // any other byte that cannot start a token
	tUnterminated // '"' without a closing '"'
)

type token struct {
	kind tokKind
	pos  int
	text string // literal contents, or the offending input
}

// keywords in xapi's lexer. None is a prefix of another, so trying them
// in any order gives the lexer's longest match.
var keywords = [...]struct {
	word string
	kind tokKind
}{
	{"true", tTrue}, {"false", tFalse}, {"field", tField},
	{"and", tAnd}, {"or", tOr}, {"not", tNot},
}

type lexer struct {
	s   string
	pos int
}

func (l *lexer) next() token {
	s := l.s
	for l.pos < len(s) && (s[l.pos] == ' ' || s[l.pos] == '\t' || s[l.pos] == '\n') {
		l.pos++
	}
	start := l.pos
	if start == len(s) {
		return token{kind: tEOF, pos: start}
	}
	c := s[start]
	switch c {
	case '=':
		l.pos++
		return token{kind: tEq, pos: start}
	case '(':
		l.pos++
		return token{kind: tLParen, pos: start}
	case ')':
		l.pos++
		return token{kind: tRParen, pos: start}
	case '"':
		n := strings.IndexByte(s[start+1:], '"')
		if n < 0 {
			l.pos = len(s)
			return token{kind: tUnterminated, pos: start, text: s[start+1:]}
		}
		l.pos = start + 2 + n
		return token{kind: tLit, pos: start, text: s[start+1 : start+1+n]}
	}
	for _, kw := range keywords {
		if strings.HasPrefix(s[start:], kw.word) {
			l.pos += len(kw.word)
			return token{kind: kw.kind, pos: start}
		}
	}
	if isWordByte(c) {
		for l.pos < len(s) && isWordByte(s[l.pos]) {
			l.pos++
		}
		return token{kind: tBadWord, pos: start, text: s[start:l.pos]}
	}
	_, n := utf8.DecodeRuneInString(s[start:])
	l.pos += n
	return token{kind: tBadChar, pos: start, text: s[start:l.pos]}
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

// describe names a token for "found ..." in error messages.
func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "end of input"
	case tLit:
		return "literal " + quoteShort(t.text)
	case tEq:
		return "'='"
	case tLParen:
		return "'('"
	case tRParen:
		return "')'"
	case tBadWord:
		msg := "unknown word " + quoteShort(t.text)
		lower := strings.ToLower(t.text)
		for _, kw := range keywords {
			if lower != t.text && strings.HasPrefix(lower, kw.word) {
				return msg + " (keywords are lower-case)"
			}
		}
		return msg
	case tBadChar:
		if t.text == "\r" {
			return `carriage return (only space, tab and newline may separate tokens)`
		}
		return "unexpected character " + strconv.QuoteToASCII(t.text)
	case tUnterminated:
		return "unterminated literal " + quoteShort(t.text) + ` (no closing '"')`
	}
	for _, kw := range keywords {
		if kw.kind == t.kind {
			return `"` + kw.word + `"`
		}
	}
	return "token"
}

func describeOperand(o Operand) string {
	if o.Field {
		return "field " + quoteShort(o.Text)
	}
	return "literal " + quoteShort(o.Text)
}

func quoteShort(s string) string {
	const limit = 32
	if len(s) > limit {
		n := limit
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		return strconv.Quote(s[:n]) + "..."
	}
	return strconv.Quote(s)
}

type parser struct {
	lx    lexer
	tok   token
	depth int
}

// Parse parses a filter expression. Every error is a *SyntaxError.
func Parse(s string) (Expr, error) {
	if len(s) > MaxLen {
		return nil, &SyntaxError{Pos: MaxLen, Msg: fmt.Sprintf("expression longer than %d bytes", MaxLen)}
	}
	p := &parser{lx: lexer{s: s}}
	p.advance()
	e, err := p.expr("")
	if err != nil {
		return nil, err
	}
	if p.tok.kind != tEOF {
		return nil, p.unexpected(`"and", "or" or end of input`)
	}
	return e, nil
}

func (p *parser) advance() { p.tok = p.lx.next() }

func (p *parser) unexpected(want string) *SyntaxError {
	return &SyntaxError{Pos: p.tok.pos, Msg: "expected " + want + ", found " + describe(p.tok)}
}

// expr parses a left-associative chain of terms joined by and/or. A 'not'
// term extends over the rest of the chain, so the loop ends after one.
// context says what came before, for messages.
func (p *parser) expr(context string) (Expr, error) {
	e, err := p.term(context)
	if err != nil {
		return nil, err
	}
	for p.tok.kind == tAnd || p.tok.kind == tOr {
		isAnd := p.tok.kind == tAnd
		p.advance()
		if isAnd {
			r, err := p.term(` after "and"`)
			if err != nil {
				return nil, err
			}
			e = And{e, r}
		} else {
			r, err := p.term(` after "or"`)
			if err != nil {
				return nil, err
			}
			e = Or{e, r}
		}
	}
	return e, nil
}

func (p *parser) term(context string) (Expr, error) {
	switch p.tok.kind {
	case tTrue:
		p.advance()
		return True{}, nil
	case tFalse:
		p.advance()
		return False{}, nil
	case tNot:
		e, err := p.nested(` after "not"`)
		if err != nil {
			return nil, err
		}
		return Not{e}, nil
	case tLParen:
		open := p.tok.pos
		e, err := p.nested(` after '('`)
		if err != nil {
			return nil, err
		}
		if p.tok.kind != tRParen {
			return nil, p.unexpected(fmt.Sprintf(`"and", "or" or ')' closing the '(' at offset %d`, open))
		}
		p.advance()
		return e, nil
	case tLit, tField:
		l, err := p.operand("")
		if err != nil {
			return nil, err
		}
		if p.tok.kind != tEq {
			return nil, p.unexpected("'=' after " + describeOperand(l))
		}
		p.advance()
		r, err := p.operand(" after '='")
		if err != nil {
			return nil, err
		}
		return Eq{l, r}, nil
	}
	return nil, p.unexpected("an expression" + context)
}

func (p *parser) operand(context string) (Operand, error) {
	switch p.tok.kind {
	case tLit:
		o := Operand{Text: p.tok.text}
		p.advance()
		return o, nil
	case tField:
		p.advance()
		if p.tok.kind != tLit {
			return Operand{}, p.unexpected(`a quoted column name after "field"`)
		}
		o := Operand{Field: true, Text: p.tok.text}
		p.advance()
		return o, nil
	}
	return Operand{}, p.unexpected("a literal or field" + context)
}

// nested reads the expression after a "not" or '(' (the current token),
// one level deeper: past MaxDepth levels the input is refused rather than
// read by ever deeper recursion.
func (p *parser) nested(context string) (Expr, error) {
	if p.depth >= MaxDepth {
		return nil, &SyntaxError{Pos: p.tok.pos, Msg: fmt.Sprintf("nesting of '(' and \"not\" deeper than %d", MaxDepth)}
	}
	p.depth++
	p.advance()
	e, err := p.expr(context)
	p.depth--
	return e, err
}
