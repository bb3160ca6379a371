package redolog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// toyDB is a key-value "database" whose commits feed a Log the way the
// real database's commit hook would: under its writer lock, in order.
type toyDB struct {
	mu   sync.Mutex
	gen  uint64
	rows map[string]string
	log  *Log
}

func newToyDB() *toyDB { return &toyDB{rows: map[string]string{}} }

func (db *toyDB) set(k, v string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.gen++
	d := Delta{Kind: WriteField, Table: "t", Ref: k, Field: "v", Value: v}
	if _, ok := db.rows[k]; !ok {
		d = Delta{Kind: CreateRow, Table: "t", Ref: k, Fields: [][2]string{{"v", v}}}
	}
	db.rows[k] = v
	if db.log != nil {
		db.log.Delta(db.gen, []Delta{d})
	}
}

func (db *toyDB) del(k string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.gen++
	delete(db.rows, k)
	if db.log != nil {
		db.log.Delta(db.gen, []Delta{{Kind: DeleteRow, Table: "t", Ref: k}})
	}
}

func (db *toyDB) snapshot() (uint64, func(io.Writer) error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	rows := maps.Clone(db.rows)
	return db.gen, func(w io.Writer) error { return json.NewEncoder(w).Encode(rows) }
}

func (db *toyDB) current() (uint64, map[string]string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.gen, maps.Clone(db.rows)
}

// rebuild applies a recovered log to its database dump.
func rebuild(t *testing.T, r *Recovered) map[string]string {
	t.Helper()
	rows := map[string]string{}
	if err := json.Unmarshal(r.DB, &rows); err != nil {
		t.Fatalf("database dump: %v", err)
	}
	if r.BadDelta != nil {
		t.Fatalf("bad delta: %v", r.BadDelta)
	}
	for _, e := range r.Deltas {
		for _, d := range e.Deltas {
			switch d.Kind {
			case CreateRow:
				rows[d.Ref] = d.Fields[0][1]
			case WriteField:
				rows[d.Ref] = d.Value
			case DeleteRow:
				delete(rows, d.Ref)
			}
		}
	}
	return rows
}

func checkRecovered(t *testing.T, path string, half int64, db *toyDB) *Recovered {
	t.Helper()
	r, err := Recover(path, RecoverOptions{HalfSize: half})
	if err != nil {
		t.Fatal(err)
	}
	gen, rows := db.current()
	if r.LastGen() != gen {
		t.Errorf("recovered up to generation %d, database is at %d", r.LastGen(), gen)
	}
	if got := rebuild(t, r); !maps.Equal(got, rows) {
		t.Fatalf("recovered database differs: %d rows, want %d", len(got), len(rows))
	}
	return r
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func flush(t *testing.T, l *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v (stats %+v)", err, l.Stats())
	}
}

// testDev wraps a device to record calls and to hang, slow down or fail
// writes on demand.
type testDev struct {
	Device
	mu       sync.Mutex
	hang     chan struct{} // writes block until it is closed
	slow     time.Duration
	failNext error
	calls    []call
}

type call struct {
	op  string
	gen uint64
	err error
}

func (d *testDev) before() error {
	d.mu.Lock()
	h, slow, fail := d.hang, d.slow, d.failNext
	d.failNext = nil
	d.mu.Unlock()
	if h != nil {
		<-h
	}
	time.Sleep(slow)
	return fail
}

func (d *testDev) note(op string, gen uint64, err error) {
	d.mu.Lock()
	d.calls = append(d.calls, call{op, gen, err})
	d.mu.Unlock()
}

func (d *testDev) WriteDB(gen uint64, marker string, r io.Reader) error {
	err := d.before()
	if err == nil {
		err = d.Device.WriteDB(gen, marker, r)
	}
	d.note("db", gen, err)
	return err
}

func (d *testDev) WriteDelta(gen uint64, marker string, data []byte) error {
	err := d.before()
	if err == nil {
		err = d.Device.WriteDelta(gen, marker, data)
	}
	d.note("delta", gen, err)
	return err
}

func (d *testDev) setHang(h chan struct{}) { d.mu.Lock(); d.hang = h; d.mu.Unlock() }

func (d *testDev) history() []call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]call(nil), d.calls...)
}

// devFactory opens real devices wrapped in testDevs, remembering them.
type devFactory struct {
	mu     sync.Mutex
	devs   []*testDev
	setup  func(*testDev)
	failed error // when set, opening fails with it
}

