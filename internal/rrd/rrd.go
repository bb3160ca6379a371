package rrd

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// DSType says how the numbers given to Update become a rate.
type DSType uint8

const (
	// Gauge values are stored as they are (a temperature, a memory size).
	Gauge DSType = iota
	// Absolute values are counts since the previous reading; the rate is the
	// value divided by the seconds since that reading.
	Absolute
	// Derive values are ever-growing counters; the rate is the difference
	// from the previous reading divided by the seconds between them.
	Derive
)

// dsTypeNames are the rrdtool spellings of the data source types.
var dsTypeNames = [...]string{Gauge: "GAUGE", Absolute: "ABSOLUTE", Derive: "DERIVE"}

// String gives the rrdtool spelling: GAUGE, ABSOLUTE or DERIVE.
func (t DSType) String() string { return enumName(dsTypeNames[:], t, "DSType") }

// ParseDSType reads the rrdtool spelling of a data source type (exact case).
func ParseDSType(s string) (DSType, error) {
	if t, ok := parseEnum[DSType](dsTypeNames[:], s); ok {
		return t, nil
	}
	return 0, fmt.Errorf("rrd: unknown data source type %q", s)
}

// enumName is the name names gives v, or typ(v) when it gives none.
func enumName[T ~uint8](names []string, v T, typ string) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, uint8(v))
}

// parseEnum is the value names gives the name s (exactly), if any.
func parseEnum[T ~uint8](names []string, s string) (T, bool) {
	i := slices.Index(names, s)
	return T(i), i >= 0
}

// CF is a consolidation function: how the primary data points of one row of
// an archive are combined into the value stored for that row.
type CF uint8

const (
	// Average is the mean of the known points, renormalised for unknown ones.
	Average CF = iota
	// Min is the smallest point.
	Min
	// Max is the largest point.
	Max
	// Last is the most recent point.
	Last
	// AnyCF is not a consolidation function: Export takes it to mean "do not
	// filter archives by CF", as xapi does when cf is absent or unknown.
	AnyCF CF = 255
)

// cfNames are the rrdtool spellings of the consolidation functions.
var cfNames = [...]string{Average: "AVERAGE", Min: "MIN", Max: "MAX", Last: "LAST"}

// String gives the rrdtool spelling: AVERAGE, MIN, MAX or LAST (and ANY
// for AnyCF).
func (c CF) String() string {
	if c == AnyCF {
		return "ANY"
	}
	return enumName(cfNames[:], c, "CF")
}

// ParseCF reads the rrdtool spelling of a consolidation function. Like
// xapi's it is case-sensitive: "average" is an error.
func ParseCF(s string) (CF, error) {
	if c, ok := parseEnum[CF](cfNames[:], s); ok {
		return c, nil
	}
	return 0, fmt.Errorf("rrd: unknown consolidation function %q", s)
}

// Kind says what a Value holds.
type Kind uint8

const (
	// Unknown is a missing reading.
	Unknown Kind = iota
	// Float is a 64-bit floating point reading.
	Float
	// Int is a 64-bit signed integer reading (a counter, usually).
	Int
)

// Transform is applied to a primary data point after its rate is computed.
type Transform uint8

const (
	// Identity leaves the point alone.
	Identity Transform = iota
	// Inverse stores 1 - x (plugins use it to turn "idle" into "busy").
	Inverse
)

// Value is one reading given to Update. The zero Value is Unknown.
type Value struct {
	Kind      Kind
	F         float64
	I         int64
	Transform Transform
}

// FloatValue is a known floating point reading.
func FloatValue(f float64) Value { return Value{Kind: Float, F: f} }

// IntValue is a known integer reading.
func IntValue(i int64) Value { return Value{Kind: Int, I: i} }

// UnknownValue is a missing reading.
func UnknownValue() Value { return Value{} }

func (v Value) float() float64 {
	switch v.Kind {
	case Float:
		return v.F
	case Int:
		return float64(v.I)
	}
	return math.NaN()
}

