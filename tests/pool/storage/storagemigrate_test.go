// Package storage tests storage migration inside a pool (VM.migrate_send
// to another SR): running and halted VMs with their snapshots, cancels
// and refusals, a read-only disk, on the simulator and on QEMU. Snapshot
// chains, checkpoints and suspended VMs are in tests/pool/chain.
package storage

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// VM.migrate_send inside a pool (issue 18, storage migration): each host
// has its own local SR ("Local storage", type file); a running VM's disk
// moves from host 0's to host 1's while the VM moves, through
// host.migrate_receive's dest map, as XO calls them.

// A running simulated VM with its disk on host 0's local SR moves to host
// 1 with the disk going to host 1's local SR; then back.
func TestStorageMigrateSimulator(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := suite.Ctx(t)
	_, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "sxm", nil)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	for _, to := range []int{1, 0} {
		_, vdi := suite.VMDisk(r, vm)
		before := suite.SRVDIs(r, local[to])
		r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[to]), map[string]string{vdi: local[to]},
			map[string]string{}, map[string]string{})...)
		suite.CheckMoved(t, r, vm, vdi, local[to], hosts[to])
		if n := suite.SRVDIs(r, local[to]); n != before+1 {
			t.Fatalf("host %d's SR has %d VDIs, want %d", to, n, before+1)
		}
		if n := string(r.Call("VDI.get_virtual_size", suite.VMDiskVDI(r, vm))); n != fmt.Sprint(4<<20) {
			t.Fatalf("the new VDI's virtual size: %s", n)
		}
	}
}

