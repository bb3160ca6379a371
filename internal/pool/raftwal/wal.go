// Package raftwal keeps raft's log in append-only segment files: a
// raft.LogStore for github.com/hashicorp/raft. The daemon keeps its raft
// log here (internal/pool/dbraft); raft's term and vote stay in bbolt
// (internal/pool/raftstore), where they change only at elections.
//
// # Why not bbolt
//
// A bbolt commit syncs twice: the pages, then the meta page that makes
// them current. An append-only log needs one sync per StoreLogs: the
// records are written at the end of the current segment and the file is
// fdatasynced once. A record whose bytes did not all reach the disk
// before a crash is found by its checksum and cut off at the next Open.
// Every replicated write waits for a follower's sync, and the leader's
// (alongside, with StoreLogsAsync), so the store's sync is on the path of
// every write (docs/performance.md, issue 12, has the figures that moved
// the log here).
//
// # Files
//
// A directory holds segments named by the index of their first entry,
// as 20 decimal digits and ".wal" ("00000000000000000001.wal"). A
// segment is a sequence of records:
//
//	length  uint32, big-endian: the bytes of the body
//	crc     uint32, big-endian: CRC-32C of the body
//	body    index uvarint, term uvarint, type byte, appended-at unix
//	        nanoseconds varint, data length uvarint and data,
//	        extensions length uvarint and extensions
//
// Entries are contiguous: each record's index is one more than the one
// before, across segments. A new segment starts when the current one
// passes Options.SegmentBytes.
//
// The segment being appended to is extended ahead of its records, in
// steps of Options.PreallocBytes (fallocate), so that the sync of an
// append does not also have to record a larger file: on ext4 here that
// takes an fdatasync from about 155 µs to 90 µs (docs/performance.md).
// With Options.ZeroSegments the next segment is instead made ahead, in
// the background, as a synced file of written zeros (spare.go), so that
// a sync does not have to record which reserved blocks now hold data
// either. Either way the space ahead reads as zeros, which no record
// starts with (a record's length is never 0): Open takes the first zero
// header of the last segment as the end of the log and cuts the file
// there, as it cuts a torn record. A segment is cut to its records (and
// synced) before the next one begins, and at Close. The file "first"
// holds, as 8 big-endian bytes, the lowest index that is not deleted
// (raft's log compaction removes a prefix; entries of a segment before
// it are ignored), written to a temporary file, synced and renamed into
// place.
//
// # Recovery
//
// Open reads every segment. In the last one, a record that is short or
// whose checksum or body does not hold is a torn write: the segment is
// cut there (and synced) and the log ends at the record before. Anywhere
// else the same damage is reported as an error wrapping ErrCorrupt:
// earlier segments were complete and synced before the next began.
//
// # Syncing behind the writer
//
// StoreLogs returns once its entries are synced. StoreLogsAsync returns
// once they are written (readable by GetLog), and a goroutine of the
// log's own syncs them behind the writer, one fdatasync for whatever was
// written meanwhile. DurableIndex says how far the disk holds the log and
// WaitDurable waits for it. This is for a raft leader, which may send
// entries to its followers while they reach its own disk, so long as
// nothing treats an entry as committed before it is durable here too
// (internal/pool/dbraft says how it keeps to that). A failed sync fails
// the log: every later store, and every wait, returns that error (the
// page cache may have dropped what did not reach the disk; reopening
// reads what did). Open syncs what it finds, so a log reopened after a
// crash of the process (not of the machine) starts durable.
//
// # Deleting
//
// raft deletes either a prefix (compaction after a snapshot) or a suffix
// (entries of a deposed leader that conflict with the new one's).
// DeleteRange removes whole segments where it can, moves "first" for a
// prefix, and truncates the segment holding the first deleted entry of a
// suffix. A range in the middle of the log is refused.
package raftwal

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/safepath"
)

// MaxEntryBytes bounds the data and extensions of one entry each.
const MaxEntryBytes = 64 << 20

// maxRecord bounds a record's body: both fields at their limit and the
// fixed fields.
const maxRecord = 2*MaxEntryBytes + 64

// ErrCorrupt is wrapped by errors about damaged segments.
var ErrCorrupt = errors.New("raftwal: corrupt log")

var crcTable = crc32.MakeTable(crc32.Castagnoli)

const (
	segmentSuffix = ".wal"
	firstName     = "first"
	headerBytes   = 8
)