// DS describes one data source of an RRD.
type DS struct {
	Name string
	Type DSType
	// Min and Max bound the stored rates: a rate outside them is stored as
	// unknown (NaN). Use math.Inf for "no bound".
	Min, Max float64
	// Heartbeat is rrdtool's minimal_heartbeat: a reading that comes more
	// than this many seconds after the previous one is unknown.
	Heartbeat float64
}

// RRAConfig describes one round-robin archive.
type RRAConfig struct {
	CF CF
	// Rows is how many consolidated points the archive keeps.
	Rows int
	// PDPPerRow is how many steps make one row (1 = one row per step).
	PDPPerRow int
	// XFF is the xfiles factor: the largest fraction of unknown primary
	// points a row may have and still be known.
	XFF float64
}

// Bounds on what New, AddDS and ParseXML accept. They are far above what
// xapi creates (a host RRD has a few hundred sources and twelve archives)
// and keep a hostile upload from asking for unbounded memory.
const (
	MaxDS          = 1 << 14
	MaxRRAs        = 64
	MaxRows        = 1 << 20
	MaxPDPPerRow   = 1 << 20
	MaxCells       = 1 << 24 // data sources x rows, summed over archives
	MaxNameLen     = 1024
	MaxStep        = 1 << 17
	maxUnixSeconds = 1 << 40 // about year 36812; keeps int64 time arithmetic far from overflow
)

// ErrNoRRA is returned by Export when no archive matches the request (xapi's
// No_RRA_Available).
var ErrNoRRA = errors.New("rrd: no archive available")

type dsState struct {
	DS
	last        Value // the previous raw reading, for Derive
	value       float64
	unknownSec  float64
	lastUpdated float64
}

type rra struct {
	RRAConfig
	// data holds one ring of Rows float32 values per data source: ring i is
	// data[i*Rows:(i+1)*Rows]. xapi keeps its rings in single precision
	// too, which halves the memory and is what its dumps print.
	data []float32
	// cur[i] is the slot of ring i's newest value. Rings move separately
	// because a caller may update only some sources at a time.
	cur        []int32
	cdpValue   []float64
	cdpUnknown []int64
}

// RRD is a round-robin database: data sources, each with a value in every
// archive. It is not safe for concurrent use; the caller locks.
type RRD struct {
	step        int64
	lastUpdated float64
	ds          []dsState
	rras        []rra

	// Per-update scratch space, kept so that updates do not allocate.
	scratchRate []float64
	scratchPDP  []float64
	scratchIdx  []int
	scratchSel  []int
	scratchVals []Value
	// byName maps source names to positions; rebuilt whenever the sources
	// change, so that lookups never write.
	byName map[string]int
}

// Step is the length of one primary data point in seconds.
func (r *RRD) Step() int64 { return r.step }

// LastUpdated is the time of the most recent update, in Unix seconds.
func (r *RRD) LastUpdated() float64 { return r.lastUpdated }

// DSs returns the data sources in the order their values are given to
// Update.
func (r *RRD) DSs() []DS {
	out := make([]DS, len(r.ds))
	for i := range r.ds {
		out[i] = r.ds[i].DS
	}
	return out
}

// DSIndex returns the position of the named source, or -1.
func (r *RRD) DSIndex(name string) int {
	if i, ok := r.byName[name]; ok {
		return i
	}
	return -1
}

// Archives returns the archive configurations in order.
func (r *RRD) Archives() []RRAConfig {
	out := make([]RRAConfig, len(r.rras))
	for i := range r.rras {
		out[i] = r.rras[i].RRAConfig
	}
	return out
}

