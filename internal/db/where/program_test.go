package where

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// A fake VM table: column names, and one row in stored string form.
var (
	vmColumns = []string{"_ref", "name__label", "power_state", "is_a_template", "other_config", "tags"}
	vmRow     = []string{"OpaqueRef:1", "web 1", "Running", "false", "(('k' 'v'))", "()"}
)

func vmLookup(col string) (int, bool) {
	i := slices.Index(vmColumns, col)
	return i, i >= 0
}

func vmGet(col int) string { return vmRow[col] }

func TestEval(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{`true`, true},
		{`false`, false},
		{`field "power_state" = "Running"`, true},
		{`field "power_state" = "running"`, false},
		{`"Running" = field "power_state"`, true},
		{`field "name__label" = "web 1"`, true},
		{`field "other_config" = "(('k' 'v'))"`, true},
		{`field "tags" = "()"`, true},
		{`field "tags" = ""`, false},
		{`field "_ref" = "OpaqueRef:1"`, true},
		{`field "is_a_template" = field "power_state"`, false},
		{`field "is_a_template" = field "is_a_template"`, true},
		{`"a" = "a"`, true},
		{`"a" = "b"`, false},
		{`field "power_state" = "Running" and not (field "is_a_template" = "true")`, true},
		{`field "power_state" = "Halted" or field "is_a_template" = "false"`, true},
		{`field "power_state" = "Halted" or field "is_a_template" = "true"`, false},
		{`not field "power_state" = "Halted"`, true},
		{`not field "power_state" = "Running" and false`, true}, // not (… and false)
		{`(not field "power_state" = "Running") and false`, false},
		{`(not field "power_state" = "Running") or true`, true},
		{`not field "power_state" = "Running" or true`, false}, // not (… or true)
		{`not not field "tags" = "()"`, true},
		{`not (field "tags" = "()" and not field "name__label" = "x")`, false},
		{`true or field "power_state" = "x" and false`, false}, // (true or …) and false
	}
	for _, tt := range tests {
		e, err := Parse(tt.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.in, err)
		}
		p, err := Bind(e, vmLookup)
		if err != nil {
			t.Fatalf("Bind(%q): %v", tt.in, err)
		}
		if got := p.Eval(vmGet); got != tt.want {
			t.Errorf("Eval(%q) = %v, want %v", tt.in, got, tt.want)
		}
		if got := refEval(e, vmRowValue); got != tt.want {
			t.Errorf("reference Eval(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func vmRowValue(col string) string {
	i, _ := vmLookup(col)
	return vmRow[i]
}

func TestBindFolding(t *testing.T) {
	tests := []struct {
		in      string
		isTrue  bool
		unknown string // column of the expected UnknownColumnError
	}{
		{in: `true`, isTrue: true},
		{in: `not false`, isTrue: true},
		{in: `"a" = "a"`, isTrue: true},
		{in: `not "a" = "b"`, isTrue: true},
		{in: `field "tags" = field "tags"`, isTrue: true},
		{in: `false or true`, isTrue: true},
		{in: `false`},
		{in: `field "tags" = "()"`},
		{in: `field "tags" = "()" or true`, isTrue: true},
		// Columns that evaluation never reaches are not looked up.
		{in: `true or field "nope" = "x"`, isTrue: true},
		{in: `false and field "nope" = "x"`},
		{in: `(not true) and field "nope" = "x"`},
		{in: `not (false and field "nope" = "x")`, isTrue: true},
		// Reachable ones must exist.
		{in: `field "nope" = "x"`, unknown: "nope"},
		{in: `"x" = field "nope"`, unknown: "nope"},
		{in: `field "nope" = "x" and false`, unknown: "nope"},
		{in: `field "tags" = "x" or field "nope" = "x"`, unknown: "nope"},
		{in: `false or not field "nope" = "x"`, unknown: "nope"},
		{in: `not true and field "nope" = "x"`, unknown: "nope"}, // not (true and …)
	}
	for _, tt := range tests {
		e, err := Parse(tt.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.in, err)
		}
		p, err := Bind(e, vmLookup)
		if tt.unknown != "" {
			var ue *UnknownColumnError
			if !errors.As(err, &ue) || ue.Column != tt.unknown {
				t.Errorf("Bind(%q) error = %v, want unknown column %q", tt.in, err, tt.unknown)
			}
			continue
		}
		if err != nil {
			t.Errorf("Bind(%q): %v", tt.in, err)
			continue
		}
		if p.IsTrue() != tt.isTrue {
			t.Errorf("Bind(%q).IsTrue() = %v", tt.in, p.IsTrue())
		}
	}
	if _, err := Bind(nil, vmLookup); err == nil {
		t.Error("Bind(nil) succeeded")
	}
	if _, err := Bind(eqf("tags", "x"), nil); err == nil {
		t.Error("Bind with no lookup succeeded")
	}
}

