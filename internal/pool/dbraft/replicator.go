// Package dbraft keeps a host's database in step with its pool's through
// raft: the pool's replicated database.
//
// # Where it sits
//
// A Replicator is the database's persister (db.Persister). Beneath it is
// the host's own file (persist.Store), which only the Replicator feeds.
// On a host that is not in a pool (Standalone) it passes every batch
// straight to the file: a single host pays nothing for the pool. Once raft
// runs (Start), every change to a persistent class goes through the raft
// log before the file and before the writer is released:
//
//   - On the leader (the pool's coordinator) the sender turns each group
//     of queued batches into one entry (replica.Encode, whole rows) and
//     hands it to raft without waiting; many entries are in flight at
//     once. The completer takes them in order: when raft has committed an
//     entry and applied it here, its writers return at once (the change
//     is on a quorum's disks, in raft's log) and its batches go to the
//     file, which catches up behind (see "The file" below). Batches of
//     in-memory classes only (sessions, tasks) skip raft but keep their
//     place in the order.
//   - On a member, entries from the coordinator are applied by the FSM to
//     the database (replica.ApplyTx, several entries in one transaction)
//     and so to the file. A member's own changes (a module writing on the
//     member) travel as deltas (replica.EncodeDelta) to the coordinator
//     through Options.Forward, which applies them there; the member's
//     writer returns once the coordinator has them durably, and the
//     change comes back to every member through the log.
//
// When leadership is lost with entries in flight, the writers of entries
// that raft did not apply here fail with an error wrapping ErrNotLeader
// and db.ErrNotDurable (the change may or may not have been made: a
// retry is safe for XenAPI's setters), and the database rolls back to its
// last durable state; anything that did commit comes back through the log
// as the new coordinator's. A new leader applies everything committed
// (raft's barrier) before it takes writes.
//
// # The file
//
// While raft runs, the host's file is a copy of what raft applied here,
// not the durable record: it is written without fsync, after the writers
// were released, and a write that fails is tried again instead of
// refusing anything (persist.Store.SetSync). Whatever it lacks when the
// process or the machine stops is in raft's log (internal/pool/raftwal),
// which holds an entry on a quorum's disks, the leader's among them,
// before it is applied anywhere (see leaderLog). Before the whole file is replaced (a snapshot restored) the
// writes queued for it are flushed, so that none lands on top. With raft
// stopped (Standalone) a batch goes to the file, synced, before its
// writer returns, as on a host that never was in a pool.
//
// # Restart and snapshots
//
// The file records, in the same bbolt transaction as the rows, the raft
// index it holds (persist.Options.Mark); on restart raft replays only
// what came after (raft's NoSnapshotRestoreOnStart). A raft snapshot is
// the whole persistent state (replica.EncodeState) with its index; a
// member far behind gets one and replaces its rows with it (db.Replace).
package dbraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/schema"
)

// Errors.
var (
	// ErrNotLeader: a write reached a host that cannot take it now (the
	// coordinator changed, or there is none); retry on the coordinator.
	ErrNotLeader = errors.New("dbraft: this host is not the pool's coordinator")
	// ErrStopped: the replicator is closed.
	ErrStopped = errors.New("dbraft: stopped")
)

// Mode is what a replicator does with a batch.
type Mode int32

// Modes.
const (
	// Standalone: no pool; batches go straight to the file.
	Standalone Mode = iota
	// Leader: batches go through raft, then to the file.
	Leader
	// Follower: entries arrive through raft; own changes are forwarded.
	Follower
)

func (m Mode) String() string { return [...]string{"standalone", "leader", "follower"}[m] }

// maxInFlight bounds the entries between the sender and the completer.
const maxInFlight = 256

