package poolfarm

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/testkit/testdaemon"
)

func TestOptionsRefused(t *testing.T) {
	for name, o := range map[string]Options{
		"no hosts":       {Coordinator: "127.0.0.2:1", Port: 1},
		"too many hosts": {Coordinator: "127.0.0.2:1", Port: 1, Hosts: MaxHosts + 1},
		"no coordinator": {Port: 1, Hosts: 1},
		"bad port":       {Coordinator: "127.0.0.2:1", Port: 70000, Hosts: 1},
		"not loopback":   {Coordinator: "127.0.0.2:1", Port: 1, Hosts: 1, Base: netip.MustParseAddr("10.0.0.1")},
		"past the /24":   {Coordinator: "127.0.0.2:1", Port: 1, Hosts: 10, Base: netip.MustParseAddr("127.0.2.250")},
	} {
		if f, err := New(o); err == nil {
			_ = f.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

// A light host that has not joined refuses raft's upgrade (it holds no
// pool secret), answers anything else 503, and a join its coordinator
// does not answer fails with a clear error; Close stops every listener.
func TestUnjoinedHost(t *testing.T) {
	base := netip.MustParseAddr("127.0.3.2")
	port := testdaemon.FreePort(t, "127.0.3.2", "127.0.3.3", "127.0.3.4")
	f, err := New(Options{Coordinator: testdaemon.Addr("127.0.3.4", port), Port: port, Hosts: 2, Base: base,
		Username: "root", Password: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if got := f.Hosts[1].Addr; got != testdaemon.Addr("127.0.3.3", port) {
		t.Fatalf("host 1 at %s", got)
	}
	l, err := raftnet.NewStreamLayer(raftnet.Config{Advertise: "127.0.0.1:1", Secrets: func() []string { return []string{"guess"} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.DialContext(ctx, f.Hosts[0].Addr); !errors.Is(err, raftnet.ErrBadSecret) {
		t.Fatalf("raft upgrade with a wrong secret: %v", err)
	}
	resp, err := http.Post("http://"+f.Hosts[0].Addr+"/pool/call", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/pool/call: %s", resp.Status)
	}
	// Nobody listens at the coordinator's address.
	err = f.Hosts[0].Join(ctx)
	if err == nil || !strings.Contains(err.Error(), "cannot reach the coordinator") {
		t.Fatalf("join with no coordinator: %v", err)
	}
	if f.Hosts[0].Joined() || f.Hosts[0].AppliedIndex() != 0 {
		t.Fatal("a failed join left raft running")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", f.Hosts[0].Addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatal("a closed farm still accepts connections")
	}
}
