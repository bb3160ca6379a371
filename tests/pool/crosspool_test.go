package pool

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"toolstackd/internal/pooltest"
	"toolstackd/internal/testdaemon"
	"toolstackd/internal/xerr"
)

// Cross-pool migration (issue 18): two toolstackd processes that are not
// joined, each a pool of its own with its local SR; a running VM of pool
// A moves to pool B's host with its disk (VM.migrate_send with B's
// host.migrate_receive dest map, B's session inside it), as XO and xe
// vm-migrate remote-master= call it.

// twoPools starts two hosts and does not join them: a session on each.
func twoPools(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, [2]rpc, [2]string) {
	t.Helper()
	o.Hosts = 2
	p := pooltest.Start(t, o)
	c := pooltest.NewClient(netip.Addr{})
	var rs [2]rpc
	var hosts [2]string
	for i := range 2 {
		s, err := p.Login(ctx, c, i)
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = rpc{t, ctx, c, p.Addr(i), s}
		var all []string
		if err := json.Unmarshal(rs[i].call("host.get_all"), &all); err != nil || len(all) != 1 {
			t.Fatalf("host.get_all on pool %d: %v %v", i, all, err)
		}
		hosts[i] = all[0]
	}
	return p, rs, hosts
}

// mgmtNetwork is the network of host's management PIF.
func mgmtNetwork(r rpc, host string) string {
	r.t.Helper()
	var pifs map[string]map[string]any
	if err := json.Unmarshal(r.call("PIF.get_all_records"), &pifs); err != nil {
		r.t.Fatal(err)
	}
	for _, p := range pifs {
		if p["host"] == host && p["management"] == true {
			return p["network"].(string)
		}
	}
	r.t.Fatalf("host %s has no management PIF", host)
	return ""
}