// Row returns the value archive a keeps for source ds, age rows back from the
// newest (0 = newest), as stored: single precision widened to float64.
func (r *RRD) Row(a, ds, age int) (float64, error) {
	if a < 0 || a >= len(r.rras) || ds < 0 || ds >= len(r.ds) {
		return 0, errors.New("rrd: archive or data source out of range")
	}
	x := &r.rras[a]
	if age < 0 || age >= x.Rows {
		return 0, errors.New("rrd: row out of range")
	}
	return x.peek(ds, age), nil
}

func validDS(d DS) error {
	if d.Name == "" || len(d.Name) > MaxNameLen {
		return fmt.Errorf("rrd: data source name must have 1 to %d bytes", MaxNameLen)
	}
	if d.Type > Derive {
		return fmt.Errorf("rrd: data source %q: bad type %d", d.Name, d.Type)
	}
	if math.IsNaN(d.Min) || math.IsNaN(d.Max) || math.IsNaN(d.Heartbeat) {
		return fmt.Errorf("rrd: data source %q: min, max and heartbeat must be numbers", d.Name)
	}
	return nil
}

func validRRA(c RRAConfig) error {
	if c.CF > Last {
		return fmt.Errorf("rrd: bad consolidation function %d", c.CF)
	}
	if c.Rows < 1 || c.Rows > MaxRows {
		return fmt.Errorf("rrd: archive rows must be 1 to %d", MaxRows)
	}
	if c.PDPPerRow < 1 || c.PDPPerRow > MaxPDPPerRow {
		return fmt.Errorf("rrd: archive pdp_per_row must be 1 to %d", MaxPDPPerRow)
	}
	if !(c.XFF >= 0 && c.XFF <= 1) {
		return errors.New("rrd: archive xff must be between 0 and 1")
	}
	return nil
}

// seconds turns a time into the float Unix seconds xapi works in, refusing
// times before 1970 or absurdly far ahead.
func seconds(t time.Time) (float64, error) {
	s := float64(t.Unix()) + float64(t.Nanosecond())/1e9
	if !(s >= 0 && s < maxUnixSeconds) {
		return 0, fmt.Errorf("rrd: time %v out of range", t)
	}
	return s, nil
}

// New creates an RRD whose archives are all unknown, with step seconds per
// primary data point, and gives it a first all-unknown update at now, as
// xapi's rrd_create does. The data sources keep their order.
func New(step int64, now time.Time, sources []DS, archives []RRAConfig) (*RRD, error) {
	ts, err := seconds(now)
	if err != nil {
		return nil, err
	}
	if step < 1 || step > MaxStep {
		return nil, fmt.Errorf("rrd: step must be 1 to %d seconds", int64(MaxStep))
	}
	if len(sources) > MaxDS {
		return nil, fmt.Errorf("rrd: more than %d data sources", MaxDS)
	}
	if len(archives) > MaxRRAs {
		return nil, fmt.Errorf("rrd: more than %d archives", MaxRRAs)
	}
	seen := make(map[string]bool, len(sources))
	for _, d := range sources {
		if err := validDS(d); err != nil {
			return nil, err
		}
		if seen[d.Name] {
			return nil, fmt.Errorf("rrd: data source %q given twice", d.Name)
		}
		seen[d.Name] = true
	}
	rows := 0
	for _, c := range archives {
		if err := validRRA(c); err != nil {
			return nil, err
		}
		rows += c.Rows
	}
	if rows*len(sources) > MaxCells {
		return nil, fmt.Errorf("rrd: more than %d stored values", MaxCells)
	}
	r := &RRD{step: step}
	r.ds = make([]dsState, len(sources))
	for i, d := range sources {
		r.ds[i] = dsState{DS: d}
	}
	r.rras = make([]rra, len(archives))
	for a, c := range archives {
		x := rra{RRAConfig: c}
		n := len(sources)
		x.data = make([]float32, n*c.Rows)
		for j := range x.data {
			x.data[j] = float32(math.NaN())
		}
		x.cur = make([]int32, n)
		x.cdpValue = make([]float64, n)
		x.cdpUnknown = make([]int64, n)
		for i := range n {
			x.cur[i] = int32(c.Rows - 1)
			x.cdpValue[i] = cfInit(c.CF, &r.ds[i].DS)
		}
		r.rras[a] = x
	}
	r.sizeScratch()
	idx := r.allIdx()
	vals := make([]Value, len(sources)) // all Unknown
	r.update(ts, idx, vals, true)
	return r, nil
}

