package dbraft

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
	"toolstackd/internal/schema"
)

// node is one host of an in-process pool: its file, database, replicator
// and raft transport.
type node struct {
	id    raft.ServerID
	dir   string
	trans *raft.InmemTransport
	r     *Replicator
	store *persist.Store
	d     *db.DB
}

type pool struct {
	t     testing.TB
	tune  func(*raft.Config)
	nodes []*node
	mu    sync.Mutex // guards the leader lookups of Forward
}

// tune sets raft's timeouts for the tests: raft's own defaults of a
// second. A member's first contact installs a snapshot, which takes about
// 100 ms on a quiet machine with the race detector; with a lease of
// 150 ms a busy machine let it run out meanwhile, the leader stepped
// down, and the pool failed to form.
func tune(c *raft.Config) {
	c.HeartbeatTimeout = time.Second
	c.ElectionTimeout = time.Second
	c.LeaderLeaseTimeout = time.Second
}

func (p *pool) open(n *node) {
	t := p.t
	n.r = New(Options{Model: dm.Model, Forward: p.forward})
	var err error
	n.store, err = n.r.OpenStore(filepath.Join(n.dir, "toolstackd.db"), persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n.d = db.New(dm.Model, db.Options{Persister: n.r})
	if err := n.store.Load(n.d); err != nil {
		t.Fatal(err)
	}
	n.r.Attach(n.d)
}

func (p *pool) start(n *node, bootstrap bool) {
	if err := n.r.Start(StartOptions{ID: n.id, Dir: filepath.Join(n.dir, "raft"), Transport: n.trans,
		Bootstrap: bootstrap, Tune: p.tune, LogOutput: raftLog()}); err != nil {
		p.t.Fatal(err)
	}
}

// raftLog is where raft logs: nowhere, or stderr with DBRAFT_LOG=1.
func raftLog() io.Writer {
	if os.Getenv("DBRAFT_LOG") == "1" {
		return os.Stderr
	}
	return io.Discard
}

func (p *pool) close(n *node) {
	if err := n.r.Close(); err != nil {
		p.t.Log(err)
	}
	if err := n.store.Close(); err != nil {
		p.t.Log(err)
	}
}

// forward is every member's Forward: to whichever node leads now.
func (p *pool) forward(ctx context.Context, entry []byte) (uint64, error) {
	for _, n := range p.live() {
		if n.r.Mode() == Leader {
			return n.r.ApplyRemote(ctx, entry)
		}
	}
	return 0, ErrNotLeader
}

func (p *pool) live() []*node {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*node(nil), p.nodes...)
}

// kill takes a node out of the pool and closes it (raft stops without a
// transfer); it returns the nodes left.
func (p *pool) kill(n *node) []*node {
	p.mu.Lock()
	p.nodes = slices.DeleteFunc(p.nodes, func(x *node) bool { return x == n })
	rest := append([]*node(nil), p.nodes...)
	p.mu.Unlock()
	p.close(n)
	return rest
}

// revive brings a killed node back from its files, as a follower.
func (p *pool) revive(n *node) {
	p.open(n)
	p.wire(n)
	p.start(n, false)
	p.mu.Lock()
	p.nodes = append(p.nodes, n)
	p.mu.Unlock()
}

// newPool makes n hosts; the first boots a database and makes a pool of
// itself, the others join it as voters.
func newPool(t testing.TB, n int) *pool { return newPoolTuned(t, n, tune) }

// newPoolTuned is newPool with raft configured by tuneFn.
func newPoolTuned(t testing.TB, n int, tuneFn func(*raft.Config)) *pool {
	p := &pool{t: t, tune: tuneFn}
	for i := range n {
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprint("host", i)))
		p.nodes = append(p.nodes, &node{id: raft.ServerID(fmt.Sprint("host", i)), dir: t.TempDir(), trans: trans})
		_ = addr
	}
	for _, nd := range p.nodes {
		p.wire(nd)
	}
	for _, nd := range p.nodes {
		p.open(nd)
	}
	t.Cleanup(func() {
		for _, nd := range p.live() {
			p.close(nd)
		}
	})
	first := p.nodes[0]
	if _, err := api.FirstBoot(first.d, api.ProbeHost(), api.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	p.start(first, true)
	p.waitLeader(first)
	if err := first.r.Compact(); err != nil {
		t.Fatal(err)
	}
	for _, nd := range p.nodes[1:] {
		p.start(nd, false)
		if err := first.r.Raft().AddVoter(nd.id, nd.trans.LocalAddr(), 0, 5*time.Second).Error(); err != nil {
			t.Fatal(err)
		}
	}
	p.converge()
	return p
}

