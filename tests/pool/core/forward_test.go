package core

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// A call routed to a member runs there: a VM made on the coordinator
// starts on a member (simulator), the pool sees it running there, and
// the member's own replica agrees.
func TestCallsRunOnTheirHost(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	call := func(method string, params ...any) json.RawMessage {
		t.Helper()
		raw, err := c.Call(ctx, p.Addr(0), method, append([]any{s}, params...)...)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		return raw
	}
	str := func(raw json.RawMessage) string {
		t.Helper()
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return v
	}
	member := suite.HostRefs(t, ctx, c, p, 0, s)[1]
	vm := str(call("VM.create", testdaemon.VMRecord("on-a-member")))
	call("VM.start_on", vm, member, false, false)
	if ps := str(call("VM.get_power_state", vm)); ps != "Running" {
		t.Fatalf("power state on the coordinator: %s", ps)
	}
	if on := str(call("VM.get_resident_on", vm)); on != member {
		t.Fatalf("resident on %s, want the member %s", on, member)
	}
	// The member's replica agrees.
	ls, err := p.LocalLogin(ctx, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ps, err := c.CallString(ctx, p.Addr(1), "VM.get_power_state", ls, vm)
		if err == nil && ps == "Running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member's replica: %q, %v", ps, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	call("VM.hard_shutdown", vm)
	if ps := str(call("VM.get_power_state", vm)); ps != "Halted" {
		t.Fatalf("after hard_shutdown: %s", ps)
	}
	// VM.start places the VM on a host of the pool and runs it there.
	call("VM.start", vm, false, false)
	on := str(call("VM.get_resident_on", vm))
	if ps := str(call("VM.get_power_state", vm)); ps != "Running" || on == "OpaqueRef:NULL" {
		t.Fatalf("after VM.start: %s on %s", ps, on)
	}
	t.Logf("VM.start placed the VM on %s", on)
}

// A member that dies is not live on the coordinator within a bound, and
// live again once it is back.
func TestMemberLiveness(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	metrics, err := c.CallString(ctx, p.Addr(0), "host.get_metrics", s, suite.HostRefs(t, ctx, c, p, 0, s)[2])
	if err != nil {
		t.Fatal(err)
	}
	live := func() bool {
		raw, err := c.Call(ctx, p.Addr(0), "host_metrics.get_live", s, metrics)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw) == "true"
	}
	waitFor := func(want bool, bound time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for live() != want {
			if time.Since(start) > bound {
				t.Fatalf("host_metrics.live still %v after %v", !want, bound)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitFor(true, 30*time.Second)
	p.Kill(2)
	t.Logf("a killed member is not live after %v", waitFor(false, 30*time.Second))
	// A call routed to it is refused at once: HOST_OFFLINE [host].
	dead := suite.HostRefs(t, ctx, c, p, 0, s)[2]
	vm, err := c.CallString(ctx, p.Addr(0), "VM.create", s, testdaemon.VMRecord("for a dead host"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, dead, false, false)
	if pooltest.Code(err) != xerr.HostOffline || !strings.Contains(err.Error(), dead) {
		t.Fatalf("VM.start_on a dead member: %v, want HOST_OFFLINE [%s]", err, dead)
	}
	p.Restart(2)
	t.Logf("a restarted member is live again after %v", waitFor(true, 30*time.Second))
}

// Debian's XenAPI.py follows HOST_IS_SLAVE the way os_xenapi's session
// does, and reads a member's replica with slave_local_login
// (tests/e2e/xenapi_pool.py).
func TestXenAPIPyFollowsTheCoordinator(t *testing.T) {
	runPoolClient(t, "python3", "xenapi_pool.py", "/usr/lib/python3/dist-packages/os_xenapi/client/XenAPI.py")
}

// Xen Orchestra's xen-api client (npm, installed by .ci/run in tests/e2e)
// follows HOST_IS_SLAVE from a member to the coordinator, and to the new
// coordinator after pool.designate_new_master (tests/e2e/xo_pool.mjs).
func TestXOFollowsTheCoordinator(t *testing.T) {
	runPoolClient(t, "node", "xo_pool.mjs", filepath.Join(testdaemon.SourceRoot(), "tests", "e2e", "node_modules", "xen-api"))
}

// runPoolClient runs a script of tests/e2e against a pool of three hosts
// with POOL_URLS and POOL_PASSWORD; needs is a file the client library
// must have installed (CI installs them; elsewhere the test skips).
func runPoolClient(t *testing.T, interpreter, script, needs string) {
	bin, err := exec.LookPath(interpreter)
	if _, serr := os.Stat(needs); err != nil || serr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s or %s missing in CI: %v %v", interpreter, needs, err, serr)
		}
		t.Skipf("%s or %s not installed", interpreter, needs)
	}
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	var urls []string
	for i := range p.Len() {
		urls = append(urls, "http://"+p.Advertised(i))
	}
	cmd := exec.CommandContext(ctx, bin, script)
	cmd.Dir = filepath.Join(testdaemon.SourceRoot(), "tests", "e2e")
	cmd.Env = append(os.Environ(), "POOL_URLS="+strings.Join(urls, " "), "POOL_PASSWORD="+p.Password())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The script asks, with a line of its own, for the coordinator to be
	// killed, and reads back which host was.
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		t.Logf("%s: %s", script, line)
		if line != "KILL THE COORDINATOR" {
			continue
		}
		c := pooltest.NewClient(netip.Addr{})
		i, _, err := p.FindCoordinator(ctx, c)
		if err != nil {
			t.Fatalf("finding the coordinator to kill: %v", err)
		}
		p.Kill(i)
		t.Logf("killed the coordinator, host %d", i)
		fmt.Fprintf(stdin, "%d\n", i)
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, errOut.String())
	}
}

