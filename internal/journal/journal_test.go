package journal_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolstackd/internal/journal"
)

// entry is one parsed journal entry: each field's values in order.
type entry map[string][]string

func (e entry) get(t testing.TB, name string) string {
	t.Helper()
	v := e[name]
	if len(v) != 1 {
		t.Fatalf("field %s: %q, want one value; entry %v", name, v, e)
	}
	return v[0]
}

// parse reads an entry as systemd-journald does: NAME=value lines, or
// NAME, a newline, a little-endian 64-bit length, the value and a newline.
func parse(b []byte) (entry, error) {
	e := entry{}
	for len(b) > 0 {
		nl := bytes.IndexByte(b, '\n')
		if nl < 0 {
			return nil, errors.New("field without a newline")
		}
		if eq := bytes.IndexByte(b[:nl], '='); eq >= 0 {
			e[string(b[:eq])] = append(e[string(b[:eq])], string(b[eq+1:nl]))
			b = b[nl+1:]
			continue
		}
		name := string(b[:nl])
		b = b[nl+1:]
		if len(b) < 8 {
			return nil, fmt.Errorf("%s: short length", name)
		}
		n := binary.LittleEndian.Uint64(b)
		b = b[8:]
		if uint64(len(b)) < n+1 || b[n] != '\n' {
			return nil, fmt.Errorf("%s: value of %d bytes does not fit or lacks its newline", name, n)
		}
		e[name] = append(e[name], string(b[:n]))
		b = b[n+1:]
	}
	return e, nil
}