// wire connects a node's transport with every other's, both ways (raft
// closing a node's transport at shutdown drops its links).
func (p *pool) wire(n *node) {
	for _, o := range p.nodes {
		if o != n {
			n.trans.Connect(o.trans.LocalAddr(), o.trans)
			o.trans.Connect(n.trans.LocalAddr(), n.trans)
		}
	}
}

func (p *pool) waitLeader(nodes ...*node) *node {
	p.t.Helper()
	if len(nodes) == 0 {
		nodes = p.live()
	}
	// An election takes one to two seconds, a split vote again as long.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if n.r.Mode() == Leader {
				return n
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.t.Fatal("no leader")
	return nil
}

// converge waits until every live node has applied what the leader has
// and holds the same persistent state.
func (p *pool) converge() {
	p.t.Helper()
	leader := p.waitLeader()
	// A barrier applies everything committed on the leader.
	if err := leader.r.Raft().Barrier(5 * time.Second).Error(); err != nil {
		p.t.Fatal(err)
	}
	want := leader.r.AppliedIndex()
	for _, n := range p.live() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.r.WaitApplied(ctx, want)
		cancel()
		if err != nil {
			p.t.Fatalf("%s: %v", n.id, err)
		}
	}
	// The leader's own last entries reach its visible state through the
	// completer; give it a moment, then compare.
	deadline := time.Now().Add(5 * time.Second)
	for {
		diff := ""
		for _, n := range p.live() {
			if diff = differ(leader.d, n.d); diff != "" {
				diff = fmt.Sprintf("%s vs %s: %s", leader.id, n.id, diff)
				break
			}
		}
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatal(diff)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// differ describes the first difference between two databases'
// persistent rows ("" when they hold the same).
func differ(a, b *db.DB) string {
	sa, sb := a.Snapshot(), b.Snapshot()
	for _, c := range dm.Model.Classes {
		if !c.Persist || !c.InDB {
			continue
		}
		if na, nb := sa.Count(c), sb.Count(c); na != nb {
			return fmt.Sprintf("%s: %d rows and %d", c.Name, na, nb)
		}
		out := ""
		sa.Ascend(c, func(ra *db.Row) bool {
			rb, ok := sb.Get(c, ra.Ref)
			if !ok {
				out = fmt.Sprintf("%s %s missing", c.Name, ra.Ref)
				return false
			}
			for _, f := range c.Fields {
				if f.Derived && !f.Inverse.Class.Persist || !f.Derived && !f.Persist {
					continue
				}
				if va, vb := sa.Value(ra, f), sb.Value(rb, f); !schema.Equal(va, vb) {
					out = fmt.Sprintf("%s %s .%s: %v and %v", c.Name, ra.Ref, f.Name, va, vb)
					return false
				}
			}
			return true
		})
		if out != "" {
			return out
		}
	}
	return ""
}

func createVM(d *db.DB, name string) (ref string, err error) {
	_, err = d.Update(func(tx *db.Tx) error {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name}).Row())
		return err
	})
	return ref, err
}