// crossVM makes a VM on pool A with a disk on sr (a known pattern on it)
// and a VIF on net, started: the VM, its VDI, VIF and the disk's sum.
func crossVM(t *testing.T, r rpc, sr, net string) (vm, vdi, vif string, sum [32]byte) {
	t.Helper()
	vm = sharedVM(r, sr, "xpool", nil)
	_, vdi = vmDisk(r, vm)
	sum = writePattern(t, r, r.at, vdi, 4<<20)
	vif = r.str("VIF.create", map[string]any{"device": "0", "network": net, "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	r.call("VM.start", vm, false, false)
	return vm, vdi, vif, sum
}

// assertArgs are VM.assert_can_migrate's arguments after the session.
func assertArgs(vm string, dest, vdiMap, vifMap map[string]string) []any {
	return []any{vm, dest, true, vdiMap, vifMap, map[string]string{}, map[string]string{}}
}

func TestCrossPoolMigrateSimulator(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	vm, vdi, vif, sum := crossVM(t, a, srA, mgmtNetwork(a, hosts[0]))
	uuid := a.str("VM.get_uuid", vm)
	before := srVDIs(b, srB)
	dest := destMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: mgmtNetwork(b, hosts[1])}

	// The checks pass first.
	a.call("VM.assert_can_migrate", assertArgs(vm, dest, vdiMap, vifMap)...)
	t0 := time.Now()
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	t.Logf("cross-pool move of the simulator VM: %v", time.Since(t0))

	// Pool B has it, running on its host, with the same uuid.
	if got := b.str("VM.get_by_uuid", uuid); got != newVM {
		t.Fatalf("VM.get_by_uuid on pool B: %s, migrate_send returned %s", got, newVM)
	}
	s := vmWhere(b, newVM)
	if s.Power != "Running" || s.On != hosts[1] || len(s.Ops) != 0 {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	_, nv := vmDisk(b, newVM)
	if b.str("VDI.get_SR", nv) != srB || srVDIs(b, srB) != before+1 {
		t.Fatalf("the new VDI %s is not pool B's local SR's", nv)
	}
	// The simulator's mirror only accounts for a qcow2 image's bytes (see
	// internal/xenops/sim/mirror.go): the data is compared with QEMU
	// (TestCrossPoolMigrateQEMU); here the size.
	_ = sum
	if n := string(b.call("VDI.get_virtual_size", nv)); n != "4194304" {
		t.Fatalf("the new VDI's virtual size: %s", n)
	}
	var vifs []string
	if err := json.Unmarshal(b.call("VM.get_VIFs", newVM), &vifs); err != nil || len(vifs) != 1 ||
		b.str("VIF.get_network", vifs[0]) != mgmtNetwork(b, hosts[1]) {
		t.Fatalf("the VIFs on pool B: %v %v", vifs, err)
	}
	// Pool A has neither the VM nor its old disk.
	for _, q := range [][2]string{{"VM.get_uuid", vm}, {"VDI.get_uuid", vdi}, {"VIF.get_uuid", vif}} {
		if _, err := a.c.Call(ctx, a.at, q[0], a.s, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s on pool A after the move: %v", q[0], err)
		}
	}
	if _, err := a.c.Call(ctx, a.at, "VM.get_by_uuid", a.s, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	// And back with xe on pool B, as xapi's xe does it (remote-master=
	// pool A, a login there, host.migrate_receive there, VM.migrate_send
	// here); the VIF is left to the default (the receiving network).
	xe := testdaemonCLI(t, b, p.Password())
	_, nv = vmDisk(b, newVM)
	xe("vm-migrate", "uuid="+uuid, "remote-master="+a.at, "remote-username=root", "remote-password="+p.Password(),
		"host="+a.str("host.get_uuid", hosts[0]), "vdi:"+b.str("VDI.get_uuid", nv)+"="+a.str("SR.get_uuid", srA))
	back := a.str("VM.get_by_uuid", uuid)
	if s := vmWhere(a, back); s.Power != "Running" || s.On != hosts[0] || len(s.Ops) != 0 {
		t.Fatalf("on pool A after xe vm-migrate: %+v", s)
	}
	if _, err := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool B after xe vm-migrate: %v", err)
	}
	a.call("VM.hard_shutdown", back)
}

// A cancelled cross-pool move leaves the VM running on pool A and
// nothing on pool B; bad dest maps get XenAPI errors.
func TestCrossPoolMigrateCancelAndRefusals(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{
		Env: []string{"TOOLSTACKD_SIM_DELAYS=mirror-copy=8s"}}})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	vm, vdi, vif, _ := crossVM(t, a, srA, mgmtNetwork(a, hosts[0]))
	uuid := a.str("VM.get_uuid", vm)
	before := srVDIs(b, srB)
	dest := destMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: mgmtNetwork(b, hosts[1])}

	refuse := func(what, code string, dest map[string]string, vdiMap, vifMap map[string]string) {
		t.Helper()
		for _, m := range []string{"VM.assert_can_migrate", "VM.migrate_send"} {
			args := migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})
			if m == "VM.assert_can_migrate" {
				args = assertArgs(vm, dest, vdiMap, vifMap)
			}
			_, err := a.c.Call(ctx, a.at, m, append([]any{a.s}, args...)...)
			wantRefusal(t, m+": "+what, err, code)
		}
	}
	bad := map[string]string{}
	for k, v := range dest {
		bad[k] = v
	}
	bad["session_id"] = "OpaqueRef:00000000-0000-0000-0000-000000000bad"
	refuse("a session pool B does not know", xerr.SessionInvalid, bad, vdiMap, vifMap)
	refuse("a disk not in the map", xerr.VDINotInMap, dest, map[string]string{}, vifMap)
	refuse("a VIF not in the map", xerr.VIFNotInMap, dest, vdiMap, map[string]string{})
	refuse("an SR pool B does not have", xerr.HandleInvalid, dest, map[string]string{vdi: srA}, vifMap)

	// The destination's endpoint takes only its own pool's sessions and
	// only as an upgrade.
	for _, c := range []struct {
		what, session string
		upgrade       bool
		want          int
	}{
		{"no session", "", true, http.StatusUnauthorized},
		{"pool A's session", a.s, true, http.StatusUnauthorized},
		{"no upgrade", b.s, false, http.StatusUpgradeRequired},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.at+"/migrate?session_id="+url.QueryEscape(c.session), http.NoBody)
		if err != nil {
			t.Fatal(err)
		}
		if c.upgrade {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "toolstackd-crosspool-migrate/1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("POST /migrate with %s: %d, want %d", c.what, resp.StatusCode, c.want)
		}
	}

	cancelAt := func(what string, lo, hi float64) {
		t.Helper()
		task := a.str("Async.VM.migrate_send", migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
		waitUntil(t, 60*time.Second, what, func() bool {
			if st := a.str("task.get_status", task); st != "pending" {
				t.Fatalf("%s: the migration ended early: %s %s", what, st, a.call("task.get_error_info", task))
			}
			var prog float64
			_ = json.Unmarshal(a.call("task.get_progress", task), &prog)
			return prog > lo && prog < hi
		})
		a.call("task.cancel", task)
		if st, info := waitTask(t, a, task); st != "cancelled" {
			t.Fatalf("%s: a cancelled migration: %s %v", what, st, info)
		}
		waitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(vmWhere(a, vm).Ops) == 0 })
		if s := vmWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
			t.Fatalf("%s: after the cancel: %+v", what, s)
		}
		if _, v := vmDisk(a, vm); v != vdi {
			t.Fatalf("%s: the VBD is on %s after the cancel", what, v)
		}
		if !simDomainIn(t, p.Hosts[0].DataDir, uuid) {
			t.Fatalf("%s: the VM's domain is gone from pool A", what)
		}
		waitUntil(t, 30*time.Second, "pool B to drop what it made", func() bool {
			_, err := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, uuid)
			return pooltest.Code(err) == xerr.UUIDInvalid && !simDomainIn(t, p.Hosts[1].DataDir, uuid) && srVDIs(b, srB) == before
		})
	}
	// The mirror takes 8 s: cancelled while the disk is copied.
	cancelAt("the mirror", 0.12, 0.5)
	// The memory capped at 40 bytes a second: cancelled while it goes.
	a.call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	cancelAt("the memory", 0.55, 0.9)
	// Nothing was left in the way.
	a.call("VM.remove_from_other_config", vm, "migration_bandwidth")
	task := a.str("Async.VM.migrate_send", migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	if st, info := waitTask(t, a, task); st != "success" {
		t.Fatalf("the move after the cancels: %s %v", st, info)
	}
	if s := vmWhere(b, b.str("VM.get_by_uuid", uuid)); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move: %+v", s)
	}
}

