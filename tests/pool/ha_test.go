package pool

import (
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/ha/lease"
	"toolstackd/internal/pooltest"
	"toolstackd/internal/testdaemon"
	"toolstackd/internal/xerr"
)

// haTiming are short HA timing values for tests: the fence interval is
// 2 s·1.01 + 1 s + 2 s + 0.5 s = 5.52 s.
const haTiming = "lease=2s,renew=400ms,grace=1s,watchdog=2s,margin=500ms"

// haPool is a pool of three simulated hosts with HA enabled and a
// protected VM running on host on.
func haPool(t *testing.T, on int, args ...string) (rpc, *pooltest.Pool, map[int]string, string) {
	t.Helper()
	ctx := testCtx(t)
	p := pooltest.Start(t, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: append([]string{"--ha-timing", haTiming}, args...)}})
	p.Join(t)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rpc{t, ctx, c, p.Addr(0), s}
	hosts := hostRefs(t, ctx, c, p, 0, s)
	r.call("pool.enable_ha", []string{}, map[string]string{})
	if got := r.str("pool.get_ha_cluster_stack", poolRef(t, ctx, c, p, 0, s)); got == "" {
		t.Error("ha_cluster_stack is empty with HA enabled")
	}
	vm := r.str("VM.create", testdaemon.VMRecord("protected"))
	r.call("VM.set_ha_restart_priority", vm, "restart")
	r.call("VM.start_on", vm, hosts[on], false, false)
	return r, p, hosts, vm
}

// waitRunningElsewhere waits until vm runs on a host other than gone and
// returns where and after how long.
func waitRunningElsewhere(r rpc, vm, gone string, bound time.Duration) (string, time.Duration) {
	r.t.Helper()
	start := time.Now()
	for {
		ps, _ := r.c.CallString(r.ctx, r.at, "VM.get_power_state", r.s, vm)
		on, _ := r.c.CallString(r.ctx, r.at, "VM.get_resident_on", r.s, vm)
		if ps == "Running" && on != gone && on != "OpaqueRef:NULL" && on != "" {
			return on, time.Since(start)
		}
		if time.Since(start) > bound {
			r.t.Fatalf("the protected VM is %s on %s after %v", ps, on, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A member killed with kill -9: after the fence interval the coordinator
// declares it dead and its protected VM runs on another host.
func TestHARestartsAKilledHostsVMs(t *testing.T) {
	r, p, hosts, vm := haPool(t, 2)
	tm, _ := lease.ParseTiming(haTiming)
	p.Kill(2)
	on, took := waitRunningElsewhere(r, vm, hosts[2], 30*time.Second)
	t.Logf("kill -9 of the VM's host: running again on %s after %v (fence interval %v)", on, took, tm.FenceAfter())
	if took < tm.FenceAfter()-tm.Renew {
		t.Errorf("restarted after %v, before the fence interval %v allows", took, tm.FenceAfter())
	}
	if live := r.call("host_metrics.get_live", r.str("host.get_metrics", hosts[2])); string(live) != "false" {
		t.Errorf("the dead host is still live: %s", live)
	}
}

// A member stopped (SIGSTOP) for longer than the fence interval loses its
// VM to another host; when it resumes its lease is over and it kills its
// own instance at once: the VM never runs twice.
func TestHAStoppedHostKillsItsInstance(t *testing.T) {
	r, p, hosts, vm := haPool(t, 1)
	uuid := r.str("VM.get_uuid", vm)
	if !simDomainIn(t, p.Hosts[1].DataDir, uuid) {
		t.Fatal("no simulated domain for the VM on its host")
	}
	if err := p.Stop(1); err != nil {
		t.Fatal(err)
	}
	on, took := waitRunningElsewhere(r, vm, hosts[1], 30*time.Second)
	t.Logf("SIGSTOP of the VM's host: running again on %s after %v", on, took)
	if err := p.Cont(1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for simDomainIn(t, p.Hosts[1].DataDir, uuid) {
		if time.Now().After(deadline) {
			t.Fatal("the resumed host still runs its instance of the VM")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ps := r.str("VM.get_power_state", vm); ps != "Running" || r.str("VM.get_resident_on", vm) != on {
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
		if time.Since(stopped) > 15*time.Second {
			t.Fatal("the stopped host was not reset by its watchdog")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the watchdog reset the stopped host after %v", time.Since(stopped))
	on, _ := waitRunningElsewhere(r, vm, hosts[1], 30*time.Second)
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

// simDomainIn reports whether the simulator under a host's data dir has a
// domain for the VM.
func simDomainIn(t *testing.T, dataDir, uuid string) bool {
	t.Helper()
	found := false
	_ = filepath.WalkDir(filepath.Join(dataDir, "xenops"), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == uuid+".json" {
			found = true
		}
		return nil
	})
	return found
}

// A VM with a disk on a host's local SR cannot be protected; HA's calls
// refuse what xapi refuses.
func TestHAConstraints(t *testing.T) {
	ctx, p, c, s := joinedPool(t)
	r := rpc{t, ctx, c, p.Addr(0), s}
	member := hostRefs(t, ctx, c, p, 0, s)[1]
	vm := r.str("VM.create", testdaemon.VMRecord("local disk"))
	vdi := r.str("VDI.create", map[string]any{"name_label": "local", "name_description": "", "SR": r.localSR(member),
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	if _, err := c.Call(ctx, p.Addr(0), "VM.set_ha_restart_priority", s, vm, "restart"); pooltest.Code(err) != xerr.HAConstraintViolationSRNotShared {
		t.Fatalf("protecting a VM on local storage: %v", err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.disable_ha", s); pooltest.Code(err) != xerr.HANotEnabled {
		t.Fatalf("disable_ha with HA off: %v", err)
	}
	r.call("pool.enable_ha", []string{}, map[string]string{})
	if _, err := c.Call(ctx, p.Addr(0), "pool.enable_ha", s, []string{}, map[string]string{}); pooltest.Code(err) != xerr.HAIsEnabled {
		t.Fatalf("enable_ha twice: %v", err)
	}
	r.call("pool.disable_ha")
}
