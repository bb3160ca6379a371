// Package scale measures a large pool: real toolstackd processes as the
// voters and the coordinator, and many light simulated hosts
// (internal/testkit/poolfarm, in this test's process) as the other members, with
// many VMs, for issue 12's last figure row (join time, coordinator CPU at
// rest, event.from latency, VM.start placement time, coordinator memory).
//
// TestScaleSmall runs in make test (5 real hosts, 20 light hosts, 5,000
// VMs, well under a minute) and asserts that every light host joins, is
// live on the coordinator and receives the pool's raft entries, that no
// light host votes, and that VM.start places a VM on a real host.
//
// TestScale is the full measurement, skipped unless TOOLSTACKD_SCALE=1:
//
//	TOOLSTACKD_SCALE=1 go test -count=1 -timeout 90m -v -run 'TestScale$' ./tests/scale/
//
// It first measures the baseline (3 real hosts, 100 VMs, no light hosts),
// then the large pool: 5 real hosts (the pool's 5 voters: the coordinator
// promotes members to voters up to 5, so with fewer real hosts it would
// promote light hosts, whose raft log is never synced) and 123 light
// hosts, 128 hosts in all, with 100,000 VMs. TOOLSTACKD_SCALE_LIGHT and
// TOOLSTACKD_SCALE_VMS change the large pool's light hosts and VMs;
// TOOLSTACKD_SCALE_SPLIT=1 adds three pools that tell the hosts' cost
// from the VMs' (5 real hosts with 100 VMs; with the light hosts and 100
// VMs; with 100,000 VMs and no light hosts). It needs about 5 GiB of
// memory and, on 2 cores, about 4 minutes (10 with the split).
//
// Method, for both pools:
//   - VMs are made before the pool is formed, on the first host alone, by
//     16 concurrent clients calling VM.create (testdaemon.VMRecord: 128 MiB,
//     diskless, no affinity); the time is reported.
//   - The other real hosts join with pool.join (pooltest), then the light
//     hosts one after the other through the coordinator's /pool/join; each
//     join is timed from the request to the light host's raft node holding
//     the index the coordinator answered with (the real pool.join's own end).
//   - Every host must be live on the coordinator (host_metrics.live), every
//     light host's node must have heard from the leader within 5 s and
//     apply a new write.
//   - CPU at rest: the coordinator's utime+stime from /proc/PID/stat over
//     the window (30 s; 3 s in the small test) with no client calls, as a
//     percentage of one core; RSS is VmRSS after it.
//   - event.from: as docs/performance.md measured it: one client writes
//     VM.set_name_description on the coordinator's control domain every
//     10 ms; another (its own session and connection) loops on
//     event.from(['vm'], token, 30); latency is from the write call's return
//     to the watcher reading the reply that holds that value or a later one
//     (clamped at 0).
//   - VM.start placement: VM.start(vm, false, false) of halted VMs with no
//     affinity (the coordinator chooses the host), timed call by call, each
//     VM shut down (untimed) after; every one must land on a real host.
package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/testkit/poolfarm"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// size is one pool to measure.
type size struct {
	name   string
	real   int // toolstackd processes
	light  int // poolfarm hosts
	vms    int
	rest   time.Duration // CPU-at-rest window
	writes int           // event.from writes
	starts int           // VM.start calls
}

// figures are one pool's measurements.
type figures struct {
	size
	create              time.Duration
	joinTotal           time.Duration
	joinP50, joinP99    time.Duration
	snapshotBytes       int64
	cpuRest             float64 // % of one core
	rss, testRSS        int64
	eventP50, eventP99  time.Duration
	eventMax            time.Duration
	eventFromStart      [2]time.Duration // p50, p99 from the write call's start
	startP50, startP99  time.Duration
	startOnCoordinator  int
	coordinatorHostsSaw int
}

func TestScaleSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 5 daemons and 20 light hosts")
	}
	f := measure(t, size{name: "small", real: 5, light: 20, vms: 5000, rest: 3 * time.Second, writes: 50, starts: 5})
	t.Log(f.String())
}

