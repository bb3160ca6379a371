package rrd

import (
	"bytes"
	"compress/gzip"
	"errors"
	"math"
	"strings"
	"testing"
)

// C's %.15g as printed by Python's '%.15g' (the same libc formatting OCaml's
// Printf uses).
func TestFloatFormatMatchesC(t *testing.T) {
	cases := []struct {
		f    float64
		want string
	}{
		{0.1, "0.1"}, {1e-05, "1e-05"}, {0.0001, "0.0001"},
		{123456789012345.0, "123456789012345"}, {1234567890123456.0, "1.23456789012346e+15"},
		{1e15, "1e+15"}, {1e16, "1e+16"}, {1e21, "1e+21"}, {1.5e-7, "1.5e-07"},
		{2.5, "2.5"}, {1.0 / 3, "0.333333333333333"}, {26.66666603088379, "26.6666660308838"},
		{-0.5, "-0.5"}, {5e-324, "4.94065645841247e-324"}, {math.MaxFloat64, "1.79769313486232e+308"},
		{100, "100"}, {1e14, "100000000000000"}, {999999999999999, "999999999999999"},
		{0.00012345678901234567, "0.000123456789012346"},
		{0, "0.0"}, {math.Copysign(0, -1), "0.0"}, {math.NaN(), "NaN"},
		{math.Inf(1), "Infinity"}, {math.Inf(-1), "-Infinity"},
	}
	for _, c := range cases {
		if got := string(appendFloat(nil, c.f)); got != c.want {
			t.Errorf("%v: got %s want %s", c.f, got, c.want)
		}
	}
}

func TestEscaping(t *testing.T) {
	if got := string(appendXMLText(nil, "a<b>&\"c'\t\x01")); got != "a&lt;b&gt;&amp;&quot;c'\t\uFFFD" {
		t.Error(got)
	}
	if got := string(appendJSONString(nil, "a\"\\\n\x01/é")); got != `"a\"\\\n\u0001/é"` {
		t.Error(got)
	}
	var o xmlOut
	o.start("a")
	o.start("b")
	o.end("b")
	o.elText("c", "")
	o.end("a")
	if string(o.b) != "<a><b/><c></c></a>" {
		t.Error(string(o.b))
	}
}

func TestStandardArchives(t *testing.T) {
	host := HostArchives()
	if len(host) != 10 {
		t.Fatalf("host has %d archives, want 1 + 3x3", len(host))
	}
	if host[0] != (RRAConfig{Average, 120, 1, 0.5}) || host[1] != (RRAConfig{Average, 120, 12, 1}) ||
		host[2] != (RRAConfig{Min, 120, 12, 1}) || host[9] != (RRAConfig{Max, 366, 17280, 1}) {
		t.Errorf("host layout %v", host)
	}
	vm := VMArchives(false)
	if len(vm) != 4 || vm[3] != (RRAConfig{Average, 366, 17280, 0.5}) {
		t.Errorf("vm layout %v", vm)
	}
}

