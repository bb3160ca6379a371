package events

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// DefaultQueueLength bounds the deprecated event.next queue. xapi bounds
// its queue by size (10 MB of JSON, warning below 500 events); a count is
// simpler and, since queued rows are shared with the database, is what
// bounds the memory held.
const DefaultQueueLength = 10000

// LegacyEvent is one event of the deprecated event.next API: one database
// change, numbered by the registry's own counter.
type LegacyEvent struct {
	ID        uint64    // from a counter of its own: sent as a decimal string
	Timestamp time.Time // when the registry took the change from the database
	Class     *schema.Class
	Op        db.Op
	Ref       string
	// Row is the object after the change, or for del the object before it
	// (xapi's pre-delete snapshot).
	Row *db.Row
	// Snap is a snapshot at or after the change, for reading the row's
	// derived sets. (A deleted row's derived sets read as empty.)
	Snap *db.Snapshot
}

// Registry holds the event.register subscriptions, one per session, and
// the queue event.next reads. It runs no goroutine: each call first takes
// the changes committed since the last call from the database's change
// feed (Pump), queueing those some registered session wants. If the feed
// has already dropped changes it never took, or the queue outgrows its
// bound, the sessions that had not read the lost events get EVENTS_LOST.
type Registry struct {
	d   *db.DB
	max int
	now func() time.Time

	mu        sync.Mutex
	gen       uint64 // changes up to this generation have been taken
	nextID    uint64 // the id of the next event (event.get_current_id)
	lostBelow uint64 // ids below this were dropped before every session read them
	queue     []LegacyEvent
	head      int // queue[head:] is live, ids ascending
	sessions  map[string]*legacySub
	want      *union // what the sessions want together; nil when stale
}

type legacySub struct {
	items  []item
	lastID uint64        // ids below this were handed out, or predate the subscription
	gone   chan struct{} // closed by Forget
}

// NewRegistry makes a registry over d with DefaultQueueLength.
func NewRegistry(d *db.DB) *Registry { return NewRegistryWithLimit(d, DefaultQueueLength) }

// NewRegistryWithLimit makes a registry whose queue holds at most max
// events.
func NewRegistryWithLimit(d *db.DB, max int) *Registry {
	if max <= 0 {
		max = DefaultQueueLength
	}
	return &Registry{d: d, max: max, now: time.Now, gen: d.Generation(), sessions: map[string]*legacySub{}}
}

// Register is event.register: it adds classes (as event.from reads them)
// to the session's subscription, making one if needed. Events committed
// before the session's first registration are not delivered to it.
func (r *Registry) Register(session string, classes []string) error {
	r.resubscribe(session, classes, func(have, given []item) []item { return append(have, given...) })
	return nil
}

// Unregister is event.unregister: it removes the given entries from the
// session's subscription. As in xapi, a session that had none gets an
// empty one.
func (r *Registry) Unregister(session string, classes []string) error {
	r.resubscribe(session, classes, func(have, given []item) []item {
		return slices.DeleteFunc(have, func(it item) bool { return slices.Contains(given, it) })
	})
	return nil
}

// resubscribe replaces the session's subscription (made if needed) by
// change(what it has, the classes given), once the changes committed so
// far have been taken from the feed under the old one.
func (r *Registry) resubscribe(session string, classes []string, change func(have, given []item) []item) {
	given := parseItems(classes)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pumpLocked()
	sub := r.subLocked(session)
	sub.items = change(sub.items, given)
	r.want = nil
}

func parseItems(classes []string) []item {
	out := make([]item, len(classes))
	for i, s := range classes {
		out[i] = parseItem(s)
	}
	return out
}

func (r *Registry) subLocked(session string) *legacySub {
	sub, ok := r.sessions[session]
	if !ok {
		sub = &legacySub{lastID: r.nextID, gone: make(chan struct{})}
		r.sessions[session] = sub
	}
	return sub
}

// Forget drops the session's subscription (on logout). Its event.next
// calls return SESSION_INVALID [session].
func (r *Registry) Forget(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sub, ok := r.sessions[session]; ok {
		close(sub.gone)
		delete(r.sessions, session)
		r.want = nil
	}
}

// CurrentID is event.get_current_id: the id the next event will get.
func (r *Registry) CurrentID() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pumpLocked()
	return r.nextID
}

