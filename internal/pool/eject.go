package pool

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/xerr"
)

// leavePath: a host being ejected asks the coordinator to let it go.
const leavePath = "/pool/leave"

// eject is pool.eject. The route runs it on the host to be ejected, as
// xapi does: it asks the coordinator to take it out of raft and to remove
// its records (host, metrics, CPUs, PIFs, PBDs, its local SRs and their
// disks, the VMs resident on it, its pinned certificates), then starts
// afresh as a pool of its own (Config.Eject) once the call is answered,
// keeping root's password.
func (p *Pool) eject(c *api.Call, a dm.PoolEjectArgs) (dm.Void, error) {
	host, ok := c.Snapshot().Get(dm.Host.Class, string(a.Host))
	if !ok {
		return dm.Void{}, xerr.New(xerr.HandleInvalid, "host", string(a.Host))
	}
	switch {
	case p.cfg.Repl.Mode() == dbraft.Standalone:
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "this host is not in a pool")
	case p.cfg.Repl.Mode() == dbraft.Leader:
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "the coordinator cannot be ejected: designate another host first")
	case host.UUID() != p.cfg.HostUUID:
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "pool.eject runs on the host it ejects")
	}
	var rootHash string
	for _, u := range c.Snapshot().All(dm.User.Class) {
		if u.String(dm.User.ShortName) == "root" {
			rootHash = u.String(dm.User.PasswordHash)
		}
	}
	leader := p.cfg.Repl.LeaderAddr()
	if leader == "" {
		return dm.Void{}, xerr.New(xerr.CannotContactHost, "the coordinator")
	}
	ctx, cancel := context.WithTimeout(c.Ctx, 60*time.Second)
	defer cancel()
	if err := p.notifyXen(ctx, leader, leavePath, member{UUID: p.cfg.HostUUID, Address: p.Advertised()}); err != nil {
		return dm.Void{}, err
	}
	p.log.Info("ejected from the pool; starting afresh as a pool of its own")
	if p.cfg.Eject != nil {
		go func() {
			time.Sleep(200 * time.Millisecond) // let the answer go out first
			p.cfg.Eject(rootHash)
		}()
	}
	return dm.Void{}, nil
}

// serveLeave takes a host out of the pool, on the coordinator.
func (p *Pool) serveLeave(w http.ResponseWriter, r *http.Request) {
	var m member
	if readJSON(w, r, &m) {
		answer(w, p.removeHost(m.UUID), http.StatusConflict)
	}
}

// removeHost takes the host with uuid out of raft and removes its records
// (see eject), on the coordinator.
func (p *Pool) removeHost(uuid string) error {
	rf := p.cfg.Repl.Raft()
	if rf == nil || p.cfg.Repl.Mode() != dbraft.Leader {
		return xerr.New(xerr.HostIsSlave, p.Coordinator())
	}
	if uuid == p.cfg.HostUUID {
		return xerr.New(xerr.OperationNotAllowed, "the coordinator cannot leave its pool")
	}
	if err := rf.RemoveServer(raft.ServerID(uuid), 0, 30*time.Second).Error(); err != nil {
		return fmt.Errorf("removing the host from raft: %w", err)
	}
	if err := p.balanceVoters(); err != nil {
		p.log.Warn("could not rebalance the pool's voters", "err", err)
	}
	_, err := p.cfg.Server.DB.Update(func(tx *db.Tx) error {
		host, ok := tx.ByUUID(dm.Host.Class, uuid)
		if !ok {
			return nil
		}
		tx.Lenient = true
		return deleteAll(tx, hostRecords(tx, host, true))
	})
	return err
}

// deleteAll deletes rows (hostRecords lists each once).
func deleteAll(tx *db.Tx, rows []*db.Row) error {
	for _, r := range rows {
		if err := tx.Delete(r.Class, r.Ref); err != nil {
			return err
		}
	}
	return nil
}

// hostDestroy is host.destroy (xe host-forget): the coordinator forgets a
// host that is gone for good, taking it out of raft and removing its
// records as an eject does. A live host must be ejected instead
// (HOST_IS_LIVE); the coordinator cannot forget itself.
func (p *Pool) hostDestroy(c *api.Call, a dm.HostDestroyArgs) (dm.Void, error) {
	host, ok := c.Snapshot().Get(dm.Host.Class, string(a.Self))
	if !ok {
		return dm.Void{}, xerr.New(xerr.HandleInvalid, "host", string(a.Self))
	}
	if host.UUID() == p.cfg.HostUUID {
		return dm.Void{}, xerr.New(xerr.HostIsLive, string(a.Self))
	}
	if m, ok := c.Snapshot().Get(dm.HostMetrics.Class, host.String(dm.Host.Metrics)); ok && m.Get(dm.HostMetrics.Live) == true {
		return dm.Void{}, xerr.New(xerr.HostIsLive, string(a.Self))
	}
	if p.cfg.Repl.Mode() == dbraft.Standalone {
		// Not in a pool: nothing but the record to forget.
		_, err := p.cfg.Server.DB.Update(func(tx *db.Tx) error {
			tx.Lenient = true
			return deleteAll(tx, hostRecords(tx, host, true))
		})
		return dm.Void{}, err
	}
	return dm.Void{}, p.removeHost(host.UUID())
}
