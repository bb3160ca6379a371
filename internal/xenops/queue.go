package xenops

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Operations on one VM run one at a time, in order, from that VM's
// queue; operations on different VMs run in parallel, at most Workers at
// once. The limit can be changed while running.

// workers is a counting semaphore whose size can change, granting slots
// in arrival order.
type workers struct {
	mu      sync.Mutex
	limit   int
	busy    int
	waiting []chan struct{}
}

func newWorkers(n int) *workers {
	if n < 1 {
		n = 1
	}
	return &workers{limit: n}
}

func (w *workers) acquire(ctx context.Context) error {
	w.mu.Lock()
	if w.busy < w.limit && len(w.waiting) == 0 {
		w.busy++
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.waiting = append(w.waiting, ch)
	w.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		w.mu.Lock()
		for i, c := range w.waiting {
			if c == ch {
				w.waiting = append(w.waiting[:i:i], w.waiting[i+1:]...)
				w.mu.Unlock()
				return ctx.Err()
			}
		}
		w.mu.Unlock()
		// Granted while giving up: hand the slot on.
		w.release()
		return ctx.Err()
	}
}

// do runs fn holding a slot. The slot is released by a defer, so that a
// panic in fn, recovered further up, still gives it back.
func (w *workers) do(ctx context.Context, fn func() error) error {
	if err := w.acquire(ctx); err != nil {
		return err
	}
	defer w.release()
	return fn()
}

func (w *workers) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.busy <= w.limit && len(w.waiting) > 0 {
		ch := w.waiting[0]
		w.waiting = w.waiting[1:]
		close(ch) // the slot passes on: busy is unchanged
		return
	}
	w.busy--
}

func (w *workers) setLimit(n int) {
	if n < 1 {
		n = 1
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.limit = n
	for w.busy < w.limit && len(w.waiting) > 0 {
		w.busy++
		close(w.waiting[0])
		w.waiting = w.waiting[1:]
	}
}

func (w *workers) stats() (limit, busy, waiting int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.limit, w.busy, len(w.waiting)
}

const (
	jobQueued int32 = iota
	jobStarted
	jobAbandoned
)

// job is one queued operation.
type job struct {
	ctx   context.Context
	name  string
	check bool // a "needs attention" check: coalesced
	run   func(ctx context.Context) error
	done  chan error
	state atomic.Int32
}

type vmQueue struct {
	jobs         []*job
	checkPending bool
}

type queues struct {
	w  *workers
	mu sync.Mutex
	q  map[string]*vmQueue
}

func newQueues(n int) *queues { return &queues{w: newWorkers(n), q: map[string]*vmQueue{}} }

// submit queues a job for a VM. A check job is dropped when one is
// already waiting for that VM: checks carry no intent, so one suffices.
func (qs *queues) submit(vm string, j *job) bool {
	j.done = make(chan error, 1)
	qs.mu.Lock()
	vq := qs.q[vm]
	start := vq == nil
	if start {
		vq = &vmQueue{}
		qs.q[vm] = vq
	}
	if j.check {
		if vq.checkPending {
			qs.mu.Unlock()
			return false
		}
		vq.checkPending = true
	}
	vq.jobs = append(vq.jobs, j)
	qs.mu.Unlock()
	if start {
		go qs.drain(vm, vq)
	}
	return true
}

// drain runs a VM's jobs until its queue is empty.
func (qs *queues) drain(vm string, vq *vmQueue) {
	for {
		qs.mu.Lock()
		if len(vq.jobs) == 0 {
			delete(qs.q, vm)
			qs.mu.Unlock()
			return
		}
		j := vq.jobs[0]
		vq.jobs[0] = nil
		vq.jobs = vq.jobs[1:]
		if j.check {
			vq.checkPending = false
		}
		qs.mu.Unlock()
		if !j.state.CompareAndSwap(jobQueued, jobStarted) {
			j.done <- context.Canceled // abandoned by its caller
			continue
		}
		err := j.ctx.Err()
		if err == nil {
			err = qs.w.do(j.ctx, func() error { return runJob(j) })
		}
		j.done <- err
	}
}

func runJob(j *job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: panic: %v", j.name, r)
		}
	}()
	return j.run(j.ctx)
}

// wait returns the job's result. A job cancelled before it started
// returns at once; one that started is waited for, since it must leave
// its VM in a valid state before anyone else touches it.
func (j *job) wait() error {
	select {
	case err := <-j.done:
		return err
	case <-j.ctx.Done():
		if j.state.CompareAndSwap(jobQueued, jobAbandoned) {
			return j.ctx.Err()
		}
		return <-j.done
	}
}

// depth is how many jobs wait for a VM (for tests and diagnostics).
func (qs *queues) depth(vm string) int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if vq := qs.q[vm]; vq != nil {
		return len(vq.jobs)
	}
	return 0
}

// total is how many jobs wait over every VM.
func (qs *queues) total() int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	n := 0
	for _, vq := range qs.q {
		n += len(vq.jobs)
	}
	return n
}

// QueueDepth is how many VM operations wait for their turn on this
// host (for metrics).
func (m *Manager) QueueDepth() int { return m.q.total() }