// Options tune Open.
type Options struct {
	// SegmentBytes starts a new segment once the current one is larger
	// (default 64 MiB).
	SegmentBytes int64
	// PreallocBytes is how far ahead of its records the segment being
	// appended to is extended at a time (default 4 MiB; negative: never).
	PreallocBytes int64
	// NoSync skips fdatasync (benchmarks only).
	NoSync bool
	// ZeroSegments keeps the next segment ready as a synced file of
	// zeros, made in the background (see "Zeroed segments" in spare.go):
	// appends then sync without a journal commit.
	ZeroSegments bool
}

// where is an entry's place on disk.
type where struct {
	seg *segment
	off int64
	n   int32 // body length
}

type segment struct {
	first uint64 // index of its first record
	path  string
	f     *os.File
	size  int64 // the end of its records
	alloc int64 // the file's length: size, or more where extended ahead
	// zeroed is the end of the part of the file that holds written
	// zeros (a segment made from a spare), or 0.
	zeroed int64
}

// WAL is a raft.LogStore on segment files. It is safe for concurrent use.
type WAL struct {
	dir  string
	opts Options

	mu    sync.RWMutex
	segs  []*segment
	first uint64 // lowest index kept (0: empty log)
	last  uint64 // highest index stored (0: empty log)
	// at[i] is where the entry of index base+i is (base: the first
	// entry of the first segment).
	base uint64
	at   []where
	buf  []byte

	// durable is the highest index known to be on the disk; durableCh
	// is closed and replaced when it grows or the log fails (failed).
	durable   uint64
	durableCh chan struct{}
	failed    error
	// gen grows whenever entries are deleted from the end, so that a
	// sync begun before does not vouch for entries written after.
	gen uint64
	// syncer syncs behind StoreLogsAsync (started by the first one);
	// preparer keeps a spare (Options.ZeroSegments, spare.go), the next
	// segment once ready, and is nil once stopped.
	syncer   *worker
	preparer *worker
	spare    *spare
}

var _ raft.LogStore = (*WAL)(nil)

// Open opens (creating it if needed) the log in dir, cutting a torn tail.
func Open(dir string, opts Options) (*WAL, error) {
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = 64 << 20
	}
	if opts.PreallocBytes == 0 {
		opts.PreallocBytes = 4 << 20
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	w := &WAL{dir: dir, opts: opts, durableCh: make(chan struct{})}
	if err := removeStaleSpare(dir); err != nil {
		return nil, err
	}
	if err := w.load(); err != nil {
		_ = w.closeFiles()
		return nil, err
	}
	// What a stopped process wrote may still be only in the page cache.
	for _, seg := range w.segs {
		if err := fdatasync(seg.f); err != nil {
			_ = w.closeFiles()
			return nil, err
		}
	}
	w.durable = w.last
	if opts.ZeroSegments {
		w.preparer = startWorker(w.prepareStep)
		w.preparer.kick()
	}
	return w, nil
}

// load reads "first" and every segment.
func (w *WAL) load() error {
	firstPath, err := safepath.JoinName(w.dir, firstName)
	if err != nil {
		return err
	}
	var keep uint64
	switch b, err := os.ReadFile(firstPath); { //nolint:gosec // the path is under the log's directory (safepath)
	case err == nil && len(b) == 8:
		keep = binary.BigEndian.Uint64(b)
	case err == nil:
		return fmt.Errorf("%w: %s holds %d bytes", ErrCorrupt, firstPath, len(b))
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	names, err := w.segmentNames()
	if err != nil {
		return err
	}
	for i, name := range names {
		start, _ := strconv.ParseUint(strings.TrimSuffix(name, segmentSuffix), 10, 64)
		path, err := safepath.JoinName(w.dir, name)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0o600) //nolint:gosec // the path is under the log's directory (safepath)
		if err != nil {
			return err
		}
		seg := &segment{first: start, path: path, f: f}
		w.segs = append(w.segs, seg)
		if w.last != 0 && start != w.last+1 {
			return fmt.Errorf("%w: segment %s starts at %d, the log before ends at %d", ErrCorrupt, name, start, w.last)
		}
		if err := w.scan(seg, i == len(names)-1); err != nil {
			return err
		}
	}
	if w.last == 0 {
		return nil
	}
	w.first = max(w.base, keep)
	if w.first > w.last {
		w.first, w.last = 0, 0
	}
	return nil
}

