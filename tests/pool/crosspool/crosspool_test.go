// Package crosspool tests moving VMs to another pool (VM.migrate_send
// with a destination from Host.migrate_receive) on the simulator: running,
// halted and suspended VMs, cancels, refusals, the roles allowed to do it,
// over TLS, and its figure. The QEMU moves are in tests/pool/crossqemu.
package crosspool

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// Cross-pool migration (issue 18): two toolstackd processes that are not
// joined, each a pool of its own with its local SR; a running VM of pool
// A moves to pool B's host with its disk (VM.migrate_send with B's
// host.migrate_receive dest map, B's session inside it), as XO and xe
// vm-migrate remote-master= call it.

// crossVM makes a VM on pool A with a disk on sr (a known pattern on it)
// and a VIF on net, started: the VM, its VDI, VIF and the disk's sum.
func crossVM(t *testing.T, r suite.RPC, sr, net string) (vm, vdi, vif string, sum [32]byte) {
	t.Helper()
	vm = suite.SharedVM(r, sr, "xpool", nil)
	_, vdi = suite.VMDisk(r, vm)
	sum = suite.WritePattern(t, r, r.At, vdi, 4<<20)
	vif = r.Str("VIF.create", map[string]any{"device": "0", "network": net, "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	r.Call("VM.start", vm, false, false)
	return vm, vdi, vif, sum
}

func TestCrossPoolMigrateSimulator(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm, vdi, vif, sum := crossVM(t, a, srA, suite.MgmtNetwork(a, hosts[0]))
	uuid := a.Str("VM.get_uuid", vm)
	before := suite.SRVDIs(b, srB)
	dest := suite.DestMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: suite.MgmtNetwork(b, hosts[1])}

	// The checks pass first.
	a.Call("VM.assert_can_migrate", suite.AssertArgs(vm, dest, vdiMap, vifMap)...)
	t0 := time.Now()
	newVM := a.Str("VM.migrate_send", suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	t.Logf("cross-pool move of the simulator VM: %v", time.Since(t0))

	// Pool B has it, running on its host, with the same uuid.
	if got := b.Str("VM.get_by_uuid", uuid); got != newVM {
		t.Fatalf("VM.get_by_uuid on pool B: %s, migrate_send returned %s", got, newVM)
	}
	s := suite.VMWhere(b, newVM)
	if s.Power != "Running" || s.On != hosts[1] || len(s.Ops) != 0 {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	_, nv := suite.VMDisk(b, newVM)
	if b.Str("VDI.get_SR", nv) != srB || suite.SRVDIs(b, srB) != before+1 {
		t.Fatalf("the new VDI %s is not pool B's local SR's", nv)
	}
	// The simulator's mirror only accounts for a qcow2 image's bytes (see
	// internal/xenops/sim/mirror.go): the data is compared with QEMU
	// (TestCrossPoolMigrateQEMU); here the size.
	_ = sum
	if n := string(b.Call("VDI.get_virtual_size", nv)); n != "4194304" {
		t.Fatalf("the new VDI's virtual size: %s", n)
	}
	var vifs []string
	if err := json.Unmarshal(b.Call("VM.get_VIFs", newVM), &vifs); err != nil || len(vifs) != 1 ||
		b.Str("VIF.get_network", vifs[0]) != suite.MgmtNetwork(b, hosts[1]) {
		t.Fatalf("the VIFs on pool B: %v %v", vifs, err)
	}
	// Pool A has neither the VM nor its old disk.
	for _, q := range [][2]string{{"VM.get_uuid", vm}, {"VDI.get_uuid", vdi}, {"VIF.get_uuid", vif}} {
		if _, err := a.C.Call(ctx, a.At, q[0], a.S, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s on pool A after the move: %v", q[0], err)
		}
	}
	if _, err := a.C.Call(ctx, a.At, "VM.get_by_uuid", a.S, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	// And back with xe on pool B, as xapi's xe does it (remote-master=
	// pool A, a login there, host.migrate_receive there, VM.migrate_send
	// here); the VIF is left to the default (the receiving network).
	xe := suite.DaemonCLI(t, b, p.Password())
	_, nv = suite.VMDisk(b, newVM)
	xe("vm-migrate", "uuid="+uuid, "remote-master="+a.At, "remote-username=root", "remote-password="+p.Password(),
		"host="+a.Str("host.get_uuid", hosts[0]), "vdi:"+b.Str("VDI.get_uuid", nv)+"="+a.Str("SR.get_uuid", srA))
	back := a.Str("VM.get_by_uuid", uuid)
	if s := suite.VMWhere(a, back); s.Power != "Running" || s.On != hosts[0] || len(s.Ops) != 0 {
		t.Fatalf("on pool A after xe vm-migrate: %+v", s)
	}
	if _, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool B after xe vm-migrate: %v", err)
	}
	a.Call("VM.hard_shutdown", back)
}

// A cancelled cross-pool move leaves the VM running on pool A and
// nothing on pool B; bad dest maps get XenAPI errors.
func TestCrossPoolMigrateCancelAndRefusals(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{
		Env: []string{"TOOLSTACKD_SIM_DELAYS=mirror-copy=8s"}}})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm, vdi, vif, _ := crossVM(t, a, srA, suite.MgmtNetwork(a, hosts[0]))
	uuid := a.Str("VM.get_uuid", vm)
	before := suite.SRVDIs(b, srB)
	dest := suite.DestMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: suite.MgmtNetwork(b, hosts[1])}

	refuse := func(what, code string, dest map[string]string, vdiMap, vifMap map[string]string) {
		t.Helper()
		for _, m := range []string{"VM.assert_can_migrate", "VM.migrate_send"} {
			args := suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})
			if m == "VM.assert_can_migrate" {
				args = suite.AssertArgs(vm, dest, vdiMap, vifMap)
			}
			_, err := a.C.Call(ctx, a.At, m, append([]any{a.S}, args...)...)
			suite.WantRefusal(t, m+": "+what, err, code)
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
		{"pool A's session", a.S, true, http.StatusUnauthorized},
		{"no upgrade", b.S, false, http.StatusUpgradeRequired},
	} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+b.At+"/migrate?session_id="+url.QueryEscape(c.session), http.NoBody)
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
		task := a.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
		suite.WaitUntil(t, 60*time.Second, what, func() bool {
			if st := a.Str("task.get_status", task); st != "pending" {
				t.Fatalf("%s: the migration ended early: %s %s", what, st, a.Call("task.get_error_info", task))
			}
			var prog float64
			_ = json.Unmarshal(a.Call("task.get_progress", task), &prog)
			return prog > lo && prog < hi
		})
		a.Call("task.cancel", task)
		if st, info := suite.WaitTask(t, a, task); st != "cancelled" {
			t.Fatalf("%s: a cancelled migration: %s %v", what, st, info)
		}
		suite.WaitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(suite.VMWhere(a, vm).Ops) == 0 })
		if s := suite.VMWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
			t.Fatalf("%s: after the cancel: %+v", what, s)
		}
		if _, v := suite.VMDisk(a, vm); v != vdi {
			t.Fatalf("%s: the VBD is on %s after the cancel", what, v)
		}
		if !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
			t.Fatalf("%s: the VM's domain is gone from pool A", what)
		}
		suite.WaitUntil(t, 30*time.Second, "pool B to drop what it made", func() bool {
			_, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, uuid)
			return pooltest.Code(err) == xerr.UUIDInvalid && !suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) && suite.SRVDIs(b, srB) == before
		})
	}
	// The mirror takes 8 s: cancelled while the disk is copied.
	cancelAt("the mirror", 0.12, 0.5)
	// The memory capped at 40 bytes a second: cancelled while it goes.
	a.Call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	cancelAt("the memory", 0.55, 0.9)
	// Nothing was left in the way.
	a.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	task := a.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	if st, info := suite.WaitTask(t, a, task); st != "success" {
		t.Fatalf("the move after the cancels: %s %v", st, info)
	}
	if s := suite.VMWhere(b, b.Str("VM.get_by_uuid", uuid)); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move: %+v", s)
	}
}

