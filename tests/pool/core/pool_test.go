// Package core is the pool's tier-2 test: three real toolstackd processes
// on loopback with a fault proxy on every peer link (internal/testkit/pooltest),
// joined into one pool, while clients read and write and the test kills,
// pauses and partitions hosts. Every history is checked by porcupine and
// against the final state (no acknowledged write lost). Beside the faults:
// joining, forwarding, emergency mode, ejection, secret rotation, xe's
// pool-join and the figures of the write path.
//
// The other pool suites are packages beside this one (tests/pool/...),
// each under four minutes on a quiet two-core machine so that go test runs
// them side by side; the steps they share are in tests/pool/suite.
//
// By default (CI, two cores) each fault test runs a few rounds, stopping
// when its budget runs out; TOOLSTACKD_LONG=1 runs the full 100
// coordinator kills and 100 partition/heal cycles (docs/testing.md).
package core

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// budget bounds a test's fault loop: a CI run stops starting rounds after
// failoverBound is the longest a test waits for the pool to make progress
// again after a fault, or for a coordinator to be found: failover takes
// about 2 s on a quiet machine (3 s at worst, docs/performance.md).
const failoverBound = 30 * time.Second

// it (so the test stays under 90 s); a long run has a larger one.
func budget() time.Duration {
	if suite.Long() {
		return 40 * time.Minute
	}
	return 45 * time.Second
}

// Three hosts join the first: it stays the coordinator, lists all three,
// and each member answers a login with HOST_IS_SLAVE naming it.
func TestJoinThree(t *testing.T) {
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	if c := p.Coordinator(t, 30*time.Second); c != 0 {
		t.Fatalf("coordinator is host %d after joining host 0", c)
	}
	c := pooltest.NewClient(netip.Addr{})
	for i := 1; i < p.Len(); i++ {
		_, err := p.Login(ctx, c, i)
		e, ok := testdaemon.AsError(err)
		if !ok || e.Code != "HOST_IS_SLAVE" || len(e.Params) != 1 || p.IndexOf(e.Params[0]) != 0 {
			t.Fatalf("login on member %d: %v", i, err)
		}
	}
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.Call(ctx, p.Addr(0), "host.get_all", s)
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	if err := json.Unmarshal(raw, &hosts); err != nil || len(hosts) != 3 {
		t.Fatalf("host.get_all: %s, %v", raw, err)
	}
	// host.address is where the other hosts reach each one: its proxy.
	seen := map[int]bool{}
	for _, h := range hosts {
		a, err := c.CallString(ctx, p.Addr(0), "host.get_address", s, h)
		if err != nil {
			t.Fatal(err)
		}
		i := p.IndexOf(a)
		if i < 0 || seen[i] {
			t.Fatalf("host %s has address %q (hosts %v)", h, a, hosts)
		}
		seen[i] = true
	}
}

