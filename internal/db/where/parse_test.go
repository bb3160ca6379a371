package where

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

var (
	yes = True{}
	no  = False{}
)

func lit(s string) Operand   { return Operand{Text: s} }
func field(s string) Operand { return Operand{Field: true, Text: s} }

// eqf is field "col" = "val".
func eqf(col, val string) Expr { return Eq{field(col), lit(val)} }

func TestParse(t *testing.T) {
	a, b, c := eqf("a", "1"), eqf("b", "2"), eqf("c", "3")
	tests := []struct {
		in   string
		want Expr
	}{
		// Every token kind.
		{`true`, yes},
		{`false`, no},
		{`"x" = "y"`, Eq{lit("x"), lit("y")}},
		{`field "name__label" = "vm"`, eqf("name__label", "vm")},
		{`"vm" = field "name__label"`, Eq{lit("vm"), field("name__label")}},
		{`field "a" = field "b"`, Eq{field("a"), field("b")}},
		{`"a" = "a"`, Eq{lit("a"), lit("a")}},
		{`true and false`, And{yes, no}},
		{`true or false`, Or{yes, no}},
		{`not true`, Not{yes}},
		{`(true)`, yes},
		{`((((false))))`, no},

		// and/or: same precedence, left-associative.
		{`true or false and false`, And{Or{yes, no}, no}},
		{`true and false or true`, Or{And{yes, no}, yes}},
		{`field "a" = "1" or field "b" = "2" and field "c" = "3"`, And{Or{a, b}, c}},
		{`field "a" = "1" and field "b" = "2" and field "c" = "3"`, And{And{a, b}, c}},
		{`field "a" = "1" or (field "b" = "2" and field "c" = "3")`, Or{a, And{b, c}}},

		// not: lowest precedence in xapi; it reaches to the end of its group.
		{`not field "a" = "1"`, Not{a}},
		{`not field "a" = "1" and field "b" = "2"`, Not{And{a, b}}},
		{`(not field "a" = "1") and field "b" = "2"`, And{Not{a}, b}},
		{`field "a" = "1" and not field "b" = "2" or field "c" = "3"`, And{a, Not{Or{b, c}}}},
		{`(not true) or false`, Or{Not{yes}, no}},
		{`(not true or false) and true`, And{Not{Or{yes, no}}, yes}},
		{`not not true`, Not{Not{yes}}},
		{`not (true)`, Not{yes}},

		// The example from the XenAPI documentation.
		{`field "power_state" = "Running" and not (field "is_a_template" = "true")`,
			And{eqf("power_state", "Running"), Not{eqf("is_a_template", "true")}}},

		// Whitespace: space, tab and newline, or none at all.
		{" \t\ntrue\n\t ", yes},
		{"field\t\"a\"\n=\n\"1\"", a},
		{`field"a"="1"`, a},
		{`nottrue`, Not{yes}},
		{`(true)or(false)`, Or{yes, no}},
		{`trueandfalse`, And{yes, no}},
		{`notfield"a"="1"`, Not{a}},

		// Literals hold any byte except '"', spaces and keywords included.
		{`"" = ""`, Eq{lit(""), lit("")}},
		{`field "" = " "`, Eq{field(""), lit(" ")}},
		{`"a and b" = "(not) = or"`, Eq{lit("a and b"), lit("(not) = or")}},
		{`field "other_config" = "(('k' 'v'))"`, eqf("other_config", "(('k' 'v'))")},
		{"\"tab\tnl\ncr\r\" = \"\\'\"", Eq{lit("tab\tnl\ncr\r"), lit(`\'`)}},
		{"\"héllo ✓\" = \"\x00\xff\"", Eq{lit("héllo ✓"), lit("\x00\xff")}},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("Parse(%q)\n got %s\nwant %s", tt.in, got, tt.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		in  string
		pos int
		msg string // substring of SyntaxError.Msg
	}{
		{``, 0, "expected an expression, found end of input"},
		{"  \n", 3, "expected an expression, found end of input"},
		{`"abc`, 0, `unterminated literal "abc"`},
		{`field "a" = "b`, 12, "unterminated literal"},
		{`field "a`, 6, `expected a quoted column name after "field", found unterminated literal`},
		{`field "a"`, 9, `expected '=' after field "a", found end of input`},
		{`field "a" "b"`, 10, `expected '=' after field "a", found literal "b"`},
		{`"a" = "b" = "c"`, 10, `expected "and", "or" or end of input, found '='`},
		{`"a" =`, 5, "expected a literal or field after '=', found end of input"},
		{`"a" = true`, 6, `expected a literal or field after '=', found "true"`},
		{`= "a"`, 0, "expected an expression, found '='"},
		{`true and`, 8, `expected an expression after "and", found end of input`},
		{`true or or false`, 8, `expected an expression after "or", found "or"`},
		{`and true`, 0, `expected an expression, found "and"`},
		{`not`, 3, `expected an expression after "not"`},
		{`(true`, 5, `expected "and", "or" or ')' closing the '(' at offset 0, found end of input`},
		{`((true)`, 7, "closing the '(' at offset 0"},
		{`true)`, 4, `expected "and", "or" or end of input, found ')'`},
		{`()`, 1, `expected an expression after '(', found ')'`},
		{`true false`, 5, `found "false"`},
		{`"a" = "b" "c"`, 10, `found literal "c"`},
		{`TRUE`, 0, `unknown word "TRUE" (keywords are lower-case)`},
		{`true AND false`, 5, `unknown word "AND" (keywords are lower-case)`},
		{`yes`, 0, `unknown word "yes"`},
		{`truex`, 4, `unknown word "x"`},
		{`field name__label = "x"`, 6, `expected a quoted column name after "field", found unknown word "name__label"`},
		{`field = "x"`, 6, `expected a quoted column name after "field", found '='`},
		{`field`, 5, `expected a quoted column name after "field", found end of input`},
		{`'a' = 'b'`, 0, `unexpected character "'"`},
		{"true\r\nor false", 4, "carriage return"},
		{"\xff", 0, `unexpected character "\xff"`},
		{`"` + strings.Repeat("x", 100), 0, `unterminated literal "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...`},
	}
	for _, tt := range tests {
		e, err := Parse(tt.in)
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Errorf("Parse(%q) = %v, %v; want a SyntaxError", tt.in, e, err)
			continue
		}
		if se.Pos != tt.pos || !strings.Contains(se.Msg, tt.msg) {
			t.Errorf("Parse(%q): %v\nwant offset %d and %q", tt.in, err, tt.pos, tt.msg)
		}
	}
}

