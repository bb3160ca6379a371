package db

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"toolstackd/internal/schema"
)

// DefaultDeletedWindow is how many deletions each table remembers for
// event.from by default (xapi keeps between 256 and 512).
const DefaultDeletedWindow = 512

// DefaultFeedLength is how many changes the change feed keeps by default.
const DefaultFeedLength = 1 << 16

// Options tune a database.
type Options struct {
	// DeletedWindow bounds the deletions remembered per table. Older ones
	// are forgotten: event.from no longer reports them.
	DeletedWindow int
	// FeedLength bounds the changes kept for ChangesSince (the newest
	// batch is always kept, however large).
	FeedLength int
	// Persister, when set, makes committed batches durable. Update then
	// returns, and readers see a commit, only once the persister has
	// called Durable for its generation: no reader ever sees a write that
	// a crash could lose. Writers do not wait for each other's I/O: a
	// commit is prepared under the writer lock and made visible later, in
	// order, so a persister can group many commits into one sync.
	Persister Persister
}

// Persister makes batches durable (see Options.Persister).
type Persister interface {
	// Append queues a batch, in generation order. The persister must later
	// call DB.Durable with a generation at or past b.To, or DB.Fail.
	Append(b *Batch)
}

// ErrFailed wraps the persistence error that stopped the database taking
// writes; reads go on from the last durable state.
var ErrFailed = errors.New("db: persistence failed; writes are refused until restart")

// ErrNotDurable wraps the persistence error that made a commit fail (see
// DB.Abort): the commit did not happen, and later writes may succeed.
var ErrNotDurable = errors.New("db: the change could not be written to disk and was not made")

// Op is what a change did to a row.
type Op uint8

// Change operations.
const (
	OpCreate Op = iota
	OpModify
	OpDelete
)

func (o Op) String() string { return [...]string{"add", "mod", "del"}[o] }

// Change is one row's change within a batch. Row is the row after the
// change (nil for a deletion); Old is the row before (nil for a creation).
type Change struct {
	Op    Op
	Class *schema.Class
	Ref   string
	Gen   uint64
	Row   *Row
	Old   *Row
	Field *schema.Field // for a modification by Set: the field written
}

// Batch is one committed transaction: its changes in order, and the
// generations it spans (From exclusive, To inclusive).
type Batch struct {
	From, To uint64
	Changes  []Change
	// Tag is the transaction's Tx.Tag.
	Tag any
}

type pendingCommit struct {
	snap  *Snapshot
	batch *Batch
	done  chan error
}

// DB is the database.
type DB struct {
	model    *schema.Model
	opts     Options
	relIndex map[*schema.Field]int // derived inverse field -> index into state.rels

	mu       sync.Mutex // held by the one writer
	work     *state     // the writer's own copy: its trees are never read by others
	prepared *Snapshot  // the newest committed snapshot, visible or not
	cur      atomic.Pointer[Snapshot]
	failed   error // set once persistence fails (under mu and pubMu)

	pubMu   sync.Mutex // orders publication
	pending []pendingCommit
	// aborted is set (under pubMu) by Abort: work and prepared hold
	// commits that will never be durable, and the next writer must start
	// again from the current snapshot.
	aborted   error
	isAborted atomic.Bool // aborted != nil, for writers to check without pubMu

	feedMu      sync.Mutex
	feed        []*Batch // oldest first, from feedHead on
	feedHead    int
	feedChanges int // changes held in feed[feedHead:]
}

// New makes an empty database for a model.
func New(m *schema.Model, opts Options) *DB {
	if opts.DeletedWindow <= 0 {
		opts.DeletedWindow = DefaultDeletedWindow
	}
	if opts.FeedLength <= 0 {
		opts.FeedLength = DefaultFeedLength
	}
	d := &DB{model: m, opts: opts, relIndex: map[*schema.Field]int{}}
	for _, c := range m.Classes {
		if len(c.Fields) > maxFields {
			panic("db: class " + c.Name + " has more fields than a row can hold")
		}
	}
	for _, r := range m.Relations {
		if !r.ManyToMany {
			d.relIndex[r.Inverse] = len(d.relIndex)
		}
	}
	d.work = newState(m, d.relIndex)
	d.prepared = &Snapshot{reader: reader{db: d, s: d.work.clone()}, done: make(chan struct{})}
	d.cur.Store(d.prepared)
	return d
}

// Model returns the datamodel the database holds.
func (d *DB) Model() *schema.Model { return d.model }

// Snapshot returns the latest committed state. It is cheap and never blocks.
func (d *DB) Snapshot() *Snapshot { return d.cur.Load() }

// Generation returns the latest committed generation.
func (d *DB) Generation() uint64 { return d.cur.Load().s.gen }