// What VM.migrate_send and VM.assert_can_migrate refuse, with xapi's
// codes: a disk not in the map, a disk left on an SR the destination
// cannot see, an SR that does not exist, copy mode, a VIF moved to
// another network, a destination outside the pool. Nothing moves; then
// xe vm-migrate with vdi: moves it.
func TestStorageMigrateRefusals(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "refused", nil)
	_, vdi := suite.VMDisk(r, vm)
	dest := suite.DestMap(r, hosts[1])
	send := func(d map[string]string, vdiMap, vifMap, options map[string]string) error {
		_, err := r.C.Call(ctx, r.At, "VM.migrate_send", append([]any{r.S}, suite.MigrateSendArgs(vm, d, vdiMap, vifMap, options)...)...)
		return err
	}
	can := func(d map[string]string, vdiMap, vifMap, options map[string]string) error {
		_, err := r.C.Call(ctx, r.At, "VM.assert_can_migrate", r.S, vm, d, true, vdiMap, vifMap, options, map[string]string{})
		return err
	}
	both := func(what string, d map[string]string, vdiMap, vifMap, options map[string]string, code string, params ...string) {
		t.Helper()
		suite.WantRefusal(t, what, send(d, vdiMap, vifMap, options), code, params...)
		suite.WantRefusal(t, "assert_can_migrate: "+what, can(d, vdiMap, vifMap, options), code, params...)
	}
	none := map[string]string{}
	// A halted VM moves its disks (TestStorageMigrateHaltedAndSnapshots),
	// but asked about a pool migration (no vdi_map) it is not running.
	suite.WantRefusal(t, "assert_can_migrate of a halted VM without a map", can(dest, none, none, none), xerr.VMBadPowerState, vm, "running", "halted")
	r.Call("VM.start_on", vm, hosts[0], false, false)
	both("a disk left where the destination cannot see it, no map", dest, none, none, none, xerr.VMRequiresSR, vm, local[0])
	// A second disk, not in the map.
	vdi2 := r.Str("VDI.create", map[string]any{"name_label": "second", "name_description": "", "SR": local[0],
		"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	vbd2 := r.Str("VBD.create", map[string]any{"VM": vm, "VDI": vdi2, "userdevice": "1", "bootable": false, "mode": "RW",
		"type": "Disk", "empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{}})
	both("a disk not in the map", dest, map[string]string{vdi: local[1]}, none, none, xerr.VDINotInMap, vdi2)
	r.Call("VBD.destroy", vbd2)
	r.Call("VDI.destroy", vdi2)
	both("a disk left where the destination cannot see it", dest, map[string]string{vdi: local[0]}, none, none, xerr.VMRequiresSR, vm, local[0])
	both("an SR that does not exist", dest, map[string]string{vdi: "OpaqueRef:00000000-0000-0000-0000-00000000dead"}, none, none, xerr.HandleInvalid)
	both("copy mode", dest, map[string]string{vdi: local[1]}, none, map[string]string{"copy": "true"}, xerr.OperationNotAllowed)
	other := map[string]string{}
	for k, v := range dest {
		other[k] = v
	}
	other["host"] = "OpaqueRef:00000000-0000-0000-0000-0000000f00d5"
	// A host this pool does not have is taken as another pool's (as xapi
	// does), which does not know it either (tests/pool/crosspool moves VMs
	// between pools).
	both("a destination in another pool", other, map[string]string{vdi: local[1]}, none, none, xerr.HandleInvalid)
	// A VIF put on another network.
	net := r.Str("network.create", map[string]any{"name_label": "elsewhere", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}, "bridge": "", "managed": true, "tags": []string{}})
	// host.migrate_receive on a network the host has no PIF on.
	_, err := r.C.Call(ctx, r.At, "host.migrate_receive", r.S, hosts[1], net, map[string]string{})
	suite.WantRefusal(t, "host.migrate_receive on a network without the host", err, xerr.HostCannotAttachNetwork, hosts[1], net)
	r.Call("VIF.create", map[string]any{"device": "0", "network": net, "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	var vifs []string
	_ = json.Unmarshal(r.Call("VM.get_VIFs", vm), &vifs)
	if len(vifs) > 0 {
		mgmt := ""
		var pifs map[string]map[string]any
		_ = json.Unmarshal(r.Call("PIF.get_all_records"), &pifs)
		for _, p := range pifs {
			if p["host"] == hosts[1] && p["management"] == true {
				mgmt = p["network"].(string)
			}
		}
		both("a VIF moved to another network", dest, map[string]string{vdi: local[1]}, map[string]string{vifs[0]: mgmt}, none,
			xerr.OperationNotAllowed)
		r.Call("VIF.destroy", vifs[0])
	}
	// The move that can be made passes the check.
	if err := can(dest, map[string]string{vdi: local[1]}, none, none); err != nil {
		t.Fatalf("assert_can_migrate of a move that can be made: %v", err)
	}
	if s := suite.VMWhere(r, vm); s.On != hosts[0] || s.Power != "Running" || len(s.Ops) != 0 {
		t.Fatalf("a refused VM: %+v", s)
	}
	if _, v := suite.VMDisk(r, vm); v != vdi {
		t.Fatalf("a refused VM's disk moved to %s", v)
	}
	// xe: vdi: within the pool goes through migrate_send; remote-master
	// is refused.
	c := suite.DaemonCLI(t, r, p.Password())
	out := c("vm-migrate", "uuid="+r.Str("VM.get_uuid", vm), "host="+r.Str("host.get_uuid", hosts[1]),
		"vdi:"+r.Str("VDI.get_uuid", vdi)+"="+r.Str("SR.get_uuid", local[1]))
	if s := suite.VMWhere(r, vm); s.On != hosts[1] || s.Power != "Running" {
		t.Fatalf("after xe vm-migrate vdi: %+v (%s)", s, out)
	}
	if _, v := suite.VMDisk(r, vm); r.Str("VDI.get_SR", v) != local[1] {
		t.Fatalf("xe vm-migrate vdi: left the disk on %s", r.Str("VDI.get_SR", v))
	}
}

// Cancelling VM.migrate_send while the disk is mirrored, and again while
// the memory goes: the VM runs on host 0 with its old disk, and host 1
// has no new VDI and no domain.
func TestStorageMigrateCancel(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export)")
	}
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{
		Env: []string{"TOOLSTACKD_SIM_DELAYS=mirror-copy=8s"}}})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "cancelled", nil)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	_, vdi := suite.VMDisk(r, vm)
	before := suite.SRVDIs(r, local[1])
	cancelAt := func(what string, lo, hi float64) {
		t.Helper()
		task := r.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
			map[string]string{}, map[string]string{})...)
		suite.WaitUntil(t, 60*time.Second, what, func() bool {
			if st := r.Str("task.get_status", task); st != "pending" {
				t.Fatalf("the migration ended early: %s %s", st, r.Call("task.get_error_info", task))
			}
			var prog float64
			_ = json.Unmarshal(r.Call("task.get_progress", task), &prog)
			return prog > lo && prog < hi
		})
		r.Call("task.cancel", task)
		if st, info := suite.WaitTask(t, r, task); st != "cancelled" {
			t.Fatalf("%s: a cancelled migration: %s %v", what, st, info)
		}
		suite.WaitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
		if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
			t.Fatalf("%s: after the cancel: %+v", what, s)
		}
		if _, v := suite.VMDisk(r, vm); v != vdi {
			t.Fatalf("%s: the VBD is on %s after the cancel", what, v)
		}
		if !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
			t.Fatalf("%s: the VM's domain is gone from its host", what)
		}
		suite.WaitUntil(t, 30*time.Second, "the destination to drop what it made", func() bool {
			return !suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) && suite.SRVDIs(r, local[1]) == before
		})
	}
	// The mirror takes 8 s: cancelled while the disk is copied.
	cancelAt("the mirror", 0.12, 0.5)
	// The memory capped at 40 bytes a second: cancelled while it goes.
	r.Call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	cancelAt("the memory", 0.55, 0.9)
	// Nothing was left in the way (the mirror takes its time: Async).
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	task := r.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	if st, info := suite.WaitTask(t, r, task); st != "success" {
		t.Fatalf("the move after the cancels: %s %v", st, info)
	}
	suite.CheckMoved(t, r, vm, vdi, local[1], hosts[1])
}