func TestScale(t *testing.T) {
	if os.Getenv("TOOLSTACKD_SCALE") != "1" {
		t.Skip("set TOOLSTACKD_SCALE=1 to measure the 128-host, 100,000-VM pool")
	}
	light, vms := envInt(t, "TOOLSTACKD_SCALE_LIGHT", 123), envInt(t, "TOOLSTACKD_SCALE_VMS", 100000)
	rest := 30 * time.Second
	sizes := []size{
		{name: "baseline", real: 3, vms: 100, rest: rest, writes: 300, starts: 20},
		{name: "large", real: 5, light: light, vms: vms, rest: rest, writes: 300, starts: 20},
	}
	if os.Getenv("TOOLSTACKD_SCALE_SPLIT") == "1" {
		// Which of hosts and VMs costs what.
		sizes = append(sizes,
			size{name: "5 real, few VMs", real: 5, vms: 100, rest: rest, writes: 300, starts: 20},
			size{name: "hosts only", real: 5, light: light, vms: 100, rest: rest, writes: 300, starts: 20},
			size{name: "VMs only", real: 5, vms: vms, rest: rest, writes: 300, starts: 20})
	}
	var all []figures
	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) { all = append(all, measure(t, sz)) })
		if t.Failed() {
			return
		}
	}
	for _, f := range all {
		t.Log(f.String())
	}
	base, big := all[0], all[1]
	ratio := func(a, b time.Duration) string { return fmt.Sprintf("%.2f", float64(a)/float64(max(b, 1))) }
	t.Logf("large/baseline: CPU at rest %.1f%% / %.1f%%; RSS %.0f / %.0f MiB; event.from from the write's start p50 %s p99 %s; VM.start p50 %s p99 %s",
		big.cpuRest, base.cpuRest, mib(big.rss), mib(base.rss),
		ratio(big.eventFromStart[0], base.eventFromStart[0]), ratio(big.eventFromStart[1], base.eventFromStart[1]),
		ratio(big.startP50, base.startP50), ratio(big.startP99, base.startP99))
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: a count", name, v)
	}
	return n
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func (f figures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d real + %d light hosts, %d VMs\n", f.name, f.real, f.light, f.vms)
	fmt.Fprintf(&b, "  VM.create x%d before the pool: %v (%.0f VMs/s)\n", f.vms, f.create.Round(time.Millisecond),
		float64(f.vms)/max(f.create.Seconds(), 1e-9))
	if f.light > 0 {
		fmt.Fprintf(&b, "  light hosts join: total %v, per host p50 %v p99 %v; snapshot bytes per host %.1f MiB\n",
			f.joinTotal.Round(time.Millisecond), f.joinP50.Round(time.Millisecond), f.joinP99.Round(time.Millisecond),
			mib(f.snapshotBytes)/float64(f.light))
	}
	fmt.Fprintf(&b, "  coordinator at rest over %v: %.1f%% of one core; RSS %.0f MiB (this test process, with the farm: %.0f MiB)\n",
		f.rest, f.cpuRest, mib(f.rss), mib(f.testRSS))
	fmt.Fprintf(&b, "  event.from, %d writes every 10 ms: p50 %v p99 %v max %v after the write returned; p50 %v p99 %v from its start\n", f.writes,
		f.eventP50.Round(10*time.Microsecond), f.eventP99.Round(10*time.Microsecond), f.eventMax.Round(10*time.Microsecond),
		f.eventFromStart[0].Round(10*time.Microsecond), f.eventFromStart[1].Round(10*time.Microsecond))
	fmt.Fprintf(&b, "  VM.start placement x%d: p50 %v p99 %v (%d of %d on the coordinator; %d hosts seen)",
		f.starts, f.startP50.Round(10*time.Microsecond), f.startP99.Round(10*time.Microsecond), f.startOnCoordinator, f.starts,
		f.coordinatorHostsSaw)
	return b.String()
}

// testCtx is a context that ends a little before the test's deadline.
func testCtx(t *testing.T) context.Context {
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-10*time.Second))
		t.Cleanup(cancel)
	}
	return ctx
}

