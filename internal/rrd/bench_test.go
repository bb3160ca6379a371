package rrd

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"
)

// vmSources is a typical VM's ten default sources: CPU time of two vCPUs,
// network and disk byte counters (DERIVE), memory figures and a couple of
// gauges.
func vmSources() []DS {
	inf := math.Inf(1)
	mk := func(name string, ty DSType, max float64) DS {
		return DS{Name: name, Type: ty, Min: 0, Max: max, Heartbeat: DefaultHeartbeat}
	}
	return []DS{
		mk("cpu0", Derive, 1), mk("cpu1", Derive, 1),
		mk("vif_0_rx", Derive, inf), mk("vif_0_tx", Derive, inf),
		mk("vbd_xvda_read", Derive, inf), mk("vbd_xvda_write", Derive, inf),
		mk("memory", Gauge, inf), mk("memory_target", Gauge, inf),
		mk("memory_internal_free", Gauge, inf), mk("runstate_fullrun", Gauge, 1),
	}
}

// benchTick updates n VM RRDs once per simulated 5 s tick, as rrdd's
// sampling loop does, and reports the cost of a tick, the share of one core
// that is at one tick per 5 s, and the memory one VM's RRD takes.
func benchTick(b *testing.B, n int, minMax bool) {
	start := time.Unix(1_700_000_000, 0)
	rrds := make([]*RRD, n)
	for i := range rrds {
		r, err := New(DefaultStep, start, vmSources(), VMArchives(minMax))
		if err != nil {
			b.Fatal(err)
		}
		rrds[i] = r
	}
	vals := make([]Value, 10)
	counter := int64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for tick := 0; tick < b.N; tick++ {
		now := start.Add(time.Duration(tick+1) * 5 * time.Second)
		counter += 1_000_000
		for i, r := range rrds {
			for k := 0; k < 6; k++ {
				vals[k] = IntValue(counter * int64(k+1))
			}
			vals[0] = FloatValue(float64(tick) * 2.5) // CPU seconds, 0.5/s
			vals[1] = FloatValue(float64(tick) * 1.5)
			vals[6] = FloatValue(4 << 30)
			vals[7] = FloatValue(4 << 30)
			vals[8] = FloatValue(float64(i << 20))
			vals[9] = FloatValue(0.01)
			if err := r.Update(now, vals); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	perTick := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(perTick/float64(n), "ns/VM-update")
	b.ReportMetric(perTick/5e9*100, "%core@5s")
	b.ReportMetric(float64(rrds[0].MemoryBytes()), "bytes/VM-RRD")
}

// One op is one tick over 1,000 running VMs with ten sources each.
func BenchmarkTick1000VMs(b *testing.B) {
	for _, minMax := range []bool{false, true} {
		b.Run(fmt.Sprintf("minmax=%v", minMax), func(b *testing.B) { benchTick(b, 1000, minMax) })
	}
}

func BenchmarkExportHostAndVMs(b *testing.B) {
	start := time.Unix(1_700_000_000, 0)
	var srcs []Source
	host, _ := New(DefaultStep, start, vmSources(), HostArchives())
	srcs = append(srcs, Source{"host:h:", host})
	for i := 0; i < 100; i++ {
		r, _ := New(DefaultStep, start, vmSources(), VMArchives(false))
		srcs = append(srcs, Source{fmt.Sprintf("vm:%d:", i), r})
	}
	b.ReportAllocs()
	for b.Loop() {
		x, err := Export(srcs, 1_700_000_000-600, 0, AnyCF)
		if err != nil {
			b.Fatal(err)
		}
		_ = x.AppendXML(nil)
	}
}

func BenchmarkHostRRDXML(b *testing.B) {
	host, _ := New(DefaultStep, time.Unix(1_700_000_000, 0), vmSources(), HostArchives())
	buf := host.AppendXML(nil, true)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = host.AppendXML(buf[:0], true)
	}
}

// Parsing a host-sized upload: 40 sources over the host layout (about as
// big as a busy host's RRD).
func BenchmarkParseXMLHost(b *testing.B) {
	var dss []DS
	for i := 0; i < 4; i++ {
		for _, d := range vmSources() {
			d.Name = fmt.Sprintf("%s_%d", d.Name, i)
			dss = append(dss, d)
		}
	}
	host, err := New(DefaultStep, time.Unix(1_700_000_000, 0), dss, HostArchives())
	if err != nil {
		b.Fatal(err)
	}
	doc := host.AppendXML(nil, true)
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseXML(bytes.NewReader(doc)); err != nil {
			b.Fatal(err)
		}
	}
}
