package redolog

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
)

// memStorage is a growable in-memory file.
type memStorage struct {
	mu sync.Mutex
	b  []byte
}

func (m *memStorage) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memStorage) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if end := off + int64(len(p)); end > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, end-int64(len(m.b)))...)
	}
	return copy(m.b[off:], p), nil
}

func (m *memStorage) Size() (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.b)), nil
}

func (m *memStorage) Close() error { return nil }

func (m *memStorage) bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.b)
}

// write is one recorded WriteAt.
type write struct {
	off  int64
	data []byte
}

// hookStorage passes through to another storage, recording writes and
// calling a hook after each.
type hookStorage struct {
	storage
	mu      sync.Mutex
	writes  []write
	onWrite func(w write)
}

func (h *hookStorage) WriteAt(p []byte, off int64) (int, error) {
	n, err := h.storage.WriteAt(p, off)
	w := write{off, bytes.Clone(p)}
	h.mu.Lock()
	h.writes = append(h.writes, w)
	fn := h.onWrite
	h.mu.Unlock()
	if fn != nil {
		fn(w)
	}
	return n, err
}

func (h *hookStorage) take() []write {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.writes
	h.writes = nil
	return w
}

func newMemDevice(t testing.TB, half int64) (*FileDevice, *memStorage) {
	t.Helper()
	m := &memStorage{}
	d, err := newDevice(m, half, false)
	if err != nil {
		t.Fatal(err)
	}
	return d, m
}

func openMemImage(t testing.TB, img []byte, half int64, readOnly bool) (*FileDevice, error) {
	t.Helper()
	return newDevice(&memStorage{b: bytes.Clone(img)}, half, readOnly)
}

func newMarker() string { return uuid.NewString() }

// readAll returns every record Read yields.
func readAll(t testing.TB, d Device) []Record {
	t.Helper()
	var recs []Record
	if err := d.Read(func(r Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatalf("Read: %v", err)
	}
	return recs
}

// state is a comparable summary of a log's readable state.
type state struct {
	Half   int
	DBGen  uint64
	DB     string
	Deltas []string // "gen:data"
}

func (s state) String() string {
	return fmt.Sprintf("half %d db %d (%d bytes) deltas [%s]", s.Half, s.DBGen, len(s.DB), strings.Join(s.Deltas, " "))
}

func stateOf(recs []Record) state {
	var s state
	for _, r := range recs {
		switch r.Kind {
		case RecordDB:
			s = state{Half: r.Half, DBGen: r.Gen, DB: string(r.Data)}
		case RecordDelta:
			s.Deltas = append(s.Deltas, fmt.Sprintf("%d:%s", r.Gen, r.Data))
		}
	}
	return s
}

func readState(t testing.TB, d Device) state { t.Helper(); return stateOf(readAll(t, d)) }

func equalState(a, b state) bool { return reflect.DeepEqual(a, b) }

func mustWriteDB(t testing.TB, d Device, gen uint64, marker string, data []byte) {
	t.Helper()
	if err := d.WriteDB(gen, marker, bytes.NewReader(data)); err != nil {
		t.Fatalf("WriteDB(%d): %v", gen, err)
	}
}

func mustWriteDelta(t testing.TB, d Device, gen uint64, marker string, data []byte) {
	t.Helper()
	if err := d.WriteDelta(gen, marker, data); err != nil {
		t.Fatalf("WriteDelta(%d): %v", gen, err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
