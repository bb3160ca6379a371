package redolog

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func dbBytes(gen uint64, n int) []byte {
	var b bytes.Buffer
	for b.Len() < n {
		fmt.Fprintf(&b, "<database generation=%d row=%d/>\n", gen, b.Len())
	}
	return b.Bytes()[:n]
}

func TestDeviceLayoutAndRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	const half = 64 << 10
	d, err := OpenDevice(path, DeviceOptions{HalfSize: half})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if string(raw) != Magic+"\x000" {
		t.Fatalf("fresh header = %q", raw)
	}
	if _, err := ReadState(d); !errors.Is(err, ErrEmpty) {
		t.Fatalf("ReadState on a fresh log: %v", err)
	}
	m := newMarker()
	db := dbBytes(10, 1000)
	mustWriteDB(t, d, 10, m, db)
	deltas := []string{"CreateRow...", "second delta", strings.Repeat("x", 3000)}
	for i, s := range deltas {
		mustWriteDelta(t, d, uint64(11+i), m, []byte(s))
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// The bytes on disk, exactly.
	var want bytes.Buffer
	want.WriteString(Magic + "\x001")
	fmt.Fprintf(&want, "%s%016d%s%016d%s", m, len(db), db, 10, m)
	for i, s := range deltas {
		fmt.Fprintf(&want, "%016d%s%016d%s", len(s), s, 11+i, m)
	}
	want.Write(make([]byte, TerminatorSize))
	raw, _ = os.ReadFile(path)
	if !bytes.Equal(raw, want.Bytes()) {
		t.Fatalf("on-disk bytes differ:\n got %q\nwant %q", raw[:200], want.Bytes()[:200])
	}

	// Read back through a read-only open and Recover.
	ro, err := OpenDevice(path, DeviceOptions{HalfSize: half, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, ro)
	ro.Close()
	if len(recs) != 4 || recs[0].Kind != RecordDB || recs[0].Gen != 10 || recs[0].Half != 1 || recs[0].Marker != m || !bytes.Equal(recs[0].Data, db) {
		t.Fatalf("records: %+v", recs)
	}
	for i, s := range deltas {
		r := recs[i+1]
		if r.Kind != RecordDelta || r.Gen != uint64(11+i) || string(r.Data) != s || r.Marker != m {
			t.Fatalf("delta %d: %+v", i, r)
		}
	}

	// Reopen for writing: deltas continue after the last one.
	d, err = OpenDevice(path, DeviceOptions{HalfSize: half})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteDelta(13, m, []byte("old gen")); !errors.Is(err, ErrGeneration) {
		t.Fatalf("WriteDelta with a stale generation: %v", err)
	}
	if err := d.WriteDelta(14, newMarker(), []byte("other marker")); !errors.Is(err, ErrMarkerMismatch) {
		t.Fatalf("WriteDelta with another marker: %v", err)
	}
	mustWriteDelta(t, d, 20, m, []byte("after reopen"))
	s := readState(t, d)
	if len(s.Deltas) != 4 || s.Deltas[3] != "20:after reopen" {
		t.Fatalf("after reopen: %v", s)
	}
	d.Close()
}

// TestWriteDBSwitchesHalves checks the double buffering on a real file:
// each WriteDB goes to the other half, never writes the valid half, and
// flips the validity byte with its very last write.
func TestWriteDBSwitchesHalves(t *testing.T) {
	for _, chunk := range []int{0, 100} { // 0: one write; 100: streamed
		t.Run(fmt.Sprintf("chunk%d", chunk), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "redo")
			const half = 8 << 10
			fs, err := openFileStorage(path, half, false)
			if err != nil {
				t.Fatal(err)
			}
			h := &hookStorage{storage: fs}
			d, err := newDevice(h, half, false)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if chunk > 0 {
				d.chunk = chunk
			}
			var gen uint64
			wantHalf := 1
			for round := 0; round < 5; round++ {
				gen++
				m := newMarker()
				oldHalf := 3 - wantHalf
				before, _ := os.ReadFile(path)
				oldStart := int64(HeaderSize + (oldHalf-1)*half)
				oldEnd := oldStart + half
				var oldBytes []byte
				if int64(len(before)) > oldStart {
					oldBytes = before[oldStart:min(oldEnd, int64(len(before)))]
				}
				h.take()
				h.onWrite = func(w write) {
					if w.off == ValidityOffset-1 {
						return
					}
					if w.off < oldEnd && w.off+int64(len(w.data)) > oldStart {
						t.Errorf("round %d: write at %d+%d touches the valid half %d", round, w.off, len(w.data), oldHalf)
					}
					now, _ := os.ReadFile(path)
					if round > 0 && now[ValidityOffset] != byte('0'+oldHalf) {
						t.Errorf("round %d: validity byte flipped early", round)
					}
					if int64(len(now)) > oldStart {
						cur := now[oldStart:min(oldEnd, int64(len(now)))]
						if !bytes.Equal(cur[:len(oldBytes)], oldBytes) || bytes.ContainsFunc(cur[len(oldBytes):], func(r rune) bool { return r != 0 }) {
							t.Errorf("round %d: the valid half changed before the flip", round)
						}
					}
				}
				db := dbBytes(gen, 700+round*300)
				mustWriteDB(t, d, gen, m, db)
				h.onWrite = nil
				ws := h.take()
				last := ws[len(ws)-1]
				if last.off != ValidityOffset-1 || string(last.data) != "\x00"+string(rune('0'+wantHalf)) {
					t.Fatalf("round %d: last write %d %q, want the validity byte", round, last.off, last.data)
				}
				if chunk > 0 && len(ws) < 5 {
					t.Fatalf("round %d: %d writes: not streamed", round, len(ws))
				}
				raw, _ := os.ReadFile(path)
				if raw[ValidityOffset] != byte('0'+wantHalf) {
					t.Fatalf("round %d: validity %q", round, raw[ValidityOffset])
				}
				// The other half still holds the previous state.
				if round > 0 && !bytes.Equal(raw[oldStart:oldStart+int64(len(oldBytes))], oldBytes) {
					t.Fatalf("round %d: old half changed", round)
				}
				gen++
				mustWriteDelta(t, d, gen, m, []byte(fmt.Sprint("delta ", gen)))
				s := readState(t, d)
				if s.Half != wantHalf || s.DB != string(db) || len(s.Deltas) != 1 {
					t.Fatalf("round %d: state %v", round, s)
				}
				wantHalf = 3 - wantHalf
			}
		})
	}
}

