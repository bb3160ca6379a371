package core

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// TestFigures measures issue 12's figures through real processes, each
// against a baseline in the same run: durable write latency (one setter
// call) on a pool's coordinator against a host alone, with 1 and 16
// clients, and VM.start_on + VM.hard_shutdown of a simulated VM on a
// member (forwarded) against the coordinator (local). It runs with
// TOOLSTACKD_FIGURES=1 and prints the figures (docs/performance.md).
func TestFigures(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure issue 12's figures")
	}
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	alone := pooltest.Start(t, pooltest.Options{Hosts: 1})
	c := pooltest.NewClient(netip.Addr{})
	for _, clients := range []int{1, 16} {
		base := writeLatency(t, ctx, c, alone.Addr(0), alone, 0, clients)
		pooled := writeLatency(t, ctx, c, p.Addr(0), p, 0, clients)
		t.Logf("durable write, %2d clients: alone p50 %v p99 %v; pool of 3 p50 %v p99 %v; ratio p50 %.2f p99 %.2f",
			clients, base[0], base[1], pooled[0], pooled[1],
			float64(pooled[0])/float64(base[0]), float64(pooled[1])/float64(base[1]))
	}
	// The same with the pool's links direct, without the fault proxies
	// the tier-2 tests put on every one: the path a pool has in
	// production. (A pool of its own, gone at the end of the subtest.)
	t.Run("no fault proxies", func(t *testing.T) {
		direct := suite.StartPoolWith(t, ctx, pooltest.Options{Hosts: 3})
		for _, clients := range []int{1, 16} {
			base := writeLatency(t, ctx, c, alone.Addr(0), alone, 0, clients)
			plain := writeLatency(t, ctx, c, direct.Addr(0), direct, 0, clients)
			t.Logf("durable write, %2d clients, no fault proxies: alone p50 %v p99 %v; pool of 3 p50 %v p99 %v; ratio p50 %.2f p99 %.2f",
				clients, base[0], base[1], plain[0], plain[1], float64(plain[0])/float64(base[0]), float64(plain[1])/float64(base[1]))
		}
	})
	failover(t, ctx, p, 5)
	coord := p.Coordinator(t, 30*time.Second)
	member := (coord + 1) % p.Len()
	s, err := p.Login(ctx, c, coord)
	if err != nil {
		t.Fatal(err)
	}
	byIndex := suite.HostRefs(t, ctx, c, p, coord, s)
	local := suite.StartCycles(t, ctx, c, p.Addr(coord), s, byIndex[coord], 30)
	remote := suite.StartCycles(t, ctx, c, p.Addr(coord), s, byIndex[member], 30)
	t.Logf("VM.start_on + VM.hard_shutdown (simulator): on the coordinator p50 %v; on a member (forwarded) p50 %v; ratio %.2f",
		local, remote, float64(remote)/float64(local))
}

// writeLatency is p50 and p99 of VM.set_name_description on host i of p,
// with clients concurrent clients for 3 s.
func writeLatency(t *testing.T, ctx context.Context, c *pooltest.Client, addr string, p *pooltest.Pool, i, clients int) [2]time.Duration {
	t.Helper()
	lat := writeLatencies(t, ctx, c, addr, p, i, clients)
	return [2]time.Duration{quantile(lat, 0.5), quantile(lat, 0.99)}
}

// writeLatencies is every latency of VM.set_name_description on host i
// of p, with clients concurrent clients for 3 s, sorted.
func writeLatencies(t *testing.T, ctx context.Context, c *pooltest.Client, addr string, p *pooltest.Pool, i, clients int) []time.Duration {
	t.Helper()
	s, err := p.Login(ctx, c, i)
	if err != nil {
		t.Fatal(err)
	}
	vms := make([]string, clients)
	for k := range vms {
		vms[k], err = c.CallString(ctx, addr, "VM.create", s, testdaemon.VMRecord(fmt.Sprint("latency-", k)))
		if err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var lat []time.Duration
	end := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for k := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(end); n++ {
				start := time.Now()
				if _, err := c.Call(ctx, addr, "VM.set_name_description", s, vms[k], fmt.Sprint(n)); err != nil {
					t.Error(err)
					return
				}
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(lat)
	if len(lat) == 0 {
		t.Fatal("no write completed")
	}
	return lat
}

// quantile is the q quantile of sorted latencies.
func quantile(lat []time.Duration, q float64) time.Duration {
	return lat[int(float64(len(lat)-1)*q)]
}

// TestFiguresWriteTail prints the whole latency distribution of durable
// writes, a host alone and a pool of 3 on direct links taking turns, in
// three rounds, for 1 and 16 writers (TOOLSTACKD_FIGURES=1): the figures
// behind the write ratios of TestFigures, with their tails.
func TestFiguresWriteTail(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure issue 12's figures")
	}
	ctx := suite.Ctx(t)
	p := suite.StartPoolWith(t, ctx, pooltest.Options{Hosts: 3})
	alone := pooltest.Start(t, pooltest.Options{Hosts: 1})
	c := pooltest.NewClient(netip.Addr{})
	coord := p.Coordinator(t, 30*time.Second)
	show := func(lat []time.Duration) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%6d writes", len(lat))
		for _, q := range []float64{0.1, 0.5, 0.9, 0.99, 0.999, 1} {
			fmt.Fprintf(&b, "  p%-4g %8v", q*100, quantile(lat, q).Round(time.Microsecond))
		}
		return b.String()
	}
	for _, clients := range []int{1, 16} {
		for round := range 3 {
			a := writeLatencies(t, ctx, c, alone.Addr(0), alone, 0, clients)
			b := writeLatencies(t, ctx, c, p.Addr(coord), p, coord, clients)
			t.Logf("%2d writers, round %d: alone %s", clients, round+1, show(a))
			t.Logf("%2d writers, round %d: pool  %s; p50 ratio %.2f, p99 ratio %.2f", clients, round+1, show(b),
				float64(quantile(b, 0.5))/float64(quantile(a, 0.5)), float64(quantile(b, 0.99))/float64(quantile(a, 0.99)))
		}
	}
}

// failover kills the coordinator n times and logs how long until a write
// is acknowledged again, by a client that tries every other host every
// 20 ms (so that the figure is the pool's, not a client's back-off).
func failover(t *testing.T, ctx context.Context, p *pooltest.Pool, n int) {
	t.Helper()
	var times []time.Duration
	for round := range n {
		c := pooltest.NewClient(netip.Addr{})
		coord := p.Coordinator(t, 30*time.Second)
		s, err := p.Login(ctx, c, coord)
		if err != nil {
			t.Fatal(err)
		}
		pool := suite.PoolRef(t, ctx, c, p, coord, s)
		killed := time.Now()
		p.Kill(coord)
		var took time.Duration
		for took == 0 {
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("round %d: no write acknowledged 30 s after the kill", round)
			}
			for i := range p.Len() {
				if i == coord {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				s, err := p.Login(cctx, c, i)
				if err == nil {
					_, err = c.Call(cctx, p.Addr(i), "pool.set_name_description", s, pool, fmt.Sprint("round ", round))
				}
				cancel()
				if err == nil {
					took = time.Since(killed)
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		times = append(times, took)
		p.Restart(coord)
		lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
		err = p.WaitLive(lctx, p.Len())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(times)
	t.Logf("coordinator killed (kill -9) %d times: first acknowledged write after p50 %v, max %v (all: %v)",
		n, times[len(times)/2], times[len(times)-1], times)
}
