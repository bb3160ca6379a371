package pool

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/xerr"
)

// A host's intra-pool address changes when its management interface
// moves (host.management_reconfigure): the daemon first serves on the new
// address as well as the old, then calls Readdress, then closes the old
// listener.
//
//   - On a member, Readdress asks the coordinator (POST /pool/address,
//     with the pool secret) to put the new address in raft's
//     configuration. Raft's AddNonvoter with the host's own ID and a new
//     address replaces the address and keeps the server's suffrage: the
//     coordinator's replication to the member (heartbeats, hence
//     liveness) and every forwarded call (addressOf reads the
//     configuration) go to the new address from the next message on.
//   - On the coordinator, it makes the same change itself. Members find
//     the coordinator by its address in the configuration (see
//     dbraft.Replicator.LeaderAddr), since the address raft puts in its
//     own messages is the one it started with.
//   - On a host alone there is no one to tell.
//
// Either way the host's own advertised address (Advertised: what it
// names itself by in pool.join, pool.eject and recovery, and what raft
// starts with next) becomes the new one.

// addressPath takes a member's new intra-pool address on the coordinator.
const addressPath = "/pool/address"

// readdressTimeout bounds the configuration change on the coordinator.
const readdressTimeout = 30 * time.Second

// Advertised is the address ("ip:port") other hosts of the pool reach
// this one at now.
func (p *Pool) Advertised() string { return *p.advertise.Load() }

// Readdress makes addr ("ip:port") this host's intra-pool address, in
// raft's configuration and in what it names itself by. The host must
// already answer at addr. A member that cannot reach its coordinator gets
// CANNOT_CONTACT_HOST and keeps its old address.
func (p *Pool) Readdress(ctx context.Context, addr string) error {
	if err := checkAddress(addr); err != nil {
		return xerr.New(xerr.InternalError, "pool: new address: "+err.Error())
	}
	p.joinMu.Lock()
	defer p.joinMu.Unlock()
	if addr == p.Advertised() {
		return nil
	}
	self := member{UUID: p.cfg.HostUUID, Address: addr}
	switch p.cfg.Repl.Mode() {
	case dbraft.Standalone:
	case dbraft.Leader:
		if err := p.setRaftAddress(self); err != nil {
			return xerr.New(xerr.InternalError, "pool: changing this host's address in raft: "+err.Error())
		}
	default:
		wctx, cancel := context.WithTimeout(ctx, readdressTimeout)
		defer cancel()
		leader, err := p.cfg.Repl.WaitLeader(wctx)
		if err != nil {
			return xerr.New(xerr.CannotContactHost, "the pool's coordinator")
		}
		if err := p.notifyXen(wctx, leader, addressPath, self); err != nil {
			return err
		}
	}
	p.advertise.Store(&addr)
	p.lcfg.Advertise = addr // raft's next start (under joinMu, as every start)
	p.log.Info("this host's intra-pool address changed", "address", addr)
	return nil
}

func checkAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		return fmt.Errorf("%q is not an address a peer can reach", host)
	}
	if port == "" || port == "0" {
		return fmt.Errorf("%q has no port", addr)
	}
	return nil
}

// errNotInRaft: the host named is not a server of the pool's raft.
var errNotInRaft = errors.New("the host is not in raft's configuration")

// setRaftAddress replaces a server's address in raft's configuration, on
// the coordinator, keeping its suffrage.
func (p *Pool) setRaftAddress(m member) error {
	rf := p.cfg.Repl.Raft()
	if rf == nil || p.cfg.Repl.Mode() != dbraft.Leader {
		return dbraft.ErrNotLeader
	}
	f := rf.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	for _, s := range f.Configuration().Servers {
		if s.ID != raft.ServerID(m.UUID) {
			continue
		}
		if s.Address == raft.ServerAddress(m.Address) {
			return nil
		}
		// AddNonvoter on a voter changes its address only (hashicorp/raft's
		// nextConfiguration), as AddVoter would; on a non-voter likewise.
		return rf.AddNonvoter(s.ID, raft.ServerAddress(m.Address), 0, readdressTimeout).Error()
	}
	return errNotInRaft
}

// serveAddress: a member moved its management address.
func (p *Pool) serveAddress(w http.ResponseWriter, r *http.Request) {
	m, ok := p.readMember(w, r)
	if !ok {
		return
	}
	if err := checkAddress(m.Address); err != nil {
		http.Error(w, "bad address: "+err.Error(), http.StatusBadRequest)
		return
	}
	err := p.setRaftAddress(m)
	switch {
	case err == nil:
		p.log.Info("a member's intra-pool address changed", "host", m.UUID, "address", m.Address)
		w.WriteHeader(http.StatusOK)
	case errors.Is(err, errNotInRaft):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errors.Is(err, dbraft.ErrNotLeader), errors.Is(err, raft.ErrNotLeader):
		http.Error(w, err.Error(), http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// CutOff reports whether this host is a pool member that knows no
// coordinator (xapi's slave emergency mode: host.local_management_reconfigure
// is for it).
func (p *Pool) CutOff() bool { return p.Member() && p.cfg.Repl.LeaderAddr() == "" }
