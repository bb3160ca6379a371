package raftcompare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
	"toolstackd/internal/testkit/rafttest"
)

// ---- hashicorp/raft, set up as the groundwork benchmarks do ----

type hashiCluster struct {
	rafts   []*raft.Raft
	fsms    []*rafttest.FSM
	closers []func() error
	leader  *raft.Raft
}

// filler is where commands take their padding from.
var filler = strings.Repeat("v", 64<<10)

type closingLogStore interface {
	raft.LogStore
	Close() error
}

// startHashiCluster starts 3 nodes on 127.0.0.1–3 over raft's TCP
// transport wrapped in the daemon's Conservative, the log of
// kind "wal" (raftwal) or "bbolt" (raftstore) and the stable store on
// raftstore, each under its own directory of dirs.
func startHashiCluster(ctx context.Context, kind string, dirs []string) (*hashiCluster, error) {
	c := &hashiCluster{}
	var trans []raft.Transport
	var servers []raft.Server
	for i := range dirs {
		t, err := raft.NewTCPTransport(fmt.Sprintf("127.0.0.%d:0", i+1), nil, 3, 5*time.Second, io.Discard)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.closers = append(c.closers, t.Close)
		trans = append(trans, raftnet.Conservative(t))
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(fmt.Sprint("n", i+1)), Address: t.LocalAddr()})
	}
	for i, dir := range dirs {
		stable, err := raftstore.Open(dir, raftstore.Options{})
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.closers = append(c.closers, stable.Close)
		var logs closingLogStore = stable
		if kind == "wal" {
			if err := os.MkdirAll(filepath.Join(dir, "wal"), 0o700); err != nil {
				c.Stop()
				return nil, err
			}
			w, err := raftwal.Open(filepath.Join(dir, "wal"), raftwal.Options{})
			if err != nil {
				c.Stop()
				return nil, err
			}
			c.closers = append(c.closers, w.Close)
			logs = w
		}
		conf := rafttest.Config(servers[i].ID, time.Second)
		snaps := raft.NewInmemSnapshotStore()
		if err := raft.BootstrapCluster(conf, logs, stable, snaps, trans[i], raft.Configuration{Servers: servers}); err != nil {
			c.Stop()
			return nil, err
		}
		fsm := rafttest.NewFSM()
		r, err := raft.NewRaft(conf, fsm, logs, stable, snaps, trans[i])
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.rafts = append(c.rafts, r)
		c.fsms = append(c.fsms, fsm)
	}
	for c.leader == nil {
		for _, r := range c.rafts {
			if r.State() == raft.Leader {
				c.leader = r
			}
		}
		if c.leader != nil {
			break
		}
		select {
		case <-ctx.Done():
			c.Stop()
			return nil, fmt.Errorf("no hashicorp leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := c.leader.Barrier(10 * time.Second).Error(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// leaderNow is the node that leads now, or nil: on a loaded machine a
// starved heartbeat can move leadership during a measurement.
func (c *hashiCluster) leaderNow() *raft.Raft {
	for _, r := range c.rafts {
		if r.State() == raft.Leader {
			return r
		}
	}
	return nil
}

// Write applies a put whose command is size bytes on the leader and
// waits for its FSM to apply it.
func (c *hashiCluster) Write(_ context.Context, key string, size int) error {
	l := c.leaderNow()
	if l == nil {
		return raft.ErrNotLeader
	}
	f := l.Apply(rafttest.EncodePut(key, filler[:max(size-len(key)-1, 1)]), 10*time.Second)
	if err := f.Error(); err != nil {
		return err
	}
	if err, ok := f.Response().(error); ok {
		return err
	}
	return nil
}

// converged waits until every FSM applied what the leader's did and
// checks the histories are the same.
func (c *hashiCluster) converged(ctx context.Context) error {
	for c.leader = c.leaderNow(); c.leader == nil; c.leader = c.leaderNow() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("no hashicorp leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := c.leader.Barrier(10 * time.Second).Error(); err != nil {
		return err
	}
	var want []rafttest.Entry
	for i, r := range c.rafts {
		if r == c.leader {
			want = c.fsms[i].Applied()
		}
	}
	for i, f := range c.fsms {
		for f.LastApplied() < want[len(want)-1].Index {
			select {
			case <-ctx.Done():
				return fmt.Errorf("node %d behind: %w", i+1, ctx.Err())
			case <-time.After(10 * time.Millisecond):
			}
		}
		got := f.Applied()
		if len(got) < len(want) {
			return fmt.Errorf("node %d applied %d entries, the leader %d", i+1, len(got), len(want))
		}
		for j := range want {
			if got[j] != want[j] {
				return fmt.Errorf("node %d applied %+v at %d, the leader %+v", i+1, got[j], j, want[j])
			}
		}
	}
	return nil
}

func (c *hashiCluster) Stop() {
	var errs []error
	for _, r := range c.rafts {
		errs = append(errs, r.Shutdown().Error())
	}
	for i := len(c.closers) - 1; i >= 0; i-- {
		errs = append(errs, c.closers[i]())
	}
	_ = errors.Join(errs...)
}

// ---- the floor: one host's fsync'd append, group-committed ----

type floorReq struct {
	b    []byte
	done chan error
}

// floor appends records to one file: a single goroutine writes whatever
// is queued with one write and one fdatasync and then releases the
// writers, as a host's group commit does.
type floor struct {
	f    *os.File
	reqs chan floorReq
	quit chan struct{}
	done chan struct{}
}

func openFloor(dir string) (*floor, error) {
	f, err := os.OpenFile(filepath.Join(dir, "floor.log"), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600) //nolint:gosec // a test's temporary directory
	if err != nil {
		return nil, err
	}
	fl := &floor{f: f, reqs: make(chan floorReq, 64), quit: make(chan struct{}), done: make(chan struct{})}
	go fl.loop()
	return fl, nil
}

func (fl *floor) loop() {
	defer close(fl.done)
	var batch []floorReq
	var buf []byte
	for {
		batch, buf = batch[:0], buf[:0]
		select {
		case <-fl.quit:
			return
		case r := <-fl.reqs:
			batch = append(batch, r)
		}
		for more := true; more; {
			select {
			case r := <-fl.reqs:
				batch = append(batch, r)
			default:
				more = false
			}
		}
		for _, r := range batch {
			buf = append(buf, r.b...)
		}
		_, err := fl.f.Write(buf)
		if err == nil {
			err = fdatasync(fl.f)
		}
		for _, r := range batch {
			r.done <- err
		}
	}
}

// Write appends size bytes and waits until they are synced.
func (fl *floor) Write(ctx context.Context, size int) error {
	r := floorReq{b: make([]byte, size), done: make(chan error, 1)}
	select {
	case fl.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (fl *floor) Close() error {
	close(fl.quit)
	<-fl.done
	return fl.f.Close()
}