// The figure for docs/performance.md: a running simulated VM with its
// 4 MiB disk moved back and forth between two pools, against the same
// VM moved with its disk between the two hosts of one pool (storage
// migration inside the pool), on this machine in the same run. The
// medians of TOOLSTACKD_XPOOL_ROUNDS moves (default 10) each way are
// logged with their ratio. The moves themselves are the other tests'
// subject, so it runs when asked for the figure:
//
//	TOOLSTACKD_FIGURES=1 go test -count=1 -v -run TestCrossPoolFigure ./tests/pool/crosspool/
func TestCrossPoolFigure(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure the cross-pool migration figure")
	}
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
	ctx := suite.Ctx(t)
	// Inside one pool: the baseline.
	var intra []time.Duration
	{
		_, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
		local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
		vm := suite.SharedVM(r, local[0], "figure-intra", nil)
		r.Call("VM.start_on", vm, hosts[0], false, false)
		for i := range rounds {
			to := (i + 1) % 2
			_, vdi := suite.VMDisk(r, vm)
			dest := suite.DestMap(r, hosts[to])
			t0 := time.Now()
			r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, dest, map[string]string{vdi: local[to]}, map[string]string{}, map[string]string{})...)
			intra = append(intra, time.Since(t0))
		}
	}
	// Between two pools.
	_, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{})
	srs := [2]string{rs[0].LocalSR(hosts[0]), rs[1].LocalSR(hosts[1])}
	vm := suite.SharedVM(rs[0], srs[0], "figure-cross", nil)
	uuid := rs[0].Str("VM.get_uuid", vm)
	rs[0].Call("VM.start", vm, false, false)
	var cross []time.Duration
	for i := range rounds {
		from, to := i%2, (i+1)%2
		_, vdi := suite.VMDisk(rs[from], vm)
		dest := suite.DestMap(rs[to], hosts[to])
		t0 := time.Now()
		vm = rs[from].Str("VM.migrate_send", suite.MigrateSendArgs(vm, dest, map[string]string{vdi: srs[to]}, map[string]string{}, map[string]string{})...)
		cross = append(cross, time.Since(t0))
		if got := rs[to].Str("VM.get_uuid", vm); got != uuid {
			t.Fatalf("round %d: the VM's uuid on the other pool is %s", i, got)
		}
	}
	mi, mc := med(intra), med(cross)
	t.Logf("figure: VM.migrate_send of a running simulated VM with a 4 MiB disk, median of %d: inside a pool %v, to another pool %v (%.2fx)",
		rounds, mi, mc, float64(mc)/float64(mi))
}