func (r *RRD) sizeScratch() {
	n := len(r.ds)
	r.byName = make(map[string]int, n)
	for i := range r.ds {
		r.byName[r.ds[i].Name] = i
	}
	r.scratchRate = make([]float64, n)
	r.scratchPDP = make([]float64, n)
	r.scratchSel = make([]int, 0, n)
	r.scratchVals = make([]Value, 0, n)
	r.scratchIdx = make([]int, n)
	for i := range r.scratchIdx {
		r.scratchIdx[i] = i
	}
}

func (r *RRD) allIdx() []int { return r.scratchIdx[:len(r.ds)] }

// Update records one reading per data source, in DSs order, taken at t.
// It follows xapi's ds_update: rates from the source types, the heartbeat,
// min/max bounds, and consolidation into every archive whose row ends
// between the previous update and t. It does not allocate.
func (r *RRD) Update(t time.Time, values []Value) error {
	return r.UpdateSome(t, nil, values, false)
}

// UpdateSome records readings for some data sources only: values[k] is for
// source idx[k] (idx nil means all sources, in order). fresh says the
// readings start a new series (xapi's new_rrd, used when a VM's domain
// changes): a Derive source then stores its raw value instead of a
// difference. Like xapi, the time since the previous update is taken from
// the first source listed, so callers should list sources in DSs order.
func (r *RRD) UpdateSome(t time.Time, idx []int, values []Value, fresh bool) error {
	ts, err := seconds(t)
	if err != nil {
		return err
	}
	if idx == nil {
		idx = r.allIdx()
	}
	if len(idx) == 0 && len(values) == 0 {
		// Nothing to record; like xapi (CA-408841), not even the time.
		return nil
	}
	if len(idx) != len(values) {
		return fmt.Errorf("rrd: %d values for %d data sources", len(values), len(idx))
	}
	if len(idx) > len(r.ds) {
		return errors.New("rrd: more values than data sources")
	}
	for _, i := range idx {
		if i < 0 || i >= len(r.ds) {
			return fmt.Errorf("rrd: data source index %d out of range", i)
		}
	}
	for _, v := range values {
		if v.Kind > Int || v.Transform > Inverse {
			return errors.New("rrd: bad value kind or transform")
		}
	}
	r.update(ts, idx, values, fresh)
	return nil
}

// UpdateNamed records readings given by source name, as rrdd does for each
// plugin's readings (ds_update_named): names the RRD does not have are
// ignored, and the readings are applied in the RRD's source order, so that
// the time since the previous update comes from the earliest listed source.
// A name given twice uses its last reading. Sources not named are left
// alone; rrdd then gives those an Unknown reading at the same time.
func (r *RRD) UpdateNamed(t time.Time, names []string, values []Value, fresh bool) error {
	if len(names) != len(values) {
		return fmt.Errorf("rrd: %d values for %d names", len(values), len(names))
	}
	sel := r.scratchSel[:0]
	vals := r.scratchVals[:0]
	for k, name := range names {
		i := r.DSIndex(name)
		if i < 0 {
			continue
		}
		// Insert in source order (the lists are short: one plugin's
		// sources); a repeated name replaces its reading.
		j := len(sel)
		for j > 0 && sel[j-1] > i {
			j--
		}
		if j > 0 && sel[j-1] == i {
			vals[j-1] = values[k]
			continue
		}
		sel = append(sel, 0)
		vals = append(vals, Value{})
		copy(sel[j+1:], sel[j:])
		copy(vals[j+1:], vals[j:])
		sel[j], vals[j] = i, values[k]
	}
	r.scratchSel, r.scratchVals = sel, vals
	return r.UpdateSome(t, sel, vals, fresh)
}

