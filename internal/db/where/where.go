// Package where implements the filter language of XenAPI's
// get_all_records_where and get_all_where calls, with the grammar and
// lexical rules of xapi's ocaml/database/db_filter_{lex.mll,parse.mly}:
//
//	expr  := value '=' value | expr 'and' expr | expr 'or' expr
//	       | 'not' expr | 'true' | 'false' | '(' expr ')'
//	value := '"' <any bytes except "> '"'      a literal
//	       | 'field' '"' <column name> '"'     a column reference
//
// The rules below are those of xapi's generated parser, which are not
// always what the grammar suggests at first sight:
//
//   - 'and' and 'or' have the same precedence and associate to the left:
//     a or b and c means (a or b) and c.
//   - 'not' has the LOWEST precedence: xapi declares it before 'and' and
//     'or' (%right LNOT, then %left LAND LOR), and in yacc a later
//     declaration binds tighter. So 'not' takes everything up to the
//     closing ')' of its group, or to the end of the input:
//     not a and b means not (a and b), and a and not b or c means
//     a and not (b or c). Write (not a) and b to negate only a.
//   - Tokens may be separated by space, tab and newline only. Carriage
//     return and every other byte outside a literal are errors.
//   - Keywords are lower-case and need no separator: xapi's lexer matches
//     them as plain prefixes, so nottrue, (true)or(false) and
//     field"a"="b" are valid, while TRUE and truex are not.
//   - A literal is any run of bytes other than '"' between two '"'.
//     There are no escapes. The same holds for column names.
//
// The only comparison is string equality on xapi's stored string form of
// a column (S-expressions for sets and maps, "true"/"false" for bools,
// OpaqueRef:... for refs). Both sides may be literals or fields.
package where

import "strings"

// Expr is a node of a parsed filter: True, False, Eq, And, Or or Not.
// The set is closed. Nodes are comparable values, so two expressions are
// equal exactly when == says so.
type Expr interface {
	// String returns the canonical source form, which Parse maps back to
	// an equal Expr as long as no literal or column name contains '"'.
	String() string
	isExpr()
}

// Operand is one side of an Eq: a column name if Field is set, otherwise
// a literal.
type Operand struct {
	Field bool
	Text  string
}

type (
	// True is the constant true.
	True struct{}
	// False is the constant false.
	False struct{}
	// Eq is string equality of two operands.
	Eq struct{ L, R Operand }
	// And is short-circuit conjunction, L first.
	And struct{ L, R Expr }
	// Or is short-circuit disjunction, L first.
	Or struct{ L, R Expr }
	// Not is negation.
	Not struct{ E Expr }
)

func (True) isExpr()  {}
func (False) isExpr() {}
func (Eq) isExpr()    {}
func (And) isExpr()   {}
func (Or) isExpr()    {}
func (Not) isExpr()   {}

func (e True) String() string  { return format(e) }
func (e False) String() string { return format(e) }
func (e Eq) String() string    { return format(e) }
func (e And) String() string   { return format(e) }
func (e Or) String() string    { return format(e) }
func (e Not) String() string   { return format(e) }

// String returns the operand's source form: "text" or field "text".
func (o Operand) String() string {
	if o.Field {
		return `field "` + o.Text + `"`
	}
	return `"` + o.Text + `"`
}

func format(e Expr) string {
	var b strings.Builder
	write(&b, e)
	return b.String()
}

// write prints e so that it reads the same under xapi's rules and under
// the usual "not binds tightest" reading: a Not that is an operand of
// and/or is always parenthesised, and so is a Not's and/or operand.
func write(b *strings.Builder, e Expr) {
	switch e := e.(type) {
	case True:
		b.WriteString("true")
	case False:
		b.WriteString("false")
	case Eq:
		b.WriteString(e.L.String())
		b.WriteString(" = ")
		b.WriteString(e.R.String())
	case And:
		writeBinary(b, e.L, " and ", e.R)
	case Or:
		writeBinary(b, e.L, " or ", e.R)
	case Not:
		b.WriteString("not ")
		writeGrouped(b, e.E, isBinary(e.E))
	case nil:
		b.WriteString("<nil>")
	}
}

func writeBinary(b *strings.Builder, l Expr, op string, r Expr) {
	// Left operands need no parentheses when they are and/or, as both
	// associate to the left and a Not never ends up bare on their right.
	_, lnot := l.(Not)
	writeGrouped(b, l, lnot)
	b.WriteString(op)
	_, rnot := r.(Not)
	writeGrouped(b, r, rnot || isBinary(r))
}

func writeGrouped(b *strings.Builder, e Expr, paren bool) {
	if paren {
		b.WriteByte('(')
	}
	write(b, e)
	if paren {
		b.WriteByte(')')
	}
}

func isBinary(e Expr) bool {
	switch e.(type) {
	case And, Or:
		return true
	}
	return false
}

// Columns returns the distinct column names that e references, in order
// of first appearance.
func Columns(e Expr) []string {
	var cols []string
	seen := map[string]bool{}
	var walk func(Expr)
	add := func(o Operand) {
		if o.Field && !seen[o.Text] {
			seen[o.Text] = true
			cols = append(cols, o.Text)
		}
	}
	walk = func(e Expr) {
		switch e := e.(type) {
		case Eq:
			add(e.L)
			add(e.R)
		case And:
			walk(e.L)
			walk(e.R)
		case Or:
			walk(e.L)
			walk(e.R)
		case Not:
			walk(e.E)
		}
	}
	walk(e)
	return cols
}
