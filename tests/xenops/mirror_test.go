package xenops_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// mirrorEnd is the destination end of a disk mirror as a storage
// migration builds it: an export of an image, reached through a relay on
// the source host (here both ends are on loopback; the relay's dialer
// stands for the pool connection and hands each connection to
// Export.Serve).
type mirrorEnd struct {
	img   string
	exp   *storage.Export
	relay *storage.Relay
}

func newMirrorEnd(t *testing.T, dir, name, size string) *mirrorEnd {
	t.Helper()
	m := &mirrorEnd{img: filepath.Join(dir, name+".qcow2")}
	qcow2(t, m.img, size)
	var err error
	if m.exp, err = storage.ExportImage(context.Background(), "", m.img, "qcow2"); err != nil {
		t.Fatal(err)
	}
	m.relay, err = storage.NewRelay("", func(ctx context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() { _ = m.exp.Serve(context.Background(), b) }()
		return a, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.close(t) })
	return m
}

func (m *mirrorEnd) target() backend.MirrorTarget {
	return backend.MirrorTarget{URI: m.relay.URI().String()}
}

func (m *mirrorEnd) close(t *testing.T) {
	if err := m.relay.Close(); err != nil {
		t.Error(err)
	}
	if err := m.exp.Close(); err != nil {
		t.Error(err)
	}
}

// imgCompare runs qemu-img compare (sharing images a running QEMU holds).
func imgCompare(a, b string) (bool, string) {
	out, err := exec.Command("qemu-img", "compare", "-U", a, b).CombinedOutput()
	return err == nil, strings.TrimSpace(string(out))
}

// rawCopy copies an image's contents (as the guest reads them) to a raw file.
func rawCopy(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "convert", "-U", "-O", "raw", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v %s", err, out)
	}
}

