package sim

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
)

func statsDomain(uuid string, start time.Time) *backend.DomainInfo {
	return &backend.DomainInfo{UUID: uuid, State: backend.DomainRunning, StartTime: start, VCPUs: 2, Memory: 256 << 20,
		Disks: []backend.Disk{{Device: "0", Path: "/x/0"}, {Device: "3", CD: true}},
		NICs:  []backend.NIC{{Device: "0"}, {Device: "1"}}}
}

// Counters are worked out from the time alone: the same instant reads the
// same; another VM reads otherwise.
func TestStatsDeterministic(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start.Add(90 * time.Minute)
	a, err := domainStats(statsDomain("5B3C7A1E-0000-4000-8000-000000000001", start), now)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := domainStats(statsDomain("5B3C7A1E-0000-4000-8000-000000000001", start), now)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two reads at one instant differ:\n%+v\n%+v", a, b)
	}
	if a.UUID != "5b3c7a1e-0000-4000-8000-000000000001" {
		t.Errorf("UUID %q is not lower case", a.UUID)
	}
	c, _ := domainStats(statsDomain("5b3c7a1e-0000-4000-8000-000000000002", start), now)
	if c.VCPUTime[0] == a.VCPUTime[0] || c.Disks[0].ReadBytes == a.Disks[0].ReadBytes {
		t.Errorf("two VMs count alike: %v %v", a.VCPUTime, c.VCPUTime)
	}
	if a.VCPUTime[0] == a.VCPUTime[1] {
		t.Errorf("two VCPUs count alike: %v", a.VCPUTime)
	}
	if a.Memory != 256<<20 || a.MemoryTarget != 256<<20 || a.MemoryInternalFree < 256<<20/5 || a.MemoryInternalFree > 256<<20*6/10 {
		t.Errorf("memory %d target %d free %d", a.Memory, a.MemoryTarget, a.MemoryInternalFree)
	}
	if cd := a.Disks[1]; cd != (stats.Disk{Device: "3"}) {
		t.Errorf("empty CD drive: %+v", cd)
	}
	if a.NICs[0].Device != "0" || a.NICs[1].Device != "1" || a.NICs[0].RxBytes == 0 || a.NICs[0].TxBytes == 0 {
		t.Errorf("NICs: %+v", a.NICs)
	}
}

// Over days of ticks, every counter moves and none goes down; rates stay
// in their bands.
func TestStatsMonotonicAndPlausible(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v := 0; v < 20; v++ {
		info := statsDomain(fmt.Sprintf("00000000-0000-4000-8000-%012d", v), start)
		prev, err := domainStats(info, start)
		if err != nil {
			t.Fatal(err)
		}
		if prev.VCPUTime[0] != 0 || prev.Disks[0].ReadBytes != 0 || prev.NICs[0].RxBytes != 0 {
			t.Fatalf("counters at start: %+v", prev)
		}
		now := start
		for step := 0; step < 2000; step++ {
			dt := time.Duration(1+step%7) * 5 * time.Second
			if step%100 == 99 {
				dt = 6 * time.Hour
			}
			now = now.Add(dt)
			cur, _ := domainStats(info, now)
			secs := dt.Seconds()
			for i := range cur.VCPUTime {
				busy := (cur.VCPUTime[i] - prev.VCPUTime[i]).Seconds() / secs
				if busy < 0.05-1e-6 || busy > 0.60+1e-6 {
					t.Fatalf("VM %d VCPU %d busy %.3f over %v at %v", v, i, busy, dt, now.Sub(start))
				}
			}
			for i := range cur.Disks {
				c, p := cur.Disks[i], prev.Disks[i]
				if c.ReadBytes < p.ReadBytes || c.WriteBytes < p.WriteBytes || c.ReadOps < p.ReadOps || c.WriteOps < p.WriteOps ||
					c.ReadTime < p.ReadTime || c.WriteTime < p.WriteTime {
					t.Fatalf("disk %s went down: %+v after %+v", c.Device, c, p)
				}
			}
			d, p := cur.Disks[0], prev.Disks[0]
			if rate := float64(d.ReadBytes-p.ReadBytes) / secs; rate < 0.5e6-1 || rate > 4e6+1 {
				t.Fatalf("read rate %.0f B/s", rate)
			}
			if d.WriteBytes <= p.WriteBytes || d.ReadOps == 0 || d.ReadOps != d.ReadBytes/(64<<10) {
				t.Fatalf("disk: %+v after %+v", d, p)
			}
			for i := range cur.NICs {
				if cur.NICs[i].RxBytes <= prev.NICs[i].RxBytes || cur.NICs[i].TxBytes <= prev.NICs[i].TxBytes {
					t.Fatalf("NIC %d did not move: %+v after %+v", i, cur.NICs[i], prev.NICs[i])
				}
			}
			prev = cur
		}
	}
}

