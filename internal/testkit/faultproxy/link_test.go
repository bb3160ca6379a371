package faultproxy

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestLinkPartitionIsolateHeal puts a proxy in front of three echo
// "hosts" and checks which host can reach which after each fault.
func TestLinkPartitionIsolateHeal(t *testing.T) {
	noLeak(t)
	names := []string{"h1", "h2", "h3"}
	srcs := []netip.Addr{lo2, lo3, lo4}
	var members []Member
	for i, n := range names {
		echo := startEcho(t)
		members = append(members, Member{Name: n, Source: srcs[i], Listen: "127.0.0.1:0", Target: echo.addr()})
	}
	l, err := NewLink(members, Config{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// reach reports whether from can do a round trip to to within d.
	reach := func(from, to int, d time.Duration) bool {
		c := dialFrom(t, srcs[from], l.Addr(names[to]))
		defer c.Close()
		return roundTrip(c, []byte("hi"), d) == nil
	}
	check := func(what string, want [3][3]bool) {
		t.Helper()
		for i := range 3 {
			for j := range 3 {
				if i == j {
					continue
				}
				d := 2 * time.Second
				if !want[i][j] {
					d = 200 * time.Millisecond
				}
				if got := reach(i, j, d); got != want[i][j] {
					t.Errorf("%s: %s→%s reachable %v, want %v", what, names[i], names[j], got, want[i][j])
				}
			}
		}
	}
	all := [3][3]bool{{true, true, true}, {true, true, true}, {true, true, true}}
	check("start", all)

	if err := l.Partition([]string{"h1"}, []string{"h2", "h3"}); err != nil {
		t.Fatal(err)
	}
	check("h1 | h2 h3", [3][3]bool{{true, false, false}, {false, true, true}, {false, true, true}})
	// A client that is not a member still reaches every host.
	client := dialFrom(t, lo1, l.Addr("h1"))
	if err := roundTrip(client, []byte("client"), 2*time.Second); err != nil {
		t.Fatalf("non-member client cut by a partition: %v", err)
	}
	_ = client.Close()

	l.HealAll()
	check("healed", all)

	if err := l.Isolate("h3"); err != nil {
		t.Fatal(err)
	}
	check("h3 isolated", [3][3]bool{{true, true, false}, {true, true, false}, {false, false, true}})
	l.HealAll()

	if err := l.SetLink("h1", "h2", Blackhole()); err != nil {
		t.Fatal(err)
	}
	check("h1→h2 cut", [3][3]bool{{true, false, true}, {true, true, true}, {true, true, true}})
	l.HealAll()

	if err := l.SetLinks(Delay(20*time.Millisecond, 0)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !reach(0, 1, 2*time.Second) || time.Since(start) < 40*time.Millisecond {
		t.Errorf("SetLinks delay not applied (%v)", time.Since(start))
	}
	l.HealAll()

	// ResetHost breaks the connections into and out of one host only
	// (once the connections of the checks above have wound down).
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range names {
		for l.Proxy(n).Stats().Active != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	h1h2 := dialFrom(t, lo2, l.Addr("h2"))
	h3h1 := dialFrom(t, lo4, l.Addr("h1"))
	h2h3 := dialFrom(t, lo3, l.Addr("h3"))
	for _, c := range []net.Conn{h1h2, h3h1, h2h3} {
		if err := roundTrip(c, []byte("up"), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := l.ResetHost("h1"); n != 2 || err != nil {
		t.Fatalf("ResetHost(h1) = %d, %v", n, err)
	}
	for _, c := range []net.Conn{h1h2, h3h1} {
		if roundTrip(c, []byte("x"), 2*time.Second) == nil {
			t.Error("a connection of h1 survived ResetHost")
		}
	}
	if err := roundTrip(h2h3, []byte("still"), 2*time.Second); err != nil {
		t.Errorf("h2→h3 broken by ResetHost(h1): %v", err)
	}
	if n := l.ResetAll(); n != 1 {
		t.Errorf("ResetAll reset %d, want the 1 left", n)
	}
	if _, err := l.ResetHost("nope"); err == nil {
		t.Error("ResetHost of an unknown member")
	}

	for _, bad := range []func() error{
		func() error { return l.Partition([]string{"h1"}, []string{"nope"}) },
		func() error { return l.Partition([]string{"h1"}, []string{"h1"}) },
		func() error { return l.Isolate("nope") },
		func() error { return l.SetLink("h1", "h1", Blackhole()) },
		func() error { return l.SetLinks(Fault{Drop: 3}) },
	} {
		if bad() == nil {
			t.Error("bad link request accepted")
		}
	}
	if l.Proxy("nope") != nil || l.Addr("nope") != "" || len(l.Names()) != 3 {
		t.Error("lookups of unknown members")
	}
}

func TestNewLinkRejects(t *testing.T) {
	ok := Member{Name: "a", Source: lo2, Listen: "127.0.0.1:0", Target: "127.0.0.1:1"}
	for _, ms := range [][]Member{
		{{Source: lo2, Listen: "127.0.0.1:0", Target: "127.0.0.1:1"}},
		{ok, ok},
		{ok, {Name: "b", Source: lo2, Listen: "127.0.0.1:0", Target: "127.0.0.1:1"}},
		{{Name: "a", Listen: "127.0.0.1:0", Target: "127.0.0.1:1"}},
		{ok, {Name: "b", Source: lo3, Listen: "bad", Target: "127.0.0.1:1"}},
	} {
		if l, err := NewLink(ms, Config{}); err == nil {
			_ = l.Close()
			t.Errorf("NewLink(%+v) accepted", ms)
		}
	}
}