// TestQEMUDiskMirror mirrors the qcow2 disk of a running guest that keeps
// writing to it into an export of another qcow2 image: the mirror gets in
// sync, the guest is paused, the mirror completed and both images are
// identical. Then: a mirror cancelled half-way leaves the source as it
// was and no job; unreachable, silent, too small and vanishing targets
// fail with MIRROR_FAILED and leave the guest running on its disk; a
// leaf over a parent is mirrored alone (sync top) onto a copy of the
// parent; a pivot onto a local image (VDI.pool_migrate's way) and then
// onto an NBD export move the guest's writes to the target while it
// keeps writing, and the backend records the disk as the target.
func TestQEMUDiskMirror(t *testing.T) {
	g := testGuest(t)
	r := newResolver()
	e := qemuEnv(t, g, r)
	vm := e.guestVM(g, "mirror", nil)
	uuid := e.uuidOf(vm)
	src := filepath.Join(e.dir, "src.qcow2")
	qcow2(t, src, "64M")
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 24M", "-c", "write -P 0xa5 40M 8M", src).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v %s", err, out)
	}
	vdi := e.addVDI("mirror", src, 64<<20)
	r.add(vdi, src)
	e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.call("VM.start", vm, false, false)
	con := e.console(vm, "vt100")
	defer con.Close()
	ready := con.waitFor(t, "GUEST-READY", 3*time.Minute)
	gdev := "vda"
	if !strings.Contains(ready, gdev) {
		t.Fatalf("the guest has no %s: %q", gdev, ready)
	}
	mir, ok := e.m.Backend().(backend.DiskMirrorer)
	if !ok {
		t.Fatal("the QEMU backend is not a DiskMirrorer")
	}
	ctx := context.Background()
	dev := "0"

	// The guest writes all over its disk, all along.
	fmt.Fprintf(con, "( n=0; while true; do dd if=/dev/urandom of=/dev/%s bs=64k count=8 seek=$((RANDOM %% 1000)) conv=fsync 2>/dev/null; n=$((n+1)); [ $((n %% 20)) = 0 ] && echo WROTE-$n; done ) &\n", gdev)
	con.waitFor(t, "WROTE-20", 2*time.Minute)

	t.Run("sync", func(t *testing.T) {
		dst := newMirrorEnd(t, e.dir, "dst", "64M")
		start := time.Now()
		if err := mir.StartMirror(ctx, uuid, dev, dst.target()); err != nil {
			t.Fatal(err)
		}
		var last float64
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := mir.WaitMirrorReady(wctx, uuid, dev, func(p float64) { last = p }); err != nil {
			t.Fatal(err)
		}
		st, err := mir.MirrorStatus(ctx, uuid, dev)
		if err != nil || !st.Active || !st.Ready || last != 1 {
			t.Fatalf("status %+v %v, last progress %v", st, err, last)
		}
		t.Logf("in sync after %v (%d bytes)", time.Since(start), st.Total)
		con.waitFor(t, "WROTE-", time.Minute) // the guest wrote while in sync
		e.call("VM.pause", vm)
		if err := mir.CompleteMirror(ctx, uuid, dev, false); err != nil {
			t.Fatal(err)
		}
		if st, _ := mir.MirrorStatus(ctx, uuid, dev); st.Active {
			t.Fatalf("after completion: %+v", st)
		}
		if same, out := imgCompare(src, dst.img); !same {
			t.Fatalf("the target differs from the source: %s", out)
		}
		e.call("VM.unpause", vm)
		con.waitFor(t, "WROTE-", time.Minute)
	})

	t.Run("cancel", func(t *testing.T) {
		e.call("VM.pause", vm)
		defer e.call("VM.unpause", vm)
		before := filepath.Join(e.dir, "before.raw")
		rawCopy(t, src, before)
		dst := newMirrorEnd(t, e.dir, "cancelled", "64M")
		tg := dst.target()
		tg.Bandwidth = 4 << 20
		if err := mir.StartMirror(ctx, uuid, dev, tg); err != nil {
			t.Fatal(err)
		}
		if err := mir.StartMirror(ctx, uuid, dev, tg); !xerr.HasCode(err, xerr.MirrorFailed) {
			t.Fatalf("a second mirror of the disk: %v", err)
		}
		eventually(t, time.Minute, "the copy to start", func() bool {
			st, err := mir.MirrorStatus(ctx, uuid, dev)
			return err == nil && st.Done > 0
		})
		if err := mir.CompleteMirror(ctx, uuid, dev, false); !xerr.HasCode(err, xerr.MirrorFailed) {
			t.Fatalf("completing a mirror not in sync: %v", err)
		}
		if err := mir.CancelMirror(ctx, uuid, dev); err != nil {
			t.Fatal(err)
		}
		if err := mir.CancelMirror(ctx, uuid, dev); err != nil {
			t.Fatalf("second cancel: %v", err)
		}
		if st, _ := mir.MirrorStatus(ctx, uuid, dev); st.Active || st.Done != 0 {
			t.Fatalf("after cancel: %+v", st)
		}
		if same, out := imgCompare(before, src); !same {
			t.Fatalf("cancelling changed the source: %s", out)
		}
	})

	t.Run("hostile", func(t *testing.T) {
		// Nobody there.
		err := mir.StartMirror(ctx, uuid, dev, backend.MirrorTarget{URI: "nbd+unix:///vdi?socket=" + filepath.Join(e.dir, "nothing.sock")})
		if !xerr.HasCode(err, xerr.MirrorFailed) {
			t.Fatalf("unreachable target: %v", err)
		}
		// Not a URI, or not one we take.
		for _, u := range []string{"/etc/passwd", "nbd+tls://x/y", "nbd://[::1/x", ""} {
			if err := mir.StartMirror(ctx, uuid, dev, backend.MirrorTarget{URI: u}); !xerr.HasCode(err, xerr.MirrorFailed) {
				t.Errorf("target %q: %v", u, err)
			}
		}
		// A server that accepts and never speaks: the handshake is ours,
		// bounded by the context, and QEMU's monitor is never held.
		sock := filepath.Join(e.dir, "silent.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		began := time.Now()
		err = mir.StartMirror(sctx, uuid, dev, backend.MirrorTarget{URI: "nbd+unix:///vdi?socket=" + sock})
		if !xerr.HasCode(err, xerr.MirrorFailed) || time.Since(began) > 30*time.Second {
			t.Fatalf("silent target: %v after %v", err, time.Since(began))
		}
		t.Logf("silent target refused after %v: %v", time.Since(began), err)
		// Too small a target.
		small := newMirrorEnd(t, e.dir, "small", "1M")
		if err := mir.StartMirror(ctx, uuid, dev, small.target()); !xerr.HasCode(err, xerr.MirrorFailed) {
			t.Fatalf("small target: %v", err)
		}
		// A target that goes away mid-copy: the mirror fails on its own,
		// says so, and cancelling clears it.
		gone := newMirrorEnd(t, e.dir, "gone", "64M")
		tg := gone.target()
		tg.Bandwidth = 2 << 20
		if err := mir.StartMirror(ctx, uuid, dev, tg); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the copy to start", func() bool {
			st, err := mir.MirrorStatus(ctx, uuid, dev)
			return err == nil && st.Done > 0
		})
		if err := gone.relay.Close(); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer wcancel()
		err = mir.WaitMirrorReady(wctx, uuid, dev, nil)
		if !xerr.HasCode(err, xerr.MirrorFailed) {
			t.Fatalf("waiting on a mirror whose target went away: %v", err)
		}
		st, _ := mir.MirrorStatus(ctx, uuid, dev)
		if !st.Active || st.Error == "" {
			t.Fatalf("a failed mirror reads as %+v", st)
		}
		t.Logf("the mirror whose target went away: %v; status %+v", err, st)
		if err := mir.CancelMirror(ctx, uuid, dev); err != nil {
			t.Fatal(err)
		}
		if st, _ := mir.MirrorStatus(ctx, uuid, dev); st.Active {
			t.Fatalf("after cancel: %+v", st)
		}
		// The guest runs on its own disk all along.
		con.waitFor(t, "WROTE-", time.Minute)
		if s := e.domState(vm); s != backend.DomainRunning {
			t.Fatalf("domain %s", s)
		}
	})

	t.Run("top", func(t *testing.T) {
		// A leaf over a parent, as a VDI with a snapshot is: the parent
		// is copied first, the mirror copies only the leaf (sync top)
		// into a new leaf over the copy, and the chains read the same.
		base := filepath.Join(e.dir, "base.qcow2")
		qcow2(t, base, "32M")
		if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 24M", base).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io: %v %s", err, out)
		}
		leaf := filepath.Join(e.dir, "leaf.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-b", base, "-F", "qcow2", leaf).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
		if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x22 4M 2M", leaf).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io: %v %s", err, out)
		}
		vdi := e.addVDI("leaf", leaf, 32<<20)
		r.add(vdi, leaf)
		vbd := e.addVBD(vm, vdi, "1", "Disk", "RW")
		e.call("VBD.plug", vbd)
		baseCopy := filepath.Join(e.dir, "base-copy.qcow2")
		if out, err := exec.Command("qemu-img", "convert", "-O", "qcow2", base, baseCopy).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
		dstLeaf := filepath.Join(e.dir, "dst-leaf.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-b", baseCopy, "-F", "qcow2", dstLeaf).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v %s", err, out)
		}
		exp, err := storage.ExportImage(ctx, "", dstLeaf, "qcow2")
		if err != nil {
			t.Fatal(err)
		}
		defer exp.Close()
		if err := mir.StartMirror(ctx, uuid, "1", backend.MirrorTarget{URI: exp.URI().String(), Sync: backend.MirrorTop}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := mir.WaitMirrorReady(wctx, uuid, "1", nil); err != nil {
			t.Fatal(err)
		}
		st, _ := mir.MirrorStatus(ctx, uuid, "1")
		if st.Total > 8<<20 {
			t.Errorf("a top mirror of a 2 MiB leaf copied %d bytes", st.Total)
		}
		e.call("VM.pause", vm)
		err = mir.CompleteMirror(ctx, uuid, "1", false)
		e.call("VM.unpause", vm)
		if err != nil {
			t.Fatal(err)
		}
		if same, out := imgCompare(leaf, dstLeaf); !same {
			t.Fatalf("the chains differ: %s", out)
		}
		e.call("VBD.unplug", vbd)
	})

	t.Run("pivot-local", func(t *testing.T) {
		// A target on this host that QEMU opens itself (VDI.pool_migrate's
		// way), pivoted onto while the guest writes all over the disk.
		local := filepath.Join(e.dir, "local.qcow2")
		qcow2(t, local, "64M")
		tg := backend.MirrorTarget{Path: local, Format: "qcow2", VDI: "OpaqueRef:local-target"}
		if err := mir.StartMirror(ctx, uuid, dev, tg); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := mir.WaitMirrorReady(wctx, uuid, dev, nil); err != nil {
			t.Fatal(err)
		}
		if err := mir.CompleteMirror(ctx, uuid, dev, true); err != nil {
			t.Fatal(err)
		}
		info, _ := e.m.Backend().Info(uuid)
		if len(info.Disks) != 1 || info.Disks[0].Path != local || info.Disks[0].Format != "qcow2" || info.Disks[0].VDI != tg.VDI {
			t.Fatalf("after the pivot the backend has the disk as %+v, want %s", info.Disks, local)
		}
		// Beyond the writer's reach (it writes below 63 MiB).
		const mark, at = "LOCAL-PIVOT-MARK", 64<<20 - 4096
		fmt.Fprintf(con, "echo %s | dd of=/dev/%s bs=512 seek=%d conv=fsync 2>/dev/null; echo LMARKED-$?\n", mark, gdev, at/512)
		if err := consoleWait(con, "LMARKED-0", time.Minute); err != nil {
			mirrorDiagnose(t, e, uuid, dev)
			t.Fatalf("the guest's write after the pivot: %v", err)
		}
		con.waitFor(t, "WROTE-", time.Minute) // the writer goes on
		raw := filepath.Join(e.dir, "local.raw")
		rawCopy(t, local, raw)
		b, err := os.ReadFile(raw)
		if err != nil || string(b[at:at+len(mark)]) != mark {
			t.Fatalf("the new image holds %q (%v), want the guest's write", b[at:at+len(mark)], err)
		}
	})

	t.Run("pivot", func(t *testing.T) {
		// The guest's writer runs on through the pivot. An earlier
		// version stopped it with "kill %1" first, and in about 1 run in
		// 10 the guest's next write never came: not the pivot (it
		// happened with no mirror at all) but the test guest, whose
		// interactive shell is its PID 1: the killed job's dd was
		// re-parented to the shell, which then sat in sigsuspend with
		// no child left (a sysrq-t dump: no dd, nothing in D state),
		// and the next command's write never reached the disk.
		dst := newMirrorEnd(t, e.dir, "pivot", "64M")
		info, _ := e.m.Backend().Info(uuid)
		cur := info.Disks[0].Path // the source, or the local target pivoted onto
		if err := mir.StartMirror(ctx, uuid, dev, dst.target()); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		if err := mir.WaitMirrorReady(wctx, uuid, dev, nil); err != nil {
			t.Fatal(err)
		}
		if err := mir.CompleteMirror(ctx, uuid, dev, true); err != nil {
			t.Fatal(err)
		}
		before := filepath.Join(e.dir, "pivot-before.raw")
		rawCopy(t, cur, before)
		const mark, markAt = "PIVOTED-WRITE-MARK", 64<<20 - 8192 // beyond the writer's reach
		fmt.Fprintf(con, "echo %s | dd of=/dev/%s bs=512 seek=%d conv=fsync 2>/dev/null; echo MARKED-$?\n", mark, gdev, markAt/512)
		if err := consoleWait(con, "MARKED-0", time.Minute); err != nil {
			mirrorDiagnose(t, e, uuid, dev)
			t.Fatalf("the guest's write after the pivot: %v", err)
		}
		con.waitFor(t, "WROTE-", time.Minute) // the writer goes on
		c, err := nbd.Dial(ctx, dst.exp.URI())
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(mark))
		_, err = c.ReadAt(got, markAt)
		c.Close()
		if err != nil || string(got) != mark {
			t.Fatalf("the target holds %q (%v), want the guest's write", got, err)
		}
		if same, out := imgCompare(before, cur); !same {
			t.Fatalf("the source changed after the pivot: %s", out)
		}
		info, _ = e.m.Backend().Info(uuid)
		if len(info.Disks) != 1 || info.Disks[0].Path != dst.relay.URI().String() || info.Disks[0].Format != "raw" {
			t.Fatalf("after the pivot the backend has the disk as %+v, want %s", info.Disks, dst.relay.URI())
		}
		// The pivoted disk can be mirrored again.
		again := newMirrorEnd(t, e.dir, "again", "64M")
		if err := mir.StartMirror(ctx, uuid, dev, again.target()); err != nil {
			t.Fatal(err)
		}
		if err := mir.WaitMirrorReady(wctx, uuid, dev, nil); err != nil {
			t.Fatal(err)
		}
		if err := mir.CancelMirror(ctx, uuid, dev); err != nil {
			t.Fatal(err)
		}
	})

	e.call("VM.hard_shutdown", vm)
	noLeftovers(t, e, vm)
}

