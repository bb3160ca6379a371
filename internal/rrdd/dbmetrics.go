package rrdd

import (
	"log/slog"
	"strconv"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/rrd/plugin"
)

// Publisher copies a few of the latest readings into the database after
// each tick, where clients read them without asking for RRDs:
// VM_metrics.memory_actual (when it moves by a MiB or more),
// VM_metrics.VCPUs_utilisation (at most once a minute per VM, as it
// moves every tick), both with last_updated; and host_metrics.
// last_updated once a minute. host_metrics.memory_free stays the VM
// lifecycle's accounting (what placement and the HA planner use), not
// the host kernel's free memory.
//
// All changes of a tick go into one transaction.
type Publisher struct {
	db      *db.DB
	hostRef string
	s       *Service
	log     *slog.Logger
	// vcpus remembers when each VM's VCPUs_utilisation was last written.
	vcpus    map[string]time.Time
	hostSeen time.Time
}

// utilisationEvery is how often a VM's VCPUs_utilisation is rewritten.
const utilisationEvery = time.Minute

// NewPublisher makes a publisher for s into d; hostRef is this host.
func NewPublisher(d *db.DB, hostRef string, s *Service, log *slog.Logger) *Publisher {
	return &Publisher{db: d, hostRef: hostRef, s: s, log: log, vcpus: map[string]time.Time{}}
}

// vmFigures is what a tick says of one VM.
type vmFigures struct {
	metrics string
	memory  int64
	haveMem bool
	vcpus   map[string]float64
}

// Publish writes what changed; it is meant for Config.AfterTick.
func (p *Publisher) Publish(now time.Time) {
	snap := p.db.Snapshot()
	var vms []vmFigures
	seen := map[string]bool{}
	for _, o := range p.s.Owners() {
		if o.Kind != plugin.VM {
			continue
		}
		row, ok := snap.ByUUID(dm.VM.Class, o.UUID)
		if !ok {
			continue
		}
		m := row.String(dm.VM.Metrics)
		seen[m] = true
		f := vmFigures{metrics: m}
		if v, ok := p.s.Latest(o, "memory"); ok {
			f.memory, f.haveMem = int64(v), true
		}
		if now.Sub(p.vcpus[m]) >= utilisationEvery {
			f.vcpus = map[string]float64{}
			for i := 0; ; i++ {
				v, ok := p.s.Latest(o, "cpu"+strconv.Itoa(i))
				if !ok {
					break
				}
				f.vcpus[strconv.Itoa(i)] = v
			}
		}
		vms = append(vms, f)
	}
	for m := range p.vcpus {
		if !seen[m] {
			delete(p.vcpus, m)
		}
	}
	hostDue := now.Sub(p.hostSeen) >= time.Minute
	_, err := p.db.Update(func(tx *db.Tx) error {
		for _, f := range vms {
			r, ok := tx.Get(dm.VMMetrics.Class, f.metrics)
			if !ok {
				continue
			}
			changed := false
			if cur, _ := r.Get(dm.VMMetrics.MemoryActual).(int64); f.haveMem && f.memory > 0 && abs(cur-f.memory) >= 1<<20 {
				if err := tx.Set(dm.VMMetrics.MemoryActual, f.metrics, f.memory); err != nil {
					return err
				}
				changed = true
			}
			if len(f.vcpus) > 0 {
				if err := tx.Set(dm.VMMetrics.VCPUsUtilisation, f.metrics, f.vcpus); err != nil {
					return err
				}
				p.vcpus[f.metrics] = now
				changed = true
			}
			if changed {
				if err := tx.Set(dm.VMMetrics.LastUpdated, f.metrics, now.UTC()); err != nil {
					return err
				}
			}
		}
		if hostDue {
			if h, ok := tx.Get(dm.Host.Class, p.hostRef); ok {
				if m := h.String(dm.Host.Metrics); m != "" {
					if _, ok := tx.Get(dm.HostMetrics.Class, m); ok {
						if err := tx.Set(dm.HostMetrics.LastUpdated, m, now.UTC()); err != nil {
							return err
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		p.log.Debug("metrics: could not publish into the database", "err", err)
		return
	}
	if hostDue {
		p.hostSeen = now
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
