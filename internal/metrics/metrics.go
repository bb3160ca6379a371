// Package metrics serves the daemon's health as Prometheus metrics on
// GET /metrics, in the OpenMetrics text format when the scraper asks for
// it and the classic text format otherwise.
//
// What is measured:
//
//	toolstackd_api_calls_total{method,result}       XenAPI calls that came in
//	                                                over the wire, by message
//	                                                and outcome ("success" or
//	                                                the XenAPI error code)
//	toolstackd_api_call_duration_seconds{method}    their latency
//	toolstackd_db_commit_duration_seconds           one write transaction of
//	                                                the database file (a group
//	                                                of commits)
//	toolstackd_db_commits_total, _failures_total    write transactions made
//	                                                and failed
//	toolstackd_db_generation                        the database's generation
//	toolstackd_tasks_pending                        tasks not yet finished
//	toolstackd_sessions                             sessions open
//	toolstackd_event_watchers                       event.from and event.next
//	                                                calls waiting
//	toolstackd_xenops_queue_depth                   VM operations queued or
//	                                                running
//	toolstackd_conns_open, _max, _peers             connections open from
//	                                                clients, their cap, and
//	                                                from the pool's hosts
//	toolstackd_conns_refused_{client,full,peer}_total connections closed at
//	                                                accept, by the cap met
//	toolstackd_conns_reclaimed_total                idle connections closed
//	                                                to make room
//	toolstackd_ha_lease_renewals_total,             this host's HA lease
//	_renewal_failures_total, _renewal_seconds_total renewals and their time
//	toolstackd_ha_lease_remaining_seconds           how long the lease holds
//
// plus the Go runtime's and the process's own (go_*, process_*). The
// host, VM and SR data sources of the rrd module join them when that
// module lands.
//
// Labels are bounded: method is a message of the datamodel, as the wire
// spells it ("VM.start", "Async.VM.start"), or "unknown" for a name the
// daemon does not serve, so that a client sending made-up names cannot
// grow the registry; result is "success" or an error code.
//
// Access is authenticated like the other HTTP handlers (a session_id
// query parameter or cookie, or basic authentication as root); a setting
// opens it to anyone, for scrapers that cannot log in.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "toolstackd"

// Registry holds the daemon's metrics. Its methods are safe for
// concurrent use.
type Registry struct {
	reg     *prometheus.Registry
	calls   *prometheus.CounterVec
	latency *prometheus.HistogramVec
	commits prometheus.Histogram
}

// New makes a registry with the call and commit metrics and the Go and
// process collectors.
func New() *Registry {
	r := &Registry{reg: prometheus.NewRegistry()}
	r.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "api_calls_total",
		Help: "XenAPI calls received over the wire, by message and result (success or the error code).",
	}, []string{"method", "result"})
	r.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "api_call_duration_seconds",
		Help:    "Latency of XenAPI calls received over the wire, from decoding to the result.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"method"})
	r.commits = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "db_commit_duration_seconds",
		Help:    "Duration of one write transaction of the database file (a group of commits, fsync included).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	})
	r.reg.MustRegister(r.calls, r.latency, r.commits,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// ObserveCall counts one call and its latency.
func (r *Registry) ObserveCall(method, result string, d time.Duration) {
	r.calls.WithLabelValues(method, result).Inc()
	r.latency.WithLabelValues(method).Observe(d.Seconds())
}

// ObserveCommit records one write transaction of the database file.
func (r *Registry) ObserveCommit(d time.Duration) {
	r.commits.Observe(d.Seconds())
}

// Gauge adds a gauge whose value fn reads at each scrape; fn must be
// cheap and safe for concurrent use. name is without the namespace.
func (r *Registry) Gauge(name, help string, fn func() float64) {
	r.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, fn))
}

// Counter adds a counter read from fn at each scrape (a total kept
// elsewhere); name is without the namespace and ends in _total.
func (r *Registry) Counter(name, help string, fn func() float64) {
	r.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, fn))
}

// Samples adds a family of gauges with the given labels, read at each
// scrape: fn calls emit once per series, with its value and its label
// values in the order of labels. name is without the namespace.
func (r *Registry) Samples(name, help string, labels []string, fn func(emit func(v float64, labelValues ...string))) {
	r.reg.MustRegister(&samples{desc: prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil), fn: fn})
}

// samples is the collector of Samples.
type samples struct {
	desc *prometheus.Desc
	fn   func(emit func(v float64, labelValues ...string))
}

func (s *samples) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *samples) Collect(ch chan<- prometheus.Metric) {
	s.fn(func(v float64, lv ...string) {
		if m, err := prometheus.NewConstMetric(s.desc, prometheus.GaugeValue, v, lv...); err == nil {
			ch <- m
		}
	})
}

// Gatherer is the registry, for tests and for handlers that add to it.
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// Authenticator checks an HTTP request and, when it fails, writes the
// reply itself and returns false (api.Server.HTTPSession's contract).
type Authenticator func(w http.ResponseWriter, req *http.Request) bool

// Handler serves the metrics; auth guards it unless open is set. A scrape
// is bounded by timeout and by one scrape at a time per daemon (a slow
// scraper cannot pile up work).
func (r *Registry) Handler(auth Authenticator, open bool, timeout time.Duration) http.Handler {
	h := promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{
		EnableOpenMetrics:   true,
		MaxRequestsInFlight: 1,
		Timeout:             timeout,
		ErrorHandling:       promhttp.ContinueOnError,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !open && !auth(w, req) {
			return
		}
		h.ServeHTTP(w, req)
	})
}
