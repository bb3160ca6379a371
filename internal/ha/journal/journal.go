// Package journal records when VM instances start and stop, on the
// machine's monotonic clock, so that a test can prove that no VM ever had
// two running instances (docs/ha.md).
//
// Every host of a test pool appends to one file: "start VM HOST NS" when
// a domain is made, "stop VM HOST NS" once it is destroyed (both on the
// safe side: a start is written before the domain runs, a stop after it
// is gone), and "dead - HOST NS" when a host is reset (its fake watchdog
// fired), which ends every instance the host had. NS is CLOCK_MONOTONIC
// in nanoseconds, which hosts on one machine share. Lines are written
// with one append each, which the kernel keeps whole.
package journal

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The kinds of event.
const (
	Start = "start"
	Stop  = "stop"
	Dead  = "dead"
)

// Now is CLOCK_MONOTONIC in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// Append adds one event to the journal at path (vm is "-" for Dead).
func Append(path, kind, vm, host string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600) //nolint:gosec // a test's journal, named by its flag
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s %s %d\n", kind, vm, host, Now())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Event is one line of a journal.
type Event struct {
	Kind, VM, Host string
	At             int64
}

// Read reads a journal; a torn last line (a host killed while writing)
// is skipped.
func Read(path string) ([]Event, error) {
	f, err := os.Open(path) //nolint:gosec // a test's journal
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 4 {
			continue
		}
		at, err := strconv.ParseInt(fields[3], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case Start, Stop, Dead:
			out = append(out, Event{Kind: fields[0], VM: fields[1], Host: fields[2], At: at})
		}
	}
	return out, sc.Err()
}

// Instance is one run of a VM on a host: from its start to its stop or
// its host's reset (End is 0 while it still runs).
type Instance struct {
	VM, Host   string
	Start, End int64
}

// Overlap is two instances of one VM that ran at the same time.
type Overlap struct{ A, B Instance }

func (o Overlap) String() string {
	return fmt.Sprintf("VM %s ran on %s from %d to %d and on %s from %d to %d", o.A.VM, o.A.Host, o.A.Start, o.A.End,
		o.B.Host, o.B.Start, o.B.End)
}

// Instances pairs the events into instances, ordered by start.
func Instances(events []Event) []Instance {
	evs := append([]Event(nil), events...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].At < evs[j].At })
	type key struct{ vm, host string }
	open := map[key]int{} // -> index in out
	var out []Instance
	for _, e := range evs {
		switch e.Kind {
		case Start:
			k := key{e.VM, e.Host}
			if _, running := open[k]; running {
				continue // a second start without a stop: the same instance, counted from its first
			}
			open[k] = len(out)
			out = append(out, Instance{VM: e.VM, Host: e.Host, Start: e.At})
		case Stop:
			k := key{e.VM, e.Host}
			if i, ok := open[k]; ok {
				out[i].End = e.At
				delete(open, k)
			}
		case Dead:
			for k, i := range open {
				if k.host == e.Host {
					out[i].End = e.At
					delete(open, k)
				}
			}
		}
	}
	return out
}

// Check returns every pair of instances of one VM whose runs overlap.
func Check(events []Event) []Overlap {
	byVM := map[string][]Instance{}
	for _, in := range Instances(events) {
		byVM[in.VM] = append(byVM[in.VM], in)
	}
	var out []Overlap
	for _, vm := range slices.Sorted(maps.Keys(byVM)) {
		ins := byVM[vm]
		for i := range ins {
			for j := i + 1; j < len(ins); j++ {
				a, b := ins[i], ins[j]
				aEnd, bEnd := a.End, b.End
				if aEnd == 0 {
					aEnd = 1<<63 - 1
				}
				if bEnd == 0 {
					bEnd = 1<<63 - 1
				}
				if a.Start < bEnd && b.Start < aEnd {
					out = append(out, Overlap{a, b})
				}
			}
		}
	}
	return out
}