// segmentNames lists the directory's segments in index order.
func (w *WAL) segmentNames() ([]string, error) {
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, segmentSuffix) {
			continue
		}
		digits := strings.TrimSuffix(n, segmentSuffix)
		if _, err := strconv.ParseUint(digits, 10, 64); err != nil || len(digits) != 20 {
			return nil, fmt.Errorf("%w: unexpected file %s", ErrCorrupt, n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// scan indexes a segment's records; in the last segment a damaged record
// ends the log and the file is cut there.
func (w *WAL) scan(seg *segment, last bool) error {
	r := bufio.NewReaderSize(seg.f, 1<<16)
	var off int64
	next := seg.first
	var hdr [headerBytes]byte
	var body []byte
	for {
		bad := ""
		_, err := io.ReadFull(r, hdr[:])
		if err == io.EOF {
			break
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		switch {
		case err != nil:
			bad = "a short record header"
		case n == 0 || n > maxRecord:
			bad = fmt.Sprintf("a record of %d bytes", n)
		default:
			body = slices.Grow(body[:0], int(n))[:n]
			if _, err := io.ReadFull(r, body); err != nil {
				bad = "a short record"
			} else if crcOf(body) != binary.BigEndian.Uint32(hdr[4:]) {
				bad = "a record with a wrong checksum"
			} else {
				var l raft.Log
				if err := decode(body, &l); err != nil {
					bad = err.Error()
				} else if l.Index != next {
					bad = fmt.Sprintf("entry %d where %d was due", l.Index, next)
				}
			}
		}
		if bad != "" {
			if !last {
				return fmt.Errorf("%w: %s at offset %d of %s", ErrCorrupt, bad, off, seg.path)
			}
			// A torn write: the log ends before it.
			if err := seg.f.Truncate(off); err != nil {
				return err
			}
			if err := seg.f.Sync(); err != nil {
				return err
			}
			break
		}
		if w.base == 0 {
			w.base = next
		}
		w.at = append(w.at, where{seg: seg, off: off, n: int32(n)})
		w.last = next
		next++
		off += headerBytes + int64(n)
	}
	seg.size, seg.alloc = off, off
	return nil
}

// FirstIndex returns the lowest index stored, 0 when the log is empty.
func (w *WAL) FirstIndex() (uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.first, nil
}

// LastIndex returns the highest index stored, 0 when the log is empty.
func (w *WAL) LastIndex() (uint64, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.last, nil
}

// GetLog fills log with the entry at index, or returns raft.ErrLogNotFound.
func (w *WAL) GetLog(index uint64, log *raft.Log) error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.first == 0 || index < w.first || index > w.last {
		return raft.ErrLogNotFound
	}
	p := w.at[index-w.base]
	rec := make([]byte, headerBytes+int(p.n))
	if _, err := p.seg.f.ReadAt(rec, p.off); err != nil {
		return fmt.Errorf("raftwal: entry %d: %w", index, err)
	}
	body := rec[headerBytes:]
	if crcOf(body) != binary.BigEndian.Uint32(rec[4:headerBytes]) {
		return fmt.Errorf("raftwal: entry %d: %w: wrong checksum", index, ErrCorrupt)
	}
	var l raft.Log
	if err := decode(body, &l); err != nil {
		return fmt.Errorf("raftwal: entry %d: %w", index, err)
	}
	if l.Index != index {
		return fmt.Errorf("raftwal: entry %d: %w: holds index %d", index, ErrCorrupt, l.Index)
	}
	*log = l
	return nil
}

// StoreLog stores one entry.
func (w *WAL) StoreLog(log *raft.Log) error { return w.StoreLogs([]*raft.Log{log}) }

// StoreLogs appends entries, which must follow the last one stored (any
// index on an empty log), with one write and one sync.
func (w *WAL) StoreLogs(logs []*raft.Log) error { return w.store(logs, true) }

// StoreLogsAsync appends entries as StoreLogs does, without waiting for
// the disk: they are readable at once and synced behind (see "Syncing
// behind the writer" in the package documentation).
func (w *WAL) StoreLogsAsync(logs []*raft.Log) error {
	return w.store(logs, false)
}

// store appends entries, synced or not.
func (w *WAL) store(logs []*raft.Log, sync bool) error {
	if len(logs) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	if !sync && w.syncer == nil {
		w.syncer = startWorker(w.syncStep)
	}
	next := w.last + 1
	if w.first == 0 {
		next = logs[0].Index
		// An empty log may still have files: a segment whose records were
		// all torn, or entries below a "first" beyond them. A log starting
		// anywhere must not be appended to them.
		if len(w.segs) > 0 {
			if err := w.deleteAll(); err != nil {
				return err
			}
		}
	}
	for i, l := range logs {
		if l == nil {
			return fmt.Errorf("raftwal: StoreLogs: entry %d is nil", i)
		}
		if l.Index != next+uint64(i) {
			return fmt.Errorf("raftwal: StoreLogs: entry %d where %d was due", l.Index, next+uint64(i))
		}
		if len(l.Data) > MaxEntryBytes || len(l.Extensions) > MaxEntryBytes {
			return fmt.Errorf("raftwal: StoreLogs: entry %d is larger than %d bytes", l.Index, MaxEntryBytes)
		}
	}
	buf := w.buf[:0]
	places := make([]where, 0, len(logs))
	for _, l := range logs {
		start := len(buf)
		buf = append(buf, make([]byte, headerBytes)...)
		buf = encode(buf, l)
		body := buf[start+headerBytes:]
		binary.BigEndian.PutUint32(buf[start:], uint32(len(body)))
		binary.BigEndian.PutUint32(buf[start+4:], crcOf(body))
		places = append(places, where{off: int64(start), n: int32(len(body))})
	}
	w.buf = buf
	seg, err := w.tail(next, int64(len(buf)))
	if err != nil {
		return err
	}
	for i := range places {
		places[i].seg, places[i].off = seg, seg.size+places[i].off
	}
	w.extend(seg, int64(len(buf)))
	if _, err := seg.f.WriteAt(buf, seg.size); err != nil {
		// Cut whatever reached the file (Open would cut it as torn).
		seg.alloc = -1
		_ = trim(seg)
		return fmt.Errorf("raftwal: %w", err)
	}
	if sync && !w.opts.NoSync {
		if err := fdatasync(seg.f); err != nil {
			seg.alloc = -1
			_ = trim(seg)
			return w.fail(err)
		}
	}
	seg.size += int64(len(buf))
	if w.first == 0 {
		w.first, w.base, w.at = next, next, w.at[:0]
	}
	w.at = append(w.at, places...)
	w.last = logs[len(logs)-1].Index
	if sync || w.opts.NoSync {
		// One sync of the file holds everything before too: earlier
		// segments were synced before this one began.
		w.setDurable(w.last)
	}
	if !sync {
		w.syncer.kick() // awake already, it sees these too
	}
	return nil
}

// setDurable records that the disk holds the log up to index. It runs
// under mu.
func (w *WAL) setDurable(index uint64) {
	if index <= w.durable {
		return
	}
	w.durable = index
	close(w.durableCh)
	w.durableCh = make(chan struct{})
}

// fail records a failed sync, which fails the log; it runs under mu and
// returns the error stores return from now on.
func (w *WAL) fail(err error) error {
	if w.failed == nil {
		w.failed = fmt.Errorf("raftwal: a sync failed, the log takes nothing more: %w", err)
		close(w.durableCh)
		w.durableCh = make(chan struct{})
	}
	return w.failed
}

// DurableIndex is the highest index known to be on the disk.
func (w *WAL) DurableIndex() uint64 {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.durable
}

// WaitDurable waits until the disk holds the log up to index, the log
// fails (its error), or ctx ends.
func (w *WAL) WaitDurable(ctx context.Context, index uint64) error {
	for {
		w.mu.RLock()
		durable, failed, ch := w.durable, w.failed, w.durableCh
		w.mu.RUnlock()
		switch {
		case durable >= index:
			return nil
		case failed != nil:
			return failed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("raftwal: waiting for entry %d to reach the disk (at %d): %w", index, durable, ctx.Err())
		}
	}
}

// syncStep is the syncer's step: it syncs the last segment when entries
// were written without a sync, and records how far that made the log
// durable. The sync runs without the lock, so writes and reads go on
// meanwhile.
func (w *WAL) syncStep(<-chan struct{}) {
	w.mu.RLock()
	upTo, gen, n := w.last, w.gen, len(w.segs)
	var seg *segment
	if n > 0 && w.failed == nil && upTo > w.durable {
		seg = w.segs[n-1] // earlier segments were synced when this one began
	}
	w.mu.RUnlock()
	if seg == nil {
		return
	}
	err := fdatasync(seg.f)
	w.mu.Lock()
	defer w.mu.Unlock()
	// Entries deleted from the end meanwhile (gen) may have closed the
	// file or been written again after the sync began.
	if gen == w.gen {
		if err != nil {
			_ = w.fail(err)
		} else {
			w.setDurable(upTo)
		}
	}
	// A sync that vouched for nothing goes round again while entries wait
	// for the disk, whether or not a store kicked meanwhile.
	if gen != w.gen && w.failed == nil && w.last > w.durable {
		w.syncer.kick()
	}
}

// stopSyncer ends the syncer, if it runs; not under mu. (A store after
// it finds the syncer halted: kicks do nothing.)
func (w *WAL) stopSyncer() {
	w.mu.RLock()
	s := w.syncer
	w.mu.RUnlock()
	if s != nil {
		s.halt()
	}
}

// extend makes room for n more bytes of records in seg ahead of time
// (see Files in the package documentation). Where the file system
// cannot, the write extends the file itself, as it would without this.
func (w *WAL) extend(seg *segment, n int64) {
	if w.opts.PreallocBytes < 0 || seg.size+n <= seg.alloc {
		return
	}
	to := seg.size + max(n, w.opts.PreallocBytes)
	if err := preallocate(seg.f, seg.alloc, to-seg.alloc); err != nil {
		w.opts.PreallocBytes = -1 // not here; not again
		return
	}
	seg.alloc = to
}

// trim cuts seg's file to its records.
func trim(seg *segment) error {
	if seg.alloc == seg.size {
		return nil
	}
	if err := seg.f.Truncate(seg.size); err != nil {
		return err
	}
	seg.alloc, seg.zeroed = seg.size, min(seg.zeroed, seg.size)
	return nil
}

// tail returns the segment to append entry next to, with n bytes of
// records, starting a new one when the current one is full (or there is
// none), or when a spare is ready and the records would not fit in the
// current one's zeros.
func (w *WAL) tail(next uint64, n int64) (*segment, error) {
	if k := len(w.segs); k > 0 {
		cur := w.segs[k-1]
		early := w.spare != nil && cur.size > 0 && cur.size+n > cur.zeroed
		if cur.size < w.opts.SegmentBytes && !early {
			return cur, nil
		}
	}
	return w.newSegment(next)
}

// newSegment starts the segment that holds entry next on: a spare if one
// is ready, or a new empty file.
func (w *WAL) newSegment(next uint64) (*segment, error) {
	n := len(w.segs)
	if n > 0 {
		// Only the last segment may end in an extension or hold entries
		// not yet synced: cut the full one to its records, and sync it,
		// before a later one exists.
		if cur := w.segs[n-1]; cur.alloc != cur.size || w.durable < w.last {
			if err := trim(cur); err != nil {
				return nil, err
			}
			if err := fdatasync(cur.f); err != nil {
				return nil, w.fail(err)
			}
			w.setDurable(w.last)
		}
	}
	name := fmt.Sprintf("%020d%s", next, segmentSuffix)
	path, err := safepath.JoinName(w.dir, name)
	if err != nil {
		return nil, err
	}
	if seg, err := w.useSpare(next, path); err != nil || seg != nil {
		if seg != nil {
			w.segs = append(w.segs, seg)
		}
		return seg, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600) //nolint:gosec // the path is under the log's directory (safepath)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.SyncDir(w.dir); err != nil {
		_ = f.Close()
		return nil, err
	}
	seg := &segment{first: next, path: path, f: f}
	w.segs = append(w.segs, seg)
	return seg, nil
}

// DeleteRange deletes the entries min to max inclusive: a prefix or a
// suffix of the log.
func (w *WAL) DeleteRange(min, max uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if min > max || w.first == 0 || max < w.first || min > w.last {
		return nil
	}
	switch {
	case min <= w.first && max >= w.last:
		return w.deleteAll()
	case min <= w.first:
		return w.deletePrefix(max)
	case max >= w.last:
		return w.deleteSuffix(min)
	}
	return fmt.Errorf("raftwal: DeleteRange(%d, %d) inside the log [%d, %d]", min, max, w.first, w.last)
}

// deletePrefix keeps the entries after upTo.
func (w *WAL) deletePrefix(upTo uint64) error {
	if err := w.writeFirst(upTo + 1); err != nil {
		return err
	}
	w.first = upTo + 1
	// Whole segments before the new first go.
	for len(w.segs) > 1 && w.segs[1].first <= w.first {
		if err := w.removeSegment(w.segs[0]); err != nil {
			return err
		}
		w.segs = w.segs[1:]
	}
	drop := w.segs[0].first - w.base
	w.at = slices.Clone(w.at[drop:])
	w.base = w.segs[0].first
	return nil
}

// deleteSuffix keeps the entries before from.
func (w *WAL) deleteSuffix(from uint64) error {
	w.gen++ // before any file changes: a sync under way vouches for nothing
	p := w.at[from-w.base]
	// Segments from the one that starts at from (if one does) go whole;
	// the one holding from otherwise is cut before it.
	for len(w.segs) > 0 && w.segs[len(w.segs)-1].first >= from {
		if err := w.removeSegment(w.segs[len(w.segs)-1]); err != nil {
			return err
		}
		w.segs = w.segs[:len(w.segs)-1]
	}
	if p.seg.first < from {
		if err := p.seg.f.Truncate(p.off); err != nil {
			return err
		}
		if err := fdatasync(p.seg.f); err != nil {
			return w.fail(err) // the file is cut, the index is not: stop here
		}
		p.seg.size, p.seg.alloc, p.seg.zeroed = p.off, p.off, min(p.seg.zeroed, p.off)
	}
	w.at = w.at[:from-w.base]
	w.last = from - 1
	// What is left is on the disk: the segment cut was synced just now,
	// and every one before it when its successor began. Saying so here
	// matters: a sync under way when gen moved vouches for nothing, and
	// no store may follow to wake the syncer again.
	w.durable = min(w.durable, w.last)
	w.setDurable(w.last)
	return nil
}

func (w *WAL) deleteAll() error {
	w.gen++ // before any file changes: a sync under way vouches for nothing
	if err := w.writeFirst(0); err != nil {
		return err
	}
	for _, s := range w.segs {
		if err := w.removeSegment(s); err != nil {
			return err
		}
	}
	w.segs, w.at = nil, nil
	w.first, w.last, w.base = 0, 0, 0
	w.durable = 0
	return nil
}

func (w *WAL) removeSegment(s *segment) error {
	_ = s.f.Close()
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(w.dir)
}

// writeFirst records the lowest index kept, atomically.
func (w *WAL) writeFirst(first uint64) error {
	path, err := safepath.JoinName(w.dir, firstName)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, binary.BigEndian.AppendUint64(nil, first), 0o600)
}

