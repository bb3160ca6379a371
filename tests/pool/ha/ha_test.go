// Package ha tests HA on a pool of real toolstackd processes: leases and
// self-fencing, the watchdog, the failover planner and its guards, restarts
// of protected VMs after kills, stops and partitions (on the simulator and
// on QEMU), and host evacuation with and without HA.
package ha

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/ha/journal"
	"toolstackd/internal/ha/lease"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// haPool is a pool of three simulated hosts with HA enabled and a
// protected VM running on host on.
func haPool(t *testing.T, on int, args ...string) (suite.RPC, *pooltest.Pool, map[int]string, string) {
	t.Helper()
	p, r, hosts := suite.Joined(t, suite.Ctx(t), pooltest.Options{Hosts: 3,
		Daemon: testdaemon.Options{ExtraArgs: append([]string{"--ha-timing", suite.HATiming}, args...)}})
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	if got := r.Str("pool.get_ha_cluster_stack", suite.PoolRef(t, r.Ctx, r.C, p, 0, r.S)); got == "" {
		t.Error("ha_cluster_stack is empty with HA enabled")
	}
	vm := r.Str("VM.create", testdaemon.VMRecord("protected"))
	r.Call("VM.set_ha_restart_priority", vm, "restart")
	r.Call("VM.start_on", vm, hosts[on], false, false)
	return r, p, hosts, vm
}

