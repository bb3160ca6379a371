package raftwal_test

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
	"toolstackd/internal/testkit/rafttest"
)

// The comparison that moved the daemon's raft log here: raft's log on
// bbolt (internal/pool/raftstore, where the daemon kept it before)
// against this segment log, first alone (StoreLogs of 1 and 16 entries of 512 bytes, synced),
// then under a 3-node raft on the in-memory transport with the daemon's
// heartbeat workaround (the latency of one Apply, 1 and 16 writers).
//
//	go test -run '^$' -bench . ./internal/pool/raftwal/

type logStore interface {
	raft.LogStore
	Close() error
}

func openKind(b *testing.B, kind, dir string) logStore {
	switch kind {
	case "bbolt":
		s, err := raftstore.Open(dir, raftstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return s
	default:
		w, err := raftwal.Open(dir, raftwal.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
}

var kinds = []string{"bbolt", "wal"}

func BenchmarkStoreLogs(b *testing.B) {
	for _, per := range []int{1, 16} {
		for _, kind := range kinds {
			b.Run(fmt.Sprintf("%s/entries=%d", kind, per), func(b *testing.B) {
				s := openKind(b, kind, b.TempDir())
				defer func() { _ = s.Close() }()
				payload := bytes.Repeat([]byte{0xab}, 512)
				next := uint64(1)
				logs := make([]*raft.Log, per)
				var lat []time.Duration
				for b.Loop() {
					for i := range logs {
						logs[i] = &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: payload, AppendedAt: time.Now()}
						next++
					}
					t0 := time.Now()
					if err := s.StoreLogs(logs); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				report(b, lat)
			})
		}
	}
}

// BenchmarkRaftApply: the latency of raft.Apply on the leader of 3 nodes,
// each with its log and stable state on disk (the stable state stays on
// bbolt for both kinds: raft writes it at elections only).
func BenchmarkRaftApply(b *testing.B) {
	for _, writers := range []int{1, 16} {
		for _, kind := range kinds {
			b.Run(fmt.Sprintf("%s/writers=%d", kind, writers), func(b *testing.B) {
				leader := cluster(b, kind)
				var mu sync.Mutex
				var lat []time.Duration
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
						mine := make([]time.Duration, 0, n)
						for i := range n {
							t0 := time.Now()
							if err := leader.Apply(rafttest.EncodePut(fmt.Sprint("k", w), fmt.Sprint(i)), 5*time.Second).Error(); err != nil {
								b.Error(err)
								return
							}
							mine = append(mine, time.Since(t0))
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.StopTimer()
				report(b, lat)
			})
		}
	}
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// cluster starts 3 nodes whose logs are of the kind given and returns the
// leader.
func cluster(b *testing.B, kind string) *raft.Raft {
	type node struct {
		id    raft.ServerID
		trans *raft.InmemTransport
		r     *raft.Raft
	}
	var nodes []*node
	for i := range 3 {
		_, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprint("n", i)))
		nodes = append(nodes, &node{id: raft.ServerID(fmt.Sprint("n", i)), trans: trans})
	}
	for _, a := range nodes {
		for _, o := range nodes {
			if a != o {
				a.trans.Connect(o.trans.LocalAddr(), o.trans)
			}
		}
	}
	var servers []raft.Server
	for _, n := range nodes {
		servers = append(servers, raft.Server{ID: n.id, Address: n.trans.LocalAddr()})
	}
	for _, n := range nodes {
		logs := openKind(b, kind, b.TempDir())
		stable, err := raftstore.Open(b.TempDir(), raftstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		conf := raft.DefaultConfig()
		conf.LocalID = n.id
		conf.Logger = hclog.New(&hclog.LoggerOptions{Output: io.Discard, Level: hclog.Off})
		snaps := raft.NewInmemSnapshotStore()
		trans := raftnet.Conservative(n.trans)
		if err := raft.BootstrapCluster(conf, logs, stable, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			b.Fatal(err)
		}
		r, err := raft.NewRaft(conf, rafttest.NewFSM(), logs, stable, snaps, trans)
		if err != nil {
			b.Fatal(err)
		}
		n.r = r
		b.Cleanup(func() {
			_ = r.Shutdown().Error()
			_ = logs.Close()
			_ = stable.Close()
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n.r.State() == raft.Leader {
				if err := n.r.Barrier(5 * time.Second).Error(); err != nil {
					b.Fatal(err)
				}
				return n.r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatal("no leader")
	return nil
}
