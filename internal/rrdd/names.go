package rrdd

import (
	"context"
	"math"
	"strconv"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd/stats"
)

// The data sources of the host and of its VMs carry the names, types,
// units and defaults xapi's rrdd and its plugins give them (rrdp-cpu,
// rrdp-squeezed, rrdp-netdev, rrdp-iostat), because clients match on the
// names: Xen Orchestra's charts read cpu<n>, memory, memory_internal_free,
// vbd_<device>_read and vif_<n>_rx. Sources with no xapi counterpart
// (a host's physical disks) are named in the same style and documented
// as toolstackd's own.

// source is a data source description with rrdd's defaults.
func source(owner plugin.Owner, name, desc, units string, ty rrd.DSType, def bool, lo, hi float64) plugin.Source {
	return plugin.Source{Name: name, Description: desc, Units: units, Owner: owner, Type: ty, Default: def, Min: lo, Max: hi}
}

var inf = math.Inf(1)

func seconds(d time.Duration) rrd.Value { return rrd.FloatValue(d.Seconds()) }

// counter is a cumulative count as rrdd's plugins give it: an int64 (a
// counter past 2^63 wraps, which DERIVE handles).
func counter(n uint64) rrd.Value { return rrd.IntValue(int64(n)) } //nolint:gosec // wraps by design

// HostReadings names the host's counters.
func HostReadings(h stats.Host, isPIF func(dev string) bool) []Reading {
	host := plugin.Owner{Kind: plugin.Host}
	out := make([]Reading, 0, len(h.CPUBusy)+8+4*len(h.NICs)+4*len(h.Disks))
	var busy time.Duration
	for i, b := range h.CPUBusy {
		busy += b
		out = append(out, Reading{source(host, "cpu"+strconv.Itoa(i), "Physical cpu usage for cpu "+strconv.Itoa(i),
			"(fraction)", rrd.Derive, true, 0, 1), seconds(b)})
	}
	if n := len(h.CPUBusy); n > 0 {
		out = append(out, Reading{source(host, "cpu_avg", "Average physical cpu usage", "(fraction)", rrd.Derive, true, 0, 1),
			seconds(busy / time.Duration(n))})
	}
	if h.MemoryTotal > 0 {
		out = append(out,
			Reading{source(host, "memory_total_kib", "Total amount of memory in the host", "KiB", rrd.Gauge, true, 0, inf),
				rrd.IntValue(h.MemoryTotal / 1024)},
			Reading{source(host, "memory_free_kib", "Total amount of free memory", "KiB", rrd.Gauge, true, 0, inf),
				rrd.IntValue(h.MemoryFree / 1024)})
	}
	out = append(out, Reading{source(host, "loadavg", "Domain0 loadavg", "(fraction)", rrd.Gauge, true, math.Inf(-1), inf),
		rrd.FloatValue(h.LoadAverage)})
	var rx, tx uint64
	for _, n := range h.NICs {
		if isPIF != nil && !isPIF(n.Device) {
			continue
		}
		rx += n.RxBytes
		tx += n.TxBytes
		p := "pif_" + n.Device
		out = append(out,
			Reading{source(host, p+"_rx", "Bytes per second received on physical interface "+n.Device, "B/s", rrd.Derive, true, 0, inf), counter(n.RxBytes)},
			Reading{source(host, p+"_tx", "Bytes per second sent on physical interface "+n.Device, "B/s", rrd.Derive, true, 0, inf), counter(n.TxBytes)},
			Reading{source(host, p+"_rx_errors", "Receive errors per second on physical interface "+n.Device, "err/s", rrd.Derive, false, 0, inf), counter(n.RxErrors)},
			Reading{source(host, p+"_tx_errors", "Transmit errors per second on physical interface "+n.Device, "err/s", rrd.Derive, false, 0, inf), counter(n.TxErrors)})
	}
	out = append(out,
		Reading{source(host, "pif_aggr_rx", "Bytes per second received on all physical interfaces", "B/s", rrd.Derive, true, 0, inf), counter(rx)},
		Reading{source(host, "pif_aggr_tx", "Bytes per second sent on all physical interfaces", "B/s", rrd.Derive, true, 0, inf), counter(tx)})
	for _, d := range h.Disks {
		p := "disk_" + d.Device
		out = append(out,
			Reading{source(host, p+"_read", "Reads from physical disk "+d.Device+", in B/s", "B/s", rrd.Derive, true, 0, inf), counter(d.ReadBytes)},
			Reading{source(host, p+"_write", "Writes to physical disk "+d.Device+", in B/s", "B/s", rrd.Derive, true, 0, inf), counter(d.WriteBytes)},
			Reading{source(host, p+"_iops_read", "Read requests per second", "requests/s", rrd.Derive, false, 0, inf), counter(d.ReadOps)},
			Reading{source(host, p+"_iops_write", "Write requests per second", "requests/s", rrd.Derive, false, 0, inf), counter(d.WriteOps)})
	}
	return out
}

