// Package rafttest runs raft clusters inside one test process: the first
// tier of the pool's fault tests.
//
// A Cluster is N nodes (3 or 5, any number works) of hashicorp/raft, each
// with its log in raftwal segment files and its term and vote in a
// raftstore file (as the daemon keeps them) in its own temporary
// directory, a file snapshot store beside it, an FSM (a deterministic
// key/value map that records every entry it applies) and raft's
// in-memory transport wrapped by raftnet.Conservative, exactly as
// the daemon wraps its network transport. All nodes are bootstrapped with
// the same configuration.
//
// Faults:
//
//   - Cut(a, b) stops traffic between two nodes in both directions;
//     Isolate(i) cuts a node from every other; Partition(side...) splits
//     the cluster in two; Heal() restores every link.
//   - Kill(i) shuts a node down (raft stopped, transport and files
//     closed; the others see its link go dead); Restart(i) starts it again
//     on the same files with a fresh FSM, which raft refills by replaying
//     the log.
//
// Observation: Leader and WaitLeader find the leader (optionally among a
// subset of nodes, e.g. the majority side of a partition), Put writes
// through the current leader, WaitConverged waits for every live node to
// have applied everything the leader has, and CheckLogs compares the
// applied histories and the stored logs of all live nodes.
//
// The package's own tests are the tier-1 fault suite: election, 3- and
// 5-node replication, a 2/3 split of 5 nodes, the leader killed under 4
// concurrent writers (10 rounds) and the leader cut off into a minority
// while writing and healed while writing (20 rounds, the
// hashicorp/raft#695 scenario); every acknowledged write is checked on
// every live node and the logs compared after each round. Long mode,
// TOOLSTACKD_LONG=1, runs ten times the rounds:
//
//	TOOLSTACKD_LONG=1 go test -race -timeout 30m -v ./internal/testkit/rafttest
//
// Timeouts default to raft's own (1 s heartbeat and election timeout,
// 500 ms leader lease): CI machines are loaded and, with heartbeats on the
// main loop, a slow fsync must not look like a dead leader. Set
// RAFTTEST_LOG=1 to see raft's logs on stderr.
package rafttest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
	"toolstackd/internal/safepath"
)

// Options shape a Cluster. The zero value is a 3-node cluster with
// raft's default timeouts.
type Options struct {
	Nodes int
	// HeartbeatTimeout is also the election timeout; the leader lease is
	// half of it. Default 1 s.
	HeartbeatTimeout time.Duration
	// ApplyTimeout bounds Put (default 2 s).
	ApplyTimeout time.Duration
}

// Node is one member of a Cluster.
type Node struct {
	ID   raft.ServerID
	Addr raft.ServerAddress
	Dir  string

	alive  bool
	raft   *raft.Raft
	fsm    *FSM
	log    *raftwal.WAL     // raft's log, as the daemon keeps it
	stable *raftstore.Store // raft's term and vote
	inmem  *raft.InmemTransport
	trans  raft.Transport
}

// Cluster is a set of raft nodes in this process.
type Cluster struct {
	t    testing.TB
	opts Options

	mu    sync.Mutex
	nodes []*Node
	cut   map[[2]int]bool
}

// Config is the raft configuration the harness gives a node, with the
// harness's timeouts.
func (c *Cluster) Config(id raft.ServerID) *raft.Config {
	return Config(id, c.opts.HeartbeatTimeout)
}

// Config returns raft's default configuration for a node with the given
// heartbeat (and election) timeout, logging at warning level to stderr
// when RAFTTEST_LOG=1 and nowhere otherwise. Snapshots are rare enough
// that short tests never take one, so applied histories stay complete.
func Config(id raft.ServerID, heartbeat time.Duration) *raft.Config {
	if heartbeat <= 0 {
		heartbeat = time.Second
	}
	conf := raft.DefaultConfig()
	conf.LocalID = id
	conf.HeartbeatTimeout = heartbeat
	conf.ElectionTimeout = heartbeat
	conf.LeaderLeaseTimeout = heartbeat / 2
	conf.SnapshotThreshold = 1 << 20
	conf.SnapshotInterval = time.Hour
	out := io.Writer(io.Discard)
	if os.Getenv("RAFTTEST_LOG") == "1" {
		out = os.Stderr
	}
	conf.Logger = hclog.New(&hclog.LoggerOptions{Name: string(id), Output: out, Level: hclog.Warn})
	return conf
}

// NewCluster makes, bootstraps and starts a cluster; t's cleanup shuts
// it down.
func NewCluster(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.HeartbeatTimeout <= 0 {
		opts.HeartbeatTimeout = time.Second
	}
	if opts.ApplyTimeout <= 0 {
		opts.ApplyTimeout = 2 * time.Second
	}
	c := &Cluster{t: t, opts: opts, cut: make(map[[2]int]bool)}
	root := t.TempDir()
	var servers []raft.Server
	for i := range opts.Nodes {
		name := "node" + strconv.Itoa(i)
		dir, err := safepath.JoinName(root, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		n := &Node{ID: raft.ServerID(name), Addr: raft.ServerAddress(name), Dir: dir}
		c.nodes = append(c.nodes, n)
		servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: n.ID, Address: n.Addr})
	}
	t.Cleanup(c.Shutdown)
	for i, n := range c.nodes {
		if err := c.open(n); err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		snaps, err := raft.NewFileSnapshotStore(n.Dir, 2, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		err = raft.BootstrapCluster(c.Config(n.ID), n.log, n.stable, snaps, n.trans, raft.Configuration{Servers: servers})
		if err != nil {
			t.Fatalf("bootstrap node %d: %v", i, err)
		}
	}
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatalf("start node %d: %v", i, err)
		}
	}
	return c
}