// waitRunningElsewhere waits until vm runs on a host other than gone and
// returns where and after how long.
func waitRunningElsewhere(r suite.RPC, vm, gone string, bound time.Duration) (string, time.Duration) {
	r.T.Helper()
	start := time.Now()
	for {
		ps, _ := r.C.CallString(r.Ctx, r.At, "VM.get_power_state", r.S, vm)
		on, _ := r.C.CallString(r.Ctx, r.At, "VM.get_resident_on", r.S, vm)
		if ps == "Running" && on != gone && on != "OpaqueRef:NULL" && on != "" {
			return on, time.Since(start)
		}
		if time.Since(start) > bound {
			r.T.Fatalf("the protected VM is %s on %s after %v", ps, on, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A member killed with kill -9: after the fence interval the coordinator
// declares it dead and its protected VM runs on another host.
func TestHARestartsAKilledHostsVMs(t *testing.T) {
	r, p, hosts, vm := haPool(t, 2)
	tm, _ := lease.ParseTiming(suite.HATiming)
	killed := time.Now()
	p.Kill(2)
	on, _ := waitRunningElsewhere(r, vm, hosts[2], suite.HARestartBound)
	took := time.Since(killed)
	t.Logf("kill -9 of the VM's host: running again on %s after %v (fence interval %v)", on, took, tm.FenceAfter())
	// The coordinator counts the fence interval from the host's last
	// renewal it granted, not from the kill, which this test sees. That
	// renewal came up to one renewal period before the kill, more when
	// the next one was in flight or its tick late on a loaded machine
	// (CI once saw 5.11 s against a bound of one period, 5.12 s): allow
	// two. A restart on liveness alone (2 s here) still fails.
	if took < tm.FenceAfter()-2*tm.Renew {
		t.Errorf("restarted after %v, before the fence interval %v allows", took, tm.FenceAfter())
	}
	if live := r.Call("host_metrics.get_live", r.Str("host.get_metrics", hosts[2])); string(live) != "false" {
		t.Errorf("the dead host is still live: %s", live)
	}
}

// A member stopped (SIGSTOP) for longer than the fence interval loses its
// VM to another host; when it resumes its lease is over and it kills its
// own instance at once: the VM never runs twice.
func TestHAStoppedHostKillsItsInstance(t *testing.T) {
	r, p, hosts, vm := haPool(t, 1)
	uuid := r.Str("VM.get_uuid", vm)
	if !suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) {
		t.Fatal("no simulated domain for the VM on its host")
	}
	if err := p.Stop(1); err != nil {
		t.Fatal(err)
	}
	on, took := waitRunningElsewhere(r, vm, hosts[1], suite.HARestartBound)
	t.Logf("SIGSTOP of the VM's host: running again on %s after %v", on, took)
	if err := p.Cont(1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(suite.HAActBound)
	for suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) {
		if time.Now().After(deadline) {
			t.Fatal("the resumed host still runs its instance of the VM")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ps := r.Str("VM.get_power_state", vm); ps != "Running" || r.Str("VM.get_resident_on", vm) != on {
		t.Fatalf("after the resumed host fenced itself the VM is %s", ps)
	}
}

// A member stopped (SIGSTOP) stops petting its watchdog: the fake
// watchdog kills its process group, as a reset would, within the
// watchdog's timeout, and the VM runs again elsewhere.
func TestHAWatchdogResetsAStoppedHost(t *testing.T) {
	r, p, hosts, vm := haPool(t, 1, "--watchdog", "fake")
	pid := p.Hosts[1].PID
	stopped := time.Now()
	if err := p.Stop(1); err != nil {
		t.Fatal(err)
	}
	for processAlive(pid) {
		if time.Since(stopped) > suite.HAActBound {
			t.Fatal("the stopped host was not reset by its watchdog")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the watchdog reset the stopped host after %v", time.Since(stopped))
	on, _ := waitRunningElsewhere(r, vm, hosts[1], suite.HARestartBound)
	t.Logf("running again on %s %v after the stop", on, time.Since(stopped))
}

// processAlive reports whether pid is a process that has not exited (a
// zombie counts as exited).
func processAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A VM with a disk on a host's local SR cannot be protected; HA's calls
// refuse what xapi refuses.
func TestHAConstraints(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	r := suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(0), S: s}
	member := suite.HostRefs(t, ctx, c, p, 0, s)[1]
	vm := r.Str("VM.create", testdaemon.VMRecord("local disk"))
	vdi := r.Str("VDI.create", map[string]any{"name_label": "local", "name_description": "", "SR": r.LocalSR(member),
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	if _, err := c.Call(ctx, p.Addr(0), "VM.set_ha_restart_priority", s, vm, "restart"); pooltest.Code(err) != xerr.HAConstraintViolationSRNotShared {
		t.Fatalf("protecting a VM on local storage: %v", err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.disable_ha", s); pooltest.Code(err) != xerr.HANotEnabled {
		t.Fatalf("disable_ha with HA off: %v", err)
	}
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	if _, err := c.Call(ctx, p.Addr(0), "pool.enable_ha", s, []string{}, map[string]string{}); pooltest.Code(err) != xerr.HAIsEnabled {
		t.Fatalf("enable_ha twice: %v", err)
	}
	r.Call("pool.ha_prevent_restarts_for", 0)
	r.Call("pool.disable_ha")
	// An operator declares a killed host dead: its VMs are Halted at once.
	dead := suite.HostRefs(t, ctx, c, p, 0, s)[2]
	gone := r.Str("VM.create", testdaemon.VMRecord("on a host that dies"))
	r.Call("VM.start_on", gone, dead, false, false)
	if consoles := string(r.Call("VM.get_consoles", gone)); consoles == "[]" {
		t.Fatal("a running VM without consoles")
	}
	p.Kill(2)
	if _, err := c.Call(ctx, p.Addr(0), "host.declare_dead", s, suite.HostRefs(t, ctx, c, p, 0, s)[0]); pooltest.Code(err) != xerr.OperationNotAllowed {
		t.Fatalf("the coordinator declaring itself dead: %v", err)
	}
	r.Call("host.declare_dead", dead)
	if ps, on := r.Str("VM.get_power_state", gone), r.Str("VM.get_resident_on", gone); ps != "Halted" || on != "OpaqueRef:NULL" {
		t.Fatalf("a dead host's VM: %s on %s", ps, on)
	}
	// Recorded as any VM that stopped: no console left pointing at the
	// dead host.
	if consoles := string(r.Call("VM.get_consoles", gone)); consoles != "[]" {
		t.Fatalf("a dead host's VM keeps its consoles: %s", consoles)
	}
}

// The planner's calls on a pool of three 4 GiB hosts with one protected
// 3 GiB VM: one host failure is tolerated (the raft quorum allows no
// more), the VM would restart on the empty host, two failures are
// refused, and once an unprotected VM fills the spare room the pool is
// overcommitted.
func TestHAPlanner(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: []string{
		"--ha-timing", suite.HATiming, "--host-memory", "4GiB"}}})
	c, s := r.C, r.S
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	sized := func(name string, size int64) string { return suite.SizedVM(r, name, size) }
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	a := sized("protected", 3<<30)
	r.Call("VM.set_ha_restart_priority", a, "restart")
	r.Call("VM.start_on", a, hosts[0], false, false)
	if got := string(r.Call("pool.ha_compute_max_host_failures_to_tolerate")); got != "1" {
		t.Fatalf("max failures tolerated: %s, want 1 (the quorum of three voters)", got)
	}
	if got := string(r.Call("pool.ha_failover_plan_exists", 1)); got != "true" {
		t.Fatalf("plan for one failure: %s", got)
	}
	var plan map[string]map[string]string
	if err := json.Unmarshal(r.Call("pool.ha_compute_vm_failover_plan", []string{hosts[0]}, []string{a}), &plan); err != nil {
		t.Fatal(err)
	}
	if h := plan[a]["host"]; h != hosts[1] && h != hosts[2] {
		t.Fatalf("failover plan for the protected VM: %v", plan)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_ha_host_failures_to_tolerate", s, pool, 2); pooltest.Code(err) != xerr.HAOperationWouldBreakFailoverPlan {
		t.Fatalf("tolerating two failures of three voters: %v", err)
	}
	r.Call("pool.set_ha_host_failures_to_tolerate", pool, 1)
	waitPlan := func(wantFor, over string) { t.Helper(); suite.WaitPlanFor(r, pool, wantFor, over) }
	waitPlan("1", "false")
	// A second protected 3 GiB VM still leaves a plan; a third would not:
	// protecting it is refused.
	b := sized("second", 3<<30)
	r.Call("VM.set_ha_restart_priority", b, "restart")
	r.Call("VM.start", b, false, false)
	third := sized("third", 3<<30)
	if _, err := c.Call(ctx, p.Addr(0), "VM.set_ha_restart_priority", s, third, "restart"); pooltest.Code(err) != xerr.HAOperationWouldBreakFailoverPlan {
		t.Fatalf("protecting a third 3 GiB VM: %v", err)
	}
	r.Call("VM.hard_shutdown", b)
	r.Call("VM.set_ha_restart_priority", b, "")
	// Unprotected VMs fill the other hosts: if host 0 failed, the
	// protected VM would have nowhere to go.
	var filler string
	for _, i := range []int{1, 2} {
		filler = sized("filler", 2<<30)
		r.Call("VM.start_on", filler, hosts[i], false, false)
	}
	waitPlan("0", "true")
	// The alerts xapi raises on that step, on the pool.
	var msgs map[string]map[string]any
	if err := json.Unmarshal(r.Call("message.get_all_records"), &msgs); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, m := range msgs {
		name, _ := m["name"].(string)
		body, _ := m["body"].(string)
		seen[name] = body
	}
	if body, ok := seen["HA_POOL_DROP_IN_PLAN_EXISTS_FOR"]; !ok || body != "0" {
		t.Errorf("HA_POOL_DROP_IN_PLAN_EXISTS_FOR: %q %v (messages %v)", body, ok, seen)
	}
	if _, ok := seen["HA_POOL_OVERCOMMITTED"]; !ok {
		t.Errorf("no HA_POOL_OVERCOMMITTED among %v", seen)
	}
	if got := string(r.Call("pool.ha_compute_hypothetical_max_host_failures_to_tolerate", map[string]string{a: ""})); got != "1" {
		t.Fatalf("hypothetical with the VM unprotected: %s", got)
	}
	// A configuration may protect a VM that is not protected now, and it
	// names every VM to protect: with only a filler protected, it can
	// restart on the other filler's host if its own fails.
	if got := string(r.Call("pool.ha_compute_hypothetical_max_host_failures_to_tolerate", map[string]string{filler: "restart"})); got != "1" {
		t.Fatalf("hypothetical with a filler protected: %s", got)
	}
}

// TestHAFigures measures, with HA's default timing values, the time from
// a host's death (kill -9, with its fake watchdog) to its protected VM
// running on another host.
//
//	TOOLSTACKD_FIGURES=1 go test -count=1 -v -run TestHAFigures ./tests/pool/
func TestHAFigures(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure issue 13's figures")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: []string{"--watchdog", "fake"}}})
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	var vms []string
	for i := range 5 {
		vm := r.Str("VM.create", testdaemon.VMRecord("protected-"+strconv.Itoa(i)))
		r.Call("VM.set_ha_restart_priority", vm, "restart")
		r.Call("VM.start_on", vm, hosts[2], false, false)
		vms = append(vms, vm)
	}
	time.Sleep(3 * time.Second) // a few renewals
	start := time.Now()
	p.Kill(2)
	var last time.Duration
	for _, vm := range vms {
		_, _ = waitRunningElsewhere(r, vm, hosts[2], 3*time.Minute)
		last = time.Since(start)
	}
	t.Logf("kill -9 of a host with 5 protected VMs, default timing (fence interval %v): all running elsewhere after %v",
		lease.Defaults().FenceAfter(), last)
}

// A member cut off from the pool (every link through its fault proxy
// blackholed) cannot renew its lease: it kills its protected VM itself,
// the coordinator restarts it elsewhere after the fence interval, and
// once the link heals the member is back without a second instance.
func TestHAPartitionedHostFencesItself(t *testing.T) {
	jpath := filepath.Join(t.TempDir(), "instances")
	p, r, hosts := suite.Joined(t, suite.Ctx(t), pooltest.Options{Hosts: 3, Proxy: true, Daemon: testdaemon.Options{ExtraArgs: []string{
		"--ha-timing", suite.HATiming, "--watchdog", "fake", "--instance-journal", jpath}}})
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	vm := r.Str("VM.create", testdaemon.VMRecord("protected"))
	r.Call("VM.set_ha_restart_priority", vm, "restart")
	r.Call("VM.start_on", vm, hosts[2], false, false)
	uuid := r.Str("VM.get_uuid", vm)
	if err := p.Link.Isolate(pooltest.Name(2)); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	// The member's own instance goes first (its lease ends), then the VM
	// runs elsewhere.
	for suite.SimDomainIn(t, p.Hosts[2].DataDir, uuid) {
		if time.Since(cut) > suite.HAActBound {
			t.Fatal("the cut-off member still runs its protected VM")
		}
		time.Sleep(50 * time.Millisecond)
	}
	killed := time.Since(cut)
	on, _ := waitRunningElsewhere(r, vm, hosts[2], suite.HARestartBound)
	t.Logf("cut off: the member killed its instance after %v; running on %s %v after the cut", killed, on, time.Since(cut))
	p.Link.HealAll()
	time.Sleep(3 * time.Second) // the member renews again
	if ps := r.Str("VM.get_power_state", vm); ps != "Running" || r.Str("VM.get_resident_on", vm) != on {
		t.Fatalf("after the heal the VM is %s", ps)
	}
	events, err := journal.Read(jpath)
	if err != nil {
		t.Fatal(err)
	}
	if o := journal.Check(events); len(o) > 0 {
		t.Fatalf("two instances: %v", o)
	}
}