// crossHalted is a halted VM on pool A with a disk on A's local SR that
// holds a pattern, ready to move to pool B's host 1 and local SR.
type crossHalted struct {
	ctx       context.Context
	a, b      suite.RPC
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
	ctx := suite.Ctx(t)
	_, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{})
	m := &crossHalted{ctx: ctx, a: rs[0], b: rs[1], hosts: hosts, srB: rs[1].LocalSR(hosts[1])}
	m.vm = suite.SharedVM(m.a, m.a.LocalSR(hosts[0]), name, nil)
	_, m.vdi = suite.VMDisk(m.a, m.vm)
	m.diskBytes = suite.WritePattern(t, m.a, m.a.At, m.vdi, 4<<20)
	m.uuid = m.a.Str("VM.get_uuid", m.vm)
	return m
}

// send moves the VM with its disk to pool B's local SR and checks that
// it arrived in power state power, with its uuid and no operation left
// marked, and that its disk's bytes came along; it returns the VM and
// its disk on pool B.
func (m *crossHalted) send(t *testing.T, power string) (newVM, newVDI string) {
	t.Helper()
	newVM = m.a.Str("VM.migrate_send", suite.MigrateSendArgs(m.vm, suite.DestMap(m.b, m.hosts[1]), map[string]string{m.vdi: m.srB},
		map[string]string{}, map[string]string{})...)
	if s := suite.VMWhere(m.b, newVM); s.Power != power || len(s.Ops) != 0 || m.b.Str("VM.get_uuid", newVM) != m.uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	_, newVDI = suite.VMDisk(m.b, newVM)
	if got := suite.ReadDisk(t, m.b, m.b.At, newVDI); len(got) != 4<<20 || sha256.Sum256(got) != m.diskBytes {
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
		if _, err := m.a.C.Call(m.ctx, m.a.At, q[0], m.a.S, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
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
	before := suite.SRVDIs(b, m.srB)
	newVM, nv := m.send(t, "Halted")
	if b.Str("VDI.get_SR", nv) != m.srB || suite.SRVDIs(b, m.srB) != before+1 {
		t.Fatalf("the new VDI %s is not pool B's local SR's", nv)
	}
	m.goneFromA(t)
	b.Call("VM.start", newVM, false, false)
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != m.hosts[1] {
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
	a.Call("VM.start", m.vm, false, false)
	a.Call("VM.suspend", m.vm)
	sv := a.Str("VM.get_suspend_VDI", m.vm)
	image := suite.ReadDisk(t, a, a.At, sv)
	newVM, _ := m.send(t, "Suspended")
	nsv := b.Str("VM.get_suspend_VDI", newVM)
	if b.Str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the VM's memory image on pool B: %s", b.Call("VDI.get_record", nsv))
	}
	if got := suite.ReadDisk(t, b, b.At, nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the memory image differs on pool B")
	}
	m.goneFromA(t, sv)
	b.Call("VM.resume", newVM, false, false)
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != m.hosts[1] {
		t.Fatalf("resumed on pool B: %+v", s)
	}
	b.Call("VM.hard_shutdown", newVM)
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
	ctx := suite.Ctx(t)
	ips := []string{pooltest.HostIP(0).String(), pooltest.HostIP(1).String()}
	port := testdaemon.FreePort(t, ips...)
	args := map[int][]string{}
	for i, ip := range ips {
		args[i] = []string{"--listen-https", testdaemon.Addr(ip, port)}
	}
	_, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{HostArgs: args})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm, vdi, vif, _ := crossVM(t, a, srA, suite.MgmtNetwork(a, hosts[0]))
	uuid := a.Str("VM.get_uuid", vm)
	dest := suite.DestMap(b, hosts[1])
	dest["master"] = "https://" + testdaemon.Addr(ips[1], port) + "/"
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: suite.MgmtNetwork(b, hosts[1])}

	if _, err := a.C.Call(ctx, a.At, "VM.migrate_send", append([]any{a.S}, suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)...); pooltest.Code(err) != xerr.SSLVerifyError {
		t.Fatalf("VM.migrate_send to a pool whose certificate this pool does not trust: %v, want SSL_VERIFY_ERROR", err)
	} else {
		t.Logf("before pool B's certificate is trusted: %v", err)
	}
	if s := suite.VMWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("on pool A after the refused move: %+v", s)
	}
	if _, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("pool B has the VM after the refused move: %v", err)
	}

	a.Call("pool.install_ca_certificate", "pool-b.pem", b.Str("host.get_server_certificate", hosts[1]))
	newVM := a.Str("VM.migrate_send", suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move over https: %+v", s)
	}
	if _, err := a.C.Call(ctx, a.At, "VM.get_by_uuid", a.S, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	b.Call("VM.hard_shutdown", newVM)
}