// A running guest on real QEMU (TCG), a known pattern on its disk, moves
// from pool A to pool B: it counts on there without a reboot, one QEMU
// process runs it, and pool B's new VDI holds the same bytes.
func TestCrossPoolMigrateQEMU(t *testing.T) {
	g := tickGuest(t) // migrate_fault_test.go: "TICK n" on the serial port
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}}})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	const size = 64 << 20
	vm := a.str("VM.create", testdaemon.VMRecord("qemu-xpool"))
	vdi := a.str("VDI.create", map[string]any{"name_label": "xpool disk", "name_description": "", "SR": srA,
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	a.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	sum := writePattern(t, a, a.at, vdi, size)
	uuid := a.str("VM.get_uuid", vm)
	g.setOn(a, vm)
	t.Cleanup(func() { killQEMUs(uuid) })
	a.call("VM.start", vm, false, false)
	ticks := &tickLog{}
	t.Cleanup(ticks.close)
	if _, err := ticks.follow(p.Hosts[0].DataDir, uuid, 0); err != nil {
		t.Fatal(err)
	}
	ticks.wait(t, 0, 3, 2*time.Minute) // the guest runs

	t0 := time.Now()
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, destMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	t.Logf("cross-pool move of the QEMU guest with its %d MiB disk: %v", size>>20, time.Since(t0))
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] || b.str("VM.get_uuid", newVM) != uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if pids := qemuOf(uuid); len(pids) != 1 {
		t.Fatalf("QEMU processes of the VM after the move: %v", pids)
	}
	n := ticks.count(1)
	if _, err := ticks.follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.wait(t, 1, n+3, time.Minute) // it counts on, on pool B
	ticks.check(t)
	_, nv := vmDisk(b, newVM)
	if b.str("VDI.get_SR", nv) != srB {
		t.Fatalf("the new VDI %s is not on pool B's local SR", nv)
	}
	if got := readDisk(t, b, b.at, nv); len(got) != size || sha256.Sum256(got) != sum {
		t.Fatalf("the moved disk differs: %d bytes", len(got))
	}
	if _, err := a.c.Call(ctx, a.at, "VM.get_by_uuid", a.s, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	if _, err := a.c.Call(ctx, a.at, "VDI.get_uuid", a.s, vdi); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old VDI on pool A after the move: %v", err)
	}
}

// The figure for docs/performance.md: a running simulated VM with its
// 4 MiB disk moved back and forth between two pools, against the same
// VM moved with its disk between the two hosts of one pool (storage
// migration inside the pool), on this machine in the same run. The
// medians of TOOLSTACKD_XPOOL_ROUNDS moves (default 10) each way are
// logged with their ratio.
func TestCrossPoolFigure(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	rounds := 10
	if n, err := strconv.Atoi(os.Getenv("TOOLSTACKD_XPOOL_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	ctx := testCtx(t)
	// Inside one pool: the baseline.
	var intra []time.Duration
	{
		_, r, hosts := storagePool(t, ctx, pooltest.Options{})
		local := []string{r.localSR(hosts[0]), r.localSR(hosts[1])}
		vm := sharedVM(r, local[0], "figure-intra", nil)
		r.call("VM.start_on", vm, hosts[0], false, false)
		for i := range rounds {
			to := (i + 1) % 2
			_, vdi := vmDisk(r, vm)
			dest := destMap(r, hosts[to])
			t0 := time.Now()
			r.call("VM.migrate_send", migrateSendArgs(vm, dest, map[string]string{vdi: local[to]}, map[string]string{}, map[string]string{})...)
			intra = append(intra, time.Since(t0))
		}
	}
	// Between two pools.
	_, rs, hosts := twoPools(t, ctx, pooltest.Options{})
	srs := [2]string{rs[0].localSR(hosts[0]), rs[1].localSR(hosts[1])}
	vm := sharedVM(rs[0], srs[0], "figure-cross", nil)
	uuid := rs[0].str("VM.get_uuid", vm)
	rs[0].call("VM.start", vm, false, false)
	var cross []time.Duration
	for i := range rounds {
		from, to := i%2, (i+1)%2
		_, vdi := vmDisk(rs[from], vm)
		dest := destMap(rs[to], hosts[to])
		t0 := time.Now()
		vm = rs[from].str("VM.migrate_send", migrateSendArgs(vm, dest, map[string]string{vdi: srs[to]}, map[string]string{}, map[string]string{})...)
		cross = append(cross, time.Since(t0))
		if got := rs[to].str("VM.get_uuid", vm); got != uuid {
			t.Fatalf("round %d: the VM's uuid on the other pool is %s", i, got)
		}
	}
	mi, mc := med(intra), med(cross)
	t.Logf("figure: VM.migrate_send of a running simulated VM with a 4 MiB disk, median of %d: inside a pool %v, to another pool %v (%.2fx)",
		rounds, mi, mc, float64(mc)/float64(mi))
}

// A QEMU guest's move to another pool cancelled while its disk is
// mirrored, then while its memory goes (migration_bandwidth, 8 MiB/s,
// holds both): each time it counts on in pool A with its old disk, and
// pool B has no QEMU, no VM and no new VDI; then it moves and counts on
// there.
func TestCrossPoolMigrateQEMUCancel(t *testing.T) {
	g := tickGuest(t)
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}}})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	vm := sharedVM(a, srA, "qemu-xpool-cancel", map[string]string{"migration_bandwidth": strconv.Itoa(8 << 20)})
	a.call("VDI.resize", vmDiskVDI(a, vm), 64<<20)
	_, vdi := vmDisk(a, vm)
	writePattern(t, a, a.at, vdi, 64<<20)
	uuid := a.str("VM.get_uuid", vm)
	g.setOn(a, vm)
	t.Cleanup(func() { killQEMUs(uuid) })
	a.call("VM.start", vm, false, false)
	ticks := &tickLog{}
	t.Cleanup(ticks.close)
	if _, err := ticks.follow(p.Hosts[0].DataDir, uuid, 0); err != nil {
		t.Fatal(err)
	}
	ticks.wait(t, 0, 3, 2*time.Minute)
	before := srVDIs(b, srB)
	vdiMap := map[string]string{vdi: srB}
	cancelAt := func(what string, lo, hi float64) {
		t.Helper()
		task := a.str("Async.VM.migrate_send", migrateSendArgs(vm, destMap(b, hosts[1]), vdiMap, map[string]string{}, map[string]string{})...)
		waitUntil(t, 2*time.Minute, what, func() bool {
			if st := a.str("task.get_status", task); st != "pending" {
				t.Fatalf("%s: the migration ended early: %s %s", what, st, a.call("task.get_error_info", task))
			}
			var prog float64
			_ = json.Unmarshal(a.call("task.get_progress", task), &prog)
			return prog > lo && prog < hi
		})
		a.call("task.cancel", task)
		if st, info := waitTask(t, a, task); st != "cancelled" {
			t.Fatalf("%s: a cancelled migration: %s %v", what, st, info)
		}
		waitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(vmWhere(a, vm).Ops) == 0 })
		if s := vmWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
			t.Fatalf("%s: after the cancel: %+v", what, s)
		}
		if _, v := vmDisk(a, vm); v != vdi {
			t.Fatalf("%s: the VBD is on %s after the cancel", what, v)
		}
		waitUntil(t, 30*time.Second, "pool B to drop its QEMU, VM and VDI", func() bool {
			_, err := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, uuid)
			return len(qemuOf(uuid)) == 1 && srVDIs(b, srB) == before && pooltest.Code(err) == xerr.UUIDInvalid
		})
		ticks.wait(t, 0, ticks.count(0)+3, time.Minute) // the guest counts on where it was
	}
	cancelAt("the mirror", 0.12, 0.5)
	cancelAt("the memory", 0.505, 0.9)
	a.call("VM.remove_from_other_config", vm, "migration_bandwidth")
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, destMap(b, hosts[1]), vdiMap, map[string]string{}, map[string]string{})...)
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if _, err := ticks.follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.wait(t, 1, 3, time.Minute)
	ticks.check(t)
}

