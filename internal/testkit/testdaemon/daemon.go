// Package testdaemon runs the real toolstackd binary for tests that treat
// it as a black box: crash and restart tests, connection floods, a full
// disk, the xe command line, VMs on real QEMU. It is ordinary (non-test)
// code so that every test package can import it; nothing in the daemon
// imports it.
//
// # Building
//
// Build compiles ./cmd/toolstackd from this checkout once per test binary
// and returns the path of the result; every later call returns the same
// path at once. Setting TOOLSTACKD_BIN to the path of a prebuilt binary
// skips the build (to test `make build`'s output, or another revision).
// BuildCommand does the same for any other command under cmd/, for example
// the xe client with XE_BIN. The binaries live in one directory per test
// process, testdaemon-bin-PID in the temporary directory; a test binary
// cannot remove its own when it exits without a TestMain, so each one, on
// its first build, removes those of processes that have gone. A package
// with a TestMain may call RemoveBuilds at its end to leave nothing
// behind at all.
//
// # Addresses
//
// FreeAddr picks a free TCP port on one loopback address. All of 127.0.0.0/8
// reaches the loopback device on Linux, so several daemons can listen on
// 127.0.0.2, 127.0.0.3, ... with the same port, as the hosts of a pool
// would; FreePort finds one port that is free on every address given, and
// Addr joins it with each address for Options.Listen. A free port is only
// a promise of a moment ago: another process may take it before the daemon
// binds it, which Start reports as a daemon that exited.
//
// # Running a daemon
//
// Start runs the binary with Options (data dir, listen address, backend,
// extra flags and environment, root password) and returns once the daemon
// accepts TCP connections on its address (and Options.Ready, if set, says
// yes), or fails the test with the daemon's output. A Daemon is one process:
// its PID, its combined stdout and stderr (Log, safe to read while the
// process writes), Alive, Signal (SIGSTOP and SIGCONT included), Kill
// (SIGKILL and wait), Stop (SIGTERM, wait, SIGKILL after a bound), FDCount
// and RSS from /proc. Restart starts a new process with the same options:
// same data dir, same address, same password. When the test ends, every
// daemon it started that is still running is stopped (and killed if it does
// not stop); when the test failed, the log is printed. A daemon also dies
// with the test process, even one killed by `go test -timeout`
// (PR_SET_PDEATHSIG; Linux ties it to the thread that started the daemon,
// so do not start one from a goroutine that has locked its OS thread and
// ends while the daemon should live).
//
// # Calls
//
// Client makes XenAPI calls over the daemon's real HTTP: Call speaks
// JSON-RPC 2.0 on /jsonrpc, CallXML speaks XML-RPC on /RPC2. A XenAPI
// failure comes back as *Error, with the code and its parameters; anything
// else (a refused connection, a timeout, a reply that is not RPC) is
// another error, so that a test can tell "the daemon answered no" from "the
// daemon did not answer". Every call has a timeout (DefaultTimeout unless
// the Client says otherwise). Daemon.Client and Daemon.Login give a client
// and a root session for a daemon.
//
// A typical test:
//
//	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
//	sess := d.Login(t)
//	raw, err := d.Client().Call("network.get_all", sess)
//	...
//	d.Kill()
//	d = d.Restart()
package testdaemon

