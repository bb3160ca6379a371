package pool

import (
	"time"

	"github.com/hashicorp/raft"

	dm "toolstackd/internal/api/datamodel"
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

// liveGrace is how long a member's heartbeats must keep failing before
// the coordinator records it as not live.
const liveGrace = time.Second

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
	type run struct {
		since time.Time
		timer *time.Timer
	}
	failing := make(map[string]run)
	expired := make(chan string, 64)
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
					failing[peer] = run{since: time.Now(), timer: time.AfterFunc(liveGrace, func() {
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
