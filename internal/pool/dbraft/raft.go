package dbraft

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"toolstackd/internal/db"
	"toolstackd/internal/pool/raftnet"
	"toolstackd/internal/pool/replica"
)

var randRead = rand.Read

// StartOptions say how to run raft on this host.
type StartOptions struct {
	// ID is this host's raft server ID (its host uuid).
	ID raft.ServerID
	// Dir holds raft's log (the directory "log", see logStores), its
	// term and vote (raft.db) and its snapshots.
	Dir string
	// Transport carries raft's messages; Start wraps it so that
	// heartbeats go through raft's main loop (hashicorp/raft#695).
	Transport raft.Transport
	// Bootstrap makes a new pool of this host alone, if Dir holds no
	// raft state yet (the first host of a pool).
	Bootstrap bool
	// Tune, if set, adjusts raft's configuration (tests shorten timeouts).
	Tune func(*raft.Config)
	// LogOutput receives raft's own log (warnings and errors); nil:
	// standard error.
	LogOutput io.Writer
}

// Start runs raft: the host's database is from now on the pool's. The
// host is a follower until raft elects it.
func (r *Replicator) Start(o StartOptions) (err error) {
	if r.raft.Load() != nil {
		return errors.New("dbraft: already started")
	}
	store, snaps, conf, err := r.open(o)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = store.Close()
		}
	}()
	notify := make(chan bool, 16)
	conf.NotifyCh = notify
	// The leader syncs its own log behind the writer (leaderLog): no
	// follower learns of a commit its disk does not hold yet.
	trans := raftnet.ConservativeGated(o.Transport, func(commit uint64) error {
		// Bounded, as every wait is: an append that gives up is retried
		// by raft after its backoff.
		ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
		defer cancel()
		return store.log.WaitDurable(ctx, commit)
	})
	if o.Bootstrap {
		has, err := raft.HasExistingState(store.log, store.stable, snaps)
		if err != nil {
			return err
		}
		if !has {
			cfg := raft.Configuration{Servers: []raft.Server{{ID: o.ID, Address: trans.LocalAddr()}}}
			if err := raft.BootstrapCluster(conf, store.log, store.stable, snaps, trans, cfg); err != nil {
				return err
			}
		}
	}
	if err := r.catchUp(snaps); err != nil {
		return err
	}
	logs, err := raft.NewLogCache(logCacheEntries, leaderLog{store.log, r.leading})
	if err != nil {
		return err
	}
	// Raft's log is the durable record from now on: the file is written
	// without waiting for the disk (see catchUp for the way back), once
	// what was written alone is synced.
	r.setMode(Follower)
	r.store.Flush()
	if err := r.store.SetSync(false); err != nil {
		r.setMode(Standalone)
		return err
	}
	rf, err := raft.NewRaft(conf, fsm{r: r, durable: store.log}, logs, store.stable, snaps, trans)
	if err != nil {
		_ = r.store.SetSync(true)
		r.setMode(Standalone)
		return err
	}
	r.raft.Store(rf)
	r.stores = store
	r.watchDone, r.stopWatch = make(chan struct{}), make(chan struct{})
	go r.watch(rf, notify, r.stopWatch)
	go r.watchLeader(rf, r.stopWatch)
	return nil
}

