package pool

import (
	"context"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/dbraft"
)

// Liveness: the coordinator's raft sends every member a heartbeat several
// times a second; raft reports a member whose heartbeats fail (refused,
// reset, or unanswered for the transport's timeout, 10 s) and one whose
// heartbeats resume. The coordinator writes what it sees into
// host_metrics.live. A host that stops answering is not live within the
// transport timeout and raft's retry back-off (about 15 s); its VMs'
// records are left as they are.
//
// One failed heartbeat is not enough: a member that restarts resets the
// coordinator's pooled connection, and the first heartbeat after that
// fails although the member is back a moment later. A member is written
// down as not live only when its heartbeats are still failing
// liveGrace after the first failure of the run.

// A new coordinator inherits what the old one wrote: a member recorded as
// not live whose heartbeats never fail at the new coordinator would stay
// so for ever, since raft reports only a resumption after failures. So,
// while this host leads, every liveSweep it asks each member recorded as
// not live, and not failing here, whether it answers (pingPath, with the
// pool secret, bounded by pingTimeout); one that does is recorded live.

// liveGrace is how long a member's heartbeats must keep failing before
// the coordinator records it as not live.
const liveGrace = time.Second

// liveSweep is how often a coordinator checks members recorded as not
// live; pingTimeout bounds one check.
const (
	liveSweep   = 2 * time.Second
	pingTimeout = 2 * time.Second
	pingPath    = "/pool/ping"
)

// failRun is a run of failed heartbeats to one member: when it began and
// the timer that ends its grace.
type failRun struct {
	since time.Time
	timer *time.Timer
}

// watchLiveness follows raft's heartbeat observations until stop closes.
func (p *Pool) watchLiveness(rf *raft.Raft, stop <-chan struct{}) {
	ch := make(chan raft.Observation, 64)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	})
	rf.RegisterObserver(obs)
	defer rf.DeregisterObserver(obs)
	// failing holds, per member whose heartbeats are failing, when the
	// run of failures began and the timer that ends its grace.
	failing := make(map[string]failRun)
	expired := make(chan string, 64)
	answered := make(chan string, 64)
	sweep := time.NewTicker(liveSweep)
	defer sweep.Stop()
	sweeping := false
	defer func() {
		for _, r := range failing {
			r.timer.Stop()
		}
	}()
	for {
		select {
		case o := <-ch:
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				peer := string(d.PeerID)
				if _, ok := failing[peer]; !ok {
					failing[peer] = failRun{since: time.Now(), timer: time.AfterFunc(liveGrace, func() {
						select {
						case expired <- peer:
						case <-stop:
						}
					})}
				}
			case raft.ResumedHeartbeatObservation:
				peer := string(d.PeerID)
				if r, ok := failing[peer]; ok {
					r.timer.Stop()
					delete(failing, peer)
				}
				p.setLive(peer, true)
			}
		case <-sweep.C:
			if sweeping || p.cfg.Repl.Mode() != dbraft.Leader {
				continue
			}
			down := p.recordedDown(rf, failing)
			if len(down) == 0 {
				continue
			}
			sweeping = true
			go func() {
				p.ping(down, answered, stop)
				select {
				case answered <- "":
				case <-stop:
				}
			}()
		case peer := <-answered:
			if peer == "" {
				sweeping = false
			} else if _, ok := failing[peer]; !ok {
				p.setLive(peer, true)
			}
		case peer := <-expired:
			// A timer stopped too late may still deliver: only a member
			// whose current run of failures has lasted the grace counts.
			if r, ok := failing[peer]; ok && time.Since(r.since) >= liveGrace {
				p.setLive(peer, false)
			}
		case <-stop:
			return
		}
	}
}

// recordedDown lists the members (by id, with their raft addresses)
// that the database records as not live and whose heartbeats are not
// failing here.
func (p *Pool) recordedDown(rf *raft.Raft, failing map[string]failRun) map[string]string {
	f := rf.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	snap := p.cfg.Server.DB.Snapshot()
	down := map[string]string{}
	for _, s := range f.Configuration().Servers {
		id := string(s.ID)
		if _, bad := failing[id]; bad || id == p.cfg.HostUUID {
			continue
		}
		host, ok := snap.ByUUID(dm.Host.Class, id)
		if !ok {
			continue
		}
		if m, ok := snap.Get(dm.HostMetrics.Class, host.String(dm.Host.Metrics)); ok && m.Get(dm.HostMetrics.Live) == false {
			down[id] = string(s.Address)
		}
	}
	return down
}

// ping asks each member in down (id to address) whether it answers, and
// sends the id of each that does to answered.
func (p *Pool) ping(down map[string]string, answered chan<- string, stop <-chan struct{}) {
	for id, addr := range down {
		if !p.answers(context.Background(), addr) {
			continue
		}
		select {
		case answered <- id:
		case <-stop:
			return
		}
	}
}

// answers reports whether the host at addr answers a ping (signed, and
// proven: a host of this pool) within pingTimeout.
func (p *Pool) answers(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	resp, err := p.post(ctx, addr, pingPath, "text/plain", nil)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// servePing answers a coordinator's liveness check.
func servePing(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }

// setLive records, on the coordinator, whether the host with uuid is live.
func (p *Pool) setLive(uuid string, live bool) {
	if p.cfg.Repl.Mode() != dbraft.Leader {
		return
	}
	_, err := p.cfg.Server.DB.Update(func(tx *db.Tx) error {
		host, ok := tx.ByUUID(dm.Host.Class, uuid)
		if !ok {
			return nil
		}
		m := host.String(dm.Host.Metrics)
		if r, ok := tx.Get(dm.HostMetrics.Class, m); ok && r.Get(dm.HostMetrics.Live) != live {
			return tx.Set(dm.HostMetrics.Live, m, live)
		}
		return nil
	})
	if err != nil {
		p.log.Warn("could not record a host's liveness", "host", uuid, "live", live, "err", err)
		return
	}
	p.log.Info("host liveness", "host", uuid, "live", live)
}
