// Package chain tests storage migration of what hangs off a VM's disk:
// snapshot chains (each snapshot's blocks shared as before), checkpoints
// with their memory, and suspended VMs, on the simulator and on QEMU.
package chain

import (
	"crypto/sha256"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// Snapshot chains in a storage migration, as xapi moves them: a running
// QEMU guest whose disk has two snapshots, each taken after different
// writes, moves to host 1's local SR. The snapshots' disks arrive as a
// chain (the older one whole, the newer as what changed since, the
// guest's disk mirrored with only its own top onto a clone of the newer),
// so the destination holds them sharing their history again: the disk's
// image has the two snapshots' images below it, and the three take about
// the space they took on the source, not three full copies. Every disk
// reads as before; the new VDIs are snapshots of the new disk, at the
// old snapshot times. Then the VM, halted, moves back the same way (its
// disk copied as what changed since its newest snapshot).
func TestStorageMigrateSnapshotChain(t *testing.T) {
	g := suite.TickGuest(t)
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	const size = 64 << 20
	vm, vdi := suite.VMWithDisk(r, "chain", "chain disk", local[0], size)
	// Writes of shrinking length: each generation differs from the one
	// before in its first megabytes only.
	write := func(n int) [32]byte {
		suite.WritePattern(t, r, p.Addr(0), vdi, n)
		return sha256.Sum256(suite.ReadDisk(t, r, p.Addr(0), vdi))
	}
	sums := map[string][32]byte{}
	sums["s1"] = write(size)
	s1 := r.Str("VM.snapshot", vm, "s1")
	sums["s2"] = write(8 << 20)
	s2 := r.Str("VM.snapshot", vm, "s2")
	sums["disk"] = write(2 << 20)
	snaps := map[string]string{"s1": s1, "s2": s2}
	times := map[string]string{}
	for name, s := range snaps {
		_, sv := suite.VMDisk(r, s)
		times[name] = string(r.Call("VDI.get_snapshot_time", sv))
	}
	used := func(host int, vdis ...string) int64 {
		var images []string
		for _, v := range vdis {
			images = append(images, suite.FileNamed(t, p.Hosts[host].DataDir, r.Str("VDI.get_uuid", v)))
		}
		return imageBytes(t, images...)
	}
	srcUsed := used(0, vdi, suite.VMDiskVDI(r, s1), suite.VMDiskVDI(r, s2))

	uuid, ticks := suite.StartTicking(t, g, p, r, vm, hosts, 0)
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	nv := suite.CheckMoved(t, r, vm, vdi, local[1], hosts[1])
	if !regexp.MustCompile(`msg="qemu: disk mirror started" .*vm=` + uuid + `.* sync=top`).MatchString(p.Hosts[0].Log()) {
		t.Fatal("the disk was not mirrored by its top alone")
	}
	n := ticks.Count(1)
	if _, err := ticks.Follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, 1, n+3, time.Minute)
	ticks.Check(t) // counting on: no reboot

	// The records: each snapshot's disk is a snapshot of the new disk,
	// taken when the old one was.
	check := func(host int, disk string) {
		t.Helper()
		for name, s := range snaps {
			_, sv := suite.VMDisk(r, s)
			if r.Str("VDI.get_SR", sv) != local[host] || string(r.Call("VDI.get_is_a_snapshot", sv)) != "true" ||
				r.Str("VDI.get_snapshot_of", sv) != disk || string(r.Call("VDI.get_snapshot_time", sv)) != times[name] ||
				r.Str("VDI.get_name_label", sv) != "chain disk" {
				t.Fatalf("snapshot %s's disk after the move: SR %s, is_a_snapshot %s, snapshot_of %s (want %s), time %s (want %s)",
					name, r.Str("VDI.get_SR", sv), r.Call("VDI.get_is_a_snapshot", sv), r.Str("VDI.get_snapshot_of", sv), disk,
					r.Call("VDI.get_snapshot_time", sv), times[name])
			}
		}
		// The images: the disk over s2's copy over s1's.
		for _, name := range []string{"s1", "s2"} {
			suite.SharesHistory(t, p.Hosts[host].DataDir, r.Str("VDI.get_uuid", disk), r.Str("VDI.get_uuid", suite.VMDiskVDI(r, snaps[name])))
		}
		got := used(host, disk, suite.VMDiskVDI(r, s1), suite.VMDiskVDI(r, s2))
		t.Logf("figure: a %d MiB disk and its two snapshots take %d KiB on host %d (%d KiB on the source before the move: ratio %.2f)",
			size>>20, got>>10, host, srcUsed>>10, float64(got)/float64(srcUsed))
		if got > srcUsed*3/2 {
			t.Fatalf("the disk and its snapshots take %d bytes after the move, %d before: no sharing", got, srcUsed)
		}
	}
	check(1, nv)
	r.Call("VM.hard_shutdown", vm)
	contents := func(disk string) {
		t.Helper()
		for name, v := range map[string]string{"disk": disk, "s1": suite.VMDiskVDI(r, s1), "s2": suite.VMDiskVDI(r, s2)} {
			if got := suite.ReadDisk(t, r, p.Addr(0), v); sha256.Sum256(got) != sums[name] {
				t.Fatalf("%s reads otherwise after the move (%d bytes)", name, len(got))
			}
		}
	}
	contents(nv)

	// Halted, back to host 0: every disk copied, the VM's own as what
	// changed since its newest snapshot.
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[0]), map[string]string{nv: local[0]},
		map[string]string{}, map[string]string{})...)
	_, back := suite.VMDisk(r, vm)
	if back == nv || r.Str("VDI.get_SR", back) != local[0] {
		t.Fatalf("the halted VM's disk is on %s", r.Str("VDI.get_SR", back))
	}
	check(0, back)
	contents(back)
}

