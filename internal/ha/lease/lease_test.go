package lease

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1_000_000, 0)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestDefaultsAndFenceAfter(t *testing.T) {
	d := Defaults()
	if err := d.Check(); err != nil {
		t.Fatal(err)
	}
	// L(1+ρ) + G + W + M = 10.1 + 5 + 10 + 2 s.
	if got, want := d.FenceAfter(), 27100*time.Millisecond; got != want {
		t.Fatalf("FenceAfter %v, want %v", got, want)
	}
	for _, bad := range []Timing{
		{},
		{Lease: 10 * time.Second, Renew: 6 * time.Second, Watchdog: time.Second},
		{Lease: 10 * time.Second, Renew: 2 * time.Second, Watchdog: time.Second, Drift: -0.1},
		{Lease: 10 * time.Second, Renew: 2 * time.Second, Watchdog: time.Second, KillGrace: -1},
	} {
		if bad.Check() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// The lease counts from the asking, and an old answer never shortens it.
func TestHolderCountsFromTheAsking(t *testing.T) {
	h := NewHolder(Defaults())
	if h.Valid(t0) {
		t.Fatal("valid before any grant")
	}
	a := h.Attempt(at(0))
	b := h.Attempt(at(2 * time.Second))
	h.Granted(b) // answered first
	h.Granted(a) // a slow answer to the older request
	if got := h.Until(); !got.Equal(at(12 * time.Second)) {
		t.Fatalf("until %v, want t0+12s", got.Sub(t0))
	}
	if !h.Valid(at(11*time.Second)) || h.Valid(at(12*time.Second)) {
		t.Fatal("validity around the end of the lease")
	}
	h.Drop()
	if h.Valid(at(time.Second)) {
		t.Fatal("valid after Drop")
	}
}

// The coordinator declares a host dead only FenceAfter after its last
// renewal, and a new coordinator counts from its own start.
func TestLedger(t *testing.T) {
	tm := Defaults()
	f := tm.FenceAfter()
	l := NewLedger(tm, at(0))
	l.Renew("a", at(5*time.Second))
	l.Renew("a", at(3*time.Second)) // out of order: ignored
	if l.Dead("a", at(5*time.Second+f-time.Millisecond)) {
		t.Fatal("a dead before F since its last renewal")
	}
	if !l.Dead("a", at(5*time.Second+f)) {
		t.Fatal("a not dead F after its last renewal")
	}
	// b never renewed with this coordinator: counted from its start.
	if l.Dead("b", at(f-time.Millisecond)) || !l.Dead("b", at(f)) {
		t.Fatal("b is counted from the ledger's start")
	}
	if got := l.DeadAmong([]string{"c", "a", "b"}, at(f+time.Second)); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("dead among: %v", got)
	}
	if !l.Renewed("a") || l.Renewed("b") {
		t.Fatal("Renewed")
	}
	l.Forget("a")
	if l.Dead("a", at(f-time.Second)) {
		t.Fatal("a forgotten host counts from the start again, not from nothing")
	}
}

// The argument of docs/ha.md, checked on numbers: whatever the order of
// events, when the coordinator may declare a host dead, the host (whose
// clock may run slower by up to ρ) is past its kill grace and its
// watchdog's timeout.
func TestCoordinatorNeverDeclaresBeforeTheHostIsGone(t *testing.T) {
	tm := Defaults()
	for _, sendDelay := range []time.Duration{0, time.Millisecond, 500 * time.Millisecond, 3 * time.Second} {
		// Real time: the host asks at 0 and the coordinator records it
		// sendDelay later. The host's clock runs slow by ρ: its lease,
		// L on its clock, ends at L(1+ρ) in real time at worst.
		recorded := sendDelay
		hostLeaseEnd := time.Duration(float64(tm.Lease) * (1 + tm.Drift))
		hostGoneBy := hostLeaseEnd + tm.KillGrace + tm.Watchdog
		// The coordinator's clock may run fast by ρ: F on its clock is at
		// least F/(1+ρ) in real time.
		declaredAt := recorded + time.Duration(float64(tm.FenceAfter())/(1+tm.Drift))
		if declaredAt <= hostGoneBy {
			t.Errorf("send delay %v: declared at %v, host gone by %v", sendDelay, declaredAt, hostGoneBy)
		}
	}
}

func TestPhases(t *testing.T) {
	tm := Defaults()
	until := at(10 * time.Second)
	for _, tc := range []struct {
		now    time.Duration
		killed bool
		want   Phase
	}{
		{5 * time.Second, false, Held},
		{10 * time.Second, false, Killing},
		{14 * time.Second, false, Killing},
		{15 * time.Second, false, Fenced},
		{15 * time.Second, true, Safe},
		{11 * time.Second, true, Safe},
	} {
		if got := tm.PhaseAt(until, at(tc.now), tc.killed); got != tc.want {
			t.Errorf("at %v killed %v: %v, want %v", tc.now, tc.killed, got, tc.want)
		}
	}
	if tm.PhaseAt(time.Time{}, t0, false) != Fenced || tm.PhaseAt(time.Time{}, t0, true) != Safe {
		t.Error("a host without a lease may run nothing protected")
	}
}

func TestParseTiming(t *testing.T) {
	got, err := ParseTiming("lease=2s, renew=400ms,grace=1s,watchdog=2s,margin=500ms,drift=0.02")
	want := Timing{Lease: 2 * time.Second, Renew: 400 * time.Millisecond, KillGrace: time.Second, Watchdog: 2 * time.Second,
		Margin: 500 * time.Millisecond, Drift: 0.02}
	if err != nil || got != want {
		t.Fatalf("%+v %v", got, err)
	}
	if got, err := ParseTiming(""); err != nil || got != Defaults() {
		t.Fatalf("empty: %+v %v", got, err)
	}
	for _, bad := range []string{"lease", "lease=x", "nap=1s", "renew=9s", "drift=two"} {
		if _, err := ParseTiming(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
