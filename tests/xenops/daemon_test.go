package xenops_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// The real daemon, built from cmd/toolstackd.

// startDaemon runs toolstackd on a data dir and waits until it answers.
func startDaemon(t *testing.T, dir, addr, backend string, env ...string) *testdaemon.Daemon {
	t.Helper()
	return startDaemonArgs(t, dir, addr, backend, nil, env...)
}

func startDaemonArgs(t *testing.T, dir, addr, backend string, args []string, env ...string) *testdaemon.Daemon {
	t.Helper()
	return testdaemon.Start(t, testdaemon.Options{DataDir: dir, Listen: addr, Backend: backend, LogLevel: "warn",
		ExtraArgs: args, Env: env, Password: rootPW})
}

// stop stops the daemon with SIGTERM; it must go within 30 s.
func stop(t *testing.T, d *testdaemon.Daemon) {
	t.Helper()
	if err := d.Stop(); err != nil {
		t.Errorf("daemon did not stop on SIGTERM: %v", err)
	}
}

// remote is an env talking to a daemon.
func remote(t *testing.T, d *testdaemon.Daemon) *env {
	e := &env{t: t, url: d.URL}
	e.sess = e.str(e.call("session.login_with_password", "root", rootPW, "2.21", "xenops-test"))
	return e
}

func (e *env) uuidOf(vm string) string { return e.field("VM", vm, "uuid").(string) }

// TestDaemonRestartKeepsVMs: toolstackd is killed with VMs running; one
// VM's QEMU dies while it is down. The restarted daemon manages the
// survivor again, without restarting it, and marks the other Halted.
func TestDaemonRestartKeepsVMs(t *testing.T) {
	g := testGuest(t)
	dir := shortTempDir(t)
	addr := testdaemon.FreeAddr(t, "")
	env := []string{"TOOLSTACKD_QEMU_ACCEL=" + g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}
	d := startDaemon(t, dir, addr, "qemu", env...)
	defer func() { d.Kill() }()
	e := remote(t, d)
	a := e.guestVM(g, "survivor", nil)
	b := e.guestVM(g, "casualty", nil)
	e.addVIF(a, "0")
	uuids := []string{e.uuidOf(a), e.uuidOf(b)}
	t.Cleanup(func() {
		for _, id := range uuids {
			for _, pid := range qemuProcesses(id) {
				t.Errorf("QEMU %d left running; killing it", pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	e.call("VM.start", a, false, false)
	e.call("VM.start", b, false, false)
	pa, pb := qemuProcesses(uuids[0]), qemuProcesses(uuids[1])
	if len(pa) != 1 || len(pb) != 1 {
		t.Fatalf("QEMU processes: %v %v", pa, pb)
	}
	domid := e.field("VM", a, "domid")

	d.Kill()
	syscall.Kill(pb[0], syscall.SIGKILL) // dies while nobody watches
	time.Sleep(100 * time.Millisecond)
	if !alive(pa[0]) {
		t.Fatal("killing the daemon killed a VM")
	}

	d = d.Restart()
	e = remote(t, d)
	if p := e.power(a); p != "Running" || e.field("VM", a, "domid") != domid {
		t.Fatalf("survivor after restart: %s domid %v (was %v)\n%s", p, e.field("VM", a, "domid"), domid, d.Log())
	}
	if now := qemuProcesses(e.uuidOf(a)); len(now) != 1 || now[0] != pa[0] {
		t.Fatalf("survivor's QEMU after restart: %v, was %d", now, pa[0])
	}
	if p := e.power(b); p != "Halted" {
		t.Fatalf("casualty after restart: %s", p)
	}
	if _, err := os.Stat(filepath.Join(dir, "xenops", "qemu", e.uuidOf(b))); !os.IsNotExist(err) {
		t.Errorf("casualty's domain directory is left: %v", err)
	}
	// Managed again: its console answers, it pauses and resumes, and it
	// stops when told.
	vnc := e.console(a, "rfb")
	banner := make([]byte, 12)
	vnc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := vnc.Read(banner); err != nil || !strings.HasPrefix(string(banner), "RFB ") {
		t.Errorf("VNC after restart: %q %v", banner, err)
	}
	vnc.Close()
	e.call("VM.pause", a)
	e.call("VM.unpause", a)
	// The re-attached QEMU is watched: its death is noticed.
	e.call("VM.start", b, false, false)
	syscall.Kill(pa[0], syscall.SIGKILL)
	killed := time.Now()
	eventually(t, 2*time.Second, "survivor Halted after its QEMU died", func() bool { return e.power(a) == "Halted" })
	t.Logf("death of a re-attached QEMU handled in %v", time.Since(killed))
	e.call("VM.hard_shutdown", b)
	if p := qemuProcesses(uuids[1]); len(p) != 0 || e.power(b) != "Halted" {
		t.Fatalf("hard_shutdown after restart: %v %s", p, e.power(b))
	}
	stop(t, d)
}