// op is one device operation in a torn-write scenario.
type op struct {
	name string
	run  func(d *FileDevice) error
}

// TestTornWrites simulates a crash at every write of every operation and
// at many byte offsets inside it: the image holds all earlier writes and a
// prefix of the torn one (the rest is the old content, or garbage). Read
// must then give exactly the state before the operation, or the state
// after it once its last write is complete; and a writer must be able to
// carry on from the torn image.
func TestTornWrites(t *testing.T) {
	const half = 2048
	d, mem := newMemDevice(t, half)
	d.chunk = 100
	h := &hookStorage{storage: mem}
	d.st = h
	var m string
	gen := uint64(0)
	dbOp := func(size int) op {
		return op{fmt.Sprintf("writedb(%d)", size), func(d *FileDevice) error {
			gen++
			m = newMarker()
			return d.WriteDB(gen, m, bytes.NewReader(dbBytes(gen, size)))
		}}
	}
	deltaOp := func(size int) op {
		return op{fmt.Sprintf("delta(%d)", size), func(d *FileDevice) error {
			gen++
			return d.WriteDelta(gen, m, bytes.Repeat([]byte{byte('a' + gen%26)}, size))
		}}
	}
	ops := []op{
		dbOp(350), deltaOp(10), deltaOp(200), deltaOp(1),
		dbOp(90), deltaOp(300), deltaOp(20),
		dbOp(500), deltaOp(5), deltaOp(400), // back in half 1, over stale records
		dbOp(120), deltaOp(700), deltaOp(700), deltaOp(200),
		dbOp(60), // half 1 again, much shorter than before
		deltaOp(30), deltaOp(30),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	checked := 0
	for _, o := range ops {
		base := mem.bytes()
		beforeState := stateFromImage(t, base, half)
		h.take()
		if err := o.run(d); err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		ws := h.take()
		afterState := readState(t, d)
		for k, w := range ws {
			for _, p := range tearPoints(len(w.data)) {
				for _, garbage := range []bool{false, true} {
					// Header writes are a couple of bytes in one sector:
					// they land whole or not at all.
					if garbage && (p == len(w.data) || w.off < HeaderSize) {
						continue
					}
					img := bytes.Clone(base)
					for _, pw := range ws[:k] {
						img = overlay(img, pw.off, pw.data)
					}
					torn := bytes.Clone(w.data[:p])
					if garbage {
						junk := make([]byte, len(w.data)-p)
						for i := range junk {
							junk[i] = byte(rng.UintN(256))
						}
						torn = append(torn, junk...)
					}
					img = overlay(img, w.off, torn)
					// The operation is complete once the bytes of its last
					// write, but for a delta's trailing NUL terminator, are
					// on disk (the old content may already hold the last
					// few).
					want := beforeState
					if n := len(w.data) - trailingNULs(w.data); k == len(ws)-1 && int64(len(img)) >= w.off+int64(n) && bytes.Equal(img[w.off:w.off+int64(n)], w.data[:n]) {
						want = afterState
					}
					got := stateFromImage(t, img, half)
					checked++
					if !equalState(got, want) {
						t.Fatalf("%s: crash in write %d/%d at byte %d/%d (garbage %v):\n got %v\nwant %v",
							o.name, k+1, len(ws), p, len(w.data), garbage, got, want)
					}
					// A writer carries on from the torn image.
					if got.DB != "" {
						wd, err := openMemImage(t, img, half, false)
						if err != nil {
							t.Fatal(err)
						}
						last := got.DBGen
						if n := len(got.Deltas); n > 0 {
							fmt.Sscanf(got.Deltas[n-1], "%d:", &last)
						}
						recs := readAll(t, wd)
						err = wd.WriteDelta(last+1, recs[0].Marker, []byte("carry on"))
						if errors.Is(err, ErrNoSpace) {
							continue
						}
						if err != nil {
							t.Fatalf("%s: writing after a torn write: %v", o.name, err)
						}
						next := readState(t, wd)
						exp := got
						exp.Deltas = append(append([]string(nil), got.Deltas...), fmt.Sprintf("%d:carry on", last+1))
						if !equalState(next, exp) {
							t.Fatalf("%s: after carrying on:\n got %v\nwant %v", o.name, next, exp)
						}
					}
				}
			}
		}
	}
	t.Logf("%d torn images checked", checked)
}

func trailingNULs(b []byte) int {
	n := 0
	for n < len(b) && n < TerminatorSize && b[len(b)-1-n] == 0 {
		n++
	}
	return n
}

func tearPoints(n int) []int {
	var ps []int
	for p := 0; p <= n; p++ {
		if p < 80 || n-p < 80 || p%37 == 0 {
			ps = append(ps, p)
		}
	}
	return ps
}

func overlay(img []byte, off int64, data []byte) []byte {
	if end := off + int64(len(data)); end > int64(len(img)) {
		img = append(img, make([]byte, end-int64(len(img)))...)
	}
	copy(img[off:], data)
	return img
}

func stateFromImage(t testing.TB, img []byte, half int64) state {
	t.Helper()
	d, err := openMemImage(t, img, half, true)
	if err != nil {
		t.Fatalf("opening image: %v", err)
	}
	return readState(t, d)
}

// TestTruncateAndCorruptFile cuts or overwrites a real log file at every
// offset inside its last delta record and inside its last database record.
func TestTruncateAndCorruptFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "redo")
	const half = 4096
	d, err := OpenDevice(path, DeviceOptions{HalfSize: half})
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := newMarker(), newMarker()
	mustWriteDB(t, d, 1, m1, dbBytes(1, 300))
	for g := uint64(2); g <= 4; g++ {
		mustWriteDelta(t, d, g, m1, []byte(fmt.Sprint("delta-", g)))
	}
	prevDB := readState(t, d)
	mustWriteDB(t, d, 5, m2, dbBytes(5, 300))
	mustWriteDelta(t, d, 6, m2, []byte("delta-6"))
	prevDelta := readState(t, d)
	mustWriteDelta(t, d, 7, m2, []byte(strings.Repeat("delta-7 ", 20)))
	full := readState(t, d)
	d.Close()
	img, _ := os.ReadFile(path)

	h2 := int64(HeaderSize + half)
	dbEnd := h2 + dbOverhead + 300
	d6End := dbEnd + deltaOverhead + 7
	d7End := d6End + deltaOverhead + 160
	if int64(len(img)) != d7End+TerminatorSize {
		t.Fatalf("file is %d bytes, want %d", len(img), d7End+TerminatorSize)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	try := func(name string, data []byte, want state) {
		t.Helper()
		p := filepath.Join(dir, "cut")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Recover(p, RecoverOptions{HalfSize: half})
		if err != nil {
			t.Fatalf("%s: Recover: %v", name, err)
		}
		if r.Half != want.Half || r.Gen != want.DBGen || string(r.DB) != want.DB {
			t.Fatalf("%s: Recover gave half %d gen %d", name, r.Half, r.Gen)
		}
		ro, err := OpenDevice(p, DeviceOptions{HalfSize: half, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		got := readState(t, ro)
		ro.Close()
		if !equalState(got, want) {
			t.Fatalf("%s:\n got %v\nwant %v", name, got, want)
		}
	}
	try("intact", img, full)
	corruptions := func(x, end int64) map[string][]byte {
		out := map[string][]byte{"truncate": bytes.Clone(img[:x])}
		for _, fill := range []string{"zero", "ff", "random"} {
			c := bytes.Clone(img)
			for i := x; i < end; i++ {
				switch fill {
				case "ff":
					c[i] = 0xff
				case "random":
					c[i] = byte(rng.UintN(256))
				default:
					c[i] = 0
				}
			}
			out[fill] = c
		}
		return out
	}
	for x := d6End; x < d7End; x++ {
		for name, c := range corruptions(x, d7End) {
			try(fmt.Sprintf("last delta, %s at %d", name, x), c, prevDelta)
		}
	}
	for x := h2; x < dbEnd; x++ {
		for name, c := range corruptions(x, dbEnd) {
			try(fmt.Sprintf("last db, %s at %d", name, x), c, prevDB)
		}
	}

	// A writer on a log whose valid half is broken keeps the readable
	// half and writes the new database over the broken one.
	cut := filepath.Join(dir, "cut")
	os.WriteFile(cut, img[:h2+200], 0o600)
	w, err := OpenDevice(cut, DeviceOptions{HalfSize: half})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteDelta(8, m2, []byte("x")); !errors.Is(err, ErrNoDatabase) {
		t.Fatalf("delta onto a fallen-back log: %v", err)
	}
	m3 := newMarker()
	mustWriteDB(t, w, 8, m3, dbBytes(8, 100))
	w.Close()
	after, _ := os.ReadFile(cut)
	if !bytes.Equal(after[HeaderSize:HeaderSize+half], img[HeaderSize:HeaderSize+half]) {
		t.Fatal("half 1 (the readable one) was overwritten")
	}
	if after[ValidityOffset] != '2' {
		t.Fatalf("validity %q", after[ValidityOffset])
	}
}

func TestDeviceNoSpace(t *testing.T) {
	for _, chunk := range []int{0, 64} {
		t.Run(fmt.Sprintf("chunk%d", chunk), func(t *testing.T) {
			const half = 1024
			path := filepath.Join(t.TempDir(), "redo")
			d, err := OpenDevice(path, DeviceOptions{HalfSize: half})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if chunk > 0 {
				d.chunk = chunk
			}
			m := newMarker()
			mustWriteDB(t, d, 1, m, dbBytes(1, 200))
			gen := uint64(1)
			delta := bytes.Repeat([]byte("d"), 120)
			n := 0
			for {
				gen++
				err := d.WriteDelta(gen, m, delta)
				if errors.Is(err, ErrNoSpace) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				n++
			}
			if want := (half - dbOverhead - 200) / (deltaOverhead + 120); n != want {
				t.Fatalf("%d deltas fit, want %d", n, want)
			}
			// A smaller delta may still fit: NoSpace changed nothing.
			if err := d.WriteDelta(gen, m, []byte("s")); err != nil {
				t.Fatalf("small delta after NoSpace: %v", err)
			}
			before := readState(t, d)
			// A database bigger than a half does not fit either; the old
			// state stays.
			gen++
			if err := d.WriteDB(gen, newMarker(), bytes.NewReader(dbBytes(gen, half))); !errors.Is(err, ErrNoSpace) {
				t.Fatalf("oversized WriteDB: %v", err)
			}
			if err := d.WriteDB(gen, newMarker(), bytes.NewReader(dbBytes(gen, half-dbOverhead+1))); !errors.Is(err, ErrNoSpace) {
				t.Fatalf("WriteDB one byte too big: %v", err)
			}
			if s := readState(t, d); !equalState(s, before) {
				t.Fatalf("state changed by a failed WriteDB: %v", s)
			}
			if err := d.WriteDelta(gen+1, m, []byte("x")); !errors.Is(err, ErrNoDatabase) {
				t.Fatalf("delta after a failed WriteDB: %v", err)
			}
			// Exactly a half's worth fits (no room for the terminator).
			m2 := newMarker()
			mustWriteDB(t, d, gen, m2, dbBytes(gen, half-dbOverhead))
			if s := readState(t, d); s.DBGen != gen || len(s.DB) != half-dbOverhead || len(s.Deltas) != 0 {
				t.Fatalf("full-half database: %v", s)
			}
			if err := d.WriteDelta(gen+1, m2, []byte("x")); !errors.Is(err, ErrNoSpace) {
				t.Fatalf("delta into a full half: %v", err)
			}
		})
	}
}

func TestDeviceArgumentsAndEmpty(t *testing.T) {
	d, _ := newMemDevice(t, 4096)
	m := newMarker()
	for _, c := range []struct {
		name string
		err  error
	}{
		{"short marker", d.WriteDB(1, m[:35], bytes.NewReader([]byte("x")))},
		{"marker with space", d.WriteDB(1, " "+m[1:], bytes.NewReader([]byte("x")))},
		{"huge gen", d.WriteDB(MaxGeneration+1, m, bytes.NewReader([]byte("x")))},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if err := d.WriteDB(1, m, bytes.NewReader(nil)); !errors.Is(err, ErrEmptyDB) {
		t.Errorf("empty database: %v", err)
	}
	if err := d.WriteDelta(2, m, []byte("x")); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("delta with no database: %v", err)
	}
	mustWriteDB(t, d, MaxGeneration-1, m, []byte("db"))
	mustWriteDelta(t, d, MaxGeneration, m, []byte("last"))
	if err := d.WriteDelta(2, m, nil); err == nil {
		t.Error("empty delta accepted")
	}
	if s := readState(t, d); len(s.Deltas) != 1 || s.DBGen != MaxGeneration-1 {
		t.Fatalf("state %v", s)
	}
	if err := d.Empty(); err != nil {
		t.Fatal(err)
	}
	if recs := readAll(t, d); len(recs) != 0 {
		t.Fatalf("records after Empty: %v", recs)
	}
	if _, err := ReadState(d); !errors.Is(err, ErrEmpty) {
		t.Fatalf("ReadState after Empty: %v", err)
	}
	if err := d.WriteDelta(MaxGeneration, m, []byte("x")); !errors.Is(err, ErrNoDatabase) {
		t.Errorf("delta after Empty: %v", err)
	}
	mustWriteDB(t, d, 3, m, []byte("db3"))
	if s := readState(t, d); s.Half != 1 || s.DB != "db3" {
		t.Fatalf("after Empty and WriteDB: %v", s)
	}
}

func TestOpenDevice(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk")
	os.WriteFile(junk, bytes.Repeat([]byte("not a log "), 100), 0o600)
	if _, err := OpenDevice(junk, DeviceOptions{ReadOnly: true}); !errors.Is(err, ErrNotRedoLog) {
		t.Errorf("read-only open of junk: %v", err)
	}
	if _, err := Recover(junk, RecoverOptions{}); !errors.Is(err, ErrNotRedoLog) {
		t.Errorf("Recover of junk: %v", err)
	}
	if _, err := OpenDevice(filepath.Join(dir, "missing"), DeviceOptions{ReadOnly: true}); err == nil {
		t.Error("read-only open of a missing file succeeded")
	}
	if _, err := OpenDevice(dir, DeviceOptions{}); err == nil {
		t.Error("open of a directory succeeded")
	}
	if _, err := OpenDevice(junk, DeviceOptions{HalfSize: 100}); err == nil {
		t.Error("tiny half accepted")
	}
	// A writable open initialises a file that is not a log.
	d, err := OpenDevice(junk, DeviceOptions{HalfSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := d.Validity(); v != 0 || err != nil {
		t.Fatalf("validity %d %v", v, err)
	}
	if _, err := ReadState(d); !errors.Is(err, ErrEmpty) {
		t.Fatalf("ReadState: %v", err)
	}
	d.Close()
	raw, _ := os.ReadFile(junk)
	if string(raw[:HeaderSize]) != Magic+"\x000" {
		t.Fatalf("header %q", raw[:HeaderSize])
	}
	ro, err := OpenDevice(junk, DeviceOptions{HalfSize: 1024, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.WriteDB(1, newMarker(), bytes.NewReader([]byte("x"))); !errors.Is(err, ErrReadOnly) {
		t.Errorf("write on a read-only device: %v", err)
	}
	ro.Close()
}

func TestRecoverDecodes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	d, err := OpenDevice(path, DeviceOptions{HalfSize: 8192})
	if err != nil {
		t.Fatal(err)
	}
	m := newMarker()
	mustWriteDB(t, d, 5, m, []byte("<db/>"))
	b1, _ := EncodeAll(sampleDeltas[:2])
	b2, _ := EncodeAll(sampleDeltas[2:])
	mustWriteDelta(t, d, 6, m, b1)
	mustWriteDelta(t, d, 9, m, b2)
	mustWriteDelta(t, d, 10, m, []byte("not a delta"))
	b3, _ := EncodeAll(sampleDeltas[:1])
	mustWriteDelta(t, d, 11, m, b3)
	d.Close()
	r, err := Recover(path, RecoverOptions{HalfSize: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if r.Gen != 5 || string(r.DB) != "<db/>" || r.Marker != m || r.Half != 1 {
		t.Fatalf("recovered %+v", r)
	}
	if len(r.Deltas) != 2 || r.Deltas[0].Gen != 6 || r.Deltas[1].Gen != 9 || len(r.Deltas[0].Deltas) != 2 || len(r.Deltas[1].Deltas) != len(sampleDeltas)-2 {
		t.Fatalf("deltas %+v", r.Deltas)
	}
	if r.BadDelta == nil || r.LastGen() != 9 {
		t.Fatalf("BadDelta %v, LastGen %d", r.BadDelta, r.LastGen())
	}
}
