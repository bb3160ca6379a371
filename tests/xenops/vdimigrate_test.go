package xenops_test

import (
	"context"
	"crypto/md5"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xenops"
	"toolstackd/internal/xenops/sim"
)

// VDI.pool_migrate: a disk of a running VM moves to another SR of its
// host while the guest uses it. On the simulator (in the test process,
// with the real storage layer and file SRs) for the checks, the records
// and cancellation; on QEMU with the tiny guest (the real daemon) for the
// data, the guest's writes across the pivot and a restart.

// storageDisks gives VMs their disks through storage's datapaths, as the
// daemon's resolver does (cmd/toolstackd, without the live-snapshot hook).
type storageDisks struct{ s *storage.Service }

func (d storageDisks) Attach(ctx context.Context, vm, vdi string, readonly bool) (xenops.DiskSource, error) {
	dp := "vbd/" + vm + "/" + vdi
	p, err := d.s.Attach(ctx, dp, vdi, readonly)
	if err != nil {
		return xenops.DiskSource{}, err
	}
	if err := d.s.Activate(ctx, dp, vdi); err != nil {
		_ = d.s.Detach(ctx, dp, vdi)
		return xenops.DiskSource{}, err
	}
	if p.Kind == "nbd" {
		return xenops.DiskSource{Kind: xenops.DiskNBD, NBDURI: p.URI, Format: "raw"}, nil
	}
	return xenops.DiskSource{Kind: xenops.DiskFile, Path: p.Path, Format: p.Format}, nil
}

func (d storageDisks) Detach(ctx context.Context, vm, vdi string) error {
	dp := "vbd/" + vm + "/" + vdi
	if err := d.s.Deactivate(ctx, dp, vdi); err != nil {
		return err
	}
	return d.s.Detach(ctx, dp, vdi)
}

// The copies of a VDI's snapshots go through storage's exports, as in
// the daemon (xenops.DiskMover).
func (d storageDisks) ExportVDI(ctx context.Context, vdi string) (*storage.Export, error) {
	return d.s.Export(ctx, vdi)
}

func (d storageDisks) ExportVDIReadOnly(ctx context.Context, vdi string) (*storage.Export, error) {
	return d.s.ExportReadOnly(ctx, vdi)
}

func (d storageDisks) DiffExtents(ctx context.Context, vdi, base string) ([]storage.Extent, error) {
	return d.s.DiffExtents(ctx, vdi, base)
}

func (d storageDisks) IsOverlayOf(ctx context.Context, vdi, base string) (bool, error) {
	return d.s.IsOverlayOf(ctx, vdi, base)
}

