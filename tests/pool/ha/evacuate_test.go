package ha

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// Host evacuation (issue 18, item 3) on three simulated hosts sharing a
// sharedfs SR: host.get_vms_which_prevent_evacuation and
// host.assert_can_evacuate name a VM with a disk on the host's local SR
// (VM_REQUIRES_SR) and host.evacuate refuses; without it, host.disable +
// host.evacuate moves every running VM to the other two hosts within
// their memory (two 896 MiB VMs on each 2 GiB host: the most-room-first
// packing is needed), the halted VMs stay, and the host ends with no
// resident VM; a cancelled evacuation leaves every VM running on exactly
// one host and a second one finishes; xe host-evacuate,
// host-get-vms-which-prevent-evacuation and vm-migrate do the same
// through the CLI, and vm-migrate's remote-pool options are refused.
func TestEvacuate(t *testing.T) {
	ctx := suite.Ctx(t)
	ev := newEvacPool(t, ctx, map[int][]string{
		0: {"--host-memory", "2GiB"}, 1: {"--host-memory", "4GiB"}, 2: {"--host-memory", "2GiB"}})
	r, hosts := ev.r, ev.hosts
	src := hosts[1]

	// Four VMs of 896 MiB and six of 32 MiB: two big ones fit on each
	// 2 GiB host, with room for the small ones beside them.
	const size, small = 7 << 27, 32 << 20
	var running []string
	sizes := map[string]int64{}
	for i := range 10 {
		sz := int64(size)
		if i >= 4 {
			sz = small
		}
		vm := ev.newVM(fmt.Sprintf("evac-%d", i), sz, ev.sr)
		r.Call("VM.start_on", vm, src, false, false)
		running = append(running, vm)
		sizes[vm] = sz
	}
	halted := ev.newVM("evac-halted", size, ev.sr)
	r.Call("VM.set_affinity", halted, src)
	local := ev.newVM("evac-local", 1<<26, r.LocalSR(src))
	r.Call("VM.start_on", local, src, false, false)

	// The VM on the local SR prevents the evacuation, and only it.
	var prevent map[string][]string
	if err := json.Unmarshal(r.Call("host.get_vms_which_prevent_evacuation", src), &prevent); err != nil {
		t.Fatal(err)
	}
	localSR := r.LocalSR(src)
	if len(prevent) != 1 || !slices.Equal(prevent[local], []string{xerr.VMRequiresSR, local, localSR}) {
		t.Fatalf("get_vms_which_prevent_evacuation: %v, want only %s: [VM_REQUIRES_SR %s %s]", prevent, local, local, localSR)
	}
	_, err := r.C.Call(ctx, r.At, "host.assert_can_evacuate", r.S, src)
	if e, ok := testdaemon.AsError(err); !ok || e.Code != xerr.CannotEvacuateHost ||
		!slices.Equal(e.Params, []string{strings.Join([]string{xerr.VMRequiresSR, local, localSR}, ",")}) {
		t.Fatalf("assert_can_evacuate: %v", err)
	}
	_, err = r.C.Call(ctx, r.At, "host.evacuate", r.S, src, "OpaqueRef:NULL", 0)
	if pooltest.Code(err) != xerr.VMRequiresSR {
		t.Fatalf("host.evacuate with a local disk: %v, want VM_REQUIRES_SR", err)
	}
	for _, vm := range running {
		if on := r.Str("VM.get_resident_on", vm); on != src {
			t.Fatalf("a refused evacuation moved %s to %s", vm, on)
		}
	}
	r.Call("VM.hard_shutdown", local)
	r.Call("host.assert_can_evacuate", src)

	// host.disable + host.evacuate, two migrations at a time.
	r.Call("host.disable", src)
	task := r.Str("Async.host.evacuate", src, "OpaqueRef:NULL", 2)
	if st, info := ev.waitTask(task, 60*time.Second); st != "success" {
		if len(info) > 0 && info[0] == xerr.NotImplemented {
			t.Skipf("VM.pool_migrate is not served yet: %v", info)
		}
		t.Fatalf("host.evacuate: %s %v", st, info)
	}
	var progress float64
	_ = json.Unmarshal(r.Call("task.get_progress", task), &progress)
	if progress != 1 {
		t.Errorf("the evacuation's progress at the end: %v", progress)
	}
	perHost, used := map[string]int{}, map[string]int64{}
	for _, vm := range running {
		on := r.Str("VM.get_resident_on", vm)
		if ps := r.Str("VM.get_power_state", vm); ps != "Running" || (on != hosts[0] && on != hosts[2]) {
			t.Fatalf("%s after the evacuation: %s on %s", vm, ps, on)
		}
		if sizes[vm] == size {
			perHost[on]++
		}
		used[on] += sizes[vm]
	}
	if perHost[hosts[0]] != 2 || perHost[hosts[2]] != 2 {
		t.Errorf("896 MiB VMs per host after the evacuation: %v, want two on each 2 GiB host", perHost)
	}
	for h, n := range used {
		if n > 2<<30 {
			t.Errorf("host %s was given %d bytes of VMs, more than its 2 GiB", h, n)
		}
	}
	ev.assertNoGuests(src)
	for _, vm := range []string{halted, local} {
		if ps, on := r.Str("VM.get_power_state", vm), r.Str("VM.get_resident_on", vm); ps != "Halted" || on != "OpaqueRef:NULL" {
			t.Errorf("halted VM %s after the evacuation: %s on %s", vm, ps, on)
		}
	}
	ev.assertOneHostEach(running)

	// Back to host 1 (restarted there: fewer migrations than the test
	// needs add nothing), then a cancelled evacuation (one at a time,
	// cancelled after the first move).
	r.Call("host.enable", src)
	back := func(vm string) {
		t.Helper()
		r.Call("VM.hard_shutdown", vm)
		r.Call("VM.start_on", vm, src, false, false)
	}
	for _, vm := range running {
		back(vm)
	}
	task = r.Str("Async.host.evacuate", src, "OpaqueRef:NULL", 1)
	deadline := time.Now().Add(60 * time.Second)
	for ev.movedFrom(running, src) == 0 && r.Str("task.get_status", task) == "pending" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	r.Call("task.cancel", task)
	st, info := ev.waitTask(task, 60*time.Second)
	switch {
	case st == "cancelled" && len(info) > 0 && info[0] == xerr.TaskCancelled:
		if n := ev.movedFrom(running, src); n == len(running) {
			t.Logf("the evacuation was cancelled after its last move")
		} else {
			t.Logf("cancelled with %d of %d VMs moved", n, len(running))
		}
	case st == "success":
		t.Logf("the evacuation finished before the cancellation reached it")
	default:
		t.Fatalf("cancelled evacuation: %s %v", st, info)
	}
	ev.assertOneHostEach(running)
	r.Call("host.evacuate", src, "OpaqueRef:NULL", 0)
	ev.assertNoGuests(src)
	ev.assertOneHostEach(running)

	// The same through xe.
	xe := testdaemon.BuildCommand(t, "xe", "XE_BIN")
	hostUUID := func(h string) string { return r.Str("host.get_uuid", h) }
	host, port, _ := net.SplitHostPort(r.At)
	runXe := func(wantOK bool, args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, xe, append([]string{"-s", host, "-p", port, "-u", "root", "-pw", ev.p.Password()}, args...)...)
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("xe %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	// Bring one VM back with xe vm-migrate (another restarted there),
	// then evacuate with xe.
	runXe(true, "vm-migrate", "uuid="+r.Str("VM.get_uuid", running[0]), "host="+hostUUID(src), "live=true")
	if on := r.Str("VM.get_resident_on", running[0]); on != src {
		t.Fatalf("xe vm-migrate left %s on %s", running[0], on)
	}
	back(running[1])
	out := runXe(false, "vm-migrate", "uuid="+r.Str("VM.get_uuid", running[0]), "remote-master=127.0.0.9",
		"remote-username=root", "remote-password=x", "host="+hostUUID(hosts[0]))
	if !strings.Contains(out, "Cannot contact the remote pool") { // nothing listens there
		t.Errorf("xe vm-migrate with remote-master: %s", out)
	}
	if on := r.Str("VM.get_resident_on", running[0]); on != src {
		t.Errorf("a refused remote vm-migrate moved the VM to %s", on)
	}
	if out := runXe(true, "host-get-vms-which-prevent-evacuation", "uuid="+hostUUID(src)); strings.TrimSpace(out) != "" {
		t.Errorf("xe host-get-vms-which-prevent-evacuation with nothing in the way: %q", out)
	}
	r.Call("VM.start_on", local, src, false, false)
	out = runXe(true, "host-get-vms-which-prevent-evacuation", "uuid="+hostUUID(src))
	if !strings.Contains(out, r.Str("VM.get_uuid", local)) || !strings.Contains(out, "VM_REQUIRES_SR,"+local+","+localSR) {
		t.Errorf("xe host-get-vms-which-prevent-evacuation: %q", out)
	}
	out = runXe(false, "host-evacuate", "uuid="+hostUUID(src))
	if !strings.Contains(out, "VM_REQUIRES_SR") {
		t.Errorf("xe host-evacuate with a local disk: %q", out)
	}
	r.Call("VM.hard_shutdown", local)
	// Over a network: one without PIFs on the destinations is refused
	// before anything moves; the management network (a PIF with an
	// address on every host) carries the moves.
	inside := r.Str("network.create", map[string]any{"name_label": "no PIFs", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}, "bridge": "", "managed": true, "tags": []string{}})
	_, err = r.C.Call(ctx, r.At, "host.evacuate", r.S, src, inside, 0)
	if e, ok := testdaemon.AsError(err); !ok || e.Code != xerr.PIFNotPresent || len(e.Params) != 2 || e.Params[1] != inside {
		t.Fatalf("host.evacuate over a network without PIFs: %v, want PIF_NOT_PRESENT [host, %s]", err, inside)
	}
	if n := ev.movedFrom(running[:2], src); n != 0 {
		t.Fatalf("a refused evacuation moved %d VMs", n)
	}
	var mgmt string
	for _, pif := range ev.pifs() {
		if pif["management"] == true {
			mgmt = pif["network"].(string)
		}
	}
	runXe(true, "host-evacuate", "uuid="+hostUUID(src), "batch-size=3", "network-uuid="+r.Str("network.get_uuid", mgmt))
	ev.assertNoGuests(src)
	ev.assertOneHostEach(running)
}

