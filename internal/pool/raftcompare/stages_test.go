package raftcompare

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestEtcdStages follows every write of 16 writers through the three
// etcd nodes and logs, as p50 after the leader began writing it to its
// log, when each node began writing it and had it on disk, and when the
// leader applied it. It checks the
// one rule the parallel write must not break: when the leader applies a
// write, the write is on the disks of at least two of the three nodes.
func TestEtcdStages(t *testing.T) {
	if testing.Short() {
		t.Skip("a latency breakdown; run without -short")
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) { testEtcdStages(t, mode.async) })
	}
}

func testEtcdStages(t *testing.T, async bool) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type key struct {
		node  uint64
		stage string
	}
	var mu sync.Mutex
	ev := map[uint64]map[key]time.Time{}
	traceHook = func(node uint64, stage string, pid uint64) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		m := ev[pid]
		if m == nil {
			m = map[key]time.Time{}
			ev[pid] = m
		}
		if _, seen := m[key{node, stage}]; !seen {
			m[key{node, stage}] = now
		}
	}
	c, err := startEtcdCluster(ctx, dirs(t), async)
	if err != nil {
		traceHook = nil
		t.Fatal(err)
	}
	defer func() {
		c.Stop()
		traceHook = nil
	}()
	l := c.Leader()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 60 {
				if err := l.Write(ctx, cmdBytes); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := c.converged(ctx); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	var stages []key
	for _, n := range c.nodes {
		stages = append(stages, key{n.id, "writing"}, key{n.id, "synced"})
	}
	stages = append(stages, key{l.id, "applied"})
	d := map[key][]time.Duration{}
	var follower int
	for pid, m := range ev {
		t0, ok := m[key{l.id, "writing"}]
		applied, ok2 := m[key{l.id, "applied"}]
		if !ok || !ok2 {
			continue
		}
		durable := 0
		for _, n := range c.nodes {
			if s, ok := m[key{n.id, "synced"}]; ok && !s.After(applied) {
				durable++
			}
		}
		if durable < 2 {
			t.Errorf("write %#x applied on the leader while on %d disks", pid, durable)
		}
		if s, ok := m[key{l.id, "synced"}]; !ok || s.After(applied) {
			follower++ // committed by the two followers before the leader's own sync
		}
		for _, s := range stages {
			if x, ok := m[s]; ok {
				d[s] = append(d[s], x.Sub(t0))
			}
		}
	}
	for _, s := range stages {
		slices.Sort(d[s])
		if len(d[s]) > 0 {
			t.Logf("node %d %-7s p50 %6.3f ms after the leader began writing it (negative: before)", s.node, s.stage, float64(d[s][len(d[s])/2].Microseconds())/1000)
		}
	}
	t.Logf("%d of %d writes applied on the leader before its own sync of them had finished", follower, len(ev))
}
