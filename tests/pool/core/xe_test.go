package core

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// xe, the thin CLI, joins a host to a pool (pool-join against the joiner,
// with a password) and lists the pool's hosts on the coordinator; on the
// member's local socket (no password) it reaches the coordinator.
func TestXePoolJoin(t *testing.T) {
	ctx := suite.Ctx(t)
	if !pooltest.DaemonHasFlag(t, "--advertise") {
		t.Skip("toolstackd has no --advertise flag")
	}
	xe := testdaemon.BuildCommand(t, "xe", "XE_BIN")
	p := pooltest.Start(t, pooltest.Options{Hosts: 2, Proxy: true})
	run := func(env []string, args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, xe, args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("xe %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	remote := func(i int, args ...string) string {
		host, port, _ := net.SplitHostPort(p.Addr(i))
		return run(nil, append([]string{"-s", host, "-p", port, "-u", "root", "-pw", p.Password()}, args...)...)
	}
	coordinator, _, _ := net.SplitHostPort(p.Advertised(0))
	remote(1, "pool-join", "master-address="+coordinator, "master-username=root", "master-password="+p.Password())
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(remote(0, "host-list", "--minimal"), ","); got != 1 {
		t.Fatalf("xe host-list on the coordinator: %d commas, want 1 (two hosts)", got)
	}
	// Over the member's local socket, without a password.
	pool := strings.TrimSpace(remote(0, "pool-list", "--minimal"))
	run([]string{"TOOLSTACKD_DATA_DIR=" + p.Hosts[1].DataDir}, "pool-param-set", "uuid="+pool, "name-description=set with xe on a member")
	if got := strings.TrimSpace(remote(0, "pool-param-get", "uuid="+pool, "param-name=name-description")); got != "set with xe on a member" {
		t.Fatalf("the coordinator after xe on the member's socket: %q", got)
	}
}

// pool.join with a wrong password for the coordinator fails as a login
// does, and the host stays a pool of its own.
func TestJoinWrongPassword(t *testing.T) {
	ctx := suite.Ctx(t)
	p := pooltest.Start(t, pooltest.Options{Hosts: 2, Proxy: true})
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(1), "pool.join", s, p.Advertised(0), "root", "not the password")
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "SESSION_AUTHENTICATION_FAILED" {
		t.Fatalf("a join with a wrong password: %v", err)
	}
	if _, err := p.Login(ctx, c, 1); err != nil {
		t.Fatalf("the host after a failed join: %v", err)
	}
}
