package pool

import (
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// A source address counts as a peer's for sourceTTL after its last
// authenticated request, an IPv4-mapped address as its IPv4 one, and the
// book forgets the least recently seen address once full.
func TestSourceBook(t *testing.T) {
	var b sourceBook
	now := time.Unix(1_000_000, 0)
	a := netip.MustParseAddr("192.0.2.7")
	if b.has(a, now) {
		t.Fatal("an empty book has an address")
	}
	b.note(netip.MustParseAddr("::ffff:192.0.2.7"), now)
	if !b.has(a, now.Add(sourceTTL-time.Second)) {
		t.Fatal("a mapped address is not its IPv4 one")
	}
	if b.has(a, now.Add(sourceTTL)) {
		t.Fatal("an address counts after sourceTTL")
	}
	b.note(a, now.Add(time.Minute)) // seen again: counts from then on
	if !b.has(a, now.Add(sourceTTL)) {
		t.Fatal("a new request does not renew an address")
	}
	b.note(netip.Addr{}, now) // no address: nothing
	for i := range maxSources {
		b.note(netip.AddrFrom4([4]byte{198, 51, byte(i >> 8), byte(i)}), now.Add(2*time.Minute+time.Duration(i)))
	}
	if b.has(a, now.Add(3*time.Minute)) {
		t.Fatal("a full book kept its least recently seen address")
	}
	if n := len(b.seen); n != maxSources {
		t.Fatalf("%d addresses kept, want %d", n, maxSources)
	}
}

// noteSource takes a request's remote address; one without (the local
// socket's) adds nothing.
func TestNoteSource(t *testing.T) {
	p := &Pool{}
	r := httptest.NewRequest("POST", "/pool/ping", nil)
	r.RemoteAddr = "127.0.0.3:40000"
	p.noteSource(r)
	r.RemoteAddr = "@"
	p.noteSource(r)
	if !p.sources.has(netip.MustParseAddr("127.0.0.3"), time.Now()) || len(p.sources.seen) != 1 {
		t.Fatalf("sources after two requests: %v", p.sources.seen)
	}
}
