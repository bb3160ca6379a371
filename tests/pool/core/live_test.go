package core

import (
	"context"
	"testing"
	"time"

	"toolstackd/internal/testkit/faultproxy"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/tests/pool/suite"
)

// A coordinator records a member as not live and dies before it sees the
// member again. The next coordinator's heartbeats to that member never
// fail, so raft never reports a resumption to it: only its own check of
// the members recorded as not live can put the record right.
func TestLivenessOutlivesCoordinator(t *testing.T) {
	ctx := suite.Ctx(t)
	p := suite.StartPool(t, ctx)
	c := p.Coordinator(t, 20*time.Second)
	m, o := (c+1)%3, (c+2)%3
	// Every connection from the coordinator to m breaks at once.
	if err := p.Link.SetLink(pooltest.Name(c), pooltest.Name(m), faultproxy.Drop(1)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := p.WaitNotLive(wctx, m)
	cancel()
	if err != nil {
		t.Fatalf("host %d cut off from coordinator %d: %v", m, c, err)
	}
	// The coordinator dies; m cannot reach o, so only o can win the
	// election, and o reaches m from its first heartbeat.
	if err := p.Link.SetLink(pooltest.Name(m), pooltest.Name(o), faultproxy.Drop(1)); err != nil {
		t.Fatal(err)
	}
	p.Kill(c)
	if got := p.Coordinator(t, 20*time.Second); got != o {
		t.Fatalf("host %d is the coordinator, want %d", got, o)
	}
	p.Link.HealAll()
	p.Restart(c)
	lctx, cancel2 := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel2()
	if err := p.WaitLive(lctx, p.Len()); err != nil {
		t.Fatalf("after the coordinator changed: %v", err)
	}
}
