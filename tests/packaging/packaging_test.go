// Package packaging tests the Debian package (issue 16): make deb, lintian,
// and, as root on a machine without the package, dpkg -i, the systemd
// units, the service's command line under a NOTIFY_SOCKET this test reads
// (READY=1 once the API answers, WATCHDOG=1 while the database writer
// moves, none while it is frozen), xe over the local socket, and a purge
// that leaves none of the package's files.
package packaging

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/netnstest"
)

const repo = "../.."

// This checkout's package, built once for both tests that need it (make
// deb takes a minute or more), in debDir, which TestMain removes.
var (
	debOnce sync.Once
	debDir  string
	deb     string
	debErr  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if debDir != "" {
		_ = os.RemoveAll(debDir)
	}
	os.Exit(code)
}

// checkoutDeb is this checkout's package: the one TOOLSTACKD_DEB names
// (built already with make deb), else one built here the first time it
// is asked for.
func checkoutDeb(t *testing.T) string {
	t.Helper()
	if prebuilt := os.Getenv("TOOLSTACKD_DEB"); prebuilt != "" {
		return prebuilt
	}
	debOnce.Do(func() {
		dir, err := os.MkdirTemp("", "toolstackd-deb")
		if err != nil {
			debErr = err.Error()
			return
		}
		debDir = dir
		build := exec.Command("make", "-s", "deb", "DEB_DIR="+dir)
		build.Dir = repo
		if b, err := build.CombinedOutput(); err != nil {
			debErr = fmt.Sprintf("make deb: %v\n%s", err, b)
			return
		}
		debs, _ := filepath.Glob(filepath.Join(dir, "toolstackd_*_*.deb"))
		if len(debs) != 1 {
			debErr = fmt.Sprintf("make deb made %v", debs)
			return
		}
		deb = debs[0]
	})
	if debErr != "" {
		t.Fatal(debErr)
	}
	return deb
}

func TestDebianPackage(t *testing.T) {
	for _, tool := range []string{"make", "dpkg-deb", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	start := time.Now()
	deb := checkoutDeb(t)
	st, err := os.Stat(deb)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: make deb took %v; %s is %.1f MB", time.Since(start).Round(time.Second), filepath.Base(deb), float64(st.Size())/1e6)

	t.Run("lintian", func(t *testing.T) {
		if _, err := exec.LookPath("lintian"); err != nil {
			t.Skip("lintian is not installed (scripts/install-test-deps.sh installs it)")
		}
		b, err := exec.Command("lintian", "--tag-display-limit", "0", deb).CombinedOutput()
		t.Logf("lintian:\n%s", b)
		if bytes.Contains(b, []byte("\nE: ")) || bytes.HasPrefix(b, []byte("E: ")) {
			t.Fatal("lintian reports errors")
		}
		if err != nil && !bytes.Contains(b, []byte("W: ")) {
			t.Fatalf("lintian: %v", err)
		}
	})

	t.Run("install", func(t *testing.T) { installed(t, deb) })
}

// installed installs the package, runs the service's command line, and
// purges it. It changes the machine: it runs only as root, where the
// package, its data directory and its configuration are not already
// there.
func installed(t *testing.T, deb string) {
	if os.Geteuid() != 0 {
		t.Skip("installing needs root")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("no dpkg")
	}
	if exec.Command("dpkg", "-s", "toolstackd").Run() == nil {
		t.Skip("toolstackd is installed on this machine: not touching it")
	}
	for _, p := range []string{"/var/lib/toolstackd", "/etc/toolstackd"} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s exists on this machine: not touching it", p)
		}
	}
	if b, err := exec.Command("dpkg", "-s", "qemu-system-x86", "qemu-utils", "iproute2").CombinedOutput(); err != nil {
		t.Skipf("the package's dependencies are not installed: %s", b)
	}
	if b, err := exec.Command("dpkg", "-i", deb).CombinedOutput(); err != nil {
		_ = exec.Command("dpkg", "--purge", "toolstackd").Run()
		t.Fatalf("dpkg -i: %v\n%s", err, b)
	}
	list, err := exec.Command("dpkg", "-L", "toolstackd").Output()
	if err != nil {
		t.Fatal(err)
	}
	purged := false
	purge := func() {
		if purged {
			return
		}
		purged = true
		if b, err := exec.Command("dpkg", "--purge", "toolstackd").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge: %v\n%s", err, b)
		}
	}
	defer purge()

	t.Run("units", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Skip("no systemd-analyze")
		}
		b, err := exec.Command("systemd-analyze", "verify", "/lib/systemd/system/toolstackd.service",
			"/lib/systemd/system/toolstackd.socket", "/lib/systemd/system/toolstackd-api.socket").CombinedOutput()
		if err != nil || len(bytes.TrimSpace(b)) > 0 {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, b)
		}
	})
	t.Run("versions", func(t *testing.T) {
		for _, argv := range [][]string{{"/usr/sbin/toolstackd", "--version"}, {"/usr/bin/xe", "--version"}} {
			b, err := exec.Command(argv[0], argv[1:]...).Output()
			if err != nil || bytes.Contains(b, []byte(" dev\n")) {
				t.Errorf("%s: %v %q: want git's version", strings.Join(argv, " "), err, b)
			}
		}
	})
	t.Run("service", serviceCommandLine)

	purge()
	// Nothing the package installed is left, but directories other
	// packages share (/etc, /usr/share/man/man1, ...).
	ours := regexp.MustCompile(`^(/etc/toolstackd|/var/lib/toolstackd|/usr/libexec/toolstackd|/usr/share/doc/toolstackd)(/|$)`)
	for _, p := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		fi, err := os.Stat(p) // /lib may be a link to /usr/lib
		if err != nil {
			continue
		}
		if !fi.IsDir() || ours.MatchString(p) {
			t.Errorf("left after purge: %s", p)
		}
	}
	if links, _ := filepath.Glob("/etc/systemd/system/*/toolstackd*"); len(links) > 0 {
		t.Errorf("unit links left after purge: %v", links)
	}
}

