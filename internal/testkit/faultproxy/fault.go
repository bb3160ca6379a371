package faultproxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxDelay bounds Delay+Jitter of a Fault: a longer delay is a partition
// and should be written as one (Blackhole), and an unbounded delay would
// let a typo hold connections for hours.
const MaxDelay = time.Minute

// A Fault says what happens to the bytes of a connection from one source.
// The zero Fault passes everything unchanged. Faults combine: a Fault with
// both Delay and Drop delays the chunks it does not drop; Blackhole wins
// over everything else.
type Fault struct {
	// Blackhole holds all traffic, both ways, on the source's existing
	// and new connections: the proxy stops reading and writing, the
	// connections stay open (a new one is accepted and left waiting),
	// and nothing is lost. When the rule is lifted the held bytes flow
	// again in order, as after a healed partition in which TCP kept
	// retransmitting.
	Blackhole bool
	// Delay is added to every chunk before it is written on, Jitter is
	// the largest random deviation from it either way (75 ms ± 50 ms is
	// Delay 75ms, Jitter 50ms). Chunks are never reordered within one
	// direction of a connection: a chunk is never written before the one
	// read before it. A new delay applies to the chunks read after it is
	// set; chunks already waiting keep their time.
	Delay, Jitter time.Duration
	// Drop is the probability (0 to 1) with which each chunk read, either
	// way, resets its connection: TCP cannot lose bytes silently, so a
	// lossy link looks to the endpoints like a connection that breaks.
	// Both sides see a reset (RST), not an orderly close.
	Drop float64
}

// Pass is the fault that forwards everything unchanged.
var Pass = Fault{}

// Blackhole returns the fault that holds all traffic (see Fault.Blackhole).
func Blackhole() Fault { return Fault{Blackhole: true} }

// Delay returns the fault that delays each chunk by d ± jitter.
func Delay(d, jitter time.Duration) Fault { return Fault{Delay: d, Jitter: jitter} }

// Drop returns the fault that resets a connection on each chunk with
// probability p.
func Drop(p float64) Fault { return Fault{Drop: p} }

// Validate reports a fault that cannot be applied: a negative delay or
// jitter, a jitter larger than the delay, Delay+Jitter over MaxDelay, or a
// drop probability outside [0, 1] (or NaN).
func (f Fault) Validate() error {
	switch {
	case f.Delay < 0 || f.Jitter < 0:
		return errors.New("faultproxy: negative delay or jitter")
	case f.Jitter > f.Delay:
		return fmt.Errorf("faultproxy: jitter %v larger than delay %v", f.Jitter, f.Delay)
	case f.Delay+f.Jitter > MaxDelay:
		return fmt.Errorf("faultproxy: delay %v±%v over the maximum %v", f.Delay, f.Jitter, MaxDelay)
	case !(f.Drop >= 0 && f.Drop <= 1):
		return fmt.Errorf("faultproxy: drop probability %v outside [0, 1]", f.Drop)
	}
	return nil
}

// String describes the fault as the CLI accepts it: "pass", "blackhole",
// "delay=75ms±50ms", "drop=0.5" or a combination joined by spaces.
func (f Fault) String() string {
	if f.Blackhole {
		return "blackhole"
	}
	var parts []string
	if f.Delay > 0 {
		parts = append(parts, fmt.Sprintf("delay=%v±%v", f.Delay, f.Jitter))
	}
	if f.Drop > 0 {
		parts = append(parts, fmt.Sprintf("drop=%v", f.Drop))
	}
	if len(parts) == 0 {
		return "pass"
	}
	return strings.Join(parts, " ")
}

// ParseFault reads a fault as String writes it: "pass", "blackhole", or
// any of "delay=D", "delay=D±J" (also "delay=D+-J"), "jitter=J" and
// "drop=P" separated by spaces, with durations as time.ParseDuration reads
// them ("delay=75ms±50ms drop=0.1").
func ParseFault(s string) (Fault, error) {
	var f Fault
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return f, errors.New("faultproxy: empty fault")
	}
	for _, tok := range fields {
		name, val, hasVal := strings.Cut(tok, "=")
		var err error
		switch {
		case tok == "pass" && len(fields) == 1:
		case tok == "blackhole":
			f.Blackhole = true
		case name == "delay" && hasVal:
			d, j, withJitter := strings.Cut(strings.Replace(val, "+-", "±", 1), "±")
			if f.Delay, err = time.ParseDuration(d); err == nil && withJitter {
				f.Jitter, err = time.ParseDuration(j)
			}
		case name == "jitter" && hasVal:
			f.Jitter, err = time.ParseDuration(val)
		case name == "drop" && hasVal:
			f.Drop, err = strconv.ParseFloat(val, 64)
		default:
			return Fault{}, fmt.Errorf("faultproxy: %q is not a fault (pass, blackhole, delay=D±J, jitter=J, drop=P)", tok)
		}
		if err != nil {
			return Fault{}, fmt.Errorf("faultproxy: %q: %w", tok, err)
		}
	}
	if err := f.Validate(); err != nil {
		return Fault{}, err
	}
	return f, nil
}
