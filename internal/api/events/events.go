// Package events implements the semantics of XenAPI's event calls over the
// database: event.from and event.inject, and the deprecated
// event.register, unregister, next and get_current_id. It knows nothing of
// the wire: the RPC layer encodes what it returns and maps its errors.
//
// event.from follows xapi's xapi_event.ml. For a token (a generation) and
// the latest snapshot, each subscribed object gives at most one event:
//
//   - add if it was created after the token (id = its creation generation);
//   - mod if it was modified after the token and created at or before it
//     (id = its last modification);
//   - del if it was deleted after the token and created at or before it
//     (id = the deletion); an object created and deleted after the token
//     gives nothing, and neither does a deletion the database no longer
//     remembers (its deleted window is bounded; valid_ref_counts lets
//     clients notice).
//
// A batch lists adds, then mods, then dels (xapi's order), each group by
// id, then class, then ref. Its token is the largest generation among the
// subscribed objects examined, and never less than the token given. The
// call waits for the first snapshot that gives an event, with no polling
// and no batching delay: it blocks on the scanned snapshot's Done channel
// and rescans only what changed since.
package events

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// DefaultTimeout is how long event.from waits when its timeout cannot be
// used (negative, NaN, infinite or too large): xapi's 24 hours.
const DefaultTimeout = 24 * time.Hour

// Timeout converts event.from's timeout parameter, in seconds, to a
// duration as xapi does: a value that is not a representable span gives
// DefaultTimeout.
func Timeout(seconds float64) time.Duration {
	if math.IsNaN(seconds) || seconds < 0 || seconds*1e9 >= math.MaxInt64 {
		return DefaultTimeout
	}
	return time.Duration(seconds * 1e9)
}

// Event is one object's change in an event.from batch.
type Event struct {
	ID    uint64        // the generation of the change: sent as a decimal string
	Class *schema.Class // sent as Class.Lower
	Op    db.Op         // "add", "mod" or "del"
	Ref   string
	Row   *db.Row // the object in the batch's Snap for add and mod; nil for del
}

// Batch is event.from's result.
type Batch struct {
	Events []Event
	// ValidRefCounts maps the lower-case name of every database table that
	// produces events (whatever was subscribed) to its row count in Snap.
	// It is shared with other batches of the same snapshot: read only.
	ValidRefCounts map[string]int32
	Token          string
	// Snap is the snapshot the rows come from; the encoder reads derived
	// sets (VM.VBDs) through it.
	Snap *db.Snapshot
}

