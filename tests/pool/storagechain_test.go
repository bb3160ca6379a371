package pool

import (
	"crypto/sha256"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/pooltest"
	"toolstackd/internal/testdaemon"
	"toolstackd/internal/xerr"
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
	g := tickGuest(t)
	ctx := testCtx(t)
	p, r, hosts := storagePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}}})
	local := []string{r.localSR(hosts[0]), r.localSR(hosts[1])}
	const size = 64 << 20
	vm, vdi := vmWithDisk(r, "chain", "chain disk", local[0], size)
	// Writes of shrinking length: each generation differs from the one
	// before in its first megabytes only.
	write := func(n int) [32]byte {
		writePattern(t, r, p.Addr(0), vdi, n)
		return sha256.Sum256(readDisk(t, r, p.Addr(0), vdi))
	}
	sums := map[string][32]byte{}
	sums["s1"] = write(size)
	s1 := r.str("VM.snapshot", vm, "s1")
	sums["s2"] = write(8 << 20)
	s2 := r.str("VM.snapshot", vm, "s2")
	sums["disk"] = write(2 << 20)
	snaps := map[string]string{"s1": s1, "s2": s2}
	times := map[string]string{}
	for name, s := range snaps {
		_, sv := vmDisk(r, s)
		times[name] = string(r.call("VDI.get_snapshot_time", sv))
	}
	used := func(host int, vdis ...string) int64 {
		var images []string
		for _, v := range vdis {
			images = append(images, fileNamed(t, p.Hosts[host].DataDir, r.str("VDI.get_uuid", v)))
		}
		return imageBytes(t, images...)
	}
	srcUsed := used(0, vdi, vmDiskVDI(r, s1), vmDiskVDI(r, s2))

	uuid, ticks := startTicking(t, g, p, r, vm, hosts, 0)
	r.call("VM.migrate_send", migrateSendArgs(vm, destMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	nv := checkMoved(t, r, vm, vdi, local[1], hosts[1])
	if !regexp.MustCompile(`msg="qemu: disk mirror started" .*vm=` + uuid + `.* sync=top`).MatchString(p.Hosts[0].Log()) {
		t.Fatal("the disk was not mirrored by its top alone")
	}
	n := ticks.count(1)
	if _, err := ticks.follow(p.Hosts[1].DataDir, uuid, 1); err != nil {
		t.Fatal(err)
	}
	ticks.wait(t, 1, n+3, time.Minute)
	ticks.check(t) // counting on: no reboot

	// The records: each snapshot's disk is a snapshot of the new disk,
	// taken when the old one was.
	check := func(host int, disk string) {
		t.Helper()
		for name, s := range snaps {
			_, sv := vmDisk(r, s)
			if r.str("VDI.get_SR", sv) != local[host] || string(r.call("VDI.get_is_a_snapshot", sv)) != "true" ||
				r.str("VDI.get_snapshot_of", sv) != disk || string(r.call("VDI.get_snapshot_time", sv)) != times[name] ||
				r.str("VDI.get_name_label", sv) != "chain disk" {
				t.Fatalf("snapshot %s's disk after the move: SR %s, is_a_snapshot %s, snapshot_of %s (want %s), time %s (want %s)",
					name, r.str("VDI.get_SR", sv), r.call("VDI.get_is_a_snapshot", sv), r.str("VDI.get_snapshot_of", sv), disk,
					r.call("VDI.get_snapshot_time", sv), times[name])
			}
		}
		// The images: the disk over s2's copy over s1's.
		for _, name := range []string{"s1", "s2"} {
			sharesHistory(t, p.Hosts[host].DataDir, r.str("VDI.get_uuid", disk), r.str("VDI.get_uuid", vmDiskVDI(r, snaps[name])))
		}
		got := used(host, disk, vmDiskVDI(r, s1), vmDiskVDI(r, s2))
		t.Logf("figure: a %d MiB disk and its two snapshots take %d KiB on host %d (%d KiB on the source before the move: ratio %.2f)",
			size>>20, got>>10, host, srcUsed>>10, float64(got)/float64(srcUsed))
		if got > srcUsed*3/2 {
			t.Fatalf("the disk and its snapshots take %d bytes after the move, %d before: no sharing", got, srcUsed)
		}
	}
	check(1, nv)
	r.call("VM.hard_shutdown", vm)
	contents := func(disk string) {
		t.Helper()
		for name, v := range map[string]string{"disk": disk, "s1": vmDiskVDI(r, s1), "s2": vmDiskVDI(r, s2)} {
			if got := readDisk(t, r, p.Addr(0), v); sha256.Sum256(got) != sums[name] {
				t.Fatalf("%s reads otherwise after the move (%d bytes)", name, len(got))
			}
		}
	}
	contents(nv)

	// Halted, back to host 0: every disk copied, the VM's own as what
	// changed since its newest snapshot.
	r.call("VM.migrate_send", migrateSendArgs(vm, destMap(r, hosts[0]), map[string]string{nv: local[0]},
		map[string]string{}, map[string]string{})...)
	_, back := vmDisk(r, vm)
	if back == nv || r.str("VDI.get_SR", back) != local[0] {
		t.Fatalf("the halted VM's disk is on %s", r.str("VDI.get_SR", back))
	}
	check(0, back)
	contents(back)
}

// backingChain is an image's file and its backing files, top first.
func backingChain(t *testing.T, image string) []string {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--backing-chain", "--output=json", image).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", image, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range infos {
		names = append(names, filepath.Base(i.Filename))
	}
	return names
}

// imageBytes is the space the images' chains take on disk, each file
// counted once.
func imageBytes(t *testing.T, images ...string) int64 {
	t.Helper()
	seen := map[string]bool{}
	var n int64
	for _, image := range images {
		for _, f := range backingChain(t, image) {
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

// sharesHistory checks that the image of the VDI of uuid disk, under
// dir, has below it the image the VDI of uuid snap is a top over.
func sharesHistory(t *testing.T, dir, disk, snap string) {
	t.Helper()
	chain := backingChain(t, fileNamed(t, dir, disk))
	sc := backingChain(t, fileNamed(t, dir, snap))
	if len(sc) < 2 || !slices.Contains(chain, sc[1]) {
		t.Fatalf("the snapshot's image %v shares nothing with the disk's %v", sc, chain)
	}
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
	ctx := testCtx(t)
	p, r, hosts := storagePool(t, ctx, pooltest.Options{})
	local := []string{r.localSR(hosts[0]), r.localSR(hosts[1])}
	vm := sharedVM(r, local[0], "checkpointed", nil)
	_, vdi := vmDisk(r, vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	cp := r.str("VM.checkpoint", vm, "with memory")
	sv := r.str("VM.get_suspend_VDI", cp)
	if r.str("VDI.get_SR", sv) != local[0] {
		t.Skipf("the checkpoint's memory is on SR %s, not host 0's local SR: nothing to move", r.str("VDI.get_SR", sv))
	}
	image := readDisk(t, r, p.Addr(0), sv)
	r.call("VM.migrate_send", migrateSendArgs(vm, destMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	checkMoved(t, r, vm, vdi, local[1], hosts[1])
	nsv := r.str("VM.get_suspend_VDI", cp)
	if nsv == sv || r.str("VDI.get_SR", nsv) != local[1] || r.str("VDI.get_type", nsv) != "suspend" {
		t.Fatalf("the checkpoint's suspend image after the move: %s on %s", nsv, r.str("VDI.get_SR", nsv))
	}
	if _, err := r.c.Call(ctx, r.at, "VDI.get_uuid", r.s, sv); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old suspend image after the move: %v", err)
	}
	if got := readDisk(t, r, p.Addr(0), nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the checkpoint's suspend image differs after the move")
	}
	r.call("VM.revert", cp)
	if s := vmWhere(r, vm); s.Power != "Suspended" {
		t.Fatalf("after reverting to the checkpoint: %+v", s)
	}
	r.call("VM.resume_on", vm, hosts[1], false, false)
	if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed from the moved checkpoint: %+v", s)
	}
	r.call("VM.hard_shutdown", vm)
}

// A suspended VM moves with VM.migrate_send as xapi allows: its disk and
// its memory image (on host 0's local SR, which host 1 does not see) are
// copied to host 1's local SR, the VM stays suspended there, and resumes
// on host 1 from the image that moved.
func TestStorageMigrateSuspended(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the exports)")
	}
	ctx := testCtx(t)
	p, r, hosts := storagePool(t, ctx, pooltest.Options{})
	local := []string{r.localSR(hosts[0]), r.localSR(hosts[1])}
	vm := sharedVM(r, local[0], "suspended mover", nil)
	_, vdi := vmDisk(r, vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	r.call("VM.suspend", vm)
	sv := r.str("VM.get_suspend_VDI", vm)
	if r.str("VDI.get_SR", sv) != local[0] {
		t.Skipf("the VM's memory is on SR %s, not host 0's local SR: nothing to move", r.str("VDI.get_SR", sv))
	}
	image := readDisk(t, r, p.Addr(0), sv)
	r.call("VM.migrate_send", migrateSendArgs(vm, destMap(r, hosts[1]), map[string]string{vdi: local[1]},
		map[string]string{}, map[string]string{})...)
	if s := vmWhere(r, vm); s.Power != "Suspended" || len(s.Ops) != 0 {
		t.Fatalf("a suspended VM after its move: %+v", s)
	}
	_, nv := vmDisk(r, vm)
	nsv := r.str("VM.get_suspend_VDI", vm)
	if nv == vdi || r.str("VDI.get_SR", nv) != local[1] || nsv == sv || r.str("VDI.get_SR", nsv) != local[1] {
		t.Fatalf("after the move: disk %s on %s, memory %s on %s", nv, r.str("VDI.get_SR", nv), nsv, r.str("VDI.get_SR", nsv))
	}
	if got := readDisk(t, r, p.Addr(0), nsv); sha256.Sum256(got) != sha256.Sum256(image) {
		t.Fatal("the memory image differs after the move")
	}
	r.call("VM.resume_on", vm, hosts[1], false, false)
	if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[1] {
		t.Fatalf("resumed after the move: %+v", s)
	}
	r.call("VM.hard_shutdown", vm)
}
