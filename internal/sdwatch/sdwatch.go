// Package sdwatch feeds systemd's service watchdog (WatchdogSec=): it
// sends WATCHDOG=1 only while every part of the daemon it checks makes
// progress, so that systemd restarts a daemon that hangs but not one
// that is merely busy.
//
// A part is stuck when it has had work waiting, and finished none of it,
// for longer than its limit. Work that takes long but moves (a busy
// database writer that completes a write now and then, VM queues that
// drain) is not a stall, and neither is a part with nothing to do.
package sdwatch

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Check is one part of the daemon the watchdog looks at.
type Check struct {
	// Name says which part stalled, in the log.
	Name string
	// Limit is how long the part may stall before the pings stop.
	Limit time.Duration
	// Stalled is how long the part has had work waiting without finishing
	// any (0: it is idle or moving).
	Stalled func() time.Duration
}

// Config is a watchdog.
type Config struct {
	// Interval is systemd's watchdog timeout (WATCHDOG_USEC); the
	// watchdog pings every half of it.
	Interval time.Duration
	Checks   []Check
	// Notify sends a state to systemd ("WATCHDOG=1").
	Notify func(state string) error
	Log    *slog.Logger
}

// Run pings until ctx ends, skipping every ping while a check reports a
// stall past its limit.
func Run(ctx context.Context, cfg Config) {
	period := cfg.Interval / 2
	if period < 10*time.Millisecond {
		period = 10 * time.Millisecond
	}
	t := time.NewTicker(period)
	defer t.Stop()
	stalled := ""
	for {
		name, how := firstStall(cfg.Checks)
		switch {
		case name == "":
			if stalled != "" && cfg.Log != nil {
				cfg.Log.Warn("making progress again: pinging systemd's watchdog", "part", stalled)
			}
			stalled = ""
			if err := cfg.Notify("WATCHDOG=1"); err != nil && cfg.Log != nil {
				cfg.Log.Debug("systemd watchdog ping", "err", err)
			}
		case name != stalled:
			stalled = name
			if cfg.Log != nil {
				cfg.Log.Error("no progress: no longer pinging systemd's watchdog, which will restart the daemon",
					"part", name, "stalled", how.Round(time.Millisecond))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// firstStall names the first check stalled past its limit.
func firstStall(checks []Check) (string, time.Duration) {
	for _, c := range checks {
		if d := c.Stalled(); d > c.Limit {
			return c.Name, d
		}
	}
	return "", 0
}

// Counter turns a part's counters into a Stalled function: sample says
// whether work is waiting and how much the part has finished so far. The
// stall is the time since the count last moved, while work waits.
func Counter(sample func() (waiting bool, done uint64)) func() time.Duration {
	return counter(sample, time.Now)
}

func counter(sample func() (bool, uint64), now func() time.Time) func() time.Duration {
	var mu sync.Mutex
	var last uint64
	var since time.Time // when work was first seen waiting with the count at last
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		waiting, done := sample()
		t := now()
		if !waiting {
			since = time.Time{}
			last = done
			return 0
		}
		if since.IsZero() || done != last {
			since, last = t, done
			return 0
		}
		return t.Sub(since)
	}
}
