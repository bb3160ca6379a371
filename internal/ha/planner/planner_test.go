package planner

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

const gib = int64(1) << 30

// tvm is a test VM: a name and a size in GiB, protected unless said.
type tvm struct {
	name string
	gib  int64
}

// thost is a test host: total memory in GiB and the VMs resident on it.
type thost struct {
	name  string
	total int64
	vms   []tvm
}

// mkPool builds a pool as xapi's HA tests do: every host live, its free
// memory its total less its resident VMs, every VM protected and agile.
func mkPool(hosts ...thost) Pool {
	var p Pool
	for _, h := range hosts {
		free := h.total * gib
		for _, v := range h.vms {
			free -= v.gib * gib
			p.VMs = append(p.VMs, VM{ID: v.name, Memory: v.gib * gib, Host: h.name, Priority: PriorityRestart})
		}
		p.Hosts = append(p.Hosts, Host{ID: h.name, FreeMemory: free, Live: true})
	}
	return p
}

// From xapi's test_ha_vm_failover.ml, PlanForNFailures: two 256 GiB
// hosts, one failure to tolerate.
func TestPlanForNFailures(t *testing.T) {
	cases := []struct {
		name string
		pool Pool
		want Status
		// wantApprox is the approximate planner's answer, more
		// conservative: it assumes the emptiest host fails.
		wantApprox Status
	}{
		{"two hosts, no VMs",
			mkPool(thost{"master", 256, nil}, thost{"slave", 256, nil}),
			PlanExistsForAllVMs, PlanExistsForAllVMs},
		{"one VM of just under half a host",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}}}, thost{"slave", 256, nil}),
			PlanExistsForAllVMs, PlanExistsForAllVMs},
		{"two VMs filling most of one host",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}, {"vm2", 120}}}, thost{"slave", 256, nil}),
			PlanExistsForAllVMs, NoPlanExists},
		{"overcommitted",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}, {"vm2", 120}}}, thost{"slave", 256, []tvm{{"vm3", 120}, {"vm4", 120}}}),
			NoPlanExists, NoPlanExists},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, force := range []bool{false, true} {
				res, err := PlanExists(context.Background(), tc.pool, 1, Options{ForceApproximate: force})
				if err != nil {
					t.Fatal(err)
				}
				want := tc.want
				if force {
					want = tc.wantApprox
				}
				if res.Status != want {
					t.Errorf("approximate=%v: got %v, want %v", force, res.Status, want)
				}
				if !force && res.Heuristic != Exhaustive {
					t.Errorf("heuristic %v, want exhaustive for 2 hosts", res.Heuristic)
				}
			}
		})
	}
}

// From AssertNewVMPreservesHAPlan: a new 120 GiB protected VM is started.
func TestAssertNewVMPreservesHAPlan(t *testing.T) {
	newVM := VM{ID: "new", Memory: 120 * gib, Priority: PriorityRestart}
	cases := []struct {
		name   string
		pool   Pool
		break_ bool
	}{
		{"room for it",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}}}, thost{"slave", 256, nil}), false},
		{"no room after a failure",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}, {"vm2", 120}}}, thost{"slave", 256, nil}), true},
		{"already overcommitted: never refused",
			mkPool(thost{"master", 256, []tvm{{"vm1", 120}, {"vm2", 120}}}, thost{"slave", 256, []tvm{{"vm3", 120}}}), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := CheckChange(context.Background(), tc.pool, Change{SetVMs: []VM{newVM}}, 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if v.WouldBreak != tc.break_ {
				t.Fatalf("WouldBreak = %v (before %v, after %v), want %v", v.WouldBreak, v.Before.Status, v.After.Status, tc.break_)
			}
			if err := v.Err(); (err != nil) != tc.break_ || (err != nil && !errors.Is(err, ErrWouldBreakPlan)) {
				t.Fatalf("Err() = %v", err)
			}
		})
	}
}