// imageBytes is the space the images' chains take on disk, each file
// counted once.
func imageBytes(t *testing.T, images ...string) int64 {
	t.Helper()
	seen := map[string]bool{}
	var n int64
	for _, image := range images {
		for _, f := range suite.BackingChain(t, image) {
			path := filepath.Join(filepath.Dir(image), f)
			if seen[path] {
				continue
			}
			seen[path] = true
			var st syscall.Stat_t
			if err := syscall.Stat(path, &st); err != nil {
				t.Fatal(err)
			}
			n += st.Blocks * 512
		}
	}
	return n
}

// A checkpoint's memory goes with the VM it was taken of, as xapi moves
// the suspend images the destination cannot see: a running VM with a
// checkpoint (its suspend image on host 0's local SR) moves to host 1's
// local SR; the checkpoint's suspend image is then on an SR host 1 sees,
// holding the same bytes, and the VM reverts to the checkpoint and
// resumes from it there.
func TestStorageMigrateCheckpoint(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "checkpointed", nil)
	_, vdi := suite.VMDisk(r, vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	cp := r.Str("VM.checkpoint", vm, "with memory")
	sv := r.Str("VM.get_suspend_VDI", cp)
	if r.Str("VDI.get_SR", sv) != local[0] {
		t.Skipf("the checkpoint's memory is on SR %s, not host 0's local SR: nothing to move", r.Str("VDI.get_SR", sv))
	}
	image := suite.ReadDisk(t, r, p.Addr(0), sv)
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	suite.CheckMoved(t, r, vm, vdi, local[1], hosts[1])
	nsv := r.Str("VM.get_suspend_VDI", cp)
	if nsv == sv || r.Str("VDI.get_SR", nsv) != local[1] || r.Str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the checkpoint's suspend image after the move: %s on %s", nsv, r.Str("VDI.get_SR", nsv))
	}
	if _, err := r.C.Call(ctx, r.At, "VDI.get_uuid", r.S, sv); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old suspend image after the move: %v", err)
	}
	if got := suite.ReadDisk(t, r, p.Addr(0), nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the checkpoint's suspend image differs after the move")
	}
	r.Call("VM.revert", cp)
	if s := suite.VMWhere(r, vm); s.Power != "Suspended" {
		t.Fatalf("after reverting to the checkpoint: %+v", s)
	}
	r.Call("VM.resume_on", vm, hosts[1], false, false)
	if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed from the moved checkpoint: %+v", s)
	}
	r.Call("VM.hard_shutdown", vm)
}

// A suspended VM moves with VM.migrate_send as xapi allows: its disk and
// its memory image (on host 0's local SR, which host 1 does not see) are
// copied to host 1's local SR, the VM stays suspended there, and resumes
// on host 1 from the image that moved.
func TestStorageMigrateSuspended(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := suite.Ctx(t)
	p, r, hosts := suite.StoragePool(t, ctx, pooltest.Options{})
	local := []string{r.LocalSR(hosts[0]), r.LocalSR(hosts[1])}
	vm := suite.SharedVM(r, local[0], "suspended mover", nil)
	_, vdi := suite.VMDisk(r, vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	r.Call("VM.suspend", vm)
	sv := r.Str("VM.get_suspend_VDI", vm)
	if r.Str("VDI.get_SR", sv) != local[0] {
		t.Skipf("the VM's memory is on SR %s, not host 0's local SR: nothing to move", r.Str("VDI.get_SR", sv))
	}
	image := suite.ReadDisk(t, r, p.Addr(0), sv)
	r.Call("VM.migrate_send", suite.MigrateSendArgs(vm, suite.DestMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	if s := suite.VMWhere(r, vm); s.Power != "Suspended" || len(s.Ops) != 0 {
		t.Fatalf("a suspended VM after its move: %+v", s)
	}
	_, nv := suite.VMDisk(r, vm)
	nsv := r.Str("VM.get_suspend_VDI", vm)
	if nv == vdi || r.Str("VDI.get_SR", nv) != local[1] || nsv == sv || r.Str("VDI.get_SR", nsv) != local[1] {
		t.Fatalf("after the move: disk %s on %s, memory %s on %s", nv, r.Str("VDI.get_SR", nv), nsv, r.Str("VDI.get_SR", nsv))
	}
	if got := suite.ReadDisk(t, r, p.Addr(0), nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the memory image differs after the move")
	}
	r.Call("VM.resume_on", vm, hosts[1], false, false)
	if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed after the move: %+v", s)
	}
	r.Call("VM.hard_shutdown", vm)
}
