package rrdd

import (
	"context"
	"fmt"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
)

// vmsAt is n VMs' counters at tick i, moving as the simulator's do: one
// VCPU, one disk and one NIC each.
func vmsAt(n, i int) []stats.VM {
	out := make([]stats.VM, n)
	for k := range out {
		g := uint64(i * (k + 1))
		out[k] = stats.VM{
			UUID:         fmt.Sprintf("%08x-0000-4000-8000-%012x", k, k),
			VCPUTime:     []time.Duration{time.Duration(i) * time.Second * time.Duration(k%5+1) / 10},
			Memory:       1 << 30,
			MemoryTarget: 1 << 30,
			Disks:        []stats.Disk{{Device: "xvda", ReadBytes: g << 20, WriteBytes: g << 19, ReadOps: g << 4, WriteOps: g << 3}},
			NICs:         []stats.NIC{{Device: "0", RxBytes: g << 10, TxBytes: g << 9}},
		}
	}
	return out
}

// BenchmarkTick1000VMs is one 5 s tick of the metrics loop for 1,000
// running VMs (13 data sources each): naming, rates, consolidation into
// every archive. docs/performance.md turns ns/op into a share of a core.
func BenchmarkTick1000VMs(b *testing.B) {
	const n = 1000
	i := 0
	s, err := New(Config{Dir: b.TempDir(), HostUUID: hostUUID, Samplers: []Named{{"vms", VMSampler(func(context.Context) []stats.VM {
		return vmsAt(n, i)
	})}}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for ; i < 3; i++ {
		s.Tick(ctx, at(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		s.Tick(ctx, at(i))
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(s.MemoryBytes())/n, "archive-bytes/VM")
}
