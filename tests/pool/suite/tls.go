package suite

import (
	"context"
	"net/netip"
	"testing"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// TLSPool runs n hosts, each with --listen-https on its own 127.0.0.N and
// one HTTPS port for all, and joins every other host to host 0 by its IP
// alone (pool.join's port is then the joiner's own pool port: HTTPS). It
// returns the pool and the HTTPS port.
func TLSPool(t *testing.T, ctx context.Context, n int) (*pooltest.Pool, int) {
	t.Helper()
	if !pooltest.DaemonHasFlag(t, "--listen-https") || !pooltest.DaemonHasFlag(t, "--advertise") {
		t.Skip("toolstackd has no --listen-https or no pool support")
	}
	ips := make([]string, n)
	for i := range ips {
		ips[i] = pooltest.HostIP(i).String()
	}
	port := testdaemon.FreePort(t, ips...)
	args := map[int][]string{}
	for i, ip := range ips {
		args[i] = []string{"--listen-https", testdaemon.Addr(ip, port)}
	}
	p := pooltest.Start(t, pooltest.Options{Hosts: n, HostArgs: args})
	if p.Port == port {
		t.Fatalf("the HTTP and HTTPS ports are both %d", port)
	}
	c := pooltest.NewClient(netip.Addr{})
	c.Timeout = pooltest.DefaultJoinTimeout
	for i := 1; i < n; i++ {
		s, err := p.Login(ctx, c, i)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, p.Addr(i), "pool.join", s, ips[0], "root", p.Password()); err != nil {
			t.Fatalf("host %d joining %s over TLS: %v\n%s", i, ips[0], err, p.Hosts[i].LogTail(30))
		}
	}
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, n); err != nil {
		t.Fatalf("joined hosts within %v: %v", pooltest.LiveTimeout, err)
	}
	return p, port
}
