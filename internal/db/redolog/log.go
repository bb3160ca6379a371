package redolog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// xapi's limits (db_globs.ml).
const (
	DefaultDeltaTimeout = 2 * time.Second
	DefaultDBTimeout    = 30 * time.Second
	DefaultReadTimeout  = 30 * time.Second
	DefaultOpenTimeout  = 5 * time.Second
	DefaultRetryMin     = 2 * time.Second
	DefaultRetryMax     = 120 * time.Second
	DefaultQueueLength  = 4096

	// lateCommitDelay is how long the log waits before writing the
	// database again when a snapshot turned out older than a delta that
	// was dropped (the commit was not yet visible to Snapshot).
	lateCommitDelay = 20 * time.Millisecond
)

// Log errors.
var (
	// ErrTimeout means the device did not complete an operation in time.
	ErrTimeout = errors.New("redolog: device operation timed out")
	// ErrClosed is returned by calls on a closed Log.
	ErrClosed = errors.New("redolog: log closed")
	// ErrDegraded means the log is not currently persisting writes.
	ErrDegraded = errors.New("redolog: degraded: writes are not being persisted")
)

// Alert reports a change of the log's health.
type Alert struct {
	Healthy bool  // false: the log stopped persisting writes; true: it recovered
	Err     error // the failure, when !Healthy
	Time    time.Time
}

// Options configure a Log. Snapshot is required.
type Options struct {
	// HalfSize is the length of each half of the log (0: DefaultHalfSize).
	HalfSize int64
	// Snapshot returns the generation of the current database and a
	// function that writes that state (the dump whose bytes become the
	// database record). The log calls it whenever it must write the whole
	// database on its own: at start, after an outage, when a half is full
	// and when deltas were dropped. The state must include every commit
	// for which Delta has already been called; dump runs on another
	// goroutine and may be abandoned (its writes then fail).
	Snapshot func() (gen uint64, dump func(io.Writer) error)
	// QueueLength bounds the queued operations (0: DefaultQueueLength).
	// When the queue is full, deltas are dropped and the whole database
	// is written later instead.
	QueueLength int
	// Timeouts (0: xapi's defaults). CloseTimeout bounds Close
	// (0: DBTimeout+DeltaTimeout).
	DeltaTimeout, DBTimeout, OpenTimeout, CloseTimeout time.Duration
	// Reconnection back-off after a failure: RetryMin, doubling up to
	// RetryMax (0: 2 s and 120 s).
	RetryMin, RetryMax time.Duration
	// Logger receives the log's messages (nil: slog.Default()).
	Logger *slog.Logger
	// OnAlert, when set, is called (on the log's goroutine) when the log
	// becomes degraded and when it recovers. It must not block for long.
	OnAlert func(Alert)
	// OpenDevice opens the device (nil: OpenDevice on the path with
	// HalfSize). Tests inject failing or hanging devices here.
	OpenDevice func(path string, halfSize int64) (Device, error)
}

// Stats are counters of a Log's activity.
type Stats struct {
	DeltasQueued   uint64 // Delta calls accepted into the queue
	DeltasWritten  uint64 // delta records written
	DeltasDropped  uint64 // Delta calls dropped (degraded, queue full, unencodable)
	DeltasCovered  uint64 // queued deltas skipped because a database record already held them
	DBWrites       uint64 // database records written
	Failures       uint64 // failed device operations (including timeouts)
	DurableGen     uint64 // generation of the last record written
	QueueLength    int    // operations waiting now
	QueueCapacity  int
	AbandonedCalls uint64 // device calls abandoned after a timeout
}

type itemKind uint8

const (
	itemDelta itemKind = iota
	itemDB
	itemFlush
)

type item struct {
	kind itemKind
	gen  uint64
	data []byte
	dump func(io.Writer) error
	ack  chan error
}

// Log is the redo log's front end for the database's commit path. Delta
// and WriteDB never wait for the device: they queue the work for the log's
// goroutine, which performs each device call on a goroutine of its own and
// gives up on it after the call's timeout.
type Log struct {
	path  string
	opts  Options
	log   *slog.Logger
	queue chan item
	stop  chan struct{}
	done  chan struct{}

	closed    atomic.Bool
	abort     atomic.Bool
	accepting atomic.Bool   // false while degraded: Delta drops at once
	lost      atomic.Uint64 // highest generation of a dropped delta
	healthy   atomic.Bool

	queued, written, dropped, covered, dbWrites, failures, abandoned, durableGen atomic.Uint64

	// The log goroutine's own state.
	dev      Device
	stuck    chan struct{} // non-nil while an abandoned call has not returned
	marker   string
	durable  uint64 // generation of the last record written
	degraded bool
	lastErr  error
	backoff  time.Duration
	syncAt   time.Time // when to write the whole database next (zero: not scheduled)
	closeErr error
}