// A call over a member's local superuser socket (xe on the member) goes
// to the coordinator, as xapi's do: the write is the pool's, a read sees
// the coordinator's state, and an Async call's work runs where its route
// says (its task is the member's: sessions are each host's own).
func TestLocalSocketGoesToTheCoordinator(t *testing.T) {
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	call := suite.SocketCaller(t, filepath.Join(p.Hosts[1].DataDir, "xapi.sock"))
	var ls, task string
	_ = json.Unmarshal(call("session.login_with_password", "root", ""), &ls)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	call("pool.set_name_description", ls, pool, "from a member's socket")
	if got, err := c.CallString(ctx, p.Addr(0), "pool.get_name_description", s, pool); err != nil || got != "from a member's socket" {
		t.Fatalf("on the coordinator: %q %v", got, err)
	}
	// A call the coordinator must pass on (VDI.create on the member's
	// own SR runs where the SR is plugged): sent whole to the
	// coordinator, routed there, run on the member.
	member := suite.HostRefs(t, ctx, c, p, 0, s)[1]
	var pbds map[string]map[string]any
	b, err := c.Call(ctx, p.Addr(0), "PBD.get_all_records", s)
	if err != nil || json.Unmarshal(b, &pbds) != nil {
		t.Fatalf("PBD.get_all_records: %v", err)
	}
	localSR := ""
	for _, pbd := range pbds {
		if pbd["host"] != member {
			continue
		}
		sr, _ := pbd["SR"].(string)
		if shared, err := c.Call(ctx, p.Addr(0), "SR.get_shared", s, sr); err == nil && string(shared) == "false" {
			localSR = sr
		}
	}
	if localSR == "" {
		t.Fatal("the member has no local SR")
	}
	var vdi string
	if err := json.Unmarshal(call("VDI.create", ls, map[string]any{"name_label": "from a member's socket", "name_description": "",
		"SR": localSR, "virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false,
		"other_config": map[string]string{}, "xenstore_data": map[string]string{}, "sm_config": map[string]string{},
		"tags": []string{}}), &vdi); err != nil || !strings.HasPrefix(vdi, "OpaqueRef:") {
		t.Fatalf("VDI.create on the member's SR over its socket: %q %v", vdi, err)
	}
	if sr, err := c.CallString(ctx, p.Addr(0), "VDI.get_SR", s, vdi); err != nil || sr != localSR {
		t.Fatalf("the VDI's SR as the coordinator has it: %q %v", sr, err)
	}
	if err := json.Unmarshal(call("Async.pool.sync_database", ls), &task); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var status string
		_ = json.Unmarshal(call("task.get_status", ls, task), &status)
		if status == "success" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task status %s", status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
