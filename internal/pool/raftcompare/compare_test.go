package raftcompare

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	etcdName   = "etcd raft, raftwal"
	asyncName  = "etcd async, raftwal"
	sharedName = "3 fsyncs at once"
)

// cmdBytes is the size of every write's command.
const cmdBytes = 512

const rounds = 3

var writerCounts = []int{1, 16}

// subject is one of the things measured.
type subject struct {
	name  string
	write func(ctx context.Context, w, i int) error
}

type result struct {
	p50, p99 time.Duration
	n        int
	wall     time.Duration
}

// percentile of sorted latencies (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// measure runs writers concurrent writers of per writes each, after a
// few writes not counted, and returns the latencies' p50 and p99.
func measure(ctx context.Context, s subject, writers, per int) (result, error) {
	for i := range 10 {
		if err := writeRetrying(ctx, s, 99, i); err != nil {
			return result{}, fmt.Errorf("%s warm-up: %w", s.name, err)
		}
	}
	lat := make([][]time.Duration, writers)
	errs := make([]error, writers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range writers {
		wg.Go(func() {
			mine := make([]time.Duration, 0, per)
			for i := range per {
				s0 := time.Now()
				if err := writeRetrying(ctx, s, w, i); err != nil {
					errs[w] = fmt.Errorf("%s writer %d write %d: %w", s.name, w, i, err)
					return
				}
				mine = append(mine, time.Since(s0))
			}
			lat[w] = mine
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	var all []time.Duration
	for w := range writers {
		if errs[w] != nil {
			return result{}, errs[w]
		}
		all = append(all, lat[w]...)
	}
	slices.Sort(all)
	return result{p50: percentile(all, 0.50), p99: percentile(all, 0.99), n: len(all), wall: wall}, nil
}

// writeRetrying is one write as a client makes it: a write refused
// because leadership changed under it (a loaded machine can starve a
// heartbeat) is made again once there is a leader, for up to a minute;
// the time the retries take counts in the write's latency.
func writeRetrying(ctx context.Context, s subject, w, i int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.write(ctx, w, i)
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d.Microseconds())/1000) }

func span(v []float64, format string) string {
	lo, hi := slices.Min(v), slices.Max(v)
	return fmt.Sprintf(format+"–"+format, lo, hi)
}

func dirs(t *testing.T) []string {
	base := t.TempDir()
	var d []string
	for i := range 3 {
		p := filepath.Join(base, fmt.Sprint("n", i+1))
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		d = append(d, p)
	}
	return d
}

// TestCompare measures commit latency on the leader for etcd raft on
// raftwal, hashicorp raft on raftwal and on bbolt, and the floor of one
// fsync'd append, interleaved, in 3 rounds; see the package manual.
func TestCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("a latency measurement of about 15 s; run without -short")
	}
	per1, per16 := 300, 40
	timeout := 5 * time.Minute
	if os.Getenv("TOOLSTACKD_LONG") == "1" {
		per1, per16, timeout = 3000, 400, 30*time.Minute
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	t.Logf("load average at start: %s", loadavg())

	fl, err := openFloor(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fl.Close() }()
	// Three nodes here share one disk; their syncs contend as three
	// hosts' would not. This floor shows what three syncs at once cost.
	var fl3 [3]*floor
	for i := range fl3 {
		if fl3[i], err = openFloor(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = fl3[i].Close() }()
	}
	ec, err := startEtcdCluster(ctx, dirs(t), false)
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Stop()
	ea, err := startEtcdCluster(ctx, dirs(t), true)
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Stop()
	hw, err := startHashiCluster(ctx, "wal", dirs(t))
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	hb, err := startHashiCluster(ctx, "bbolt", dirs(t))
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Stop()

	// Writes go to whichever node leads at the time: on a loaded machine
	// leadership can move during a measurement, and writeRetrying makes
	// a refused write again, as a client would.
	etcdLeader, asyncLeader := ec.Leader(), ea.Leader()
	leaderOf := func(c *etcdCluster) (*etcdNode, error) {
		if l := c.Leader(); l != nil {
			return l, nil
		}
		return nil, errors.New("no etcd leader")
	}
	subjects := []subject{
		{"fsync floor", func(ctx context.Context, _, _ int) error { return fl.Write(ctx, cmdBytes) }},
		{sharedName, func(ctx context.Context, _, _ int) error {
			errs := make(chan error, len(fl3))
			for _, f := range fl3 {
				go func() { errs <- f.Write(ctx, cmdBytes) }()
			}
			var first error
			for range fl3 {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return first
		}},
		{etcdName, func(ctx context.Context, _, _ int) error {
			l, err := leaderOf(ec)
			if err != nil {
				return err
			}
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return l.Write(c, cmdBytes)
		}},
		{asyncName, func(ctx context.Context, _, _ int) error {
			l, err := leaderOf(ea)
			if err != nil {
				return err
			}
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return l.Write(c, cmdBytes)
		}},
		{"hashicorp raft, raftwal", func(ctx context.Context, w, i int) error {
			return hw.Write(ctx, fmt.Sprintf("w%02d-%08d", w, i), cmdBytes)
		}},
		{"hashicorp raft, bbolt", func(ctx context.Context, w, i int) error {
			return hb.Write(ctx, fmt.Sprintf("w%02d-%08d", w, i), cmdBytes)
		}},
	}
	// res[subject][writers] holds one result a round.
	res := map[string]map[int][]result{}
	for _, s := range subjects {
		res[s.name] = map[int][]result{}
	}
	for r := range rounds {
		for k := range subjects {
			s := subjects[(r+k)%len(subjects)]
			for _, writers := range writerCounts {
				per := per1
				if writers > 1 {
					per = per16
				}
				var ecl *etcdCluster
				switch s.name {
				case etcdName:
					ecl = ec
				case asyncName:
					ecl = ea
				}
				var before [3][3]int64
				if ecl != nil {
					for i, n := range ecl.nodes {
						r, e, w := n.stats.snapshot()
						before[i] = [3]int64{r, e, int64(w)}
					}
				}
				got, err := measure(ctx, s, writers, per)
				if err != nil {
					t.Fatal(err)
				}
				if ecl != nil {
					for i, n := range ecl.nodes {
						r, e, w := n.stats.snapshot()
						r, e, w = r-before[i][0], e-before[i][1], w-time.Duration(before[i][2])
						if r > 0 {
							t.Logf("        etcd node %d: %d log writes, %.1f entries a write, %s ms a write", i+1, r, float64(e)/float64(r), ms(w/time.Duration(r)))
						}
					}
				}
				res[s.name][writers] = append(res[s.name][writers], got)
				t.Logf("round %d  %-24s writers=%-2d  n=%-5d p50 %s ms  p99 %s ms  (%.0f writes/s)",
					r+1, s.name, writers, got.n, ms(got.p50), ms(got.p99), float64(got.n)/got.wall.Seconds())
			}
		}
	}
	t.Logf("load average at end: %s", loadavg())

	// The replicas agree with their leaders.
	if etcdLeader != ec.Leader() || asyncLeader != ea.Leader() {
		t.Log("an etcd leader changed during the measurement (the machine was busy): its figures include the election")
	}
	if err := ec.converged(ctx); err != nil {
		t.Error(err)
	}
	if err := ea.converged(ctx); err != nil {
		t.Error(err)
	}
	if err := hw.converged(ctx); err != nil {
		t.Error(err)
	}
	if err := hb.converged(ctx); err != nil {
		t.Error(err)
	}

	// Summary: ranges over rounds, ratios to the same round's floor.
	floorRes := res[subjects[0].name]
	var b strings.Builder
	fmt.Fprintf(&b, "\n| subject | writers | p50 ms | p99 ms | p50 / floor p50 | p99 / floor p99 |\n|---|---|---|---|---|---|\n")
	for _, writers := range writerCounts {
		for _, s := range subjects {
			var p50, p99, r50, r99 []float64
			for r, x := range res[s.name][writers] {
				f := floorRes[writers][r]
				p50 = append(p50, float64(x.p50.Microseconds())/1000)
				p99 = append(p99, float64(x.p99.Microseconds())/1000)
				r50 = append(r50, float64(x.p50)/float64(f.p50))
				r99 = append(r99, float64(x.p99)/float64(f.p99))
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s |\n", s.name, writers,
				span(p50, "%.2f"), span(p99, "%.2f"), span(r50, "%.2f"), span(r99, "%.2f"))
		}
	}
	// Pairs compared round by round.
	pairs := [][2]string{
		{etcdName, "hashicorp raft, raftwal"},
		{etcdName, "hashicorp raft, bbolt"},
		{etcdName, sharedName},
		{asyncName, etcdName},
		{asyncName, "hashicorp raft, raftwal"},
	}
	for _, pr := range pairs {
		for _, writers := range writerCounts {
			var r50 []float64
			for r := range rounds {
				r50 = append(r50, float64(res[pr[0]][writers][r].p50)/float64(res[pr[1]][writers][r].p50))
			}
			fmt.Fprintf(&b, "p50 %s / %s, %d writers: %s\n", pr[0], pr[1], writers, span(r50, "%.2f"))
		}
	}
	t.Log(b.String())
}
