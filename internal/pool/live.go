package pool

import (
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
	for {
		select {
		case o := <-ch:
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				p.setLive(string(d.PeerID), false)
			case raft.ResumedHeartbeatObservation:
				p.setLive(string(d.PeerID), true)
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
