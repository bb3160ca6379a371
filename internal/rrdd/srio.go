package rrdd

import (
	"context"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd/stats"
)

// SR I/O: xapi's iostat plugin reports, on the host's RRD, each SR's
// traffic from the VM disks on it, named by the first 8 characters of
// the SR's uuid (Xen Orchestra's SR charts read these): read_<sr> and
// write_<sr> (B/s), io_throughput_read_/_write_/_total_<sr> (MiB/s) and
// iops_read_/_write_/_total_<sr> (requests/s). Here they are the sums
// over the VBDs of the running VMs whose VDIs are on the SR, from the
// same counters as the VBDs' own sources.

// VBDSR says which SR holds the VDI of a running VM's disk (by the VM's
// uuid and the disk's device name); ok is false for an empty drive or an
// unknown disk.
type VBDSR func(vmUUID, device string) (srUUID string, ok bool)

// diskKey names one VM disk.
type diskKey struct{ vm, device string }

// srIO turns per-disk cumulative counters into per-SR amounts since the
// previous tick.
type srIO struct {
	srOf VBDSR
	prev map[diskKey]stats.Disk
}

// srTotals is one SR's traffic over one tick.
type srTotals struct{ readB, writeB, readOps, writeOps uint64 }

// readings sums the disks' traffic since the previous call by SR. A disk
// seen for the first time counts from its next reading; a counter that
// went back (a domain restarted) counts from its new value.
func (s *srIO) readings(vms []stats.VM) []Reading {
	next := make(map[diskKey]stats.Disk, len(s.prev))
	by := map[string]*srTotals{}
	var order []string
	for _, v := range vms {
		for _, d := range v.Disks {
			k := diskKey{v.UUID, d.Device}
			next[k] = d
			sr, ok := s.srOf(v.UUID, d.Device)
			if !ok {
				continue
			}
			t := by[sr]
			if t == nil {
				t = &srTotals{}
				by[sr] = t
				order = append(order, sr)
			}
			p, seen := s.prev[k]
			if !seen {
				continue
			}
			t.readB += since(d.ReadBytes, p.ReadBytes)
			t.writeB += since(d.WriteBytes, p.WriteBytes)
			t.readOps += since(d.ReadOps, p.ReadOps)
			t.writeOps += since(d.WriteOps, p.WriteOps)
		}
	}
	s.prev = next
	host := plugin.Owner{Kind: plugin.Host}
	out := make([]Reading, 0, 9*len(order))
	for _, sr := range order {
		t := by[sr]
		key := sr
		if len(key) > 8 {
			key = key[:8]
		}
		mib := func(b uint64) rrd.Value { return rrd.FloatValue(float64(b) / (1 << 20)) }
		n := func(v uint64) rrd.Value { return rrd.IntValue(int64(v)) } //nolint:gosec // a tick's amount
		abs := func(name, desc, units string, v rrd.Value) Reading {
			return Reading{source(host, name+"_"+key, desc, units, rrd.Absolute, true, 0, inf), v}
		}
		out = append(out,
			abs("read", "Reads from the SR, in B/s", "B/s", n(t.readB)),
			abs("write", "Writes to the SR, in B/s", "B/s", n(t.writeB)),
			abs("io_throughput_read", "Data read from the SR, in MiB/s", "MiB/s", mib(t.readB)),
			abs("io_throughput_write", "Data written to the SR, in MiB/s", "MiB/s", mib(t.writeB)),
			abs("io_throughput_total", "All SR I/O, in MiB/s", "MiB/s", mib(t.readB+t.writeB)),
			abs("iops_read", "Read requests per second", "requests/s", n(t.readOps)),
			abs("iops_write", "Write requests per second", "requests/s", n(t.writeOps)),
			abs("iops_total", "I/O Requests per second", "requests/s", n(t.readOps+t.writeOps)))
	}
	return out
}

// since is a counter's growth; one that went back (reset) counts from 0.
func since(cur, prev uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// VMSRSampler samples the running VMs through read, as VMSampler, and
// adds the host's per-SR I/O sources for the disks srOf places.
func VMSRSampler(read func(ctx context.Context) []stats.VM, srOf VBDSR) Sampler {
	io := &srIO{srOf: srOf, prev: map[diskKey]stats.Disk{}}
	return SamplerFunc(func(ctx context.Context, _ time.Time) ([]Reading, error) {
		vms := read(ctx)
		var out []Reading
		for _, v := range vms {
			out = append(out, VMReadings(v)...)
		}
		return append(out, io.readings(vms)...), nil
	})
}