// From ComputeMaxFailures, with the cluster's quorum as the limit.
func TestComputeMaxFailures(t *testing.T) {
	three := mkPool(thost{"master", 256, nil}, thost{"slave1", 256, nil}, thost{"slave2", 256, nil})
	two := mkPool(thost{"master", 256, nil}, thost{"slave1", 256, nil})
	cases := []struct {
		name  string
		pool  Pool
		limit int
		want  int
	}{
		{"three voters", three, QuorumLimit(3, 0), 1},
		{"two voters", two, QuorumLimit(2, 0), 0},
		{"one voter of two hosts", two, QuorumLimit(1, 1), 1},
		{"no limit: every host", three, -1, 3},
		{"five voters", mkPool(thost{"a", 8, nil}, thost{"b", 8, nil}, thost{"c", 8, nil}, thost{"d", 8, nil}, thost{"e", 8, nil}), QuorumLimit(5, 0), 2},
		{"memory bound below quorum",
			mkPool(thost{"a", 10, []tvm{{"v1", 6}}}, thost{"b", 10, []tvm{{"v2", 6}}}, thost{"c", 10, []tvm{{"v3", 6}}},
				thost{"d", 10, nil}, thost{"e", 10, nil}), QuorumLimit(5, 0), 2},
		{"memory bound: one spare host",
			mkPool(thost{"a", 10, []tvm{{"v1", 6}}}, thost{"b", 10, []tvm{{"v2", 6}}}, thost{"c", 10, []tvm{{"v3", 6}}},
				thost{"d", 10, nil}), -1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MaxFailuresTolerated(context.Background(), tc.pool, tc.limit, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestQuorumLimit(t *testing.T) {
	for _, tc := range []struct{ voters, non, want int }{
		{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {3, 0, 1}, {4, 0, 1}, {5, 0, 2}, {7, 0, 3}, {1, 1, 1}, {3, 2, 3}, {-1, -1, 0},
	} {
		if got := QuorumLimit(tc.voters, tc.non); got != tc.want {
			t.Errorf("QuorumLimit(%d, %d) = %d, want %d", tc.voters, tc.non, got, tc.want)
		}
	}
}

// The rule of binpack.ml's choose_heuristic.
func TestChooseHeuristic(t *testing.T) {
	for _, tc := range []struct {
		n, r int
		want Heuristic
	}{
		{1, 0, Exhaustive}, {2, 1, Exhaustive}, {32, 1, Exhaustive}, {33, 1, Approximate},
		{64, 1, Approximate}, {32, 2, Exhaustive}, {32, 3, Approximate}, {16, 3, Exhaustive},
		{16, 4, Approximate}, {10, 3, Exhaustive}, {8, 5, Approximate}, {7, 4, Exhaustive},
		{15, 3, Exhaustive}, {30, 20, Approximate}, {32, 32, Approximate}, {3, 3, Exhaustive},
		{4, 5, Approximate}, {6, 6, Exhaustive}, {7, 7, Approximate},
	} {
		if got := ChooseHeuristic(tc.n, tc.r); got != tc.want {
			t.Errorf("ChooseHeuristic(%d, %d) = %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
}

// checkPlan is binpack_test.ml's check_plan made stricter: no VM on a
// failed or dead host or a host it may not run on, no host given more
// than its free memory, every failed VM placed.
func checkPlan(pool Pool, failed []string, plan map[string]string, wantAll []string) error {
	hosts := map[string]Host{}
	for _, h := range pool.Hosts {
		hosts[h.ID] = h
	}
	vms := map[string]VM{}
	for _, v := range pool.VMs {
		vms[v.ID] = v
	}
	used := map[string]int64{}
	for vm, h := range plan {
		host, ok := hosts[h]
		if !ok || !host.Live || slices.Contains(failed, h) {
			return fmt.Errorf("VM %s on failed or dead host %q", vm, h)
		}
		if v := vms[vm]; v.Hosts != nil && !slices.Contains(v.Hosts, h) {
			return fmt.Errorf("VM %s on %s, which it may not run on", vm, h)
		}
		used[h] += vms[vm].Memory
	}
	for h, u := range used {
		if u > hosts[h].FreeMemory {
			return fmt.Errorf("host %s given %d with %d free", h, u, hosts[h].FreeMemory)
		}
	}
	for _, vm := range wantAll {
		if _, ok := plan[vm]; !ok {
			return fmt.Errorf("VM %s not restarted", vm)
		}
	}
	return nil
}

// binpack_test.ml: an obviously bad plan (two 1-unit VMs onto one
// 1-unit host) must be detected by the checker.
func TestCheckPlanDetectsBadPlan(t *testing.T) {
	pool := Pool{
		Hosts: []Host{{ID: "h0", FreeMemory: 1, Live: true}, {ID: "h1", FreeMemory: 1, Live: true}},
		VMs:   []VM{{ID: "v0", Memory: 1, Host: "h1", Priority: PriorityRestart}, {ID: "v1", Memory: 1, Host: "h1", Priority: PriorityRestart}},
	}
	bad := map[string]string{"v0": "h0", "v1": "h0"}
	if err := checkPlan(pool, []string{"h1"}, bad, []string{"v0", "v1"}); err == nil {
		t.Fatal("bad plan not detected")
	}
	if err := checkPlan(pool, []string{"h1"}, map[string]string{"v0": "h1"}, nil); err == nil {
		t.Fatal("plan onto a failed host not detected")
	}
	if err := checkPlan(pool, []string{"h1"}, map[string]string{"v0": "h0"}, []string{"v0", "v1"}); err == nil {
		t.Fatal("incomplete plan not detected")
	}
	// The planner itself: only one fits.
	plan, err := FailoverPlan(pool, []string{"h1"}, []string{"v0", "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if plan[0].Host != "h0" || plan[1].Reason != NoMemory {
		t.Fatalf("plan %+v", plan)
	}
}

func planMap(pls []Placement) map[string]string {
	m := map[string]string{}
	for _, p := range pls {
		if p.Host != "" {
			m[p.VM] = p.Host
		}
	}
	return m
}

// combinations calls f with every k-subset of xs.
func combinations(xs []string, k int, f func([]string)) {
	var rec func(start int, cur []string)
	rec = func(start int, cur []string) {
		if len(cur) == k {
			f(slices.Clone(cur))
			return
		}
		for i := start; i < len(xs); i++ {
			rec(i+1, append(cur, xs[i]))
		}
	}
	rec(0, nil)
}

func failedVMs(pool Pool, failed []string) []string {
	var out []string
	for _, v := range pool.VMs {
		if slices.Contains(failed, v.Host) {
			out = append(out, v.ID)
		}
	}
	return out
}

// binpack_test.ml's impossible case: 8 hosts of 500 units, one VM of 400
// on each, 5 failures: both heuristics say no, and a counterexample
// exists among the specific plans.
func TestImpossibleCase(t *testing.T) {
	var pool Pool
	var ids []string
	for i := range 8 {
		h := fmt.Sprintf("h%d", i)
		ids = append(ids, h)
		pool.Hosts = append(pool.Hosts, Host{ID: h, FreeMemory: 500, Live: true})
		pool.VMs = append(pool.VMs, VM{ID: fmt.Sprintf("v%d", i), Memory: 400, Host: h, Priority: PriorityRestart})
	}
	ix, err := validate(pool)
	if err != nil {
		t.Fatal(err)
	}
	c := prepare(ix).cfg
	if c.approximate(5) {
		t.Error("approximate planner says a plan exists")
	}
	if ok, _, err := c.exhaustive(context.Background(), 5, -1); ok || err != nil {
		t.Errorf("exhaustive planner says %v, %v", ok, err)
	}
	if ChooseHeuristic(8, 5) != Approximate {
		t.Error("8 hosts, 5 failures should choose the approximation")
	}
	res, err := PlanExists(context.Background(), pool, 5, Options{})
	if err != nil || res.Status != NoPlanExists {
		t.Fatalf("PlanExists = %+v, %v", res, err)
	}
	found := false
	combinations(ids, 5, func(failed []string) {
		pls, err := FailoverPlan(pool, failed, failedVMs(pool, failed))
		if err != nil {
			t.Fatal(err)
		}
		if checkPlan(pool, failed, planMap(pls), failedVMs(pool, failed)) != nil {
			found = true
		}
	})
	if !found {
		t.Fatal("no counterexample found")
	}
}

// binpack_test.ml's possible case: 10 hosts of 500 to 1,500 units, 5 VMs
// of 256 placed at random, 3 failures: always possible, and every
// specific plan for 3 failed hosts is complete and valid.
func TestPossibleCase(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var pool Pool
		var ids []string
		for i := range 10 {
			h := fmt.Sprintf("h%d", i)
			ids = append(ids, h)
			pool.Hosts = append(pool.Hosts, Host{ID: h, FreeMemory: 500 + rng.Int64N(1000), Live: true})
		}
		for i := range 5 {
			pool.VMs = append(pool.VMs, VM{ID: fmt.Sprintf("v%d", i), Memory: 256, Host: ids[rng.IntN(10)], Priority: PriorityRestart})
		}
		res, err := PlanExists(context.Background(), pool, 3, Options{})
		if err != nil || res.Status != PlanExistsForAllVMs || res.Heuristic != Exhaustive {
			t.Fatalf("seed %d: %+v, %v", seed, res, err)
		}
		combinations(ids, 3, func(failed []string) {
			pls, err := FailoverPlan(pool, failed, failedVMs(pool, failed))
			if err != nil {
				t.Fatal(err)
			}
			if err := checkPlan(pool, failed, planMap(pls), failedVMs(pool, failed)); err != nil {
				t.Fatalf("seed %d, failed %v: %v", seed, failed, err)
			}
		})
	}
}

// The tie-breaking of xapi's sorted-list insertion: the host just packed
// into goes before hosts with as much free memory.
func TestBiggestFitDecreasingOrder(t *testing.T) {
	pool := Pool{
		Hosts: []Host{{ID: "a", FreeMemory: 10, Live: true}, {ID: "b", FreeMemory: 10, Live: true}, {ID: "dead", FreeMemory: 100}},
		VMs: []VM{
			{ID: "x", Memory: 4, Host: "dead", Priority: PriorityRestart},
			{ID: "y", Memory: 4, Host: "dead", Priority: PriorityRestart},
			{ID: "z", Memory: 4, Host: "dead", Priority: PriorityRestart},
			{ID: "big", Memory: 11, Host: "dead", Priority: PriorityRestart},
			{ID: "tiny", Memory: 1, Host: "dead", Priority: PriorityRestart},
		},
	}
	pls, err := FailoverPlan(pool, nil, []string{"x", "y", "z", "big", "tiny"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range pls {
		got[p.VM] = p.Host
	}
	// big does not fit and is skipped; x→a, y→b, z→b (b re-inserted last
	// among the equals), tiny→a (a 6 vs b 2).
	want := map[string]string{"x": "a", "y": "b", "z": "b", "big": "", "tiny": "a"}
	for vm, h := range want {
		if got[vm] != h {
			t.Errorf("%s → %q, want %q (plan %v)", vm, got[vm], h, got)
		}
	}
	if pls[3].Reason != NoMemory {
		t.Errorf("big: reason %v", pls[3].Reason)
	}
}

func TestNonAgile(t *testing.T) {
	base := func() Pool {
		return Pool{
			Hosts: []Host{{ID: "a", FreeMemory: 100, Live: true}, {ID: "b", FreeMemory: 100, Live: true}, {ID: "c", FreeMemory: 100, Live: true}},
			VMs: []VM{
				{ID: "agile", Memory: 10, Host: "a", Priority: PriorityRestart},
				{ID: "local", Memory: 10, Host: "b", Priority: PriorityRestart, Hosts: []string{"b"}},
			},
		}
	}
	ctx := context.Background()
	res, err := PlanExists(ctx, base(), 1, Options{})
	if err != nil || res.Status != PlanExistsExcludingNonAgileVMs {
		t.Fatalf("running non-agile VM: %+v, %v", res, err)
	}
	n, err := MaxFailuresTolerated(ctx, base(), -1, Options{})
	if err != nil || n != 0 {
		t.Fatalf("max failures with a non-agile VM = %d, %v; want 0", n, err)
	}
	// Offline (its host died): xapi counts it as not restarted.
	p := base()
	p.Hosts[1].Live = false
	if res, _ := PlanExists(ctx, p, 0, Options{}); res.Status != NoPlanExists {
		t.Fatalf("offline non-agile VM: %v", res.Status)
	}
	// Agile by the brief's rule: every host but its own.
	p = base()
	p.VMs[1].Hosts = []string{"a", "c"}
	if res, _ := PlanExists(ctx, p, 1, Options{}); res.Status != PlanExistsForAllVMs {
		t.Fatalf("VM allowed everywhere else: %v", res.Status)
	}
	// ha_compute_vm_failover_plan: the local VM cannot go anywhere live.
	pls, err := FailoverPlan(base(), []string{"b"}, []string{"local", "agile"})
	if err != nil || pls[0].Reason != NotAgile || pls[1].Host == "" {
		t.Fatalf("failover plan %+v, %v", pls, err)
	}
	// A non-agile VM allowed on two hosts goes to a live one of them.
	p = base()
	p.VMs[1].Hosts = []string{"b", "c"}
	p.VMs[1].Host = ""
	pls, err = FailoverPlan(p, []string{"b"}, []string{"local"})
	if err != nil || pls[0].Host != "c" {
		t.Fatalf("failover plan %+v, %v", pls, err)
	}
	// Restart order: pinned to its first allowed host, b, which is dead.
	ro, err := RestartOrder(base(), []string{"b"})
	if err != nil || ro.Complete || len(ro.Restarts) != 1 || ro.Restarts[0].Host != "" {
		t.Fatalf("restart order %+v, %v", ro, err)
	}
}

func TestOfflineProtectedVMsArePlacedFirst(t *testing.T) {
	// Two halted protected VMs must fit before failures are considered.
	pool := mkPool(thost{"a", 16, nil}, thost{"b", 16, nil})
	pool.VMs = append(pool.VMs,
		VM{ID: "h1", Memory: 10 * gib, Priority: PriorityRestart},
		VM{ID: "h2", Memory: 10 * gib, Priority: PriorityRestart})
	ctx := context.Background()
	if res, _ := PlanExists(ctx, pool, 0, Options{}); res.Status != PlanExistsForAllVMs {
		t.Fatalf("r=0: %v", res.Status)
	}
	if res, _ := PlanExists(ctx, pool, 1, Options{}); res.Status != NoPlanExists {
		t.Fatalf("r=1: %v", res.Status)
	}
	pool.VMs = append(pool.VMs, VM{ID: "h3", Memory: 10 * gib, Priority: PriorityRestart})
	if res, _ := PlanExists(ctx, pool, 0, Options{}); res.Status != NoPlanExists || res.Heuristic != Trivial {
		t.Fatalf("three halted VMs on two hosts: %+v", res)
	}
}

func TestCheckChange(t *testing.T) {
	ctx := context.Background()
	pool := func() Pool {
		return mkPool(thost{"master", 256, []tvm{{"vm1", 120}}}, thost{"slave", 256, nil})
	}
	two := 2
	zero := 0
	cases := []struct {
		name   string
		change Change
		break_ bool
	}{
		{"nothing", Change{}, false},
		{"memory increase that still fits", Change{SetVMs: []VM{{ID: "vm1", Memory: 200 * gib, Host: "master", Priority: PriorityRestart}}}, false},
		{"memory increase beyond any host", Change{SetVMs: []VM{{ID: "vm1", Memory: 260 * gib, Host: "master", Priority: PriorityRestart}}}, true},
		{"host disable", Change{DisableHosts: []string{"slave"}}, true},
		{"migration", Change{SetVMs: []VM{{ID: "vm1", Memory: 120 * gib, Host: "slave", Priority: PriorityRestart}}}, false},
		{"start on master, fits after a failure", Change{SetVMs: []VM{{ID: "new", Memory: 120 * gib, Host: "master", Priority: PriorityRestart}}}, false},
		{"start on master, does not", Change{SetVMs: []VM{{ID: "new", Memory: 140 * gib, Host: "master", Priority: PriorityRestart}}}, true},
		{"start anywhere", Change{SetVMs: []VM{{ID: "new", Memory: 140 * gib, Priority: PriorityRestart}}}, true},
		{"start anywhere, small", Change{SetVMs: []VM{{ID: "new", Memory: 16 * gib, Priority: PriorityRestart}}}, false},
		{"shutdown", Change{RemoveVMs: []string{"vm1"}}, false},
		{"more failures than hosts allow", Change{Failures: &two}, true},
		{"fewer failures", Change{Failures: &zero}, false},
		{"unprotect", Change{SetVMs: []VM{{ID: "vm1", Memory: 120 * gib, Host: "master"}}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := CheckChange(ctx, pool(), tc.change, 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if v.Before.Status != PlanExistsForAllVMs {
				t.Fatalf("before: %v", v.Before.Status)
			}
			if v.WouldBreak != tc.break_ {
				t.Fatalf("WouldBreak %v (after %v), want %v", v.WouldBreak, v.After.Status, tc.break_)
			}
		})
	}
	// Setting a restart priority on a running VM: its memory is already
	// on its host, so protection alone costs nothing extra.
	p := mkPool(thost{"a", 100, []tvm{{"v", 60}}}, thost{"b", 100, nil})
	p.VMs[0].Priority = PriorityNone
	v, err := CheckChange(ctx, p, Change{SetVMs: []VM{{ID: "v", Memory: 60 * gib, Host: "a", Priority: PriorityRestart}}}, 1, Options{})
	if err != nil || v.WouldBreak || v.After.Status != PlanExistsForAllVMs {
		t.Fatalf("protect running VM: %+v, %v", v, err)
	}
	// Hostile changes.
	for _, ch := range []Change{
		{DisableHosts: []string{"nope"}},
		{RemoveVMs: []string{"nope"}},
		{SetVMs: []VM{{ID: "x", Memory: -1}}},
		{SetVMs: []VM{{ID: "x", Host: "nope"}}},
		{SetVMs: []VM{{ID: "x"}, {ID: "x"}}},
		{SetVMs: []VM{{ID: "vm1"}}, RemoveVMs: []string{"vm1"}},
		{SetVMs: []VM{{ID: "x", Priority: "always"}}},
	} {
		if _, err := CheckChange(ctx, pool(), ch, 1, Options{}); err == nil {
			t.Errorf("change %+v accepted", ch)
		}
	}
}

func TestHypothetical(t *testing.T) {
	ctx := context.Background()
	pool := mkPool(thost{"master", 256, []tvm{{"vm1", 120}, {"vm2", 120}}}, thost{"slave", 256, []tvm{{"vm3", 120}, {"vm4", 120}}})
	for i := range pool.VMs {
		pool.VMs[i].Priority = PriorityNone
	}
	for _, tc := range []struct {
		conf map[string]Priority
		want int
	}{
		{map[string]Priority{}, 2},
		{map[string]Priority{"vm1": PriorityBestEffort, "vm3": PriorityNone}, 2},
		{map[string]Priority{"vm1": PriorityRestart}, 0},
	} {
		got, err := HypotheticalMaxFailures(ctx, pool, tc.conf, -1, Options{})
		if err != nil || got != tc.want {
			t.Errorf("%v: got %d, %v; want %d", tc.conf, got, err, tc.want)
		}
	}
	if _, err := HypotheticalMaxFailures(ctx, pool, map[string]Priority{"vm1": "always"}, -1, Options{}); !errors.Is(err, ErrInvalidPriority) {
		t.Errorf("invalid priority: %v", err)
	}
	if _, err := HypotheticalMaxFailures(ctx, pool, map[string]Priority{"ghost": PriorityRestart}, -1, Options{}); !errors.Is(err, ErrUnknownVM) {
		t.Errorf("unknown VM: %v", err)
	}
	// The pool's own priorities are unchanged by the call.
	if pool.VMs[0].Priority != PriorityNone {
		t.Error("input modified")
	}
}

func TestRestartOrder(t *testing.T) {
	pool := Pool{
		Hosts: []Host{{ID: "dead", FreeMemory: 0}, {ID: "a", FreeMemory: 20, Live: true}, {ID: "b", FreeMemory: 12, Live: true}},
		VMs: []VM{
			{ID: "p-neg", Memory: 2, Host: "dead", Priority: PriorityRestart, Order: -1},
			{ID: "p2", Memory: 4, Host: "dead", Priority: PriorityRestart, Order: 2},
			{ID: "p0b", Memory: 4, Host: "dead", Priority: PriorityRestart, Order: 0},
			{ID: "p0a", Memory: 8, Host: "dead", Priority: PriorityRestart, Order: 0},
			{ID: "running", Memory: 4, Host: "a", Priority: PriorityRestart},
			{ID: "halted", Memory: 2, Priority: PriorityRestart, Order: 2},
			{ID: "be1", Memory: 6, Host: "dead", Priority: PriorityBestEffort, Order: 1},
			{ID: "be-big", Memory: 50, Host: "dead", Priority: PriorityBestEffort},
			{ID: "be-elsewhere", Memory: 1, Host: "a", Priority: PriorityBestEffort},
			{ID: "none", Memory: 1, Host: "dead"},
		},
	}
	ro, err := RestartOrder(pool, []string{"dead"})
	if err != nil {
		t.Fatal(err)
	}
	if !ro.Complete {
		t.Fatalf("plan incomplete: %+v", ro)
	}
	type row struct {
		vm   string
		wave int
	}
	var got []row
	plan := map[string]string{}
	for _, r := range ro.Restarts {
		got = append(got, row{r.VM, r.Wave})
		if r.Host != "" {
			plan[r.VM] = r.Host
		}
	}
	want := []row{{"p0a", 0}, {"p0b", 0}, {"halted", 1}, {"p2", 1}, {"p-neg", 2}, {"be-big", 3}, {"be1", 4}}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if plan["be-big"] != "" {
		t.Error("best-effort VM larger than any host got a host")
	}
	if plan["be1"] == "" {
		t.Error("best-effort VM that fits got no host")
	}
	if err := checkPlan(pool, []string{"dead"}, plan, []string{"p-neg", "p2", "p0a", "p0b", "halted"}); err != nil {
		t.Fatal(err)
	}
}

func TestHostileInput(t *testing.T) {
	ctx := context.Background()
	ok := Host{ID: "h", FreeMemory: 1, Live: true}
	cases := []struct {
		name string
		pool Pool
		want error
	}{
		{"empty host ID", Pool{Hosts: []Host{{}}}, ErrInvalidInput},
		{"duplicate host", Pool{Hosts: []Host{ok, ok}}, ErrInvalidInput},
		{"huge free memory", Pool{Hosts: []Host{{ID: "h", FreeMemory: MaxMemory + 1}}}, ErrInvalidInput},
		{"empty VM ID", Pool{Hosts: []Host{ok}, VMs: []VM{{}}}, ErrInvalidInput},
		{"duplicate VM", Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v"}, {ID: "v"}}}, ErrInvalidInput},
		{"negative memory", Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v", Memory: -1}}}, ErrInvalidInput},
		{"unknown resident host", Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v", Host: "x"}}}, ErrUnknownHost},
		{"unknown allowed host", Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v", Hosts: []string{"x"}}}}, ErrUnknownHost},
		{"bad priority", Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v", Priority: "sometimes"}}}, ErrInvalidPriority},
		{"too many hosts", Pool{Hosts: make([]Host, MaxHosts+1)}, ErrInvalidInput},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := PlanExists(ctx, tc.pool, 0, Options{}); !errors.Is(err, tc.want) {
				t.Errorf("PlanExists: %v, want %v", err, tc.want)
			}
			if _, err := MaxFailuresTolerated(ctx, tc.pool, -1, Options{}); !errors.Is(err, tc.want) {
				t.Errorf("MaxFailuresTolerated: %v", err)
			}
			if _, err := FailoverPlan(tc.pool, nil, nil); !errors.Is(err, tc.want) {
				t.Errorf("FailoverPlan: %v", err)
			}
			if _, err := RestartOrder(tc.pool, nil); !errors.Is(err, tc.want) {
				t.Errorf("RestartOrder: %v", err)
			}
		})
	}
	good := Pool{Hosts: []Host{ok}, VMs: []VM{{ID: "v", Host: "h", Priority: PriorityRestart}}}
	if _, err := PlanExists(ctx, good, -1, Options{}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("negative r: %v", err)
	}
	if res, err := PlanExists(ctx, good, 5, Options{}); err != nil || res.Status != NoPlanExists {
		t.Errorf("r beyond the hosts: %+v, %v", res, err)
	}
	if _, err := FailoverPlan(good, []string{"x"}, nil); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("unknown failed host: %v", err)
	}
	if _, err := FailoverPlan(good, nil, []string{"x"}); !errors.Is(err, ErrUnknownVM) {
		t.Errorf("unknown failed VM: %v", err)
	}
	if _, err := FailoverPlan(good, nil, []string{"v", "v"}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("duplicate failed VM: %v", err)
	}
	if _, err := RestartOrder(good, []string{"x"}); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("unknown failed host: %v", err)
	}
	// Zero-sized VMs: the approximation does not divide by zero.
	zero := Pool{Hosts: []Host{ok, {ID: "g", Live: true}}, VMs: []VM{{ID: "v", Host: "h", Priority: PriorityRestart}}}
	if res, err := PlanExists(ctx, zero, 1, Options{ForceApproximate: true}); err != nil || res.Status != PlanExistsForAllVMs {
		t.Errorf("zero-sized VM: %+v, %v", res, err)
	}
}

// bigPool is the benchmark's shape: hosts of hostGiB, VMs of 1 to 16
// GiB spread round-robin.
func bigPool(hosts, vms int, hostGiB int64, seed uint64) Pool {
	rng := rand.New(rand.NewPCG(seed, 7))
	var p Pool
	for i := range hosts {
		p.Hosts = append(p.Hosts, Host{ID: fmt.Sprintf("host-%03d", i), FreeMemory: hostGiB * gib, Live: true})
	}
	for i := range vms {
		h := i % hosts
		m := (1 + rng.Int64N(16)) * gib
		p.Hosts[h].FreeMemory -= m
		p.VMs = append(p.VMs, VM{ID: fmt.Sprintf("vm-%04d", i), Memory: m, Host: p.Hosts[h].ID, Priority: PriorityRestart, Order: rng.Int64N(4)})
	}
	return p
}

func TestBudgetAndCancel(t *testing.T) {
	pool := bigPool(16, 1000, 1024, 1)
	res, err := PlanExists(context.Background(), pool, 3, Options{Budget: 100})
	if err != nil || !res.BudgetExceeded || res.Heuristic != Approximate {
		t.Fatalf("budget: %+v, %v", res, err)
	}
	full, err := PlanExists(context.Background(), pool, 3, Options{Budget: -1})
	if err != nil || full.Heuristic != Exhaustive || full.BudgetExceeded {
		t.Fatalf("unbounded: %+v, %v", full, err)
	}
	t.Logf("16 hosts, 1000 VMs, r=3: %v by %v in %d steps", full.Status, full.Heuristic, full.Steps)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := PlanExists(ctx, pool, 3, Options{Budget: -1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	if _, err := MaxFailuresTolerated(ctx, pool, -1, Options{Budget: -1}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// The exhaustive and approximate planners agree with a brute force on
// small random pools where they must: whenever the approximation finds
// a plan, the exhaustive search does too (the approximation is the more
// conservative of the two).
func TestApproximateIsConservative(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 3))
		n := 2 + rng.IntN(5)
		var p Pool
		for i := range n {
			p.Hosts = append(p.Hosts, Host{ID: fmt.Sprintf("h%d", i), FreeMemory: rng.Int64N(40), Live: true})
		}
		for i := range rng.IntN(12) {
			h := rng.IntN(n)
			m := 1 + rng.Int64N(10)
			p.Hosts[h].FreeMemory -= m
			p.VMs = append(p.VMs, VM{ID: fmt.Sprintf("v%d", i), Memory: m, Host: p.Hosts[h].ID, Priority: PriorityRestart})
		}
		for r := 0; r < n; r++ {
			ix, err := validate(p)
			if err != nil {
				t.Fatal(err)
			}
			c := prepare(ix).cfg
			ex, _, err := c.exhaustive(context.Background(), r, -1)
			if err != nil {
				t.Fatal(err)
			}
			if c.approximate(r) && !ex {
				t.Fatalf("seed %d r %d: approximate says yes, exhaustive no: %+v", seed, r, p)
			}
		}
	}
}

// xapi's exhaustive planner simulates failures one host at a time, so a
// pool it approves for r failures can still fail to pack the VMs of r
// hosts lost at once. RestartOrder then replays the failures in order;
// with that, every approved pool restarts everything for every choice of
// up to r failed hosts. The table case is one such pool (found by a
// random search): packing 12, 11 and 5 at once leaves the 5 without a
// host, while failing h3 and then h4 places all three.
func TestRestartOrderKeepsThePlannersPromise(t *testing.T) {
	tight := Pool{
		Hosts: []Host{{ID: "h0", FreeMemory: -4, Live: true}, {ID: "h1", FreeMemory: -4, Live: true}, {ID: "h2", FreeMemory: 16, Live: true},
			{ID: "h3", FreeMemory: 19, Live: true}, {ID: "h4", FreeMemory: -22, Live: true}, {ID: "h5", FreeMemory: 14, Live: true}},
		VMs: []VM{{ID: "v0", Memory: 12, Host: "h4", Priority: PriorityRestart}, {ID: "v1", Memory: 12, Host: "h1", Priority: PriorityRestart},
			{ID: "v2", Memory: 7, Host: "h0", Priority: PriorityRestart}, {ID: "v3", Memory: 11, Host: "h4", Priority: PriorityRestart},
			{ID: "v4", Memory: 5, Host: "h3", Priority: PriorityRestart}},
	}
	if res, _ := PlanExists(context.Background(), tight, 2, Options{}); res.Status != PlanExistsForAllVMs || res.Heuristic != Exhaustive {
		t.Fatalf("planner: %+v", res)
	}
	failed := []string{"h3", "h4"}
	if pls, _ := FailoverPlan(tight, failed, failedVMs(tight, failed)); checkPlan(tight, failed, planMap(pls), failedVMs(tight, failed)) == nil {
		t.Fatal("packing at once should fail here")
	}
	checkPromise := func(t *testing.T, p Pool, r int) {
		var ids []string
		for _, h := range p.Hosts {
			ids = append(ids, h.ID)
		}
		for k := 1; k <= r; k++ {
			combinations(ids, k, func(failed []string) {
				ro, err := RestartOrder(p, failed)
				if err != nil {
					t.Fatal(err)
				}
				plan := map[string]string{}
				for _, rs := range ro.Restarts {
					plan[rs.VM] = rs.Host
				}
				if err := checkPlan(p, failed, plan, failedVMs(p, failed)); err != nil || !ro.Complete {
					t.Fatalf("failed %v: %v (complete %v)\npool %+v", failed, err, ro.Complete, p)
				}
			})
		}
	}
	checkPromise(t, tight, 2)
	for seed := range uint64(3000) {
		rng := rand.New(rand.NewPCG(seed, 9))
		n := 2 + rng.IntN(5)
		var p Pool
		for i := range n {
			p.Hosts = append(p.Hosts, Host{ID: fmt.Sprintf("h%d", i), FreeMemory: rng.Int64N(30), Live: true})
		}
		for i := range rng.IntN(10) {
			h := rng.IntN(n)
			m := 1 + rng.Int64N(12)
			p.Hosts[h].FreeMemory -= m
			p.VMs = append(p.VMs, VM{ID: fmt.Sprintf("v%d", i), Memory: m, Host: p.Hosts[h].ID, Priority: PriorityRestart})
		}
		for r := 1; r < n; r++ {
			if res, _ := PlanExists(context.Background(), p, r, Options{}); res.Status == PlanExistsForAllVMs && res.Heuristic == Exhaustive {
				checkPromise(t, p, r)
			}
		}
	}
}

// A pool at the edge of xapi's exhaustive rule with a hundred thousand
// VMs: the default budget cuts the search short and the approximation
// answers, in bounded time.
func TestLargeInputIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("large input")
	}
	pool := bigPool(16, 100_000, 100_000, 2)
	start := time.Now()
	res, err := PlanExists(context.Background(), pool, 3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.BudgetExceeded || res.Heuristic != Approximate {
		t.Fatalf("result %+v", res)
	}
	n, err := MaxFailuresTolerated(context.Background(), pool, -1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("16 hosts, 100,000 VMs: r=3 %v (%d steps), max failures %d, in %v", res.Status, res.Steps, n, time.Since(start))
}