// watchLeader ends a delta on its way to a coordinator as soon as raft
// sees another leader (or none): see forward.
func (r *Replicator) watchLeader(rf *raft.Raft, stop <-chan struct{}) {
	ch := make(chan raft.Observation, 16)
	obs := raft.NewObserver(ch, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	rf.RegisterObserver(obs)
	defer rf.DeregisterObserver(obs)
	for {
		select {
		case <-ch:
			r.abortForward()
		case <-stop:
			return
		}
	}
}

// catchUp restores the newest raft snapshot when the file holds less
// than it: the file is written without fsync while raft runs, so a power
// cut may take its last writes, and raft replays only the log after its
// snapshot (the file's mark tells the FSM where to start).
func (r *Replicator) catchUp(snaps raft.SnapshotStore) error {
	metas, err := snaps.List()
	if err != nil || len(metas) == 0 {
		return err
	}
	_, rc, err := snaps.Open(metas[0].ID)
	if err != nil {
		return err
	}
	// The snapshot's own index (ours, not raft's) is its first field;
	// Restore reads the whole of it only when the file is behind.
	head := make([]byte, binary.MaxVarintLen64)
	n, _ := io.ReadFull(rc, head)
	index, _ := binary.Uvarint(head[:n])
	if index <= r.AppliedIndex() {
		return rc.Close()
	}
	r.log.Warn("the database file is behind raft's snapshot; restoring the snapshot",
		"file", r.AppliedIndex(), "snapshot", index)
	return fsm{r: r}.Restore(readCloser{io.MultiReader(bytes.NewReader(head[:n]), rc), rc})
}

type readCloser struct {
	io.Reader
	io.Closer
}

// open opens raft's stores in o.Dir and makes raft's configuration.
func (r *Replicator) open(o StartOptions) (*logStores, raft.SnapshotStore, *raft.Config, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, nil, nil, err
	}
	store, err := openLogStores(o.Dir)
	if err != nil {
		return nil, nil, nil, err
	}
	out := o.LogOutput
	if out == nil {
		out = os.Stderr
	}
	snaps, err := raft.NewFileSnapshotStore(o.Dir, 2, out)
	if err != nil {
		_ = store.Close()
		return nil, nil, nil, err
	}
	conf := raft.DefaultConfig()
	conf.LocalID = o.ID
	// The file holds what was applied (its mark): raft replays only
	// what came after, instead of restoring the last snapshot over it.
	conf.NoSnapshotRestoreOnStart = true
	conf.Logger = hclog.New(&hclog.LoggerOptions{Name: "raft", Output: out, Level: hclog.Warn})
	if o.Tune != nil {
		o.Tune(conf)
	}
	return store, snaps, conf, nil
}

// Recover rewrites raft's stored configuration to servers, with raft
// stopped: the way back for a pool that lost its quorum (raft's
// RecoverCluster; the procedure Consul calls peers.json). Everything in
// the log is applied first. Start raft afterwards.
func (r *Replicator) Recover(o StartOptions, servers []raft.Server) error {
	if r.raft.Load() != nil {
		return errors.New("dbraft: stop raft before recovering it")
	}
	store, snaps, conf, err := r.open(o)
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	trans := raftnet.Conservative(o.Transport)
	return raft.RecoverCluster(conf, fsm{r: r}, store.log, store.stable, snaps, trans, raft.Configuration{Servers: servers})
}

// Forget drops what this host holds of raft (its files go with the
// caller's removal of o.Dir): the next start begins from the pool's
// snapshot, which replaces the database.
func (r *Replicator) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appliedIndex, r.appliedGen, r.marked = 0, 0, 0
}

// watch follows leadership: a new leader applies everything committed
// before it takes writes; a deposed one forwards them.
func (r *Replicator) watch(rf *raft.Raft, notify <-chan bool, stop <-chan struct{}) {
	defer close(r.watchDone)
	for {
		select {
		case leader := <-notify:
			r.abortForward()
			if !leader {
				was := r.Mode()
				r.setMode(Follower)
				if was == Leader && r.opts.OnDeposed != nil {
					go r.opts.OnDeposed()
				}
				continue
			}
			if err := rf.Barrier(0).Error(); err != nil {
				r.log.Warn("elected, but the barrier failed; staying a follower", "err", err)
				continue
			}
			if rf.State() == raft.Leader {
				r.setMode(Leader)
				r.log.Info("this host is the pool's coordinator", "index", r.AppliedIndex())
				if r.opts.OnLeader != nil {
					go r.opts.OnLeader()
				}
			}
		case <-stop:
			return
		}
	}
}

// Raft is the running raft (nil before Start): membership changes and
// leadership transfers are the pool layer's.
func (r *Replicator) Raft() *raft.Raft { return r.raft.Load() }

// Stop shuts raft down: the host goes back to keeping its database alone.
func (r *Replicator) Stop() error {
	rf := r.raft.Load()
	if rf == nil {
		return nil
	}
	err := rf.Shutdown().Error()
	close(r.stopWatch)
	<-r.watchDone
	// A future raft took just as it shut down may never be answered:
	// settle every own entry still open as failed.
	r.mu.Lock()
	for _, f := range r.own {
		r.settleLocked(f, 0, raft.ErrRaftShutdown)
	}
	r.mu.Unlock()
	// The file is synced, and takes writes synced, before a write can
	// rely on it alone.
	if serr := r.store.SetSync(true); err == nil {
		err = serr
	}
	r.setMode(Standalone)
	if cerr := r.stores.Close(); err == nil {
		err = cerr
	}
	r.raft.Store(nil)
	r.stores = nil
	return err
}

