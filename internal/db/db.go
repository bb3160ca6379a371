// Package db is toolstackd's in-memory database: one table per datamodel
// class, rows of canonical values, a global 64-bit generation bumped by
// every write, derived inverse sets kept from the datamodel's relations,
// indexes by ref, uuid, name_label and modification generation, and a
// generation-ordered change feed.
//
// Readers take a Snapshot: an immutable view that never blocks and is never
// blocked by writers. Writers run one at a time in Update, see their own
// writes, and publish a new snapshot atomically when the function returns
// nil; an error discards every write of the transaction.
package db

import (
	"errors"
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
	// OnCommit, when set, is called with each batch in generation order
	// while the writer lock is held; the function it returns (if any) is
	// called after the lock is released and before Update returns, and its
	// error is Update's. Persistence uses it to make writes durable before
	// they are acknowledged, grouping concurrent commits.
	OnCommit func(*Batch) (wait func() error)
}

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
}

// DB is the database.
type DB struct {
	model    *schema.Model
	opts     Options
	relIndex map[*schema.Field]int // derived inverse field -> index into state.rels

	mu   sync.Mutex // held by the one writer
	work *state     // the writer's own copy: its trees are never read by others
	cur  atomic.Pointer[Snapshot]

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
	d.cur.Store(&Snapshot{reader: reader{db: d, s: d.work.clone()}, done: make(chan struct{})})
	return d
}

// Model returns the datamodel the database holds.
func (d *DB) Model() *schema.Model { return d.model }

// Snapshot returns the latest committed state. It is cheap and never blocks.
func (d *DB) Snapshot() *Snapshot { return d.cur.Load() }

// Generation returns the latest committed generation.
func (d *DB) Generation() uint64 { return d.cur.Load().s.gen }

// Update runs fn as one transaction. fn's writes are visible to fn at once
// and to everyone else when fn returns nil; if fn returns an error (or
// panics) none of them happen. It returns the generation after the commit.
func (d *DB) Update(fn func(tx *Tx) error) (uint64, error) {
	d.mu.Lock()
	locked := true
	defer func() {
		if locked {
			d.mu.Unlock()
		}
	}()
	tx := newTx(d, d.work)
	if err := fn(tx); err != nil {
		return d.work.gen, err
	}
	if tx.s.gen == d.work.gen { // nothing written
		return tx.s.gen, nil
	}
	batch := &Batch{From: d.work.gen, To: tx.s.gen, Changes: tx.changes}
	var wait func() error
	if d.opts.OnCommit != nil {
		wait = d.opts.OnCommit(batch)
	}
	d.work = tx.s
	d.publish(tx)
	d.appendFeed(batch)
	locked = false
	d.mu.Unlock()
	if wait != nil {
		if err := wait(); err != nil {
			return batch.To, err
		}
	}
	return batch.To, nil
}

// publish makes the writer's state visible: tables and indexes the
// transaction touched are cloned so that later writes never reach readers.
func (d *DB) publish(tx *Tx) {
	old := d.cur.Load()
	s := *old.s
	s.gen = d.work.gen
	s.tables = append([]*table(nil), old.s.tables...)
	for i, owned := range tx.ownTable {
		if owned {
			s.tables[i] = d.work.tables[i].clone()
		}
	}
	if tx.ownKeys {
		s.keys = d.work.keys.Clone()
	}
	if tx.ownRels != nil {
		s.rels = append(s.rels[:0:0], old.s.rels...)
		for i, owned := range tx.ownRels {
			if owned {
				s.rels[i] = d.work.rels[i].Clone()
			}
		}
	}
	next := &Snapshot{reader: reader{db: d, s: &s}, done: make(chan struct{})}
	d.cur.Store(next)
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
}

// Done is closed when a newer snapshot has been committed: waiters for
// changes select on it, with no polling and no batching delay.
func (s *Snapshot) Done() <-chan struct{} { return s.done }