func TestReplicatesLeaderAndMemberWrites(t *testing.T) {
	p := newPool(t, 3)
	leader := p.waitLeader()
	var members []*node
	for _, n := range p.nodes {
		if n != leader {
			members = append(members, n)
		}
	}
	// 16 writers on the coordinator, 2 on each member, at once.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	write := func(d *db.DB, who string, n int) {
		defer wg.Done()
		for i := range n {
			// A loaded machine may cost the leader its lease (1 s
			// timeouts here): a write refused as not durable is retried,
			// as a client would.
			var err error
			for try := 0; try < 50; try++ {
				var ref string
				ref, err = createVM(d, fmt.Sprintf("%s-%d", who, i))
				if err == nil {
					_, err = d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, ref, "described") })
				}
				if !errors.Is(err, db.ErrNotDurable) && !errors.Is(err, ErrNotLeader) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", who, err)
				return
			}
		}
	}
	for w := range 16 {
		wg.Add(1)
		go write(leader.d, fmt.Sprint("leader", w), 20)
	}
	for i, m := range members {
		for w := range 2 {
			wg.Add(1)
			go write(m.d, fmt.Sprintf("member%d.%d", i, w), 10)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	p.converge()
	if n := leader.d.Snapshot().Count(dm.VM.Class); n < 16*20+4*10 {
		t.Fatalf("%d VMs", n)
	}
	// A member's write is visible on the member when its call returns.
	ref, err := createVM(members[0].d, "read-your-write")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := members[0].d.Snapshot().Get(dm.VM.Class, ref); !ok {
		t.Fatal("a member does not see its own acknowledged write")
	}
	// Another host that waits for the writer's SeenIndex sees it too
	// (forwarded calls and migrations carry that index), at once, with
	// no retry.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := members[1].r.WaitApplied(ctx, members[0].r.SeenIndex()); err != nil {
		t.Fatal(err)
	}
	if _, ok := members[1].d.Snapshot().Get(dm.VM.Class, ref); !ok {
		t.Fatal("a host that waited for the writer's SeenIndex does not see its write")
	}
}

