package pool

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/pool/peerauth"
	"toolstackd/internal/xerr"
)

// Recovery of a pool that lost its quorum, in XenAPI's terms (raft's
// RecoverCluster underneath: Consul's peers.json procedure).
//
//   - pool.emergency_transition_to_master, on a surviving member: raft's
//     configuration is rewritten to this host alone, which elects itself
//     and coordinates the pool from what its replica holds (writes the
//     lost majority had and this host had not are gone: the price of
//     going on without a quorum, as with xapi's own emergency mode).
//   - pool.recover_slaves, on the new coordinator: every other host of
//     the database is told to drop its raft state and start again from
//     the coordinator's snapshot, and is added back; it returns those
//     that answered.
//   - pool.emergency_reset_master(address), on a member: the same from
//     the member's side, towards the coordinator at address.

const (
	rejoinPath = "/pool/rejoin" // a member starts again from the coordinator's snapshot
	readdPath  = "/pool/readd"  // the coordinator adds back a member that did
)

// member is how a host names itself to the coordinator.
type member struct {
	UUID    string `json:"uuid"`
	Address string `json:"address"`
}

// readMember reads a member message naming a host of the pool, or
// answers 400 (not the JSON expected) or 404 (no such host) and returns
// false.
func (p *Pool) readMember(w http.ResponseWriter, r *http.Request) (member, bool) {
	var m member
	if !readJSON(w, r, &m) {
		return m, false
	}
	if _, ok := p.cfg.Server.DB.Snapshot().ByUUID(dm.Host.Class, m.UUID); !ok {
		http.Error(w, "no such host in the pool", http.StatusNotFound)
		return m, false
	}
	return m, true
}

func (p *Pool) emergencyTransitionToMaster(c *api.Call, _ dm.PoolEmergencyTransitionToMasterArgs) (dm.Void, error) {
	if haEnabled(c.Snapshot()) {
		return dm.Void{}, xerr.New(xerr.HAIsEnabled) // as xapi: HA's own failover decides
	}
	p.joinMu.Lock()
	defer p.joinMu.Unlock()
	switch p.cfg.Repl.Mode() {
	case dbraft.Standalone, dbraft.Leader:
		return dm.Void{}, nil // already its own master
	}
	// Only when the coordinator is gone: while it answers, it goes on
	// accepting logins and writes, and taking over would make two
	// coordinators. pool.designate_new_master moves the role instead.
	if leader := p.cfg.Repl.LeaderAddr(); leader != "" && p.answers(c.Ctx, leader) {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed,
			"the pool's coordinator at "+leader+" is alive: pool.designate_new_master moves its role without two coordinators")
	}
	p.log.Warn("emergency transition to master: this host takes over the pool alone")
	p.stopRaft()
	trans, err := p.transport()
	if err != nil {
		return dm.Void{}, err
	}
	self := []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(p.cfg.HostUUID), Address: raft.ServerAddress(p.Advertised())}}
	err = p.cfg.Repl.Recover(p.startOptions(trans, false), self)
	_ = trans.Close()
	if err != nil {
		return dm.Void{}, fmt.Errorf("rewriting raft's configuration: %w", err)
	}
	if err := p.startRaft(false); err != nil {
		return dm.Void{}, err
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 30*time.Second)
	defer cancel()
	if err := p.cfg.Repl.WaitLeading(ctx); err != nil {
		return dm.Void{}, err
	}
	// Hosts that come back start from a snapshot of this host's state.
	return dm.Void{}, p.cfg.Repl.Compact()
}

