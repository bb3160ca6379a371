package raftwal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func entry(i uint64, size int) *raft.Log {
	return &raft.Log{Index: i, Term: 1 + i/10, Type: raft.LogCommand,
		Data: bytes.Repeat([]byte{byte(i)}, size), Extensions: []byte(fmt.Sprint("ext", i)),
		AppendedAt: time.Unix(0, int64(i)*1000)}
}

func store(t testing.TB, w *WAL, from, to uint64, size int) {
	t.Helper()
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, entry(i, size))
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}

func open(t testing.TB, dir string, opts Options) *WAL {
	t.Helper()
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// check says whether w holds exactly the entries first to last as entry
// makes them.
func check(t testing.TB, w *WAL, first, last uint64, size int) {
	t.Helper()
	f, _ := w.FirstIndex()
	l, _ := w.LastIndex()
	if f != first || l != last {
		t.Fatalf("log [%d, %d], want [%d, %d]", f, l, first, last)
	}
	if first == 0 {
		return
	}
	for i := first; i <= last; i++ {
		var got raft.Log
		if err := w.GetLog(i, &got); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		want := entry(i, size)
		if got.Index != i || got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) ||
			!bytes.Equal(got.Extensions, want.Extensions) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("entry %d reads back as %+v", i, got)
		}
	}
	var l0 raft.Log
	if err := w.GetLog(first-1, &l0); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("entry before the first: %v", err)
	}
	if err := w.GetLog(last+1, &l0); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("entry after the last: %v", err)
	}
}

func TestStoreReopenAndSegments(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentBytes: 4096})
	check(t, w, 0, 0, 0)
	for i := uint64(1); i <= 200; i += 10 {
		store(t, w, i, i+9, 100)
	}
	check(t, w, 1, 200, 100)
	if err := w.StoreLogs([]*raft.Log{entry(202, 1)}); err == nil {
		t.Fatal("a gap in the log was stored")
	}
	if err := w.StoreLogs([]*raft.Log{entry(150, 1)}); err == nil {
		t.Fatal("an entry over an existing one was stored without DeleteRange")
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) < 3 {
		t.Fatalf("%d segments for 200 entries of 100 bytes in 4 KiB segments", len(segs))
	}
	_ = w.Close()
	w = open(t, dir, Options{SegmentBytes: 4096})
	check(t, w, 1, 200, 100)
	store(t, w, 201, 210, 100)
	check(t, w, 1, 210, 100)
}

func TestDeletePrefixAndSuffix(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentBytes: 2048})
	store(t, w, 5, 300, 50)
	// Compaction: a prefix, partly inside a segment.
	if err := w.DeleteRange(5, 123); err != nil {
		t.Fatal(err)
	}
	check(t, w, 124, 300, 50)
	// A deposed leader's tail, partly inside a segment.
	if err := w.DeleteRange(251, 300); err != nil {
		t.Fatal(err)
	}
	check(t, w, 124, 250, 50)
	if err := w.DeleteRange(130, 140); err == nil {
		t.Fatal("a range inside the log was deleted")
	}
	store(t, w, 251, 260, 50)
	_ = w.Close()
	w = open(t, dir, Options{SegmentBytes: 2048})
	check(t, w, 124, 260, 50)
	// Everything (a snapshot installed past the log), then a fresh start
	// higher up.
	if err := w.DeleteRange(0, 1000); err != nil {
		t.Fatal(err)
	}
	check(t, w, 0, 0, 0)
	store(t, w, 1001, 1010, 50)
	_ = w.Close()
	w = open(t, dir, Options{SegmentBytes: 2048})
	check(t, w, 1001, 1010, 50)
}

// lastSegment is the path of the directory's newest segment.
func lastSegment(t *testing.T, dir string) string {
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) == 0 {
		t.Fatal("no segment")
	}
	return segs[len(segs)-1]
}

// A crash in the middle of a write leaves part of a record at the end
// of the last segment: Open cuts it, and the log goes on from the last
// whole entry.
func TestTornTailIsCut(t *testing.T) {
	for _, cut := range []int{1, 4, 8, 20, 60} {
		t.Run(fmt.Sprint("cut=", cut), func(t *testing.T) {
			dir := t.TempDir()
			w := open(t, dir, Options{})
			store(t, w, 1, 10, 100)
			_ = w.Close()
			seg := lastSegment(t, dir)
			fi, _ := os.Stat(seg)
			// The last record loses its last cut bytes.
			if err := os.Truncate(seg, fi.Size()-int64(cut)); err != nil {
				t.Fatal(err)
			}
			w = open(t, dir, Options{})
			check(t, w, 1, 9, 100)
			store(t, w, 10, 12, 100)
			w = reopen(t, w, dir)
			check(t, w, 1, 12, 100)
		})
	}
	// Garbage after the last record, and a flipped bit in it.
	dir := t.TempDir()
	w := open(t, dir, Options{})
	store(t, w, 1, 10, 100)
	_ = w.Close()
	seg := lastSegment(t, dir)
	b, _ := os.ReadFile(seg)
	b[len(b)-3] ^= 0x10
	b = append(b, 0, 0, 0, 9, 1, 2, 3)
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	w = open(t, dir, Options{})
	check(t, w, 1, 9, 100)
}