// The coordinator is stopped under load: every acknowledged write is on
// the new coordinator and every member; writes that failed say so with
// a retryable error.
func TestLeaderLossKeepsAcknowledgedWrites(t *testing.T) {
	p := newPool(t, 3)
	for round := range 3 {
		leader := p.waitLeader()
		var mu sync.Mutex
		acked := map[string]string{}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					name := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					ref, err := createVM(leader.d, name)
					if err != nil {
						// Retryable (leadership went), or the host is gone.
						if !errors.Is(err, db.ErrNotDurable) && !errors.Is(err, db.ErrFailed) {
							t.Errorf("a failed write says %v", err)
						}
						return
					}
					mu.Lock()
					acked[ref] = name
					mu.Unlock()
				}
			}()
		}
		time.Sleep(300 * time.Millisecond)
		// Kill: shut raft down without a transfer, then bring the host
		// back from its files as a follower.
		rest := p.kill(leader)
		close(stop)
		wg.Wait()
		next := p.waitLeader(rest...)
		// The new leader applies what was committed in the background: an
		// acknowledged write may show late (a loaded machine), never not
		// at all.
		deadline := time.Now().Add(15 * time.Second)
		for ref, name := range acked {
			for {
				row, ok := next.d.Snapshot().Get(dm.VM.Class, ref)
				if ok && row.String(dm.VM.NameLabel) == name {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: acknowledged VM %s (%s) lost", round, ref, name)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		p.revive(leader)
		if got := leader.r.AppliedIndex(); got == 0 {
			t.Fatalf("round %d: a restarted host's file records no applied index", round)
		}
		p.converge()
		t.Logf("round %d: %d acknowledged writes kept; new leader %s", round, len(acked), next.id)
	}
}

// A member whose file lost its last writes (written without fsync while
// raft runs; a power cut) comes back from raft's snapshot and log.
func TestFileBehindSnapshotCatchesUp(t *testing.T) {
	p := newPool(t, 3)
	leader := p.waitLeader()
	var member *node
	for _, n := range p.nodes {
		if n != leader {
			member = n
			break
		}
	}
	for i := range 20 {
		if _, err := createVM(leader.d, fmt.Sprint("before-", i)); err != nil {
			t.Fatal(err)
		}
	}
	p.converge()
	// The member's file as it is now: what a power cut may leave.
	p.kill(member)
	file := filepath.Join(member.dir, "toolstackd.db")
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	p.revive(member)
	for i := range 20 {
		if _, err := createVM(leader.d, fmt.Sprint("after-", i)); err != nil {
			t.Fatal(err)
		}
	}
	p.converge()
	if err := member.r.Compact(); err != nil {
		t.Fatal(err)
	}
	p.kill(member)
	if err := os.WriteFile(file, old, 0o600); err != nil {
		t.Fatal(err)
	}
	p.revive(member)
	p.converge()
}

// The coordinator releases a writer once raft has the change, before its
// own file does: a coordinator that stops with its file behind (the last
// writes never reached it) gets them back from raft's log when it
// returns, its own entries included, and nothing acknowledged is lost.
func TestLeaderFileBehindLogCatchesUp(t *testing.T) {
	p := newPool(t, 3)
	leader := p.waitLeader()
	for i := range 10 {
		if _, err := createVM(leader.d, fmt.Sprint("before-", i)); err != nil {
			t.Fatal(err)
		}
	}
	p.converge()
	file := filepath.Join(leader.dir, "toolstackd.db")
	leader.store.Flush()
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i := range 30 {
		name := fmt.Sprint("after-", i)
		ref, err := createVM(leader.d, name)
		if err != nil {
			t.Fatal(err)
		}
		want[ref] = name
	}
	// Stop it and put back the file as it was before the last 30 writes.
	rest := p.kill(leader)
	if err := os.WriteFile(file, old, 0o600); err != nil {
		t.Fatal(err)
	}
	p.waitLeader(rest...)
	p.revive(leader)
	p.converge()
	for ref, name := range want {
		row, ok := leader.d.Snapshot().Get(dm.VM.Class, ref)
		if !ok || row.String(dm.VM.NameLabel) != name {
			t.Fatalf("acknowledged VM %s (%s) is not on the returned host", ref, name)
		}
	}
}

// A member learns that the coordinator's write is committed from the
// coordinator's next append. With the pool quiet that append comes after
// raft's CommitTimeout (here an hour, so that nothing else brings it);
// Nudge brings it at once.
func TestNudgeTellsMembersOfCommits(t *testing.T) {
	p := newPoolTuned(t, 3, func(c *raft.Config) {
		tune(c)
		c.CommitTimeout = time.Hour
	})
	leader := p.waitLeader()
	// The follower whose acknowledgement committed the write learns of the
	// commit only from a later append; a slower one may get the entry in an
	// append that already carries the commit. Take a follower that has not
	// applied the write, and try again with a new write if both have.
	var member *node
	var idx uint64
	for attempt := 0; member == nil; attempt++ {
		if attempt == 5 {
			t.Fatal("every follower applied each write with no append after it: the test shows nothing")
		}
		if _, err := createVM(leader.d, fmt.Sprintf("committed-%d", attempt)); err != nil {
			t.Fatal(err)
		}
		idx = leader.r.SeenIndex()
		for _, n := range p.nodes {
			if n == leader {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err := n.r.WaitApplied(ctx, idx)
			cancel()
			if err != nil {
				member = n
				break
			}
		}
	}
	member.r.Nudge(idx) // not the leader: nothing happens
	start := time.Now()
	leader.r.Nudge(idx)
	leader.r.Nudge(idx) // coalesced with the first
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := member.r.WaitApplied(ctx, idx); err != nil {
		t.Fatal(err)
	}
	t.Logf("the member applied index %d %v after the nudge", idx, time.Since(start))
	// A nudge for an index a finished barrier covered appends nothing.
	deadline := time.Now().Add(10 * time.Second)
	for {
		leader.r.mu.Lock()
		busy := leader.r.nudging
		leader.r.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the nudge did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	last := leader.r.Raft().LastIndex()
	leader.r.Nudge(idx)
	time.Sleep(50 * time.Millisecond)
	if got := leader.r.Raft().LastIndex(); got != last {
		t.Fatalf("a covered nudge appended: last index %d, then %d", last, got)
	}
}

// A pool whose hosts kept raft's log in raft.db (toolstackd before the
// log moved to its own files) comes back with every write: each host's
// log is moved to the log directory at start, and raft.db keeps no
// entries.
func TestLogMovesOutOfRaftDB(t *testing.T) {
	p := newPool(t, 3)
	leader := p.waitLeader()
	for i := range 30 {
		if _, err := createVM(leader.d, fmt.Sprint("vm-", i)); err != nil {
			t.Fatal(err)
		}
	}
	p.converge()
	vms := leader.d.Snapshot().Count(dm.VM.Class)
	nodes := p.live()
	want := make(map[raft.ServerID]uint64)
	for _, n := range nodes {
		want[n.id] = n.r.Raft().LastIndex()
		p.kill(n)
	}
	for _, n := range nodes {
		// The old layout: the entries in raft.db, no log directory.
		dir := filepath.Join(n.dir, "raft")
		old, err := raftstore.Open(dir, raftstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		wal, err := raftwal.Open(filepath.Join(dir, logDirName), raftwal.Options{})
		if err != nil {
			t.Fatal(err)
		}
		first, _ := wal.FirstIndex()
		last, _ := wal.LastIndex()
		if last < want[n.id] {
			t.Fatalf("%s: log ends at %d, raft had %d", n.id, last, want[n.id])
		}
		for i := first; i <= last; i++ {
			var l raft.Log
			if err := wal.GetLog(i, &l); err != nil {
				t.Fatal(err)
			}
			if err := old.StoreLog(&l); err != nil {
				t.Fatal(err)
			}
		}
		_ = wal.Close()
		_ = old.Close()
		if err := os.RemoveAll(filepath.Join(dir, logDirName)); err != nil {
			t.Fatal(err)
		}
		// A crash of a first attempt left half a copy.
		if err := os.MkdirAll(filepath.Join(dir, logDirName+".import"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		p.revive(n)
	}
	leader = p.waitLeader()
	if _, err := createVM(leader.d, "after"); err != nil {
		t.Fatal(err)
	}
	p.converge()
	if got := leader.d.Snapshot().Count(dm.VM.Class); got != vms+1 {
		t.Fatalf("%d VMs after the move, want %d", got, vms+1)
	}
	for _, n := range nodes {
		if first, _ := n.r.stores.stable.FirstIndex(); first != 0 {
			t.Fatalf("%s: raft.db still holds entries from %d", n.id, first)
		}
		if last, _ := n.r.stores.log.LastIndex(); last <= want[n.id] {
			t.Fatalf("%s: the log ends at %d, before the write after the move", n.id, last)
		}
	}
}

// TestNothingAppliedBeforeTheLeadersDiskHasIt checks the rule that lets
// the leader sync its log behind the writer (leaderLog): no host applies
// an entry (and so no writer is released) before the leader's disk
// holds it. It also checks that the leader does write behind: some
// samples find entries in its log not yet on its disk.
func TestNothingAppliedBeforeTheLeadersDiskHasIt(t *testing.T) {
	p := newPool(t, 3)
	p.waitLeader()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				// Whoever leads now takes the write; a refusal while
				// leadership moves is retried.
				for _, n := range p.nodes {
					if n.r.leading() {
						_, _ = createVM(n.d, fmt.Sprintf("w%d-%d", w, i))
						break
					}
				}
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	behind, samples := 0, 0
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && (samples < 20000 || behind == 0); samples++ {
		applied := make([]uint64, len(p.nodes))
		for i, n := range p.nodes {
			applied[i] = n.r.AppliedIndex()
		}
		var leaders []*node
		for _, n := range p.nodes {
			if n.r.leading() {
				leaders = append(leaders, n)
			}
		}
		// A deposed leader may not know it yet, and miss what its
		// successor committed: compare with a leader only when it is the
		// one host that thinks it leads.
		if len(leaders) == 1 {
			n := leaders[0]
			wal := n.r.stores.log
			durable := wal.DurableIndex()
			for i, a := range applied {
				if a > durable {
					t.Fatalf("host %d applied entry %d; the leader's disk holds the log only up to %d", i, a, durable)
				}
			}
			if last, _ := wal.LastIndex(); last > durable {
				behind++
			}
		}
	}
	if behind == 0 {
		t.Fatalf("in %d samples the leader's log was never ahead of its disk: it does not write behind", samples)
	}
	t.Logf("%d samples, %d with the leader writing behind", samples, behind)
}

// blockingLog is a log whose entries reach the disk when the test says.
type blockingLog struct{ release chan struct{} }

func (b blockingLog) WaitDurable(ctx context.Context, _ uint64) error {
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The FSM applies nothing before raft's log has it on disk.
func TestFSMWaitsForTheDisk(t *testing.T) {
	p := newPool(t, 1)
	n := p.waitLeader()
	before := n.r.AppliedIndex()
	log := blockingLog{make(chan struct{})}
	f := fsm{r: n.r, durable: log}
	done := make(chan []any, 1)
	go func() {
		done <- f.ApplyBatch([]*raft.Log{{Index: before + 1, Type: raft.LogNoop}, {Index: before + 2, Type: raft.LogNoop}})
	}()
	select {
	case <-done:
		t.Fatal("entries were applied before the log had them on disk")
	case <-time.After(50 * time.Millisecond):
	}
	close(log.release)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("entries not applied once on disk")
	}
}