// Options configure a Replicator.
type Options struct {
	Model *schema.Model
	Log   *slog.Logger
	// Forward sends a member's delta (replica.EncodeDelta) to the
	// coordinator, which applies it (Replicator.ApplyRemote); it returns
	// once the coordinator has it durably, with the raft index that
	// covers it there (0 when unknown). Without it a member refuses its
	// own persistent writes with ErrNotLeader.
	Forward func(ctx context.Context, entry []byte) (uint64, error)
	// OnLeader, if set, runs (in a goroutine of its own) each time this
	// host becomes the leader and can take writes.
	OnLeader func()
	// OnDeposed, if set, runs (in a goroutine of its own) each time this
	// host stops being the leader.
	OnDeposed func()
}

// applied marks a batch that applies replicated entries: raft index.
type applied struct{ index uint64 }

// Replicator is a host's database persister in a pool. See the package
// documentation.
type Replicator struct {
	opts  Options
	log   *slog.Logger
	store *persist.Store
	d     *db.DB

	mu    sync.Mutex
	cond  *sync.Cond
	queue []*db.Batch
	// fwdCancel ends the delta forward is sending (nil: none), under
	// fwdMu.
	fwdMu     sync.Mutex
	fwdCancel context.CancelFunc
	// mode is what the replicator does now: written under mu, read
	// without it on every call's path (Mode).
	mode atomic.Int32
	// epoch grows at every abort: flights of an older epoch are dropped.
	epoch uint64
	// own are this leader's entries in raft, by sequence number.
	own   map[uint64]*flight
	nonce uint64 // this process's tag on its entries
	seq   uint64
	marks []mark // raft indexes of batches on their way to the file
	// marked is the raft index the file holds once the write that asked
	// for it succeeds (markFor): a failed write, tried again, records the
	// same.
	marked  uint64
	restore uint64 // the index of a snapshot being restored
	closing bool

	// appliedIndex is the last raft entry applied here (under mu);
	// appliedGen the generation that makes it visible.
	appliedIndex uint64
	appliedGen   uint64
	appliedCh    chan struct{} // closed and replaced when appliedIndex grows
	// ackedIndex is the raft index at which the coordinator committed
	// the newest of this member's own deltas (under mu): the member's
	// database shows the change at once, but its log brings it later.
	ackedIndex uint64
	// Nudge's state (under mu): the highest index asked for, the highest
	// a completed barrier covered, and whether a barrier is on its way.
	nudgeWant, nudged uint64
	nudging           bool

	raft      atomic.Pointer[raft.Raft]
	stores    *logStores
	watchDone chan struct{}
	stopWatch chan struct{}
	flights   chan *flight
	deltas    chan delta // a member's deltas, sent in order by forward
	wg        sync.WaitGroup
}

// mark: once the file reaches gen, it holds raft index.
type mark struct{ gen, index uint64 }

type flightKind int

const (
	kindLocal  flightKind = iota // nothing to replicate, or already replicated
	kindRaft                     // an entry this leader gave raft
	kindRemote                   // a member's delta sent to the coordinator
)

// flight is a group of batches on their way to the file, in order.
type flight struct {
	kind  flightKind
	epoch uint64
	// direct: raft was stopped when the flight was sent; the file's
	// synced write makes it durable (not raft), and the file releases it.
	direct  bool
	batches []*db.Batch
	index   uint64 // raft index, when known
	seq     uint64
	future  raft.ApplyFuture
	remote  chan error
	// settled is closed once the outcome of a raft flight is known:
	// applied here by the FSM, or failed (err, under mu).
	settled chan struct{}
	done    bool
	err     error
}

func (f *flight) lastGen() uint64 { return f.batches[len(f.batches)-1].To }

// New makes a replicator over a host's file; the file must have been
// opened with persist.Options.Mark set to the replicator's Mark (use
// OpenStore). Attach gives it the database.
func New(opts Options) *Replicator {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	r := &Replicator{opts: opts, log: opts.Log, own: map[uint64]*flight{},
		appliedCh: make(chan struct{})}
	r.cond = sync.NewCond(&r.mu)
	var b [8]byte
	_, _ = randRead(b[:])
	r.nonce = binary.LittleEndian.Uint64(b[:])
	return r
}

