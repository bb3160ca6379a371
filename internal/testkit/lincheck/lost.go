package lincheck

import (
	"fmt"
	"sort"
)

// A Finding is one acknowledged write the final state cannot explain.
type Finding struct {
	Key   string
	Final string // the key's final value ("" for absent)
	// Write is the acknowledged write that was lost. For a final value
	// no write ever wrote (a phantom), Write is the zero Entry.
	Write   Entry
	Phantom bool
}

func (f Finding) String() string {
	if f.Phantom {
		return fmt.Sprintf("key %q: final value %q was never written", f.Key, f.Final)
	}
	return fmt.Sprintf("key %q: acknowledged %v lost (final value %q)", f.Key, f.Write, f.Final)
}

// LostWrites reports every acknowledged write of h that the final values
// cannot explain. final holds each key's value read after every writer
// stopped and every fault healed (a key missing from it is "", never
// written). Only keys that h writes, or that final holds, are looked at.
//
// The final value of a key must come from some write W of that value
// (acknowledged, or of unknown outcome) or be the initial "" (as if from a
// write before everything). An acknowledged write invoked after W returned
// must have been ordered after W, so the final state should show it or a
// later write: each such write is lost. Values should be unique per key;
// when they are not, the write that explains the most is assumed. A final
// value no write wrote is reported as a phantom. Reads play no part: this
// check is weaker than linearizability, and much cheaper.
func LostWrites(h []Entry, final map[string]string) []Finding {
	type write struct {
		e     Entry
		acked bool
	}
	writes := make(map[string][]write)
	for _, e := range h {
		switch {
		case e.Op.Kind == Put:
		case e.Op.Kind == CAS && (e.Unknown || e.Result.OK):
		default:
			continue
		}
		ret := e.Return
		if e.Unknown {
			ret = Pending
		}
		e.Return = ret
		writes[e.Op.Key] = append(writes[e.Op.Key], write{e: e, acked: !e.Unknown})
	}
	keys := make([]string, 0, len(writes))
	for k := range writes {
		keys = append(keys, k)
	}
	for k := range final {
		if _, ok := writes[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)

	var out []Finding
	for _, k := range keys {
		v := final[k]
		// The latest return of a write that could have left v.
		var explained int64
		found := false
		if v == "" {
			explained, found = -1, true // the initial state: before everything
		}
		for _, w := range writes[k] {
			if w.e.Op.Value == v && (!found || w.e.Return > explained) {
				explained, found = w.e.Return, true
			}
		}
		if !found {
			out = append(out, Finding{Key: k, Final: v, Phantom: true})
			explained = -1 // nothing explains it: every acknowledged write is lost
		}
		for _, w := range writes[k] {
			if w.acked && w.e.Call > explained {
				out = append(out, Finding{Key: k, Final: v, Write: w.e})
			}
		}
	}
	return out
}

// LostWrites checks the Recorder's history; see the function LostWrites.
func (r *Recorder) LostWrites(final map[string]string) ([]Finding, error) {
	if err := r.err(); err != nil {
		return nil, err
	}
	return LostWrites(r.History(), final), nil
}
