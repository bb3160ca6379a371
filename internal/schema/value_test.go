package schema

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func mustType(t testing.TB, s string) *Type {
	t.Helper()
	ty, err := ParseType(s)
	if err != nil {
		t.Fatal(err)
	}
	return ty
}

func TestParseType(t *testing.T) {
	for s, kind := range map[string]Kind{
		"string": KString, "int": KInt, "enum vm_power_state": KEnum, "VM ref": KRef, "VM record": KRecord,
		"string set": KSet, "(string -> string) map": KMap, "(int -> string set) map": KMap,
		"sr_stat record option": KOption, "void": KVoid, "an event batch": KEventBatch,
		"(VM ref -> VM record) map": KMap,
	} {
		ty, err := ParseType(s)
		if err != nil || ty.Kind != kind || ty.String() != s {
			t.Errorf("%q: %v %v", s, ty, err)
		}
	}
	ty := mustType(t, "(int -> string set) map")
	if ty.Key.Kind != KInt || ty.Elem.Kind != KSet || ty.Elem.Elem.Kind != KString {
		t.Errorf("nested map: %+v", ty)
	}
	for _, bad := range []string{"strin", "(string -> ) map", "enum", "x y ref"} {
		if _, err := ParseType(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestDBFormRoundTrip(t *testing.T) {
	cases := []struct {
		ty   string
		v    any
		text string
	}{
		{"string", "a b", "a b"},
		{"int", int64(-42), "-42"},
		{"float", 0.0, "0."},
		{"float", 1.5, "1.5"},
		{"float", 1e20, "1e+20"},
		{"float", 1.000000000001e12, "1.000000000001e+12"},
		{"float", 0.1, "0.1"},
		{"bool", true, "true"},
		{"datetime", time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), "20240102T03:04:05Z"},
		{"string set", []string{"a", "it's", `b\c`}, `('a' 'it\'s' 'b\\c')`},
		{"string set", []string{}, "()"},
		{"int set", []int64{1, 2}, "('1' '2')"},
		{"(string -> string) map", map[string]string{"k": "v", "a": "b c"}, "(('a' 'b c') ('k' 'v'))"},
		{"(int -> string set) map", map[string][]string{"0": {"x", "y"}}, "(('0' ('x' 'y')))"},
		{"(string -> int) map", map[string]int64{"n": 3}, "(('n' '3'))"},
		{"(int -> float) map", map[string]float64{"1": 0.5}, "(('1' '0.5'))"},
	}
	for _, c := range cases {
		ty := mustType(t, c.ty)
		if got := FormatDB(ty, c.v); got != c.text {
			t.Errorf("FormatDB(%s, %v) = %q, want %q", c.ty, c.v, got, c.text)
		}
		back, err := ParseDB(ty, c.text)
		if err != nil || !Equal(back, c.v) {
			t.Errorf("ParseDB(%s, %q) = %v, %v", c.ty, c.text, back, err)
		}
	}
	if f, _ := ParseDB(Float, "nan"); !math.IsNaN(f.(float64)) {
		t.Error("nan")
	}
	for _, bad := range []struct{ ty, text string }{
		{"int", "x"}, {"string set", "('a'"}, {"(string -> string) map", "(('a'))"}, {"(int -> int) map", "(('x' '1'))"},
		{"string set", "(('a'))"}, {"bool", "yes"},
	} {
		if _, err := ParseDB(mustType(t, bad.ty), bad.text); err == nil {
			t.Errorf("ParseDB(%s, %q) accepted", bad.ty, bad.text)
		}
	}
}

func TestParseDefault(t *testing.T) {
	for _, c := range []struct {
		ty, text string
		want     any
	}{
		{"string", `""`, ""},
		{"string", `"0:0"`, "0:0"},
		{"VM ref", "Null", NullRef},
		{"int set", "{0}", []int64{0}},
		{"string set", "{}", []string{}},
		{"(string -> string) map", `{"address" -> "localhost", "port" -> "27000"}`, map[string]string{"address": "localhost", "port": "27000"}},
		{"float", "-1.", -1.0},
		{"datetime", "19700101T00:00:00Z", Epoch},
	} {
		got, err := ParseDefault(mustType(t, c.ty), c.text)
		if err != nil || !Equal(got, c.want) {
			t.Errorf("ParseDefault(%s, %s) = %v, %v", c.ty, c.text, got, err)
		}
	}
}

func TestCheck(t *testing.T) {
	if Check(mustType(t, "VM ref"), "OpaqueRef:x") != nil || Check(mustType(t, "VM ref"), "x") == nil {
		t.Error("ref check")
	}
	if Check(mustType(t, "(string -> string) map"), map[string]string{"a": "b"}) != nil {
		t.Error("map check")
	}
	if Check(mustType(t, "(int -> int) map"), map[string]int64{"x": 1}) == nil {
		t.Error("int key check")
	}
	if Check(Int, 3) == nil {
		t.Error("int must be int64")
	}
}

func FuzzParseDB(f *testing.F) {
	for _, s := range []string{"()", "('a' 'b')", "(('k' 'v'))", `('a\'b')`, "((('x')))", "(('0' ('a' 'b')))", "('"} {
		f.Add(s)
	}
	types := []*Type{
		mustType(f, "string set"), mustType(f, "int set"), mustType(f, "(string -> string) map"),
		mustType(f, "(int -> string set) map"), mustType(f, "(string -> float) map"),
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, ty := range types {
			v, err := ParseDB(ty, s)
			if err != nil {
				continue
			}
			// What parses writes back to a form that parses to the same value.
			again, err := ParseDB(ty, FormatDB(ty, v))
			if err != nil || !Equal(again, v) {
				t.Fatalf("%s %q -> %v -> %q -> %v, %v", ty, s, v, FormatDB(ty, v), again, err)
			}
		}
	})
}

// MapEntries walks every canonical map form, and nothing else.
func TestMapEntries(t *testing.T) {
	for _, c := range []struct {
		m    any
		want map[string]any
	}{
		{map[string]string{"a": "x", "b": "y"}, map[string]any{"a": "x", "b": "y"}},
		{map[string]int64{"a": 1, "b": 2}, map[string]any{"a": int64(1), "b": int64(2)}},
		{map[string]float64{"a": 0.5}, map[string]any{"a": 0.5}},
		{map[string][]string{"a": {"x"}, "b": nil}, map[string]any{"a": []string{"x"}, "b": []string(nil)}},
		{map[string]any{"a": "x", "b": int64(2)}, map[string]any{"a": "x", "b": int64(2)}},
		{map[string]string(nil), map[string]any{}},
	} {
		got := map[string]any{}
		for k, v := range MapEntries(c.m) {
			got[k] = v
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%T: %v, want %v", c.m, got, c.want)
		}
	}
	n := 0
	for range MapEntries(map[string]string{"a": "x", "b": "y"}) {
		n++
		break // stopping early must not panic
	}
	if n != 1 {
		t.Fatalf("%d entries before break", n)
	}
	for _, v := range []any{nil, "map", []string{"a"}, map[string]bool{"a": true}} {
		for k := range MapEntries(v) {
			t.Errorf("%T yielded %q", v, k)
		}
	}
}