func (f *devFactory) open(path string, half int64) (Device, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed != nil {
		return nil, f.failed
	}
	d, err := OpenDevice(path, DeviceOptions{HalfSize: half})
	if err != nil {
		return nil, err
	}
	td := &testDev{Device: d}
	if f.setup != nil {
		f.setup(td)
	}
	f.devs = append(f.devs, td)
	return td, nil
}

func (f *devFactory) opened() []*testDev {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*testDev(nil), f.devs...)
}

type alerts struct {
	mu sync.Mutex
	a  []Alert
}

func (a *alerts) add(x Alert) { a.mu.Lock(); a.a = append(a.a, x); a.mu.Unlock() }
func (a *alerts) list() []Alert {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Alert(nil), a.a...)
}

func TestLogRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	const half = 1 << 20
	db := newToyDB()
	var al alerts
	l, err := Open(path, Options{HalfSize: half, Snapshot: db.snapshot, Logger: discardLogger(), OnAlert: al.add})
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	flush(t, l) // the initial database write
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				k := fmt.Sprintf("k%d-%d", w, i%40)
				if i%7 == 6 {
					db.del(k)
				} else {
					db.set(k, fmt.Sprintf("value %d of %d", i, w))
				}
			}
		}()
	}
	wg.Wait()
	flush(t, l)
	if !l.Healthy() {
		t.Fatal("not healthy")
	}
	st := l.Stats()
	if st.DeltasWritten == 0 || st.DBWrites != 1 || st.DeltasDropped != 0 || st.Failures != 0 {
		t.Fatalf("stats %+v", st)
	}
	// An explicit database write compacts the log.
	gen, dump := db.snapshot()
	l.WriteDB(gen, dump)
	db.set("after", "compaction")
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if len(al.list()) != 0 {
		t.Fatalf("alerts: %+v", al.list())
	}
	r := checkRecovered(t, path, half, db)
	if r.Gen != gen || len(r.Deltas) != 1 {
		t.Fatalf("after compaction: db %d + %d deltas, want db %d + 1", r.Gen, len(r.Deltas), gen)
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	l.Delta(100, sampleDeltas) // ignored after Close
}

// TestLogNoSpace: with a small half, the delta that does not fit makes the
// log write the whole database instead, and nothing is lost.
func TestLogNoSpace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	const half = 4096
	db := newToyDB()
	f := &devFactory{}
	l, err := Open(path, Options{HalfSize: half, Snapshot: db.snapshot, Logger: discardLogger(), OpenDevice: f.open})
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	for i := 0; i < 400; i++ {
		db.set(fmt.Sprint("key", i%15), fmt.Sprintf("value number %d, padded to some length", i))
		if i%50 == 0 {
			flush(t, l) // let the queue drain now and then so nothing is dropped
		}
	}
	flush(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	if st.DBWrites < 5 || st.DeltasDropped != 0 {
		t.Fatalf("stats %+v", st)
	}
	h := f.opened()[0].history()
	noSpace := 0
	for i, c := range h {
		if errors.Is(c.err, ErrNoSpace) {
			noSpace++
			if i+1 >= len(h) || h[i+1].op != "db" || h[i+1].gen < c.gen || h[i+1].err != nil {
				t.Fatalf("call %d: delta %d did not fit, next call %+v", i, c.gen, h[i+1:])
			}
		}
	}
	if noSpace == 0 {
		t.Fatal("no delta ever ran out of space")
	}
	checkRecovered(t, path, half, db)
}

func hungOptions(path string, db *toyDB, f *devFactory, al *alerts) Options {
	return Options{
		HalfSize:     1 << 20,
		Snapshot:     db.snapshot,
		Logger:       discardLogger(),
		OpenDevice:   f.open,
		OnAlert:      al.add,
		DeltaTimeout: 250 * time.Millisecond,
		DBTimeout:    time.Second,
		RetryMin:     30 * time.Millisecond,
		RetryMax:     120 * time.Millisecond,
	}
}

