package dbraft

import (
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
)

// BenchmarkWrite measures a durable write (one setter, as
// VM.set_name_description makes) on a host alone (its file synced) and
// on the coordinator of an in-process pool of 3 (raft's log on disk, the
// in-memory transport), with 1 and 16 writers. It reports the latency a
// writer sees, p50 and p99, beside ns/op (throughput).
func BenchmarkWrite(b *testing.B) {
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.DiscardHandler))
	b.Cleanup(func() { slog.SetDefault(prev) })
	for _, writers := range []int{1, 16} {
		b.Run("alone/writers="+itoa(writers), func(b *testing.B) {
			r := New(Options{Model: dm.Model})
			store, err := r.OpenStore(filepath.Join(b.TempDir(), "toolstackd.db"), persist.Options{})
			if err != nil {
				b.Fatal(err)
			}
			d := db.New(dm.Model, db.Options{Persister: r})
			if err := store.Load(d); err != nil {
				b.Fatal(err)
			}
			r.Attach(d)
			b.Cleanup(func() { _ = r.Close(); _ = store.Close() })
			benchWrites(b, d, writers)
		})
		b.Run("pool3/writers="+itoa(writers), func(b *testing.B) {
			p := newPool(b, 3)
			benchWrites(b, p.waitLeader().d, writers)
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// benchWrites runs b.N setter writes from writers goroutines, each on a
// VM of its own, and reports their latencies.
func benchWrites(b *testing.B, d *db.DB, writers int) {
	vms := make([]string, writers)
	for i := range vms {
		ref, err := createVM(d, "bench")
		if err != nil {
			b.Fatal(err)
		}
		vms[i] = ref
	}
	lat := make([][]time.Duration, writers)
	var wg sync.WaitGroup
	b.ResetTimer()
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				t0 := time.Now()
				_, err := d.Update(func(tx *db.Tx) error {
					return tx.Set(dm.VM.NameDescription, vms[w], itoa(i))
				})
				if err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
}