// A write on the coordinator reaches every member's replica, read there
// with session.slave_local_login_with_password.
func TestWriteReachesEveryReplica(t *testing.T) {
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	w := &pooltest.Workload{Keys: 1}
	if err := w.Setup(ctx, p); err != nil {
		t.Fatal(err)
	}
	c := pooltest.NewClient(netip.Addr{})
	coor, s, err := p.FindCoordinator(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	ref := w.Ref(w.KeyNames()[0])
	want := fmt.Sprintf("replicated-%d", time.Now().UnixNano())
	if _, err := c.Call(ctx, p.Addr(coor), "VM.set_name_description", s, ref, want); err != nil {
		t.Fatal(err)
	}
	for i := range p.Len() {
		if i == coor {
			continue
		}
		ls, err := p.LocalLogin(ctx, c, i)
		if err != nil {
			t.Fatalf("slave_local_login on host %d: %v", i, err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := c.CallString(ctx, p.Addr(i), "VM.get_name_description", ls, ref)
			if err == nil && got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("host %d's replica: %q, %v; want %q", i, got, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitProgress waits until the run has n more acknowledged operations, or
// d has passed; it reports whether it got them.
func waitProgress(run *pooltest.Run, n int64, d time.Duration) bool {
	target := run.Acked() + n
	deadline := time.Now().Add(d)
	for run.Acked() < target {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// finish stops the workload, heals everything, waits for every host to be
// live again, reads the final state and checks the history.
func finish(t *testing.T, ctx context.Context, p *pooltest.Pool, w *pooltest.Workload, run *pooltest.Run) {
	t.Helper()
	st := run.Stop()
	t.Logf("workload: %v", st)
	if p.Link != nil {
		p.Link.HealAll()
	}
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, p.Len()); err != nil {
		t.Errorf("after the faults: %v", err)
	}
	fctx, cancel2 := context.WithTimeout(ctx, failoverBound)
	defer cancel2()
	final, err := w.Final(fctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.AckedPuts == 0 {
		t.Errorf("no write was acknowledged: %v", st)
	}
	w.Check(t, final, time.Minute)
}

// underWorkload starts a joined pool of three and the workload on it (4
// clients, 8 keys).
func underWorkload(t *testing.T) (context.Context, *pooltest.Pool, *pooltest.Workload, *pooltest.Run) {
	t.Helper()
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	w := &pooltest.Workload{Clients: 4, Keys: 8, OpTimeout: 5 * time.Second}
	if err := w.Setup(ctx, p); err != nil {
		t.Fatal(err)
	}
	return ctx, p, w, w.Start(ctx)
}

// The coordinator is killed with SIGKILL under the workload, again and
// again; another host takes over, the killed one comes back as a member.
func TestCoordinatorKill(t *testing.T) {
	ctx, p, w, run := underWorkload(t)
	n, start := suite.Rounds(2, 100), time.Now()
	done := 0
	for ; done < n && time.Since(start) < budget(); done++ {
		if !waitProgress(run, 50, failoverBound) {
			t.Errorf("round %d: no progress before the kill", done)
			break
		}
		c := p.Coordinator(t, failoverBound)
		killed := time.Now()
		p.Kill(c)
		if !waitProgress(run, 1, failoverBound) {
			t.Errorf("round %d: no acknowledged operation within 20 s of killing coordinator %d", done, c)
			break
		}
		t.Logf("round %d: killed host %d, first acknowledged operation after %v", done, c, time.Since(killed).Round(time.Millisecond))
		p.Restart(c)
		lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
		err := p.WaitLive(lctx, p.Len())
		cancel()
		if err != nil {
			t.Errorf("round %d: host %d back: %v", done, c, err)
			break
		}
	}
	t.Logf("%d coordinator kills in %v", done, time.Since(start).Round(time.Millisecond))
	finish(t, ctx, p, w, run)
}

// The coordinator is frozen (SIGSTOP) under the workload and thawed
// later: the others take over meanwhile, and the thawed one, a deposed
// coordinator with calls in flight, must not have acknowledged anything
// it then loses.
func TestCoordinatorPause(t *testing.T) {
	ctx, p, w, run := underWorkload(t)
	n, start := suite.Rounds(2, 20), time.Now()
	for round := 0; round < n && time.Since(start) < budget(); round++ {
		waitProgress(run, 50, failoverBound)
		c := p.Coordinator(t, failoverBound)
		if err := p.Stop(c); err != nil {
			t.Fatal(err)
		}
		ok := waitProgress(run, 20, failoverBound)
		if err := p.Cont(c); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("round %d: no progress while coordinator %d was frozen", round, c)
			break
		}
	}
	finish(t, ctx, p, w, run)
}

// The coordinator is cut off from the other hosts (a blackhole on every
// peer link, the clients still reaching every host) and the partition is
// healed while the clients write, cycle after cycle.
func TestPartitionHeal(t *testing.T) {
	ctx, p, w, run := underWorkload(t)
	n, start := suite.Rounds(3, 100), time.Now()
	done := 0
	for ; done < n && time.Since(start) < budget(); done++ {
		waitProgress(run, 30, failoverBound)
		c := p.Coordinator(t, failoverBound)
		if err := p.Link.Isolate(pooltest.Name(c)); err != nil {
			t.Fatal(err)
		}
		// The majority side elects a coordinator and takes writes.
		if !waitProgress(run, 20, failoverBound) {
			t.Errorf("cycle %d: no progress with host %d isolated", done, c)
		}
		// Heal while the clients write.
		p.Link.HealAll()
		if !waitProgress(run, 20, failoverBound) {
			t.Errorf("cycle %d: no progress after healing", done)
			break
		}
	}
	t.Logf("%d partition/heal cycles in %v", done, time.Since(start).Round(time.Millisecond))
	finish(t, ctx, p, w, run)
}
