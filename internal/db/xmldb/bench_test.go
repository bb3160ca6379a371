package xmldb

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// benchVM is a VM shaped like a real one: a few maps and sets with
// content, most fields at their defaults.
func benchVM(i int) []any {
	return (&dm.VMRecord{
		NameLabel:       fmt.Sprintf("vm-%06d", i),
		NameDescription: "benchmark VM, created by the state.db benchmark",
		PowerState:      []dm.VMPowerState{dm.VMPowerStateHalted, dm.VMPowerStateRunning}[i%2],
		MemoryStaticMax: 4 << 30, MemoryDynamicMax: 4 << 30, MemoryDynamicMin: 2 << 30, MemoryStaticMin: 1 << 30,
		VCPUsMax: 4, VCPUsAtStartup: 2, HVMShadowMultiplier: 1,
		HVMBootPolicy: "BIOS order",
		HVMBootParams: map[string]string{"order": "cd"},
		Platform:      map[string]string{"acpi": "1", "apic": "true", "pae": "true", "viridian": "true", "nx": "true"},
		OtherConfig: map[string]string{"install-methods": "cdrom,nfs,http,ftp", "base_template_name": "Other install media",
			"import_task": "OpaqueRef:NULL", "mac_seed": fmt.Sprintf("5c1f%04x-2b1e-4f7e-8d2c-0a1b2c3d4e5f", i%65536)},
		AllowedOperations: []dm.VMOperations{dm.VMOperationsStart, dm.VMOperationsClone, dm.VMOperationsCopy, dm.VMOperationsExport},
		Tags:              []string{"bench"},
		UserVersion:       1,
		GenerationID:      "0:0",
		HasVendorDevice:   true,
	}).Row()
}

type benchDB struct {
	snap *db.Snapshot
	data []byte
}

var (
	benchOnce sync.Once
	bench100k benchDB // 100,000 VMs
	bench15   benchDB // about 15 MiB of VMs
)

func makeBenchDB(b *testing.B, n int) benchDB {
	d := db.New(dm.Model, db.Options{})
	for i := 0; i < n; i += 10000 {
		mustUpdate(b, d, func(tx *db.Tx) error {
			for j := i; j < min(i+10000, n); j++ {
				if _, err := tx.Insert(dm.VM.Class, "", benchVM(j)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	snap := d.Snapshot()
	return benchDB{snap: snap, data: encode(b, dm.Model, snap)}
}

func benchDBs(b *testing.B) {
	benchOnce.Do(func() {
		bench100k = makeBenchDB(b, 100000)
		perVM := float64(len(bench100k.data)) / 100000
		bench15 = makeBenchDB(b, int(15<<20/perVM))
	})
}

// measure runs op in the benchmark loop and reports, besides wall time
// and throughput, the process CPU time per op (the machine may be shared).
func measure(b *testing.B, x *benchDB, op func() error) {
	b.SetBytes(int64(len(x.data)))
	b.ReportAllocs()
	start, n := cpuTime(), 0
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(len(x.data))/(1<<20), "file-MiB")
	if cpu := cpuTime() - start; cpu > 0 {
		b.ReportMetric(cpu.Seconds()/float64(n), "cpu-s/op")
		b.ReportMetric(float64(len(x.data))/(1<<20)/(cpu.Seconds()/float64(n)), "MiB/cpu-s")
	}
}

func benchEncode(b *testing.B, x *benchDB) {
	measure(b, x, func() error { return Encode(io.Discard, dm.Model, x.snap) })
}

func benchDecode(b *testing.B, x *benchDB) {
	var dump *Dump
	measure(b, x, func() (err error) {
		dump, err = Decode(bytes.NewReader(x.data), dm.Model)
		return err
	})
	// What a decoded file keeps in memory.
	dump = nil
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	dump, _ = Decode(bytes.NewReader(x.data), dm.Model)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(dump)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "retained-MiB")
}

func BenchmarkEncode100kVMs(b *testing.B) { benchDBs(b); benchEncode(b, &bench100k) }
func BenchmarkDecode100kVMs(b *testing.B) { benchDBs(b); benchDecode(b, &bench100k) }
func BenchmarkEncode15MiB(b *testing.B)   { benchDBs(b); benchEncode(b, &bench15) }
func BenchmarkDecode15MiB(b *testing.B)   { benchDBs(b); benchDecode(b, &bench15) }