// measure builds the pool sz describes and measures it.
func measure(t *testing.T, sz size) figures {
	ctx := testCtx(t)
	fig := figures{size: sz}
	p := pooltest.Start(t, pooltest.Options{Hosts: sz.real})
	c := pooltest.NewClient(netip.Addr{})
	c.Timeout = time.Minute
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	vms := createVMs(t, ctx, p.Addr(0), s, sz.vms)
	fig.create = time.Since(start)
	t.Logf("%s: %d VMs made in %v", sz.name, sz.vms, fig.create)
	if sz.real > 1 {
		p.Join(t)
	}
	coord := p.Coordinator(t, 30*time.Second)
	addr, pid := p.Addr(coord), p.Hosts[coord].PID
	if s, err = p.Login(ctx, c, coord); err != nil {
		t.Fatal(err)
	}

	var farm *poolfarm.Farm
	if sz.light > 0 {
		farm, err = poolfarm.New(poolfarm.Options{Coordinator: p.Advertised(coord), Port: p.Port,
			Username: "root", Password: p.Password(), Hosts: sz.light})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = farm.Close() }) // before the daemons stop (cleanups run last first)
		start := time.Now()
		if err := farm.JoinAll(ctx, 1); err != nil {
			t.Fatal(err)
		}
		fig.joinTotal = time.Since(start)
		var times []time.Duration
		for _, h := range farm.Hosts {
			times = append(times, h.JoinTime)
			fig.snapshotBytes += h.SnapshotBytes.Load()
		}
		fig.joinP50, fig.joinP99 = pct(times, 50), pct(times, 99)
		t.Logf("%s: %d light hosts joined in %v", sz.name, sz.light, fig.joinTotal)
	}
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = p.WaitLive(lctx, sz.real+sz.light)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if farm != nil {
		checkFarm(t, ctx, c, addr, s, farm)
	}
	fig.coordinatorHostsSaw = len(list(t, ctx, c, addr, "host.get_all", s))

	// At rest: no client calls for the window.
	c.CloseIdle()
	time.Sleep(2 * time.Second)
	before := cpuTicks(t, pid)
	time.Sleep(sz.rest)
	fig.cpuRest = float64(cpuTicks(t, pid)-before) / clockTicks / sz.rest.Seconds() * 100
	fig.rss = testdaemon.RSS(pid)
	fig.testRSS = testdaemon.RSS(os.Getpid())

	fig.eventP50, fig.eventP99, fig.eventMax, fig.eventFromStart = eventLatency(t, ctx, p, coord, sz.writes)

	master := str(t, ctx, c, addr, "pool.get_master", s, only(t, list(t, ctx, c, addr, "pool.get_all", s)))
	real := map[string]bool{}
	for _, h := range list(t, ctx, c, addr, "host.get_all", s) {
		if p.IndexOf(str(t, ctx, c, addr, "host.get_address", s, h)) >= 0 {
			real[h] = true
		}
	}
	if len(real) != sz.real {
		t.Fatalf("%d real hosts in the pool's records, want %d", len(real), sz.real)
	}
	var starts []time.Duration
	for i := range sz.starts {
		vm := vms[i*len(vms)/sz.starts]
		t0 := time.Now()
		if _, err := c.Call(ctx, addr, "VM.start", s, vm, false, false); err != nil {
			t.Fatalf("VM.start %d: %v", i, err)
		}
		starts = append(starts, time.Since(t0))
		on := str(t, ctx, c, addr, "VM.get_resident_on", s, vm)
		if !real[on] {
			t.Errorf("VM.start placed a VM on %s, not a real host", on)
		}
		if on == master {
			fig.startOnCoordinator++
		}
		if _, err := c.Call(ctx, addr, "VM.hard_shutdown", s, vm); err != nil {
			t.Fatalf("VM.hard_shutdown %d: %v", i, err)
		}
	}
	fig.startP50, fig.startP99 = pct(starts, 50), pct(starts, 99)

	// Still every host live after all that.
	lctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	err = p.WaitLive(lctx, sz.real+sz.light)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	return fig
}