// TestLogHungDevice: a device whose writes block does not stall callers;
// the log goes degraded after the timeout, drops deltas, never touches the
// device while the call is stuck, and once the device comes back writes
// the whole database before resuming deltas.
func TestLogHungDevice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	f := &devFactory{}
	var al alerts
	l, err := Open(path, hungOptions(path, db, f, &al))
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	for i := 0; i < 10; i++ {
		db.set(fmt.Sprint("k", i), "before")
	}
	flush(t, l)

	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	first := f.opened()[0]
	first.setHang(release)
	// If Delta waited for the device, these commits would never finish:
	// the device stays hung until release is closed.
	start := time.Now()
	var worst time.Duration
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for i := 0; i < 2000; i++ {
			t0 := time.Now()
			db.set(fmt.Sprint("k", i%50), fmt.Sprint("during ", i))
			worst = max(worst, time.Since(t0))
			if i%100 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	select {
	case <-committed:
	case <-time.After(10 * time.Second):
		t.Fatal("commits blocked behind the hung device")
	}
	// Generous: scheduling noise on a loaded machine, not device time.
	if worst > time.Second {
		t.Errorf("a commit took %v with the device hung", worst)
	}
	t.Logf("2000 commits against a hung device in %v (slowest %v)", time.Since(start), worst)
	waitFor(t, 10*time.Second, "the log to turn unhealthy", func() bool { return !l.Healthy() })
	if a := al.list(); len(a) != 1 || a[0].Healthy || !errors.Is(a[0].Err, ErrTimeout) {
		t.Fatalf("alerts %+v", a)
	}
	// While the call is stuck: retries happen but the device is neither
	// reused nor reopened.
	time.Sleep(400 * time.Millisecond)
	waitFor(t, 10*time.Second, "a retry to fail", func() bool { return l.Stats().Failures >= 2 })
	if n := len(f.opened()); n != 1 {
		t.Fatalf("device reopened %d times while a call was stuck", n-1)
	}
	st := l.Stats()
	if st.DeltasDropped == 0 || st.AbandonedCalls != 1 || st.Failures < 2 {
		t.Fatalf("stats while hung: %+v", st)
	}
	nCalls := len(first.history())
	if got := len(l.queue); got > 0 {
		t.Logf("%d queued", got)
	}
	t.Logf("stats while hung: %+v", st)

	// The device comes back.
	close(release)
	waitFor(t, 10*time.Second, "the log to recover", l.Healthy)
	if a := al.list(); len(a) != 2 || !a[1].Healthy {
		t.Fatalf("alerts %+v", a)
	}
	devs := f.opened()
	if len(devs) != 2 {
		t.Fatalf("%d devices opened", len(devs))
	}
	if h := first.history(); len(h) != nCalls+1 || h[len(h)-1].op != "delta" {
		t.Fatalf("hung device calls after release: %+v", h[nCalls:])
	}
	if h := devs[1].history(); len(h) == 0 || h[0].op != "db" || h[0].err != nil {
		t.Fatalf("after recovery the first call was %+v, want a database write", h)
	}
	for i := 0; i < 20; i++ {
		db.set(fmt.Sprint("k", i), "after")
	}
	flush(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, path, 1<<20, db)
}

// TestLogHungDatabaseWrite: the very first (database) write hangs.
func TestLogHungDatabaseWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	release := make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	f := &devFactory{setup: func(d *testDev) { d.hang = release }}
	var al alerts
	l, err := Open(path, hungOptions(path, db, f, &al))
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	for i := 0; i < 100; i++ {
		db.set(fmt.Sprint("k", i), "v")
	}
	waitFor(t, 10*time.Second, "an alert", func() bool { return len(al.list()) == 1 })
	if l.Healthy() {
		t.Fatal("healthy with a hung device")
	}
	f.mu.Lock()
	f.setup = nil
	f.mu.Unlock()
	close(release)
	waitFor(t, 10*time.Second, "the log to recover", l.Healthy)
	db.set("x", "y")
	flush(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, path, 1<<20, db)
}

