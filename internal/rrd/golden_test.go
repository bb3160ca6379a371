package rrd

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The golden scenario. Step 5 s, three host sources and one VM source, all
// with a 12 s heartbeat, min 0 and max +inf:
//
//	gauge  GAUGE     float readings
//	abs    ABSOLUTE  float readings (events since the last reading)
//	ctr    DERIVE    int64 readings of a 64-bit counter
//	mem    GAUGE     (the VM's only source)
//
// Archives (small, so that every value can be worked out by hand):
//
//	A0  AVERAGE  4 rows x 1 step  xff 0.5
//	A1  AVERAGE  3 rows x 3 steps xff 0.5
//	A2  MIN      3 rows x 3 steps xff 0.5
//	A3  MAX      3 rows x 3 steps xff 0.5
func goldenLayout() []RRAConfig {
	return []RRAConfig{
		{CF: Average, Rows: 4, PDPPerRow: 1, XFF: 0.5},
		{CF: Average, Rows: 3, PDPPerRow: 3, XFF: 0.5},
		{CF: Min, Rows: 3, PDPPerRow: 3, XFF: 0.5},
		{CF: Max, Rows: 3, PDPPerRow: 3, XFF: 0.5},
	}
}

func at(s int64) time.Time { return time.Unix(s, 0) }

func goldenDS(name string, ty DSType) DS {
	return DS{Name: name, Type: ty, Min: 0, Max: math.Inf(1), Heartbeat: 12}
}

// goldenRRDs builds the host and VM RRDs at t=1000 and feeds them readings
// every 5 s up to t=1020 (then, if gap, one more at t=1040 after a 20 s gap).
func goldenRRDs(t testing.TB, gap bool) (host, vm *RRD) {
	t.Helper()
	var err error
	host, err = New(5, at(1000), []DS{goldenDS("gauge", Gauge), goldenDS("abs", Absolute), goldenDS("ctr", Derive)}, goldenLayout())
	if err != nil {
		t.Fatal(err)
	}
	vm, err = New(5, at(1000), []DS{goldenDS("mem", Gauge)}, goldenLayout())
	if err != nil {
		t.Fatal(err)
	}
	// The counter starts 200 below 2^64 (written as int64, -200) and wraps
	// past zero between t=1010 and t=1015; at t=1020 it goes backwards (a
	// reset).
	steps := []struct {
		t          int64
		gauge, abs Value
		ctr        int64
		mem        float64
	}{
		{1005, FloatValue(10), FloatValue(50), -200, 1},
		{1010, FloatValue(20), FloatValue(100), -100, 2},
		{1015, UnknownValue(), FloatValue(25), 100, 3},
		{1020, FloatValue(40), FloatValue(0), 50, 4},
	}
	if gap {
		steps = append(steps, struct {
			t          int64
			gauge, abs Value
			ctr        int64
			mem        float64
		}{1040, FloatValue(50), FloatValue(100), 1500, 5})
	}
	for _, s := range steps {
		if err := host.Update(at(s.t), []Value{s.gauge, s.abs, IntValue(s.ctr)}); err != nil {
			t.Fatal(err)
		}
		if err := vm.Update(at(s.t), []Value{FloatValue(s.mem)}); err != nil {
			t.Fatal(err)
		}
	}
	return host, vm
}

