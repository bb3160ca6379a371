package sdwatch

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCounter(t *testing.T) {
	var waiting bool
	var done uint64
	now := time.Unix(1000, 0)
	stalled := counter(func() (bool, uint64) { return waiting, done }, func() time.Time { return now })
	step := func(d time.Duration) time.Duration { now = now.Add(d); return stalled() }
	if s := step(0); s != 0 {
		t.Fatalf("idle: stalled %v", s)
	}
	if s := step(time.Hour); s != 0 {
		t.Fatalf("idle for an hour is not a stall: %v", s)
	}
	waiting = true
	if s := step(time.Second); s != 0 {
		t.Fatalf("work just seen waiting: %v", s)
	}
	if s := step(5 * time.Second); s != 5*time.Second {
		t.Fatalf("waiting 5s with no progress: %v", s)
	}
	done++ // busy but moving
	if s := step(5 * time.Second); s != 0 {
		t.Fatalf("progress resets the stall: %v", s)
	}
	if s := step(2 * time.Second); s != 2*time.Second {
		t.Fatalf("stalled 2s since the last progress: %v", s)
	}
	waiting = false
	if s := step(time.Minute); s != 0 {
		t.Fatalf("nothing waiting: %v", s)
	}
}

// pings counts the WATCHDOG=1 a running watchdog sends.
type pings struct {
	mu sync.Mutex
	n  int
}

func (p *pings) notify(state string) error {
	if state == "WATCHDOG=1" {
		p.mu.Lock()
		p.n++
		p.mu.Unlock()
	}
	return nil
}

func (p *pings) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func TestRunStopsPingingWhileStalled(t *testing.T) {
	var stall atomic.Int64
	var p pings
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Config{Interval: 20 * time.Millisecond, Notify: p.notify, Checks: []Check{
			{Name: "idle", Limit: time.Second, Stalled: func() time.Duration { return 0 }},
			{Name: "db", Limit: 50 * time.Millisecond, Stalled: func() time.Duration { return time.Duration(stall.Load()) }},
		}})
	}()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("no pings while healthy", func() bool { return p.count() >= 3 })
	// Under the limit: still a busy part, not a hung one.
	stall.Store(int64(40 * time.Millisecond))
	n := p.count()
	waitFor("a stall under the limit stopped the pings", func() bool { return p.count() >= n+3 })
	stall.Store(int64(time.Second))
	time.Sleep(30 * time.Millisecond) // a ping may be on its way
	n = p.count()
	time.Sleep(150 * time.Millisecond)
	if got := p.count(); got != n {
		t.Fatalf("%d pings while stalled", got-n)
	}
	stall.Store(0)
	waitFor("pings did not resume after the stall", func() bool { return p.count() > n })
}