// Damage in a segment before the last is not a torn write: Open refuses.
func TestDamageBeforeTheTailIsAnError(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentBytes: 1024})
	store(t, w, 1, 10, 100)
	store(t, w, 11, 20, 100)
	_ = w.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) < 2 {
		t.Fatalf("%d segments", len(segs))
	}
	b, _ := os.ReadFile(segs[0])
	b[20] ^= 1
	if err := os.WriteFile(segs[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{SegmentBytes: 1024}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open over a damaged earlier segment: %v", err)
	}
	// A stray file among the segments is reported, not guessed at.
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "12.wal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open with a stray segment name: %v", err)
	}
}

// FuzzOpen feeds arbitrary bytes as a log's last segment (after a whole
// first one): Open never panics or hangs, and a log it accepts reads back
// every entry it says it holds.
func FuzzOpen(f *testing.F) {
	var good []byte
	for i := uint64(11); i <= 13; i++ {
		body := encode(nil, entry(i, 10))
		good = append(good, 0, 0, 0, byte(len(body)))
		good = append(good, make([]byte, 4)...)
		copy(good[len(good)-4:], crcBytes(body))
		good = append(good, body...)
	}
	f.Add(good)
	f.Add(good[:len(good)-5])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		w, err := Open(dir, Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		store(t, w, 1, 10, 10)
		_ = w.Close()
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%020d.wal", 11)), data, 0o600); err != nil {
			t.Fatal(err)
		}
		w, err = Open(dir, Options{NoSync: true})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v", err)
			}
			return
		}
		defer func() { _ = w.Close() }()
		first, _ := w.FirstIndex()
		last, _ := w.LastIndex()
		if first != 1 || last < 10 {
			t.Fatalf("log [%d, %d] after the fuzzed segment", first, last)
		}
		for i := first; i <= last; i++ {
			var l raft.Log
			if err := w.GetLog(i, &l); err != nil {
				t.Fatalf("entry %d of [%d, %d]: %v", i, first, last, err)
			}
		}
		// The log takes the next entry after whatever it kept.
		if err := w.StoreLogs([]*raft.Log{entry(last+1, 5)}); err != nil {
			t.Fatal(err)
		}
	})
}

func crcBytes(body []byte) []byte {
	var b [4]byte
	c := crcOf(body)
	b[0], b[1], b[2], b[3] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
	return b[:]
}

// An empty log whose segment holds nothing whole (its first write was
// torn) takes a log starting at any index, and keeps it across Open.
func TestEmptyLogWithFilesStartsAnywhere(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{})
	store(t, w, 1, 3, 50)
	_ = w.Close()
	seg := lastSegment(t, dir)
	if err := os.Truncate(seg, 10); err != nil { // the first record torn
		t.Fatal(err)
	}
	w = open(t, dir, Options{})
	check(t, w, 0, 0, 0)
	store(t, w, 500, 504, 50)
	w = reopen(t, w, dir)
	check(t, w, 500, 504, 50)

	// The same with every entry below "first" after a torn tail.
	dir = t.TempDir()
	w = open(t, dir, Options{})
	store(t, w, 1, 3, 50)
	if err := w.writeFirst(9); err != nil {
		t.Fatal(err)
	}
	w = reopen(t, w, dir)
	check(t, w, 0, 0, 0)
	store(t, w, 700, 701, 50)
	w = reopen(t, w, dir)
	check(t, w, 700, 701, 50)
}