// crossHalted is a halted VM on pool A with a disk on A's local SR that
// holds a pattern, ready to move to pool B's host 1 and local SR.
type crossHalted struct {
	ctx       context.Context
	a, b      rpc
	hosts     [2]string
	srB       string
	vm, vdi   string
	uuid      string
	diskBytes [32]byte
}

func newCrossHalted(t *testing.T, name string) *crossHalted {
	t.Helper()
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := testCtx(t)
	_, rs, hosts := twoPools(t, ctx, pooltest.Options{})
	m := &crossHalted{ctx: ctx, a: rs[0], b: rs[1], hosts: hosts, srB: rs[1].localSR(hosts[1])}
	m.vm = sharedVM(m.a, m.a.localSR(hosts[0]), name, nil)
	_, m.vdi = vmDisk(m.a, m.vm)
	m.diskBytes = writePattern(t, m.a, m.a.at, m.vdi, 4<<20)
	m.uuid = m.a.str("VM.get_uuid", m.vm)
	return m
}

// send moves the VM with its disk to pool B's local SR and checks that
// it arrived in power state power, with its uuid and no operation left
// marked, and that its disk's bytes came along; it returns the VM and
// its disk on pool B.
func (m *crossHalted) send(t *testing.T, power string) (newVM, newVDI string) {
	t.Helper()
	newVM = m.a.str("VM.migrate_send", migrateSendArgs(m.vm, destMap(m.b, m.hosts[1]), map[string]string{m.vdi: m.srB},
		map[string]string{}, map[string]string{})...)
	if s := vmWhere(m.b, newVM); s.Power != power || len(s.Ops) != 0 || m.b.str("VM.get_uuid", newVM) != m.uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	_, newVDI = vmDisk(m.b, newVM)
	if got := readDisk(t, m.b, m.b.at, newVDI); len(got) != 4<<20 || sha256.Sum256(got) != m.diskBytes {
		t.Fatalf("the moved disk differs: %d bytes", len(got))
	}
	return newVM, newVDI
}

// goneFromA checks that pool A no longer holds the VM, its disk, nor the
// other VDIs named.
func (m *crossHalted) goneFromA(t *testing.T, vdis ...string) {
	t.Helper()
	qs := [][2]string{{"VM.get_uuid", m.vm}, {"VDI.get_uuid", m.vdi}}
	for _, v := range vdis {
		qs = append(qs, [2]string{"VDI.get_uuid", v})
	}
	for _, q := range qs {
		if _, err := m.a.c.Call(m.ctx, m.a.at, q[0], m.a.s, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s on pool A after the move: %v", q[0], err)
		}
	}
}