// OpenStore opens the host's file at path with the replicator's marks.
func (r *Replicator) OpenStore(path string, opts persist.Options) (*persist.Store, error) {
	opts.Mark = r.markFor
	s, err := persist.Open(path, r.opts.Model, opts)
	if err != nil {
		return nil, err
	}
	m, err := s.Mark()
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	if len(m) == 8 {
		r.appliedIndex = binary.BigEndian.Uint64(m)
	}
	r.store = s
	return s, nil
}

// Attach gives the replicator the database (made with it as persister
// and loaded from the store) and starts its loops.
func (r *Replicator) Attach(d *db.DB) {
	r.d = d
	r.flights = make(chan *flight, maxInFlight)
	r.deltas = make(chan delta, maxInFlight)
	r.wg.Add(3)
	go r.send()
	go r.complete()
	go r.forward()
}

// delta is a member's change on its way to the coordinator.
type delta struct {
	f     *flight
	entry []byte
}

// forward sends a member's deltas to the coordinator one at a time, in
// the order they were made: a delta sets whole scalar values and adds or
// removes elements of sets and maps, so two in flight at once could land
// in the other order and the older change win (a VM's
// current_operations keeping an operation that had ended).
//
// A delta in flight to a coordinator that is no longer one (it was cut
// off, or this host was elected) would hold up every later write here
// until its request timed out: abortForward ends it at once when
// leadership changes, and its writer fails with ErrNotLeader (the change
// may or may not have been made, as for any write in flight when
// leadership moves).
func (r *Replicator) forward() {
	defer r.wg.Done()
	for d := range r.deltas {
		ctx, cancel := context.WithCancel(context.Background())
		r.fwdMu.Lock()
		r.fwdCancel = cancel
		r.fwdMu.Unlock()
		index, err := r.opts.Forward(ctx, d.entry)
		if err == nil {
			r.mu.Lock()
			r.ackedIndex = max(r.ackedIndex, index)
			r.mu.Unlock()
		}
		r.fwdMu.Lock()
		aborted := r.fwdCancel == nil
		r.fwdCancel = nil
		r.fwdMu.Unlock()
		cancel()
		if err != nil && aborted {
			err = fmt.Errorf("%w: the coordinator changed while a change was on its way to it: %w", ErrNotLeader, err)
		}
		d.f.remote <- err
	}
}

// abortForward ends the delta on its way to the coordinator, if any (see
// forward).
func (r *Replicator) abortForward() {
	r.fwdMu.Lock()
	defer r.fwdMu.Unlock()
	if r.fwdCancel != nil {
		r.fwdCancel()
		r.fwdCancel = nil
	}
}

// leading says whether raft runs here as the leader now.
func (r *Replicator) leading() bool {
	rf := r.raft.Load()
	return rf != nil && rf.State() == raft.Leader
}

// AppliedIndex is the last raft index this host's database holds.
func (r *Replicator) AppliedIndex() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.appliedIndex
}

// SeenIndex is the raft index a peer must have applied to see everything
// this host's database shows: its applied index, or, on a member whose
// own writes the coordinator has committed but whose log has not yet
// brought back, the index that covers them. A request to another host
// that depends on this host's writes carries it (the receiver waits for
// it with WaitApplied).
func (r *Replicator) SeenIndex() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(r.appliedIndex, r.ackedIndex)
}

// WaitApplied waits until this host's database holds raft index i (a
// call forwarded by the coordinator carries the coordinator's index, so
// that it sees what the coordinator saw).
func (r *Replicator) WaitApplied(ctx context.Context, i uint64) error {
	for {
		r.mu.Lock()
		at, ch := r.appliedIndex, r.appliedCh
		r.mu.Unlock()
		if at >= i {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("dbraft: waiting for index %d (at %d): %w", i, at, ctx.Err())
		}
	}
}