// execStart is the service's command line, from the installed unit.
func execStart(t *testing.T) []string {
	b, err := os.ReadFile("/lib/systemd/system/toolstackd.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatal("no ExecStart in toolstackd.service")
	return nil
}

// notifications collects what the daemon sends to its NOTIFY_SOCKET.
type notifications struct {
	mu    sync.Mutex
	msgs  []note
	ready chan struct{}
}

type note struct {
	at    time.Time
	state string
}

func listenNotify(t *testing.T, path string) *notifications {
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	n := &notifications{ready: make(chan struct{})}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			for _, s := range strings.Split(strings.TrimSpace(string(buf[:k])), "\n") {
				n.msgs = append(n.msgs, note{time.Now(), s})
				if s == "READY=1" {
					close(n.ready)
				}
			}
			n.mu.Unlock()
		}
	}()
	return n
}

// count is how many times state was sent in [from, to).
func (n *notifications) count(state string, from, to time.Time) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, m := range n.msgs {
		if m.state == state && !m.at.Before(from) && m.at.Before(to) {
			c++
		}
	}
	return c
}

// times is when state was sent at or after from.
func (n *notifications) times(state string, from time.Time) []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	var at []time.Time
	for _, m := range n.msgs {
		if m.state == state && !m.at.Before(from) {
			at = append(at, m.at)
		}
	}
	return at
}