// A halted VM moves to another pool as xapi allows: its records and its
// disk's bytes (copied, as nothing writes it) arrive, it stays halted
// there, and it starts there.
func TestCrossPoolMigrateHalted(t *testing.T) {
	m := newCrossHalted(t, "xpool-halted")
	b := m.b
	before := srVDIs(b, m.srB)
	newVM, nv := m.send(t, "Halted")
	if b.str("VDI.get_SR", nv) != m.srB || srVDIs(b, m.srB) != before+1 {
		t.Fatalf("the new VDI %s is not pool B's local SR's", nv)
	}
	m.goneFromA(t)
	b.call("VM.start", newVM, false, false)
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != m.hosts[1] {
		t.Fatalf("started on pool B: %+v", s)
	}
}

// A suspended VM moves to another pool as xapi allows: its disk and its
// memory image are copied (the image to the other pool's suspend image
// SR, else its default SR), it arrives suspended on a suspend VDI made
// for it (vmhint), and resumes there from the image that moved.
func TestCrossPoolMigrateSuspended(t *testing.T) {
	m := newCrossHalted(t, "xpool-suspended")
	a, b := m.a, m.b
	a.call("VM.start", m.vm, false, false)
	a.call("VM.suspend", m.vm)
	sv := a.str("VM.get_suspend_VDI", m.vm)
	image := readDisk(t, a, a.at, sv)
	newVM, _ := m.send(t, "Suspended")
	nsv := b.str("VM.get_suspend_VDI", newVM)
	if b.str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the VM's memory image on pool B: %s", b.call("VDI.get_record", nsv))
	}
	if got := readDisk(t, b, b.at, nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the memory image differs on pool B")
	}
	m.goneFromA(t, sv)
	b.call("VM.resume", newVM, false, false)
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != m.hosts[1] {
		t.Fatalf("resumed on pool B: %+v", s)
	}
	b.call("VM.hard_shutdown", newVM)
}

// Over https: the other pool's hosts are checked by the system's roots
// and the CA certificates installed in this pool. Pool B's host
// certificate is not trusted by pool A until A installs it
// (pool.install_ca_certificate): before, the move is refused and the VM
// stays on A; after, it moves, calls and stream over TLS.
func TestCrossPoolMigrateTLS(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	if !pooltest.DaemonHasFlag(t, "--listen-https") {
		t.Skip("toolstackd has no --listen-https")
	}
	ctx := testCtx(t)
	ips := []string{pooltest.HostIP(0).String(), pooltest.HostIP(1).String()}
	port := testdaemon.FreePort(t, ips...)
	args := map[int][]string{}
	for i, ip := range ips {
		args[i] = []string{"--listen-https", testdaemon.Addr(ip, port)}
	}
	_, rs, hosts := twoPools(t, ctx, pooltest.Options{HostArgs: args})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	vm, vdi, vif, _ := crossVM(t, a, srA, mgmtNetwork(a, hosts[0]))
	uuid := a.str("VM.get_uuid", vm)
	dest := destMap(b, hosts[1])
	dest["master"] = "https://" + testdaemon.Addr(ips[1], port) + "/"
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: mgmtNetwork(b, hosts[1])}

	if _, err := a.c.Call(ctx, a.at, "VM.migrate_send", append([]any{a.s}, migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)...); pooltest.Code(err) != xerr.SSLVerifyError {
		t.Fatalf("VM.migrate_send to a pool whose certificate this pool does not trust: %v, want SSL_VERIFY_ERROR", err)
	} else {
		t.Logf("before pool B's certificate is trusted: %v", err)
	}
	if s := vmWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("on pool A after the refused move: %+v", s)
	}
	if _, err := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("pool B has the VM after the refused move: %v", err)
	}

	a.call("pool.install_ca_certificate", "pool-b.pem", b.str("host.get_server_certificate", hosts[1]))
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move over https: %+v", s)
	}
	if _, err := a.c.Call(ctx, a.at, "VM.get_by_uuid", a.s, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	b.call("VM.hard_shutdown", newVM)
}

// A VM with a snapshot, a read-only disk and a CD with a disc moves to
// another pool, on the simulator and on real QEMU (TCG). The snapshot
// was taken between two different patterns written to the VM's disk.
// Pool B has the VM and its snapshot (same uuids, is_a_snapshot,
// snapshot_of, snapshot_time), the snapshot's disk copied to where the
// VM's disk went (vdi_map names only the VM's disk: the snapshot's VDI
// follows its snapshot_of) as a snapshot VDI of the VM's new disk, the
// read-only disk copied, and both CD drives empty (xapi ejects the VM's
// CDs for a move to another pool; the ISO VDI in vdi_map is ignored);
// pool A has neither the VM nor the snapshot nor their disks, but still
// the ISO.
func TestCrossPoolMigrateSnapshotsReadOnlyCDSimulator(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{})
	crossSnapshotsCase(t, ctx, p, rs, hosts, false)
}

func TestCrossPoolMigrateSnapshotsReadOnlyCDQEMU(t *testing.T) {
	for _, bin := range []string{"qemu-nbd", "qemu-system-x86_64"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skip("no " + bin)
		}
	}
	ctx := testCtx(t)
	p, rs, hosts := twoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	crossSnapshotsCase(t, ctx, p, rs, hosts, true)
}