// A running VM on real QEMU (TCG) with a known pattern on its disk, on
// host 0's local SR, moves with the disk to host 1's: the guest (a
// counter on its serial port) counts on there without a reboot, one QEMU
// process runs it, the disk
// is a new VDI on host 1's SR with the same bytes, the old VDI is gone.
// The mirror's throughput against a copy of the image file is logged
// for docs/performance.md.
func TestStorageMigrateQEMU(t *testing.T) {
	g := suite.TickGuest(t) // "TICK n" on the serial port
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	const size = 256 << 20
	vm, vdi := suite.VMWithDisk(r, "qemu-sxm", "sxm disk", local[0], size)
	sum := suite.WritePattern(t, r, p.Addr(0), vdi, size)
	uuid, ticks := suite.StartTicking(t, g, p, r, vm, hosts, 0)
	// Rounds back and forth (TOOLSTACKD_SXM_ROUNDS, default 1), each
	// after the baseline of the figure: the current image file copied on
	// this machine with cp and with qemu-img convert (as storage copies
	// a qcow2), the guest running.
	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("TOOLSTACKD_SXM_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	var mirrors, cps, converts, walls []time.Duration
	at := 0
	for round := range rounds {
		to := 1 - at
		image := suite.FileNamed(t, p.Hosts[at].DataDir, r.Str("VDI.get_uuid", vdi))
		timed := func(name string, args ...string) time.Duration {
			t.Helper()
			out := filepath.Join(t.TempDir(), "copy")
			t0 := time.Now()
			if b, err := exec.Command(name, append(args, image, out)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", name, err, b)
			}
			return time.Since(t0)
		}
		cps = append(cps, timed("cp"))
		converts = append(converts, timed("qemu-img", "convert", "-U", "-O", "qcow2"))
		t0 := time.Now()
		r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[to]), map[string]string{vdi: local[to]},
			map[string]string{}, map[string]string{})...)
		walls = append(walls, time.Since(t0))
		nv := suite.CheckMoved(t, r, vm, vdi, local[to], hosts[to])
		if pids := suite.QEMUOf(uuid); len(pids) != 1 {
			t.Fatalf("QEMU processes of the VM after the move: %v", pids)
		}
		// The guest's state went over (QEMU's migration, not a new boot)
		// and it counts on there.
		if !regexp.MustCompile(`msg="qemu: live migration sent" .*vm=` + uuid).MatchString(p.Hosts[at].Log()) {
			t.Fatal("the source did not send the guest's state")
		}
		n := ticks.Count(to)
		if _, err := ticks.Follow(p.Hosts[to].DataDir, uuid, to); err != nil {
			t.Fatal(err)
		}
		ticks.Wait(t, to, n+3, time.Minute)
		mirror, err := time.ParseDuration(mirrorTime(p.Hosts[at].Log(), uuid))
		if err != nil || mirror <= 0 {
			t.Fatalf("the source logged no mirror time: %v", err)
		}
		mirrors = append(mirrors, mirror)
		if round == 0 || round == rounds-1 {
			time.Sleep(time.Second)
			if s := suite.VMWhere(r, vm); s.Power != "Running" {
				t.Fatalf("after the move: %+v", s)
			}
			got := suite.ReadDisk(t, r, p.Addr(0), nv)
			if len(got) != size || sha256.Sum256(got) != sum {
				t.Fatalf("the moved disk differs: %d bytes", len(got))
			}
		}
		vdi, at = nv, to
	}
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	ticks.Check(t) // one guest, counting on from host to host: no reboot
	mbs := func(d time.Duration) float64 { return float64(size) / d.Seconds() / (1 << 20) }
	mirror, cp, convert := med(mirrors), med(cps), med(converts)
	t.Logf("figure: storage migration of a %d MiB disk (all blocks written), median of %d: call %v; mirror %v = %.0f MiB/s; "+
		"cp %v = %.0f MiB/s (mirror/cp %.2f); qemu-img convert %v = %.0f MiB/s (mirror/convert %.2f); mirrors %v",
		size>>20, rounds, med(walls).Round(time.Millisecond), mirror.Round(time.Millisecond), mbs(mirror), cp.Round(time.Millisecond),
		mbs(cp), mbs(mirror)/mbs(cp), convert.Round(time.Millisecond), mbs(convert), mbs(mirror)/mbs(convert), mirrors)
}

