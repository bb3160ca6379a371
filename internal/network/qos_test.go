package network

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// The qos fields as xapi reads them: kbps is KiB/s, timeslice_us sets
// the burst (never under netback's 128 KiB); what makes no limit says
// why.
func TestRateFor(t *testing.T) {
	for _, c := range []struct {
		typ    string
		params map[string]string
		want   Rate
		why    string
	}{
		{"", nil, Rate{}, ""},
		{"", map[string]string{"kbps": "100"}, Rate{}, ""},
		{"ratelimit", map[string]string{"kbps": "100"}, Rate{Bytes: 102400, Burst: MinBurst}, ""},
		{"ratelimit", map[string]string{"kbps": "10000"}, Rate{Bytes: 10240000, Burst: 512000}, ""},
		{"ratelimit", map[string]string{"kbps": "10000", "timeslice_us": "100000"}, Rate{Bytes: 10240000, Burst: 1024000}, ""},
		{"ratelimit", map[string]string{"kbps": "10000", "timeslice_us": "junk"}, Rate{Bytes: 10240000, Burst: 512000}, ""},
		{"ratelimit", map[string]string{"kbps": "10000", "timeslice_us": "-5"}, Rate{Bytes: 10240000, Burst: 512000}, ""},
		{"ratelimit", map[string]string{"kbps": "10000", "timeslice_us": "99999999999"}, Rate{Bytes: 10240000, Burst: 512000}, "timeslice_us"},
		{"ratelimit", map[string]string{}, Rate{}, "not found"},
		{"ratelimit", map[string]string{"kbps": "fast"}, Rate{}, "not an integer"},
		{"ratelimit", map[string]string{"kbps": "1.5"}, Rate{}, "not an integer"},
		{"ratelimit", map[string]string{"kbps": "-1"}, Rate{}, "not positive"},
		{"ratelimit", map[string]string{"kbps": "0"}, Rate{}, "not positive"},
		{"ratelimit", map[string]string{"kbps": "9223372036854775807"}, Rate{}, "absurd"},
		{"ratelimit", map[string]string{"kbps": "99999999999999999999999"}, Rate{}, "not an integer"},
		{"weird", map[string]string{"kbps": "1"}, Rate{}, "unknown"},
	} {
		got, why := RateFor(c.typ, c.params)
		if got != c.want || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
			t.Errorf("RateFor(%q, %v) = %+v, %q; want %+v, %q", c.typ, c.params, got, why, c.want, c.why)
		}
	}
}

// shapingLinks is a Recorder that can also limit rates.
type shapingLinks struct {
	*Recorder
	mu    sync.Mutex
	rates map[string]Rate
}

func (s *shapingLinks) SetRate(dev string, rate, burst uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rate == 0 {
		delete(s.rates, dev)
	} else {
		s.rates[dev] = Rate{Bytes: rate, Burst: burst}
	}
	return nil
}

func (s *shapingLinks) rate(dev string) Rate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rates[dev]
}

// A VIF's tap comes from PlugTap with the network's MTU, on its bridge,
// up and with its rate limit; a change of the VIF's qos fields while it
// runs reaches the limit through Watch, invalid ones remove it, and
// UnplugTap takes the tap and its limit away.
func TestVIFTapAndRateLimit(t *testing.T) {
	e := newEnv(t)
	sl := &shapingLinks{Recorder: e.rec, rates: map[string]Rate{}}
	e.m.cfg.Links = sl
	n := e.network("guests")
	_, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	setQoS := func(typ string, params map[string]string) {
		t.Helper()
		if _, err := e.d.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VIF.QosAlgorithmType, vif, typ); err != nil {
				return err
			}
			return tx.Set(dm.VIF.QosAlgorithmParams, vif, params)
		}); err != nil {
			t.Fatal(err)
		}
	}
	setQoS("ratelimit", map[string]string{"kbps": "100"})
	ctx := context.Background()
	bridge, err := e.m.EnsureVIF(ctx, vif)
	if err != nil {
		t.Fatal(err)
	}
	if !e.m.HasBridge(bridge) {
		t.Fatalf("no bridge %s after EnsureVIF", bridge)
	}
	e.rec.Reset()
	if err := e.m.PlugTap(ctx, vif, "tsvif1.0", bridge, 9000); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls(), "delete tsvif1.0", "tap tsvif1.0 mtu 9000", "master tsvif1.0 "+bridge, "up tsvif1.0")
	if got := sl.rate("tsvif1.0"); got != (Rate{Bytes: 102400, Burst: MinBurst}) {
		t.Fatalf("rate after plug %+v", got)
	}
	// The VM lifecycle asks again (LockVIF after the backend's plug):
	// nothing changes.
	e.rec.Reset()
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	if c := e.rec.Calls(); len(c) != 0 {
		t.Fatalf("LockVIF again made calls %v", c)
	}

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.m.Watch(wctx, 20*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	waitRate := func(want Rate) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for sl.rate("tsvif1.0") != want {
			if time.Now().After(deadline) {
				t.Fatalf("rate %+v, want %+v", sl.rate("tsvif1.0"), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	setQoS("ratelimit", map[string]string{"kbps": "10000", "timeslice_us": "100000"})
	waitRate(Rate{Bytes: 10240000, Burst: 1024000})
	setQoS("ratelimit", map[string]string{"kbps": "-3"})
	waitRate(Rate{})
	setQoS("ratelimit", map[string]string{"kbps": "200"})
	waitRate(Rate{Bytes: 204800, Burst: MinBurst})
	setQoS("", map[string]string{})
	waitRate(Rate{})
	setQoS("ratelimit", map[string]string{"kbps": "300"})
	waitRate(Rate{Bytes: 307200, Burst: MinBurst})

	if err := e.m.UnplugTap(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	if got := sl.rate("tsvif1.0"); got != (Rate{}) {
		t.Fatalf("rate after unplug %+v", got)
	}
	if _, err := e.rec.Get("tsvif1.0"); err == nil {
		t.Fatal("tap left after UnplugTap")
	}
	e.m.lockMu.Lock()
	_, tracked := e.m.locked[vif]
	e.m.lockMu.Unlock()
	if tracked {
		t.Fatal("an unplugged VIF is still followed")
	}
}

// A tap whose VIF cannot be locked (locked, no nf_tables) is not left
// behind.
func TestPlugTapRefusedLeavesNothing(t *testing.T) {
	e := newEnv(t)
	n := e.network("guests")
	_, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.LockingMode, vif, "locked") }); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bridge, err := e.m.EnsureVIF(ctx, vif)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.PlugTap(ctx, vif, "tsvif2.0", bridge, 1500); err == nil {
		t.Fatal("a locked VIF got a tap with no way to lock it")
	}
	if _, err := e.rec.Get("tsvif2.0"); err == nil {
		t.Fatal("tap left after a refused plug")
	}
	if slices.Contains(e.rec.Calls(), "up tsvif2.0") && !slices.Contains(e.rec.Calls(), "delete tsvif2.0") {
		t.Fatalf("calls %v", e.rec.Calls())
	}
}