// From is event.from: it returns the subscribed events after token,
// waiting for at least one. It returns an empty batch, with the token
// unchanged, when timeout passes first; a timeout of 0 looks once and
// returns; a negative one is DefaultTimeout. When ctx ends first it
// returns ctx.Err() (the caller maps a logout to SESSION_INVALID). A bad
// token is EVENT_FROM_TOKEN_PARSE_FAILURE [token].
//
// A waiting call holds no goroutine, timer or lock beyond its own: it
// blocks on the snapshot's Done channel, its timer and ctx.
func From(ctx context.Context, d *db.DB, sub Subscription, token string, timeout time.Duration) (*Batch, error) {
	since, err := ParseToken(token)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if timeout < 0 {
		timeout = DefaultTimeout
	}
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	sc := newScanner(&sub, since)
	snap := d.Snapshot()
	floor := since // changes at or below floor have been examined
	for {
		sc.scan(snap, floor)
		if sc.found() || timeout == 0 {
			return sc.batch(d.Model(), snap), nil
		}
		// Nothing here: the next look needs only the later changes. (An
		// object examined below floor gave no event, so it was created and
		// deleted since the token and cannot change again.)
		floor = max(floor, snap.Generation())
		select {
		case <-snap.Done():
			snap = d.Snapshot()
		case <-expired:
			snap = d.Snapshot()
			sc.scan(snap, floor)
			return sc.batch(d.Model(), snap), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// scanner collects events from snapshots. It is made once per call, so
// that a rescan after a wake-up that finds nothing allocates next to
// nothing.
type scanner struct {
	sub   *Subscription
	since uint64 // the client's token
	last  uint64 // the largest generation examined, at least since

	cur              *tableSub
	adds, mods, dels []Event
	visit            func(*db.Row) bool
}

func newScanner(sub *Subscription, since uint64) *scanner {
	sc := &scanner{sub: sub, since: since, last: since}
	sc.visit = func(row *db.Row) bool {
		sc.row(row)
		return true
	}
	return sc
}

func (sc *scanner) found() bool { return len(sc.adds)+len(sc.mods)+len(sc.dels) > 0 }

// scan looks at the changes in snap after generation floor (floor >=
// since) and classifies them against since.
func (sc *scanner) scan(snap *db.Snapshot, floor uint64) {
	for i := range sc.sub.tables {
		ts := &sc.sub.tables[i]
		sc.cur = ts
		c := ts.class
		if ts.whole {
			snap.ModifiedSince(c, floor, sc.visit)
		} else {
			for _, ref := range ts.refs {
				if row, ok := snap.Get(c, ref); ok && row.Modified > floor {
					sc.row(row)
				}
			}
		}
		for _, del := range snap.DeletedSince(c, floor) {
			if !ts.whole && !slices.Contains(ts.refs, del.Ref) {
				continue
			}
			sc.last = max(sc.last, del.Deleted)
			if del.Created > sc.since {
				continue // created and deleted since the token: nothing to say
			}
			if _, live := snap.Get(c, del.Ref); live {
				continue // the ref was made again: its row says add or mod
			}
			sc.dels = append(sc.dels, Event{ID: del.Deleted, Class: c, Op: db.OpDelete, Ref: del.Ref})
		}
	}
	sc.cur = nil
}

func (sc *scanner) row(row *db.Row) {
	sc.last = max(sc.last, row.Modified)
	c := sc.cur.class
	if row.Created > sc.since {
		sc.adds = append(sc.adds, Event{ID: row.Created, Class: c, Op: db.OpCreate, Ref: row.Ref, Row: row})
	} else {
		sc.mods = append(sc.mods, Event{ID: row.Modified, Class: c, Op: db.OpModify, Ref: row.Ref, Row: row})
	}
}

func eventLess(a, b Event) int {
	if c := cmp.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Class.Index, b.Class.Index); c != 0 {
		return c
	}
	return cmp.Compare(a.Ref, b.Ref)
}

func (sc *scanner) batch(m *schema.Model, snap *db.Snapshot) *Batch {
	n := len(sc.adds) + len(sc.mods) + len(sc.dels)
	evs := make([]Event, 0, n)
	for _, group := range [][]Event{sc.adds, sc.mods, sc.dels} {
		slices.SortFunc(group, eventLess)
		evs = append(evs, group...)
	}
	return &Batch{
		Events:         evs,
		ValidRefCounts: ValidRefCounts(m, snap),
		Token:          FormatToken(sc.last),
		Snap:           snap,
	}
}

// ValidRefCounts counts the rows of every database table (as xapi does:
// not only those that produce events), by lower-case class name. The map is computed once per snapshot
// and shared by every caller asking about it (all the event.from calls
// one commit wakes), so it must not be modified.
func ValidRefCounts(m *schema.Model, snap *db.Snapshot) map[string]int32 {
	return snap.Memo(countsKey{}, func() any {
		out := make(map[string]int32, len(m.Classes))
		for _, c := range m.Classes {
			if c.InDB {
				out[c.Lower] = int32(min(snap.Count(c), math.MaxInt32))
			}
		}
		return out
	}).(map[string]int32)
}

type countsKey struct{}

// Inject is event.inject: it marks object ref of class (any case) modified
// and returns a token after which event.from reports that modification.
// A class that is not a database table, or a ref that is not an object of
// that class, is HANDLE_INVALID [class, ref].
func Inject(d *db.DB, class, ref string) (string, error) {
	c := d.Model().ClassFold(class)
	if c == nil || !c.InDB {
		return "", xerr.New(xerr.HandleInvalid, class, ref)
	}
	var gen uint64
	_, err := d.Update(func(tx *db.Tx) error {
		g, err := tx.Touch(c, ref)
		gen = g
		return err
	})
	if err != nil {
		if xerr.HasCode(err, xerr.HandleInvalid) {
			return "", xerr.New(xerr.HandleInvalid, class, ref)
		}
		return "", err
	}
	return FormatToken(gen - 1), nil
}