// Open starts a redo log on path. It does no I/O itself: the log's
// goroutine opens the device and writes the whole database (from
// opts.Snapshot) before any delta. Until that succeeds Healthy is false.
func Open(path string, opts Options) (*Log, error) {
	if opts.Snapshot == nil {
		return nil, errors.New("redolog: Options.Snapshot is required")
	}
	if opts.HalfSize == 0 {
		opts.HalfSize = DefaultHalfSize
	}
	if opts.HalfSize < MinHalfSize {
		return nil, fmt.Errorf("redolog: half size %d below the minimum %d", opts.HalfSize, MinHalfSize)
	}
	setDefault(&opts.DeltaTimeout, DefaultDeltaTimeout)
	setDefault(&opts.DBTimeout, DefaultDBTimeout)
	setDefault(&opts.OpenTimeout, DefaultOpenTimeout)
	setDefault(&opts.CloseTimeout, opts.DBTimeout+opts.DeltaTimeout)
	setDefault(&opts.RetryMin, DefaultRetryMin)
	setDefault(&opts.RetryMax, DefaultRetryMax)
	if opts.RetryMax < opts.RetryMin {
		opts.RetryMax = opts.RetryMin
	}
	if opts.QueueLength <= 0 {
		opts.QueueLength = DefaultQueueLength
	}
	if opts.OpenDevice == nil {
		opts.OpenDevice = func(path string, half int64) (Device, error) {
			d, err := OpenDevice(path, DeviceOptions{HalfSize: half})
			if err != nil {
				return nil, err
			}
			return d, nil
		}
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.Default()
	}
	l := &Log{
		path:  path,
		opts:  opts,
		log:   lg.With("component", "redolog", "device", path),
		queue: make(chan item, opts.QueueLength),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	l.accepting.Store(true)
	go l.loop()
	return l, nil
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Delta queues the deltas of one commit, whose generation (after the
// commit) is gen, as one record. It never blocks. Calls must come in
// commit order. When the log is degraded or its queue is full the deltas
// are dropped, and the whole database is written once the log can.
func (l *Log) Delta(gen uint64, ds []Delta) {
	if len(ds) == 0 || l.closed.Load() {
		return
	}
	if !l.accepting.Load() {
		l.drop(gen)
		return
	}
	data, err := EncodeAll(ds)
	if err != nil {
		// Not representable as a delta: let the database dump carry it.
		l.drop(gen)
		return
	}
	select {
	case l.queue <- item{kind: itemDelta, gen: gen, data: data}:
		l.queued.Add(1)
	default:
		l.drop(gen)
	}
}

// WriteDB queues a write of the whole database: dump writes the state at
// generation gen. It never blocks; if the queue is full the request is
// dropped (the deltas keep flowing). dump is called later, on another
// goroutine, so it must write a snapshot taken when WriteDB was called.
func (l *Log) WriteDB(gen uint64, dump func(io.Writer) error) {
	if dump == nil || l.closed.Load() {
		return
	}
	select {
	case l.queue <- item{kind: itemDB, gen: gen, dump: dump}:
	default:
		l.log.Warn("redo log queue full: database write request dropped", "generation", gen)
	}
}

// Flush waits until everything queued before it has been handled. It
// returns nil if the log was healthy then (so every delta queued before
// was written or covered by a database record), ErrDegraded otherwise.
// Unlike Delta it blocks: it is not for the commit path.
func (l *Log) Flush(ctx context.Context) error {
	if l.closed.Load() {
		return ErrClosed
	}
	ack := make(chan error, 1)
	select {
	case l.queue <- item{kind: itemFlush, ack: ack}:
	case <-l.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-ack:
		return err
	case <-l.done:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Healthy reports whether the log is persisting writes: the device is
// connected and its database record is up to date as far as the log knows.
func (l *Log) Healthy() bool { return l.healthy.Load() }

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	return Stats{
		DeltasQueued:   l.queued.Load(),
		DeltasWritten:  l.written.Load(),
		DeltasDropped:  l.dropped.Load(),
		DeltasCovered:  l.covered.Load(),
		DBWrites:       l.dbWrites.Load(),
		Failures:       l.failures.Load(),
		DurableGen:     l.durableGen.Load(),
		QueueLength:    len(l.queue),
		QueueCapacity:  cap(l.queue),
		AbandonedCalls: l.abandoned.Load(),
	}
}

// Close handles what is queued (waiting at most CloseTimeout) and closes
// the device. Calls made concurrently with Close may or may not be logged.
// It returns ErrDegraded if the log was not healthy at the end, ErrTimeout
// if the queue could not be handled in time (the log's goroutine then
// stops after its current call; a call stuck on the device is abandoned
// and the device closed whenever it returns).
func (l *Log) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	close(l.stop)
	t := time.NewTimer(l.opts.CloseTimeout)
	defer t.Stop()
	select {
	case <-l.done:
		return l.closeErr
	case <-t.C:
		l.abort.Store(true)
		return fmt.Errorf("%w: closing the redo log", ErrTimeout)
	}
}

func (l *Log) drop(gen uint64) {
	l.dropped.Add(1)
	for {
		cur := l.lost.Load()
		if gen <= cur || l.lost.CompareAndSwap(cur, gen) {
			return
		}
	}
}

// --- the log's goroutine ---

func (l *Log) loop() {
	defer close(l.done)
	l.sync()
	for !l.abort.Load() {
		var retry <-chan time.Time
		var timer *time.Timer
		if !l.syncAt.IsZero() {
			timer = time.NewTimer(time.Until(l.syncAt))
			retry = timer.C
		}
		select {
		case it := <-l.queue:
			l.handle(it)
		case <-retry:
			l.sync()
		case <-l.stop:
			l.drain()
			l.shutdown()
			return
		}
		if timer != nil {
			timer.Stop()
		}
	}
	l.shutdown()
}

// drain handles what is left in the queue after Close.
func (l *Log) drain() {
	for !l.abort.Load() {
		select {
		case it := <-l.queue:
			l.handle(it)
		default:
			return
		}
	}
}

func (l *Log) shutdown() {
	if l.dev != nil {
		dev := l.dev
		l.dev = nil
		if err := dev.Close(); err != nil {
			l.log.Warn("closing redo log device", "err", err)
		}
	}
	if l.degraded || !l.healthy.Load() {
		l.closeErr = ErrDegraded
		if l.lastErr != nil {
			l.closeErr = fmt.Errorf("%w: %w", ErrDegraded, l.lastErr)
		}
	}
	l.healthy.Store(false)
}

func (l *Log) handle(it item) {
	switch it.kind {
	case itemFlush:
		if !l.degraded && l.lost.Load() > l.durable {
			l.sync() // a dropped delta is not yet covered
		}
		if l.degraded || !l.healthy.Load() {
			it.ack <- ErrDegraded
		} else {
			it.ack <- nil
		}
	case itemDelta:
		if l.degraded {
			l.drop(it.gen)
			return
		}
		if it.gen <= l.durable {
			l.covered.Add(1)
			return
		}
		if l.lost.Load() > l.durable {
			// Some delta was dropped: the record would leave a hole. The
			// whole database (which holds this delta too) replaces it.
			l.log.Info("deltas were dropped; writing the whole database", "lost", l.lost.Load(), "durable", l.durable)
			l.sync()
			return
		}
		dev, marker := l.dev, l.marker
		_, err := l.call(l.opts.DeltaTimeout, func() (Device, error) {
			return nil, dev.WriteDelta(it.gen, marker, it.data)
		})
		switch {
		case err == nil:
			l.setDurable(it.gen)
			l.written.Add(1)
		case errors.Is(err, ErrNoSpace):
			l.log.Info("redo log half full; writing the whole database", "generation", it.gen)
			l.sync()
		default:
			l.fail(fmt.Errorf("writing delta %d: %w", it.gen, err))
		}
	case itemDB:
		if l.degraded {
			return
		}
		if it.gen < l.durable {
			return // a newer database record is already on the device
		}
		if l.lost.Load() > it.gen {
			l.sync() // that dump would miss a dropped delta: take a fresh one
			return
		}
		if err := l.writeDB(it.gen, it.dump); err != nil {
			l.fail(fmt.Errorf("writing database %d: %w", it.gen, err))
		}
	}
}

func (l *Log) setDurable(gen uint64) {
	l.durable = gen
	l.durableGen.Store(gen)
}

// sync (re)connects if needed and writes the whole database from
// Options.Snapshot; on success the log is healthy.
func (l *Log) sync() {
	l.syncAt = time.Time{}
	// Accept deltas again before the snapshot is taken: those committed
	// before it are skipped as covered, those after are needed.
	l.accepting.Store(true)
	if l.stuck != nil {
		select {
		case <-l.stuck:
			l.stuck = nil
		default:
			l.fail(fmt.Errorf("%w: an earlier device call is still blocked", ErrTimeout))
			return
		}
	}
	if l.dev == nil {
		dev, err := l.call(l.opts.OpenTimeout, func() (Device, error) {
			return l.opts.OpenDevice(l.path, l.opts.HalfSize)
		})
		if err != nil {
			l.fail(fmt.Errorf("opening device: %w", err))
			return
		}
		l.dev = dev
	}
	gen, dump := l.opts.Snapshot()
	if err := l.writeDB(gen, dump); err != nil {
		l.fail(fmt.Errorf("writing database %d: %w", gen, err))
		return
	}
	if lost := l.lost.Load(); lost > l.durable {
		// The snapshot predates a dropped delta (its commit was not yet
		// visible): write the database again shortly.
		l.syncAt = time.Now().Add(lateCommitDelay)
	}
}

// writeDB writes a database record with a fresh marker, streaming dump's
// output through a pipe to the device call.
func (l *Log) writeDB(gen uint64, dump func(io.Writer) error) error {
	marker := uuid.NewString()
	pr, pw := io.Pipe()
	go func() {
		var err error
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("database dump panicked: %v", r)
			}
			pw.CloseWithError(err)
		}()
		if err = dump(pw); err != nil {
			err = fmt.Errorf("dumping database: %w", err)
		}
	}()
	dev := l.dev
	_, err := l.call(l.opts.DBTimeout, func() (Device, error) {
		return nil, dev.WriteDB(gen, marker, pr)
	})
	// Unblock the dump if the device stopped reading early.
	pr.CloseWithError(errors.New("redolog: database write ended"))
	if err != nil {
		return err
	}
	l.marker = marker
	l.setDurable(gen)
	l.dbWrites.Add(1)
	l.recovered()
	return nil
}

// call runs op on a goroutine of its own and waits at most timeout. On
// timeout the goroutine is abandoned together with the current device: the
// log forgets the device (it will reopen it) and refuses to touch the
// device path again until the abandoned call returns, at which point a
// watcher closes the device (and any device the call opened late).
func (l *Log) call(timeout time.Duration, op func() (Device, error)) (Device, error) {
	type result struct {
		dev Device
		err error
	}
	ch := make(chan result, 1)
	go func() {
		d, err := op()
		ch <- result{d, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.dev, r.err
	case <-t.C:
	}
	l.abandoned.Add(1)
	old := l.dev
	l.dev = nil
	stuck := make(chan struct{})
	l.stuck = stuck
	go func() {
		r := <-ch
		if r.dev != nil {
			_ = r.dev.Close()
		}
		if old != nil {
			_ = old.Close()
		}
		close(stuck)
	}()
	return nil, fmt.Errorf("%w after %v", ErrTimeout, timeout)
}

// fail enters (or stays in) the degraded state and schedules a retry.
func (l *Log) fail(err error) {
	l.failures.Add(1)
	l.accepting.Store(false)
	l.healthy.Store(false)
	l.lastErr = err
	if l.dev != nil {
		// Reconnect on the next attempt. Closing might block like any
		// other call on a sick device, so it is not waited for.
		go func(c func() error) { _ = c() }(l.dev.Close)
		l.dev = nil
	}
	was := l.degraded
	l.degraded = true
	if !was {
		l.backoff = l.opts.RetryMin
	} else {
		l.backoff = min(2*l.backoff, l.opts.RetryMax)
	}
	l.syncAt = time.Now().Add(l.backoff)
	if was {
		l.log.Warn("redo log still unavailable", "err", err, "retry_in", l.backoff)
		return
	}
	l.log.Error("redo log degraded: database writes are not being persisted", "err", err, "retry_in", l.backoff)
	if l.opts.OnAlert != nil {
		l.opts.OnAlert(Alert{Healthy: false, Err: err, Time: time.Now()})
	}
}

// recovered marks the log healthy after a database record was written.
func (l *Log) recovered() {
	was := l.degraded
	l.degraded = false
	l.backoff = 0
	l.lastErr = nil
	if !l.healthy.Swap(true) {
		if was {
			l.log.Info("redo log recovered", "generation", l.durable)
			if l.opts.OnAlert != nil {
				l.opts.OnAlert(Alert{Healthy: true, Time: time.Now()})
			}
		} else {
			l.log.Info("redo log in use", "generation", l.durable)
		}
	}
}