// pifs are the pool's PIF records.
func (ev *evacPool) pifs() map[string]map[string]any {
	ev.t.Helper()
	var out map[string]map[string]any
	if err := json.Unmarshal(ev.r.Call("PIF.get_all_records"), &out); err != nil {
		ev.t.Fatal(err)
	}
	return out
}

// evacPool is a joined pool of simulated hosts with a sharedfs SR
// plugged on every host.
type evacPool struct {
	t     *testing.T
	p     *pooltest.Pool
	r     suite.RPC
	hosts map[int]string
	sr    string
}

func newEvacPool(t *testing.T, ctx context.Context, hostArgs map[int][]string) *evacPool {
	t.Helper()
	return newEvacPoolWith(t, ctx, pooltest.Options{Hosts: 3, HostArgs: hostArgs})
}

func newEvacPoolWith(t *testing.T, ctx context.Context, o pooltest.Options) *evacPool {
	t.Helper()
	if !pooltest.DaemonHasFlag(t, "--advertise") {
		t.Skip("toolstackd has no --advertise flag: no pool support yet")
	}
	p, r, hosts := suite.Joined(t, ctx, o)
	ev := &evacPool{t: t, p: p, r: r, hosts: hosts}
	ev.sr = r.Str("SR.create", hosts[0], map[string]string{"location": t.TempDir()}, 0, "shared", "", "sharedfs", "user",
		true, map[string]string{})
	var pbds []string
	if err := json.Unmarshal(r.Call("SR.get_PBDs", ev.sr), &pbds); err != nil || len(pbds) != len(hosts) {
		t.Fatalf("the sharedfs SR's PBDs: %v %v", pbds, err)
	}
	for _, pbd := range pbds {
		var on bool
		if err := json.Unmarshal(r.Call("PBD.get_currently_attached", pbd), &on); err != nil {
			t.Fatal(err)
		}
		if !on {
			r.Call("PBD.plug", pbd)
		}
	}
	return ev
}