import (
	"bytes"
	"errors"
	"fmt"
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

// DefaultPassword is root's password when Options.Password is empty.
const DefaultPassword = "testdaemon-pw"

// Default bounds.
const (
	DefaultStartTimeout = 60 * time.Second
	DefaultStopTimeout  = 30 * time.Second
)

// Options say how to run the daemon. Every field may be left empty.
type Options struct {
	// DataDir is --data-dir; empty: a new temporary directory.
	DataDir string
	// Listen is --listen; empty: FreeAddr on 127.0.0.1.
	Listen string
	// Backend is --backend (simulator or qemu); empty: the daemon's
	// default.
	Backend string
	// LogLevel is --log-level; empty: the daemon's default.
	LogLevel string
	// ExtraArgs follow the flags above on the command line.
	ExtraArgs []string
	// Env is added to the test's environment (later entries win).
	Env []string
	// Password is root's password, handed over in
	// TOOLSTACKD_ROOT_PASSWORD on first boot; empty: DefaultPassword.
	Password string
	// Binary is the daemon to run; empty: Build.
	Binary string
	// NoFile, when positive, sets the daemon's file limit (soft and hard)
	// before it starts.
	NoFile int
	// StartTimeout bounds the wait for the daemon to answer; zero:
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// StopTimeout bounds Stop's wait after SIGTERM; zero:
	// DefaultStopTimeout.
	StopTimeout time.Duration
	// Ready, when set, is asked (again and again) once the address
	// accepts connections; Start returns when it says true.
	Ready func(*Daemon) bool
}

// Daemon is one running (or exited) toolstackd process.
type Daemon struct {
	// Addr is the host:port it listens on, URL is "http://"+Addr.
	Addr, URL string
	// DataDir is its data directory.
	DataDir string
	// PID is its process id.
	PID int
	// Opts are the options it was started with, defaults filled in.
	Opts Options

	t      testing.TB
	cmd    *exec.Cmd
	log    *Buffer
	exited chan struct{}
}

// Buffer is a bytes.Buffer that one goroutine may write while others read.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// buildDirPrefix starts the name of a test process's build directory;
// its PID ends it.
const buildDirPrefix = "testdaemon-bin-"

var (
	buildMu  sync.Mutex
	builds   = map[string]*buildResult{}
	buildDir string // this process's, once made
)

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// Build returns the path of a toolstackd binary: $TOOLSTACKD_BIN if set,
// otherwise ./cmd/toolstackd of this checkout, built on the first call.
func Build(t testing.TB) string {
	t.Helper()
	return BuildCommand(t, "toolstackd", "TOOLSTACKD_BIN")
}

// BuildCommand returns the path of the binary of ./cmd/name: $envVar if
// that is set (envVar may be empty), otherwise a build made on the first
// call for that name and shared by every later one in this test binary.
func BuildCommand(t testing.TB, name, envVar string) string {
	t.Helper()
	if envVar != "" {
		if p := os.Getenv(envVar); p != "" {
			return p
		}
	}
	buildMu.Lock()
	r := builds[name]
	if r == nil {
		r = &buildResult{}
		builds[name] = r
	}
	buildMu.Unlock()
	r.once.Do(func() { r.path, r.err = build(name) })
	if r.err != nil {
		t.Fatalf("building %s: %v", name, r.err)
	}
	return r.path
}

// SourceRoot is the root of the checkout this package was compiled from:
// the nearest directory above this file that holds go.mod (so that the
// package can move within the tree).
func SourceRoot() string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Dir(file)
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return filepath.Join(dir, "..", "..", "..") // internal/testkit/testdaemon
		}
	}
}

// makeBuildDir makes this process's build directory, after removing those
// of test processes that have exited.
func makeBuildDir() (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		return buildDir, nil
	}
	tmp := os.TempDir()
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), buildDirPrefix))
		if !strings.HasPrefix(e.Name(), buildDirPrefix) || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		// Signal 0 tests whether the process exists; EPERM means it
		// does (another user's).
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(filepath.Join(tmp, e.Name())) // best effort: another run's leftovers
		}
	}
	dir := filepath.Join(tmp, buildDirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	buildDir = dir
	return dir, nil
}

func build(name string) (string, error) {
	dir, err := makeBuildDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "./cmd/"+name) //nolint:gosec // building this checkout's own commands is the point
	cmd.Dir = SourceRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %v\n%s", name, err, b)
	}
	return out, nil
}

// RemoveBuilds deletes the binaries Build and BuildCommand made, for a
// TestMain to call after m.Run. Without it the next test process that
// builds removes them.
func RemoveBuilds() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir) // best effort: a temporary directory
	}
	buildDir = ""
	builds = map[string]*buildResult{}
}

// FreeAddr returns "ip:port" with a TCP port that was free on ip a moment
// ago (the kernel picked it; nothing holds it afterwards). ip is a loopback
// address such as "127.0.0.1" or "127.0.0.2"; empty means 127.0.0.1.
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	return net.JoinHostPort(ipOr(ip), strconv.Itoa(FreePort(t, ip)))
}