// Mode reports what the replicator does now.
func (r *Replicator) Mode() Mode {
	return Mode(r.mode.Load())
}

func (r *Replicator) setMode(m Mode) {
	r.mu.Lock()
	r.mode.Store(int32(m))
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Append queues a committed batch (db.Persister). It runs under the
// database's publication lock and never blocks.
func (r *Replicator) Append(b *db.Batch) {
	r.mu.Lock()
	if Mode(r.mode.Load()) == Standalone {
		r.mu.Unlock()
		r.store.Append(b)
		return
	}
	r.queue = append(r.queue, b)
	r.mu.Unlock()
	r.cond.Signal()
}

// ReplaceAll rewrites the file from a snapshot (db.Replacer): a restored
// raft snapshot, or a restored database dump. Writes released before it
// reach the file first, so that none lands on top.
func (r *Replicator) ReplaceAll(snap *db.Snapshot) error {
	r.store.Flush()
	return r.store.ReplaceAll(snap)
}

// markFor is persist's Mark: the newest raft index among the batches up
// to gen (the file is written in order, so it holds every one before).
func (r *Replicator) markFor(gen uint64) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.restore != 0 {
		// A snapshot may move the file back as well as on.
		r.marked = r.restore
	}
	n := 0
	for n < len(r.marks) && r.marks[n].gen <= gen {
		r.marked = max(r.marked, r.marks[n].index)
		n++
	}
	r.marks = r.marks[n:]
	if r.marked == 0 {
		return nil
	}
	return binary.BigEndian.AppendUint64(nil, r.marked)
}

// send turns queued batches into flights, in order.
func (r *Replicator) send() {
	defer r.wg.Done()
	defer close(r.flights)
	defer close(r.deltas)
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closing {
			r.cond.Wait()
		}
		if r.closing && len(r.queue) == 0 {
			r.mu.Unlock()
			return
		}
		group := r.queue
		r.queue = nil
		mode, epoch := Mode(r.mode.Load()), r.epoch
		r.mu.Unlock()
		direct := mode == Standalone
		for len(group) > 0 {
			n := 1
			_, replicated := group[0].Tag.(applied)
			for n < len(group) {
				if _, ok := group[n].Tag.(applied); ok != replicated {
					break
				}
				n++
			}
			f := &flight{epoch: epoch, batches: group[:n:n]}
			if replicated {
				f.index = group[n-1].Tag.(applied).index
			} else {
				f.direct = direct
				r.launch(f, mode)
			}
			group = group[n:]
			r.flights <- f
		}
	}
}

// launch starts replicating a flight of this host's own batches.
func (r *Replicator) launch(f *flight, mode Mode) {
	switch mode {
	case Standalone:
		return // raft stopped: straight to the file
	case Leader:
		entry, ok := replica.Encode(f.batches)
		if !ok {
			return
		}
		rf := r.raft.Load()
		f.settled = make(chan struct{})
		r.mu.Lock()
		r.seq++
		f.kind, f.seq = kindRaft, r.seq
		r.own[f.seq] = f
		r.mu.Unlock()
		if rf == nil {
			r.settle(f, 0, raft.ErrRaftShutdown)
			return
		}
		f.future = rf.ApplyLog(raft.Log{Data: entry, Extensions: r.tag(f.seq)}, 0)
		go func() {
			err := f.future.Error()
			if err == nil {
				r.settle(f, f.future.Index(), nil)
				return
			}
			r.settle(f, 0, err)
		}()
	default:
		entry, ok := replica.EncodeDelta(f.batches)
		if !ok {
			return
		}
		f.kind, f.remote = kindRemote, make(chan error, 1)
		if r.opts.Forward == nil {
			f.remote <- ErrNotLeader
			return
		}
		r.deltas <- delta{f, entry}
	}
}

// tag marks an entry as this process's, with its sequence number.
func (r *Replicator) tag(seq uint64) []byte {
	b := binary.BigEndian.AppendUint64(nil, r.nonce)
	return binary.BigEndian.AppendUint64(b, seq)
}

