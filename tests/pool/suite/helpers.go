package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
)

// JoinedPool starts three hosts joined into a pool (startPool), with a
// client and a root session on the coordinator, host 0.
func JoinedPool(t *testing.T) (context.Context, *pooltest.Pool, *pooltest.Client, string) {
	t.Helper()
	ctx := Ctx(t)
	p := StartPool(t, ctx)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, p, c, s
}

// HostRefs maps host index to host ref, by the address the pool reaches
// each host at, through the session s on host at.
func HostRefs(t *testing.T, ctx context.Context, c *pooltest.Client, p *pooltest.Pool, at int, s string) map[int]string {
	t.Helper()
	var hosts []string
	raw, err := c.Call(ctx, p.Addr(at), "host.get_all", s)
	if err != nil || json.Unmarshal(raw, &hosts) != nil {
		t.Fatalf("host.get_all: %s %v", raw, err)
	}
	refs := map[int]string{}
	for _, h := range hosts {
		a, err := c.CallString(ctx, p.Addr(at), "host.get_address", s, h)
		if err != nil {
			t.Fatal(err)
		}
		refs[p.IndexOf(a)] = h
	}
	return refs
}

// PoolRef is the pool's ref, through the session s on host at.
func PoolRef(t *testing.T, ctx context.Context, c *pooltest.Client, p *pooltest.Pool, at int, s string) string {
	t.Helper()
	var pools []string
	raw, err := c.Call(ctx, p.Addr(at), "pool.get_all", s)
	if err != nil || json.Unmarshal(raw, &pools) != nil || len(pools) != 1 {
		t.Fatalf("pool.get_all: %s %v", raw, err)
	}
	return pools[0]
}

// WaitReplica waits until host i's own replica (a slave-local session)
// holds want as the pool's name_description.
func WaitReplica(t *testing.T, ctx context.Context, c *pooltest.Client, p *pooltest.Pool, i int, pool, want string, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		ls, err := p.LocalLogin(ctx, c, i)
		var got string
		if err == nil {
			got, err = c.CallString(ctx, p.Addr(i), "pool.get_name_description", ls, pool)
		}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %d's replica after %v: %q (want %q), %v", i, bound, got, want, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Joined starts the hosts o asks for (without fault proxies unless o says
// so), joins them to the first and logs in there: calls through the
// first host, and the hosts' refs by index.
func Joined(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, RPC, map[int]string) {
	t.Helper()
	p := pooltest.Start(t, o)
	p.Join(t)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p, RPC{t, ctx, c, p.Addr(0), s}, HostRefs(t, ctx, c, p, 0, s)
}

// SocketCaller makes JSON-RPC calls over a host's local superuser socket
// (as xe on that host does), failing the test on an error.
func SocketCaller(t *testing.T, sock string) func(method string, params ...any) json.RawMessage {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	t.Cleanup(hc.CloseIdleConnections)
	return func(method string, params ...any) json.RawMessage {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		resp, err := hc.Post("http://localhost/jsonrpc", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Result json.RawMessage
			Error  *struct {
				Message string
				Data    []any
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Error != nil {
			t.Fatalf("%s over %s: %v %+v", method, sock, err, out.Error)
		}
		return out.Result
	}
}

// Account makes a local account on the pool r talks to and logs it
// in over the network: user.create as root, its password set over the
// host's local socket (where any name is the local superuser, so
// session.change_password needs no old password), its subject with the
// one role given. It returns the account's session.
func Account(t *testing.T, r RPC, sock, name, pw, role string) string {
	t.Helper()
	r.Str("user.create", map[string]any{"short_name": name, "fullname": name, "other_config": map[string]string{}})
	local := SocketCaller(t, sock)
	var s string
	if err := json.Unmarshal(local("session.login_with_password", name, "", "1.0", "suite-account"), &s); err != nil {
		t.Fatal(err)
	}
	local("session.change_password", s, "", pw)
	local("session.logout", s)
	var roles []string
	if err := json.Unmarshal(r.Call("role.get_by_name_label", role), &roles); err != nil || len(roles) != 1 {
		t.Fatalf("role %s: %v %v", role, roles, err)
	}
	r.Str("subject.create", map[string]any{"subject_identifier": "local:" + name, "other_config": map[string]string{},
		"roles": roles})
	sess, err := r.C.CallString(r.Ctx, r.At, "session.login_with_password", name, pw, "1.0", "suite-account")
	if err != nil {
		t.Fatalf("login as %s (%s): %v", name, role, err)
	}
	return sess
}