// FreePort returns a TCP port that was free on every one of ips a moment
// ago (127.0.0.1 when none is given), so that several daemons can listen
// on the same port at different addresses. Join it with an address with
// Addr.
func FreePort(t testing.TB, ips ...string) int {
	t.Helper()
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	var last error
	for range 100 {
		l, err := net.Listen("tcp", net.JoinHostPort(ipOr(ips[0]), "0"))
		if err != nil {
			t.Fatalf("free port on %s: %v", ips[0], err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		held := []net.Listener{l}
		ok := true
		for _, ip := range ips[1:] {
			o, err := net.Listen("tcp", Addr(ipOr(ip), port))
			if err != nil {
				ok, last = false, err
				break
			}
			held = append(held, o)
		}
		for _, h := range held {
			_ = h.Close() // only probing: nothing was accepted
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on all of %v: %v", ips, last)
	return 0
}

// Addr joins an IP address and a port.
func Addr(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

func ipOr(ip string) string {
	if ip == "" {
		return "127.0.0.1"
	}
	return ip
}

// Start runs the daemon and waits until it answers (see Options). It fails
// the test, with the daemon's output, if the daemon exits or does not
// answer in time. The daemon is stopped when the test ends.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	if o.DataDir == "" {
		o.DataDir = t.TempDir()
	}
	if o.Listen == "" {
		o.Listen = FreeAddr(t, "")
	}
	if o.Password == "" {
		o.Password = DefaultPassword
	}
	if o.Binary == "" {
		o.Binary = Build(t)
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = DefaultStopTimeout
	}
	return start(t, o)
}

func start(t testing.TB, o Options) *Daemon {
	t.Helper()
	argv := []string{o.Binary, "--data-dir", o.DataDir, "--listen", o.Listen}
	if o.Backend != "" {
		argv = append(argv, "--backend", o.Backend)
	}
	if o.LogLevel != "" {
		argv = append(argv, "--log-level", o.LogLevel)
	}
	argv = append(argv, o.ExtraArgs...)
	var cmd *exec.Cmd
	if o.NoFile > 0 {
		// The limit must hold from the first instruction (the daemon
		// sizes its connection cap from it), and Go restores its own
		// limit in children: let a shell set it and exec the daemon
		// in its place, keeping the PID.
		script := fmt.Sprintf(`ulimit -Sn %d && ulimit -Hn %d && exec "$@"`, o.NoFile, o.NoFile)
		cmd = exec.Command("sh", append([]string{"-c", script, "sh"}, argv...)...) //nolint:gosec // the test's own daemon and flags
	} else {
		cmd = exec.Command(argv[0], argv[1:]...) //nolint:gosec // the test's own daemon and flags
	}
	cmd.Env = append(append(os.Environ(), "TOOLSTACKD_ROOT_PASSWORD="+o.Password), o.Env...)
	log := &Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	// The daemon dies with the test, even one killed by a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", o.Binary, err)
	}
	d := &Daemon{Addr: o.Listen, URL: "http://" + o.Listen, DataDir: o.DataDir, PID: cmd.Process.Pid, Opts: o,
		t: t, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait() // how it ended is in cmd.ProcessState
		close(d.exited)
	}()
	t.Cleanup(func() {
		if d.Alive() {
			if err := d.Stop(); err != nil {
				// The log ends with its goroutines (Stop's SIGQUIT).
				t.Logf("at cleanup: %v\n%s", err, d.LogTail(256<<10))
			}
		}
		if t.Failed() {
			t.Logf("daemon %d log:\n%s", d.PID, d.Log())
		}
	})
	deadline := time.Now().Add(o.StartTimeout)
	for time.Now().Before(deadline) && d.Alive() {
		if c, err := net.DialTimeout("tcp", o.Listen, time.Second); err == nil {
			_ = c.Close() // only probing
			if o.Ready == nil || o.Ready(d) {
				return d
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	state := "did not answer within " + o.StartTimeout.String()
	if !d.Alive() {
		state = "exited: " + cmd.ProcessState.String()
	} else {
		d.Kill()
	}
	t.Fatalf("daemon %s:\n%s", state, log.String())
	return nil
}

// Restart starts a new daemon with the same options: the same data dir,
// address and password. A daemon still running is stopped first (Stop);
// to crash it, Kill it before.
func (d *Daemon) Restart() *Daemon {
	d.t.Helper()
	if d.Alive() {
		if err := d.Stop(); err != nil {
			d.t.Errorf("restart: %v", err)
		}
	}
	return start(d.t, d.Opts)
}

// Log is everything the daemon has written to stdout and stderr so far.
func (d *Daemon) Log() string { return d.log.String() }

// LogTail is the last n bytes of Log, marked with "..." when cut.
func (d *Daemon) LogTail(n int) string {
	s := d.Log()
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Alive reports whether the process has not exited yet (a stopped one is
// alive).
func (d *Daemon) Alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Exited is closed once the process has exited and been reaped.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// ExitState is how the process ended; nil while it runs.
func (d *Daemon) ExitState() *os.ProcessState {
	if d.Alive() {
		return nil
	}
	return d.cmd.ProcessState
}

// Signal sends sig to the daemon (SIGSTOP freezes it, SIGCONT thaws it).
//
// SIGSTOP returns once the process is stopped (the kernel stops it
// asynchronously: a daemon running on another core could otherwise still
// answer a call made right after), or after two seconds.
func (d *Daemon) Signal(sig os.Signal) error {
	if !d.Alive() {
		return errors.New("the daemon has exited")
	}
	if err := d.cmd.Process.Signal(sig); err != nil {
		return err
	}
	if sig == syscall.SIGSTOP {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if procState(d.PID) == 'T' {
				break
			}
		}
	}
	return nil
}

// procState is a process's state letter from /proc/PID/stat (0 if it
// cannot be read).
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name is in parentheses and may hold spaces: the state
	// follows the last ')'.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

// Kill sends SIGKILL and returns once the process is gone.
func (d *Daemon) Kill() {
	// It fails only for a process that has already exited.
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// Stop sends SIGTERM (and SIGCONT, in case the daemon is stopped) and waits
// up to Options.StopTimeout for it to exit; past that it sends SIGQUIT,
// on which Go writes every goroutine's stack to the log and exits (what
// held the daemon up), then kills it, and says so in the error.
func (d *Daemon) Stop() error {
	if !d.Alive() {
		return nil
	}
	// Signals fail only once the process has exited, which the wait
	// below sees.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-d.exited:
		return nil
	case <-time.After(d.Opts.StopTimeout):
		_ = d.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
		}
		d.Kill()
		return fmt.Errorf("daemon %d did not stop within %v of SIGTERM; killed it (its goroutines are at the end of its log)", d.PID, d.Opts.StopTimeout)
	}
}

// FDCount is how many files the daemon has open (0 once it has exited).
func (d *Daemon) FDCount() int {
	if !d.Alive() {
		return 0
	}
	es, _ := os.ReadDir("/proc/" + strconv.Itoa(d.PID) + "/fd")
	return len(es)
}

// RSS is the daemon's resident memory in bytes (0 once it has exited).
func (d *Daemon) RSS() int64 {
	if !d.Alive() {
		return 0
	}
	return RSS(d.PID)
}

// RSS is a process's resident memory in bytes, from /proc (0 when it
// cannot tell).
func RSS(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

// CPUTicks is a process's user and system time so far, in clock ticks
// (100 a second on Linux), from /proc.
func CPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return u + k, nil
}

// Client is a client for this daemon with the default timeout.
func (d *Daemon) Client() *Client { return &Client{URL: d.URL} }

// Login logs root in over JSON-RPC with the daemon's password and returns
// the session; extra are login_with_password's further arguments (version,
// originator). It fails the test if the login fails.
func (d *Daemon) Login(t testing.TB, extra ...any) string {
	t.Helper()
	s, err := d.Client().Login("root", d.Opts.Password, extra...)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	return s
}