func TestImport(t *testing.T) {
	src := open(t, t.TempDir(), Options{SegmentBytes: 2048})
	store(t, src, 7, 5000, 20)
	dir := filepath.Join(t.TempDir(), "log")
	// A crash of an earlier import left half a copy beside the log.
	if err := os.MkdirAll(dir+".import", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir+".import", fmt.Sprintf("%020d.wal", 7)), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	did, err := Import(dir, src, Options{})
	if err != nil || !did {
		t.Fatalf("Import: %v, %v", did, err)
	}
	if _, err := os.Stat(dir + ".import"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the import's directory is left: %v", err)
	}
	w := open(t, dir, Options{})
	check(t, w, 7, 5000, 20)
	// An existing log is kept as it is.
	store(t, src, 5001, 5002, 20)
	if did, err := Import(dir, src, Options{}); err != nil || did {
		t.Fatalf("Import over a log: %v, %v", did, err)
	}
	check(t, w, 7, 5000, 20)
	// Nothing to import: no log is made.
	empty := open(t, t.TempDir(), Options{})
	dir2 := filepath.Join(t.TempDir(), "log")
	if did, err := Import(dir2, empty, Options{}); err != nil || did {
		t.Fatalf("Import of an empty log: %v, %v", did, err)
	}
	if _, err := os.Stat(dir2); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an empty import made %s: %v", dir2, err)
	}
}

// reopen closes w and opens its directory again.
func reopen(t testing.TB, w *WAL, dir string) *WAL {
	t.Helper()
	_ = w.Close()
	return open(t, dir, Options{})
}

// A suffix that begins exactly where a segment begins takes that segment
// whole; the log ends in the one before and goes on from there.
func TestDeleteSuffixAtASegmentStart(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentBytes: 1})
	for i := uint64(1); i <= 30; i += 10 {
		store(t, w, i, i+9, 20) // a segment for each StoreLogs
	}
	if err := w.DeleteRange(11, 30); err != nil {
		t.Fatal(err)
	}
	check(t, w, 1, 10, 20)
	store(t, w, 11, 15, 20)
	w = reopen(t, w, dir)
	check(t, w, 1, 15, 20)
	// And the first entry of the only segment: the whole log.
	if err := w.DeleteRange(1, 15); err != nil {
		t.Fatal(err)
	}
	check(t, w, 0, 0, 0)
}

// FuzzOperations runs a sequence of appends (synced, or synced behind),
// prefix and suffix deletes,
// whole deletes, reopens and crashes (files left as they are, extensions
// included) on a log with small segments, and checks it after each step
// against a model of what it should hold.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 9, 0, 9, 0, 9, 2, 3, 4, 0, 5, 1, 2, 4})
	f.Add([]byte{0, 200, 3, 0, 0, 7, 4, 0, 1, 2, 7, 2, 1, 4})
	f.Add([]byte{0, 7, 0, 7, 2, 8, 4, 0, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		dir := t.TempDir()
		// Half the inputs with zeroed segments (spares made in the
		// background, so the segments fall differently from run to run).
		opts := Options{SegmentBytes: 300, PreallocBytes: 100, NoSync: true, ZeroSegments: len(ops)%2 == 1}
		w, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = w.Close() }()
		var first, last uint64
		size := map[uint64]int{} // the model: each kept index's payload size
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%6, uint64(ops[i+1])
			switch {
			case op == 0: // append 1 to 8 entries
				from := last + 1
				if first == 0 {
					from = 1 + arg*3
				}
				var logs []*raft.Log
				for j := range 1 + arg%8 {
					n := int(arg+j) % 40
					logs = append(logs, entry(from+j, n))
					size[from+j] = n
				}
				store := w.StoreLogs
				if arg%2 == 1 {
					store = w.StoreLogsAsync // synced behind
				}
				if err := store(logs); err != nil {
					t.Fatal(err)
				}
				if first == 0 {
					first = from
				}
				last = logs[len(logs)-1].Index
			case op == 1 && first != 0 && last > first: // a prefix, compaction
				upTo := first + arg%(last-first)
				if err := w.DeleteRange(first, upTo); err != nil {
					t.Fatal(err)
				}
				first = upTo + 1
			case op == 2 && first != 0 && last > first: // a suffix, a deposed leader's
				from := first + 1 + arg%(last-first)
				if err := w.DeleteRange(from, last); err != nil {
					t.Fatal(err)
				}
				last = from - 1
			case op == 3: // everything
				if err := w.DeleteRange(0, last+10); err != nil {
					t.Fatal(err)
				}
				first, last = 0, 0
			case op == 4:
				_ = w.Close()
				if w, err = Open(dir, opts); err != nil {
					t.Fatal(err)
				}
			case op == 5:
				crash(w)
				if w, err = Open(dir, opts); err != nil {
					t.Fatal(err)
				}
			}
			f, _ := w.FirstIndex()
			l, _ := w.LastIndex()
			if f != first || l != last {
				t.Fatalf("step %d (op %d): log [%d, %d], want [%d, %d]", i/2, op, f, l, first, last)
			}
			// Whatever was stored reaches the disk without another store
			// (checked after some steps only, so that others still find
			// a sync under way).
			if arg%3 == 0 {
				wait, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := w.WaitDurable(wait, last)
				cancel()
				if err != nil {
					t.Fatalf("step %d (op %d): %v", i/2, op, err)
				}
			}
			for idx := first; idx != 0 && idx <= last; idx++ {
				var got raft.Log
				if err := w.GetLog(idx, &got); err != nil {
					t.Fatalf("step %d: entry %d: %v", i/2, idx, err)
				}
				if want := entry(idx, size[idx]); !bytes.Equal(got.Data, want.Data) || got.Term != want.Term {
					t.Fatalf("step %d: entry %d reads back wrong", i/2, idx)
				}
			}
		}
	})
}

