package db_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// sampleVM is a VM record shaped like a real one: a few maps and sets with
// content, most fields at their defaults.
func sampleVM(i int) []any {
	r := &dm.VMRecord{
		NameLabel:       fmt.Sprintf("vm-%06d", i),
		NameDescription: "benchmark VM",
		PowerState:      []dm.VMPowerState{dm.VMPowerStateHalted, dm.VMPowerStateRunning}[i%2],
		MemoryStaticMax: 4 << 30, MemoryDynamicMax: 4 << 30, MemoryDynamicMin: 2 << 30, MemoryStaticMin: 1 << 30,
		VCPUsMax: 4, VCPUsAtStartup: 2,
		HVMBootPolicy: "BIOS order",
		HVMBootParams: map[string]string{"order": "cd"},
		Platform:      map[string]string{"acpi": "1", "apic": "true", "pae": "true", "viridian": "true"},
		OtherConfig:   map[string]string{"install-methods": "cdrom", "base_template_name": "Other install media"},
		Tags:          []string{"bench"},
		UserVersion:   1,
	}
	return r.Row()
}

func fill(b testing.TB, d *db.DB, n, perTx int) []string {
	refs := make([]string, 0, n)
	for i := 0; i < n; i += perTx {
		_, err := d.Update(func(tx *db.Tx) error {
			for j := i; j < i+perTx && j < n; j++ {
				ref, err := tx.Insert(dm.VM.Class, "", sampleVM(j))
				if err != nil {
					return err
				}
				refs = append(refs, ref)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	return refs
}

var big struct {
	once  sync.Once
	d     *db.DB
	refs  []string
	uuids []string
}

// bigTable is a 100,000-VM database shared by the lookup benchmarks.
func bigTable(b *testing.B) {
	big.once.Do(func() {
		big.d = newDB(b)
		big.refs = fill(b, big.d, 100_000, 1000)
		s := big.d.Snapshot()
		for _, ref := range big.refs {
			r, _ := s.Get(dm.VM.Class, ref)
			big.uuids = append(big.uuids, r.Get(dm.VM.UUID).(string))
		}
	})
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkInsert100k inserts 100,000 VMs, one transaction each, and
// reports the heap each VM costs.
func BenchmarkInsert100k(b *testing.B) {
	for _, perTx := range []int{1, 1000} {
		b.Run(fmt.Sprintf("perTx=%d", perTx), func(b *testing.B) {
			var perVM float64
			for range b.N {
				before := heapInUse()
				d := newDB(b)
				fill(b, d, 100_000, perTx)
				after := heapInUse()
				perVM = float64(after-before) / 100_000
				runtime.KeepAlive(d)
			}
			b.ReportMetric(perVM, "heapB/VM")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/VM")
		})
	}
}

func BenchmarkGetByRef(b *testing.B) {
	bigTable(b)
	s := big.d.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		if _, ok := s.Get(dm.VM.Class, big.refs[i%len(big.refs)]); !ok {
			b.Fatal("missing")
		}
	}
}

func BenchmarkGetRecordByRef(b *testing.B) {
	bigTable(b)
	s := big.d.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		r, _ := s.Get(dm.VM.Class, big.refs[i%len(big.refs)])
		_ = s.Values(r)
	}
}

func BenchmarkGetByUUID(b *testing.B) {
	bigTable(b)
	s := big.d.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		if _, ok := s.ByUUID(dm.VM.Class, big.uuids[i%len(big.uuids)]); !ok {
			b.Fatal("missing")
		}
	}
}

func BenchmarkGetByNameLabel(b *testing.B) {
	bigTable(b)
	s := big.d.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		if len(s.ByNameLabel(dm.VM.Class, fmt.Sprintf("vm-%06d", i%100_000))) != 1 {
			b.Fatal("missing")
		}
	}
}

// BenchmarkGetByNameLabelScan is the baseline: xapi's linear scan.
func BenchmarkGetByNameLabelScan(b *testing.B) {
	bigTable(b)
	s := big.d.Snapshot()
	b.ResetTimer()
	for i := range b.N {
		want := fmt.Sprintf("vm-%06d", i%100_000)
		n := 0
		s.Ascend(dm.VM.Class, func(r *db.Row) bool {
			if r.Get(dm.VM.NameLabel) == want {
				n++
			}
			return true
		})
		if n != 1 {
			b.Fatal("missing")
		}
	}
}

func BenchmarkWhere10k(b *testing.B) {
	d := newDB(b)
	fill(b, d, 10_000, 1000)
	s := d.Snapshot()
	const expr = `field "power_state" = "Running" and not (field "is_a_template" = "true")`
	b.ResetTimer()
	for range b.N {
		rows, err := s.Where(dm.VM.Class, expr)
		if err != nil || len(rows) != 5000 {
			b.Fatal(len(rows), err)
		}
	}
}

// BenchmarkParallelReads measures get_record-style reads per second with
// several readers, with and without a writer running flat out. ns/op is
// wall time per read over all readers, so lower is more throughput.
func BenchmarkParallelReads(b *testing.B) {
	bigTable(b)
	for _, c := range []struct {
		readers int
		writer  bool
	}{{1, false}, {2, false}, {8, false}, {8, true}} {
		b.Run(fmt.Sprintf("readers=%d/writer=%t", c.readers, c.writer), func(b *testing.B) {
			stop := make(chan struct{})
			var writes atomic.Int64
			var wwg sync.WaitGroup
			if c.writer {
				wwg.Add(1)
				go func() {
					defer wwg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						big.d.Update(func(tx *db.Tx) error {
							return tx.Set(dm.VM.NameDescription, big.refs[i%len(big.refs)], fmt.Sprint(i))
						})
						writes.Add(1)
					}
				}()
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for range c.readers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						s := big.d.Snapshot()
						r, ok := s.Get(dm.VM.Class, big.refs[int(i)%len(big.refs)])
						if !ok {
							panic("missing")
						}
						_ = s.Values(r)
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(stop)
			wwg.Wait()
			if c.writer {
				b.ReportMetric(float64(writes.Load())/b.Elapsed().Seconds(), "writes/s")
			}
		})
	}
}
