package api

import (
	"sync"
	"sync/atomic"

	"toolstackd/internal/api/wire"
	"toolstackd/internal/db"
)

// Records are the bulk of most replies (VM.get_all_records with thousands
// of VMs, event.from snapshots, get_record in a loop), and most of them
// have not changed since they were last sent. So each row's record is kept
// encoded, per wire kind, and copied into later replies until the row
// changes.
//
// Rows are immutable and every write (including a change to a derived set
// such as VM.VBDs, which touches the parent row) makes a new *db.Row, so
// the row pointer identifies its content exactly: an entry is used only
// for the very row it was made from. The cache is keyed by (kind, ref) so
// that a ref holds one entry per kind however often it changes, and its
// bytes are bounded (rowCacheLimit); past the bound, entries are dropped
// until it is three quarters full.

// rowCacheDefault is the default bound on the bytes the cache holds. An
// ordinary VM's record is 2.6 KiB of JSON and 7.5 KiB of XML-RPC, which
// the allocator rounds to 2.7 and 8 KiB: with the entries' bookkeeping
// about 11 KB per VM for both kinds, 112 MB for 10,000 VMs.
const rowCacheDefault = 128 << 20

// rowEntryOverhead is what one entry costs beyond the capacity of its
// bytes: the map node, key, entry and slice headers (measured with
// runtime.MemStats: about 170 bytes).
const rowEntryOverhead = 170

// cost is what an entry is counted as against the bound.
func (e *rowEntry) cost() int64 { return int64(cap(e.b) + rowEntryOverhead) }

type rowKey struct {
	kind string
	ref  string
}

type rowEntry struct {
	row *db.Row
	b   []byte
}

type rowCache struct {
	limit   atomic.Int64
	size    atomic.Int64 // bytes held, with rowEntryOverhead per entry
	entries atomic.Int64
	m       sync.Map // rowKey -> *rowEntry
	evictMu sync.Mutex

	encodes atomic.Int64 // rows encoded through the cache (misses), for tests
}

// noCache encodes without the cache.
var noCache *rowCache

func newRowCache(limit int64) *rowCache {
	c := &rowCache{}
	c.limit.Store(max(limit, 0))
	return c
}

// setLimit bounds the memory of the cache; 0 turns it off (and empties
// it).
func (c *rowCache) setLimit(n int64) {
	c.limit.Store(max(n, 0))
	c.evict()
}

// scratch buffers for encoding a record before it is copied into the
// cache at its exact size.
var rowScratch = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// row writes a database row as its record: every public field in
// datamodel order. A row read from a snapshot is copied from the cache
// when it was encoded before, for the encoder's kind. A nil cache writes
// every row afresh.
func (c *rowCache) row(e wire.Encoder, snap db.Reader, r *db.Row) {
	pe, ok := e.(wire.Preencoder)
	s, isSnap := snap.(*db.Snapshot)
	if c == nil || !ok || !isSnap || s == nil || c.limit.Load() == 0 {
		writeRow(e, snap, r)
		return
	}
	// The cached bytes hold the derived sets as of the row's own
	// generation. They are what this call would write only if the
	// snapshot still holds this very row; a row older than the snapshot
	// (a handler's row, written with the later snapshot of its reply) is
	// written as before, with the snapshot's derived sets.
	if cur, found := s.Get(r.Class, r.Ref); !found || cur != r {
		writeRow(e, snap, r)
		return
	}
	key := rowKey{pe.Kind(), r.Ref}
	if v, hit := c.m.Load(key); hit {
		if ent := v.(*rowEntry); ent.row == r {
			pe.Preencoded(ent.b)
			return
		}
	}
	bp := rowScratch.Get().(*[]byte)
	b := pe.AppendAlone((*bp)[:0], rowMarshaler{r, s})
	pe.Preencoded(b)
	c.encodes.Add(1)
	c.put(key, &rowEntry{row: r, b: append([]byte(nil), b...)})
	if cap(b) <= 1<<20 {
		*bp = b[:0]
		rowScratch.Put(bp)
	}
}

// rowMarshaler writes one row, for AppendAlone.
type rowMarshaler struct {
	r    *db.Row
	snap db.Reader
}

func (m rowMarshaler) MarshalXenAPI(e wire.Encoder) { writeRow(e, m.snap, m.r) }

func (c *rowCache) put(key rowKey, ent *rowEntry) {
	n := ent.cost()
	if n > c.limit.Load()/8 {
		return // one huge record would push out everything else
	}
	old, loaded := c.m.Swap(key, ent)
	if loaded {
		n -= old.(*rowEntry).cost()
	} else {
		c.entries.Add(1)
	}
	if c.size.Add(n) > c.limit.Load() {
		c.evict()
	}
}

// evict drops entries until the cache is at most three quarters full. Only
// one caller evicts at a time; the others carry on.
func (c *rowCache) evict() {
	if !c.evictMu.TryLock() {
		return
	}
	defer c.evictMu.Unlock()
	target := c.limit.Load() * 3 / 4
	c.m.Range(func(k, v any) bool {
		if c.size.Load() <= target {
			return false
		}
		if c.m.CompareAndDelete(k, v) {
			c.size.Add(-v.(*rowEntry).cost())
			c.entries.Add(-1)
		}
		return true
	})
}

// writeRow encodes a row as its record.
func writeRow(e wire.Encoder, snap db.Reader, r *db.Row) {
	e.BeginStruct()
	for _, f := range r.Class.Fields {
		if f.Internal {
			continue
		}
		e.Member(f.Name)
		var v any
		if f.Derived && snap != nil {
			v = snap.Value(r, f)
		} else {
			v = r.At(f.Index)
		}
		noCache.value(e, f.Type, v, snap) // a field holds no records
	}
	e.EndStruct()
}
