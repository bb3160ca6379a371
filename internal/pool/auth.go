package pool

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/hashicorp/raft"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/pool/peerauth"
)

// How hosts authenticate each other (package peerauth): every intra-pool
// request is signed with the pool secret, never carries it; the receiver
// checks the signature, that the request was addressed to itself, and
// that it was not seen before, and proves in its answer that it holds the
// secret too. The sender believes no answer without that proof.
//
// The signature covers the identity a request runs as (headerIdentity),
// so that it cannot be changed on the way.

// errNoProof is a peer's answer that does not prove the peer holds the
// pool secret: not a host of the pool, whatever it answered.
var errNoProof = errors.New("pool: the peer did not prove it holds the pool secret")

// sign signs req, already addressed to a peer (toPeer) with its headers
// set, and returns what checking the answer's proof needs.
func (p *Pool) sign(req *http.Request) (nonce string, q peerauth.Request) {
	q = peerauth.Of(req, headerIdentity)
	return peerauth.Sign(req.Header, p.secrets.Current(), q, time.Now()), q
}

// proven reports whether resp, the answer to a request signed with nonce
// (sign), carries the peer's proof.
func (p *Pool) proven(resp *http.Response, nonce string, q peerauth.Request) bool {
	return peerauth.CheckProof(resp.Header, p.secrets.Valid(), nonce, q)
}

// verify checks a request from a peer and, when it passes, sets the
// proof on the answer's headers (before anything is written).
func (p *Pool) verify(w http.ResponseWriter, r *http.Request) error {
	q := peerauth.Of(r, headerIdentity)
	self := func(host string) bool { return p.isSelf(host) || peerauth.LocalHost(r, host) }
	secret, nonce, err := p.auth.Verify(r.Header, p.secrets.Valid(), q, self, time.Now())
	if err != nil {
		p.log.Warn("refused an intra-pool request", "from", r.RemoteAddr, "path", r.URL.Path, "err", err)
		return err
	}
	p.noteSource(r)
	peerauth.Prove(w.Header(), secret, nonce, q)
	return nil
}

// isSelf reports whether an address names this host: the address it
// advertises now or advertised at start.
func (p *Pool) isSelf(host string) bool {
	return peerauth.SameAddr(host, p.Advertised()) || peerauth.SameAddr(host, p.cfg.Advertise)
}

// signingTransport is the pool client's transport: it signs each request
// and refuses an answer without the peer's proof.
type signingTransport struct {
	p    *Pool
	base http.RoundTripper
}

func (t *signingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	nonce, q := t.p.sign(r)
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if !t.p.proven(resp, nonce, q) {
		_ = resp.Body.Close()
		t.p.log.Warn("an intra-pool answer without the peer's proof", "host", q.Host, "path", req.URL.Path, "status", resp.Status)
		return nil, errNoProof
	}
	return resp, nil
}

// peerAddrs is the set of the pool's other hosts' IP addresses, as last
// computed, and when.
type peerAddrs struct {
	at  time.Time
	ips map[netip.Addr]bool
}

// peerAddrsTTL is how long a computed set of peer addresses is used.
const peerAddrsTTL = 2 * time.Second

// IsPeer reports whether ip is the address of another host of this pool
// (raft's configuration, or a host row's address) or the source address
// of a request that proved the pool secret lately (peersource.go): the
// connection guard's test for a peer's own connection budget. A host
// that joins or moves is known within peerAddrsTTL.
func (p *Pool) IsPeer(ip netip.Addr) bool {
	cur := p.peerIPs.Load()
	if cur == nil || time.Since(cur.at) > peerAddrsTTL {
		cur = &peerAddrs{at: time.Now(), ips: p.computePeerIPs()}
		p.peerIPs.Store(cur)
	}
	return cur.ips[ip] || p.sources.has(ip, time.Now())
}

func (p *Pool) computePeerIPs() map[netip.Addr]bool {
	ips := map[netip.Addr]bool{}
	add := func(hostport string) {
		host, _, err := net.SplitHostPort(hostport)
		if err != nil {
			host = hostport
		}
		if a, err := netip.ParseAddr(host); err == nil {
			ips[a.Unmap()] = true
		}
	}
	for _, s := range p.raftServers() {
		if string(s.ID) != p.cfg.HostUUID {
			add(string(s.Address))
		}
	}
	if len(ips) == 0 {
		return ips // a host alone has no peers
	}
	for _, h := range p.cfg.Server.DB.Snapshot().All(dm.Host.Class) {
		if h.UUID() != p.cfg.HostUUID {
			add(h.String(dm.Host.Address))
		}
	}
	return ips
}

// raftServers is raft's configuration now: none on a host alone, or when
// raft cannot say.
func (p *Pool) raftServers() []raft.Server {
	rf := p.cfg.Repl.Raft()
	if rf == nil {
		return nil
	}
	f := rf.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	return f.Configuration().Servers
}