// storageEnv is an env with the storage layer: first boot's local SR
// and VDIs made with VDI.create.
func storageEnv(t *testing.T, cfg xenops.Config) *env {
	t.Helper()
	dir := shortTempDir(t)
	e := &env{t: t, dir: dir}
	e.d = db.New(dm.Model, db.Options{})
	acfg := api.DefaultConfig()
	acfg.PasswordIterations = 1000
	hash, _ := api.HashPassword(rootPW, acfg.PasswordIterations)
	host, err := api.FirstBoot(e.d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	e.host = host
	acfg.HostRef = host
	e.srv = api.New(e.d, acfg, testLogger(t, false))
	e.srv.Start()
	router := mux.NewRouter()
	e.srv.Routes(router)
	stor, err := storage.Register(e.srv, router, storage.Config{DataDir: dir, HostRef: host, FirstBoot: true,
		Log: testLogger(t, false), RunDir: filepath.Join(dir, "run"), ReserveBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir, cfg.HostRef, cfg.Disks = dir, host, storageDisks{stor}
	cfg.Log = testLogger(t, false)
	if e.m, err = xenops.Register(e.srv, router, cfg); err != nil {
		t.Fatal(err)
	}
	e.cfg = cfg
	e.http = httptest.NewServer(router)
	e.url = e.http.URL
	e.sess = e.str(e.call("session.login_with_password", "root", rootPW, "2.21", "xenops-test"))
	t.Cleanup(func() { e.close(); stor.Close() })
	return e
}

// fileSR makes a file SR in a directory of its own.
func (e *env) fileSR(name string) string {
	e.t.Helper()
	dir := shortTempDir(e.t) // outside the data directory, which storage keeps to itself
	return e.str(e.call("SR.create", e.host, map[string]string{"location": dir}, "0", name, "", "file", "user", false, map[string]string{}))
}

// newVDI makes a VDI with VDI.create.
func (e *env) newVDI(sr, name string, size int64) string {
	e.t.Helper()
	return e.str(e.call("VDI.create", map[string]any{
		"SR": sr, "name_label": name, "name_description": name + " described", "virtual_size": size, "type": "user",
		"sharable": false, "read_only": false, "other_config": map[string]string{"kept": "yes"},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{"moved"},
	}))
}

func (e *env) strs(class, ref, f string) []string {
	e.t.Helper()
	return strSet(e.field(class, ref, f))
}

// gone checks that a ref no longer names a record.
func (e *env) gone(class, ref string) bool {
	_, x := e.rpc(class+".get_record", e.sess, ref)
	return x != nil && x.Code == "HANDLE_INVALID"
}

// checkMoved checks the records after a VDI.pool_migrate of old (on VBD
// vbd) to sr that returned nu.
func (e *env) checkMoved(vbd, old, nu, sr string) {
	e.t.Helper()
	if nu == old || nu == "" || nu == nullRef {
		e.t.Fatalf("pool_migrate returned %q (old %s)", nu, old)
	}
	if got := e.field("VBD", vbd, "VDI"); got != nu {
		e.t.Fatalf("VBD.VDI %v, want the new VDI %s", got, nu)
	}
	rec := e.record("VDI", nu)
	oc, _ := rec["other_config"].(map[string]any)
	if rec["SR"] != sr || rec["name_label"] != "moving" || rec["name_description"] != "moving described" ||
		oc["kept"] != "yes" || len(strSet(rec["tags"])) != 1 || rec["virtual_size"].(float64) != 64<<20 {
		e.t.Fatalf("the new VDI: %v", rec)
	}
	if !contains(e.strs("VDI", nu, "VBDs"), vbd) {
		e.t.Fatalf("the new VDI's VBDs: %v", e.strs("VDI", nu, "VBDs"))
	}
	if !e.gone("VDI", old) {
		e.t.Fatalf("the old VDI %s is still there", old)
	}
	if cur := e.record("VDI", nu)["current_operations"].(map[string]any); len(cur) != 0 {
		e.t.Fatalf("the new VDI is marked %v", cur)
	}
}

// TestVDIPoolMigrateSimulator moves a running VM's disk between file
// SRs on the simulator: refusals first (xapi's errors), then a move
// cancelled before the pivot (nothing changes), then a move.
func TestVDIPoolMigrateSimulator(t *testing.T) {
	e := storageEnv(t, xenops.Config{Backend: "simulator", Sim: sim.Config{Delays: map[string]time.Duration{"mirror-copy": 300 * time.Millisecond}}})
	sr1 := e.fileSR("sr1")
	sr2 := e.fileSR("sr2")
	vm := e.newVM("vdimigrate", nil)
	uuid := e.uuidOf(vm)
	vdi := e.newVDI(sr1, "moving", 64<<20)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")

	// Refusals while the VM is halted, and of a VDI nobody uses.
	lone := e.newVDI(sr1, "lone", 1<<20)
	e.fails("VDI_NEEDS_VM_FOR_MIGRATE", "VDI.pool_migrate", lone, sr2, map[string]string{})
	e.fails("VM_BAD_POWER_STATE", "VDI.pool_migrate", vdi, sr2, map[string]string{})
	e.fails("HANDLE_INVALID", "VDI.pool_migrate", vdi, "OpaqueRef:nonesuch", map[string]string{})
	e.fails("HANDLE_INVALID", "VDI.pool_migrate", "OpaqueRef:nonesuch", sr2, map[string]string{})

	e.call("VM.start", vm, false, false)
	disk := func() (vdi, path string) {
		info, ok := e.m.Backend().Info(uuid)
		if !ok || len(info.Disks) != 1 {
			t.Fatalf("backend disks: %+v", info.Disks)
		}
		return info.Disks[0].VDI, info.Disks[0].Path
	}
	// A VDI already on the SR stays as it is.
	if got := e.str(e.call("VDI.pool_migrate", vdi, sr1, map[string]string{})); got != vdi {
		t.Fatalf("pool_migrate to its own SR returned %s", got)
	}
	// A snapshot is not a disk a VM uses; the VDI moves with its
	// snapshots (below).
	snaps := []string{e.str(e.call("VDI.snapshot", vdi, map[string]string{}))}
	e.fails("VDI_NEEDS_VM_FOR_MIGRATE", "VDI.pool_migrate", snaps[0], sr2, map[string]string{})
	snaps = append(snaps, e.str(e.call("VDI.snapshot", vdi, map[string]string{})))
	snapTimes := map[string]any{}
	for _, s := range snaps {
		snapTimes[e.field("VDI", s, "uuid").(string)] = e.field("VDI", s, "snapshot_time")
	}
	// An SR this host does not see.
	pbd := e.strs("SR", sr2, "PBDs")[0]
	e.call("PBD.unplug", pbd)
	e.fails("VM_REQUIRES_SR", "VDI.pool_migrate", vdi, sr2, map[string]string{})
	e.call("PBD.plug", pbd)
	if v, _ := disk(); v != vdi {
		t.Fatalf("after the refusals the domain's disk is %s", v)
	}

	// Cancelled before the pivot: nothing changes, the new VDI is gone.
	e.m.Backend().(*sim.Simulator).SetDelay("mirror-copy", time.Minute)
	before := len(e.strs("SR", sr2, "VDIs"))
	task := e.async("VDI.pool_migrate", vdi, sr2, map[string]string{})
	eventually(t, 30*time.Second, "the mirror to start", func() bool {
		return e.field("task", task, "progress").(float64) > 0.01
	})
	// The marks xapi takes: mirror on the VDI, migrate_send on the VM.
	for class, ref := range map[string]string{"VDI": vdi, "VM": vm} {
		want := map[string]string{"VDI": "mirror", "VM": "migrate_send"}[class]
		if cur := e.field(class, ref, "current_operations").(map[string]any); cur[task] != want {
			t.Fatalf("%s.current_operations %v, want %s under the task", class, cur, want)
		}
	}
	// A second move of the same VDI meanwhile is refused.
	e.fails("OTHER_OPERATION_IN_PROGRESS", "VDI.pool_migrate", vdi, sr2, map[string]string{})
	e.call("task.cancel", task)
	if st, info := e.wait(task, 30*time.Second); st != "cancelled" {
		t.Fatalf("cancelled move: %s %v", st, info)
	}
	if got := e.field("VBD", vbd, "VDI"); got != vdi || e.power(vm) != "Running" {
		t.Fatalf("after a cancelled move: VBD.VDI %v, power %s", got, e.power(vm))
	}
	if n := len(e.strs("SR", sr2, "VDIs")); n != before {
		t.Fatalf("a cancelled move left %d VDIs on the SR (had %d)", n, before)
	}
	if v, _ := disk(); v != vdi {
		t.Fatalf("after a cancelled move the domain's disk is %s", v)
	}
	eventually(t, 5*time.Second, "the marks to go", func() bool {
		return len(e.field("VM", vm, "current_operations").(map[string]any)) == 0 &&
			len(e.field("VDI", vdi, "current_operations").(map[string]any)) == 0
	})

	// The move.
	e.m.Backend().(*sim.Simulator).SetDelay("mirror-copy", 300*time.Millisecond)
	task = e.async("VDI.pool_migrate", vdi, sr2, map[string]string{})
	st, info := e.wait(task, time.Minute)
	if st != "success" {
		t.Fatalf("move: %s %v", st, info)
	}
	nu := e.str(e.call("VBD.get_VDI", vbd))
	e.checkMoved(vbd, vdi, nu, sr2)
	// The snapshots came along: on the new SR, snapshots of the new VDI
	// taken when the old ones were; the old ones gone.
	moved := e.strs("VDI", nu, "snapshots")
	if len(moved) != len(snaps) {
		t.Fatalf("the new VDI's snapshots: %v", moved)
	}
	times := map[any]bool{}
	for _, s := range moved {
		rec := e.record("VDI", s)
		if rec["SR"] != sr2 || rec["is_a_snapshot"] != true || rec["snapshot_of"] != nu || rec["name_label"] != "moving" {
			t.Fatalf("a moved snapshot: %v", rec)
		}
		times[rec["snapshot_time"]] = true
	}
	for _, at := range snapTimes {
		if !times[at] {
			t.Fatalf("snapshot times %v after the move, want %v", times, snapTimes)
		}
	}
	for _, s := range snaps {
		if !e.gone("VDI", s) {
			t.Fatalf("the old snapshot %s is still there", s)
		}
	}
	if v, path := disk(); v != nu || path == "" {
		t.Fatalf("after the move the domain's disk is %s at %s, want %s", v, path, nu)
	}
	var res string
	if raw, ok := e.record("task", task)["result"].(string); !ok || !json.Valid([]byte(`"`+raw+`"`)) {
		t.Fatalf("task result %v", e.record("task", task)["result"])
	} else {
		res = raw
	}
	t.Logf("task result %q, new VDI %s", res, nu)
	if len(e.field("VM", vm, "current_operations").(map[string]any)) != 0 {
		t.Fatalf("the VM is still marked: %v", e.field("VM", vm, "current_operations"))
	}
	// The VM runs on: it stops and starts again on the new VDI.
	e.call("VM.hard_shutdown", vm)
	e.call("VM.start", vm, false, false)
	if v, _ := disk(); v != nu {
		t.Fatalf("restarted on %s, want %s", v, nu)
	}
	e.call("VM.hard_shutdown", vm)
}

// vdiFile is the image of a file SR's VDI (srDir is the SR's location).
func (e *env) vdiFile(srDir, vdi string) string {
	e.t.Helper()
	loc, _ := e.field("VDI", vdi, "location").(string)
	p := filepath.Join(srDir, loc+".qcow2")
	if _, err := os.Stat(p); err != nil {
		e.t.Fatalf("VDI %s (location %q): %v", vdi, loc, err)
	}
	return p
}

// fileSRAt makes a file SR at dir.
func (e *env) fileSRAt(dir, name string) string {
	e.t.Helper()
	return e.str(e.call("SR.create", e.host, map[string]string{"location": dir}, "0", name, "", "file", "user", false, map[string]string{}))
}

// guestSum is the md5 of the first n MiB of the guest's disk, as the
// guest reads it.
func guestSum(t *testing.T, con *consoleConn, dev string, mib int, tag string) string {
	t.Helper()
	fmt.Fprintf(con, "echo 3 > /proc/sys/vm/drop_caches; echo %s-$(dd if=/dev/%s bs=1M count=%d 2>/dev/null | md5sum | cut -c1-32)-END\n", tag, dev, mib)
	line := con.waitForLine(t, func(l string) bool {
		return strings.Contains(l, tag+"-") && strings.Contains(l, "-END") && !strings.Contains(l, "md5sum")
	}, 3*time.Minute)
	i := strings.Index(line, tag+"-")
	return line[i+len(tag)+1 : i+len(tag)+33]
}

// TestVDIPoolMigrateQEMU moves the disk of a running guest (the real
// daemon, QEMU) from one file SR to another while the guest writes to
// it: a move cancelled half-way changes nothing; then the move, with the
// guest writing all along; the data the guest reads is the same after;
// its writes after the pivot land in the new VDI; the old VDI is gone.
// Then the daemon restarts: it still knows the disk as the new VDI (the
// disk is unplugged and plugged again, the VM shuts down cleanly), and
// the new VDI's image holds what the guest wrote.
func TestVDIPoolMigrateQEMU(t *testing.T) {
	g := testGuest(t)
	dir := shortTempDir(t)
	env := []string{"TOOLSTACKD_QEMU_ACCEL=" + g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}
	d := startDaemon(t, dir, testdaemon.FreeAddr(t, ""), "qemu", env...)
	defer func() { d.Kill() }()
	e := remote(t, d)
	e.host = e.str(e.call("session.get_this_host", e.sess))
	dir1, dir2 := shortTempDir(t), shortTempDir(t)
	sr1, sr2 := e.fileSRAt(dir1, "sr1"), e.fileSRAt(dir2, "sr2")
	vm := e.guestVM(g, "vdimigrate", nil)
	uuid := e.uuidOf(vm)
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(uuid) {
			t.Errorf("QEMU %d left running; killing it", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	vdi := e.newVDI(sr1, "moving", 64<<20)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.call("VM.start", vm, false, false)
	con := e.console(vm, "vt100")
	defer func() { con.Close() }()
	if ready := con.waitFor(t, "GUEST-READY", 3*time.Minute); !strings.Contains(ready, "vda") {
		t.Fatalf("the guest has no vda: %q", ready)
	}
	// 40 MiB of data the guest keeps, then a writer all over 48-64 MiB.
	fmt.Fprintf(con, "dd if=/dev/urandom of=/dev/vda bs=1M count=40 conv=fsync 2>/dev/null; echo FILLED-$?\n")
	con.waitFor(t, "FILLED-0", 3*time.Minute)
	// A snapshot of the running disk, then 4 MiB written over: the disk
	// moves with its snapshot, as a chain (the snapshot copied, the disk
	// mirrored with only what it wrote since onto a clone of the copy).
	snapSum := guestSum(t, con, "vda", 40, "SNAP")
	snap := e.str(e.call("VDI.snapshot", vdi, map[string]string{}))
	fmt.Fprintf(con, "dd if=/dev/urandom of=/dev/vda bs=1M count=4 conv=fsync 2>/dev/null; echo REFILLED-$?\n")
	con.waitFor(t, "REFILLED-0", 3*time.Minute)
	sum := guestSum(t, con, "vda", 40, "SUM0")
	if sum == snapSum {
		t.Fatal("the guest's writes after the snapshot changed nothing")
	}
	// The writer stops when told by a file and says so itself: the
	// guest's interactive shell is its PID 1, and after "kill %1" (a
	// killed job's dd re-parented to the shell) or a "wait" for a job
	// that ended the shell may sit in sigsuspend for good.
	fmt.Fprintf(con, "rm -f /tmp/stop-writer; ( n=0; while [ ! -e /tmp/stop-writer ]; do dd if=/dev/urandom of=/dev/vda bs=64k count=4 seek=$((768 + RANDOM %% 250)) conv=fsync 2>/dev/null; n=$((n+1)); [ $((n %% 10)) = 0 ] && echo WROTE-$n; done; echo WRITER-DONE ) &\n")
	con.waitFor(t, "WROTE-10", 2*time.Minute)

	t.Run("cancel", func(t *testing.T) {
		// Held to 2 MiB/s, the copy takes a while: cancelled half-way.
		e.setOC(vm, "migration_bandwidth", strconv.Itoa(2<<20))
		defer e.call("VM.remove_from_other_config", vm, "migration_bandwidth")
		task := e.async("VDI.pool_migrate", vdi, sr2, map[string]string{})
		eventually(t, time.Minute, "the mirror to copy", func() bool {
			return e.field("task", task, "progress").(float64) > 0.1
		})
		e.call("task.cancel", task)
		if st, info := e.wait(task, time.Minute); st != "cancelled" {
			t.Fatalf("cancelled move: %s %v", st, info)
		}
		if got := e.field("VBD", vbd, "VDI"); got != vdi || e.power(vm) != "Running" {
			t.Fatalf("after a cancelled move: VBD.VDI %v, power %s", got, e.power(vm))
		}
		eventually(t, 30*time.Second, "the cancelled move's VDIs to go", func() bool {
			return len(e.strs("SR", sr2, "VDIs")) == 0
		})
		con.waitFor(t, "WROTE-", time.Minute)
	})

	var nu string
	t.Run("move", func(t *testing.T) {
		t0 := time.Now()
		task := e.async("VDI.pool_migrate", vdi, sr2, map[string]string{})
		if st, info := e.wait(task, 5*time.Minute); st != "success" {
			t.Fatalf("move: %s %v", st, info)
		}
		t.Logf("VDI.pool_migrate of a 64 MiB disk with 40 MiB of data took %v", time.Since(t0))
		nu = e.str(e.call("VBD.get_VDI", vbd))
		e.checkMoved(vbd, vdi, nu, sr2)
		eventually(t, 30*time.Second, "the old VDIs' images to go", func() bool {
			ents, _ := filepath.Glob(filepath.Join(dir1, "*.qcow2"))
			return len(ents) == 0
		})
		// The snapshot came along, sharing the disk's history: the
		// disk's image is a top over the snapshot's copy.
		moved := e.strs("VDI", nu, "snapshots")
		if len(moved) != 1 || !e.gone("VDI", snap) || e.field("VDI", moved[0], "SR") != sr2 {
			t.Fatalf("the snapshot after the move: %v (old gone: %v)", moved, e.gone("VDI", snap))
		}
		raw := filepath.Join(shortTempDir(t), "snap.raw")
		rawCopy(t, e.vdiFile(dir2, moved[0]), raw)
		if b, err := os.ReadFile(raw); err != nil || fmt.Sprintf("%x", md5.Sum(b[:40<<20])) != snapSum {
			t.Fatalf("the moved snapshot does not hold what the disk held when it was taken (%v)", err)
		}
		if out, err := exec.Command("qemu-img", "info", "-U", "--backing-chain", e.vdiFile(dir2, nu)).Output(); err != nil ||
			strings.Count(string(out), "image:") < 2 {
			t.Fatalf("the moved disk's image is no top over its snapshot's copy: %v\n%s", err, out)
		}
		// The guest writes on, and reads what it had.
		con.waitFor(t, "WROTE-", time.Minute)
		fmt.Fprintf(con, "touch /tmp/stop-writer\n")
		con.waitForLine(t, func(l string) bool { return strings.Contains(l, "WRITER-DONE") && !strings.Contains(l, "echo") }, time.Minute)
		if got := guestSum(t, con, "vda", 40, "SUM1"); got != sum {
			t.Fatalf("the guest reads %s after the move, had %s", got, sum)
		}
		fmt.Fprintf(con, "echo AFTER-PIVOT-MARK | dd of=/dev/vda bs=1M seek=44 conv=fsync 2>/dev/null; echo MARKED-$?\n")
		con.waitFor(t, "MARKED-0", time.Minute)
	})
	if nu == "" {
		t.FailNow()
	}

	t.Run("restart", func(t *testing.T) {
		con.Close()
		d.Kill()
		d = d.Restart()
		e = remote(t, d)
		if p := e.power(vm); p != "Running" {
			t.Fatalf("after the restart: %s", p)
		}
		// Later operations work on the disk the domain holds: unplug it,
		// plug it again (the guest sees it), write, shut down.
		con = e.console(vm, "vt100")
		e.call("VBD.unplug", vbd)
		con.waitForLine(t, func(l string) bool { return strings.Contains(l, "GUEST-READY") && !strings.Contains(l, "vda") }, time.Minute)
		e.call("VBD.plug", vbd)
		con.waitForLine(t, func(l string) bool { return strings.Contains(l, "GUEST-READY") && strings.Contains(l, "vda") }, time.Minute)
		fmt.Fprintf(con, "echo AFTER-RESTART-MARK | dd of=/dev/vda bs=1M seek=46 conv=fsync 2>/dev/null; echo REMARKED-$?\n")
		con.waitFor(t, "REMARKED-0", 2*time.Minute)
		if got := guestSum(t, con, "vda", 40, "SUM2"); got != sum {
			t.Fatalf("the guest reads %s after the restart, had %s", got, sum)
		}
		con.Close()
		e.call("VM.hard_shutdown", vm)
		// The new VDI's image holds what the guest wrote.
		raw := filepath.Join(shortTempDir(t), "new.raw")
		rawCopy(t, e.vdiFile(dir2, nu), raw)
		b, err := os.ReadFile(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", md5.Sum(b[:40<<20])); got != sum {
			t.Errorf("the new VDI's first 40 MiB: md5 %s, the guest's %s", got, sum)
		}
		for off, want := range map[int]string{44 << 20: "AFTER-PIVOT-MARK", 46 << 20: "AFTER-RESTART-MARK"} {
			if got := string(b[off : off+len(want)]); got != want {
				t.Errorf("at %d MiB the new VDI holds %q, want %q", off>>20, got, want)
			}
		}
	})
	stop(t, d)
}

// TestVDIPoolMigrateThroughput measures VDI.pool_migrate of a running
// guest's 512 MiB disk full of data between two file SRs against copying
// its image file (cp, then fsync) between the same directories, for
// docs/performance.md. TOOLSTACKD_MIRROR_PERF=1 runs it.
func TestVDIPoolMigrateThroughput(t *testing.T) {
	if os.Getenv("TOOLSTACKD_MIRROR_PERF") == "" {
		t.Skip("TOOLSTACKD_MIRROR_PERF=1 runs the VDI.pool_migrate throughput figure")
	}
	g := testGuest(t)
	dir := shortTempDir(t)
	env := []string{"TOOLSTACKD_QEMU_ACCEL=" + g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}
	d := startDaemon(t, dir, testdaemon.FreeAddr(t, ""), "qemu", env...)
	defer func() { d.Kill() }()
	e := remote(t, d)
	e.host = e.str(e.call("session.get_this_host", e.sess))
	dirs := []string{shortTempDir(t), shortTempDir(t)}
	srs := []string{e.fileSRAt(dirs[0], "sr1"), e.fileSRAt(dirs[1], "sr2")}
	const size = 512 << 20
	vdi := e.newVDI(srs[0], "moving", size)
	img := e.vdiFile(dirs[0], vdi)
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x3c 0 512M", img).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v %s", err, out)
	}
	vm := e.guestVM(g, "vdimigrate-perf", nil)
	uuid := e.uuidOf(vm)
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(uuid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.call("VM.start", vm, false, false)

	copyFile := func(from, to string) time.Duration {
		t0 := time.Now()
		if out, err := exec.Command("cp", from, to).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		f, err := os.Open(to)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		el := time.Since(t0)
		os.Remove(to)
		return el
	}
	var base, move []time.Duration
	for i := range 6 {
		from, to := i%2, (i+1)%2
		cur := e.str(e.call("VBD.get_VDI", vbd))
		base = append(base, copyFile(e.vdiFile(dirs[from], cur), filepath.Join(dirs[to], "copy.img")))
		t0 := time.Now()
		e.call("VDI.pool_migrate", cur, srs[to], map[string]string{})
		move = append(move, time.Since(t0))
	}
	best := func(ds []time.Duration) time.Duration { return slices.Min(ds) }
	b, m := best(base), best(move)
	mib := float64(size >> 20)
	t.Logf("image copy (cp + fsync) %v (%.0f MiB/s), VDI.pool_migrate %v (%.0f MiB/s): pool_migrate throughput %.2fx the copy (runs %v / %v)",
		b, mib/b.Seconds(), m, mib/m.Seconds(), b.Seconds()/m.Seconds(), base, move)
	e.call("VM.hard_shutdown", vm)
	stop(t, d)
}
