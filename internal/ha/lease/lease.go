// Package lease keeps the host leases HA's fencing rests on (docs/ha.md).
//
// Two sides, each a small state machine over times given by the caller
// (a host's own monotonic clock), so that tests drive them with any
// clock:
//
//   - A Holder is a host's view of its own lease. Before it asks the
//     coordinator to renew, the host takes an Attempt (the time it asks);
//     when the coordinator answers yes, Granted makes the lease valid until
//     that time plus Timing.Lease. The lease is counted from the asking,
//     never from the answer, so that the host's lease never outlives the
//     coordinator's record of it (docs/ha.md, rule 2).
//   - A Ledger is the coordinator's record of renewals, in memory only. A
//     new Ledger (a newly elected coordinator) counts every host as renewed
//     at its own start (rule 5). Dead reports hosts whose last renewal is
//     older than Timing.FenceAfter.
//
// Neither does any I/O; the HA service renews over the network, kills
// domains and pets the watchdog on their say.
package lease

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Timing is HA's timing values (docs/ha.md, "The timing values").
type Timing struct {
	// Lease is how long a granted renewal keeps a host's lease valid (L).
	Lease time.Duration
	// Renew is how often a host asks to renew (R, L/5 by default).
	Renew time.Duration
	// KillGrace is how long a host whose lease ran out may take to kill
	// its protected VMs before it stops petting the watchdog (G).
	KillGrace time.Duration
	// Watchdog is the watchdog's timeout: the longest a machine runs
	// after its last pet (W).
	Watchdog time.Duration
	// Drift bounds the relative difference of two hosts' clock rates (ρ).
	Drift float64
	// Margin is added on top (M).
	Margin time.Duration
}

// Defaults are the timing values HA runs with unless told otherwise.
func Defaults() Timing {
	return Timing{Lease: 10 * time.Second, Renew: 2 * time.Second, KillGrace: 5 * time.Second,
		Watchdog: 10 * time.Second, Drift: 0.01, Margin: 2 * time.Second}
}

// ErrTiming is a Timing that cannot be safe.
var ErrTiming = errors.New("lease: timing values out of range")

// Check reports values that break the argument: a renewal interval that
// does not fit several times in a lease, or a negative duration or drift.
func (t Timing) Check() error {
	switch {
	case t.Lease <= 0, t.Renew <= 0, t.KillGrace < 0, t.Watchdog <= 0, t.Margin < 0:
		return ErrTiming
	case t.Drift < 0 || t.Drift >= 0.5:
		return ErrTiming
	case 2*t.Renew > t.Lease:
		return ErrTiming // a single lost renewal would end the lease
	}
	return nil
}

// FenceAfter is F: how long after the coordinator recorded a host's last
// renewal (on the coordinator's clock) the host certainly runs none of
// its protected VMs: L·(1+ρ) + G + W + M.
func (t Timing) FenceAfter() time.Duration {
	return time.Duration(float64(t.Lease)*(1+t.Drift)) + t.KillGrace + t.Watchdog + t.Margin
}

// Holder is a host's own lease. It is safe for concurrent use.
type Holder struct {
	t     Timing
	mu    sync.Mutex
	until time.Time // valid before this; zero: never granted
}

// NewHolder makes a holder with no lease.
func NewHolder(t Timing) *Holder { return &Holder{t: t} }

// Attempt is one request to renew: when it was sent.
type Attempt struct{ sent time.Time }

// Attempt records that the host asks for a renewal now.
func (h *Holder) Attempt(now time.Time) Attempt { return Attempt{sent: now} }

// Granted records that the coordinator granted a: the lease is valid
// until a's time plus the lease. An answer to an older attempt than the
// one already granted changes nothing.
func (h *Holder) Granted(a Attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if until := a.sent.Add(h.t.Lease); until.After(h.until) {
		h.until = until
	}
}

// Valid reports whether the lease holds at now.
func (h *Holder) Valid(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return now.Before(h.until)
}

// Until is when the lease ends (zero if it was never granted).
func (h *Holder) Until() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until
}