func TestParseLimits(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("(", n) + "true" + strings.Repeat(")", n) }
	nots := func(n int) string { return strings.Repeat("not ", n) + "true" }
	for _, in := range []string{nest(MaxDepth), nots(MaxDepth), strings.Repeat("not (", MaxDepth/2) + "true" + strings.Repeat(")", MaxDepth/2)} {
		if _, err := Parse(in); err != nil {
			t.Errorf("nesting %d: %v", MaxDepth, err)
		}
	}
	for _, in := range []string{nest(MaxDepth + 1), nots(MaxDepth + 1), nest(MaxLen / 2), nots(MaxLen / 5)} {
		_, err := Parse(in)
		var se *SyntaxError
		if !errors.As(err, &se) || (!strings.Contains(se.Msg, "nesting") && !strings.Contains(se.Msg, "longer")) {
			t.Errorf("too deep (%d bytes): got %v", len(in), err)
		}
	}
	_, err := Parse(`"` + strings.Repeat("x", MaxLen) + `"`)
	if se := (*SyntaxError)(nil); !errors.As(err, &se) || se.Pos != MaxLen {
		t.Errorf("too long: %v", err)
	}

	// A long flat chain is not nesting: it parses, prints and binds.
	clause := `field "uuid" = "00000000-0000-0000-0000-000000000000" or `
	long := strings.Repeat(clause, (MaxLen-10)/len(clause)) + "false"
	e, err := Parse(long)
	if err != nil {
		t.Fatalf("long chain: %v", err)
	}
	if e2, err := Parse(e.String()); err != nil || e2 != e {
		t.Errorf("long chain does not round-trip: %v", err)
	}
	p, err := Bind(e, func(string) (int, bool) { return 0, true })
	if err != nil || p.Eval(func(int) string { return "x" }) {
		t.Errorf("long chain: Bind %v or wrong result", err)
	}
}

func TestString(t *testing.T) {
	a, b, c := eqf("a", "1"), eqf("b", "2"), eqf("c", "3")
	tests := []struct {
		e    Expr
		want string
	}{
		{yes, `true`},
		{no, `false`},
		{a, `field "a" = "1"`},
		{Eq{lit("x"), field("y")}, `"x" = field "y"`},
		{And{And{a, b}, c}, `field "a" = "1" and field "b" = "2" and field "c" = "3"`},
		{And{a, Or{b, c}}, `field "a" = "1" and (field "b" = "2" or field "c" = "3")`},
		{Not{a}, `not field "a" = "1"`},
		{Not{Not{yes}}, `not not true`},
		{Not{And{yes, no}}, `not (true and false)`},
		{And{Not{yes}, no}, `(not true) and false`},
		{And{yes, Not{no}}, `true and (not false)`},
		{Or{And{yes, Not{no}}, yes}, `true and (not false) or true`},
	}
	for _, tt := range tests {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("String() = %s, want %s", got, tt.want)
		}
		if back, err := Parse(tt.want); err != nil || back != tt.e {
			t.Errorf("Parse(%s) = %v, %v; want %#v", tt.want, back, err, tt.e)
		}
	}
}

func TestColumns(t *testing.T) {
	e, err := Parse(`field "b" = field "a" or not field "b" = "x" and "y" = field "c" or true`)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := Columns(e), []string{"b", "a", "c"}; !slices.Equal(got, want) {
		t.Errorf("Columns = %q, want %q", got, want)
	}
	if got := Columns(True{}); len(got) != 0 {
		t.Errorf("Columns(true) = %q", got)
	}
}

func BenchmarkParse(b *testing.B) {
	const in = `field "power_state" = "Running" and not (field "is_a_template" = "true")`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}