// consoleWait reads a console until a line containing s, or the timeout.
func consoleWait(c *consoleConn, s string, timeout time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var seen []string
	ready := 0
	for {
		line, err := c.r.ReadString('\n')
		if strings.Contains(line, s) {
			return nil
		}
		if strings.Contains(line, "GUEST-READY") {
			ready++
		} else if l := strings.TrimSpace(line); l != "" {
			seen = append(seen[max(0, len(seen)-9):], l)
		}
		if err != nil {
			return fmt.Errorf("%w; last lines: %q; %d GUEST-READY lines meanwhile", err, seen, ready)
		}
	}
}

// mirrorDiagnose logs what the backend and QEMU say of a domain whose
// guest stopped answering.
func mirrorDiagnose(t *testing.T, e *env, uuid, dev string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, _ := e.m.Backend().Info(uuid)
	t.Logf("domain: state %s pid %d disks %+v", info.State, info.Pid, info.Disks)
	st, err := e.m.Backend().(backend.DiskMirrorer).MirrorStatus(ctx, uuid, dev)
	t.Logf("mirror status (does the monitor answer?): %+v %v", st, err)
	logs, _ := filepath.Glob(filepath.Join(e.dir, "*", "qemu", "*", "qemu.log"))
	more, _ := filepath.Glob(filepath.Join(e.dir, "qemu", "*", "qemu.log"))
	for _, l := range append(logs, more...) {
		b, _ := os.ReadFile(l)
		t.Logf("%s:\n%s", l, b[max(0, len(b)-2000):])
	}
}