// serviceCommandLine runs the unit's ExecStart as systemd would (with
// NOTIFY_SOCKET and WATCHDOG_USEC), the API on a free loopback port.
func serviceCommandLine(t *testing.T) {
	dir, err := os.MkdirTemp("", "tsd-notify") // short: a socket path
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	notify := listenNotify(t, filepath.Join(dir, "notify"))
	// The shipped network backend (linux) acts in a namespace of the
	// test's own, never on this machine's network.
	argv := append(execStart(t), "--listen", "127.0.0.1:0", "--debug-listen", "127.0.0.1:0", "--debug-hooks",
		"--sd-watchdog-db-stall", "2s", "--network-namespace", netnstest.New(t).Path())
	cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // the installed unit's command line
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "notify"), "WATCHDOG_USEC=1000000",
		"TOOLSTACKD_ROOT_PASSWORD=packaging-test")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logMu sync.Mutex
	var logText strings.Builder
	debugURL := make(chan string, 1)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`url=(http://\S+)/debug/pprof/`)
		for sc.Scan() {
			logMu.Lock()
			logText.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				debugURL <- m[1]
			}
		}
		exited <- cmd.Wait()
	}()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			logMu.Lock()
			t.Logf("daemon's log:\n%s", logText.String())
			logMu.Unlock()
		}
	}()
	select {
	case <-notify.ready:
		t.Logf("figure: ExecStart to READY=1 (empty database, QEMU backend): %v", time.Since(start).Round(time.Millisecond))
	case err := <-exited:
		t.Fatalf("the daemon exited before READY=1: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("no READY=1 in 90s")
	}
	var dbg string
	select {
	case dbg = <-debugURL:
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon's log does not say where --debug-listen is")
	}

	// xe from the package, over the local socket at its default place.
	xe := func(ctx context.Context, args ...string) (string, error) {
		b, err := exec.CommandContext(ctx, "/usr/bin/xe", args...).CombinedOutput()
		return string(b), err
	}
	ctx := context.Background()
	if out, err := xe(ctx, "vm-list"); err != nil {
		t.Fatalf("xe vm-list: %v\n%s", err, out)
	}
	poolUUID, err := xe(ctx, "pool-list", "--minimal")
	if err != nil {
		t.Fatalf("xe pool-list: %v\n%s", err, poolUUID)
	}
	poolUUID = strings.TrimSpace(poolUUID)

	// WATCHDOG=1 every half second (WATCHDOG_USEC is 1s): five take
	// 2.5 s on a quiet machine. A busy machine may hold one back, so they
	// are waited for up to 20 s, and the median gap between them is held
	// under the 1 s systemd allows.
	since := time.Now()
	for notify.count("WATCHDOG=1", since, time.Now()) < 5 {
		if time.Since(since) > 20*time.Second {
			t.Fatalf("%d WATCHDOG=1 in 20s", notify.count("WATCHDOG=1", since, time.Now()))
		}
		time.Sleep(100 * time.Millisecond)
	}
	pings := notify.times("WATCHDOG=1", since)[:5]
	var gaps []time.Duration
	for i := 1; i < len(pings); i++ {
		gaps = append(gaps, pings[i].Sub(pings[i-1]))
	}
	slices.Sort(gaps)
	if m := gaps[len(gaps)/2]; m >= time.Second {
		t.Fatalf("WATCHDOG=1 a median %v apart (gaps %v), want under WATCHDOG_USEC (1s)", m, gaps)
	}

	// Freeze the database writer for 8s and write: the write waits, and
	// after the 2s stall limit the pings stop until the writer moves.
	resp, err := http.Post(dbg+"/debug/freeze-db?seconds=8", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("freeze-db: %s", resp.Status)
	}
	frozen := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wrote := make(chan error, 1)
	go func() {
		out, err := xe(wctx, "pool-param-set", "uuid="+poolUUID, "name-description=written while frozen")
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		wrote <- err
	}()
	time.Sleep(6 * time.Second)
	if n := notify.count("WATCHDOG=1", frozen.Add(3500*time.Millisecond), frozen.Add(6*time.Second)); n != 0 {
		t.Errorf("%d WATCHDOG=1 while the database writer was frozen", n)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the write held up by the freeze: %v", err)
	}
	thawed := time.Now()
	t.Logf("the write waited %v for the frozen writer", thawed.Sub(frozen).Round(time.Millisecond))
	// The next comes within half a second on a quiet machine.
	for notify.count("WATCHDOG=1", thawed, time.Now()) == 0 {
		if time.Since(thawed) > 10*time.Second {
			t.Error("no WATCHDOG=1 within 10s after the writer moved again")
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// SIGTERM: STOPPING=1 and a clean exit.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit 30s after SIGTERM")
	}
	if notify.count("STOPPING=1", start, time.Now()) != 1 {
		t.Error("no STOPPING=1")
	}
}
