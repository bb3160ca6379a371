package sim

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
)

// Simulated counters: each is the integral of a rate that swings slowly
// between two bounds (a sine), so it moves from tick to tick, never goes
// down, and is worked out in closed form from the time since the domain
// started: nothing is kept between calls, and the same domain at the same
// instant always reads the same. Each domain's bounds, periods and phases
// come from its uuid.
//
// VCPUs are busy 5-60% of the time; each disk reads at 0.5-4 MB/s and
// writes at 0.25-2 MB/s in requests of 64 KiB on average, each taking
// 0.1-2 ms; each NIC receives 10-200 kB/s and sends 5-100 kB/s. Memory is
// the balloon target, and the guest reports 20-60% of it free. A paused
// domain's clock is not stopped (the manager does not ask for paused
// domains).

var _ backend.StatsReporter = (*Simulator)(nil)

// Stats implements backend.StatsReporter.
func (s *Simulator) Stats(ctx context.Context, uuid string) (stats.VM, error) {
	if err := ctx.Err(); err != nil {
		return stats.VM{}, err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.doms[uuid]
	if d == nil {
		return stats.VM{}, fmt.Errorf("simulator: no domain %s", uuid)
	}
	return domainStats(&d.Info, now)
}

// domainStats is a domain's counters at now.
func domainStats(info *backend.DomainInfo, now time.Time) (stats.VM, error) {
	if info.State != backend.DomainRunning && info.State != backend.DomainPaused {
		return stats.VM{}, fmt.Errorf("simulator: domain %s is %s", info.UUID, info.State)
	}
	t := 0.0
	if !info.StartTime.IsZero() {
		t = max(now.Sub(info.StartTime).Seconds(), 0)
	}
	seed := hashString(14695981039346656037, info.UUID)
	out := stats.VM{
		UUID:     strings.ToLower(info.UUID),
		VCPUTime: make([]time.Duration, max(info.VCPUs, 0)),
		Memory:   info.Memory, MemoryTarget: info.Memory, MemoryInternalFree: stats.Unknown,
		Disks: make([]stats.Disk, len(info.Disks)),
		NICs:  make([]stats.NIC, len(info.NICs)),
	}
	for i := range out.VCPUTime {
		r := stream(seed, "vcpu", uint64(i))
		out.VCPUTime[i] = time.Duration(r.wave(0.05, 0.60).integral(t) * 1e9)
	}
	if info.Memory > 0 {
		r := stream(seed, "memory", 0)
		out.MemoryInternalFree = int64(float64(info.Memory) * r.wave(0.2, 0.6).at(t))
	}
	const req = 64 << 10
	for i, dk := range info.Disks {
		x := &out.Disks[i]
		x.Device = dk.Device
		if dk.Path == "" {
			continue // an empty drive: nothing to read
		}
		// Keyed by device: plugging or unplugging another disk, or
		// changing the VCPUs, leaves this one's counters as they were.
		r := stream(seed, "vbd"+dk.Device, 0)
		rb, wb := r.wave(0.5e6, 4e6).integral(t), r.wave(0.25e6, 2e6).integral(t)
		x.ReadBytes, x.WriteBytes = uint64(rb), uint64(wb)
		x.ReadOps, x.WriteOps = uint64(rb/req), uint64(wb/req)
		// Request time grows with the requests, at a latency fixed per
		// disk (writes twice as slow), so that it never goes down.
		lat := 0.1e-3 + 1.9e-3*r.unit()
		x.ReadTime = time.Duration(float64(x.ReadOps) * lat * 1e9)
		x.WriteTime = time.Duration(float64(x.WriteOps) * lat * 2e9)
	}
	for i, n := range info.NICs {
		r := stream(seed, "vif"+n.Device, 0)
		out.NICs[i] = stats.NIC{Device: n.Device, RxBytes: uint64(r.wave(10e3, 200e3).integral(t)), TxBytes: uint64(r.wave(5e3, 100e3).integral(t))}
	}
	return out, nil
}

// hashString continues an FNV-1a hash over s.
func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// rng is a SplitMix64 stream: a few well-mixed numbers from one seed.
type rng uint64

// stream is the numbers for one counter of a domain: its seed, what the
// counter is and which of them.
func stream(seed uint64, what string, i uint64) rng {
	return rng(hashString(seed^i*0x9e3779b97f4a7c15, what))
}

func (r *rng) next() uint64 {
	*r += 0x9e3779b97f4a7c15
	z := uint64(*r)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// unit is a number in [0, 1).
func (r *rng) unit() float64 { return float64(r.next()>>11) / (1 << 53) }

// wave is a rate that swings between lo and hi (both >= 0): a band of at
// least a fifth of the range, placed at random in it, with a period of
// 1-10 minutes and a random phase.
func (r *rng) wave(lo, hi float64) wave {
	span := hi - lo
	a := lo + r.unit()*span*0.8
	b := a + span*0.2 + r.unit()*(hi-a-span*0.2)
	return wave{base: (a + b) / 2, amp: (b - a) / 2, omega: 2 * math.Pi / (60 + 540*r.unit()), phase: 2 * math.Pi * r.unit()}
}

// wave is the rate base + amp*sin(omega*t + phase), with amp <= base.
type wave struct{ base, amp, omega, phase float64 }

// at is the rate at t seconds.
func (w wave) at(t float64) float64 { return w.base + w.amp*math.Sin(w.omega*t+w.phase) }

// integral is the rate's integral from 0 to t: never negative, never
// decreasing in t.
func (w wave) integral(t float64) float64 {
	v := w.base*t - w.amp/w.omega*(math.Cos(w.omega*t+w.phase)-math.Cos(w.phase))
	return max(v, 0)
}
