// Package ovstest starts, for a test, an Open vSwitch of its own
// (ovsdb-server and ovs-vswitchd with the userspace datapath) and an OVN
// northbound side of its own (northbound and southbound ovsdb-servers
// and ovn-northd), in a temporary directory with their own sockets,
// logs and pid files: never the machine's default paths, never systemd.
// ovs-vswitchd runs in the network namespace the test names, so that
// the bridges and taps it makes are there. Everything is stopped (by
// the process ids it started) and removed when the test ends.
//
// Tests skip, naming what is missing, when the binaries are not
// installed (Debian packages openvswitch-switch, ovn-central).
//
// It is ordinary code, not a _test file, so that the tests of other
// packages can use it.
package ovstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Schemas as Debian installs them.
const (
	VSwitchSchema = "/usr/share/openvswitch/vswitch.ovsschema"
	NBSchema      = "/usr/share/ovn/ovn-nb.ovsschema"
	SBSchema      = "/usr/share/ovn/ovn-sb.ovsschema"
)

func missing(bins []string, files []string, pkg string) string {
	var gone []string
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			gone = append(gone, b)
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			gone = append(gone, f)
		}
	}
	if len(gone) == 0 {
		return ""
	}
	return fmt.Sprintf("%s not installed (Debian package %s)", strings.Join(gone, ", "), pkg)
}

// Available says why an Open vSwitch cannot be started here ("" when it
// can).
func Available() string {
	if os.Geteuid() != 0 {
		return "not root: ovs-vswitchd needs CAP_NET_ADMIN"
	}
	return missing([]string{"ovsdb-server", "ovsdb-tool", "ovs-vswitchd", "ovs-vsctl"}, []string{VSwitchSchema}, "openvswitch-switch")
}

// OVNAvailable says why OVN's northbound side cannot be started here.
func OVNAvailable() string {
	return missing([]string{"ovn-northd", "ovn-nbctl", "ovsdb-server", "ovsdb-tool"}, []string{NBSchema, SBSchema}, "ovn-central")
}

// OVS is a running ovsdb-server and ovs-vswitchd.
type OVS struct {
	Dir string
	// DB is the database endpoint, "unix:" and the socket's path.
	DB string
}

// OVN is a running northbound side of OVN.
type OVN struct {
	Dir string
	// NB and SB are the databases' endpoints.
	NB, SB string
}