// open opens a node's store and makes its transport.
func (c *Cluster) open(n *Node) error {
	st, err := raftstore.Open(n.Dir, raftstore.Options{})
	if err != nil {
		return err
	}
	wal, err := raftwal.Open(filepath.Join(n.Dir, "log"), raftwal.Options{})
	if err != nil {
		return errors.Join(err, st.Close())
	}
	_, inm := raft.NewInmemTransportWithTimeout(n.Addr, 500*time.Millisecond)
	n.log, n.stable, n.inmem, n.trans = wal, st, inm, raftnet.Conservative(inm)
	return nil
}

// start starts raft on node i (opened already on first start).
func (c *Cluster) start(i int) error {
	n := c.nodes[i]
	if n.log == nil {
		if err := c.open(n); err != nil {
			return err
		}
	}
	snaps, err := raft.NewFileSnapshotStore(n.Dir, 2, io.Discard)
	if err != nil {
		return err
	}
	fsm := NewFSM()
	r, err := raft.NewRaft(c.Config(n.ID), fsm, n.log, n.stable, snaps, n.trans)
	if err != nil {
		return err
	}
	c.mu.Lock()
	n.raft, n.fsm, n.alive = r, fsm, true
	c.rewireLocked()
	c.mu.Unlock()
	return nil
}

// rewireLocked makes the transports match the cut set and the live set.
func (c *Cluster) rewireLocked() {
	for i, a := range c.nodes {
		if a.inmem == nil {
			continue
		}
		for j, b := range c.nodes {
			if i == j {
				continue
			}
			if a.alive && b.alive && !c.cut[pair(i, j)] {
				a.inmem.Connect(b.Addr, b.inmem)
			} else {
				a.inmem.Disconnect(b.Addr)
			}
		}
	}
}

func pair(a, b int) [2]int {
	if a > b {
		a, b = b, a
	}
	return [2]int{a, b}
}

// N is the number of nodes.
func (c *Cluster) N() int { return len(c.nodes) }

// Raft returns node i's raft, nil while it is killed.
func (c *Cluster) Raft(i int) *raft.Raft {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.nodes[i].alive {
		return nil
	}
	return c.nodes[i].raft
}

// FSM returns node i's state machine (the one of its current run).
func (c *Cluster) FSM(i int) *FSM {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].fsm
}

// Alive reports whether node i is running.
func (c *Cluster) Alive(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].alive
}

// Cut stops traffic between nodes a and b, both ways.
func (c *Cluster) Cut(a, b int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut[pair(a, b)] = true
	c.rewireLocked()
}

// Isolate cuts node i from every other node.
func (c *Cluster) Isolate(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for j := range c.nodes {
		if j != i {
			c.cut[pair(i, j)] = true
		}
	}
	c.rewireLocked()
}

// Partition cuts every link between the nodes in side and the others,
// both ways: side and the rest can each talk among themselves only.
func (c *Cluster) Partition(side ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := make(map[int]bool, len(side))
	for _, i := range side {
		in[i] = true
	}
	for i := range c.nodes {
		for j := range c.nodes {
			if in[i] && !in[j] {
				c.cut[pair(i, j)] = true
			}
		}
	}
	c.rewireLocked()
}

// Heal restores every link between live nodes.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.cut)
	c.rewireLocked()
}

// Kill shuts node i down as a crash would leave it: raft stopped, its
// links dead, its files closed. Writes it acknowledged are in its store.
func (c *Cluster) Kill(i int) error {
	c.mu.Lock()
	n := c.nodes[i]
	if !n.alive {
		c.mu.Unlock()
		return fmt.Errorf("rafttest: node %d is not running", i)
	}
	n.alive = false
	c.rewireLocked()
	r, wal, st, inm := n.raft, n.log, n.stable, n.inmem
	n.log, n.stable, n.inmem, n.trans = nil, nil, nil, nil
	c.mu.Unlock()
	err := waitFuture(r.Shutdown(), 30*time.Second)
	_ = inm.Close()
	if cerr := errors.Join(wal.Close(), st.Close()); err == nil {
		err = cerr
	}
	return err
}

// Restart starts a killed node i again on its files.
func (c *Cluster) Restart(i int) error {
	if c.Alive(i) {
		return fmt.Errorf("rafttest: node %d is running", i)
	}
	return c.start(i)
}

