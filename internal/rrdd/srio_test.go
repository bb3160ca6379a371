package rrdd

import (
	"context"
	"testing"
	"time"

	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd/stats"
)

// Two VMs with disks on one SR and a CD with none: the host's SR sources
// are the sums of the disks' traffic per tick, a new disk counts from its
// next reading, a reset counter counts from its new value.
func TestSRIO(t *testing.T) {
	const sr = "5ee5ee5e-0000-4000-8000-000000000001"
	srOf := func(vm, dev string) (string, bool) { return sr, dev != "hdd" }
	vms := []stats.VM{
		{UUID: vmUUID, Disks: []stats.Disk{{Device: "xvda", ReadBytes: 1 << 20, ReadOps: 10}, {Device: "hdd", ReadBytes: 999}}},
	}
	s, _ := newService(t, t.TempDir(), Named{"vms", VMSRSampler(func(context.Context) []stats.VM { return vms }, srOf)})
	ctx := context.Background()
	s.Tick(ctx, at(0))
	vms = []stats.VM{
		{UUID: vmUUID, Disks: []stats.Disk{{Device: "xvda", ReadBytes: 6 << 20, ReadOps: 60, WriteBytes: 5 << 20}, {Device: "hdd", ReadBytes: 5000}}},
		{UUID: vm2UUID, Disks: []stats.Disk{{Device: "xvda", ReadBytes: 100 << 20}}}, // new: counts next tick
	}
	s.Tick(ctx, at(1))
	host := plugin.Owner{Kind: plugin.Host}
	for name, want := range map[string]float64{
		"read_5ee5ee5e":                1 << 20, // 5 MiB in 5 s
		"write_5ee5ee5e":               1 << 20,
		"io_throughput_read_5ee5ee5e":  1,
		"io_throughput_total_5ee5ee5e": 2,
		"iops_read_5ee5ee5e":           10,
	} {
		if v, err := s.Query(host, name, at(1)); err != nil || v != want {
			t.Errorf("%s: %v %v, want %v", name, v, err, want)
		}
	}
	vms[0].Disks[0].ReadBytes = 1 << 20 // the domain restarted: its counter went back
	vms[1].Disks[0].ReadBytes = 110 << 20
	s.Tick(ctx, at(2))
	// (archives keep single precision, as xapi's)
	if v, want := mustQuery(t, s, host, "read_5ee5ee5e"), float64(float32(float64(11<<20)/5)); v != want {
		t.Errorf("after a reset: %v, want %v", v, want)
	}
}

func mustQuery(t *testing.T, s *Service, o plugin.Owner, name string) float64 {
	t.Helper()
	v, err := s.Query(o, name, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return v
}
