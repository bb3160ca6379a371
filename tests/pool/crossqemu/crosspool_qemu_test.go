// Package crossqemu tests moving VMs to another pool on real QEMU (TCG
// where there is no KVM), and the moves that carry snapshots, checkpoints
// and a read-only CD, cancelled half-way and completed.
package crossqemu

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"os/exec"
	"strconv"
	"testing"
	"time"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// A running guest on real QEMU (TCG), a known pattern on its disk, moves
// from pool A to pool B: it counts on there without a reboot, one QEMU
// process runs it, and pool B's new VDI holds the same bytes.
func TestCrossPoolMigrateQEMU(t *testing.T) {
	g := suite.TickGuest(t) // "TICK n" on the serial port
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	const size = 64 << 20
	vm := a.Str("VM.create", testdaemon.VMRecord("qemu-xpool"))
	vdi := a.Str("VDI.create", map[string]any{"name_label": "xpool disk", "name_description": "", "SR": srA,
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	a.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	sum := suite.WritePattern(t, a, a.At, vdi, size)
	uuid := a.Str("VM.get_uuid", vm)
	g.SetOn(a, vm)
	t.Cleanup(func() { suite.KillQEMUs(uuid) })
	a.Call("VM.start", vm, false, false)
	ticks := &suite.TickLog{}
	t.Cleanup(ticks.Close)
	if _, err := ticks.Follow(p.Hosts[0].DataDir, uuid, 0); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 0, 3, 2*time.Minute) // the guest runs

	t0 := time.Now()
	newVM := a.Str("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	t.Logf("cross-pool move of the QEMU guest with its %d MiB disk: %v", size>>20, time.Since(t0))
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] || b.Str("VM.get_uuid", newVM) != uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if pids := suite.QEMUOf(uuid); len(pids) != 1 {
		t.Fatalf("QEMU processes of the VM after the move: %v", pids)
	}
	n := ticks.Count(1)
	if _, err := ticks.Follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 1, n+3, time.Minute) // it counts on, on pool B
	ticks.Check(t)
	_, nv := suite.VMDisk(b, newVM)
	if b.Str("VDI.get_SR", nv) != srB {
		t.Fatalf("the new VDI %s is not on pool B's local SR", nv)
	}
	if got := suite.ReadDisk(t, b, b.At, nv); len(got) != size || sha256.Sum256(got) != sum {
		t.Fatalf("the moved disk differs: %d bytes", len(got))
	}
	if _, err := a.C.Call(ctx, a.At, "VM.get_by_uuid", a.S, uuid); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool A after the move: %v", err)
	}
	if _, err := a.C.Call(ctx, a.At, "VDI.get_uuid", a.S, vdi); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old VDI on pool A after the move: %v", err)
	}
}

// A QEMU guest's move to another pool cancelled while its disk is
// mirrored, then while its memory goes (migration_bandwidth, 8 MiB/s,
// holds both): each time it counts on in pool A with its old disk, and
// pool B has no QEMU, no VM and no new VDI; then it moves and counts on
// there.
func TestCrossPoolMigrateQEMUCancel(t *testing.T) {
	g := suite.TickGuest(t)
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm := suite.SharedVM(a, srA, "qemu-xpool-cancel", map[string]string{"migration_bandwidth": strconv.Itoa(8 << 20)})
	a.Call("VDI.resize", suite.VMDiskVDI(a, vm), 64<<20)
	_, vdi := suite.VMDisk(a, vm)
	suite.WritePattern(t, a, a.At, vdi, 64<<20)
	uuid := a.Str("VM.get_uuid", vm)
	g.SetOn(a, vm)
	t.Cleanup(func() { suite.KillQEMUs(uuid) })
	a.Call("VM.start", vm, false, false)
	ticks := &suite.TickLog{}
	t.Cleanup(ticks.Close)
	if _, err := ticks.Follow(p.Hosts[0].DataDir, uuid, 0); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 0, 3, 2*time.Minute)
	before := suite.SRVDIs(b, srB)
	vdiMap := map[string]string{vdi: srB}
	cancelAt := func(what string, lo, hi float64) {
		t.Helper()
		task := a.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(b, hosts[1]), vdiMap, map[string]string{}, map[string]string{})...)
		suite.WaitUntil(t, 2*time.Minute, what, func() bool {
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
		suite.WaitUntil(t, 30*time.Second, "pool B to drop its QEMU, VM and VDI", func() bool {
			_, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, uuid)
			return len(suite.QEMUOf(uuid)) == 1 && suite.SRVDIs(b, srB) == before && pooltest.Code(err) == xerr.UUIDInvalid
		})
		ticks.Wait(t, 0, ticks.Count(0)+3, time.Minute) // the guest counts on where it was
	}
	cancelAt("the mirror", 0.12, 0.5)
	cancelAt("the memory", 0.505, 0.9)
	a.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	newVM := a.Str("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(b, hosts[1]), vdiMap, map[string]string{}, map[string]string{})...)
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if _, err := ticks.Follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 1, 3, time.Minute)
	ticks.Check(t)
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
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{})
	crossSnapshotsCase(t, ctx, p, rs, hosts, false)
}