// validName is the journal's rule for a field a client may send.
func validName(n string) bool {
	if n == "" || len(n) > 64 || n[0] == '_' || n[0] >= '0' && n[0] <= '9' {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// fakeJournal listens where a test's handler sends.
type fakeJournal struct {
	path string
	conn *net.UnixConn
}

func listen(t testing.TB) *fakeJournal {
	t.Helper()
	path := filepath.Join(t.TempDir(), "j.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &fakeJournal{path: path, conn: c}
}

// next receives one entry, reading a memfd's when the datagram carries one.
func (j *fakeJournal) next(t testing.TB) entry {
	t.Helper()
	buf := make([]byte, 1<<20)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_ = j.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := j.conn.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	raw := buf[:n]
	if oobn > 0 {
		if n != 0 {
			t.Fatalf("a datagram with a descriptor also has %d bytes", n)
		}
		raw = readFD(t, oob[:oobn])
	}
	e, err := parse(raw)
	if err != nil {
		t.Fatalf("%v in %q", err, raw)
	}
	for name := range e {
		if !validName(name) {
			t.Errorf("invalid field name %q", name)
		}
	}
	return e
}

func readFD(t testing.TB, oob []byte) []byte {
	t.Helper()
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v: %v", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v: %v", fds, err)
	}
	f := os.NewFile(uintptr(fds[0]), "memfd")
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL; seals&want != want {
		t.Errorf("memfd seals %#x, want %#x", seals, want)
	}
	// The descriptor shares the sender's file offset, at the end: read
	// from the start, as journald does (it maps the file).
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(io.NewSectionReader(f, 0, st.Size()))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newLogger(t testing.TB, path string, fallback io.Writer, level slog.Level) (*slog.Logger, *journal.Handler) {
	h := journal.New(journal.Options{Socket: path, Level: level, Fallback: fallback})
	t.Cleanup(func() { _ = h.Close() })
	return slog.New(h), h
}

func TestFieldsAndPriorities(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelDebug)
	for _, c := range []struct {
		log  func(string, ...any)
		prio string
	}{{log.Debug, "7"}, {log.Info, "6"}, {log.Warn, "4"}, {log.Error, "3"}} {
		c.log("hello", "call", "VM.start", "session", "s-uuid", "task", "t-uuid", "vm", "vm-uuid", "n", 42,
			"d", 1500*time.Millisecond, "err", errors.New("boom"), "ok", true)
		e := j.next(t)
		for name, want := range map[string]string{
			"MESSAGE": "hello", "PRIORITY": c.prio, "SYSLOG_IDENTIFIER": "toolstackd",
			"CALL": "VM.start", "SESSION": "s-uuid", "TASK": "t-uuid", "VM_UUID": "vm-uuid",
			"N": "42", "D": "1.5s", "ERR": "boom", "OK": "true",
		} {
			if got := e.get(t, name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		if f := e.get(t, "CODE_FILE"); !strings.HasSuffix(f, "journal_test.go") {
			t.Errorf("CODE_FILE %q", f)
		}
		if fn := e.get(t, "CODE_FUNC"); !strings.HasSuffix(fn, "TestFieldsAndPriorities") {
			t.Errorf("CODE_FUNC %q", fn)
		}
		if e.get(t, "CODE_LINE") == "0" {
			t.Error("CODE_LINE 0")
		}
	}
	// Levels between slog's take the lower one's priority.
	log.Log(context.Background(), slog.LevelError+4, "worse")
	if p := j.next(t).get(t, "PRIORITY"); p != "3" {
		t.Errorf("error+4: priority %s", p)
	}
	log.Log(context.Background(), slog.LevelInfo+2, "between")
	if p := j.next(t).get(t, "PRIORITY"); p != "6" {
		t.Errorf("info+2: priority %s", p)
	}
}

func TestLevelFilter(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelWarn)
	if log.Enabled(context.Background(), slog.LevelInfo) {
		t.Error("info enabled at warn")
	}
	log.Info("not sent")
	log.Warn("sent")
	if m := j.next(t).get(t, "MESSAGE"); m != "sent" {
		t.Errorf("got %q", m)
	}
}

func TestMultiLineValues(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	msg := "first line\nsecond line\n"
	val := "a=b\n\nc\x00d"
	log.Info(msg, "stack", val, "plain", "x=y")
	e := j.next(t)
	if got := e.get(t, "MESSAGE"); got != msg {
		t.Errorf("MESSAGE %q", got)
	}
	if got := e.get(t, "STACK"); got != val {
		t.Errorf("STACK %q", got)
	}
	if got := e.get(t, "PLAIN"); got != "x=y" {
		t.Errorf("PLAIN %q", got)
	}
}

func TestNamesSanitized(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	long := strings.Repeat("k", 100)
	log.Info("m", "remote-addr", "1", "__private", "2", "9lives", "3", "été", "4", long, "5",
		"message", "6", "priority", "7", "", "8", "Mixed.Case", "9")
	e := j.next(t)
	for name, want := range map[string]string{
		"REMOTE_ADDR": "1", "PRIVATE": "2", "X_9LIVES": "3",
		"T_":                    "4", // é is no [A-Z0-9_]: "_T_", whose leading "_" goes
		strings.Repeat("K", 64): "5", "X_MESSAGE": "6", "X_PRIORITY": "7", "X_": "8", "MIXED_CASE": "9",
	} {
		if got := e.get(t, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if got := e.get(t, "MESSAGE"); got != "m" {
		t.Errorf("MESSAGE %q: an attribute posed as the message", got)
	}
	if got := e.get(t, "PRIORITY"); got != "6" {
		t.Errorf("PRIORITY %q: an attribute posed as the priority", got)
	}
}

func TestGroups(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	log = log.With("host", "h1").WithGroup("http").With("addr", "1.2.3.4")
	log.Info("m", slog.Group("req", "method", "GET", slog.Group("", "inline", "i")), "status", 200, "vm", "not-renamed",
		slog.Group("empty"))
	e := j.next(t)
	for name, want := range map[string]string{
		"HOST": "h1", "HTTP_ADDR": "1.2.3.4", "HTTP_REQ_METHOD": "GET", "HTTP_REQ_INLINE": "i",
		"HTTP_STATUS": "200", "HTTP_VM": "not-renamed",
	} {
		if got := e.get(t, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if _, ok := e["VM_UUID"]; ok {
		t.Error("vm inside a group renamed to VM_UUID")
	}
}

type secretish struct{}

func (secretish) LogValue() slog.Value { return slog.StringValue("resolved") }

func TestValues(t *testing.T) {
	j := listen(t)
	log, _ := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	log.Info("m", "at", at, "lv", secretish{}, "f", 1.5, "u", uint64(7), "nilerr", error(nil))
	e := j.next(t)
	for name, want := range map[string]string{
		"AT": "2026-01-02T03:04:05.000000006Z", "LV": "resolved", "F": "1.5", "U": "7", "NILERR": "<nil>",
	} {
		if got := e.get(t, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// An entry larger than a datagram may be goes through a sealed memfd,
// whole.
func TestLargeEntry(t *testing.T) {
	j := listen(t)
	log, h := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	log.Info("big", "blob", big, "lines", big[:1000]+"\n"+big[:1000])
	e := j.next(t)
	if got := e.get(t, "BLOB"); got != big {
		t.Errorf("BLOB: %d bytes, want %d", len(got), len(big))
	}
	if got := e.get(t, "LINES"); got != big[:1000]+"\n"+big[:1000] {
		t.Error("LINES differ")
	}
	if h.FellBack() != 0 || h.Dropped() != 0 {
		t.Errorf("fell back %d, dropped %d", h.FellBack(), h.Dropped())
	}
}

// A journal that reads nothing never holds a caller up: once its queue
// is full, entries are dropped and counted, and the first entry that gets
// through afterwards is followed by a warning with the count.
func TestSlowReaderNeverBlocks(t *testing.T) {
	j := listen(t)
	log, h := newLogger(t, j.path, io.Discard, slog.LevelInfo)
	pad := strings.Repeat("x", 4096)
	start := time.Now()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				log.Info("flood", "i", i, "pad", pad)
			}
		}()
	}
	wg.Wait()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("8000 entries to a full socket took %v", took)
	}
	dropped := h.Dropped()
	if dropped == 0 {
		t.Fatal("nothing dropped: the socket never filled")
	}
	if h.FellBack() != 0 {
		t.Errorf("%d entries fell back to text: a full socket is no absent journal", h.FellBack())
	}
	t.Logf("dropped %d of 8000", dropped)
	// Drain, then one more entry gets through with the warning after it.
	for {
		_ = j.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, _, err := j.conn.ReadFrom(make([]byte, 1<<16)); err != nil {
			break
		}
	}
	log.Info("after")
	if m := j.next(t).get(t, "MESSAGE"); m != "after" {
		t.Fatalf("got %q", m)
	}
	w := j.next(t)
	if got, want := w.get(t, "JOURNAL_DROPPED"), fmt.Sprint(dropped); got != want {
		t.Errorf("JOURNAL_DROPPED %s, want %s", got, want)
	}
	if w.get(t, "PRIORITY") != "4" {
		t.Error("the drop warning is no warning")
	}
}

// syncBuffer is a buffer the fallback may write from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// With no journal (no socket, or a socket nobody reads), entries go to
// the fallback as text, at once; when the journal comes, they go to it.
func TestAbsentJournalFallsBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j.sock")
	var fb syncBuffer
	log, h := newLogger(t, path, &fb, slog.LevelInfo)
	log = log.With("call", "VM.start")
	start := time.Now()
	for i := 0; i < 1000; i++ {
		log.Info("no journal", "i", i)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
	if h.FellBack() != 1000 {
		t.Errorf("fell back %d", h.FellBack())
	}
	if !strings.Contains(fb.String(), `level=INFO msg="no journal" call=VM.start i=999`) {
		t.Errorf("fallback text: %.300s", fb.String())
	}
	// A socket file with nobody behind it.
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	log.Warn("journal is back")
	j := &fakeJournal{path: path, conn: c}
	e := j.next(t)
	if e.get(t, "MESSAGE") != "journal is back" || e.get(t, "CALL") != "VM.start" {
		t.Errorf("entry %v", e)
	}
	_ = c.Close() // unlinks nothing: the file stays, refusing
	log.Error("gone again")
	if !strings.Contains(fb.String(), "gone again") {
		t.Error("an entry to a refusing socket was not written to the fallback")
	}
}

func TestClosed(t *testing.T) {
	j := listen(t)
	var fb syncBuffer
	log, h := newLogger(t, j.path, &fb, slog.LevelInfo)
	_ = h.Close()
	log.Info("after close")
	if !strings.Contains(fb.String(), "after close") {
		t.Error("not in the fallback")
	}
}

// Attribute keys and values of any bytes come back whole, under a valid
// name, from the encoder through the journal's parser.
func FuzzRoundTrip(f *testing.F) {
	f.Add("call", "VM.start", "message")
	f.Add("_a-b", "x\ny", "multi\nline")
	f.Add("", "", "")
	f.Add("9\x00é", "\n", "=")
	f.Add(strings.Repeat("z", 70), "v=w", "m")
	j := listen(f)
	h := journal.New(journal.Options{Socket: j.path, Fallback: io.Discard})
	f.Cleanup(func() { _ = h.Close() })
	log := slog.New(h)
	f.Fuzz(func(t *testing.T, key, value, msg string) {
		log.Info(msg, key, value)
		e := j.next(t)
		if got := e.get(t, "MESSAGE"); got != msg {
			t.Fatalf("MESSAGE %q, want %q", got, msg)
		}
		name := journal.FieldName(key)
		if !validName(name) {
			t.Fatalf("FieldName(%q) = %q", key, name)
		}
		if key == "" && value == "" {
			return // an empty attribute is ignored
		}
		if got := e.get(t, name); got != value {
			t.Fatalf("%s = %q, want %q", name, got, value)
		}
		if h.Dropped() != 0 || h.FellBack() != 0 {
			t.Fatalf("dropped %d, fell back %d", h.Dropped(), h.FellBack())
		}
	})
}

// BenchmarkHandle is one info entry with a call's four attributes, sent
// to a socket that a goroutine drains.
func BenchmarkHandle(b *testing.B) {
	j := listen(b)
	go func() {
		buf := make([]byte, 1<<16)
		for {
			if _, _, err := j.conn.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	log, h := newLogger(b, j.path, io.Discard, slog.LevelInfo)
	b.ReportAllocs()
	for b.Loop() {
		log.Info("VM started", "call", "VM.start", "session", "0b8d6b4e-7bd1-4a4f-9f35-1ad4d0e6d7b5",
			"task", "5b0c7f5e-2d1e-4c4e-8a8c-3f0a8d6c2e11", "vm", "e3f1c2d4-5a6b-4c7d-8e9f-0a1b2c3d4e5f")
	}
	b.ReportMetric(float64(h.Dropped()), "dropped")
}
