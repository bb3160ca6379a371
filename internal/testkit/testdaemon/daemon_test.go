package testdaemon

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDaemon runs the real daemon through the harness: both RPC codecs,
// typed XenAPI errors, a bounded call to a frozen daemon, SIGKILL and a
// restart on the same data dir that keeps what was written.
func TestDaemon(t *testing.T) {
	d := Start(t, Options{Backend: "simulator", LogLevel: "warn", Password: "harness-pw"})
	if d.PID <= 0 || !d.Alive() || d.FDCount() == 0 || d.RSS() == 0 {
		t.Fatalf("pid %d alive %v fds %d rss %d", d.PID, d.Alive(), d.FDCount(), d.RSS())
	}
	sess := d.Login(t)
	c := d.Client()

	// JSON-RPC: a result, then a failure with its code and parameters.
	raw, err := c.Call("network.create", sess, map[string]any{"name_label": "kept", "name_description": "",
		"other_config": map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	net1, err := String(raw)
	if err != nil || !strings.HasPrefix(net1, "OpaqueRef:") {
		t.Fatalf("network.create: %q %v", raw, err)
	}
	_, err = c.Call("network.get_record", sess, "OpaqueRef:nothing")
	if e, ok := AsError(err); !ok || e.Code != "HANDLE_INVALID" || len(e.Params) != 2 || e.Params[1] != "OpaqueRef:nothing" {
		t.Fatalf("JSON-RPC failure: %#v", err)
	}
	if _, err := c.Login("root", "wrong"); err == nil {
		t.Fatal("a wrong password logged in")
	} else if e, ok := AsError(err); !ok || e.Code != "SESSION_AUTHENTICATION_FAILED" {
		t.Fatalf("wrong password: %v", err)
	}

	// XML-RPC: the same objects, decoded into Go values.
	v, err := c.CallXML("network.get_record", sess, net1)
	rec, _ := v.(map[string]any)
	if err != nil || rec["name_label"] != "kept" {
		t.Fatalf("XML-RPC get_record: %v %v", v, err)
	}
	if mtu, ok := rec["MTU"]; !ok || (mtu != "1500" && mtu != int64(1500)) {
		t.Errorf("MTU decoded as %#v", rec["MTU"])
	}
	_, err = c.CallXML("network.set_name_description", sess, "OpaqueRef:nothing", "x")
	if e, ok := AsError(err); !ok || e.Code != "HANDLE_INVALID" || e.Error() != "HANDLE_INVALID "+strings.Join(e.Params, " ") {
		t.Fatalf("XML-RPC failure: %#v", err)
	}
	if _, err := c.CallXML("network.set_name_description", sess, net1, "described"); err != nil {
		t.Fatal(err)
	}

	// A frozen daemon: the call times out (not a XenAPI error), and
	// answers again once thawed.
	if err := d.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	_, err = (&Client{URL: d.URL, Timeout: 300 * time.Millisecond, NoKeepAlive: true}).Call("network.get_all", sess)
	if _, ok := AsError(err); err == nil || ok || time.Since(begin) > 5*time.Second {
		t.Fatalf("a call to a stopped daemon: %v after %v", err, time.Since(begin))
	}
	d.Signal(syscall.SIGCONT)
	if _, err := c.Call("network.get_all", sess); err != nil {
		t.Fatalf("after SIGCONT: %v", err)
	}

	// SIGKILL, then a restart on the same data dir and address.
	d.Kill()
	if d.Alive() || d.ExitState() == nil || d.Signal(syscall.SIGTERM) == nil {
		t.Fatal("a killed daemon still looks alive")
	}
	d2 := d.Restart()
	if d2.Addr != d.Addr || d2.DataDir != d.DataDir || d2.PID == d.PID {
		t.Fatalf("restart: %+v", d2)
	}
	raw, err = d2.Client().Call("network.get_name_description", d2.Login(t), net1)
	if desc, _ := String(raw); err != nil || desc != "described" {
		t.Fatalf("after restart: %q %v", raw, err)
	}
	if err := d2.Stop(); err != nil || d2.Alive() {
		t.Fatalf("stop: %v", err)
	}
}

// TestDaemonThatDoesNotStart: a daemon that exits at once fails Start
// quickly with its output, rather than hanging until the start timeout.
func TestDaemonThatDoesNotStart(t *testing.T) {
	ft := &fatalT{TB: t}
	begin := time.Now()
	func() {
		defer func() { recover() }()
		Start(ft, Options{ExtraArgs: []string{"--no-such-flag"}, StartTimeout: 30 * time.Second})
	}()
	if ft.msg == "" || !strings.Contains(ft.msg, "exited") || !strings.Contains(ft.msg, "no-such-flag") {
		t.Fatalf("start of a failing daemon: %q", ft.msg)
	}
	if time.Since(begin) > 10*time.Second {
		t.Fatalf("took %v to notice the daemon exited", time.Since(begin))
	}
}

// fatalT records Fatalf instead of ending the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

// TestFreePort: one port free on several loopback addresses, on which
// several listeners can then bind at once.
func TestFreePort(t *testing.T) {
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := FreePort(t, ips...)
	for _, ip := range ips {
		l, err := net.Listen("tcp", Addr(ip, port))
		if err != nil {
			t.Fatalf("%s:%d: %v", ip, port, err)
		}
		defer l.Close()
	}
	if a := FreeAddr(t, "127.0.0.5"); !strings.HasPrefix(a, "127.0.0.5:") {
		t.Fatalf("FreeAddr: %s", a)
	}
}

// TestTwoHostsOnePort: two daemons on one port at two loopback addresses,
// as the hosts of a pool will run, each answering on its own.
func TestTwoHostsOnePort(t *testing.T) {
	port := FreePort(t, "127.0.0.2", "127.0.0.3")
	a := Start(t, Options{Listen: Addr("127.0.0.2", port), Backend: "simulator", LogLevel: "warn"})
	b := Start(t, Options{Listen: Addr("127.0.0.3", port), Backend: "simulator", LogLevel: "warn"})
	hosts := map[string]bool{}
	for _, d := range []*Daemon{a, b} {
		raw, err := d.Client().Call("host.get_all", d.Login(t))
		var refs []string
		if err != nil || json.Unmarshal(raw, &refs) != nil || len(refs) != 1 {
			t.Fatalf("%s: host.get_all %s %v", d.Addr, raw, err)
		}
		uuid, err := d.Client().Call("host.get_uuid", d.Login(t), refs[0])
		if err != nil {
			t.Fatal(err)
		}
		hosts[string(uuid)] = true
	}
	if len(hosts) != 2 {
		t.Fatalf("two daemons, hosts %v", hosts)
	}
}

// TestBuildDirSweep: a build directory left by a test process that has
// gone is removed by the next process's first build; RemoveBuilds removes
// this process's own.
func TestBuildDirSweep(t *testing.T) {
	// make unit names prebuilt binaries; this test is about building.
	t.Setenv("TOOLSTACKD_BIN", "")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(os.TempDir(), buildDirPrefix+strconv.Itoa(gone.Process.Pid))
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Dir(Build(t))
	RemoveBuilds()
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Fatalf("RemoveBuilds left %s: %v", mine, err)
	}
	bin := Build(t) // a first build again
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("the build left a dead process's %s: %v", stale, err)
	}
	if filepath.Dir(bin) != mine {
		t.Fatalf("built into %s, want %s", bin, mine)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatal(err)
	}
}
