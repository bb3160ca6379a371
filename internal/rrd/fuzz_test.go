package rrd

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"
)

// FuzzParseXML feeds arbitrary bytes to the upload parser. Whatever it
// accepts must be usable: dumped, parsed again to the same dump, updated and
// exported without a panic.
func FuzzParseXML(f *testing.F) {
	// Small seeds: the fuzzer minimises every new input it finds, and on a
	// dump of many kilobytes that alone takes its whole time budget.
	small, err := New(5, at(1000), []DS{goldenDS("g", Gauge), goldenDS("d", Derive)},
		[]RRAConfig{{Average, 2, 1, 0.5}, {Max, 2, 3, 1}})
	if err != nil {
		f.Fatal(err)
	}
	_ = small.Update(at(1005), []Value{FloatValue(1), IntValue(-5)})
	_ = small.Update(at(1010), []Value{UnknownValue(), IntValue(5)})
	f.Add(small.AppendXML(nil, true))
	f.Add(small.AppendXML(nil, false))
	f.Add([]byte(xmlDecl + `<rrd><version>0003</version><step>5</step><lastupdate>0</lastupdate></rrd>`))
	f.Add([]byte(xmlDecl + `<rrd><version/><step>5</step><lastupdate>0</lastupdate><rra><cf>MAX</cf><pdp_per_row>2</pdp_per_row><params><xff>1</xff></params><cdp_prep/><database><row/></database></rra></rrd>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseXML(bytes.NewReader(b))
		if err != nil {
			return
		}
		dump := r.AppendXML(nil, true)
		r2, err := ParseXML(bytes.NewReader(dump))
		if err != nil {
			t.Fatalf("own dump rejected: %v\n%s", err, dump)
		}
		if !bytes.Equal(r2.AppendXML(nil, true), dump) {
			t.Fatal("dump of the re-parsed RRD differs")
		}
		_ = r.AppendJSON(nil)
		vals := make([]Value, len(r.DSs()))
		for i := range vals {
			vals[i] = FloatValue(float64(i))
		}
		_ = r.Update(time.Unix(int64(r.LastUpdated())+5, 0), vals)
		_ = r.Update(time.Unix(int64(r.LastUpdated())+86400*400, 0), vals)
		if x, err := Export([]Source{{"host:x:", r}}, -600, 0, AnyCF); err == nil {
			_ = x.AppendJSON(x.AppendXML(nil))
		}
	})
}

// FuzzUpdate drives an RRD with arbitrary times, readings, and source
// additions and removals, checking the invariants: no panic, stored values
// inside the sources' bounds, and a dump that parses.
func FuzzUpdate(f *testing.F) {
	f.Add([]byte{1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 2, 200, 3, 1})
	f.Add(bytes.Repeat([]byte{0, 7, 1, 2, 3, 4, 5, 6, 7, 8}, 20))
	f.Fuzz(func(t *testing.T, ops []byte) {
		d := func(name string, ty DSType) DS {
			return DS{Name: name, Type: ty, Min: 0, Max: 100, Heartbeat: 30}
		}
		r, err := New(5, time.Unix(1000, 0), []DS{d("a", Gauge), d("b", Derive), d("c", Absolute)}, goldenLayout())
		if err != nil {
			t.Fatal(err)
		}
		now := int64(1000)
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			switch op % 6 {
			case 0, 1: // an update arg seconds later (op 1: backwards)
				if op%5 == 0 {
					now += int64(arg)
				} else {
					now -= int64(arg % 16)
				}
				vals := make([]Value, len(r.DSs()))
				for i := range vals {
					if len(ops) >= 8 {
						bits := binary.LittleEndian.Uint64(ops)
						ops = ops[8:]
						switch bits % 3 {
						case 0:
							vals[i] = FloatValue(math.Float64frombits(bits))
						case 1:
							vals[i] = IntValue(int64(bits >> 2))
						}
					}
				}
				if now < 0 {
					now = 0
				}
				if err := r.Update(time.Unix(now, 0), vals); err != nil {
					t.Fatal(err)
				}
			case 2:
				_ = r.AddDS(time.Unix(now, 0), d(string(rune('d'+arg%8)), DSType(arg%3)))
			case 3:
				r.RemoveDS(string(rune('a' + arg%12)))
			case 4:
				if x, err := Export([]Source{{"h:", r}}, now-int64(arg)*5, int64(arg%20), CF(arg%4)); err == nil {
					_ = x.AppendXML(nil)
				}
			case 5: // some sources by name, one of them perhaps absent
				now += int64(arg % 8)
				names := []string{string(rune('a' + arg%12)), string(rune('a' + arg/16%12))}
				vals := []Value{FloatValue(float64(arg)), IntValue(int64(arg) * 1000)}
				if err := r.UpdateNamed(time.Unix(now, 0), names, vals, arg%7 == 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		for a, c := range r.Archives() {
			for i, ds := range r.DSs() {
				for age := range c.Rows {
					v, err := r.Row(a, i, age)
					if err != nil {
						t.Fatal(err)
					}
					// Bounds hold for what is stored (NaN compares false).
					if v < ds.Min || v > ds.Max {
						t.Fatalf("stored %v outside [%v, %v]", v, ds.Min, ds.Max)
					}
				}
			}
		}
		dump := r.AppendXML(nil, true)
		if _, err := ParseXML(bytes.NewReader(dump)); err != nil && !strings.Contains(err.Error(), "no rows") {
			t.Fatalf("dump rejected: %v", err)
		}
	})
}