// crossSnapshotsCase is the two tests' body; qemu: the VM's mirrored
// disk's bytes can be compared (the simulator's mirror does not copy a
// qcow2 image's data).
func crossSnapshotsCase(t *testing.T, ctx context.Context, p *pooltest.Pool, rs [2]rpc, hosts [2]string, qemu bool) {
	t.Helper()
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	netA, netB := mgmtNetwork(a, hosts[0]), mgmtNetwork(b, hosts[1])
	newVDI := func(name string) string {
		return a.str("VDI.create", map[string]any{"name_label": name, "name_description": "", "SR": srA,
			"virtual_size": 4 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
			"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	}
	vbd := func(vm, vdi, dev, mode, typ string) {
		a.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": dev, "bootable": false, "mode": mode, "type": typ,
			"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	}
	vm := sharedVM(a, srA, "xpool-snapshots", nil)
	uuid := a.str("VM.get_uuid", vm)
	if qemu {
		t.Cleanup(func() { killQEMUs(uuid) })
	}
	_, vdi := vmDisk(a, vm)
	iso := newVDI("xpool iso")
	writePattern(t, a, a.at, iso, 4<<20)
	vbd(vm, iso, "3", "RO", "CD")
	vif := a.str("VIF.create", map[string]any{"device": "0", "network": netA, "VM": vm, "MAC": "02:00:00:18:18:01", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	sumThen := writePattern(t, a, a.at, vdi, 4<<20)
	snap := a.str("VM.snapshot", vm, "before")
	snapUUID := a.str("VM.get_uuid", snap)
	snapTime := a.str("VM.get_snapshot_time", snap)
	sumNow := writePattern(t, a, a.at, vdi, 4<<20)
	if sumNow == sumThen {
		t.Fatal("the two patterns are the same")
	}
	var svbds []string
	if err := json.Unmarshal(a.call("VM.get_VBDs", snap), &svbds); err != nil {
		t.Fatal(err)
	}
	svdi := ""
	for _, v := range svbds {
		if a.str("VBD.get_type", v) == "Disk" {
			svdi = a.str("VBD.get_VDI", v)
		}
	}
	if svdi == "" || a.str("VDI.get_snapshot_of", svdi) != vdi {
		t.Fatalf("the snapshot's disk %q is not a snapshot of the VM's", svdi)
	}
	svdiTime := a.str("VDI.get_snapshot_time", svdi)
	ro := newVDI("xpool read-only")
	roSum := writePattern(t, a, a.at, ro, 4<<20)
	vbd(vm, ro, "1", "RO", "Disk")
	a.call("VM.start", vm, false, false)

	before := srVDIs(b, srB)
	dest := destMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB, ro: srB, iso: srB}
	vifMap := map[string]string{vif: netB}
	a.call("VM.assert_can_migrate", assertArgs(vm, dest, vdiMap, vifMap)...)
	t0 := time.Now()
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	t.Logf("cross-pool move with a snapshot, a read-only disk and a CD (qemu %v): %v", qemu, time.Since(t0))

	// Pool B: the VM, running, and three new VDIs (the ISO stayed).
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] || len(s.Ops) != 0 || b.str("VM.get_uuid", newVM) != uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if n := srVDIs(b, srB); n != before+3 {
		t.Fatalf("pool B's SR has %d VDIs, want %d", n, before+3)
	}
	type vbdRec struct {
		VDI      string `json:"VDI"`
		Empty    bool   `json:"empty"`
		Type     string `json:"type"`
		Mode     string `json:"mode"`
		Device   string `json:"userdevice"`
		Attached bool   `json:"currently_attached"`
	}
	vbdsOf := func(r rpc, vm string) map[string]vbdRec {
		var refs []string
		if err := json.Unmarshal(r.call("VM.get_VBDs", vm), &refs); err != nil {
			t.Fatal(err)
		}
		out := map[string]vbdRec{}
		for _, v := range refs {
			var rec vbdRec
			if err := json.Unmarshal(r.call("VBD.get_record", v), &rec); err != nil {
				t.Fatal(err)
			}
			out[rec.Device] = rec
		}
		return out
	}
	var nvifs []string
	if err := json.Unmarshal(b.call("VM.get_VIFs", newVM), &nvifs); err != nil || len(nvifs) != 1 || b.str("VIF.get_network", nvifs[0]) != netB {
		t.Fatalf("the VM's VIFs on pool B: %v %v", nvifs, err)
	}
	nvif := nvifs[0]
	got := vbdsOf(b, newVM)
	if len(got) != 3 || got["0"].Type != "Disk" || got["1"].Mode != "RO" || got["1"].Type != "Disk" {
		t.Fatalf("the VM's VBDs on pool B: %+v", got)
	}
	if cd := got["3"]; cd.Type != "CD" || !cd.Empty || cd.VDI != "OpaqueRef:NULL" {
		t.Fatalf("the VM's CD on pool B: %+v, want an empty drive", cd)
	}
	nv, nro := got["0"].VDI, got["1"].VDI
	for _, v := range []string{nv, nro} {
		if b.str("VDI.get_SR", v) != srB {
			t.Fatalf("VDI %s is not on pool B's local SR", v)
		}
	}
	if s := readDisk(t, b, b.at, nro); sha256.Sum256(s) != roSum {
		t.Fatal("the read-only disk differs on pool B")
	}
	if qemu {
		if pids := qemuOf(uuid); len(pids) != 1 {
			t.Fatalf("QEMU processes of the VM after the move: %v", pids)
		}
		if !got["1"].Attached {
			t.Fatal("the read-only disk is not attached on pool B")
		}
		if s := readDisk(t, b, b.at, nv); sha256.Sum256(s) != sumNow {
			t.Fatal("the VM's disk differs on pool B")
		}
	}

	// The snapshot: same uuid and time, a snapshot of the new VM.
	var snaps []string
	if err := json.Unmarshal(b.call("VM.get_snapshots", newVM), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("the VM's snapshots on pool B: %v %v", snaps, err)
	}
	nsnap := snaps[0]
	if b.str("VM.get_uuid", nsnap) != snapUUID || string(b.call("VM.get_is_a_snapshot", nsnap)) != "true" ||
		b.str("VM.get_snapshot_of", nsnap) != newVM || b.str("VM.get_snapshot_time", nsnap) != snapTime ||
		b.str("VM.get_power_state", nsnap) != "Halted" {
		t.Fatalf("the snapshot on pool B: %s", b.call("VM.get_record", nsnap))
	}
	if p := b.str("VM.get_parent", newVM); p != nsnap {
		t.Fatalf("the VM's parent on pool B: %s, want its snapshot %s", p, nsnap)
	}
	sgot := vbdsOf(b, nsnap)
	if cd := sgot["3"]; len(sgot) != 2 || cd.Type != "CD" || !cd.Empty {
		t.Fatalf("the snapshot's VBDs on pool B: %+v", sgot)
	}
	nsv := sgot["0"].VDI
	if b.str("VDI.get_SR", nsv) != srB || string(b.call("VDI.get_is_a_snapshot", nsv)) != "true" ||
		b.str("VDI.get_snapshot_of", nsv) != nv || b.str("VDI.get_snapshot_time", nsv) != svdiTime {
		t.Fatalf("the snapshot's VDI on pool B: %s", b.call("VDI.get_record", nsv))
	}
	if s := readDisk(t, b, b.at, nsv); sha256.Sum256(s) != sumThen {
		t.Fatal("the snapshot's disk differs on pool B")
	}
	// The disk and its snapshot share their history again: the disk's
	// image is a top over the snapshot's copy (storagechain.go).
	sharesHistory(t, p.Hosts[1].DataDir, b.str("VDI.get_uuid", nv), b.str("VDI.get_uuid", nsv))
	var svifs []string
	if err := json.Unmarshal(b.call("VM.get_VIFs", nsnap), &svifs); err != nil || len(svifs) != 1 ||
		b.str("VIF.get_network", svifs[0]) != netB {
		t.Fatalf("the snapshot's VIFs on pool B: %v %v", svifs, err)
	}

	// Pool A: none of it, but the ISO.
	for _, q := range [][2]string{{"VM.get_uuid", vm}, {"VM.get_uuid", snap}, {"VDI.get_uuid", vdi}, {"VDI.get_uuid", svdi},
		{"VDI.get_uuid", ro}, {"VIF.get_uuid", vif}} {
		if _, err := a.c.Call(ctx, a.at, q[0], a.s, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s %s on pool A after the move: %v", q[0], q[1], err)
		}
	}
	for _, u := range []string{uuid, snapUUID} {
		if _, err := a.c.Call(ctx, a.at, "VM.get_by_uuid", a.s, u); pooltest.Code(err) != xerr.UUIDInvalid {
			t.Fatalf("VM.get_by_uuid %s on pool A after the move: %v", u, err)
		}
	}
	if a.str("VDI.get_SR", iso) != srA {
		t.Fatal("the ISO VDI left pool A")
	}

	// And back, halted: every disk copied, the snapshot's following its
	// snapshot_of again.
	b.call("VM.hard_shutdown", newVM)
	back := b.str("VM.migrate_send", migrateSendArgs(newVM, destMap(a, hosts[0]), map[string]string{nv: srA, nro: srA},
		map[string]string{nvif: netA}, map[string]string{})...)
	if s := vmWhere(a, back); s.Power != "Halted" || len(s.Ops) != 0 || a.str("VM.get_uuid", back) != uuid {
		t.Fatalf("on pool A after the move back: %+v", s)
	}
	if err := json.Unmarshal(a.call("VM.get_snapshots", back), &snaps); err != nil || len(snaps) != 1 ||
		a.str("VM.get_uuid", snaps[0]) != snapUUID {
		t.Fatalf("the VM's snapshots on pool A after the move back: %v %v", snaps, err)
	}
	bgot, bsgot := vbdsOf(a, back), vbdsOf(a, snaps[0])
	bvdi, bsvdi := bgot["0"].VDI, bsgot["0"].VDI
	if len(bgot) != 3 || !bgot["3"].Empty || bgot["1"].Mode != "RO" || len(bsgot) != 2 || !bsgot["3"].Empty {
		t.Fatalf("the VBDs on pool A after the move back: %+v and the snapshot's %+v", bgot, bsgot)
	}
	if string(a.call("VDI.get_is_a_snapshot", bsvdi)) != "true" || a.str("VDI.get_snapshot_of", bsvdi) != bvdi ||
		a.str("VDI.get_SR", bsvdi) != srA || a.str("VDI.get_snapshot_time", bsvdi) != svdiTime {
		t.Fatalf("the snapshot's VDI on pool A after the move back: %s", a.call("VDI.get_record", bsvdi))
	}
	if s := readDisk(t, a, a.at, bsvdi); sha256.Sum256(s) != sumThen {
		t.Fatal("the snapshot's disk differs after the move back")
	}
	sharesHistory(t, p.Hosts[0].DataDir, a.str("VDI.get_uuid", bvdi), a.str("VDI.get_uuid", bsvdi))
	if s := readDisk(t, a, a.at, bgot["1"].VDI); sha256.Sum256(s) != roSum {
		t.Fatal("the read-only disk differs after the move back")
	}
	if s := readDisk(t, a, a.at, bvdi); qemu && sha256.Sum256(s) != sumNow {
		t.Fatal("the VM's disk differs after the move back")
	}
	for _, q := range [][2]string{{"VM.get_uuid", newVM}, {"VM.get_uuid", nsnap}, {"VDI.get_uuid", nv}, {"VDI.get_uuid", nsv}} {
		if _, err := b.c.Call(ctx, b.at, q[0], b.s, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s %s on pool B after the move back: %v", q[0], q[1], err)
		}
	}
}

// A move of a VM with a snapshot and a CD cancelled while its disk is
// mirrored (after the snapshot's disk was copied): pool A keeps the VM
// running with its snapshot and disks; the CD stays ejected, as xapi
// leaves it; pool B keeps neither VM nor snapshot nor any new VDI. Then
// the VM, with a checkpoint besides, moves: its memory image with it.
func TestCrossPoolMigrateSnapshotCancel(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := testCtx(t)
	_, rs, hosts := twoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{
		Env: []string{"TOOLSTACKD_SIM_DELAYS=mirror-copy=8s"}}})
	a, b := rs[0], rs[1]
	srA, srB := a.localSR(hosts[0]), b.localSR(hosts[1])
	vm := sharedVM(a, srA, "xpool-snapshot-cancel", nil)
	uuid := a.str("VM.get_uuid", vm)
	_, vdi := vmDisk(a, vm)
	iso := a.str("VDI.create", map[string]any{"name_label": "iso", "name_description": "", "SR": srA,
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	cd := a.str("VBD.create", map[string]any{"VM": vm, "VDI": iso, "userdevice": "3", "bootable": false, "mode": "RO", "type": "CD",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	snap := a.str("VM.snapshot", vm, "kept")
	snapUUID := a.str("VM.get_uuid", snap)
	a.call("VM.start", vm, false, false)
	before := srVDIs(b, srB)
	task := a.str("Async.VM.migrate_send", migrateSendArgs(vm, destMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	waitUntil(t, 60*time.Second, "the mirror", func() bool {
		if st := a.str("task.get_status", task); st != "pending" {
			t.Fatalf("the migration ended early: %s %s", st, a.call("task.get_error_info", task))
		}
		var prog float64
		_ = json.Unmarshal(a.call("task.get_progress", task), &prog)
		// The snapshot's disk copied, the VM's being mirrored: pool B
		// has both new VDIs and the snapshot.
		_, err := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, snapUUID)
		return prog > 0.2 && prog < 0.5 && srVDIs(b, srB) == before+2 && err == nil
	})
	a.call("task.cancel", task)
	if st, info := waitTask(t, a, task); st != "cancelled" {
		t.Fatalf("a cancelled migration: %s %v", st, info)
	}
	waitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(vmWhere(a, vm).Ops) == 0 })
	if s := vmWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("after the cancel: %+v", s)
	}
	var snaps []string
	if err := json.Unmarshal(a.call("VM.get_snapshots", vm), &snaps); err != nil || len(snaps) != 1 || snaps[0] != snap {
		t.Fatalf("the VM's snapshots on pool A after the cancel: %v %v", snaps, err)
	}
	if string(a.call("VBD.get_empty", cd)) != "true" || a.str("VDI.get_SR", iso) != srA {
		t.Fatal("the CD is not left ejected (with its ISO on pool A) after the cancel")
	}
	waitUntil(t, 30*time.Second, "pool B to drop what it made", func() bool {
		_, e1 := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, uuid)
		_, e2 := b.c.Call(ctx, b.at, "VM.get_by_uuid", b.s, snapUUID)
		return pooltest.Code(e1) == xerr.UUIDInvalid && pooltest.Code(e2) == xerr.UUIDInvalid && srVDIs(b, srB) == before
	})
	// A checkpoint's memory goes with it (xapi's suspends_vdis, to the
	// other pool's suspend image SR or default SR): on pool B the
	// checkpoint is suspended on a copy of its image, and the VM reverts
	// to it and resumes there.
	cp := a.str("VM.checkpoint", vm, "with memory")
	cpUUID := a.str("VM.get_uuid", cp)
	image := readDisk(t, a, a.at, a.str("VM.get_suspend_VDI", cp))
	newVM := a.str("VM.migrate_send", migrateSendArgs(vm, destMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	ncp := b.str("VM.get_by_uuid", cpUUID)
	nsv := b.str("VM.get_suspend_VDI", ncp)
	if b.str("VM.get_power_state", ncp) != "Suspended" || b.str("VM.get_snapshot_of", ncp) != newVM ||
		b.str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the checkpoint on pool B: %s", b.call("VM.get_record", ncp))
	}
	if got := readDisk(t, b, b.at, nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the checkpoint's memory image differs on pool B")
	}
	if _, err := a.c.Call(ctx, a.at, "VM.get_by_uuid", a.s, cpUUID); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("the checkpoint on pool A after the move: %v", err)
	}
	b.call("VM.hard_shutdown", newVM)
	b.call("VM.revert", ncp)
	b.call("VM.resume", newVM, false, false)
	if s := vmWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed from the moved checkpoint on pool B: %+v", s)
	}
	b.call("VM.hard_shutdown", newVM)
}