// Update runs fn as one transaction. fn's writes are visible to fn at once
// and to everyone else when fn returns nil and the commit is durable; if
// fn returns an error none of them happen. It returns the generation after
// the commit.
//
// A commit that writes only non-persistent tables (sessions, tasks) needs
// no disk, but it is built on the commits before it: when those fail to
// become durable (see Abort) it fails with them, and Update then runs fn
// again, a few times at most, on the state that is durable.
func (d *DB) Update(fn func(tx *Tx) error) (uint64, error) {
	for attempt := 1; ; attempt++ {
		gen, persistent, err := d.update(fn)
		if err == nil || persistent || attempt == 3 || !errors.Is(err, ErrNotDurable) {
			return gen, err
		}
	}
}

// update is one attempt of Update; persistent reports whether the
// transaction wrote a persistent table.
func (d *DB) update(fn func(tx *Tx) error) (_ uint64, persistent bool, _ error) {
	d.mu.Lock()
	if d.failed != nil {
		d.mu.Unlock()
		return 0, false, d.failed
	}
	if d.isAborted.Load() {
		d.pubMu.Lock()
		if d.aborted != nil {
			d.rollback()
		}
		d.pubMu.Unlock()
	}
	tx := newTx(d, d.work)
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("db: transaction panicked: %v", r)
			}
		}()
		return fn(tx)
	}()
	if err != nil {
		gen := d.work.gen
		d.mu.Unlock()
		return gen, false, err
	}
	if tx.s.gen == d.work.gen { // nothing written
		d.mu.Unlock()
		return tx.s.gen, false, nil
	}
	batch := &Batch{From: d.work.gen, To: tx.s.gen, Changes: tx.changes, Tag: tx.Tag}
	for i := range batch.Changes {
		persistent = persistent || batch.Changes[i].Class.Persist
	}
	d.work = tx.s
	snap := d.prepare(tx)
	if d.opts.Persister == nil {
		d.pubMu.Lock()
		d.publish(snap, batch)
		d.pubMu.Unlock()
		d.mu.Unlock()
		return batch.To, persistent, nil
	}
	done := make(chan error, 1)
	d.pubMu.Lock()
	if err := d.aborted; err != nil {
		// A commit this one was built on failed while fn ran.
		d.rollback()
		d.pubMu.Unlock()
		d.mu.Unlock()
		return batch.From, persistent, err
	}
	d.pending = append(d.pending, pendingCommit{snap, batch, done})
	// Queued under pubMu, so that Abort sees every batch it fails either
	// in the persister's queue or not at all.
	d.opts.Persister.Append(batch)
	d.pubMu.Unlock()
	d.mu.Unlock()
	if err := <-done; err != nil {
		return batch.To, persistent, err
	}
	return batch.To, persistent, nil
}

// Durable is called by the persister when every batch up to generation
// gen is on disk: those commits become visible and their writers return.
func (d *DB) Durable(gen uint64) {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	n := 0
	for n < len(d.pending) && d.pending[n].batch.To <= gen {
		d.appendFeed(d.pending[n].batch)
		n++
	}
	if n == 0 {
		return
	}
	// Publish the newest commit (earlier ones are contained in it), release
	// its writers, and only then wake the event waiters: thousands of
	// event.from calls made runnable at once must not queue ahead of the
	// writers whose calls they are waiting to see.
	old := d.cur.Load()
	d.cur.Store(d.pending[n-1].snap)
	for _, p := range d.pending[:n] {
		p.done <- nil
	}
	close(old.done)
	clear(d.pending[:n])
	d.pending = d.pending[n:]
}

// Fail is called by the persister when it cannot make batches durable.
// Pending commits fail, and the database refuses writes from then on; it
// keeps serving the last durable state.
func (d *DB) Fail(err error) {
	ferr := fmt.Errorf("%w: %v", ErrFailed, err)
	d.pubMu.Lock()
	for _, p := range d.pending {
		p.done <- ferr
	}
	d.pending = nil
	d.pubMu.Unlock()
	d.mu.Lock()
	if d.failed == nil {
		d.failed = ferr
	}
	d.mu.Unlock()
}

// Abort is called by the persister when it could not make a batch
// durable but may succeed later (a full disk): every pending commit fails
// with err and is undone, as if its transaction had returned an error,
// and the database goes on taking writes from its last durable state.
// discard, if not nil, runs while no commit can be queued: the persister
// drops its queue there (every batch in it has just failed).
func (d *DB) Abort(err error, discard func()) {
	aerr := fmt.Errorf("%w: %w", ErrNotDurable, err)
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	if discard != nil {
		discard()
	}
	for _, p := range d.pending {
		p.done <- aerr
	}
	clear(d.pending)
	d.pending = nil
	d.aborted = aerr
	d.isAborted.Store(true)
}

// rollback drops the writer's commits that were never published: the
// writer state becomes the current snapshot's. It runs under mu and pubMu
// after Abort, when nothing is pending.
func (d *DB) rollback() {
	cur := d.cur.Load()
	d.work = cur.s.clone()
	d.prepared = cur
	d.aborted = nil
	d.isAborted.Store(false)
}

