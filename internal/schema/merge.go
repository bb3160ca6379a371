package schema

// Merge3 applies to cur the change that turned before into after, for a
// set or a map: the elements (keys) after lacks against before are taken
// out of cur, those it adds or changes are put in, and whatever cur holds
// that before did not is kept. This is what xapi's add_to_/remove_from_
// calls do on the coordinator's copy; a writer that changed an older
// copy of the value does not undo a concurrent change to other elements.
// For any other kind, and where the three are not of one Go type, it
// returns after.
//
// When cur is still before, the result is after, exactly (a reordered
// set stays reordered); otherwise a set keeps cur's order, then the added
// elements in after's order.
func Merge3(t *Type, before, after, cur any) any {
	if t.Kind != KSet && t.Kind != KMap || Equal(cur, before) {
		return after
	}
	switch a := after.(type) {
	case []string:
		return mergeSet(as[[]string](before), a, as[[]string](cur))
	case []int64:
		return mergeSet(as[[]int64](before), a, as[[]int64](cur))
	case []any:
		return mergeAnySet(as[[]any](before), a, as[[]any](cur))
	case map[string]string:
		return mergeMap(as[map[string]string](before), a, as[map[string]string](cur))
	case map[string]int64:
		return mergeMap(as[map[string]int64](before), a, as[map[string]int64](cur))
	case map[string]float64:
		return mergeMap(as[map[string]float64](before), a, as[map[string]float64](cur))
	case map[string][]string:
		return mergeMap(as[map[string][]string](before), a, as[map[string][]string](cur))
	case map[string]any:
		return mergeMap(as[map[string]any](before), a, as[map[string]any](cur))
	}
	return after
}

// as is v as a T, or T's zero value (an empty set or map).
func as[T any](v any) T {
	x, _ := v.(T)
	return x
}

func mergeSet[E comparable](before, after, cur []E) []E {
	in := func(s []E) map[E]bool {
		m := make(map[E]bool, len(s))
		for _, e := range s {
			m[e] = true
		}
		return m
	}
	was, now := in(before), in(after)
	out := make([]E, 0, len(cur)+len(after))
	have := make(map[E]bool, len(cur)+len(after))
	for _, e := range cur {
		if (now[e] || !was[e]) && !have[e] {
			out, have[e] = append(out, e), true
		}
	}
	for _, e := range after {
		if !was[e] && !have[e] {
			out, have[e] = append(out, e), true
		}
	}
	return out
}

// mergeAnySet is mergeSet for elements compared with Equal (records,
// rarely stored): quadratic, over sets that are small.
func mergeAnySet(before, after, cur []any) []any {
	in := func(s []any, e any) bool {
		for _, x := range s {
			if Equal(x, e) {
				return true
			}
		}
		return false
	}
	out := make([]any, 0, len(cur)+len(after))
	for _, e := range cur {
		if (in(after, e) || !in(before, e)) && !in(out, e) {
			out = append(out, e)
		}
	}
	for _, e := range after {
		if !in(before, e) && !in(out, e) {
			out = append(out, e)
		}
	}
	return out
}

func mergeMap[V any](before, after, cur map[string]V) map[string]V {
	out := make(map[string]V, len(cur)+len(after))
	for k, v := range cur {
		if _, gone := before[k]; gone {
			if _, kept := after[k]; !kept {
				continue
			}
		}
		out[k] = v
	}
	for k, v := range after {
		if w, ok := before[k]; !ok || !Equal(w, v) {
			out[k] = v
		}
	}
	return out
}
