package core

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// A pool that lost its quorum (the coordinator and one member killed)
// goes on from the surviving member: pool.emergency_transition_to_master
// there, then pool.recover_slaves brings the others back, from its state.
func TestEmergencyTransitionAndRecoverSlaves(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.sync_database", s); err != nil {
		t.Fatal(err)
	}
	p.Kill(0)
	p.Kill(1)
	// Host 2 alone has no quorum: no coordinator to send clients to.
	local, err := p.LocalLogin(ctx, c, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, p.Addr(2), "pool.emergency_transition_to_master", local); err != nil {
		t.Fatal(err)
	}
	s2, err := p.Login(ctx, c, 2)
	if err != nil {
		t.Fatalf("login on the new master: %v", err)
	}
	if got, err := c.CallString(ctx, p.Addr(2), "pool.get_name_description", s2, pool); err != nil || got != "before" {
		t.Fatalf("the new master's state: %q, %v", got, err)
	}
	if _, err := c.Call(ctx, p.Addr(2), "pool.set_name_description", s2, pool, "after"); err != nil {
		t.Fatalf("a write on the new master: %v", err)
	}
	// The others come back (with their old idea of the pool) and are
	// brought into the new one.
	p.Restart(0)
	p.Restart(1)
	raw, err := c.Call(ctx, p.Addr(2), "pool.recover_slaves", s2)
	var back []string
	if err != nil || json.Unmarshal(raw, &back) != nil || len(back) != 2 {
		t.Fatalf("pool.recover_slaves: %s %v", raw, err)
	}
	for _, i := range []int{0, 1} {
		suite.WaitReplica(t, ctx, c, p, i, pool, "after", 30*time.Second)
		_, err := p.Login(ctx, c, i)
		if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_SLAVE" || p.IndexOf(e.Params[0]) != 2 {
			t.Fatalf("login on host %d after recover_slaves: %v", i, err)
		}
	}
}

// pool.rotate_secret gives every host a new secret, the old one stops
// working, and the pool goes on: a write reaches every replica and a call
// runs on a member.
func TestRotateSecret(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	read := func(i int) string {
		b, err := os.ReadFile(filepath.Join(p.Hosts[i].DataDir, "pool-secret"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := read(1)
	if _, err := c.Call(ctx, p.Addr(0), "pool.rotate_secret", s); err != nil {
		t.Fatal(err)
	}
	after := read(0)
	for i := range p.Len() {
		if got := read(i); got != after || got == before {
			t.Fatalf("host %d's secret file after the rotation: %q (before %q, coordinator %q)", i, got, before, after)
		}
	}
	// The old secret opens nothing.
	old := strings.TrimSpace(strings.SplitN(before, "\n", 2)[0])
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr(1)+"/pool/db", strings.NewReader("x"))
	suite.SignPeerRequest(req, old)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the old secret got %s", resp.Status)
	}
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "rotated"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < p.Len(); i++ {
		suite.WaitReplica(t, ctx, c, p, i, pool, "rotated", 10*time.Second)
	}
}

// pool.eject: the host leaves raft and the pool's records, and answers as
// a pool of its own within 60 s, with the pool's root password; the pool
// goes on without it.
func TestEject(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	if _, err := c.Call(ctx, p.Addr(0), "pool.eject", s, suite.HostRefs(t, ctx, c, p, 0, s)[2]); err != nil {
		t.Fatal(err)
	}
	// The pool lists two hosts.
	if left := suite.HostRefs(t, ctx, c, p, 0, s); len(left) != 2 {
		t.Fatalf("hosts after the eject: %v", left)
	}
	// The ejected host answers as a pool of its own, same password.
	deadline := time.Now().Add(60 * time.Second)
	for {
		s2, err := p.Login(ctx, c, 2)
		if err == nil {
			var raw []byte
			raw, err = c.Call(ctx, p.Addr(2), "host.get_all", s2)
			var own []string
			if err == nil && json.Unmarshal(raw, &own) == nil && len(own) == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ejected host 60 s later: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The pool goes on: a write, replicated to the member left.
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "two hosts"); err != nil {
		t.Fatal(err)
	}
	suite.WaitReplica(t, ctx, c, p, 1, pool, "two hosts", 10*time.Second)
}

// host.destroy (xe host-forget) forgets a dead member: it leaves the
// pool's records; a live host is refused (HOST_IS_LIVE).
func TestForgetDeadHost(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	refs := suite.HostRefs(t, ctx, c, p, 0, s)
	_, err := c.Call(ctx, p.Addr(0), "host.destroy", s, refs[1])
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_LIVE" {
		t.Fatalf("forgetting a live host: %v", err)
	}
	p.Kill(2)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = c.Call(ctx, p.Addr(0), "host.destroy", s, refs[2])
		if err == nil {
			break
		}
		if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_LIVE" || time.Now().After(deadline) {
			t.Fatalf("forgetting a dead host: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if left := suite.HostRefs(t, ctx, c, p, 0, s); len(left) != 2 {
		t.Fatalf("hosts after host.destroy: %v", left)
	}
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "two left"); err != nil {
		t.Fatal(err)
	}
	suite.WaitReplica(t, ctx, c, p, 1, pool, "two left", 10*time.Second)
}

// Two hosts and a witness (--witness: a voter that never runs VMs): VMs
// are placed on the two hosts only, and the pool fails over on its own
// to the other host when the coordinator dies (a witness elected hands
// the pool on).
func TestWitness(t *testing.T) {
	ctx := suite.Ctx(t)
	p := pooltest.Start(t, pooltest.Options{Hosts: 3, Proxy: true, HostArgs: map[int][]string{2: {"--witness"}}})
	for i := 1; i < p.Len(); i++ {
		if err := p.JoinOne(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	refs := suite.HostRefs(t, ctx, c, p, 0, s)
	for n := range 4 {
		vm, err := c.CallString(ctx, p.Addr(0), "VM.create", s, testdaemon.VMRecord(fmt.Sprint("placed-", n)))
		if err == nil {
			_, err = c.Call(ctx, p.Addr(0), "VM.start", s, vm, false, false)
		}
		if err != nil {
			t.Fatal(err)
		}
		if on, err := c.CallString(ctx, p.Addr(0), "VM.get_resident_on", s, vm); err != nil || on == refs[2] {
			t.Fatalf("VM %d placed on %q (the witness is %s): %v", n, on, refs[2], err)
		}
	}
	p.Kill(0)
	start := time.Now()
	for {
		i, _, err := p.FindCoordinator(ctx, c)
		if err == nil && i == 1 {
			t.Logf("host %d coordinates %v after the kill", i, time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no coordinator 30 s after the kill: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
