package schema

import (
	"reflect"
	"testing"
)

func TestMerge3(t *testing.T) {
	set, _ := ParseType("string set")
	ints, _ := ParseType("int set")
	smap, _ := ParseType("(string -> string) map")
	for _, c := range []struct {
		name               string
		t                  *Type
		before, after, cur any
		want               any
	}{
		{"set add keeps a concurrent add", set, []string{"a"}, []string{"a", "m"}, []string{"a", "c"}, []string{"a", "c", "m"}},
		{"set remove keeps a concurrent add", set, []string{"a", "b"}, []string{"a"}, []string{"a", "b", "c"}, []string{"a", "c"}},
		{"set add of what is there already", set, []string{}, []string{"x"}, []string{"x"}, []string{"x"}},
		{"set from empty", set, nil, []string{"x"}, nil, []string{"x"}},
		{"a removed element stays removed", ints, []int64{1, 2}, []int64{1}, []int64{1, 2, 3}, []int64{1, 3}},
		{"map set keeps a concurrent key", smap, map[string]string{}, map[string]string{"m": "1"}, map[string]string{"c": "2"}, map[string]string{"m": "1", "c": "2"}},
		{"map delete keeps a concurrent key", smap, map[string]string{"op": "start"}, map[string]string{}, map[string]string{"op": "start", "op2": "clean_shutdown"}, map[string]string{"op2": "clean_shutdown"}},
		{"map change wins over the concurrent value", smap, map[string]string{"k": "old"}, map[string]string{"k": "mine"}, map[string]string{"k": "theirs"}, map[string]string{"k": "mine"}},
		{"map key untouched keeps the concurrent value", smap, map[string]string{"k": "old"}, map[string]string{"k": "old", "n": "1"}, map[string]string{"k": "theirs"}, map[string]string{"k": "theirs", "n": "1"}},
		{"scalar: after", String, "a", "b", "c", "b"},
		{"no concurrent change: after exactly", set, []string{"a", "b"}, []string{"b", "a"}, []string{"a", "b"}, []string{"b", "a"}},
	} {
		got := Merge3(c.t, c.before, c.after, c.cur)
		if !Equal(got, c.want) && !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %#v, want %#v", c.name, got, c.want)
		}
	}
}