// checkFarm asserts what makes the light hosts real members: none votes,
// each heard from the leader lately, and each applies a new write.
func checkFarm(t *testing.T, ctx context.Context, c *pooltest.Client, addr, s string, farm *poolfarm.Farm) {
	t.Helper()
	before := make([]uint64, len(farm.Hosts))
	for i, h := range farm.Hosts {
		before[i] = h.AppliedIndex()
		if v, err := h.Voter(); err != nil || v {
			t.Errorf("light host %d: voter %v (%v)", i, v, err)
		}
		if since := time.Since(h.LastContact()); since > 5*time.Second {
			t.Errorf("light host %d last heard from the leader %v ago", i, since)
		}
	}
	pool := only(t, list(t, ctx, c, addr, "pool.get_all", s))
	if _, err := c.Call(ctx, addr, "pool.set_name_description", s, pool, "scale "+time.Now().String()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i, h := range farm.Hosts {
		for h.AppliedIndex() <= before[i] {
			if time.Now().After(deadline) {
				t.Fatalf("light host %d did not apply the write (index %d)", i, h.AppliedIndex())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// createVMs makes n VMs with 16 concurrent clients and returns their refs.
func createVMs(t *testing.T, ctx context.Context, addr, s string, n int) []string {
	t.Helper()
	const workers = 16
	refs := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := pooltest.NewClient(netip.Addr{})
			defer c.CloseIdle()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				ref, err := c.CallString(ctx, addr, "VM.create", s, testdaemon.VMRecord("scale-"+strconv.Itoa(i)))
				if err != nil {
					errs <- fmt.Errorf("VM.create %d: %w", i, err)
					return
				}
				refs[i] = ref
				if (i+1)%20000 == 0 {
					t.Logf("%d VMs made", i+1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return refs
}

// eventLatency is p50, p99 and max of write-to-event.from latency (see
// the package doc), on host i of p.
func eventLatency(t *testing.T, ctx context.Context, p *pooltest.Pool, i, writes int) (p50, p99, worst time.Duration, fromStart [2]time.Duration) {
	t.Helper()
	wc, ec := pooltest.NewClient(netip.Addr{}), pooltest.NewClient(netip.Addr{})
	wc.Originator, ec.Originator = "scale-writer", "scale-watcher"
	ec.Timeout = 40 * time.Second
	addr := p.Addr(i)
	ws, err := p.Login(ctx, wc, i)
	if err != nil {
		t.Fatal(err)
	}
	es, err := p.Login(ctx, ec, i)
	if err != nil {
		t.Fatal(err)
	}
	master := str(t, ctx, wc, addr, "pool.get_master", ws, only(t, list(t, ctx, wc, addr, "pool.get_all", ws)))
	dom0 := str(t, ctx, wc, addr, "host.get_control_domain", ws, master)
	const prefix = "scale-event-"
	if _, err := wc.Call(ctx, addr, "VM.set_name_description", ws, dom0, prefix+"0"); err != nil {
		t.Fatal(err)
	}
	// The token after that write, from the one object (event.from(['vm'],
	// "", 0) would send every VM).
	raw, err := ec.Call(ctx, addr, "event.from", es, []string{"vm/" + dom0}, "", 0.0)
	if err != nil {
		t.Fatal(err)
	}
	var first eventBatch
	if err := json.Unmarshal(raw, &first); err != nil || first.Token == "" {
		t.Fatalf("event.from: %.300s %v", raw, err)
	}
	started := make([]time.Time, writes+1)
	returned := make([]time.Time, writes+1)
	arrived := make([]time.Time, writes+1)
	done := make(chan error, 1)
	go func() {
		token, seen := first.Token, 0
		for seen < writes {
			raw, err := ec.Call(ctx, addr, "event.from", es, []string{"vm"}, token, 30.0)
			now := time.Now()
			if err != nil {
				done <- err
				return
			}
			var b eventBatch
			if err := json.Unmarshal(raw, &b); err != nil {
				done <- fmt.Errorf("event.from: %.300s: %w", raw, err)
				return
			}
			if len(b.Events) == 0 {
				done <- fmt.Errorf("event.from timed out after write %d", seen)
				return
			}
			token = b.Token
			for _, e := range b.Events {
				if n, err := strconv.Atoi(strings.TrimPrefix(e.Snapshot.NameDescription, prefix)); err == nil && n > seen && n <= writes {
					for k := seen + 1; k <= n; k++ {
						arrived[k] = now
					}
					seen = n
				}
			}
		}
		done <- nil
	}()
	time.Sleep(200 * time.Millisecond) // the watcher waits in event.from
	tick := time.NewTicker(10 * time.Millisecond)
	for n := 1; n <= writes; n++ {
		<-tick.C
		started[n] = time.Now()
		if _, err := wc.Call(ctx, addr, "VM.set_name_description", ws, dom0, prefix+strconv.Itoa(n)); err != nil {
			t.Fatal(err)
		}
		returned[n] = time.Now()
	}
	tick.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lat := make([]time.Duration, 0, writes)
	whole := make([]time.Duration, 0, writes)
	for n := 1; n <= writes; n++ {
		lat = append(lat, max(arrived[n].Sub(returned[n]), 0))
		whole = append(whole, arrived[n].Sub(started[n]))
	}
	return pct(lat, 50), pct(lat, 99), slices.Max(lat), [2]time.Duration{pct(whole, 50), pct(whole, 99)}
}

type eventBatch struct {
	Events []struct {
		Snapshot struct {
			NameDescription string `json:"name_description"`
		} `json:"snapshot"`
	} `json:"events"`
	Token string `json:"token"`
}

// pct is the p-th percentile of ds (sorted in place).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)*p/100, len(ds)-1)]
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times
// (100 on every Linux architecture this runs on).
const clockTicks = 100

func list(t *testing.T, ctx context.Context, c *pooltest.Client, addr, method string, params ...any) []string {
	t.Helper()
	raw, err := c.Call(ctx, addr, method, params...)
	var out []string
	if err == nil {
		err = json.Unmarshal(raw, &out)
	}
	if err != nil {
		t.Fatalf("%s: %.200s %v", method, raw, err)
	}
	return out
}

func str(t *testing.T, ctx context.Context, c *pooltest.Client, addr, method string, params ...any) string {
	t.Helper()
	v, err := c.CallString(ctx, addr, method, params...)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return v
}

func only(t *testing.T, refs []string) string {
	t.Helper()
	if len(refs) != 1 {
		t.Fatalf("want one, got %v", refs)
	}
	return refs[0]
}

// cpuTicks is testdaemon.CPUTicks, failing the test on an error.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := testdaemon.CPUTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
