package xenops

import (
	"sync"
	"time"
)

// QueueProgress watches the VM queues for the daemon's watchdog. A VM's
// queue is stuck when the same job stays first in it: the operation
// ahead of it (or the wait for a worker) has not finished since.
type QueueProgress struct {
	m    *Manager
	mu   sync.Mutex
	seen map[*job]time.Time // each queue's first waiting job: when it was first seen there
}

// Progress starts watching the queues.
func (m *Manager) Progress() *QueueProgress {
	return &QueueProgress{m: m, seen: map[*job]time.Time{}}
}

// Stalled is how long the longest-stuck queue has not moved (0: every
// queue moved since the last look, or none has a job waiting). It is
// meant to be called every few seconds: a queue that moves between two
// looks is not seen to stall.
func (p *QueueProgress) Stalled() time.Duration {
	now := time.Now()
	heads := map[*job]bool{}
	qs := p.m.q
	qs.mu.Lock()
	for _, vq := range qs.q {
		if len(vq.jobs) > 0 {
			heads[vq.jobs[0]] = true
		}
	}
	qs.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	var worst time.Duration
	for j := range p.seen {
		if !heads[j] {
			delete(p.seen, j) // it moved on
		}
	}
	for j := range heads {
		first, ok := p.seen[j]
		if !ok {
			p.seen[j] = now
			continue
		}
		worst = max(worst, now.Sub(first))
	}
	return worst
}