// getTimes splits a time into the start of the step it falls in and the
// seconds since that start (xapi's get_times; truncation as OCaml's).
func getTimes(t float64, step int64) (int64, float64) {
	start := step * (int64(t) / step)
	return start, t - float64(start)
}

// ocamlMin and ocamlMax are OCaml's polymorphic min and max on floats,
// whose NaN behaviour the consolidation relies on.
func ocamlMin(a, b float64) float64 {
	if a <= b {
		return a
	}
	return b
}

func ocamlMax(a, b float64) float64 {
	if a >= b {
		return a
	}
	return b
}

// cfInit is the starting value of a row being consolidated, kept within
// the source's bounds so that an all-unknown row cannot store an
// out-of-range value.
func cfInit(cf CF, d *DS) float64 {
	var v float64
	switch cf {
	case Average:
		v = 0
	case Min:
		v = math.Inf(1)
	case Max:
		v = math.Inf(-1)
	default:
		v = math.NaN()
	}
	return ocamlMin(d.Max, ocamlMax(d.Min, v))
}

// rate turns one reading into a per-second rate (xapi's process_ds_value).
func (d *dsState) rate(v Value, interval float64, fresh bool) float64 {
	if interval > d.Heartbeat {
		// Too long since the last reading: unknown, and the previous raw
		// value is kept (as xapi does).
		return math.NaN()
	}
	raw := v.float()
	var out float64
	switch {
	case d.Type == Gauge || (d.Type == Derive && fresh):
		out = raw
	case d.Type == Absolute:
		out = raw / interval
	default:
		switch {
		case d.last.Kind == Int && v.Kind == Int:
			// Two's complement subtraction: a 64-bit counter that wrapped
			// still gives the right small positive difference.
			out = float64(v.I - d.last.I)
		case d.last.Kind == Float && v.Kind == Float:
			out = v.F - d.last.F
		default:
			// Unknown on either side, or (where xapi raises) a change of
			// kind between readings.
			out = math.NaN()
		}
	}
	d.last = Value{Kind: v.Kind, F: v.F, I: v.I}
	return out
}

func (r *RRD) update(ts float64, idx []int, values []Value, fresh bool) {
	if len(idx) == 0 {
		return
	}
	step := r.step
	lastUpdated := r.ds[idx[0]].lastUpdated
	interval := ts - lastUpdated
	if interval < 0 {
		// The clock went backwards: pretend one step passed.
		interval = 5
	}
	procSt, _ := getTimes(lastUpdated, step)
	occuSt, occuAge := getTimes(ts, step)
	elapsed := (occuSt - procSt) / step

	// pre is the part of the interval that belongs to the steps being
	// completed by this update, post the part in the step now open.
	pre, post := interval, 0.0
	if elapsed > 0 {
		pre, post = interval-occuAge, occuAge
	}
	r.lastUpdated = ts

	rates := r.scratchRate[:len(idx)]
	for k, i := range idx {
		d := &r.ds[i]
		rates[k] = d.rate(values[k], interval, fresh)
		d.lastUpdated = ts
	}
	for k, i := range idx {
		d := &r.ds[i]
		v := rates[k]
		switch {
		case math.IsNaN(v):
			d.unknownSec = pre
		case d.Type == Derive:
			d.value += pre * v / interval
		default:
			// Gauge and Absolute keep the latest rate, not a time-weighted
			// mean (xapi's CA-404597).
			d.value = v
		}
	}
	if elapsed <= 0 {
		return
	}

	pdps := r.scratchPDP[:len(idx)]
	fstep := float64(step)
	// xapi measures the Derive denominator with step*(t/step), which is t
	// up to rounding; it is computed the same way here so that results
	// match to the bit. The float64 conversions stop fused multiply-adds.
	span := float64(fstep*(ts/fstep)) - float64(fstep*(lastUpdated/fstep))
	for k, i := range idx {
		d := &r.ds[i]
		if interval > d.Heartbeat {
			pdps[k] = math.NaN()
			continue
		}
		var raw float64
		if d.Type == Derive {
			raw = d.value / (span - d.unknownSec)
		} else {
			raw = d.value
		}
		if values[k].Transform == Inverse {
			raw = 1 - raw
		}
		switch {
		case d.Type == Derive && raw > d.Max && raw < d.Max*1.05:
			// A Derive rate up to 5% over its maximum is measurement
			// jitter (CPU time, mostly) and is capped (xapi's CA-411679).
			raw = d.Max
		case raw < d.Min || raw > d.Max:
			raw = math.NaN()
		}
		pdps[k] = raw
	}

	for a := range r.rras {
		r.rras[a].consolidate(r, procSt, elapsed, idx, pdps)
	}

	for k, i := range idx {
		d := &r.ds[i]
		v := rates[k]
		switch {
		case math.IsNaN(v):
			d.value = 0
			d.unknownSec = post
		case d.Type == Derive:
			d.unknownSec = 0
			d.value = post * v / interval
		default:
			d.unknownSec = 0
			d.value = v
		}
	}
}