func tempDir(t testing.TB, prefix string) string {
	t.Helper()
	// Short: unix socket paths are limited to 107 bytes.
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func env(dir string) []string {
	return append(os.Environ(), "OVS_RUNDIR="+dir, "OVS_DBDIR="+dir, "OVS_LOGDIR="+dir, "OVS_PKGDATADIR=/usr/share/openvswitch",
		"OVN_RUNDIR="+dir, "OVN_DBDIR="+dir, "OVN_LOGDIR="+dir)
}

func run(t testing.TB, dir string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...) // #nosec G204 -- fixed programs with test arguments
	cmd.Env = env(dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// daemon starts a long-running process (in the foreground, as a child)
// and stops it by its pid when the test ends.
func daemon(t testing.TB, dir, logName string, name string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, logName+".out")) // #nosec G304 -- the test's own temporary directory
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...) // #nosec G204 -- fixed programs with test arguments
	cmd.Env = env(dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, logName+".log")); err == nil { // #nosec G304 -- the test's own temporary directory
				t.Logf("%s log (tail):\n%s", logName, tail(string(b), 3000))
			}
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitSocket waits for a unix socket to appear.
func waitSocket(t testing.TB, path, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: socket %s did not appear within 20s", what, path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dbServer starts an ovsdb-server on a new database made from schema.
func dbServer(t testing.TB, dir, name, schema string) string {
	t.Helper()
	db := filepath.Join(dir, name+".db")
	sock := filepath.Join(dir, name+".sock")
	run(t, dir, "ovsdb-tool", "create", db, schema)
	daemon(t, dir, name, "ovsdb-server", db, "--remote=punix:"+sock, "--no-chdir",
		"--pidfile="+filepath.Join(dir, name+".pid"), "--unixctl="+filepath.Join(dir, name+".ctl"),
		"--log-file="+filepath.Join(dir, name+".log"))
	waitSocket(t, sock, "ovsdb-server "+name)
	return "unix:" + sock
}

// Start runs ovsdb-server and ovs-vswitchd, the latter in the network
// namespace netns (a name for `ip netns exec`; "" for the test's own),
// and waits until ovs-vswitchd has registered its datapath types. Each
// of otherConfig ("key=value") is set in Open_vSwitch's other_config
// before ovs-vswitchd starts (some, as userspace-tso-enable, are read
// only then). It skips the test when Open vSwitch is not installed.
func Start(t testing.TB, netns string, otherConfig ...string) *OVS {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	dir := tempDir(t, "tsovs")
	o := &OVS{Dir: dir, DB: dbServer(t, dir, "conf", VSwitchSchema)}
	o.Vsctl(t, "--no-wait", "init")
	for _, kv := range otherConfig {
		o.Vsctl(t, "--no-wait", "set", "Open_vSwitch", ".", "other_config:"+kv)
	}
	args := []string{o.DB, "--no-chdir", "--pidfile=" + filepath.Join(dir, "vswitchd.pid"),
		"--unixctl=" + filepath.Join(dir, "vswitchd.ctl"), "--log-file=" + filepath.Join(dir, "vswitchd.log")}
	if netns != "" {
		daemon(t, dir, "vswitchd", "ip", append([]string{"netns", "exec", netns, "ovs-vswitchd"}, args...)...)
	} else {
		daemon(t, dir, "vswitchd", "ovs-vswitchd", args...)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := o.TryVsctl("get", "Open_vSwitch", ".", "datapath_types")
		if err == nil && strings.Contains(out, "netdev") {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("ovs-vswitchd did not register its datapath types within 20s: %s %v", out, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TryVsctl runs ovs-vsctl against this database.
func (o *OVS) TryVsctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ovs-vsctl", append([]string{"--db=" + o.DB, "--timeout=15"}, args...)...) // #nosec G204 -- test tool
	cmd.Env = env(o.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ovs-vsctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Vsctl runs ovs-vsctl, failing the test on error.
func (o *OVS) Vsctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := o.TryVsctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TryOfctl runs ovs-ofctl against this ovs-vswitchd (a bridge named in
// args is reached through its management socket in Dir).
func (o *OVS) TryOfctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ovs-ofctl", args...) // #nosec G204 -- test tool
	cmd.Env = env(o.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ovs-ofctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Ofctl runs ovs-ofctl, failing the test on error.
func (o *OVS) Ofctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := o.TryOfctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Flows is the OpenFlow rules of bridge whose cookie is cookie under
// mask ("0x..." each; mask "-1" for that cookie alone), one per line,
// without statistics.
func (o *OVS) Flows(t testing.TB, bridge, cookie, mask string) []string {
	t.Helper()
	out := o.Ofctl(t, "dump-flows", "--no-stats", "--no-names", bridge, "cookie="+cookie+"/"+mask)
	var flows []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "NXST_FLOW") && !strings.HasPrefix(l, "OFPST_FLOW") {
			flows = append(flows, l)
		}
	}
	return flows
}

// StartOVN runs OVN's northbound and southbound databases and
// ovn-northd. It skips the test when OVN is not installed.
func StartOVN(t testing.TB) *OVN {
	t.Helper()
	if why := OVNAvailable(); why != "" {
		t.Skip("OVN tests not run: " + why)
	}
	dir := tempDir(t, "tsovn")
	n := &OVN{Dir: dir, NB: dbServer(t, dir, "nb", NBSchema), SB: dbServer(t, dir, "sb", SBSchema)}
	daemon(t, dir, "northd", "ovn-northd", "--ovnnb-db="+n.NB, "--ovnsb-db="+n.SB, "--no-chdir",
		"--pidfile="+filepath.Join(dir, "northd.pid"), "--unixctl="+filepath.Join(dir, "northd.ctl"),
		"--log-file="+filepath.Join(dir, "northd.log"))
	n.Nbctl(t, "--no-wait", "init")
	return n
}

// TryNbctl runs ovn-nbctl against the northbound database.
func (n *OVN) TryNbctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ovn-nbctl", append([]string{"--db=" + n.NB, "--timeout=15"}, args...)...) // #nosec G204 -- test tool
	cmd.Env = env(n.Dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ovn-nbctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Nbctl runs ovn-nbctl, failing the test on error.
func (n *OVN) Nbctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := n.TryNbctl(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ErrTimeout is returned by Eventually when cond never held.
var ErrTimeout = errors.New("ovstest: condition not met in time")

// Eventually polls cond every 50 ms until it holds or timeout passes.
func Eventually(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return ErrTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
