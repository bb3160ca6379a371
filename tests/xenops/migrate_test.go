package xenops_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"toolstackd/internal/xenops/qemu/qmp"

	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu"
)

// Live migration between two QEMU backends in one process (each with
// its own state directory, as two hosts have), over loopback TCP: the
// backend half of VM.pool_migrate (backend.Migrator).

// migHost is one side: a QEMU backend of its own.
type migHost struct {
	b   *qemu.QEMU
	dir string
}

func newMigHost(t *testing.T, g *guest) *migHost {
	t.Helper()
	dir := shortTempDir(t)
	b, err := qemu.New(qemu.Config{StateDir: dir, Accel: g.accel}, testLogger(t, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return &migHost{b: b, dir: dir}
}

func migSpec(g *guest, uuid string, mem int64, incoming bool) *backend.Spec {
	return &backend.Spec{UUID: uuid, Name: "mig", VMRef: "OpaqueRef:" + uuid, Memory: mem, Target: mem, VCPUs: 1, MaxCPU: 1,
		Kernel: g.kernel, Ramdisk: g.initrd, Cmdline: g.args, Platform: map[string]string{}, AutoStart: !incoming, Incoming: incoming}
}

// start builds and starts a domain: booting, or waiting for a migration.
func (h *migHost) start(t *testing.T, spec *backend.Spec) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(spec.UUID) {
			if info, ok := h.b.Info(spec.UUID); ok && info.Pid == pid {
				t.Errorf("QEMU %d left running; killing it", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if _, err := h.b.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := h.b.Build(ctx, spec.UUID); err != nil {
		t.Fatal(err)
	}
	if err := h.b.StartDeviceModel(ctx, spec.UUID); err != nil {
		t.Fatal(err)
	}
	if !spec.Incoming {
		if err := h.b.Unpause(ctx, spec.UUID); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.b.MarkComplete(spec.UUID); err != nil {
		t.Fatal(err)
	}
}

// serial connects to a domain's serial console.
func (h *migHost) serial(t *testing.T, uuid string) *consoleConn {
	t.Helper()
	p, err := h.b.ConsolePath(uuid, "vt100")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &consoleConn{c, bufio.NewReader(c)}
}

var uptimeLine = regexp.MustCompile(`UP=([0-9]+\.[0-9]+)`)

// uptime asks the guest's shell for its uptime in seconds.
func uptime(t *testing.T, c *consoleConn) float64 {
	t.Helper()
	if _, err := io.WriteString(c, "echo UP=$(cut -d' ' -f1 /proc/uptime)\n"); err != nil {
		t.Fatal(err)
	}
	line := c.waitForLine(t, uptimeLine.MatchString, time.Minute)
	v, err := strconv.ParseFloat(uptimeLine.FindStringSubmatch(line)[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// carrier is a loopback TCP connection: the stream between the hosts.
func carrier(t *testing.T) (send, recv net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	send, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	recv = <-acc
	if recv == nil {
		t.Fatal("accept failed")
	}
	return send, recv
}

// migResult is how both halves of a migration ended.
type migResult struct {
	sendErr, recvErr error
	took             time.Duration
}

// liveMigrate runs both halves and returns their errors and the time
// the pair took. The receiver's context is recvCtx when given, else ctx.
func liveMigrate(ctx context.Context, t *testing.T, src, dst *migHost, uuid string, o backend.MigrateOptions, progress func(float64), recvCtx context.Context) migResult {
	var sendErr, recvErr error
	send, recv := carrier(t)
	var wg sync.WaitGroup
	wg.Add(1)
	t0 := time.Now()
	go func() {
		defer wg.Done()
		rctx := ctx
		if recvCtx != nil {
			rctx = recvCtx
		}
		recvErr = dst.b.ReceiveLive(rctx, uuid, recv)
		recv.Close()
	}()
	sendErr = src.b.SendLive(ctx, uuid, send, o, progress)
	send.Close()
	wg.Wait()
	return migResult{sendErr, recvErr, time.Since(t0)}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func destroy(t *testing.T, h *migHost, uuid string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := h.b.Destroy(ctx, uuid); err != nil {
		t.Fatal(err)
	}
}

// A running guest moves: it keeps running on the destination with its
// uptime continuing; the source's QEMU is left stopped, then destroyed;
// nothing is left behind.
func TestQEMUMigrateLive(t *testing.T) {
	g := testGuest(t)
	src, dst := newMigHost(t, g), newMigHost(t, g)
	fds := openFDs(t)
	const uuid = "a1000000-0000-4000-8000-000000000018"
	src.start(t, migSpec(g, uuid, 256<<20, false))
	con := src.serial(t, uuid)
	con.waitFor(t, "GUEST-READY", 2*time.Minute)
	before := uptime(t, con)
	srcPid := func() int { i, _ := src.b.Info(uuid); return i.Pid }()

	dst.start(t, migSpec(g, uuid, 256<<20, true))
	if i, _ := dst.b.Info(uuid); i.State != backend.DomainBuilding {
		t.Errorf("incoming domain is %s before its state arrives", i.State)
	}
	var last float64
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := liveMigrate(ctx, t, src, dst, uuid, backend.MigrateOptions{}, func(f float64) { last = f }, nil)
	if r.sendErr != nil || r.recvErr != nil {
		t.Fatalf("send: %v; receive: %v", r.sendErr, r.recvErr)
	}
	st, _ := src.b.MigrationStats(uuid)
	t.Logf("migrated in %v (QEMU: total %v, downtime %v, %d bytes)", r.took, st.TotalTime, st.Downtime, st.Bytes)
	if last != 1 {
		t.Errorf("last progress %v", last)
	}
	info, _ := src.b.Info(uuid)
	if info.State != backend.DomainPaused || !info.Migrated || !alive(srcPid) {
		t.Errorf("source after the send: %+v", info)
	}
	if err := src.b.SendLive(ctx, uuid, io.Discard, backend.MigrateOptions{}, nil); err == nil {
		t.Error("a migrated domain was sent again")
	}
	if i, _ := dst.b.Info(uuid); i.State != backend.DomainPaused {
		t.Errorf("destination after the receive: %s", i.State)
	}
	if err := dst.b.Unpause(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	dcon := dst.serial(t, uuid)
	if after := uptime(t, dcon); after < before {
		t.Errorf("guest uptime %v after the move, %v before: it restarted", after, before)
	}
	dcon.waitFor(t, "GUEST-READY", time.Minute)

	// A restarted source daemon finds the domain paused and marked
	// migrated, for the manager to decide on.
	src.b.Close()
	reopened, err := qemu.New(qemu.Config{StateDir: src.dir, Accel: g.accel}, testLogger(t, true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reopened.Close)
	src.b = reopened
	if info, _ := src.b.Info(uuid); info.State != backend.DomainPaused || !info.Migrated || info.Pid != srcPid {
		t.Errorf("source after a restart: %+v", info)
	}
	destroy(t, src, uuid)
	eventually(t, 10*time.Second, "the source QEMU to exit", func() bool { return !alive(srcPid) })
	if _, ok := src.b.Info(uuid); ok {
		t.Error("the source still lists the domain")
	}
	if i, _ := dst.b.Info(uuid); i.State != backend.DomainRunning || !alive(i.Pid) {
		t.Errorf("destination after the source went: %+v", i)
	}
	destroy(t, dst, uuid)
	if p := qemuProcesses(uuid); len(p) != 0 {
		t.Errorf("QEMU processes left: %v", p)
	}
	con.Close()
	dcon.Close()
	eventually(t, 10*time.Second, "file descriptors to be closed", func() bool { return openFDs(t) <= fds })
}

// Cancelling half-way leaves the guest running on the source and the
// destination's receive failing cleanly; so does the destination dying
// half-way; a last attempt then works.
func TestQEMUMigrateCancel(t *testing.T) {
	g := testGuest(t)
	src, dst := newMigHost(t, g), newMigHost(t, g)
	fds := openFDs(t)
	const uuid = "a2000000-0000-4000-8000-000000000018"
	src.start(t, migSpec(g, uuid, 256<<20, false))
	con := src.serial(t, uuid)
	con.waitFor(t, "GUEST-READY", 2*time.Minute)
	before := uptime(t, con)
	dst.start(t, migSpec(g, uuid, 256<<20, true))
	dstPid := func() int { i, _ := dst.b.Info(uuid); return i.Pid }()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	var once sync.Once
	// 1 MiB/s: the guest's few tens of MiB take long enough to cancel.
	r := liveMigrate(cctx, t, src, dst, uuid, backend.MigrateOptions{Bandwidth: 1 << 20}, func(f float64) {
		if f > 0.01 {
			once.Do(func() { time.AfterFunc(500*time.Millisecond, stop) })
		}
	}, ctx)
	if !errors.Is(r.sendErr, context.Canceled) {
		t.Errorf("send: %v", r.sendErr)
	}
	if r.recvErr == nil {
		t.Fatal("the destination r.took a cancelled migration")
	}
	// The receiver's own context runs on: it learns of the cancel from
	// the stream.
	var aborted *backend.MigrateAborted
	if !errors.As(r.recvErr, &aborted) {
		t.Errorf("receive after cancel: %v", r.recvErr)
	}
	info, _ := src.b.Info(uuid)
	if info.State != backend.DomainRunning || info.Migrated {
		t.Errorf("source after cancel: %+v", info)
	}
	if after := uptime(t, con); after < before {
		t.Errorf("source guest restarted: uptime %v then %v", before, after)
	}
	destroy(t, dst, uuid)
	eventually(t, 10*time.Second, "the destination QEMU to exit", func() bool { return !alive(dstPid) })

	// The destination dies half-way: the source learns it from the
	// stream, cancels and runs on.
	dst.start(t, migSpec(g, uuid, 256<<20, true))
	var killed sync.Once
	r = liveMigrate(ctx, t, src, dst, uuid, backend.MigrateOptions{Bandwidth: 1 << 20}, func(f float64) {
		if f > 0.01 {
			killed.Do(func() {
				go func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_ = dst.b.Destroy(ctx, uuid)
				}()
			})
		}
	}, nil)
	if r.sendErr == nil || r.recvErr == nil {
		t.Fatalf("destination died: send %v; receive %v", r.sendErr, r.recvErr)
	}
	t.Logf("destination died: send %v; receive %v", r.sendErr, r.recvErr)
	eventually(t, 30*time.Second, "the destination to be destroyed", func() bool { _, ok := dst.b.Info(uuid); return !ok })
	if info, _ := src.b.Info(uuid); info.State != backend.DomainRunning || info.Migrated {
		t.Errorf("source after the destination died: %+v", info)
	}
	if after := uptime(t, con); after < before {
		t.Errorf("source guest restarted: uptime %v then %v", before, after)
	}

	// Again, to the end.
	dst.start(t, migSpec(g, uuid, 256<<20, true))
	r = liveMigrate(ctx, t, src, dst, uuid, backend.MigrateOptions{}, nil, nil)
	if r.sendErr != nil || r.recvErr != nil {
		t.Fatalf("second attempt: send %v; receive %v", r.sendErr, r.recvErr)
	}
	destroy(t, src, uuid)
	destroy(t, dst, uuid)
	if p := qemuProcesses(uuid); len(p) != 0 {
		t.Errorf("QEMU processes left: %v", p)
	}
	con.Close()
	eventually(t, 10*time.Second, "file descriptors to be closed", func() bool { return openFDs(t) <= fds })
}

// Garbage, in the framing or inside it (for QEMU to choke on), fails the
// receive cleanly.
func TestQEMUMigrateGarbage(t *testing.T) {
	g := testGuest(t)
	dst := newMigHost(t, g)
	fds := openFDs(t)
	junk := make([]byte, 1<<20)
	_, _ = rand.Read(junk)
	var framed bytes.Buffer
	mw, _ := backend.NewMigrateWriter(&framed, "qemu")
	_, _ = mw.Write(junk)
	_ = mw.End()
	for i, stream := range [][]byte{junk, framed.Bytes(), framed.Bytes()[:framed.Len()/2]} {
		uuid := fmt.Sprintf("a300000%d-0000-4000-8000-000000000018", i)
		dst.start(t, migSpec(g, uuid, 128<<20, true))
		pid := func() int { i, _ := dst.b.Info(uuid); return i.Pid }()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := dst.b.ReceiveLive(ctx, uuid, bytes.NewReader(stream))
		cancel()
		if err == nil {
			t.Fatalf("stream %d: garbage accepted", i)
		}
		t.Logf("stream %d: %v", i, err)
		destroy(t, dst, uuid)
		eventually(t, 10*time.Second, "the QEMU to exit", func() bool { return !alive(pid) })
	}
	eventually(t, 10*time.Second, "file descriptors to be closed", func() bool { return openFDs(t) <= fds })
}

// A restarted backend destroys a domain whose incoming migration never
// completed.
func TestQEMUMigrateIncomingAtRestart(t *testing.T) {
	g := testGuest(t)
	dst := newMigHost(t, g)
	const uuid = "a4000000-0000-4000-8000-000000000018"
	dst.start(t, migSpec(g, uuid, 128<<20, true))
	i, _ := dst.b.Info(uuid)
	dst.b.Close()
	again, err := qemu.New(qemu.Config{StateDir: dst.dir, Accel: g.accel}, testLogger(t, true))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, ok := again.Info(uuid); ok {
		t.Error("the unfinished incoming domain is still listed")
	}
	eventually(t, 10*time.Second, "its QEMU to exit", func() bool { return !alive(i.Pid) })
	if _, err := os.Stat(filepath.Join(dst.dir, uuid)); !os.IsNotExist(err) {
		t.Errorf("its directory is left: %v", err)
	}
}

// TestQEMUMigratePerf measures the figures in docs/performance.md
// ("Issue 18: live migration"): our migration (two backends, the framed
// stream over loopback TCP) against QEMU's own between two processes
// started by hand over a Unix socket, with the same settings, rounds
// interleaved; it reports medians. Set TOOLSTACKD_MIGRATE_PERF=1 to run
// it (TOOLSTACKD_MIGRATE_ROUNDS, default 5).
func TestQEMUMigratePerf(t *testing.T) {
	if os.Getenv("TOOLSTACKD_MIGRATE_PERF") == "" {
		t.Skip("set TOOLSTACKD_MIGRATE_PERF=1")
	}
	rounds := 5
	if n, err := strconv.Atoi(os.Getenv("TOOLSTACKD_MIGRATE_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	g := testGuest(t)
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	for _, mem := range []int64{256 << 20, 1 << 30} {
		var oursWall, oursTotal, oursDown, handTotal, handDown []time.Duration
		for round := range rounds {
			base := handMigration(t, g, mem)
			src, dst := newMigHost(t, g), newMigHost(t, g)
			uuid := fmt.Sprintf("a5%06d-0000-4000-8000-000000000018", mem>>20*10+int64(round))
			src.start(t, migSpec(g, uuid, mem, false))
			src.serial(t, uuid).waitFor(t, "GUEST-READY", 2*time.Minute)
			dst.start(t, migSpec(g, uuid, mem, true))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			r := liveMigrate(ctx, t, src, dst, uuid, backend.MigrateOptions{}, nil, nil)
			cancel()
			if r.sendErr != nil || r.recvErr != nil {
				t.Fatalf("send %v; receive %v", r.sendErr, r.recvErr)
			}
			st, _ := src.b.MigrationStats(uuid)
			t.Logf("mem=%dMiB round=%d ours: wall %v qemu-total %v downtime %v bytes %d | by hand: qemu-total %v downtime %v",
				mem>>20, round, r.took.Round(time.Millisecond), st.TotalTime, st.Downtime, st.Bytes, base.TotalTime, base.Downtime)
			oursWall, oursTotal, oursDown = append(oursWall, r.took), append(oursTotal, st.TotalTime), append(oursDown, st.Downtime)
			handTotal, handDown = append(handTotal, base.TotalTime), append(handDown, base.Downtime)
			destroy(t, src, uuid)
			destroy(t, dst, uuid)
		}
		mw, mt, md, ht, hd := median(oursWall), median(oursTotal), median(oursDown), median(handTotal), median(handDown)
		t.Logf("PERF mem=%dMiB medians of %d: ours wall %v, QEMU total %v, downtime %v; by hand QEMU total %v, downtime %v; ratio total %.2f, downtime %.2f",
			mem>>20, rounds, mw, mt, md, ht, hd, float64(mt)/float64(max(ht, time.Millisecond)), float64(md)/float64(max(hd, time.Millisecond)))
	}
}

// handMigration boots the guest in a QEMU started by hand, migrates it
// with QEMU's own "migrate unix:..." (the backend's settings: 300 ms
// downtime limit, 8 GiB/s, auto-converge) to a second QEMU started with
// "-incoming unix:...", and returns QEMU's figures.
func handMigration(t *testing.T, g *guest, mem int64) qemu.MigrationStats {
	t.Helper()
	dir := shortTempDir(t)
	common := []string{"-machine", "pc,accel=" + g.accel, "-m", strconv.FormatInt(mem>>20, 10), "-smp", "1",
		"-nodefaults", "-display", "none", "-kernel", g.kernel, "-initrd", g.initrd, "-append", g.args}
	if g.accel == "kvm" {
		common = append(common, "-cpu", "host")
	} else {
		common = append(common, "-cpu", "max")
	}
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}()
	run := func(name string, extra ...string) *exec.Cmd {
		args := append(append([]string{}, common...), "-qmp", "unix:"+filepath.Join(dir, name+".qmp")+",server=on,wait=off",
			"-serial", "file:"+filepath.Join(dir, name+".serial"))
		cmd := exec.Command("qemu-system-x86_64", append(args, extra...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		return cmd
	}
	dial := func(name string) *qmp.Conn {
		var q *qmp.Conn
		eventually(t, 30*time.Second, "QMP of "+name, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var err error
			q, err = qmp.Dial(ctx, filepath.Join(dir, name+".qmp"), nil)
			return err == nil
		})
		return q
	}
	run("src")
	sock := filepath.Join(dir, "mig.sock")
	run("dst", "-incoming", "unix:"+sock)
	eventually(t, 2*time.Minute, "the hand-started guest to boot", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "src.serial"))
		return bytes.Contains(b, []byte("GUEST-READY"))
	})
	q := dial("src")
	defer q.Close()
	qd := dial("dst")
	defer qd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	must := func(cmd string, args any) {
		if err := q.Execute(ctx, cmd, args, nil); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
	}
	must("migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{
		{"capability": "events", "state": true}, {"capability": "auto-converge", "state": true}}})
	must("migrate-set-parameters", map[string]any{"downtime-limit": 300, "max-bandwidth": int64(8) << 30})
	eventually(t, 30*time.Second, "the incoming socket", func() bool { _, err := os.Stat(sock); return err == nil })
	t0 := time.Now()
	must("migrate", map[string]any{"uri": "unix:" + sock})
	for {
		var st struct {
			Status    string `json:"status"`
			TotalTime int64  `json:"total-time"`
			Downtime  int64  `json:"downtime"`
		}
		if err := q.Execute(ctx, "query-migrate", nil, &st); err != nil {
			t.Fatal(err)
		}
		switch st.Status {
		case "completed":
			// QEMU says completed a moment before its figures are in.
			if st.TotalTime > 0 || time.Since(t0) > 5*time.Minute {
				return qemu.MigrationStats{TotalTime: time.Duration(st.TotalTime) * time.Millisecond, Downtime: time.Duration(st.Downtime) * time.Millisecond}
			}
		case "failed", "cancelled":
			t.Fatalf("hand migration %s", st.Status)
		}
		if strings.Contains(st.Status, "error") {
			t.Fatal(st.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