// VMReadings names one VM's counters.
func VMReadings(v stats.VM) []Reading {
	vm := plugin.Owner{Kind: plugin.VM, UUID: v.UUID}
	out := make([]Reading, 0, len(v.VCPUTime)+3+8*len(v.Disks)+4*len(v.NICs))
	for i, t := range v.VCPUTime {
		out = append(out, Reading{source(vm, "cpu"+strconv.Itoa(i), "CPU"+strconv.Itoa(i)+" usage", "(fraction)", rrd.Derive, true, 0, 1), seconds(t)})
	}
	if v.Memory >= 0 {
		out = append(out, Reading{source(vm, "memory", "Memory currently allocated to VM", "B", rrd.Gauge, true, 0, inf), rrd.IntValue(v.Memory)})
	}
	if v.MemoryTarget >= 0 {
		out = append(out, Reading{source(vm, "memory_target", "Target of VM balloon driver", "B", rrd.Gauge, true, 0, inf), rrd.IntValue(v.MemoryTarget)})
	}
	if v.MemoryInternalFree >= 0 {
		out = append(out, Reading{source(vm, "memory_internal_free", "Memory used as reported by the guest agent", "KiB", rrd.Gauge, true, 0, inf),
			rrd.IntValue(v.MemoryInternalFree / 1024)})
	}
	for _, d := range v.Disks {
		p := "vbd_" + d.Device
		out = append(out,
			Reading{source(vm, p+"_read", "Reads from device "+d.Device+", in B/s", "B/s", rrd.Derive, true, 0, inf), counter(d.ReadBytes)},
			Reading{source(vm, p+"_write", "Writes from device "+d.Device+", in B/s", "B/s", rrd.Derive, true, 0, inf), counter(d.WriteBytes)},
			Reading{source(vm, p+"_iops_read", "Read requests per second", "requests/s", rrd.Derive, true, 0, inf), counter(d.ReadOps)},
			Reading{source(vm, p+"_iops_write", "Write requests per second", "requests/s", rrd.Derive, true, 0, inf), counter(d.WriteOps)},
			Reading{source(vm, p+"_iops_total", "I/O Requests per second", "requests/s", rrd.Derive, true, 0, inf), counter(d.ReadOps + d.WriteOps)},
			Reading{source(vm, p+"_iowait", "Total I/O wait time (all requests) per second", "s/s", rrd.Derive, true, 0, inf), seconds(d.ReadTime + d.WriteTime)})
	}
	for _, n := range v.NICs {
		p := "vif_" + n.Device
		out = append(out,
			Reading{source(vm, p+"_rx", "Bytes per second received on virtual interface number '"+n.Device+"'", "B/s", rrd.Derive, true, 0, inf), counter(n.RxBytes)},
			Reading{source(vm, p+"_tx", "Bytes per second transmitted on virtual interface number '"+n.Device+"'", "B/s", rrd.Derive, true, 0, inf), counter(n.TxBytes)},
			Reading{source(vm, p+"_rx_errors", "Receive errors per second on virtual interface number '"+n.Device+"'", "err/s", rrd.Derive, false, 0, inf), counter(n.RxErrors)},
			Reading{source(vm, p+"_tx_errors", "Transmit errors per second on virtual interface number '"+n.Device+"'", "err/s", rrd.Derive, false, 0, inf), counter(n.TxErrors)})
	}
	return out
}

// HostSampler samples the host through read (the host sampler), keeping
// the network interfaces isPIF accepts (nil: all).
func HostSampler(read func() (stats.Host, error), isPIF func(dev string) bool) Sampler {
	return SamplerFunc(func(context.Context, time.Time) ([]Reading, error) {
		h, err := read()
		if err != nil {
			return nil, err
		}
		return HostReadings(h, isPIF), nil
	})
}

// VMSampler samples the running VMs through read (the VM backends).
func VMSampler(read func(ctx context.Context) []stats.VM) Sampler {
	return SamplerFunc(func(ctx context.Context, _ time.Time) ([]Reading, error) {
		var out []Reading
		for _, v := range read(ctx) {
			out = append(out, VMReadings(v)...)
		}
		return out, nil
	})
}

// SRSampler samples the attached SRs listed by list.
func SRSampler(list func() []SR) Sampler {
	return SamplerFunc(func(context.Context, time.Time) ([]Reading, error) {
		var out []Reading
		for _, sr := range list() {
			out = append(out, SRReadings(sr)...)
		}
		return out, nil
	})
}

// SR is one attached SR's size and use, in bytes, as the database has
// them.
type SR struct {
	UUID                  string
	Size, Utilisation     int64
	VirtualAllocation     int64
	ReadBytes, WriteBytes uint64
	HaveIO                bool
}

// SRReadings names an SR's figures: its size and use (the
// physical_utilisation xapi records from an SR's data sources) and, when
// the SR can say, its I/O.
func SRReadings(sr SR) []Reading {
	o := plugin.Owner{Kind: plugin.SR, UUID: sr.UUID}
	out := []Reading{
		{source(o, "size", "Size of the SR", "B", rrd.Gauge, true, 0, inf), rrd.IntValue(sr.Size)},
		{source(o, "physical_utilisation", "Space used on the SR", "B", rrd.Gauge, true, 0, inf), rrd.IntValue(sr.Utilisation)},
		{source(o, "virtual_allocation", "Sum of the virtual sizes of the SR's disks", "B", rrd.Gauge, true, 0, inf), rrd.IntValue(sr.VirtualAllocation)},
	}
	if sr.HaveIO {
		out = append(out,
			Reading{source(o, "read", "Reads from the SR, in B/s", "B/s", rrd.Derive, true, 0, inf), counter(sr.ReadBytes)},
			Reading{source(o, "write", "Writes to the SR, in B/s", "B/s", rrd.Derive, true, 0, inf), counter(sr.WriteBytes)})
	}
	return out
}