// Drop ends the lease at once (HA disabled, the host leaving the pool).
func (h *Holder) Drop() {
	h.mu.Lock()
	h.until = time.Time{}
	h.mu.Unlock()
}

// Ledger is the coordinator's record of renewals. It is safe for
// concurrent use.
type Ledger struct {
	t     Timing
	start time.Time
	mu    sync.Mutex
	last  map[string]time.Time
}

// NewLedger starts a ledger at now: the moment this host became
// coordinator, which counts as every host's last renewal.
func NewLedger(t Timing, now time.Time) *Ledger {
	return &Ledger{t: t, start: now, last: map[string]time.Time{}}
}

// Renew records a renewal from host at now.
func (l *Ledger) Renew(host string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.After(l.last[host]) {
		l.last[host] = now
	}
}

// Forget drops a host (it left the pool, or was declared dead and its
// VMs dealt with: it must renew again before it counts as alive).
func (l *Ledger) Forget(host string) {
	l.mu.Lock()
	delete(l.last, host)
	l.mu.Unlock()
}

// lastOf is a host's last renewal, never before the ledger's start.
func (l *Ledger) lastOf(host string) time.Time {
	if t, ok := l.last[host]; ok && t.After(l.start) {
		return t
	}
	return l.start
}

// Renewed reports whether host has renewed with this ledger.
func (l *Ledger) Renewed(host string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.last[host]
	return ok && !t.Before(l.start)
}

// Dead reports whether host can be declared dead at now: FenceAfter has
// passed since its last renewal (or since this ledger started).
func (l *Ledger) Dead(host string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return now.Sub(l.lastOf(host)) >= l.t.FenceAfter()
}

// DeadAmong lists, sorted, the hosts of hosts that can be declared dead
// at now.
func (l *Ledger) DeadAmong(hosts []string, now time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, h := range hosts {
		if now.Sub(l.lastOf(h)) >= l.t.FenceAfter() {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out
}

// Phase is where a host stands with its lease.
type Phase int

// The phases a host goes through when its lease runs out.
const (
	// Held: the lease is valid; the watchdog is petted.
	Held Phase = iota
	// Killing: the lease ran out less than KillGrace ago: the host kills
	// its protected VMs and still pets the watchdog.
	Killing
	// Fenced: the lease ran out at least KillGrace ago and the protected
	// VMs are not known to be gone: the watchdog is no longer petted.
	Fenced
	// Safe: the lease ran out and the protected VMs are gone: nothing
	// runs that another host may restart, and the watchdog may be petted.
	Safe
)

func (p Phase) String() string {
	switch p {
	case Held:
		return "held"
	case Killing:
		return "killing"
	case Fenced:
		return "fenced"
	case Safe:
		return "safe"
	}
	return "unknown"
}

// PhaseAt is the phase of a host whose lease holds until until (zero:
// never granted, or lost with the process that held it: a lease long
// over) at now, with killed reporting whether its protected VMs are all
// gone.
func (t Timing) PhaseAt(until, now time.Time, killed bool) Phase {
	switch {
	case now.Before(until):
		return Held
	case killed:
		return Safe
	case now.Sub(until) < t.KillGrace:
		return Killing
	}
	return Fenced
}

// ParseTiming reads timing values written as "lease=10s,renew=2s,
// grace=5s,watchdog=10s,margin=2s,drift=0.01", any subset, over the
// defaults; the result must pass Check.
func ParseTiming(s string) (Timing, error) {
	t := Defaults()
	if strings.TrimSpace(s) == "" {
		return t, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return t, fmt.Errorf("%w: %q is not name=value", ErrTiming, kv)
		}
		if k == "drift" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return t, fmt.Errorf("%w: drift %q", ErrTiming, v)
			}
			t.Drift = f
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return t, fmt.Errorf("%w: %s %q", ErrTiming, k, v)
		}
		switch k {
		case "lease":
			t.Lease = d
		case "renew":
			t.Renew = d
		case "grace":
			t.KillGrace = d
		case "watchdog":
			t.Watchdog = d
		case "margin":
			t.Margin = d
		default:
			return t, fmt.Errorf("%w: no value named %q", ErrTiming, k)
		}
	}
	return t, t.Check()
}