// mirrorTime is the mirror time the source logged for the VM's last
// migration ("" when it did not).
func mirrorTime(log, uuid string) string {
	out := ""
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="VM migrated"`) && strings.Contains(l, uuid) {
			if i := strings.Index(l, "mirror="); i >= 0 {
				out = strings.TrimPrefix(strings.Fields(l[i:])[0], "mirror=")
			}
		}
	}
	return out
}

// A halted VM's disk moves with VM.migrate_send as a copy (xapi allows
// it): the VM stays halted, its VBD is on a new VDI of host 1's SR with
// the same bytes, the old VDI is gone, and the VM starts on host 1. Then
// a running VM with a snapshot moves: the snapshot's disk is copied
// along (its VDI's snapshot_of is in the map), the VM's disk mirrored.
func TestStorageMigrateHaltedAndSnapshots(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "halted mover", nil)
	_, vdi := suite.VMDisk(r, vm)
	sum := suite.WritePattern(t, r, p.Addr(0), vdi, 4<<20)
	r.Call("VM.assert_can_migrate", vm, suite.DestMap(r, hosts[1]), true, map[string]string{vdi: local[1]}, map[string]string{},
		map[string]string{}, map[string]string{})
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	s := suite.VMWhere(r, vm)
	if s.Power != "Halted" || len(s.Ops) != 0 {
		t.Fatalf("a halted VM after its disks moved: %+v", s)
	}
	_, nv := suite.VMDisk(r, vm)
	if nv == vdi || r.Str("VDI.get_SR", nv) != local[1] {
		t.Fatalf("the halted VM's disk is on %s", r.Str("VDI.get_SR", nv))
	}
	if _, err := r.C.Call(ctx, r.At, "VDI.get_uuid", r.S, vdi); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old VDI after the move: %v", err)
	}
	if got := suite.ReadDisk(t, r, p.Addr(0), nv); sha256.Sum256(got) != sum {
		t.Fatal("the copied disk differs")
	}
	r.Call("VM.start_on", vm, hosts[1], false, false)
	r.Call("VM.hard_shutdown", vm)

	// A running VM with a snapshot.
	vm2 := suite.SharedVM(r, local[0], "with a snapshot", nil)
	_, vdi2 := suite.VMDisk(r, vm2)
	sum2 := suite.WritePattern(t, r, p.Addr(0), vdi2, 4<<20)
	snap := r.Str("VM.snapshot", vm2, "before")
	_, svdi := suite.VMDisk(r, snap)
	r.Call("VM.start_on", vm2, hosts[0], false, false)
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm2, suite.DestMap(r, hosts[1]), map[string]string{vdi2: local[1]},
		map[string]string{}, map[string]string{})...)
	suite.CheckMoved(t, r, vm2, vdi2, local[1], hosts[1])
	_, nsv := suite.VMDisk(r, snap)
	if nsv == svdi || r.Str("VDI.get_SR", nsv) != local[1] {
		t.Fatalf("the snapshot's disk is on %s", r.Str("VDI.get_SR", nsv))
	}
	if _, err := r.C.Call(ctx, r.At, "VDI.get_uuid", r.S, svdi); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the snapshot's old VDI after the move: %v", err)
	}
	if got := suite.ReadDisk(t, r, p.Addr(0), nsv); sha256.Sum256(got) != sum2 {
		t.Fatal("the snapshot's copied disk differs")
	}
}

// Cancelling VM.migrate_send of a real QEMU guest while its disk is
// mirrored, then while its memory goes (the VM's migration_bandwidth,
// 8 MiB/s, holds both): each time the guest counts on on host 0 with
// its old disk, and host 1 has no QEMU and no new VDI; then it moves.
func TestStorageMigrateQEMUCancel(t *testing.T) {
	g := suite.TickGuest(t)
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "qemu-cancelled", map[string]string{"migration_bandwidth": fmt.Sprint(8 << 20)})
	r.Call("VDI.resize", suite.VMDiskVDI(r, vm), 64<<20)
	_, vdi := suite.VMDisk(r, vm)
	suite.WritePattern(t, r, p.Addr(0), vdi, 64<<20)
	uuid, ticks := suite.StartTicking(t, g, p, r, vm, hosts, 0)
	before := suite.SRVDIs(r, local[1])
	cancelAt := func(what string, lo, hi float64) {
		t.Helper()
		task := r.Str("Async.VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
			map[string]string{}, map[string]string{})...)
		suite.WaitUntil(t, 2*time.Minute, what, func() bool {
			if st := r.Str("task.get_status", task); st != "pending" {
				t.Fatalf("%s: the migration ended early: %s %s", what, st, r.Call("task.get_error_info", task))
			}
			var prog float64
			_ = json.Unmarshal(r.Call("task.get_progress", task), &prog)
			return prog > lo && prog < hi
		})
		r.Call("task.cancel", task)
		if st, info := suite.WaitTask(t, r, task); st != "cancelled" {
			t.Fatalf("%s: a cancelled migration: %s %v", what, st, info)
		}
		suite.WaitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
		if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
			t.Fatalf("%s: after the cancel: %+v", what, s)
		}
		if _, v := suite.VMDisk(r, vm); v != vdi {
			t.Fatalf("%s: the VBD is on %s after the cancel", what, v)
		}
		suite.WaitUntil(t, 30*time.Second, "host 1 to drop its QEMU and VDI", func() bool {
			return len(suite.QEMUOf(uuid)) == 1 && suite.SRVDIs(r, local[1]) == before
		})
		ticks.Wait(t, 0, ticks.Count(0)+3, time.Minute) // the guest counts on where it was
	}
	// The task's progress: 0.2 to 0.5 while the disk is mirrored (QEMU
	// reports the copy in steps), 0.5 to 0.9 while the memory goes.
	cancelAt("the mirror", 0.15, 0.5)
	if !strings.Contains(p.Hosts[0].Log(), "storage migration failed while mirroring") {
		t.Fatal("the first cancel did not come while the disk was mirrored")
	}
	cancelAt("the memory", 0.505, 0.9)
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	suite.CheckMoved(t, r, vm, vdi, local[1], hosts[1])
	if _, err := ticks.Follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 1, 3, time.Minute)
	ticks.Check(t)
}

// A running QEMU VM's read-only disk (VBD mode RO) moves as its other
// disks do: mirrored (the guest cannot write it), the same bytes on the
// destination, the new VDI read-only where the old one was.
func TestStorageMigrateQEMUReadOnlyDisk(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := r.Str("VM.create", testdaemon.VMRecord("qemu-ro"))
	vdi := r.Str("VDI.create", map[string]any{"name_label": "ro disk", "name_description": "", "SR": local[0],
		"virtual_size": 8 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	sum := suite.WritePattern(t, r, p.Addr(0), vdi, 8<<20)
	r.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "1", "bootable": false, "mode": "RO", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	uuid := r.Str("VM.get_uuid", vm)
	t.Cleanup(func() { suite.KillQEMUs(uuid) })
	r.Call("VM.start_on", vm, hosts[0], false, false)
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	nv := suite.CheckMoved(t, r, vm, vdi, local[1], hosts[1])
	if got := suite.ReadDisk(t, r, p.Addr(0), nv); sha256.Sum256(got) != sum {
		t.Fatal("the read-only disk differs after the move")
	}
}
