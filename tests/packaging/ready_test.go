package packaging

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// TestReadyWithManyVMs measures the time from the daemon's start to
// READY=1 on a database of TOOLSTACKD_READY_VMS VMs (e.g. 100000), and on
// an empty one, both loaded from the file (not a first boot).
func TestReadyWithManyVMs(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("TOOLSTACKD_READY_VMS"))
	if n <= 0 {
		t.Skip("set TOOLSTACKD_READY_VMS=100000 to measure the start of a daemon with that many VMs")
	}
	bin := testdaemon.Build(t)
	empty := t.TempDir()
	d := testdaemon.Start(t, testdaemon.Options{DataDir: empty, Binary: bin, Backend: "simulator"})
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: start to READY=1, empty database: %v", timeToReady(t, bin, empty))

	full := t.TempDir()
	d = testdaemon.Start(t, testdaemon.Options{DataDir: full, Binary: bin, Backend: "simulator"})
	s := d.Login(t)
	began := time.Now()
	createVMs(t, d.Addr, s, n)
	t.Logf("made %d VMs in %v", n, time.Since(began).Round(time.Second))
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(full, "toolstackd.db")); err == nil {
		t.Logf("database file: %.0f MB", float64(fi.Size())/1e6)
	}
	t.Logf("figure: start to READY=1, %d VMs: %v", n, timeToReady(t, bin, full))
}

// timeToReady starts the daemon on dataDir with a NOTIFY_SOCKET and
// returns how long READY=1 took; it stops the daemon.
func timeToReady(t *testing.T, bin, dataDir string) time.Duration {
	dir, err := os.MkdirTemp("", "tsd-ready")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	sock := filepath.Join(dir, "notify")
	notify := listenNotify(t, sock)
	cmd := exec.Command(bin, "--data-dir", dataDir, "--listen", testdaemon.FreeAddr(t, "127.0.0.1"), "--backend", "simulator") //nolint:gosec // the test's own daemon
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	select {
	case <-notify.ready:
		return time.Since(start)
	case <-time.After(10 * time.Minute):
		t.Fatal("no READY=1 in 10 minutes")
	}
	return 0
}

// createVMs makes n VMs with 16 clients at once.
func createVMs(t *testing.T, addr, s string, n int) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := pooltest.NewClient(netip.Addr{})
			defer c.CloseIdle()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || failed.Load() != nil {
					return
				}
				if _, err := c.CallString(ctx, addr, "VM.create", s, testdaemon.VMRecord("ready-"+strconv.Itoa(i))); err != nil {
					err = fmt.Errorf("VM.create %d: %w", i, err)
					failed.Store(&err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(*err)
	}
}