// Through the backend: a domain reads once it runs (or is paused), not
// while it is being built, after it stopped, or when it is not there.
func TestSimulatorStats(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const uuid = "11111111-2222-4333-8444-555555555555"
	if _, err := s.Create(ctx, &backend.Spec{UUID: uuid, VCPUs: 3, Target: 128 << 20, Memory: 128 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stats(ctx, uuid); err == nil {
		t.Error("a domain being built has counters")
	}
	for _, step := range []func() error{
		func() error { return s.AddDisk(ctx, uuid, backend.Disk{Device: "0", Path: "/x/0"}) },
		func() error { return s.AddNIC(ctx, uuid, backend.NIC{Device: "0"}) },
		func() error { return s.StartDeviceModel(ctx, uuid) },
		func() error { return s.Unpause(ctx, uuid) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	a, err := s.Stats(ctx, uuid)
	if err != nil || len(a.VCPUTime) != 3 || len(a.Disks) != 1 || len(a.NICs) != 1 || a.Memory != 128<<20 {
		t.Fatalf("Stats = %+v, %v", a, err)
	}
	time.Sleep(20 * time.Millisecond)
	b, _ := s.Stats(ctx, uuid)
	if b.VCPUTime[0] <= a.VCPUTime[0] || b.Disks[0].ReadBytes <= a.Disks[0].ReadBytes {
		t.Errorf("counters did not move in 20 ms: %+v then %+v", a, b)
	}
	if err := s.SetMemoryTarget(ctx, uuid, 64<<20); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Stats(ctx, uuid); c.Memory != 64<<20 || c.MemoryTarget != 64<<20 {
		t.Errorf("after a new target: memory %d target %d", c.Memory, c.MemoryTarget)
	}
	s.GuestPowerOff(uuid)
	if _, err := s.Stats(ctx, uuid); err == nil {
		t.Error("a domain that powered off has counters")
	}
	if _, err := s.Stats(ctx, "nope"); err == nil {
		t.Error("no domain has counters")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Stats(cctx, uuid); err == nil {
		t.Error("a cancelled read succeeded")
	}
}

// BenchmarkStats1000 reads 1,000 running domains' counters (2 VCPUs, 2
// disks, 1 NIC each), one op being all 1,000.
func BenchmarkStats1000(b *testing.B) {
	s, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	uuids := make([]string, 1000)
	for i := range uuids {
		uuids[i] = fmt.Sprintf("00000000-0000-4000-8000-%012d", i)
		if _, err := s.Create(ctx, &backend.Spec{UUID: uuids[i], VCPUs: 2, Target: 1 << 30}); err != nil {
			b.Fatal(err)
		}
		_ = s.AddDisk(ctx, uuids[i], backend.Disk{Device: "0", Path: "/x/0"})
		_ = s.AddDisk(ctx, uuids[i], backend.Disk{Device: "1", Path: "/x/1"})
		_ = s.AddNIC(ctx, uuids[i], backend.NIC{Device: "0"})
		_ = s.StartDeviceModel(ctx, uuids[i])
		_ = s.Unpause(ctx, uuids[i])
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, u := range uuids {
			if _, err := s.Stats(ctx, u); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/VM")
}
