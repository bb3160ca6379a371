package persist_test

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
)

// BenchmarkDurableWrites measures acknowledged (fsynced) writes per second
// with 1, 16 and 64 concurrent writers, each write its own transaction.
func BenchmarkDurableWrites(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			st, d := open(b, filepath.Join(b.TempDir(), "state.db"), persist.Options{})
			defer st.Close()
			var ref string
			d.Update(func(tx *db.Tx) (err error) {
				ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "target"}).Row())
				return
			})
			syncs := st.Syncs()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + writers - 1) / writers
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						if _, err := d.Update(func(tx *db.Tx) error {
							return tx.Set(dm.VM.NameDescription, ref, fmt.Sprint(w, "-", i))
						}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			n := per * writers
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "writes/s")
			b.ReportMetric(float64(n)/float64(st.Syncs()-syncs), "writes/sync")
		})
	}
}

// BenchmarkStartup100k measures opening and loading a file of 100,000
// VMs (plus a VBD each, for the relation rebuild).
func BenchmarkStartup100k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "state.db")
	st, d := open(b, path, persist.Options{})
	for i := 0; i < 100_000; i += 1000 {
		if _, err := d.Update(func(tx *db.Tx) error {
			for j := i; j < i+1000; j++ {
				vm, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprintf("vm-%06d", j), MemoryStaticMax: 1 << 30,
					OtherConfig: map[string]string{"a": "b"}, Platform: map[string]string{"acpi": "1"}}).Row())
				if err != nil {
					return err
				}
				if j%2 == 0 {
					if _, err := tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(vm), Userdevice: "0", Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk}).Row()); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	st.Close()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		st, d := open(b, path, persist.Options{})
		if d.Snapshot().Count(dm.VM.Class) != 100_000 {
			b.Fatal("lost rows")
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/startup")
		st.Close()
	}
}