// addPDPs folds n copies of each source's primary point into the row being
// prepared (xapi's do_cfs). Unknown points renormalise an average so that it
// stays the mean of the known ones.
func (x *rra) addPDPs(n int64, idx []int, pdps []float64) {
	cnt := int64(x.PDPPerRow)
	for k, i := range idx {
		p := pdps[k]
		if math.IsNaN(p) {
			olddiv := cnt - x.cdpUnknown[i]
			newdiv := olddiv - n
			if newdiv > 0 {
				x.cdpValue[i] = x.cdpValue[i] * float64(olddiv) / float64(newdiv)
				x.cdpUnknown[i] += n
			}
			continue
		}
		v := x.cdpValue[i]
		switch x.CF {
		case Average:
			v += p * float64(n) / float64(cnt)
		case Min:
			v = ocamlMin(v, p)
		case Max:
			v = ocamlMax(v, p)
		default:
			v = p
		}
		x.cdpValue[i] = v
	}
}

// push stores v as ring i's newest value; a value outside the source's
// bounds is stored as unknown.
func (x *rra) push(i int, v float64, d *DS) {
	if x.Rows == 0 {
		return
	}
	c := x.cur[i] + 1
	if int(c) == x.Rows {
		c = 0
	}
	x.cur[i] = c
	if v < d.Min || v > d.Max {
		v = math.NaN()
	}
	x.data[i*x.Rows+int(c)] = float32(v)
}

// peek returns ring i's value age rows back from the newest.
func (x *rra) peek(i, age int) float64 {
	j := int(x.cur[i]) - age
	if j < 0 {
		j += x.Rows
	}
	return float64(x.data[i*x.Rows+j])
}

// consolidate is xapi's rra_update for one archive: elapsed steps have
// ended since the step starting at procSt.
func (x *rra) consolidate(r *RRD, procSt, elapsed int64, idx []int, pdps []float64) {
	cnt := int64(x.PDPPerRow)
	// Steps still needed to finish the row that was open.
	startOff := cnt - (procSt/r.step)%cnt
	var rowsDone int64
	if elapsed >= startOff {
		rowsDone = (elapsed-startOff)/cnt + 1
	}
	x.addPDPs(min(startOff, elapsed), idx, pdps)
	if rowsDone == 0 {
		return
	}
	limit := int64(x.XFF * float64(cnt))
	for _, i := range idx {
		v := math.NaN()
		if x.cdpUnknown[i] <= limit {
			v = x.cdpValue[i]
		}
		x.push(i, v, &r.ds[i].DS)
	}
	// Further whole rows covered by this update all consist of the same
	// primary point, so whatever the CF they are that point.
	extra := min(rowsDone-1, int64(x.Rows))
	for range extra {
		for k, i := range idx {
			x.push(i, pdps[k], &r.ds[i].DS)
		}
	}
	for _, i := range idx {
		x.cdpUnknown[i] = 0
		x.cdpValue[i] = cfInit(x.CF, &r.ds[i].DS)
	}
	x.addPDPs((elapsed-startOff)%cnt, idx, pdps)
}