// The hand computation. Every update is 5 s after the previous one (until
// the gap), so for each: interval 5, one step ends, pre 5, post 0.
//
// t=1000 New: every source was last updated at 0, 1000 s ago, beyond the
// heartbeat: all points unknown. A0 pushes its initial value then 4 unknowns
// (all NaN). A1-A3 likewise end all NaN; 1000/5 = 200 steps and 200 mod 3 =
// 2, so their open row starts with 2 unknown points.
//
// Rates (per second) and primary points:
//
//	t     gauge         abs           ctr (raw; difference)        mem
//	1005  10            50/5 = 10     -200; no previous: unknown  1
//	1010  20            100/5 = 20    -100; 100 -> 100/5 = 20     2
//	1015  unknown (*)   25/5 = 5      100; 200 -> 40 (wrapped)    3
//	1020  40            0/5 = 0       50; -50 -> -10 < min: NaN   4
//
// (*) xapi keeps a GAUGE's previous rate when a reading is unknown: the point
// for 1015 is 20. ctr's readings are an unsigned 64-bit counter seen as
// int64: -100 is 2^64-100, so from 1010 to 1015 the counter wrapped past
// 2^64 to 100, and the two's complement difference 100 - (-100) = 200 is
// the true count.
//
// A0 (1 step per row): each point is a row. An unknown point in a one-step
// AVERAGE archive is stored as the row's starting value, 0: xapi counts an
// unknown point only if some of the row is left to renormalise over, so the
// row has 0 unknown points <= xff limit int(0.5*1) = 0. Rows 1005..1020:
//
//	gauge 10 20 20 40   abs 10 20 5 0   ctr 0 20 40 0   mem 1 2 3 4
//
// A1-A3 (3 steps per row, limit int(0.5*3) = 1 unknown point): the row
// ending at 1005 has the two unknown points from before plus one: NaN. The
// row ending at 1020 is the points of 1010, 1015, 1020:
//
//	AVERAGE gauge (20+20+40)/3 = 26.666..., abs (20+5+0)/3 = 8.333...,
//	        ctr: 20/3 + 40/3 = 20 over 3 points, then the unknown point
//	        renormalises to 2 points: 20*3/2 = 30, mem (2+3+4)/3 = 3
//	MIN     gauge 10 (**), abs 0, ctr min(20,40) = 20 renormalised *3/2 = 30,
//	        mem 1 (**)
//	MAX     gauge 40, abs 20, ctr 40*3/2 = 60, mem 4
//
// (**) When a row completes, xapi starts the next one by folding in the
// same point with weight 0; MIN, MAX and LAST ignore the weight, so the
// last point of the row ending at 1005 (gauge 10, mem 1) is carried into
// the MIN of the next row. xapi renormalises MIN and MAX for unknown points
// as it does AVERAGE. Both are xapi's arithmetic, kept for byte equality.
// Stored values are single precision: 26.666666666666668 is stored as
// 26.66666603088379 and printed with %.15g as 26.6666660308838;
// 8.333333333333334 as 8.333333015441895, printed 8.33333301544189.
//
// After 1020, the open rows of A1-A3 are empty (the row just ended), so
// A1's prepared value is 0 with no unknown points; MIN's is the carried
// point (gauge 40, abs 0, ctr unknown: +Inf, the MIN start clamped to
// max = +Inf) and MAX's (40, 0, 0). The sources keep gauge 40, abs 0 and
// ctr's last raw reading 50 with rate state 0 (post is 0).
//
// The gap: at t=1040, 20 s after 1020 and beyond the 12 s heartbeat, every
// reading is unknown (and ctr keeps 50 as its previous raw value). Four
// steps end. A0 pushes its prepared 0 for 1025, then three unknown rows.
// A1-A3 complete the row ending at 1035 with one block of three unknown
// points; that leaves nothing to renormalise over, so they are not counted
// and the row keeps its prepared value: AVERAGE 0, MIN (40, 0, +Inf), MAX
// (40, 0, 0). The step 1035-1040 opens the next row with one unknown point.

func goldenFile(t *testing.T, name string, got []byte) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs:\n got %s\nwant %s", name, got, want)
	}
}

func goldenSources(h, v *RRD) []Source {
	return []Source{{Prefix: "host:H:", RRD: h}, {Prefix: "vm:V:", RRD: v}}
}

// /rrd_updates?start=1005&host=true: start is within A0's 4 x 5 s (it must
// be after 1020 - 20 = 1000), so A0 answers, rows newest first from 1020
// down to 1005 (the last row not before start). meta start is the first row
// boundary after start: 1005/5*5 + 5 = 1010, as xapi writes it.
func TestGoldenUpdates5s(t *testing.T) {
	h, v := goldenRRDs(t, false)
	x, err := Export(goldenSources(h, v), 1005, 0, AnyCF)
	if err != nil {
		t.Fatal(err)
	}
	goldenFile(t, "updates_5s.xml", x.AppendXML(nil))
	goldenFile(t, "updates_5s.json", x.AppendJSON(nil))
}

// /rrd_updates?start=1000&interval=15: 15/5 = 3 steps per row at least, so
// A1 (the first such archive, which covers 1020 - 45 = 975 < 1000) answers,
// with A2 and A3 of the same shape since no cf was given. Rows end at 1020
// and 1005 (990 is before start); meta start is 1000/15*15 + 15 = 1005.
func TestGoldenUpdates15s(t *testing.T) {
	h, v := goldenRRDs(t, false)
	x, err := Export(goldenSources(h, v), 1000, 15, AnyCF)
	if err != nil {
		t.Fatal(err)
	}
	goldenFile(t, "updates_15s.xml", x.AppendXML(nil))
	goldenFile(t, "updates_15s.json", x.AppendJSON(nil))

	// cf=MIN keeps only the MIN archives.
	x, err = Export(goldenSources(h, v), 1000, 15, Min)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"MIN:host:H:gauge", "MIN:host:H:abs", "MIN:host:H:ctr", "MIN:vm:V:mem"}
	if strings.Join(x.Legend, ",") != strings.Join(want, ",") {
		t.Errorf("legend %v", x.Legend)
	}
	if got := x.Rows[0].Values; got[0] != 10 || got[1] != 0 || got[2] != 30 || got[3] != 1 {
		t.Errorf("MIN row %v", got)
	}
}

// /host_rrd: the whole host RRD after 1020 (XML and JSON), and after the
// gap (XML).
func TestGoldenHostRRD(t *testing.T) {
	h, _ := goldenRRDs(t, false)
	goldenFile(t, "host_rrd.xml", h.AppendXML(nil, false))
	goldenFile(t, "host_rrd.json", h.AppendJSON(nil))
	h, _ = goldenRRDs(t, true)
	goldenFile(t, "host_rrd_gap.xml", h.AppendXML(nil, false))
}
