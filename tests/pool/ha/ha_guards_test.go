package ha

import (
	"encoding/json"
	"testing"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// Overcommit protection at the pool's door: with HA on and one host
// failure to tolerate, each guarded operation that would leave a
// protected VM without a place after some host failure is refused with
// HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN, the same operation somewhere
// harmless is accepted, and with pool.ha_allow_overcommit the refused one
// goes through.
//
// Three hosts of 4 GiB (G below is 512 MiB):
//
//	host 0: an unprotected 4G VM      (4G free)
//	host 1: an unprotected 6G VM      (2G free)
//	host 2: protected P3, 3G          (5G free)
//	P2: protected, 2G, not running: the planner counts it as started on
//	    the host with the most room (host 2, leaving 3G)
//
// If host 2 fails, P3 restarts on host 0 and P2 on host 1. Starting P2 on
// host 0 instead leaves 2G on hosts 0 and 1, too little for P3; starting
// it on host 1 is harmless. Disabling host 0 leaves P3 nowhere to go, and
// so does raising P2's memory to 3G.
//
// VM.start and VM.resume without a host are guarded too, but the planner
// already counts a stopped protected VM as started where placement would
// put it, so they change nothing it sees; VM.pool_migrate's guard waits
// for migration (issue 18).
func TestHAOvercommitRefusals(t *testing.T) {
	const G = int64(512 << 20)
	ctx := suite.Ctx(t)
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: []string{
		"--ha-timing", suite.HATiming, "--host-memory", "4GiB"}}})
	c, s := r.C, r.S
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	sized := func(name string, size int64) string { return suite.SizedVM(r, name, size) }
	refused := func(what, method string, params ...any) {
		t.Helper()
		_, err := c.Call(ctx, p.Addr(0), method, append([]any{s}, params...)...)
		if pooltest.Code(err) != xerr.HAOperationWouldBreakFailoverPlan {
			t.Fatalf("%s (%s): %v, want %s", what, method, err, xerr.HAOperationWouldBreakFailoverPlan)
		}
	}
	waitPlan := func(wantFor, over string) { t.Helper(); suite.WaitPlanFor(r, pool, wantFor, over) }
	powerState := func(vm string) string { t.Helper(); return r.Str("VM.get_power_state", vm) }

	r.Call("pool.enable_ha", []string{}, map[string]string{})
	r.Call("pool.set_ha_host_failures_to_tolerate", pool, 1)
	r.Call("VM.start_on", sized("filler-0", 4*G), hosts[0], false, false)
	r.Call("VM.start_on", sized("filler-1", 6*G), hosts[1], false, false)
	p3 := sized("P3", 3*G)
	r.Call("VM.start_on", p3, hosts[2], false, false)
	r.Call("VM.set_ha_restart_priority", p3, "restart")
	p2 := sized("P2", 2*G)
	r.Call("VM.set_ha_restart_priority", p2, "restart")
	waitPlan("1", "false")

	// Where a protected VM starts or resumes.
	refused("starting P2 on host 0", "VM.start_on", p2, hosts[0], false, false)
	if ps := powerState(p2); ps != "Halted" {
		t.Fatalf("a refused start left P2 %s", ps)
	}
	r.Call("VM.start_on", p2, hosts[1], false, false)
	r.Call("VM.suspend", p2)
	waitPlan("1", "false")
	refused("resuming P2 on host 0", "VM.resume_on", p2, hosts[0], false, false)
	r.Call("VM.resume_on", p2, hosts[1], false, false)
	r.Call("VM.hard_shutdown", p2)
	waitPlan("1", "false")

	// Taking a host out of the plan.
	refused("disabling host 0", "host.disable", hosts[0])
	refused("evacuating host 0", "host.evacuate", hosts[0], "OpaqueRef:NULL", 0)
	var enabled bool
	if err := json.Unmarshal(r.Call("host.get_enabled", hosts[0]), &enabled); err != nil || !enabled {
		t.Fatalf("a refused host.disable left host 0 enabled=%v (%v)", enabled, err)
	}

	// Memory increases of a protected VM, by each setter that raises the
	// most it may use.
	refused("raising P2's static max", "VM.set_memory_static_max", p2, 3*G)
	refused("raising P2's limits", "VM.set_memory_limits", p2, 3*G, 3*G, 3*G, 3*G)
	refused("raising P2's static range", "VM.set_memory_static_range", p2, 2*G, 3*G)
	refused("raising P2's memory", "VM.set_memory", p2, 3*G)
	if got := string(r.Call("VM.get_memory_static_max", p2)); got != `"`+itoa(2*G)+`"` && got != itoa(2*G) {
		t.Fatalf("refused increases changed P2's static max to %s", got)
	}
	// A decrease is always fine.
	r.Call("VM.set_memory_limits", p2, G, G, G, G)
	r.Call("VM.set_memory_limits", p2, 2*G, 2*G, 2*G, 2*G)

	// With overcommit allowed the same calls go through.
	r.Call("pool.set_ha_allow_overcommit", pool, true)
	r.Call("VM.set_memory_static_max", p2, 3*G)
	r.Call("VM.start_on", p2, hosts[0], false, false)
	waitPlan("0", "true")
	r.Call("host.disable", hosts[0])
	// A disabled host takes no new VMs; host.enable brings it back.
	if _, err := c.Call(ctx, p.Addr(0), "VM.start_on", s, sized("late", G), hosts[0], false, false); pooltest.Code(err) != xerr.HostDisabled {
		t.Fatalf("starting a VM on a disabled host: %v, want %s", err, xerr.HostDisabled)
	}
	r.Call("host.enable", hosts[0])
	if err := json.Unmarshal(r.Call("host.get_enabled", hosts[0]), &enabled); err != nil || !enabled {
		t.Fatalf("host.enable left host 0 enabled=%v (%v)", enabled, err)
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