// crash closes w's files as a process that stopped would leave them:
// not cut to their records.
func crash(w *WAL) {
	if w.preparer != nil {
		w.preparer.halt()
		w.preparer = nil
	}
	if w.spare != nil {
		_ = w.spare.f.Close() // left on the disk, as a crash leaves it
		w.spare = nil
	}
	for _, s := range w.segs {
		_ = s.f.Close()
	}
	w.segs = nil
}

// TestExtensionAheadOfRecords checks that the segment being written is
// extended ahead of its records, that a crash leaves a log that opens
// with every entry (the extension cut), that a full segment is cut to
// its records before the next begins, and that Close cuts the last.
func TestExtensionAheadOfRecords(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 4 << 10, PreallocBytes: 16 << 10}
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 40; i++ {
		store(t, w, i, i, 200)
	}
	names, _ := w.segmentNames()
	if len(names) < 2 {
		t.Fatalf("%d segments, want several", len(names))
	}
	for i, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		seg := w.segs[i]
		switch {
		case i < len(names)-1 && fi.Size() != seg.size:
			t.Errorf("full segment %s: %d bytes on disk, %d of records", n, fi.Size(), seg.size)
		case i == len(names)-1 && fi.Size() < seg.size+opts.PreallocBytes/2:
			t.Errorf("last segment %s: %d bytes on disk, %d of records: not extended ahead", n, fi.Size(), seg.size)
		}
	}
	crash(w)
	w = open(t, dir, opts)
	check(t, w, 1, 40, 200)
	store(t, w, 41, 45, 200)
	crash(w)
	w = open(t, dir, opts)
	check(t, w, 1, 45, 200)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ = w.segmentNames()
	last := filepath.Join(dir, names[len(names)-1])
	fi, _ := os.Stat(last)
	w = open(t, dir, opts)
	if got := w.segs[len(w.segs)-1].size; fi.Size() != got {
		t.Fatalf("closed log's last segment: %d bytes on disk, %d of records", fi.Size(), got)
	}
	check(t, w, 1, 45, 200)
}