func (p *Pool) recoverSlaves(c *api.Call, _ dm.PoolRecoverSlavesArgs) ([]dm.HostRef, error) {
	if p.cfg.Repl.Mode() != dbraft.Leader {
		return nil, xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	if err := p.cfg.Repl.Compact(); err != nil {
		return nil, err
	}
	in := map[string]bool{}
	if f := p.cfg.Repl.Raft().GetConfiguration(); f.Error() == nil {
		for _, s := range f.Configuration().Servers {
			in[string(s.ID)] = true
		}
	}
	recovered := []dm.HostRef{}
	for _, h := range c.Snapshot().All(dm.Host.Class) {
		if h.UUID() == p.cfg.HostUUID || in[h.UUID()] {
			continue
		}
		addr := net.JoinHostPort(h.String(dm.Host.Address), p.cfg.Port)
		ctx, cancel := context.WithTimeout(c.Ctx, 30*time.Second)
		err := p.notify(ctx, addr, rejoinPath, member{UUID: p.cfg.HostUUID, Address: p.Advertised()})
		cancel()
		if err == nil {
			err = p.readd(member{UUID: h.UUID(), Address: addr})
		}
		if err != nil {
			p.log.Warn("pool.recover_slaves: a host did not come back", "host", h.UUID(), "address", addr, "err", err)
			continue
		}
		recovered = append(recovered, dm.HostRef(h.Ref))
	}
	return recovered, nil
}

func (p *Pool) emergencyResetMaster(c *api.Call, a dm.PoolEmergencyResetMasterArgs) (dm.Void, error) {
	master, err := p.masterAddress(a.MasterAddress)
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	if haEnabled(snap) {
		return dm.Void{}, xerr.New(xerr.HAIsEnabled)
	}
	if m := p.cfg.Repl.Mode(); m != dbraft.Follower {
		// Dropping the raft state of a coordinator, or of a host alone,
		// would end its pool.
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "pool.emergency_reset_master runs on a member of a pool, and this host is its coordinator or alone")
	}
	// The new coordinator is one of this pool's hosts: this host sends
	// it its signed requests, and follows it. An address of anyone else
	// is refused before anything changes.
	if p.isSelf(master) || !p.knownMember(snap, master) {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "master_address", a.MasterAddress)
	}
	if err := p.rejoin(); err != nil {
		return dm.Void{}, err
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 60*time.Second)
	defer cancel()
	return dm.Void{}, p.notifyXen(ctx, master, readdPath, member{UUID: p.cfg.HostUUID, Address: p.Advertised()})
}

// haEnabled reports whether the pool has HA enabled.
func haEnabled(snap db.Reader) bool {
	for _, pool := range snap.All(dm.Pool.Class) {
		if on, _ := pool.Get(dm.Pool.HAEnabled).(bool); on {
			return true
		}
	}
	return false
}

// knownMember reports whether addr is the address of a host of this
// pool: in raft's configuration, or a host row's address with the pool's
// port.
func (p *Pool) knownMember(snap db.Reader, addr string) bool {
	for _, s := range p.raftServers() {
		if peerauth.SameAddr(string(s.Address), addr) {
			return true
		}
	}
	for _, h := range snap.All(dm.Host.Class) {
		if a := h.String(dm.Host.Address); a != "" && peerauth.SameAddr(net.JoinHostPort(a, p.cfg.Port), addr) {
			return true
		}
	}
	return false
}

// stopRaft stops raft, and what watches it, to start it again another
// way (a failure to stop cleanly is logged: raft is down either way).
func (p *Pool) stopRaft() {
	p.stopWatching()
	if err := p.cfg.Repl.Stop(); err != nil {
		p.log.Warn("stopping raft", "err", err)
	}
}

// rejoin drops this host's raft state and starts raft afresh: the
// coordinator's snapshot will replace its database.
func (p *Pool) rejoin() error {
	p.joinMu.Lock()
	defer p.joinMu.Unlock()
	p.stopRaft()
	if err := os.RemoveAll(p.raftDir()); err != nil {
		return err
	}
	p.cfg.Repl.Forget()
	return p.startRaft(false)
}

// readd adds back, on the coordinator, a host that dropped its raft state.
func (p *Pool) readd(m member) error {
	rf := p.cfg.Repl.Raft()
	if rf == nil || p.cfg.Repl.Mode() != dbraft.Leader {
		return xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	if err := p.cfg.Repl.Compact(); err != nil {
		return err
	}
	if err := rf.AddNonvoter(raft.ServerID(m.UUID), raft.ServerAddress(m.Address), 0, 30*time.Second).Error(); err != nil {
		return err
	}
	// A voter again once it has shown it is live and caught up
	// (voters.go): keepVoters checks it from now on.
	p.kickVoters()
	return nil
}

// serveRejoin: the coordinator tells this host to start again from its
// snapshot.
func (p *Pool) serveRejoin(w http.ResponseWriter, _ *http.Request) {
	answer(w, p.rejoin(), http.StatusInternalServerError)
}

// serveReadd: a member that started again asks to be added back.
func (p *Pool) serveReadd(w http.ResponseWriter, r *http.Request) {
	m, ok := p.readMember(w, r)
	if !ok {
		return
	}
	if _, _, err := net.SplitHostPort(m.Address); err != nil {
		http.Error(w, "bad address", http.StatusBadRequest)
		return
	}
	answer(w, p.readd(m), http.StatusConflict)
}