// Next is event.next: it returns the session's events since its last
// call (or its registration), in id order, waiting until there is at least
// one. A session that never registered is SESSION_NOT_REGISTERED
// [session]; one whose unread events were dropped is EVENTS_LOST (once:
// the client re-registers and reads its objects again); one forgotten
// while waiting is SESSION_INVALID [session]. When ctx ends first it
// returns ctx.Err().
func (r *Registry) Next(ctx context.Context, session string) ([]LegacyEvent, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r.mu.Lock()
		sub, ok := r.sessions[session]
		if !ok {
			r.mu.Unlock()
			return nil, xerr.New(xerr.SessionNotRegistered, session)
		}
		snap := r.pumpLocked()
		start, end := sub.lastID, r.nextID
		if start < end {
			sub.lastID = end
			if start < r.lostBelow {
				r.mu.Unlock()
				return nil, xerr.New(xerr.EventsLost)
			}
			if evs := r.readLocked(sub, start, end); len(evs) > 0 {
				r.mu.Unlock()
				return evs, nil
			}
		}
		gone := sub.gone
		r.mu.Unlock()
		select {
		case <-snap.Done():
		case <-gone:
			return nil, xerr.New(xerr.SessionInvalid, session)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readLocked returns the queued events with ids in [start, end) that sub
// selects.
func (r *Registry) readLocked(sub *legacySub, start, end uint64) []LegacyEvent {
	live := r.queue[r.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].ID >= start })
	var out []LegacyEvent
	for _, ev := range live[i:] {
		if ev.ID >= end {
			break
		}
		for _, it := range sub.items {
			if it.matches(ev.Class, ev.Ref) {
				out = append(out, ev)
				break
			}
		}
	}
	return out
}

// Pump takes the changes committed since the last call into the queue.
// Every registry call does this first; it is exported for callers that
// want timestamps close to commit times without a client waiting.
func (r *Registry) Pump() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pumpLocked()
}

// pumpLocked takes the committed changes from the feed and returns a
// snapshot at or after the last change taken: a caller waiting for more
// blocks on its Done channel.
func (r *Registry) pumpLocked() *db.Snapshot {
	var deadline time.Time
	for {
		snap := r.d.Snapshot()
		if r.gen >= snap.Generation() {
			return snap
		}
		if len(r.sessions) == 0 { // nobody would read them
			r.gen = snap.Generation()
			return snap
		}
		batches, err := r.d.ChangesSince(r.gen)
		if err != nil && !errors.Is(err, db.ErrFeedTruncated) {
			panic("events: " + err.Error()) // ChangesSince has no other error
		}
		if err == nil {
			snap = r.d.Snapshot() // batches are published before they reach the feed
			r.take(batches, snap)
			if r.gen >= snap.Generation() {
				return snap
			}
		}
		// Either the feed dropped changes we never took, or a commit is
		// published but not yet in the feed (a moment inside DB.Update,
		// when an empty feed also reads as truncated). Wait that out.
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(feedWait)
		} else if now.After(deadline) {
			if err == nil {
				return snap // still not in the feed: the next call takes it
			}
			r.nextID++ // a stand-in for the unknown lost events
			r.lostBelow = r.nextID
			r.gen = snap.Generation()
			return snap
		}
		runtime.Gosched()
	}
}

// feedWait bounds how long a pump waits for the feed to catch up with a
// published snapshot before it believes the feed truncated.
const feedWait = 2 * time.Millisecond

func (r *Registry) take(batches []*db.Batch, snap *db.Snapshot) {
	if r.want == nil {
		r.want = r.union()
	}
	now := r.now()
	for _, b := range batches {
		if b.To <= r.gen {
			continue
		}
		for i := range b.Changes {
			ch := &b.Changes[i]
			if ch.Gen <= r.gen || !eventTable(ch.Class) || !r.want.matches(ch.Class, ch.Ref) {
				continue
			}
			row := ch.Row
			if ch.Op == db.OpDelete {
				row = ch.Old
			}
			r.push(LegacyEvent{ID: r.nextID, Timestamp: now, Class: ch.Class, Op: ch.Op, Ref: ch.Ref, Row: row, Snap: snap})
			r.nextID++
		}
		r.gen = b.To
	}
}

func (r *Registry) push(ev LegacyEvent) {
	r.queue = append(r.queue, ev)
	if len(r.queue)-r.head > r.max {
		r.lostBelow = max(r.lostBelow, r.queue[r.head].ID+1)
		r.queue[r.head] = LegacyEvent{}
		r.head++
	}
	if r.head > len(r.queue)/2 && r.head > 64 {
		n := copy(r.queue, r.queue[r.head:])
		clear(r.queue[n:])
		r.queue, r.head = r.queue[:n], 0
	}
}

// union is what all registered sessions want together: a change nobody
// wants is not queued.
type union struct {
	all     bool
	classes map[string]bool
	objects map[[2]string]bool
}

func (r *Registry) union() *union {
	u := &union{classes: map[string]bool{}, objects: map[[2]string]bool{}}
	for _, sub := range r.sessions {
		for _, it := range sub.items {
			switch {
			case it.all:
				u.all = true
			case it.obj:
				u.objects[[2]string{it.class, it.ref}] = true
			default:
				u.classes[it.class] = true
			}
		}
	}
	return u
}

func (u *union) matches(c *schema.Class, ref string) bool {
	return u.all || u.classes[c.Lower] || (len(u.objects) > 0 && u.objects[[2]string{c.Lower, ref}])
}