// TestSyncBehind checks StoreLogsAsync: entries readable at once, made
// durable behind the writer, a suffix delete taking back what it covered,
// and the log reopening with the entries written last.
func TestSyncBehind(t *testing.T) {
	dir := t.TempDir()
	w := open(t, dir, Options{SegmentBytes: 2 << 10})
	ctx := context.Background()
	for i := uint64(1); i <= 30; i++ {
		if err := w.StoreLogsAsync([]*raft.Log{entry(i, 100)}); err != nil {
			t.Fatal(err)
		}
		var got raft.Log
		if err := w.GetLog(i, &got); err != nil {
			t.Fatalf("entry %d just stored: %v", i, err)
		}
	}
	if err := w.WaitDurable(ctx, 30); err != nil {
		t.Fatal(err)
	}
	if d := w.DurableIndex(); d != 30 {
		t.Fatalf("durable %d, want 30", d)
	}
	if err := w.DeleteRange(21, 30); err != nil {
		t.Fatal(err)
	}
	if d := w.DurableIndex(); d != 20 {
		t.Fatalf("durable %d after deleting from 21, want 20", d)
	}
	store(t, w, 21, 25, 100) // synced
	if d := w.DurableIndex(); d != 25 {
		t.Fatalf("durable %d after a synced store, want 25", d)
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := w.WaitDurable(short, 26); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for an entry never stored: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = open(t, dir, Options{})
	check(t, w, 1, 25, 100)
	if d := w.DurableIndex(); d != 25 {
		t.Fatalf("durable %d after reopening, want 25", d)
	}
}

// TestDeleteSuffixLeavesTheRestDurable deletes from the end while the
// syncer may be mid-sync (which then vouches for nothing) and no store
// follows: what is left must be durable at once, or a waiter would wait
// for a wake-up that never comes (a CI run once hung here).
func TestDeleteSuffixLeavesTheRestDurable(t *testing.T) {
	w := open(t, t.TempDir(), Options{SegmentBytes: 4 << 10, PreallocBytes: 1 << 10})
	var last uint64
	for round := range 100 {
		if err := w.StoreLogsAsync(logsFrom(last+1, 5)); err != nil {
			t.Fatal(err)
		}
		last += 5
		if err := w.DeleteRange(last-1, last); err != nil {
			t.Fatal(err)
		}
		last -= 2
		if d := w.DurableIndex(); d != last {
			t.Fatalf("round %d: durable %d right after deleting back to %d", round, d, last)
		}
	}
	check(t, w, 1, last, 30)
}

// TestSyncBehindConcurrent runs async stores across many segments while
// readers read and wait for durability, and suffix deletes take entries
// back (run it with -race).
func TestSyncBehindConcurrent(t *testing.T) {
	w := open(t, t.TempDir(), Options{SegmentBytes: 4 << 10, PreallocBytes: 1 << 10})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // a reader of whatever is there
		defer wg.Done()
		for ctx.Err() == nil {
			last, _ := w.LastIndex()
			var l raft.Log
			_ = w.GetLog(last, &l)
			_ = w.DurableIndex()
		}
	}()
	var last uint64
	for round := range 200 {
		n := uint64(1 + round%7)
		if err := w.StoreLogsAsync(logsFrom(last+1, n)); err != nil {
			t.Fatal(err)
		}
		last += n
		if round%10 == 9 {
			if err := w.DeleteRange(last-2, last); err != nil {
				t.Fatal(err)
			}
			last -= 3
		}
		if round%5 == 4 {
			if err := w.WaitDurable(ctx, last); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.WaitDurable(ctx, last); err != nil {
		t.Fatal(err)
	}
	cancel()
	wg.Wait()
	check(t, w, 1, last, 30)
}

func logsFrom(from, n uint64) []*raft.Log {
	var logs []*raft.Log
	for i := range n {
		logs = append(logs, entry(from+i, 30))
	}
	return logs
}

// waitSpare waits until w has a spare ready.
func waitSpare(t *testing.T, w *WAL) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.RLock()
		ready := w.spare != nil
		w.mu.RUnlock()
		if ready {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare after 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// With ZeroSegments the log moves to a zeroed spare as soon as one is
// ready (even out of a segment that is not full), appends within its
// zeros, moves to the next spare when it is full, and reads back whole
// after Close and after a crash; a spare left by a crash is removed at
// Open.
func TestZeroSegments(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentBytes: 8 << 10, ZeroSegments: true}
	w, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	store(t, w, 1, 1, 100) // before a spare, or into one: either way
	waitSpare(t, w)
	store(t, w, 2, 2, 100)
	seg := w.segs[len(w.segs)-1]
	if seg.zeroed != opts.SegmentBytes {
		t.Fatalf("the segment written after a spare was ready has %d zeroed bytes, want %d", seg.zeroed, opts.SegmentBytes)
	}
	fi, err := seg.f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != opts.SegmentBytes {
		t.Fatalf("the zeroed segment's file is %d bytes, want %d", fi.Size(), opts.SegmentBytes)
	}
	// Fill past a few segments, a spare ready before each new one.
	for i := uint64(3); i <= 300; i++ {
		if w.segs[len(w.segs)-1].size+200 > opts.SegmentBytes {
			waitSpare(t, w)
		}
		store(t, w, i, i, 100)
	}
	zeroed := 0
	for _, s := range w.segs {
		if s.zeroed > 0 {
			zeroed++
		}
	}
	if zeroed < 3 {
		t.Fatalf("%d zeroed segments of %d", zeroed, len(w.segs))
	}
	check(t, w, 1, 300, 100)

	// A crash: the last segment keeps its zeros, the spare stays.
	waitSpare(t, w)
	crash(w)
	if _, err := os.Stat(filepath.Join(dir, spareName)); err != nil {
		t.Fatalf("the crash left no spare to clean up: %v", err)
	}
	w, err = Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	check(t, w, 1, 300, 100)
	store(t, w, 301, 310, 100)
	check(t, w, 1, 310, 100)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, spareName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close left the spare: %v", err)
	}
	w = open(t, dir, Options{SegmentBytes: 8 << 10})
	check(t, w, 1, 310, 100)
}