// settle records a raft flight's outcome, the first one known: the FSM
// applying it here (before raft answers the future, which may then say
// that leadership was lost) or the future's answer.
func (r *Replicator) settle(f *flight, index uint64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.settleLocked(f, index, err)
}

func (r *Replicator) settleLocked(f *flight, index uint64, err error) {
	if f.done {
		return
	}
	f.done, f.err = true, err
	if err == nil {
		f.index = index
	}
	close(f.settled)
}

// ownFlight returns the live flight an entry's tag names, if it is this
// process's.
func (r *Replicator) ownFlight(ext []byte) *flight {
	if len(ext) != 16 || binary.BigEndian.Uint64(ext) != r.nonce {
		return nil
	}
	f := r.own[binary.BigEndian.Uint64(ext[8:])]
	if f == nil || f.epoch != r.epoch || f.done {
		// Failed or aborted: its writers fail and memory rolls back, so
		// the entry is applied as anyone else's.
		return nil
	}
	return f
}

// complete takes flights in order: a replicated one is released and goes
// to the file, a failed one aborts every commit not yet durable, a direct
// one (raft stopped) goes to the file, which releases it once synced.
func (r *Replicator) complete() {
	defer r.wg.Done()
	lastDirect := false
	for f := range r.flights {
		r.mu.Lock()
		stale := f.epoch != r.epoch
		r.mu.Unlock()
		var err error
		if !stale {
			err = r.wait(f)
		}
		r.mu.Lock()
		if f.kind == kindRaft {
			delete(r.own, f.seq)
		}
		if f.epoch != r.epoch {
			// An abort failed this flight's writers already; if raft
			// commits the entry it comes back through the FSM.
			r.mu.Unlock()
			continue
		}
		if err != nil {
			r.epoch++
			for seq := range r.own {
				delete(r.own, seq) // they come back through the FSM if committed
			}
			r.mu.Unlock()
			r.abort(err)
			continue
		}
		if f.index != 0 {
			r.marks = append(r.marks, mark{f.lastGen(), f.index})
		}
		r.mu.Unlock()
		if f.direct != lastDirect {
			// Raft just started or stopped: what is in the file's queue
			// is written before the order of release changes (a synced
			// write must not release a replicated batch, nor a release
			// go ahead of a synced write not yet done).
			r.store.Flush()
			lastDirect = f.direct
		}
		for _, b := range f.batches {
			r.store.Append(b)
		}
		if !f.direct {
			// Raft has it (or it needs no disk): its writers need not
			// wait for the file.
			r.d.Durable(f.lastGen())
		}
	}
}

// wait waits for a flight's replication and reports its outcome.
func (r *Replicator) wait(f *flight) error {
	switch f.kind {
	case kindRaft:
		<-f.settled
		r.mu.Lock()
		err := f.err
		r.mu.Unlock()
		if err == nil {
			return nil
		}
		if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) ||
			errors.Is(err, raft.ErrLeadershipTransferInProgress) || errors.Is(err, raft.ErrRaftShutdown) {
			return fmt.Errorf("%w: %w", ErrNotLeader, err)
		}
		return err
	case kindRemote:
		return <-f.remote
	}
	return nil
}

// abort fails every commit not yet durable and drops the queue (each
// queued batch was built on the failed one).
func (r *Replicator) abort(err error) {
	r.d.Abort(err, func() {
		r.mu.Lock()
		clear(r.queue)
		r.queue = nil
		r.epoch++
		r.mu.Unlock()
	})
}

// Close stops raft (if running) and the loops; the store is the caller's.
// Writes still pending, and any later, fail with ErrStopped first: once
// raft stops, nothing may be acknowledged that the pool does not have.
func (r *Replicator) Close() error {
	if r.d != nil {
		r.d.Fail(ErrStopped)
	}
	err := r.Stop()
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	r.cond.Broadcast()
	r.wg.Wait()
	return err
}