func TestEvalShortCircuit(t *testing.T) {
	e, _ := Parse(`field "power_state" = "Halted" and field "tags" = "()" and field "name__label" = "x" or field "is_a_template" = "false"`)
	p, err := Bind(e, vmLookup)
	if err != nil {
		t.Fatal(err)
	}
	var read []string
	got := p.Eval(func(col int) string {
		read = append(read, vmColumns[col])
		return vmRow[col]
	})
	if want := []string{"power_state", "is_a_template"}; !got || !slices.Equal(read, want) {
		t.Errorf("Eval = %v, read %q; want true, read %q", got, read, want)
	}
}

// refEval is xapi's eval_expr, written directly.
func refEval(e Expr, get func(string) string) bool {
	val := func(o Operand) string {
		if o.Field {
			return get(o.Text)
		}
		return o.Text
	}
	switch e := e.(type) {
	case True:
		return true
	case Eq:
		return val(e.L) == val(e.R)
	case And:
		return refEval(e.L, get) && refEval(e.R, get)
	case Or:
		return refEval(e.L, get) || refEval(e.R, get)
	case Not:
		return !refEval(e.E, get)
	}
	return false
}

// randExpr builds a random expression over columns c0..c2 and values
// v0..v2, with constants mixed in to exercise folding.
func randExpr(r *rand.Rand, depth int) Expr {
	operand := func() Operand {
		if r.IntN(2) == 0 {
			return field("c" + string(rune('0'+r.IntN(3))))
		}
		return lit("v" + string(rune('0'+r.IntN(3))))
	}
	n := 6
	if depth == 0 {
		n = 3
	}
	switch r.IntN(n) {
	case 0:
		return True{}
	case 1:
		return False{}
	case 2:
		return Eq{operand(), operand()}
	case 3:
		return Not{randExpr(r, depth-1)}
	case 4:
		return And{randExpr(r, depth-1), randExpr(r, depth-1)}
	}
	return Or{randExpr(r, depth-1), randExpr(r, depth-1)}
}

// TestEvalMatchesReference checks Bind and Eval (folding, jumps and
// negated comparisons) against refEval on random expressions and rows.
func TestEvalMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lookup := func(col string) (int, bool) { return int(col[1] - '0'), true }
	for range 20000 {
		e := randExpr(r, 6)
		p, err := Bind(e, lookup)
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			row := [3]string{}
			for i := range row {
				row[i] = "v" + string(rune('0'+r.IntN(3)))
			}
			get := func(col string) string { return row[col[1]-'0'] }
			if got, want := p.Eval(func(i int) string { return row[i] }), refEval(e, get); got != want {
				t.Fatalf("%s on %q: Eval = %v, want %v", e, row, got, want)
			}
		}
	}
}

func BenchmarkEval(b *testing.B) {
	e, err := Parse(`field "power_state" = "Running" and not (field "is_a_template" = "true")`)
	if err != nil {
		b.Fatal(err)
	}
	p, err := Bind(e, vmLookup)
	if err != nil {
		b.Fatal(err)
	}
	get := func(col int) string { return vmRow[col] }
	b.ReportAllocs()
	for b.Loop() {
		if !p.Eval(get) {
			b.Fatal("no match")
		}
	}
}