func TestCrossPoolMigrateSnapshotsReadOnlyCDQEMU(t *testing.T) {
	for _, bin := range []string{"qemu-nbd", "qemu-system-x86_64"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skip("no " + bin)
		}
	}
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	crossSnapshotsCase(t, ctx, p, rs, hosts, true)
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
	ctx := suite.Ctx(t)
	_, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{Daemon: testdaemon.Options{
		Env: []string{"TOOLSTACKD_SIM_DELAYS=mirror-copy=8s"}}})
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm := suite.SharedVM(a, srA, "xpool-snapshot-cancel", nil)
	uuid := a.Str("VM.get_uuid", vm)
	_, vdi := suite.VMDisk(a, vm)
	iso := a.Str("VDI.create", map[string]any{"name_label": "iso", "name_description": "", "SR": srA,
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	cd := a.Str("VBD.create", map[string]any{"VM": vm, "VDI": iso, "userdevice": "3", "bootable": false, "mode": "RO", "type": "CD",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	snap := a.Str("VM.snapshot", vm, "kept")
	snapUUID := a.Str("VM.get_uuid", snap)
	a.Call("VM.start", vm, false, false)
	before := suite.SRVDIs(b, srB)
	task := a.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	suite.WaitUntil(t, 60*time.Second, "the mirror", func() bool {
		if st := a.Str("task.get_status", task); st != "pending" {
			t.Fatalf("the migration ended early: %s %s", st, a.Call("task.get_error_info", task))
		}
		var prog float64
		_ = json.Unmarshal(a.Call("task.get_progress", task), &prog)
		// The snapshot's disk copied, the VM's being mirrored: pool B
		// has both new VDIs and the snapshot.
		_, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, snapUUID)
		return prog > 0.2 && prog < 0.5 && suite.SRVDIs(b, srB) == before+2 && err == nil
	})
	a.Call("task.cancel", task)
	if st, info := suite.WaitTask(t, a, task); st != "cancelled" {
		t.Fatalf("a cancelled migration: %s %v", st, info)
	}
	suite.WaitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(suite.VMWhere(a, vm).Ops) == 0 })
	if s := suite.VMWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("after the cancel: %+v", s)
	}
	var snaps []string
	if err := json.Unmarshal(a.Call("VM.get_snapshots", vm), &snaps); err != nil || len(snaps) != 1 || snaps[0] != snap {
		t.Fatalf("the VM's snapshots on pool A after the cancel: %v %v", snaps, err)
	}
	if string(a.Call("VBD.get_empty", cd)) != "true" || a.Str("VDI.get_SR", iso) != srA {
		t.Fatal("the CD is not left ejected (with its ISO on pool A) after the cancel")
	}
	suite.WaitUntil(t, 30*time.Second, "pool B to drop what it made", func() bool {
		_, e1 := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, uuid)
		_, e2 := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, snapUUID)
		return pooltest.Code(e1) == xerr.UUIDInvalid && pooltest.Code(e2) == xerr.UUIDInvalid && suite.SRVDIs(b, srB) == before
	})
	// A checkpoint's memory goes with it (xapi's suspends_vdis, to the
	// other pool's suspend image SR or default SR): on pool B the
	// checkpoint is suspended on a copy of its image, and the VM reverts
	// to it and resumes there.
	cp := a.Str("VM.checkpoint", vm, "with memory")
	cpUUID := a.Str("VM.get_uuid", cp)
	image := suite.ReadDisk(t, a, a.At, a.Str("VM.get_suspend_VDI", cp))
	// This move takes the simulator's mirror-copy delay again: a task,
	// not a call bounded by the client's timeout.
	moved := time.Now()
	task = a.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(b, hosts[1]), map[string]string{vdi: srB},
		map[string]string{}, map[string]string{})...)
	if st, info := suite.WaitTask(t, a, task); st != "success" {
		t.Fatalf("the second move: %s %v", st, info)
	}
	t.Logf("the second move, with the simulator's 8 s mirror delay: %v", time.Since(moved).Round(time.Millisecond))
	newVM := b.Str("VM.get_by_uuid", uuid)
	ncp := b.Str("VM.get_by_uuid", cpUUID)
	nsv := b.Str("VM.get_suspend_VDI", ncp)
	if b.Str("VM.get_power_state", ncp) != "Suspended" || b.Str("VM.get_snapshot_of", ncp) != newVM ||
		b.Str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the checkpoint on pool B: %s", b.Call("VM.get_record", ncp))
	}
	if got := suite.ReadDisk(t, b, b.At, nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the checkpoint's memory image differs on pool B")
	}
	if _, err := a.C.Call(ctx, a.At, "VM.get_by_uuid", a.S, cpUUID); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("the checkpoint on pool A after the move: %v", err)
	}
	b.Call("VM.hard_shutdown", newVM)
	b.Call("VM.revert", ncp)
	b.Call("VM.resume", newVM, false, false)
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed from the moved checkpoint on pool B: %+v", s)
	}
	b.Call("VM.hard_shutdown", newVM)
}