func newTest(t *testing.T, dss []DS, rras []RRAConfig) *RRD {
	t.Helper()
	r, err := New(5, at(1000), dss, rras)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A counter crossing 2^63 (int64 overflow) still gives its true rate.
func TestDeriveWrapsInTwosComplement(t *testing.T) {
	r := newTest(t, []DS{goldenDS("c", Derive)}, []RRAConfig{{Average, 4, 1, 0.5}})
	must(t, r.Update(at(1005), []Value{IntValue(math.MaxInt64 - 49)}))
	must(t, r.Update(at(1010), []Value{IntValue(math.MinInt64 + 50)})) // +100 across the wrap
	if v, _ := r.Row(0, 0, 0); v != 20 {
		t.Errorf("rate across wrap = %v, want 100/5 = 20", v)
	}
	// A float counter going backwards is a reset: negative rate, below min.
	r = newTest(t, []DS{goldenDS("c", Derive)}, []RRAConfig{{Average, 4, 1, 0.5}})
	must(t, r.Update(at(1005), []Value{FloatValue(100)}))
	must(t, r.Update(at(1010), []Value{FloatValue(150)}))
	must(t, r.Update(at(1015), []Value{FloatValue(10)}))
	if v, _ := r.Row(0, 0, 1); v != 10 {
		t.Errorf("rate = %v, want 50/5 = 10", v)
	}
	// The reset's point is unknown; a one-step AVERAGE archive stores its
	// starting value 0 for it (xapi's arithmetic, see golden_test.go).
	if v, _ := r.Row(0, 0, 0); v != 0 {
		t.Errorf("reset stored %v, want 0", v)
	}
}

// CA-411679: a DERIVE rate up to 5% over max is capped at max.
func TestDeriveCapAtMax(t *testing.T) {
	d := goldenDS("c", Derive)
	d.Max = 1
	r := newTest(t, []DS{d}, []RRAConfig{{Average, 4, 1, 0.5}})
	must(t, r.Update(at(1005), []Value{FloatValue(0)}))
	must(t, r.Update(at(1010), []Value{FloatValue(5.1)}))  // 1.02/s
	must(t, r.Update(at(1015), []Value{FloatValue(11.1)})) // 1.2/s
	if v, _ := r.Row(0, 0, 1); v != 1 {
		t.Errorf("1.02 stored as %v, want capped 1", v)
	}
	if v, _ := r.Row(0, 0, 0); v != 0 {
		t.Errorf("1.2 stored as %v, want unknown (0 in a one-step archive)", v)
	}
}

func TestAbsoluteAndInverse(t *testing.T) {
	r := newTest(t, []DS{goldenDS("a", Absolute), goldenDS("g", Gauge)}, []RRAConfig{{Average, 4, 1, 0.5}})
	v := FloatValue(0.25)
	v.Transform = Inverse
	must(t, r.Update(at(1005), []Value{FloatValue(30), v}))
	if got, _ := r.Row(0, 0, 0); got != 6 {
		t.Errorf("absolute 30 over 5 s = %v, want 6", got)
	}
	if got, _ := r.Row(0, 1, 0); got != 0.75 {
		t.Errorf("inverse of 0.25 = %v, want 0.75", got)
	}
}

// Off-step updates split the interval: a DERIVE rate is weighted by the time
// it covers in each step.
func TestUnalignedDerive(t *testing.T) {
	r := newTest(t, []DS{goldenDS("c", Derive)}, []RRAConfig{{Average, 4, 1, 0.5}})
	must(t, r.Update(at(1002), []Value{FloatValue(0)}))
	must(t, r.Update(at(1007), []Value{FloatValue(50)}))  // 50 over 1002-1007: 3 s in step 1000-1005
	must(t, r.Update(at(1012), []Value{FloatValue(100)})) // 50 over 1007-1012
	// Step ending 1010: carried 2*50/5 = 20 from 1005-1007, plus 3*50/5 = 30
	// for 1007-1010: 50 over the 5 s since the previous update: 10/s.
	if v, _ := r.Row(0, 0, 0); v != 10 {
		t.Errorf("got %v, want 10", v)
	}
}

func TestClockBackwardsAndBadInput(t *testing.T) {
	r := newTest(t, []DS{goldenDS("g", Gauge)}, []RRAConfig{{Average, 4, 1, 0.5}})
	must(t, r.Update(at(1005), []Value{FloatValue(1)}))
	must(t, r.Update(at(990), []Value{FloatValue(2)})) // no row, no panic
	if err := r.Update(at(1010), nil); err == nil {
		t.Error("wrong value count accepted")
	}
	if err := r.UpdateSome(at(1010), []int{3}, []Value{{}}, false); err == nil {
		t.Error("bad index accepted")
	}
	if _, err := New(0, at(0), nil, nil); err == nil {
		t.Error("step 0 accepted")
	}
	if _, err := New(5, at(0), []DS{goldenDS("x", Gauge), goldenDS("x", Gauge)}, nil); err == nil {
		t.Error("repeated name accepted")
	}
	if _, err := New(5, at(0), nil, []RRAConfig{{Average, 0, 1, 0.5}}); err == nil {
		t.Error("zero rows accepted")
	}
	if _, err := New(5, at(-5), nil, nil); err == nil {
		t.Error("time before 1970 accepted")
	}
}

func TestAddRemoveDS(t *testing.T) {
	r := newTest(t, []DS{goldenDS("a", Gauge)}, goldenLayout())
	must(t, r.Update(at(1005), []Value{FloatValue(1)}))
	must(t, r.AddDS(at(1005), goldenDS("b", Gauge)))
	must(t, r.AddDS(at(1005), goldenDS("b", Gauge))) // again: nothing
	if len(r.DSs()) != 2 || r.DSIndex("b") != 1 {
		t.Fatalf("%v", r.DSs())
	}
	// 1005/5 = 201 steps, 201 mod 3 = 0 unknown points in A1's open row.
	if r.rras[1].cdpUnknown[1] != 0 || r.rras[0].cdpUnknown[1] != 0 {
		t.Error("unknown count of the added source")
	}
	must(t, r.Update(at(1010), []Value{FloatValue(2), FloatValue(7)}))
	if v, _ := r.Row(0, 1, 0); v != 7 {
		t.Errorf("added source stored %v", v)
	}
	if v, _ := r.Row(0, 1, 1); !math.IsNaN(v) {
		t.Errorf("added source's history %v, want unknown", v)
	}
	r.RemoveDS("a")
	r.RemoveDS("absent")
	if len(r.DSs()) != 1 || r.DSs()[0].Name != "b" {
		t.Fatalf("%v", r.DSs())
	}
	if v, _ := r.Row(0, 0, 0); v != 7 {
		t.Errorf("remaining source lost its data: %v", v)
	}
	must(t, r.Update(at(1015), []Value{FloatValue(8)}))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func sameState(t *testing.T, a, b *RRD) {
	t.Helper()
	if a.step != b.step || a.lastUpdated != b.lastUpdated || len(a.ds) != len(b.ds) || len(a.rras) != len(b.rras) {
		t.Fatal("shape differs")
	}
	for i := range a.ds {
		x, y := a.ds[i], b.ds[i]
		x.last, y.last = Value{}, Value{}
		if x.DS != y.DS || !near(x.value, y.value) || !near(x.unknownSec, y.unknownSec) || x.lastUpdated != y.lastUpdated {
			t.Errorf("ds %d: %+v vs %+v", i, x, y)
		}
	}
	for k := range a.rras {
		x, y := &a.rras[k], &b.rras[k]
		if x.RRAConfig != y.RRAConfig {
			t.Fatalf("rra %d config", k)
		}
		for i := range a.ds {
			for age := range x.Rows {
				if !eqf(x.peek(i, age), y.peek(i, age)) {
					t.Errorf("rra %d ds %d age %d: %v vs %v", k, i, age, x.peek(i, age), y.peek(i, age))
				}
			}
			if !near(x.cdpValue[i], y.cdpValue[i]) || x.cdpUnknown[i] != y.cdpUnknown[i] {
				t.Errorf("rra %d ds %d cdp", k, i)
			}
		}
	}
}

func eqf(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }

// near allows for the 15 significant digits the dump keeps of the float64
// state (the stored rows are single precision and come back exactly).
func near(a, b float64) bool { return eqf(a, b) || math.Abs(a-b) <= 1e-13*math.Abs(a) }

// Save then Load gives back the same RRD (but the previous raw reading,
// which xapi does not read back), and saving that gives the same bytes.
func TestSaveLoadRoundTrip(t *testing.T) {
	h, _ := goldenRRDs(t, true)
	var buf bytes.Buffer
	must(t, h.Save(&buf))
	got, err := Load(bytes.NewReader(buf.Bytes()))
	must(t, err)
	sameState(t, h, got)
	var again bytes.Buffer
	must(t, got.Save(&again))
	back, err := Load(&again)
	must(t, err)
	if !bytes.Equal(back.AppendXML(nil, true), got.AppendXML(nil, true)) {
		t.Error("second round trip differs")
	}
	// The plain XML is accepted too.
	plain, err := Load(bytes.NewReader(h.AppendXML(nil, true)))
	must(t, err)
	sameState(t, h, plain)
	// And the restored RRD goes on updating.
	must(t, got.Update(at(1045), []Value{FloatValue(1), FloatValue(1), IntValue(1)}))

	// A real-size host RRD round-trips as well.
	big, err := New(5, at(1_700_000_000), []DS{goldenDS("cpu0", Gauge), goldenDS("net", Derive)}, HostArchives())
	must(t, err)
	for i := int64(1); i < 400; i++ {
		must(t, big.Update(at(1_700_000_000+5*i), []Value{FloatValue(float64(i%7) / 7), IntValue(i * 1000)}))
	}
	buf.Reset()
	must(t, big.Save(&buf))
	bigBack, err := Load(&buf)
	must(t, err)
	sameState(t, big, bigBack)
}

func TestLoadRejectsCorruptGzip(t *testing.T) {
	h, _ := goldenRRDs(t, false)
	var buf bytes.Buffer
	must(t, h.Save(&buf))
	b := buf.Bytes()
	b[len(b)-5] ^= 0xff // the CRC in the trailer
	if _, err := Load(bytes.NewReader(b)); err == nil {
		t.Error("bad gzip CRC accepted")
	}
	if _, err := Load(bytes.NewReader(nil)); err == nil {
		t.Error("empty archive accepted")
	}
	// A gzip bomb stops at the limit (MaxXMLBytes in Load; 1 MiB here to
	// keep the test quick).
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	_, _ = zw.Write([]byte("<rrd><version>"))
	_, _ = zw.Write(bytes.Repeat([]byte(" "), 1<<20+10))
	_ = zw.Close()
	if _, err := load(&bomb, 1<<20); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("bomb: %v", err)
	}
}

// xapi's reading quirks: min below zero is read as zero (values below it
// become unknown), a repeated name keeps its last source, last_ds is not
// read.
func TestParseXMLQuirks(t *testing.T) {
	doc := xmlDecl + `<rrd><version>0003</version><step>5</step><lastupdate>1000</lastupdate>` +
		`<ds><name>x</name><type>GAUGE</type><minimal_heartbeat>300</minimal_heartbeat><min>-Infinity</min><max>Infinity</max><last_ds>7</last_ds><value>0.0</value><unknown_sec>0</unknown_sec></ds>` +
		`<ds><name>x</name><type>DERIVE</type><minimal_heartbeat>300</minimal_heartbeat><min>-5</min><max>Infinity</max><last_ds>7</last_ds><value>0.0</value><unknown_sec>0</unknown_sec></ds>` +
		`<rra><cf>AVERAGE</cf><pdp_per_row>1</pdp_per_row><params><xff>0.5</xff></params><cdp_prep>` +
		`<ds><primary_value>0.0</primary_value><secondary_value>0.0</secondary_value><value>0.0</value><unknown_datapoints>0</unknown_datapoints></ds>` +
		`<ds><primary_value>0.0</primary_value><secondary_value>0.0</secondary_value><value>0.0</value><unknown_datapoints>0</unknown_datapoints></ds>` +
		`</cdp_prep><database><row><v>1</v><v>-2</v></row><row><v>3</v><v>4</v></row></database></rra></rrd>`
	r, err := ParseXML(strings.NewReader(doc))
	must(t, err)
	if len(r.ds) != 1 || r.ds[0].Type != Derive || r.ds[0].Min != 0 || r.ds[0].last.Kind != Unknown || r.ds[0].lastUpdated != 1000 {
		t.Fatalf("%+v", r.ds)
	}
	if v, _ := r.Row(0, 0, 0); v != 4 {
		t.Errorf("newest %v", v)
	}
	if v, _ := r.Row(0, 0, 1); !math.IsNaN(v) {
		t.Errorf("-2 below min 0 should be unknown, got %v", v)
	}
}

func TestParseXMLRejects(t *testing.T) {
	good := string(newTestRRD(t).AppendXML(nil, true))
	bad := map[string]string{
		"empty":         "",
		"not xml":       "hello",
		"wrong root":    "<rrdx/>",
		"doctype":       `<!DOCTYPE rrd [<!ENTITY a "b">]>` + good[len(xmlDecl):],
		"step 0":        strings.Replace(good, "<step>5</step>", "<step>0</step>", 1),
		"bad cf":        strings.Replace(good, "<cf>AVERAGE</cf>", "<cf>average</cf>", 1),
		"bad type":      strings.Replace(good, "<type>GAUGE</type>", "<type>COUNTER</type>", 1),
		"bad float":     strings.Replace(good, "<xff>0.5</xff>", "<xff>half</xff>", 1),
		"xff > 1":       strings.Replace(good, "<xff>0.5</xff>", "<xff>2</xff>", 1),
		"short row":     strings.Replace(good, "<v>NaN</v></row>", "</row>", 1),
		"long row":      strings.Replace(good, "</row>", "<v>1</v></row>", 1),
		"nested text":   strings.Replace(good, "<name>g</name>", "<name><b/></name>", 1),
		"truncated":     good[:len(good)/2],
		"no rows":       strings.Replace(good, good[strings.Index(good, "<database>"):strings.Index(good, "</database>")], "<database>", 1),
		"time":          strings.Replace(good, "<lastupdate>1005</lastupdate>", "<lastupdate>1e300</lastupdate>", 1),
		"cdp count":     strings.Replace(good, "<cdp_prep><ds>", "<cdp_prep><ds><primary_value/><secondary_value/><value>0</value><unknown_datapoints>0</unknown_datapoints></ds><ds>", 1),
		"neg unknown":   strings.Replace(good, "<unknown_datapoints>0</unknown_datapoints>", "<unknown_datapoints>-1</unknown_datapoints>", 1),
		"huge pdp":      strings.Replace(good, "<pdp_per_row>1</pdp_per_row>", "<pdp_per_row>99999999999</pdp_per_row>", 1),
		"namespace":     strings.Replace(good, "<rrd>", `<rrd xmlns="x">`, 1),
		"prefix":        strings.Replace(strings.Replace(good, "<step>", "<x:step>", 1), "</step>", "</x:step>", 1),
		"attribute":     strings.Replace(good, "<ds>", `<ds a="1">`, 1),
		"mismatched":    strings.Replace(good, "</name>", "</type>", 1),
		"mismatched2":   strings.Replace(good, "</params>", "</cdp_prep>", 1),
		"text in block": strings.Replace(good, "<ds><name>", "<ds>junk<name>", 1),
	}
	for name, doc := range bad {
		if doc == good {
			t.Errorf("%s: test did not change the document", name)
			continue
		}
		if _, err := ParseXML(strings.NewReader(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseXML(strings.NewReader(good)); err != nil {
		t.Fatal(err)
	}
}

func newTestRRD(t *testing.T) *RRD {
	r := newTest(t, []DS{goldenDS("g", Gauge)}, []RRAConfig{{Average, 3, 1, 0.5}})
	must(t, r.Update(at(1005), []Value{FloatValue(1)}))
	return r
}

func TestExportSelection(t *testing.T) {
	h, v := goldenRRDs(t, false)
	srcs := goldenSources(h, v)
	// A negative start is relative to the last update: -10 is 1010, so A0,
	// rows 1020, 1015, 1010.
	x, err := Export(srcs, -10, 0, AnyCF)
	must(t, err)
	if len(x.Rows) != 3 || x.Rows[2].T != 1010 || x.Start != 1015 {
		t.Errorf("negative start: %+v", x)
	}
	// A start older than every archive falls back to the longest archive
	// with the CF: with cf=AVERAGE that is A1 (A0 and A1 are the AVERAGE
	// ones), which covers 1 + 1020 - 45 = 976; A0 does not.
	x, err = Export(srcs, 0, 0, Average)
	must(t, err)
	if x.Step != 15 || len(x.Legend) != 4 {
		t.Errorf("fallback: step %d legend %v", x.Step, x.Legend)
	}
	// No archive with LAST: xapi's No_RRA_Available.
	if _, err := Export(srcs, 0, 0, Last); !errors.Is(err, ErrNoRRA) {
		t.Errorf("LAST: %v", err)
	}
	// An interval longer than every archive: nothing qualifies.
	if _, err := Export(srcs, 0, 3600, AnyCF); !errors.Is(err, ErrNoRRA) {
		t.Errorf("long interval: %v", err)
	}
	if _, err := Export(nil, 0, 0, AnyCF); !errors.Is(err, ErrNoRRA) {
		t.Error("no sources")
	}
	// A start in the future: no rows, but an answer.
	x, err = Export(srcs, 5000, 0, AnyCF)
	must(t, err)
	if len(x.Rows) != 0 || !strings.Contains(string(x.AppendXML(nil)), "<data/>") {
		t.Errorf("future start: %s", x.AppendXML(nil))
	}
	// Absurd starts do not overflow.
	_, err = Export(srcs, math.MaxInt64, 0, AnyCF)
	must(t, err)
	_, err = Export(srcs, math.MinInt64+1, math.MaxInt64, AnyCF)
	if err != nil && !errors.Is(err, ErrNoRRA) {
		t.Error(err)
	}
}

func TestSelectOwners(t *testing.T) {
	if !SelectOwners(nil, true).Has("x") || SelectOwners(nil, false).Has("x") {
		t.Error("defaults: all VMs, no SRs")
	}
	if !SelectOwners([]string{"all"}, false).Has("x") || SelectOwners([]string{"none"}, true).Has("x") {
		t.Error("all / none")
	}
	s := SelectOwners([]string{"a", "b"}, true)
	if !s.Has("a") || !s.Has("b") || s.Has("c") {
		t.Error("list")
	}
	if !SelectHost("true") || SelectHost("True") || SelectHost("") {
		t.Error("host")
	}
	if ParseCFQuery("MAX") != Max || ParseCFQuery("max") != AnyCF || ParseCFQuery("") != AnyCF {
		t.Error("cf")
	}
}

// UpdateNamed applies a plugin's readings in source order, ignoring names
// the RRD does not have; Query reads the newest 5 s average back.
func TestUpdateNamedAndQuery(t *testing.T) {
	r := newTest(t, []DS{goldenDS("a", Gauge), goldenDS("b", Gauge), goldenDS("c", Gauge)}, goldenLayout())
	must(t, r.UpdateNamed(at(1005), []string{"c", "zz", "a", "c"}, []Value{FloatValue(3), FloatValue(9), FloatValue(1), FloatValue(4)}, false))
	if v, _ := r.Row(0, 2, 0); v != 4 {
		t.Errorf("c = %v, want its last reading 4", v)
	}
	if v, _ := r.Row(0, 0, 0); v != 1 {
		t.Errorf("a = %v", v)
	}
	// b was not named: its ring did not move and still holds the unknown
	// rows New gave it.
	if v, _ := r.Row(0, 1, 0); !math.IsNaN(v) {
		t.Errorf("b = %v", v)
	}
	if v, err := r.Query("c", at(1005)); err != nil || v != 4 {
		t.Errorf("query c = %v, %v", v, err)
	}
	if _, err := r.Query("zz", at(1005)); err == nil {
		t.Error("query of an absent source")
	}
	must(t, r.UpdateNamed(at(1010), nil, nil, false))
	if r.LastUpdated() != 1005 {
		t.Error("an empty update moved the time")
	}
	if testing.AllocsPerRun(100, func() {
		_ = r.UpdateNamed(at(1010), []string{"a", "b"}, []Value{FloatValue(1), FloatValue(2)}, false)
	}) != 0 {
		t.Error("UpdateNamed allocates")
	}
}

// Over the host layout, an hour of readings every 5 s fills the 1-minute
// archives (AVERAGE, MIN, MAX of 12 points each) and closes one hourly row.
func TestHostLayoutConsolidates(t *testing.T) {
	start := int64(1_699_999_200) // on an hour boundary: 472222 h
	r, err := New(DefaultStep, at(start), []DS{{Name: "load", Type: Gauge, Min: 0, Max: math.Inf(1), Heartbeat: DefaultHeartbeat}}, HostArchives())
	must(t, err)
	for i := int64(1); i <= 720; i++ {
		// Within each minute the readings go 1, 2, ..., 12.
		must(t, r.Update(at(start+5*i), []Value{FloatValue(float64((i-1)%12 + 1))}))
	}
	arch := r.Archives()
	want := map[RRAConfig]float64{
		{Average, 120, 12, 1}:  6.5, // (1+...+12)/12
		{Min, 120, 12, 1}:      1,
		{Max, 120, 12, 1}:      12,
		{Average, 168, 720, 1}: 6.5,
		{Min, 168, 720, 1}:     1,
		{Max, 168, 720, 1}:     12,
	}
	for a, c := range arch {
		w, ok := want[c]
		if !ok {
			continue
		}
		if v, _ := r.Row(a, 0, 0); v != w {
			t.Errorf("%v x%d newest = %v, want %v", c.CF, c.PDPPerRow, v, w)
		}
	}
	// Starting 20 minutes into an hour instead, the hourly row has 240
	// unknown points first: xapi renormalises only what was accumulated
	// before an unknown point, so the row is the known points' sum over all
	// 720: 480 * 6.5 / 720 = 4.333..., single precision 4.333333492279053.
	late, err := New(DefaultStep, at(start+1200), []DS{{Name: "load", Type: Gauge, Min: 0, Max: math.Inf(1), Heartbeat: DefaultHeartbeat}}, HostArchives())
	must(t, err)
	for i := int64(1); i <= 720; i++ {
		must(t, late.Update(at(start+1200+5*i), []Value{FloatValue(float64((i-1)%12 + 1))}))
	}
	if v, _ := late.Row(4, 0, 0); v != float64(float32(480*6.5/720)) {
		t.Errorf("hourly average after leading unknowns = %v", v)
	}
	// The 5 s archive holds the last 120 readings, newest first.
	if v, _ := r.Row(0, 0, 0); v != 12 {
		t.Errorf("5 s newest %v", v)
	}
	if v, _ := r.Row(0, 0, 1); v != 11 {
		t.Errorf("5 s second %v", v)
	}
	// /rrd_updates for the last hour at 60 s: the 1-minute archives, rows
	// from start+3600 down to start itself (a row time equal to start is
	// included, as in xapi): 61 rows, the last one from before the data.
	x, err := Export([]Source{{Prefix: "host:h:", RRD: r}}, start, 60, AnyCF)
	must(t, err)
	if x.Step != 60 || len(x.Rows) != 61 || len(x.Legend) != 3 || x.Rows[0].T != start+3600 || !math.IsNaN(x.Rows[60].Values[0]) {
		t.Errorf("step %d rows %d legend %v first %d", x.Step, len(x.Rows), x.Legend, x.Rows[0].T)
	}
}

// The rrdtool spellings read back as what wrote them, in exact case only.
func TestNamesRoundTrip(t *testing.T) {
	for _, ty := range []DSType{Gauge, Absolute, Derive} {
		if got, err := ParseDSType(ty.String()); err != nil || got != ty {
			t.Errorf("ParseDSType(%q) = %v, %v", ty.String(), got, err)
		}
	}
	for _, cf := range []CF{Average, Min, Max, Last} {
		if got, err := ParseCF(cf.String()); err != nil || got != cf {
			t.Errorf("ParseCF(%q) = %v, %v", cf.String(), got, err)
		}
	}
	if s := AnyCF.String(); s != "ANY" {
		t.Errorf("AnyCF is %q", s)
	}
	if s, s2 := CF(7).String(), DSType(3).String(); s != "CF(7)" || s2 != "DSType(3)" {
		t.Errorf("out of range: %q, %q", s, s2)
	}
	for _, s := range []string{"", "ANY", "average", "Gauge", "COUNTER"} {
		if _, err := ParseCF(s); err == nil {
			t.Errorf("ParseCF(%q) accepted", s)
		}
		if _, err := ParseDSType(s); err == nil {
			t.Errorf("ParseDSType(%q) accepted", s)
		}
	}
}