// Close syncs what was stored without a sync and closes the segment
// files.
func (w *WAL) Close() error {
	w.stopSyncer()
	w.stopPreparer()
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if n := len(w.segs); n > 0 && w.durable < w.last && w.failed == nil && !w.opts.NoSync {
		if err = fdatasync(w.segs[n-1].f); err == nil {
			w.setDurable(w.last) // wakes anyone still waiting
		}
	}
	return errors.Join(err, w.closeFiles())
}

func (w *WAL) closeFiles() error {
	var err error
	for _, s := range w.segs {
		// A log closed cleanly ends where its records do (a crash leaves
		// the extension, which Open cuts).
		if terr := trim(s); err == nil {
			err = terr
		}
		if cerr := s.f.Close(); err == nil {
			err = cerr
		}
	}
	w.segs = nil
	return err
}

// encode appends an entry's body.
func encode(dst []byte, l *raft.Log) []byte {
	dst = binary.AppendUvarint(dst, l.Index)
	dst = binary.AppendUvarint(dst, l.Term)
	dst = append(dst, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	dst = binary.AppendVarint(dst, at)
	dst = binary.AppendUvarint(dst, uint64(len(l.Data)))
	dst = append(dst, l.Data...)
	dst = binary.AppendUvarint(dst, uint64(len(l.Extensions)))
	return append(dst, l.Extensions...)
}

// decode reads an entry's body; the entry's slices are copies.
func decode(b []byte, l *raft.Log) error {
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrCorrupt, what) }
	u := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	var ok bool
	if l.Index, ok = u(); !ok {
		return bad("index")
	}
	if l.Term, ok = u(); !ok {
		return bad("term")
	}
	if len(b) < 1 {
		return bad("type")
	}
	l.Type, b = raft.LogType(b[0]), b[1:]
	at, n := binary.Varint(b)
	if n <= 0 {
		return bad("appended-at")
	}
	b = b[n:]
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	field := func(what string) ([]byte, error) {
		n, ok := u()
		if !ok || n > MaxEntryBytes || n > uint64(len(b)) {
			return nil, bad(what)
		}
		v := slices.Clone(b[:n])
		b = b[n:]
		return v, nil
	}
	var err error
	if l.Data, err = field("data"); err != nil {
		return err
	}
	if l.Extensions, err = field("extensions"); err != nil {
		return err
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return nil
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, crcTable) }