// Shutdown stops every live node; the cluster's cleanup calls it.
func (c *Cluster) Shutdown() {
	for i := range c.nodes {
		if c.Alive(i) {
			_ = c.Kill(i)
		}
	}
}

// Leader returns the index of a live node that is leader, among only
// (all nodes when only is empty), or -1.
func (c *Cluster) Leader(only ...int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	cands := only
	if len(cands) == 0 {
		for i := range c.nodes {
			cands = append(cands, i)
		}
	}
	for _, i := range cands {
		if n := c.nodes[i]; n.alive && n.raft.State() == raft.Leader {
			return i
		}
	}
	return -1
}

// WaitLeader waits up to timeout for a leader among only (see Leader).
func (c *Cluster) WaitLeader(timeout time.Duration, only ...int) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if l := c.Leader(only...); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("rafttest: no leader among %v after %v", only, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ErrFutureStuck is returned when raft has not resolved a future long
// after its timeout; the write counts as not acknowledged (a client would
// have given up), and the test does not hang.
var ErrFutureStuck = errors.New("rafttest: raft future unresolved after its bound")

func waitFuture(f raft.Future, bound time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return ErrFutureStuck
	}
}

// ErrNoLeader is returned by Put when no live node is leader.
var ErrNoLeader = errors.New("rafttest: no leader")

// Put writes key=value through the current leader and returns which
// node was leader and the raft index the write was committed at. A nil
// error means the write is acknowledged: committed by a majority and
// applied on that leader.
func (c *Cluster) Put(key, value string) (leader int, index uint64, err error) {
	l := c.Leader()
	if l < 0 {
		return -1, 0, ErrNoLeader
	}
	r := c.Raft(l)
	if r == nil {
		return -1, 0, ErrNoLeader
	}
	f := r.Apply(EncodePut(key, value), c.opts.ApplyTimeout)
	if err := waitFuture(f, 5*c.opts.ApplyTimeout); err != nil {
		return l, 0, err
	}
	switch v := f.Response().(type) {
	case uint64:
		return l, v, nil
	case error:
		return l, 0, v
	default:
		return l, 0, fmt.Errorf("rafttest: unexpected apply result %T", v)
	}
}

// WaitConverged waits up to timeout until there is a leader, it has
// applied everything committed (a barrier), and every live node has
// applied the same last entry.
func (c *Cluster) WaitConverged(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.converged(time.Until(deadline))
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Cluster) converged(left time.Duration) error {
	if left < 100*time.Millisecond {
		left = 100 * time.Millisecond
	}
	l := c.Leader()
	if l < 0 {
		return ErrNoLeader
	}
	r := c.Raft(l)
	if r == nil {
		return ErrNoLeader
	}
	if err := waitFuture(r.Barrier(left), left+5*time.Second); err != nil {
		return fmt.Errorf("rafttest: barrier on node %d: %w", l, err)
	}
	want := c.FSM(l).LastApplied()
	for i := range c.nodes {
		if !c.Alive(i) {
			continue
		}
		if got := c.FSM(i).LastApplied(); got != want {
			return fmt.Errorf("rafttest: node %d applied up to %d, leader %d up to %d", i, got, l, want)
		}
	}
	return nil
}

// CheckLogs compares the live nodes: their FSMs applied the same entries
// in the same order, and their stored logs hold the same entries over the
// range every one of them still has. Call it after WaitConverged.
func (c *Cluster) CheckLogs() error {
	ref := -1
	var refApplied []Entry
	for i := range c.nodes {
		if !c.Alive(i) {
			continue
		}
		a := c.FSM(i).Applied()
		if ref < 0 {
			ref, refApplied = i, a
			continue
		}
		if len(a) != len(refApplied) {
			return fmt.Errorf("rafttest: node %d applied %d entries, node %d %d", i, len(a), ref, len(refApplied))
		}
		for k := range a {
			if a[k] != refApplied[k] {
				return fmt.Errorf("rafttest: applied entry %d differs: node %d %+v, node %d %+v", k, i, a[k], ref, refApplied[k])
			}
		}
	}
	return c.compareStores()
}

func (c *Cluster) compareStores() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var live []*Node
	var lo, hi uint64 = 0, ^uint64(0)
	for _, n := range c.nodes {
		if !n.alive {
			continue
		}
		f, err := n.log.FirstIndex()
		if err != nil {
			return err
		}
		l, err := n.log.LastIndex()
		if err != nil {
			return err
		}
		lo, hi = max(lo, f), min(hi, l)
		live = append(live, n)
	}
	for idx := lo; idx <= hi && idx != 0; idx++ {
		var first raft.Log
		for k, n := range live {
			var l raft.Log
			if err := n.log.GetLog(idx, &l); err != nil {
				return fmt.Errorf("rafttest: %s: log %d: %w", n.ID, idx, err)
			}
			l.AppendedAt = time.Time{} // each node stamps its own
			if k == 0 {
				first = l
			} else if !reflect.DeepEqual(l, first) {
				return fmt.Errorf("rafttest: stored log %d differs between %s (term %d) and %s (term %d)", idx, live[0].ID, first.Term, n.ID, l.Term)
			}
		}
	}
	return nil
}