// AddDS adds a data source at the end (xapi's rrd_add_ds, used to record a
// source): its rings are all unknown and the row being prepared counts the
// steps already gone by as unknown. Adding a name that exists does nothing.
func (r *RRD) AddDS(t time.Time, d DS) error {
	ts, err := seconds(t)
	if err != nil {
		return err
	}
	if err := validDS(d); err != nil {
		return err
	}
	if r.DSIndex(d.Name) >= 0 {
		return nil
	}
	if len(r.ds) >= MaxDS {
		return fmt.Errorf("rrd: more than %d data sources", MaxDS)
	}
	rows := 0
	for a := range r.rras {
		rows += r.rras[a].Rows
	}
	if rows*(len(r.ds)+1) > MaxCells {
		return fmt.Errorf("rrd: more than %d stored values", MaxCells)
	}
	r.ds = append(r.ds, dsState{DS: d})
	npdps := int64(ts) / r.step
	for a := range r.rras {
		x := &r.rras[a]
		for range x.Rows {
			x.data = append(x.data, float32(math.NaN()))
		}
		x.cur = append(x.cur, int32(x.Rows-1))
		x.cdpValue = append(x.cdpValue, cfInit(x.CF, &d))
		x.cdpUnknown = append(x.cdpUnknown, npdps%int64(x.PDPPerRow))
	}
	r.sizeScratch()
	return nil
}

// RemoveDS drops the named data source and everything stored for it (xapi's
// rrd_remove_ds, used to forget a source). Removing an absent name does
// nothing.
func (r *RRD) RemoveDS(name string) {
	i := r.DSIndex(name)
	if i < 0 {
		return
	}
	r.removeAt(i)
}

func (r *RRD) removeAt(i int) {
	r.ds = append(r.ds[:i], r.ds[i+1:]...)
	for a := range r.rras {
		x := &r.rras[a]
		x.data = append(x.data[:i*x.Rows], x.data[(i+1)*x.Rows:]...)
		x.cur = append(x.cur[:i], x.cur[i+1:]...)
		x.cdpValue = append(x.cdpValue[:i], x.cdpValue[i+1:]...)
		x.cdpUnknown = append(x.cdpUnknown[:i], x.cdpUnknown[i+1:]...)
	}
	r.sizeScratch()
}

// Clone returns a deep copy (what xapi's HTTP handlers serialise, so that
// the lock is not held while writing).
func (r *RRD) Clone() *RRD {
	c := &RRD{step: r.step, lastUpdated: r.lastUpdated}
	c.ds = append([]dsState(nil), r.ds...)
	c.rras = make([]rra, len(r.rras))
	for a, x := range r.rras {
		c.rras[a] = rra{
			RRAConfig:  x.RRAConfig,
			data:       append([]float32(nil), x.data...),
			cur:        append([]int32(nil), x.cur...),
			cdpValue:   append([]float64(nil), x.cdpValue...),
			cdpUnknown: append([]int64(nil), x.cdpUnknown...),
		}
	}
	c.sizeScratch()
	return c
}

// MemoryBytes is roughly how much memory the RRD's archives and state take:
// what the benchmarks report per VM.
func (r *RRD) MemoryBytes() int {
	n := 0
	for _, d := range r.ds {
		n += 96 + len(d.Name)
	}
	for _, x := range r.rras {
		n += 4*len(x.data) + 4*len(x.cur) + 8*len(x.cdpValue) + 8*len(x.cdpUnknown) + 96
	}
	return n + 3*8*len(r.ds) + 64
}