// crossSnapshotsCase is the two tests' body; qemu: the VM's mirrored
// disk's bytes can be compared (the simulator's mirror does not copy a
// qcow2 image's data).
func crossSnapshotsCase(t *testing.T, ctx context.Context, p *pooltest.Pool, rs [2]suite.RPC, hosts [2]string, qemu bool) {
	t.Helper()
	a, b := rs[0], rs[1]
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	netA, netB := suite.MgmtNetwork(a, hosts[0]), suite.MgmtNetwork(b, hosts[1])
	newVDI := func(name string) string {
		return a.Str("VDI.create", map[string]any{"name_label": name, "name_description": "", "SR": srA,
			"virtual_size": 4 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
			"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	}
	vbd := func(vm, vdi, dev, mode, typ string) {
		a.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": dev, "bootable": false, "mode": mode, "type": typ,
			"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	}
	vm := suite.SharedVM(a, srA, "xpool-snapshots", nil)
	uuid := a.Str("VM.get_uuid", vm)
	if qemu {
		t.Cleanup(func() { suite.KillQEMUs(uuid) })
	}
	_, vdi := suite.VMDisk(a, vm)
	iso := newVDI("xpool iso")
	suite.WritePattern(t, a, a.At, iso, 4<<20)
	vbd(vm, iso, "3", "RO", "CD")
	vif := a.Str("VIF.create", map[string]any{"device": "0", "network": netA, "VM": vm, "MAC": "02:00:00:18:18:01", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	sumThen := suite.WritePattern(t, a, a.At, vdi, 4<<20)
	snap := a.Str("VM.snapshot", vm, "before")
	snapUUID := a.Str("VM.get_uuid", snap)
	snapTime := a.Str("VM.get_snapshot_time", snap)
	sumNow := suite.WritePattern(t, a, a.At, vdi, 4<<20)
	if sumNow == sumThen {
		t.Fatal("the two patterns are the same")
	}
	var svbds []string
	if err := json.Unmarshal(a.Call("VM.get_VBDs", snap), &svbds); err != nil {
		t.Fatal(err)
	}
	svdi := ""
	for _, v := range svbds {
		if a.Str("VBD.get_type", v) == "Disk" {
			svdi = a.Str("VBD.get_VDI", v)
		}
	}
	if svdi == "" || a.Str("VDI.get_snapshot_of", svdi) != vdi {
		t.Fatalf("the snapshot's disk %q is not a snapshot of the VM's", svdi)
	}
	svdiTime := a.Str("VDI.get_snapshot_time", svdi)
	ro := newVDI("xpool read-only")
	roSum := suite.WritePattern(t, a, a.At, ro, 4<<20)
	vbd(vm, ro, "1", "RO", "Disk")
	a.Call("VM.start", vm, false, false)

	before := suite.SRVDIs(b, srB)
	dest := suite.DestMap(b, hosts[1])
	vdiMap := map[string]string{vdi: srB, ro: srB, iso: srB}
	vifMap := map[string]string{vif: netB}
	a.Call("VM.assert_can_migrate", suite.AssertArgs(vm, dest, vdiMap, vifMap)...)
	t0 := time.Now()
	newVM := a.Str("VM.migrate_send", suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)
	t.Logf("cross-pool move with a snapshot, a read-only disk and a CD (qemu %v): %v", qemu, time.Since(t0))

	// Pool B: the VM, running, and three new VDIs (the ISO stayed).
	if s := suite.VMWhere(b, newVM); s.Power != "Running" || s.On != hosts[1] || len(s.Ops) != 0 || b.Str("VM.get_uuid", newVM) != uuid {
		t.Fatalf("on pool B after the move: %+v", s)
	}
	if n := suite.SRVDIs(b, srB); n != before+3 {
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
	vbdsOf := func(r suite.RPC, vm string) map[string]vbdRec {
		var refs []string
		if err := json.Unmarshal(r.Call("VM.get_VBDs", vm), &refs); err != nil {
			t.Fatal(err)
		}
		out := map[string]vbdRec{}
		for _, v := range refs {
			var rec vbdRec
			if err := json.Unmarshal(r.Call("VBD.get_record", v), &rec); err != nil {
				t.Fatal(err)
			}
			out[rec.Device] = rec
		}
		return out
	}
	var nvifs []string
	if err := json.Unmarshal(b.Call("VM.get_VIFs", newVM), &nvifs); err != nil || len(nvifs) != 1 || b.Str("VIF.get_network", nvifs[0]) != netB {
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
		if b.Str("VDI.get_SR", v) != srB {
			t.Fatalf("VDI %s is not on pool B's local SR", v)
		}
	}
	if s := suite.ReadDisk(t, b, b.At, nro); sha256.Sum256(s) != roSum {
		t.Fatal("the read-only disk differs on pool B")
	}
	if qemu {
		if pids := suite.QEMUOf(uuid); len(pids) != 1 {
			t.Fatalf("QEMU processes of the VM after the move: %v", pids)
		}
		if !got["1"].Attached {
			t.Fatal("the read-only disk is not attached on pool B")
		}
		if s := suite.ReadDisk(t, b, b.At, nv); sha256.Sum256(s) != sumNow {
			t.Fatal("the VM's disk differs on pool B")
		}
	}

	// The snapshot: same uuid and time, a snapshot of the new VM.
	var snaps []string
	if err := json.Unmarshal(b.Call("VM.get_snapshots", newVM), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("the VM's snapshots on pool B: %v %v", snaps, err)
	}
	nsnap := snaps[0]
	if b.Str("VM.get_uuid", nsnap) != snapUUID || string(b.Call("VM.get_is_a_snapshot", nsnap)) != "true" ||
		b.Str("VM.get_snapshot_of", nsnap) != newVM || b.Str("VM.get_snapshot_time", nsnap) != snapTime ||
		b.Str("VM.get_power_state", nsnap) != "Halted" {
		t.Fatalf("the snapshot on pool B: %s", b.Call("VM.get_record", nsnap))
	}
	if p := b.Str("VM.get_parent", newVM); p != nsnap {
		t.Fatalf("the VM's parent on pool B: %s, want its snapshot %s", p, nsnap)
	}
	sgot := vbdsOf(b, nsnap)
	if cd := sgot["3"]; len(sgot) != 2 || cd.Type != "CD" || !cd.Empty {
		t.Fatalf("the snapshot's VBDs on pool B: %+v", sgot)
	}
	nsv := sgot["0"].VDI
	if b.Str("VDI.get_SR", nsv) != srB || string(b.Call("VDI.get_is_a_snapshot", nsv)) != "true" ||
		b.Str("VDI.get_snapshot_of", nsv) != nv || b.Str("VDI.get_snapshot_time", nsv) != svdiTime {
		t.Fatalf("the snapshot's VDI on pool B: %s", b.Call("VDI.get_record", nsv))
	}
	if s := suite.ReadDisk(t, b, b.At, nsv); sha256.Sum256(s) != sumThen {
		t.Fatal("the snapshot's disk differs on pool B")
	}
	// The disk and its snapshot share their history again: the disk's
	// image is a top over the snapshot's copy (storagechain.go).
	suite.SharesHistory(t, p.Hosts[1].DataDir, b.Str("VDI.get_uuid", nv), b.Str("VDI.get_uuid", nsv))
	var svifs []string
	if err := json.Unmarshal(b.Call("VM.get_VIFs", nsnap), &svifs); err != nil || len(svifs) != 1 ||
		b.Str("VIF.get_network", svifs[0]) != netB {
		t.Fatalf("the snapshot's VIFs on pool B: %v %v", svifs, err)
	}

	// Pool A: none of it, but the ISO.
	for _, q := range [][2]string{{"VM.get_uuid", vm}, {"VM.get_uuid", snap}, {"VDI.get_uuid", vdi}, {"VDI.get_uuid", svdi},
		{"VDI.get_uuid", ro}, {"VIF.get_uuid", vif}} {
		if _, err := a.C.Call(ctx, a.At, q[0], a.S, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s %s on pool A after the move: %v", q[0], q[1], err)
		}
	}
	for _, u := range []string{uuid, snapUUID} {
		if _, err := a.C.Call(ctx, a.At, "VM.get_by_uuid", a.S, u); pooltest.Code(err) != xerr.UUIDInvalid {
			t.Fatalf("VM.get_by_uuid %s on pool A after the move: %v", u, err)
		}
	}
	if a.Str("VDI.get_SR", iso) != srA {
		t.Fatal("the ISO VDI left pool A")
	}

	// And back, halted: every disk copied, the snapshot's following its
	// snapshot_of again.
	b.Call("VM.hard_shutdown", newVM)
	back := b.Str("VM.migrate_send", suite.MigrateSendArgs(newVM, suite.DestMap(a, hosts[0]), map[string]string{nv: srA, nro: srA},
		map[string]string{nvif: netA}, map[string]string{})...)
	if s := suite.VMWhere(a, back); s.Power != "Halted" || len(s.Ops) != 0 || a.Str("VM.get_uuid", back) != uuid {
		t.Fatalf("on pool A after the move back: %+v", s)
	}
	if err := json.Unmarshal(a.Call("VM.get_snapshots", back), &snaps); err != nil || len(snaps) != 1 ||
		a.Str("VM.get_uuid", snaps[0]) != snapUUID {
		t.Fatalf("the VM's snapshots on pool A after the move back: %v %v", snaps, err)
	}
	bgot, bsgot := vbdsOf(a, back), vbdsOf(a, snaps[0])
	bvdi, bsvdi := bgot["0"].VDI, bsgot["0"].VDI
	if len(bgot) != 3 || !bgot["3"].Empty || bgot["1"].Mode != "RO" || len(bsgot) != 2 || !bsgot["3"].Empty {
		t.Fatalf("the VBDs on pool A after the move back: %+v and the snapshot's %+v", bgot, bsgot)
	}
	if string(a.Call("VDI.get_is_a_snapshot", bsvdi)) != "true" || a.Str("VDI.get_snapshot_of", bsvdi) != bvdi ||
		a.Str("VDI.get_SR", bsvdi) != srA || a.Str("VDI.get_snapshot_time", bsvdi) != svdiTime {
		t.Fatalf("the snapshot's VDI on pool A after the move back: %s", a.Call("VDI.get_record", bsvdi))
	}
	if s := suite.ReadDisk(t, a, a.At, bsvdi); sha256.Sum256(s) != sumThen {
		t.Fatal("the snapshot's disk differs after the move back")
	}
	suite.SharesHistory(t, p.Hosts[0].DataDir, a.Str("VDI.get_uuid", bvdi), a.Str("VDI.get_uuid", bsvdi))
	if s := suite.ReadDisk(t, a, a.At, bgot["1"].VDI); sha256.Sum256(s) != roSum {
		t.Fatal("the read-only disk differs after the move back")
	}
	if s := suite.ReadDisk(t, a, a.At, bvdi); qemu && sha256.Sum256(s) != sumNow {
		t.Fatal("the VM's disk differs after the move back")
	}
	for _, q := range [][2]string{{"VM.get_uuid", newVM}, {"VM.get_uuid", nsnap}, {"VDI.get_uuid", nv}, {"VDI.get_uuid", nsv}} {
		if _, err := b.C.Call(ctx, b.At, q[0], b.S, q[1]); pooltest.Code(err) != xerr.HandleInvalid {
			t.Fatalf("%s %s on pool B after the move back: %v", q[0], q[1], err)
		}
	}
}
