package api

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The per-client failure table stays within its bound however many
// addresses fail, and IPv6 clients are counted per /64.
func TestAuthGuardIsBounded(t *testing.T) {
	l := DefaultAuthLimits()
	l.MaxClients, l.FailureDelay = 64, 0
	g := newAuthGuard(l)
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		o := Origin{Remote: fmt.Sprintf("10.0.%d.%d:4000", i/256, i%256)}
		if err := g.check(ctx, o, "root", "", "x", 1); err == nil {
			t.Fatal("unknown user accepted")
		}
	}
	if n, m := len(g.clients), g.lru.Len(); n > 64 || m != n {
		t.Errorf("clients %d, lru %d", n, m)
	}
	for _, c := range []struct{ remote, key string }{
		{"[2001:db8:1:2:3:4:5:6]:80", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:81", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},
		{"192.0.2.1:9", "192.0.2.1"},
		{"", "?"},
	} {
		if k := clientKey(c.remote); k != c.key {
			t.Errorf("clientKey(%q) = %q, want %q", c.remote, k, c.key)
		}
	}
	// A client refused while backing off is refused before any hashing.
	l = DefaultAuthLimits()
	l.FailureDelay, l.FailuresBeforeRefusal, l.RefusalPeriod = 0, 2, time.Minute
	g = newAuthGuard(l)
	o := Origin{Remote: "192.0.2.7:1"}
	g.check(ctx, o, "root", "", "x", 1)
	g.check(ctx, o, "root", "", "x", 1)
	// A well-formed hash that would take seconds to check.
	slow := "pbkdf2-sha256$9000000$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	if !wellFormedHash(slow) {
		t.Fatal("test hash not well formed")
	}
	start := time.Now()
	if err := g.check(ctx, o, "root", slow, "right", 1); err == nil {
		t.Fatal("accepted while refused")
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("refusal took %v: the password was hashed", d)
	}
}
