package xenops

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestQueueSerialisesPerVM(t *testing.T) {
	qs := newQueues(8)
	var running atomic.Int32
	var maxSame atomic.Int32
	var order []int
	var mu sync.Mutex
	var jobs []*job
	for i := range 20 {
		j := &job{ctx: context.Background(), name: "op", run: func(ctx context.Context) error {
			n := running.Add(1)
			if n > maxSame.Load() {
				maxSame.Store(n)
			}
			time.Sleep(time.Millisecond)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			running.Add(-1)
			return nil
		}}
		qs.submit("vm", j)
		jobs = append(jobs, j)
	}
	for _, j := range jobs {
		if err := j.wait(); err != nil {
			t.Fatal(err)
		}
	}
	if maxSame.Load() != 1 {
		t.Fatalf("%d operations ran at once on one VM", maxSame.Load())
	}
	for i, v := range order {
		if v != i {
			t.Fatalf("order %v", order)
		}
	}
}

func TestQueueParallelAcrossVMsWithinLimit(t *testing.T) {
	qs := newQueues(3)
	var running, peak atomic.Int32
	release := make(chan struct{})
	var jobs []*job
	for i := range 10 {
		j := &job{ctx: context.Background(), name: "op", run: func(ctx context.Context) error {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			running.Add(-1)
			return nil
		}}
		qs.submit(string(rune('a'+i)), j)
		jobs = append(jobs, j)
	}
	time.Sleep(50 * time.Millisecond)
	if peak.Load() != 3 {
		t.Fatalf("peak %d with a limit of 3", peak.Load())
	}
	qs.w.setLimit(5) // grows while busy
	time.Sleep(50 * time.Millisecond)
	if peak.Load() != 5 {
		t.Fatalf("peak %d after raising the limit to 5", peak.Load())
	}
	close(release)
	for _, j := range jobs {
		j.wait()
	}
	if limit, busy, waiting := qs.w.stats(); limit != 5 || busy != 0 || waiting != 0 {
		t.Fatalf("workers after: %d %d %d", limit, busy, waiting)
	}
}

func TestQueueCancelWhileQueued(t *testing.T) {
	qs := newQueues(4)
	block := make(chan struct{})
	first := &job{ctx: context.Background(), name: "long", run: func(ctx context.Context) error { <-block; return nil }}
	qs.submit("vm", first)
	ctx, cancel := context.WithCancel(context.Background())
	ran := false
	second := &job{ctx: ctx, name: "queued", run: func(ctx context.Context) error { ran = true; return nil }}
	qs.submit("vm", second)
	cancel()
	start := time.Now()
	if err := second.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("queued job: %v", err)
	}
	if time.Since(start) > 100*time.Millisecond {
		t.Fatal("a cancelled queued job waited for the one before it")
	}
	close(block)
	first.wait()
	third := &job{ctx: context.Background(), name: "after", run: func(ctx context.Context) error { return nil }}
	qs.submit("vm", third)
	third.wait()
	if ran {
		t.Fatal("the abandoned job ran")
	}
}

func TestQueueCoalescesChecks(t *testing.T) {
	qs := newQueues(4)
	block, started := make(chan struct{}), make(chan struct{})
	first := &job{ctx: context.Background(), name: "long", run: func(ctx context.Context) error { close(started); <-block; return nil }}
	qs.submit("vm", first)
	<-started
	var checks atomic.Int32
	queued := 0
	for range 10 {
		if qs.submit("vm", &job{ctx: context.Background(), name: "check", check: true, run: func(ctx context.Context) error {
			checks.Add(1)
			return nil
		}}) {
			queued++
		}
	}
	if queued != 1 || qs.depth("vm") != 1 {
		t.Fatalf("%d checks queued, depth %d", queued, qs.depth("vm"))
	}
	close(block)
	first.wait()
	deadline := time.Now().Add(time.Second)
	for checks.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if checks.Load() != 1 {
		t.Fatalf("%d checks ran", checks.Load())
	}
}

func TestQueueRecoversPanics(t *testing.T) {
	qs := newQueues(1)
	j := &job{ctx: context.Background(), name: "bad", run: func(ctx context.Context) error { panic("boom") }}
	qs.submit("vm", j)
	if err := j.wait(); err == nil {
		t.Fatal("a panic was not an error")
	}
	ok := &job{ctx: context.Background(), name: "good", run: func(ctx context.Context) error { return nil }}
	qs.submit("vm", ok)
	if err := ok.wait(); err != nil {
		t.Fatal(err)
	}
}

// TestWorkersDoReleasesOnPanic: a panic inside do gives its slot back.
func TestWorkersDoReleasesOnPanic(t *testing.T) {
	w := newWorkers(2)
	for range 5 {
		func() {
			defer func() { _ = recover() }()
			_ = w.do(context.Background(), func() error { panic("boom") })
		}()
	}
	if _, busy, _ := w.stats(); busy != 0 {
		t.Fatalf("%d slots still busy after panics", busy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.do(ctx, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}