// ApplyRemote applies a member's delta (replica.EncodeDelta) on the
// coordinator and returns once it is durable, that is committed by raft.
func (r *Replicator) ApplyRemote(ctx context.Context, entry []byte) (uint64, error) {
	if r.Mode() != Leader {
		return 0, ErrNotLeader
	}
	rows, err := replica.Decode(r.opts.Model, entry)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if _, err = r.d.Update(func(tx *db.Tx) error { return replica.ApplyTx(tx, rows) }); err != nil {
		return 0, err
	}
	// The leader's own write is applied when its writer returns: the
	// applied index now covers it.
	return r.AppliedIndex(), nil
}

// LeaderAddr is the address of the pool's coordinator as raft knows it
// ("" when there is none, or raft is not running): its address in raft's
// configuration, which follows a coordinator that moved its management
// address (the address in its messages is the one its raft started
// with), else the one its messages carry.
func (r *Replicator) LeaderAddr() string {
	rf := r.raft.Load()
	if rf == nil {
		return ""
	}
	addr, id := rf.LeaderWithID()
	if id != "" {
		for _, s := range rf.GetConfiguration().Configuration().Servers {
			if s.ID == id {
				return string(s.Address)
			}
		}
	}
	return string(addr)
}

// Nudge, on the leader, makes the followers learn soon that index i is
// committed, for a request to one of them that carries i (a forwarded
// call waits until its host has applied the index it carries).
//
// A follower learns how far the log is committed from the leader's next
// append; when the pool is quiet, hashicorp/raft sends one only after
// its CommitTimeout, a random 50-100 ms, and a call forwarded just after
// a write waited that long for it. Nudge appends a barrier entry (one
// small entry, synced as any other): the append that carries it carries
// the commit index too. Nudges are coalesced: one barrier at a time,
// and none for an index an earlier barrier covered. It never blocks; on
// a host that does not lead, it does nothing.
func (r *Replicator) Nudge(i uint64) {
	r.mu.Lock()
	if i <= r.nudged || r.Mode() != Leader {
		r.mu.Unlock()
		return
	}
	r.nudgeWant = max(r.nudgeWant, i)
	start := !r.nudging
	r.nudging = true
	r.mu.Unlock()
	if start {
		go r.nudge()
	}
}

// nudge appends barriers until one covers every index asked for.
func (r *Replicator) nudge() {
	for {
		r.mu.Lock()
		want := r.nudgeWant
		rf := r.raft.Load()
		if want <= r.nudged || rf == nil || r.Mode() != Leader {
			r.nudging = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		// Applied here, so committed: the barrier's append carries a
		// commit index of at least want.
		err := rf.Barrier(nudgeTimeout).Error()
		r.mu.Lock()
		if err != nil {
			r.nudging = false // leadership moved, or raft stopped
			r.mu.Unlock()
			return
		}
		r.nudged = max(r.nudged, want)
		r.mu.Unlock()
	}
}

// nudgeTimeout bounds how long a nudge waits to enter raft's queue.
const nudgeTimeout = 5 * time.Second

// gateTimeout bounds how long an append waits for the leader's disk to
// hold the commit index it carries (far beyond a sync on any disk).
const gateTimeout = 10 * time.Second

// WaitLeading waits until this host leads the pool and takes writes
// (raft elected it and it applied everything committed before), or ctx
// ends.
func (r *Replicator) WaitLeading(ctx context.Context) error {
	for r.Mode() != Leader {
		select {
		case <-ctx.Done():
			return fmt.Errorf("dbraft: raft did not elect this host: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// WaitLeader waits until raft knows a leader or ctx ends.
func (r *Replicator) WaitLeader(ctx context.Context) (string, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if a := r.LeaderAddr(); a != "" {
			return a, nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return "", fmt.Errorf("dbraft: no coordinator: %w", ctx.Err())
		}
	}
}

// Compact makes raft take a snapshot of the whole database now and drop
// the log before it, so that every host that joins later starts from the
// database as it is (a pool's first host calls it once raft made it the
// leader: what the host held before the pool is in no log entry).
func (r *Replicator) Compact() error {
	rf := r.raft.Load()
	if rf == nil {
		return ErrStopped
	}
	conf := rf.ReloadableConfig()
	keep := conf.TrailingLogs
	conf.TrailingLogs = 0
	if err := rf.ReloadConfig(conf); err != nil {
		return err
	}
	err := rf.Snapshot().Error()
	conf.TrailingLogs = keep
	if rerr := rf.ReloadConfig(conf); err == nil {
		err = rerr
	}
	return err
}