// newVM makes a halted simulated VM of size bytes with a 4 MiB disk on
// sr.
func (ev *evacPool) newVM(name string, size int64, sr string) string {
	ev.t.Helper()
	r := ev.r
	rec := testdaemon.VMRecord(name)
	for _, f := range []string{"memory_static_max", "memory_dynamic_max", "memory_dynamic_min", "memory_target"} {
		rec[f] = size
	}
	rec["memory_static_min"] = min(size, 64<<20)
	vm := r.Str("VM.create", rec)
	vdi := r.Str("VDI.create", map[string]any{"name_label": name, "name_description": "", "SR": sr, "virtual_size": 4 << 20,
		"type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"unpluggable": true, "empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{}})
	return vm
}

// waitTask waits for a task to leave pending and returns its status and
// error_info.
func (ev *evacPool) waitTask(task string, bound time.Duration) (string, []string) {
	ev.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		st := ev.r.Str("task.get_status", task)
		if st != "pending" && st != "cancelling" {
			var info []string
			_ = json.Unmarshal(ev.r.Call("task.get_error_info", task), &info)
			return st, info
		}
		if time.Now().After(deadline) {
			ev.t.Fatalf("task %s still %s after %v", task, st, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// movedFrom counts the VMs of vms no longer resident on host.
func (ev *evacPool) movedFrom(vms []string, host string) int {
	n := 0
	for _, vm := range vms {
		if ev.r.Str("VM.get_resident_on", vm) != host {
			n++
		}
	}
	return n
}

// assertNoGuests checks that no guest is resident on host.
func (ev *evacPool) assertNoGuests(host string) {
	ev.t.Helper()
	var vms []string
	if err := json.Unmarshal(ev.r.Call("host.get_resident_VMs", host), &vms); err != nil {
		ev.t.Fatal(err)
	}
	for _, vm := range vms {
		var dom0 bool
		_ = json.Unmarshal(ev.r.Call("VM.get_is_control_domain", vm), &dom0)
		if !dom0 {
			ev.t.Errorf("%s is still resident on the evacuated host", vm)
		}
	}
}

// assertOneHostEach checks that every VM of vms is running, resident on
// a host of the pool that lists it (and no other host does), with no
// operation left in progress on it, as each host's own replica says once
// it has caught up.
func (ev *evacPool) assertOneHostEach(vms []string) {
	ev.t.Helper()
	r := ev.r
	listed := map[string][]string{}
	for _, h := range ev.hosts {
		var res []string
		if err := json.Unmarshal(r.Call("host.get_resident_VMs", h), &res); err != nil {
			ev.t.Fatal(err)
		}
		for _, vm := range res {
			listed[vm] = append(listed[vm], h)
		}
	}
	for _, vm := range vms {
		on := r.Str("VM.get_resident_on", vm)
		if ps := r.Str("VM.get_power_state", vm); ps != "Running" {
			ev.t.Errorf("%s is %s", vm, ps)
		}
		if !slices.Equal(listed[vm], []string{on}) {
			ev.t.Errorf("%s is resident on %s, listed by %v", vm, on, listed[vm])
		}
		var ops map[string]string
		_ = json.Unmarshal(r.Call("VM.get_current_operations", vm), &ops)
		if len(ops) != 0 {
			ev.t.Errorf("%s still has operations in progress: %v", vm, ops)
		}
		var domid int64
		_ = json.Unmarshal(r.Call("VM.get_domid", vm), &domid)
		if domid < 0 {
			ev.t.Errorf("%s runs without a domain: domid %d", vm, domid)
		}
		// The simulators: one domain, on the resident host (a source
		// removes its stopped domain as the move ends).
		uuid := r.Str("VM.get_uuid", vm)
		deadline := time.Now().Add(20 * time.Second)
		for {
			var in []string
			for i, h := range ev.hosts {
				if suite.SimDomainIn(ev.t, ev.p.Hosts[i].DataDir, uuid) {
					in = append(in, h)
				}
			}
			if slices.Equal(in, []string{on}) {
				break
			}
			if time.Now().After(deadline) {
				ev.t.Errorf("%s (resident on %s) has simulator domains on %v", vm, on, in)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestEvacuateFigure measures the evacuation of a host running N=100
// simulated VMs (host.evacuate, default batch of 10) against the same 100
// moves made one after another with VM.pool_migrate by one client, in
// the same pool and session. It runs with TOOLSTACKD_FIGURES=1 and
// prints the figure (docs/performance.md, issue 18).
func TestEvacuateFigure(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure the evacuation figure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	ev := newEvacPool(t, ctx, nil)
	r, hosts := ev.r, ev.hosts
	src, dst := hosts[1], hosts[2]
	const n = 100
	vms := make([]string, n)
	for i := range vms {
		vms[i] = ev.newVM(fmt.Sprintf("fig-%d", i), 64<<20, ev.sr)
		r.Call("VM.start_on", vms[i], src, false, false)
	}
	var seq, evac []time.Duration
	for range 3 {
		start := time.Now()
		for _, vm := range vms {
			r.Call("VM.pool_migrate", vm, dst, map[string]string{"live": "true"})
		}
		seq = append(seq, time.Since(start))
		for _, vm := range vms {
			r.Call("VM.pool_migrate", vm, src, map[string]string{"live": "true"})
		}
		start = time.Now()
		r.Call("host.evacuate", src, "OpaqueRef:NULL", 0)
		evac = append(evac, time.Since(start))
		ev.assertNoGuests(src)
		for _, vm := range vms {
			r.Call("VM.pool_migrate", vm, src, map[string]string{"live": "true"})
		}
	}
	slices.Sort(seq)
	slices.Sort(evac)
	t.Logf("%d simulated VMs: %d sequential VM.pool_migrate calls median %v; host.evacuate (batch 10) median %v; ratio %.2f",
		n, n, seq[1], evac[1], float64(evac[1])/float64(seq[1]))
}

// Two guests on real QEMU (TCG), their disks on the shared SR, are
// evacuated from a member to the coordinator: at the end one QEMU process
// runs each, with its state only in the coordinator's directory, and the
// records follow.
func TestEvacuateQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	ctx := suite.Ctx(t)
	ev := newEvacPoolWith(t, ctx, pooltest.Options{Hosts: 2, Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	r, hosts := ev.r, ev.hosts
	var vms, uuids []string
	for i := range 2 {
		vm := ev.newVM(fmt.Sprintf("qemu-evac-%d", i), 128<<20, ev.sr)
		r.Call("VM.start_on", vm, hosts[1], false, false)
		t.Cleanup(func() { _, _ = r.C.Call(context.Background(), r.At, "VM.hard_shutdown", r.S, vm) })
		vms, uuids = append(vms, vm), append(uuids, r.Str("VM.get_uuid", vm))
	}
	task := r.Str("Async.host.evacuate", hosts[1], "OpaqueRef:NULL", 0)
	if st, info := ev.waitTask(task, 120*time.Second); st != "success" {
		t.Fatalf("host.evacuate: %s %v", st, info)
	}
	ev.assertNoGuests(hosts[1])
	for i, vm := range vms {
		if ps, on := r.Str("VM.get_power_state", vm), r.Str("VM.get_resident_on", vm); ps != "Running" || on != hosts[0] {
			t.Errorf("%s after the evacuation: %s on %s", vm, ps, on)
		}
		if pids := suite.QEMUOf(uuids[i]); len(pids) != 1 {
			t.Errorf("%s runs in %d QEMU processes: %v", vm, len(pids), pids)
		}
		if !suite.IsDir(filepath.Join(ev.p.Hosts[0].DataDir, "xenops", "qemu", uuids[i])) ||
			suite.IsDir(filepath.Join(ev.p.Hosts[1].DataDir, "xenops", "qemu", uuids[i])) {
			t.Errorf("%s's QEMU state is not (only) on the coordinator", vm)
		}
	}
}

// A member running 10 simulated VMs and 2 guests on real QEMU (TCG)
// side by side (--backend qemu+simulator) is evacuated to the
// coordinator: every VM ends running there, each QEMU guest in exactly
// one QEMU process (on the coordinator), each simulated one in the
// coordinator's simulator, and the member holds none.
func TestEvacuateMixed(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	ctx := suite.Ctx(t)
	ev := newEvacPoolWith(t, ctx, pooltest.Options{Hosts: 2, Daemon: testdaemon.Options{Backend: "qemu+simulator",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}, ExtraArgs: []string{"--host-memory", "8GiB"}}})
	r, hosts := ev.r, ev.hosts
	var vms, simVMs, qemuUUIDs, simUUIDs []string
	for i := range 12 {
		simulated := i >= 2
		vm := ev.newVM(fmt.Sprintf("mixed-evac-%d", i), 128<<20, ev.sr)
		if simulated {
			r.Call("VM.add_to_platform", vm, "toolstackd-simulated", "true")
		}
		r.Call("VM.start_on", vm, hosts[1], false, false)
		t.Cleanup(func() { _, _ = r.C.Call(context.Background(), r.At, "VM.hard_shutdown", r.S, vm) })
		vms = append(vms, vm)
		if simulated {
			simVMs = append(simVMs, vm)
			simUUIDs = append(simUUIDs, r.Str("VM.get_uuid", vm))
		} else {
			qemuUUIDs = append(qemuUUIDs, r.Str("VM.get_uuid", vm))
		}
	}
	for _, u := range qemuUUIDs {
		if pids := suite.QEMUOf(u); len(pids) != 1 {
			t.Fatalf("QEMU guest %s runs in %d QEMU processes before the evacuation", u, len(pids))
		}
	}
	for _, u := range simUUIDs {
		if pids := suite.QEMUOf(u); len(pids) != 0 {
			t.Fatalf("simulated VM %s has QEMU processes %v", u, pids)
		}
	}
	start := time.Now()
	task := r.Str("Async.host.evacuate", hosts[1], "OpaqueRef:NULL", 0)
	if st, info := ev.waitTask(task, 180*time.Second); st != "success" {
		t.Fatalf("host.evacuate: %s %v", st, info)
	}
	t.Logf("host.evacuate of 10 simulated VMs and 2 QEMU guests: %v", time.Since(start).Round(time.Millisecond))
	ev.assertNoGuests(hosts[1])
	ev.assertOneHostEach(simVMs)
	for _, vm := range vms {
		if ps := r.Str("VM.get_power_state", vm); ps != "Running" {
			t.Errorf("%s is %s after the evacuation", vm, ps)
		}
		if on := r.Str("VM.get_resident_on", vm); on != hosts[0] {
			t.Errorf("%s is on %s after the evacuation, want the coordinator", vm, on)
		}
	}
	for _, u := range qemuUUIDs {
		if pids := suite.QEMUOf(u); len(pids) != 1 {
			t.Errorf("QEMU guest %s runs in %d QEMU processes after the evacuation: %v", u, len(pids), pids)
		}
		if !suite.IsDir(filepath.Join(ev.p.Hosts[0].DataDir, "xenops", "qemu", u)) || suite.IsDir(filepath.Join(ev.p.Hosts[1].DataDir, "xenops", "qemu", u)) {
			t.Errorf("%s's QEMU state is not (only) on the coordinator", u)
		}
	}
	for _, u := range simUUIDs {
		if pids := suite.QEMUOf(u); len(pids) != 0 {
			t.Errorf("simulated VM %s has QEMU processes %v after the evacuation", u, pids)
		}
		if !suite.IsFile(filepath.Join(ev.p.Hosts[0].DataDir, "xenops", "sim", u+".json")) || suite.IsFile(filepath.Join(ev.p.Hosts[1].DataDir, "xenops", "sim", u+".json")) {
			t.Errorf("simulated VM %s is not (only) in the coordinator's simulator", u)
		}
	}
}

// With HA on, evacuating must leave the pool as a host failure and HA's
// restarts would: a VM HA does not protect prevents it
// (HOST_EVACUATE_VM_NOT_HA_PROTECTED [vm]); once it is shut down the
// protected VM moves. (Refusal by the failover plan,
// HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN, is in TestHAOvercommitRefusals.)
func TestEvacuateWithHA(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Daemon: testdaemon.Options{ExtraArgs: []string{
		"--ha-timing", suite.HATiming, "--host-memory", "4GiB"}}})
	pool := suite.PoolRef(t, ctx, r.C, p, 0, r.S)
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	r.Call("pool.set_ha_host_failures_to_tolerate", pool, 1)
	prot, unprot := suite.SizedVM(r, "protected", 256<<20), suite.SizedVM(r, "unprotected", 256<<20)
	r.Call("VM.set_ha_restart_priority", prot, "restart")
	for _, vm := range []string{prot, unprot} {
		r.Call("VM.start_on", vm, hosts[1], false, false)
	}
	suite.WaitPlanFor(r, pool, "1", "false")
	var prevent map[string][]string
	if err := json.Unmarshal(r.Call("host.get_vms_which_prevent_evacuation", hosts[1]), &prevent); err != nil {
		t.Fatal(err)
	}
	if len(prevent) != 1 || !slices.Equal(prevent[unprot], []string{xerr.HostEvacuateVMNotHAProtected, unprot}) {
		t.Fatalf("get_vms_which_prevent_evacuation with HA on: %v", prevent)
	}
	if _, err := r.C.Call(ctx, r.At, "host.evacuate", r.S, hosts[1], "OpaqueRef:NULL", 0); pooltest.Code(err) != xerr.HostEvacuateVMNotHAProtected {
		t.Fatalf("host.evacuate with an unprotected VM: %v", err)
	}
	r.Call("VM.hard_shutdown", unprot)
	r.Call("host.evacuate", hosts[1], "OpaqueRef:NULL", 0)
	if on := r.Str("VM.get_resident_on", prot); on == hosts[1] || r.Str("VM.get_power_state", prot) != "Running" {
		t.Fatalf("the protected VM after the evacuation: on %s", on)
	}
}