// TestLogBackoff: failed reconnections are retried after 2^n * RetryMin,
// capped at RetryMax; one alert when it goes down, one when it comes back.
func TestLogBackoff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	var mu sync.Mutex
	var attempts []time.Time
	f := &devFactory{failed: syscall.EIO}
	open := func(p string, half int64) (Device, error) {
		mu.Lock()
		attempts = append(attempts, time.Now())
		mu.Unlock()
		return f.open(p, half)
	}
	var al alerts
	opts := hungOptions(path, db, f, &al)
	opts.DeltaTimeout, opts.DBTimeout = 5*time.Second, 10*time.Second // not about hangs
	opts.OpenDevice = open
	opts.RetryMin, opts.RetryMax = 20*time.Millisecond, 80*time.Millisecond
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	// 10 attempts take 620 ms on a quiet machine; uncapped, the tenth
	// would come after 10 s.
	waitFor(t, 8*time.Second, "10 attempts", func() bool { mu.Lock(); defer mu.Unlock(); return len(attempts) >= 10 })
	mu.Lock()
	var gaps []time.Duration
	for i := 1; i < 10; i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	mu.Unlock()
	t.Logf("retry gaps %v", gaps)
	// Each gap is at least its back-off (timers never fire early; they
	// may fire late on a loaded machine), and the cap holds: uncapped, the
	// last gaps would be 1.28, 2.56 and 5.12 s, where capped they are
	// 80 ms on a quiet machine.
	want := []time.Duration{20, 40, 80, 80, 80, 80, 80, 80, 80}
	for i, g := range gaps {
		if w := want[i] * time.Millisecond; g < w-time.Millisecond {
			t.Errorf("gap %d = %v, want at least %v", i, g, w)
		}
	}
	if m := min(gaps[6], gaps[7], gaps[8]); m > time.Second {
		t.Errorf("back-off not capped at 80ms: gaps %v", gaps)
	}
	db.set("a", "b")
	f.mu.Lock()
	f.failed = nil
	f.mu.Unlock()
	waitFor(t, 10*time.Second, "recovery", l.Healthy)
	// The recovery's alert is sent after the log is healthy again.
	waitFor(t, 10*time.Second, "the recovery's alert", func() bool { return len(al.list()) >= 2 })
	if a := al.list(); len(a) != 2 || a[0].Healthy || !errors.Is(a[0].Err, syscall.EIO) || !a[1].Healthy {
		t.Fatalf("alerts %+v", a)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, path, 1<<20, db)
}

// TestLogWriteError: a failing write degrades the log; the retry writes
// the whole database.
func TestLogWriteError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	f := &devFactory{}
	var al alerts
	opts := hungOptions(path, db, f, &al)
	opts.DeltaTimeout, opts.DBTimeout = 5*time.Second, 10*time.Second // not about hangs
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	db.set("a", "1")
	flush(t, l)
	d := f.opened()[0]
	d.mu.Lock()
	d.failNext = syscall.EIO
	d.mu.Unlock()
	db.set("b", "2")
	waitFor(t, 10*time.Second, "an alert", func() bool { return len(al.list()) >= 1 })
	db.set("c", "3")
	waitFor(t, 10*time.Second, "recovery", l.Healthy)
	db.set("d", "4")
	flush(t, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, path, 1<<20, db)
	if n := len(f.opened()); n != 2 {
		t.Fatalf("%d devices opened, want a reconnection", n)
	}
}

// TestLogQueueOverflow: a slow device and a small queue: deltas that do
// not fit in the queue are dropped and covered by a database write.
func TestLogQueueOverflow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	f := &devFactory{setup: func(d *testDev) { d.slow = time.Millisecond }}
	var al alerts
	opts := hungOptions(path, db, f, &al)
	opts.DeltaTimeout, opts.DBTimeout = 5*time.Second, 10*time.Second // not about hangs
	opts.QueueLength = 8
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	flush(t, l) // the initial database write
	for i := 0; i < 3000; i++ {
		db.set(fmt.Sprint("k", i%100), fmt.Sprint("v", i))
	}
	flush(t, l)
	st := l.Stats()
	if st.DeltasDropped == 0 || st.DBWrites < 2 || !l.Healthy() {
		t.Fatalf("stats %+v", st)
	}
	t.Logf("stats %+v", st)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	checkRecovered(t, path, 1<<20, db)
	if len(al.list()) != 0 {
		t.Fatalf("alerts %+v", al.list())
	}
}

// TestLogCloseTimeout: Close gives up on a hung device.
func TestLogCloseTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "redo")
	db := newToyDB()
	f := &devFactory{}
	var al alerts
	opts := hungOptions(path, db, f, &al)
	opts.DeltaTimeout = 10 * time.Second
	opts.CloseTimeout = 200 * time.Millisecond
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	db.log = l
	db.set("a", "b")
	flush(t, l)
	release := make(chan struct{})
	defer close(release)
	f.opened()[0].setHang(release)
	db.set("c", "d")
	t0 := time.Now()
	if err := l.Close(); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Close: %v", err)
	}
	// 200 ms on a quiet machine; the device hangs until the test ends.
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
}
