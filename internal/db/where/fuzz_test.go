package where

import (
	"errors"
	"hash/fnv"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		``,
		`true`,
		`field "power_state" = "Running" and not (field "is_a_template" = "true")`,
		`not field "a" = "b" or (false and "x" = field "y")`,
		`nottrue`,
		`(true)or(false)`,
		`field"a"=field"b"`,
		"\"a b\"\t=\n\"\xff\"",
		`((((not not true))))`,
		`"unterminated`,
		`TRUE and`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := Parse(s)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || se.Pos < 0 || se.Pos > len(s) || se.Msg == "" {
				t.Fatalf("Parse(%q): bad error %#v", s, err)
			}
			return
		}
		c := e.String()
		e2, err := Parse(c)
		if err != nil {
			t.Fatalf("Parse(%q) ok, but its String %q does not parse: %v", s, c, err)
		}
		if e2 != e {
			t.Fatalf("Parse(%q) = %s, but Parse(String) = %s", s, c, e2)
		}
		if c2 := e2.String(); c2 != c {
			t.Fatalf("String not canonical: %q, then %q", c, c2)
		}

		// Bind and Eval agree with the reference evaluator on a row
		// whose values derive from the column names.
		value := func(col string) string {
			h := fnv.New32a()
			h.Write([]byte(col))
			if h.Sum32()%2 == 0 {
				return col // makes field "x" = "x" true
			}
			return ""
		}
		cols := Columns(e)
		p, err := Bind(e, func(col string) (int, bool) {
			for i, c := range cols {
				if c == col {
					return i, true
				}
			}
			return 0, false
		})
		if err != nil {
			t.Fatalf("Bind(%s): %v", c, err)
		}
		got := p.Eval(func(i int) string { return value(cols[i]) })
		want := refEval(e, value)
		if got != want {
			t.Fatalf("%s: Eval = %v, reference = %v", c, got, want)
		}
		if p.IsTrue() && !want {
			t.Fatalf("%s: IsTrue but false on a row", c)
		}
	})
}