// TestQEMUDiskMirrorThroughput measures the mirror of a 1 GiB disk full
// of data against qemu-img convert of the same image to the same kind of
// target (an export of an empty qcow2, through a relay), for
// docs/performance.md. TOOLSTACKD_MIRROR_PERF=1 runs it.
func TestQEMUDiskMirrorThroughput(t *testing.T) {
	if os.Getenv("TOOLSTACKD_MIRROR_PERF") == "" {
		t.Skip("TOOLSTACKD_MIRROR_PERF=1 runs the mirror throughput figure")
	}
	g := testGuest(t)
	r := newResolver()
	e := qemuEnv(t, g, r)
	vm := e.guestVM(g, "mirror-perf", nil)
	uuid := e.uuidOf(vm)
	src := filepath.Join(e.dir, "big.qcow2")
	qcow2(t, src, "1G")
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x3c 0 1G", src).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v %s", err, out)
	}
	vdi := e.addVDI("big", src, 1<<30)
	r.add(vdi, src)
	e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.call("VM.start", vm, false, false)
	con := e.console(vm, "vt100")
	defer con.Close()
	con.waitFor(t, "GUEST-READY", 3*time.Minute)
	mir := e.m.Backend().(backend.DiskMirrorer)
	ctx := context.Background()

	var base, mirror []time.Duration
	for i := range 5 {
		dst := newMirrorEnd(t, e.dir, fmt.Sprintf("conv%d", i), "1G")
		began := time.Now()
		out, err := exec.Command("qemu-img", "convert", "-U", "-n", "-f", "qcow2", "-O", "raw", src, dst.relay.URI().String()).CombinedOutput()
		if err != nil {
			t.Fatalf("qemu-img convert: %v %s", err, out)
		}
		base = append(base, time.Since(began))
		dst.close(t)

		dst = newMirrorEnd(t, e.dir, fmt.Sprintf("mirror%d", i), "1G")
		began = time.Now()
		if err := mir.StartMirror(ctx, uuid, "0", dst.target()); err != nil {
			t.Fatal(err)
		}
		if err := mir.WaitMirrorReady(ctx, uuid, "0", nil); err != nil {
			t.Fatal(err)
		}
		if err := mir.CompleteMirror(ctx, uuid, "0", false); err != nil {
			t.Fatal(err)
		}
		mirror = append(mirror, time.Since(began))
		if same, out := imgCompare(src, dst.img); !same {
			t.Fatalf("mirror %d differs: %s", i, out)
		}
		dst.close(t)
	}
	best := func(ds []time.Duration) time.Duration {
		m := ds[0]
		for _, d := range ds {
			m = min(m, d)
		}
		return m
	}
	b, m := best(base), best(mirror)
	mib := float64(1 << 30 / (1 << 20))
	t.Logf("qemu-img convert %v (%.0f MiB/s), mirror %v (%.0f MiB/s): mirror throughput %.2fx convert (runs %v / %v)",
		b, mib/b.Seconds(), m, mib/m.Seconds(), b.Seconds()/m.Seconds(), base, mirror)
	e.call("VM.hard_shutdown", vm)
}
