package xenops_test

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The real daemon, built from cmd/toolstackd.

var (
	daemonOnce sync.Once
	daemonBin  string
	daemonErr  error
	binDir     string
)

func buildDaemon(t *testing.T) string {
	t.Helper()
	daemonOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		binDir, daemonErr = os.MkdirTemp("", "xo-bin")
		if daemonErr != nil {
			return
		}
		daemonBin = filepath.Join(binDir, "toolstackd")
		cmd := exec.Command("go", "build", "-o", daemonBin, "./cmd/toolstackd")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			daemonErr = err
			daemonBin = string(out)
		}
	})
	if daemonErr != nil {
		t.Fatalf("building the daemon: %v\n%s", daemonErr, daemonBin)
	}
	return daemonBin
}

type daemon struct {
	cmd  *exec.Cmd
	addr string
	log  *bytes.Buffer
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startDaemon runs toolstackd on a data dir and waits until it answers.
func startDaemon(t *testing.T, dir, addr, backend string, env ...string) *daemon {
	t.Helper()
	return startDaemonArgs(t, dir, addr, backend, nil, env...)
}

func startDaemonArgs(t *testing.T, dir, addr, backend string, args []string, env ...string) *daemon {
	t.Helper()
	cmd := exec.Command(buildDaemon(t), append([]string{"--data-dir", dir, "--listen", addr, "--backend", backend, "--log-level", "warn"}, args...)...)
	cmd.Env = append(append(os.Environ(), "TOOLSTACKD_ROOT_PASSWORD="+rootPW), env...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{cmd: cmd, addr: addr, log: &log}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return d
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	t.Fatalf("daemon did not start:\n%s", log.String())
	return nil
}

func (d *daemon) kill() {
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
}

func (d *daemon) stop(t *testing.T) {
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		d.kill()
		t.Errorf("daemon did not stop on SIGTERM")
	}
}

// rss is a process's resident memory in bytes.
func rss(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

// remote is an env talking to a daemon.
func remote(t *testing.T, d *daemon) *env {
	e := &env{t: t, url: "http://" + d.addr}
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
	addr := freeAddr(t)
	env := []string{"TOOLSTACKD_QEMU_ACCEL=" + g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}
	d := startDaemon(t, dir, addr, "qemu", env...)
	defer func() { d.kill() }()
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

	d.kill()
	syscall.Kill(pb[0], syscall.SIGKILL) // dies while nobody watches
	time.Sleep(100 * time.Millisecond)
	if !alive(pa[0]) {
		t.Fatal("killing the daemon killed a VM")
	}

	d = startDaemon(t, dir, addr, "qemu", env...)
	e = remote(t, d)
	if p := e.power(a); p != "Running" || e.field("VM", a, "domid") != domid {
		t.Fatalf("survivor after restart: %s domid %v (was %v)\n%s", p, e.field("VM", a, "domid"), domid, d.log)
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
	d.stop(t)
}
