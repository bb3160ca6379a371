package events_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/api/events"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// BenchmarkWriteToEvent measures the time from the start of a commit to
// the return of event.from calls waiting for it, with 1 and 100 watchers
// (each a client in an event.from loop). It reports the p50 and p99 over
// all watcher returns.
func BenchmarkWriteToEvent(b *testing.B) {
	for _, watchers := range []int{1, 100} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) {
			d := newDB(b)
			v := createVM(b, d, "v")
			for i := range 200 { // some other rows, so that tables are not trivial
				createVM(b, d, fmt.Sprint("other", i))
				createHost(b, d, fmt.Sprint("host", i))
			}
			s := sub(b, "vm", "host", "pool", "task")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			var start atomic.Int64 // unix nanos at the start of the current commit
			var ready atomic.Int64
			lat := make(chan time.Duration, watchers)
			var wg sync.WaitGroup
			for range watchers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tok := events.FormatToken(d.Generation())
					for {
						ready.Add(1)
						bt, err := events.From(ctx, d, s, tok, time.Minute)
						if err != nil {
							return
						}
						lat <- time.Duration(time.Now().UnixNano() - start.Load())
						tok = bt.Token
					}
				}()
			}
			all := make([]time.Duration, 0, b.N*watchers)
			b.ResetTimer()
			for i := range b.N {
				// Wait until every watcher is back in From, then give them
				// a moment to block.
				for ready.Load() < int64((i+1)*watchers) {
					runtime.Gosched()
				}
				time.Sleep(50 * time.Microsecond)
				start.Store(time.Now().UnixNano())
				if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, v, fmt.Sprint(i)) }); err != nil {
					b.Fatal(err)
				}
				for range watchers {
					all = append(all, <-lat)
				}
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			slices.Sort(all)
			b.ReportMetric(float64(all[len(all)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkIdleWaiters blocks 10,000 event.from calls, reports the memory
// each holds while idle (heap and stack, from runtime.MemStats), then wakes
// them all with one write and reports how long the last took to return.
func BenchmarkIdleWaiters(b *testing.B) {
	const n = 10000
	d := newDB(b)
	v := createVM(b, d, "v")
	s := sub(b, "vm", "host", "pool", "task")
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		tok := events.FormatToken(d.Generation())
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		var started, returned sync.WaitGroup
		started.Add(n)
		returned.Add(n)
		for range n {
			go func() {
				defer returned.Done()
				started.Done()
				if _, err := events.From(ctx, d, s, tok, time.Hour); err != nil {
					b.Error(err)
				}
			}()
		}
		started.Wait()
		time.Sleep(300 * time.Millisecond) // let them all block
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap := int64(after.HeapInuse) - int64(before.HeapInuse)
		stack := int64(after.StackInuse) - int64(before.StackInuse)
		b.ReportMetric(float64(heap+stack)/n, "bytes/waiter")
		b.ReportMetric(float64(stack)/n, "stack-bytes/waiter")
		t0 := time.Now()
		if _, err := d.Update(func(tx *db.Tx) error { _, err := tx.Touch(dm.VM.Class, v); return err }); err != nil {
			b.Fatal(err)
		}
		returned.Wait()
		b.ReportMetric(float64(time.Since(t0).Nanoseconds()), "wake-all-ns")
		cancel()
	}
}