// Failed reports the persistence error that stopped writes, if any.
func (d *DB) Failed() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// prepare makes the snapshot of the writer's state after a commit: tables
// and indexes the transaction touched are cloned so that later writes
// never reach readers. It runs under the writer lock.
func (d *DB) prepare(tx *Tx) *Snapshot {
	base := d.prepared.s
	s := *base
	s.gen = d.work.gen
	s.tables = append([]*table(nil), base.tables...)
	for i, owned := range tx.ownTable {
		if owned {
			s.tables[i] = d.work.tables[i].clone()
		}
	}
	if tx.ownKeys {
		s.keys = d.work.keys.Clone()
	}
	if tx.ownRels != nil {
		s.rels = append(s.rels[:0:0], base.rels...)
		for i, owned := range tx.ownRels {
			if owned {
				s.rels[i] = d.work.rels[i].Clone()
			}
		}
	}
	d.prepared = &Snapshot{reader: reader{db: d, s: &s}, done: make(chan struct{})}
	return d.prepared
}

// publish makes a prepared snapshot the current one (under pubMu, in
// generation order) and wakes whoever waits on the previous one.
func (d *DB) publish(snap *Snapshot, b *Batch) {
	d.appendFeed(b) // first, so the feed never lags the current snapshot
	d.setCurrent(snap)
}

// setCurrent makes snap the current snapshot and wakes whoever waits on
// the one it replaces. The caller holds pubMu.
func (d *DB) setCurrent(snap *Snapshot) {
	old := d.cur.Load()
	d.cur.Store(snap)
	close(old.done)
}

func (d *DB) appendFeed(b *Batch) {
	d.feedMu.Lock()
	defer d.feedMu.Unlock()
	d.feed = append(d.feed, b)
	d.feedChanges += len(b.Changes)
	for d.feedChanges > d.opts.FeedLength && d.feedHead < len(d.feed)-1 {
		d.feedChanges -= len(d.feed[d.feedHead].Changes)
		d.feed[d.feedHead] = nil
		d.feedHead++
	}
	// Compact once the dropped prefix is the larger part.
	if d.feedHead > len(d.feed)/2 {
		n := copy(d.feed, d.feed[d.feedHead:])
		clear(d.feed[n:])
		d.feed, d.feedHead = d.feed[:n], 0
	}
}

// ErrFeedTruncated says the change feed no longer holds the generation
// asked for: the consumer must resynchronise from a snapshot.
var ErrFeedTruncated = errors.New("db: change feed no longer holds that generation")

// ChangesSince returns the committed batches after generation gen, oldest
// first, or ErrFeedTruncated if some of them were already dropped.
func (d *DB) ChangesSince(gen uint64) ([]*Batch, error) {
	d.feedMu.Lock()
	defer d.feedMu.Unlock()
	live := d.feed[d.feedHead:]
	if len(live) == 0 {
		if gen < d.Generation() {
			return nil, ErrFeedTruncated
		}
		return nil, nil
	}
	if gen < live[0].From {
		return nil, ErrFeedTruncated
	}
	i := sort.Search(len(live), func(i int) bool { return live[i].To > gen })
	return append([]*Batch(nil), live[i:]...), nil
}

// Snapshot is an immutable view of the database at one generation.
type Snapshot struct {
	reader
	done chan struct{}
	memo sync.Map
}

// Memo returns the value computed for key on this snapshot, computing it
// with fn the first time. Derived data that depends only on the snapshot
// (row counts for event.from) is worked out once however many readers ask.
func (s *Snapshot) Memo(key any, fn func() any) any {
	if v, ok := s.memo.Load(key); ok {
		return v
	}
	v, _ := s.memo.LoadOrStore(key, fn())
	return v
}

// Done is closed when a newer snapshot has been committed: waiters for
// changes select on it, with no polling and no batching delay.
func (s *Snapshot) Done() <-chan struct{} { return s.done }

// RowChange is what a group of batches did to one row: its state before
// the first of them (nil if they created it) and their last change to it.
type RowChange struct {
	Before *Row
	Last   *Change
}

// PersistentRowChanges returns, for each row of a persistent class that
// batches change, its RowChange, in the order the rows were first
// changed.
func PersistentRowChanges(batches []*Batch) []RowChange {
	type rowKey struct {
		c   *schema.Class
		ref string
	}
	at := map[rowKey]int{}
	var out []RowChange
	for _, b := range batches {
		for i := range b.Changes {
			ch := &b.Changes[i]
			if !ch.Class.Persist {
				continue
			}
			k := rowKey{ch.Class, ch.Ref}
			if j, seen := at[k]; seen {
				out[j].Last = ch
				continue
			}
			at[k] = len(out)
			out = append(out, RowChange{Before: ch.Old, Last: ch})
		}
	}
	return out
}

// LastPersistentChanges returns the last change to each persistent row
// batches change, in the order the rows were first changed: what a store
// or a replica needs to end in the state the batches leave.
func LastPersistentChanges(batches []*Batch) []*Change {
	rcs := PersistentRowChanges(batches)
	out := make([]*Change, len(rcs))
	for i, rc := range rcs {
		out[i] = rc.Last
	}
	return out
}
