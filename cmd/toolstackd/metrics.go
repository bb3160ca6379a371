package main

import (
	"net/http"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/metrics"
	"toolstackd/internal/netguard"
	"toolstackd/internal/rrd/plugin"
)

// serveMetrics adds GET /metrics: the daemon's health for Prometheus
// (internal/metrics), authenticated like the other handlers unless
// --metrics-open.
func (h *host) serveMetrics(o options) {
	reg := metrics.New()
	h.metrics = reg
	h.srv.SetObserver(reg)
	if h.store != nil {
		h.store.ObserveCommits(reg.ObserveCommit)
		reg.Counter("db_commits_total", "Write transactions of the database file.", func() float64 { return float64(h.store.Syncs()) })
		reg.Counter("db_commit_failures_total", "Failed write attempts of the database file.", func() float64 { return float64(h.store.Failures()) })
	}
	reg.Gauge("db_generation", "The database's generation (one more for every commit).", func() float64 { return float64(h.db.Generation()) })
	reg.Gauge("tasks_pending", "Tasks of this host's calls that have not finished.", func() float64 { return float64(h.srv.PendingTasks()) })
	reg.Gauge("sessions", "Sessions open on this host.", func() float64 { return float64(h.srv.Sessions()) })
	reg.Gauge("event_watchers", "event.from and event.next calls waiting for changes.", func() float64 { return float64(h.srv.EventWatchers()) })
	if g := o.guard; g != nil {
		stat := func(f func(netguard.Stats) float64) func() float64 { return func() float64 { return f(g.Stats()) } }
		reg.Gauge("conns_open", "Connections open from clients (the local socket's included, the pool's other hosts' not).",
			stat(func(s netguard.Stats) float64 { return float64(s.Open) }))
		reg.Gauge("conns_max", "The cap on clients' connections open at once (--max-conns).",
			stat(func(s netguard.Stats) float64 { return float64(s.MaxConns) }))
		reg.Gauge("conns_peers", "Connections open from the pool's other hosts, within a budget of their own.",
			stat(func(s netguard.Stats) float64 { return float64(s.Peers) }))
		reg.Counter("conns_refused_client_total", "Connections closed at accept: over one client's cap (--max-conns-per-client).",
			stat(func(s netguard.Stats) float64 { return float64(s.RefusedClient) }))
		reg.Counter("conns_refused_full_total", "Connections closed at accept: over the cap of all clients (--max-conns).",
			stat(func(s netguard.Stats) float64 { return float64(s.RefusedFull) }))
		reg.Counter("conns_refused_peer_total", "Connections from the pool's other hosts closed at accept: over their own budget.",
			stat(func(s netguard.Stats) float64 { return float64(s.RefusedPeer) }))
		reg.Counter("conns_reclaimed_total", "Idle keep-alive connections closed to make room near the cap.",
			stat(func(s netguard.Stats) float64 { return float64(s.Reclaimed) }))
	}
	if h.xm != nil {
		reg.Gauge("xenops_queue_depth", "VM operations waiting for their turn.", func() float64 { return float64(h.xm.QueueDepth()) })
	}
	if svc := h.rrdd; svc != nil {
		// The data sources' newest 5 s values, as /rrd_updates has them.
		reg.Samples("data_source", "The newest 5 s value of each recorded data source of this host, its VMs and its SRs (xapi's data-source names).",
			[]string{"owner", "uuid", "name"}, func(emit func(float64, ...string)) {
				hostUUID := ""
				if row, ok := h.db.Snapshot().Get(dm.Host.Class, h.srv.Cfg.HostRef); ok {
					hostUUID = row.UUID()
				}
				svc.EachLatest(func(o plugin.Owner, name string, v float64) {
					switch o.Kind {
					case plugin.Host:
						emit(v, "host", hostUUID, name)
					case plugin.VM:
						emit(v, "vm", o.UUID, name)
					case plugin.SR:
						emit(v, "sr", o.UUID, name)
					}
				})
			})
	}
	auth := func(w http.ResponseWriter, r *http.Request) bool { return h.srv.HTTPSession(w, r, 0) != nil }
	h.router.Handle("/metrics", api.TrimSlash(reg.Handler(auth, o.metricsOpen, 10*time.Second))).Methods(http.MethodGet)
}
