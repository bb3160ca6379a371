package pool

import (
	"net/http"
	"net/netip"
	"sync"
	"time"

	"toolstackd/internal/netguard"
)

// Peers' source addresses. The connection guard gives the pool's other
// hosts a connection budget of their own (IsPeer), and it can only tell a
// peer by the source address of a connection, before any byte is read.
// The addresses the pool knows a host by (its host row, raft's
// configuration) are where the host is reached, which is not always where
// its own connections come from: a host that advertises the address of a
// port-forwarding proxy or of a NAT in front of it, a host with several
// addresses whose kernel picks another source on the route to a peer, or
// a host listening on every address. Those hosts would count as clients,
// and a client flood would cut them off.
//
// So a host also remembers the source address of every request that
// proved the pool secret (a signed intra-pool request, a raft upgrade),
// and counts it as a peer's for sourceTTL after the last one. Only a
// holder of the secret adds an address; at most maxSources are kept, the
// least recently seen forgotten first. Clients sharing a source address
// with a peer (behind the same NAT) share the peer's budget too, as they
// would if that address were the peer's own. The connection such a
// request came on moves to the peers' budget too (netguard.Peer).

const (
	// sourceTTL is how long a source address counts as a peer's after
	// its last authenticated request: long enough to cover a pool
	// without HA, whose members may send the coordinator nothing for
	// many minutes (raft's traffic rides connections the coordinator
	// opened), short enough that an address a host gave up stops
	// counting within the hour.
	sourceTTL = time.Hour
	// maxSources bounds the addresses remembered.
	maxSources = 256
)

// sourceBook is the set of source addresses that carried authenticated
// pool requests, with when each last did. The zero value is ready.
type sourceBook struct {
	mu   sync.Mutex
	seen map[netip.Addr]time.Time
}

// note records that ip carried an authenticated request at now.
func (b *sourceBook) note(ip netip.Addr, now time.Time) {
	if !ip.IsValid() {
		return
	}
	ip = ip.Unmap()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = map[netip.Addr]time.Time{}
	}
	if _, ok := b.seen[ip]; !ok && len(b.seen) >= maxSources {
		var oldest netip.Addr
		var at time.Time
		for a, t := range b.seen {
			if !oldest.IsValid() || t.Before(at) {
				oldest, at = a, t
			}
		}
		delete(b.seen, oldest)
	}
	b.seen[ip] = now
}

// has reports whether ip carried an authenticated request within
// sourceTTL before now.
func (b *sourceBook) has(ip netip.Addr, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.seen[ip.Unmap()]
	return ok && now.Sub(t) < sourceTTL
}

// noteSource records the source address of r, a request whose signature
// was accepted (a request over the local socket has none), and moves the
// connection it came on to the peers' budget: one accepted before its
// address was known as a peer's would otherwise stay among the clients'
// and be closed as idle to make room for them, under a call the peer is
// about to send on it.
func (p *Pool) noteSource(r *http.Request) {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		p.sources.note(ap.Addr(), time.Now())
	}
	netguard.Peer(r.Context())
}
