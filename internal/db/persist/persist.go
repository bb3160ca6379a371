// Package persist keeps the database's persistent tables in a bbolt file
// under the data dir. It is the database's Persister: every committed
// batch is written before the API call that made it returns, and
// concurrent commits share one sync (group commit). At start-up it loads
// the file back and rebuilds what is derived.
//
// Layout: bucket "meta" holds the storage format, the datamodel schema
// version and the generation; one bucket per persistent class maps a ref
// to its row: created and modified generations, then (column, value)
// pairs in xapi's stored string form, for every persistent column whose
// value is not the column's default.
//
// A failed write (a full disk, an I/O error) is a condition, not the end:
// the commits in the failed group, and every commit queued behind them,
// fail and are undone in memory (db.DB.Abort), so that a client told
// "failed" never sees its change and one told "done" always finds it on
// disk. bbolt's handle is then distrusted: before the next write the file
// is closed and reopened, and its recorded generation compared with the last one written, so that a
// commit bbolt reported failed but which reached the file anyway is
// overwritten from memory. While writes keep failing the store touches the
// disk at most once per back-off interval (growing to MaxRetryInterval);
// writes in between fail at once with the last error, and commits that
// need no disk (sessions) go on. The first write after space returns and
// the back-off runs out succeeds, without a restart.
//
// # A file that follows another durable record
//
// In a pool the durable record is raft's log, and the file is the host's
// copy of what raft applied (SetSync(false)): it is written without fsync,
// and the pool releases writers as soon as raft has their change, before
// the file does. A write that fails then refuses nothing (the change is
// already acknowledged and lives in raft's log): the store keeps the group
// and tries it again after the back-off, until it succeeds or the store
// closes; a file left behind is brought forward from the log at the next
// start. Flush waits for the file to catch up with what was queued.
package persist

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// FormatVersion is the version of this package's on-disk layout.
const FormatVersion = 1

var (
	metaBucket = []byte("meta")
	keyFormat  = []byte("format")
	keyMajor   = []byte("schema_major")
	keyMinor   = []byte("schema_minor")
	keyGen     = []byte("generation")
	keyMark    = []byte("mark")
)

// Upgrade is one step of the schema upgrade framework: it runs on a file
// whose schema version is older than (Major, Minor), inside the opening
// transaction.
type Upgrade struct {
	Major, Minor int
	Name         string
	Apply        func(tx *bolt.Tx, m *schema.Model) error
}

// Options tune a store.
type Options struct {
	Log *slog.Logger
	// Upgrades run in order on files older than the model's schema.
	Upgrades []Upgrade
	// LockTimeout bounds the wait for another process holding the file.
	LockTimeout time.Duration
	// NoSync skips fsync (tests and benchmarks of the in-memory path only).
	NoSync bool
	// MaxSize caps the file (0: no cap); writes past it fail as on a full
	// disk.
	MaxSize int
	// MaxRetryInterval bounds the wait between attempts to write while
	// writes fail (default DefaultMaxRetryInterval).
	MaxRetryInterval time.Duration
	// Mark, if set, is asked in every write for a few bytes to record with
	// the generation the file reaches (nil: keep the last ones); Store.Mark
	// reads them back. The pool records there the raft index the file
	// holds, in the same transaction as the rows.
	Mark func(gen uint64) []byte
	// FollowLinger is how long a file that follows another durable
	// record (SetSync(false)) gathers changes before it writes them
	// (default DefaultFollowLinger; negative: not at all). One bbolt
	// transaction then carries every change made in that time, and a row
	// changed many times is encoded once. Nobody waits for these writes
	// (the record elsewhere released the writers); Flush, Close and
	// SetSync(true) cut the wait short; what the file lacks at a crash is
	// brought forward from the record at the next start.
	FollowLinger time.Duration
}

// Back-off between write attempts while the disk refuses writes: it
// starts at minRetryInterval and doubles up to Options.MaxRetryInterval.
const (
	minRetryInterval        = 10 * time.Millisecond
	DefaultMaxRetryInterval = 250 * time.Millisecond
	// backoffMemory: a failure this long after the previous one starts
	// the back-off afresh.
	backoffMemory = 10 * time.Second
	// DefaultFollowLinger is Options.FollowLinger's default: at most 50
	// writes a second of a file that follows raft's log.
	DefaultFollowLinger = 20 * time.Millisecond
)

// Store is an open database file.
type Store struct {
	model *schema.Model
	log   *slog.Logger
	d     *db.DB
	path  string
	bopts *bolt.Options
	mark  func(gen uint64) []byte
	// linger is Options.FollowLinger (0: none).
	linger time.Duration

	// fileMu is held for every use of the file.
	fileMu sync.Mutex
	bolt   *bolt.DB // nil when reopening it failed
	// suspect is set when a write transaction failed: bbolt's state, and
	// what reached the file, are then unknown until it is reopened.
	suspect bool
	// fileGen is the generation the file records as of the last write
	// known to have succeeded.
	fileGen uint64
	// following is set (under fileMu) while the file follows a durable
	// record kept elsewhere (SetSync(false)): failed writes are retried
	// instead of refused.
	following atomic.Bool

	// Owned by the commit loop: the error of the last failed write (nil
	// when writes succeed), the back-off, and when to try again.
	broken   error
	backoff  time.Duration
	retryAt  time.Time
	lastFail time.Time
	maxRetry time.Duration
	alertAt  time.Time // when the last ALERT was logged
	alerted  bool      // an ALERT was logged and no write succeeded since

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*db.Batch
	closing bool
	done    chan struct{}
	// queued counts the batches ever appended, handled those the loop
	// wrote, refused or dropped; flushed wakes Flush when handled grows.
	queued, handled uint64
	stopped         bool // the loop has returned
	flushed         *sync.Cond
	syncs           int // bbolt transactions written, for tests of group commit
	failures        int // failed write attempts, for tests
	// flushing counts the Flush calls waiting: the loop does not linger
	// while one waits. lastFollow is when the loop last wrote the file
	// as a follower (the loop's own); lingerGen numbers its lingers and
	// lingerWoke is the one whose time ran out.
	flushing              int
	lastFollow            time.Time
	lingerGen, lingerWoke uint64
	// Observers see every batch after it is on disk, in order (the redo
	// log uses this).
	observers []func(*db.Batch)
	timing    func(time.Duration) // sees each successful write transaction's duration
}

// Error is a store error that says what to do about it.
type Error struct {
	Path string
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("database %s: %s: %v", e.Path, e.Msg, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Open opens (or creates) the file at path for model m. A file written by
// a newer schema is refused; an older one is upgraded.
func Open(path string, m *schema.Model, opts Options) (s *Store, err error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.LockTimeout == 0 {
		opts.LockTimeout = 2 * time.Second
	}
	// bbolt panics on some corrupt files: turn that into an error. (The
	// freelist is synced to the file: without it bbolt rebuilds it by
	// scanning every page in a goroutine of its own, where a corrupt page
	// is a panic nobody can recover.)
	defer func() {
		if r := recover(); r != nil {
			err = &Error{path, "the file is corrupt (move it aside and restore from a dump or the redo log)", fmt.Errorf("%v", r)}
		}
	}()
	bopts := &bolt.Options{Timeout: opts.LockTimeout, NoSync: opts.NoSync,
		FreelistType: bolt.FreelistMapType, MaxSize: opts.MaxSize}
	b, err := bolt.Open(path, 0o600, bopts)
	if err != nil {
		msg := "cannot open"
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			msg = "another toolstackd holds it"
		case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
			msg = "the file is corrupt or truncated (move it aside and restore from a dump or the redo log)"
		case errors.Is(err, os.ErrPermission):
			msg = "no permission to write it (check the data dir's owner and mode)"
		case errors.Is(err, syscall.EROFS):
			msg = "the data dir is on a read-only file system (remount it read-write, or pick another --data-dir)"
		}
		return nil, &Error{path, msg, err}
	}
	if opts.MaxRetryInterval <= 0 {
		opts.MaxRetryInterval = DefaultMaxRetryInterval
	}
	switch {
	case opts.FollowLinger == 0:
		opts.FollowLinger = DefaultFollowLinger
	case opts.FollowLinger < 0:
		opts.FollowLinger = 0
	}
	s = &Store{bolt: b, model: m, log: opts.Log, path: path, bopts: bopts, maxRetry: opts.MaxRetryInterval,
		mark: opts.Mark, linger: opts.FollowLinger, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	s.flushed = sync.NewCond(&s.mu)
	if err := s.checkSchema(path, opts.Upgrades); err != nil {
		_ = b.Close() // the schema error is the one to report
		return nil, err
	}
	return s, nil
}

func itoa(n int) []byte { return []byte(strconv.Itoa(n)) }

func (s *Store) checkSchema(path string, upgrades []Upgrade) error {
	return s.bolt.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return &Error{path, "cannot write", err}
		}
		if meta.Get(keyFormat) == nil { // a new file
			for k, v := range map[string]int{string(keyFormat): FormatVersion, string(keyMajor): s.model.SchemaMajor, string(keyMinor): s.model.SchemaMinor} {
				if err := meta.Put([]byte(k), itoa(v)); err != nil {
					return &Error{path, "cannot write", err}
				}
			}
			return nil
		}
		format, _ := strconv.Atoi(string(meta.Get(keyFormat)))
		major, _ := strconv.Atoi(string(meta.Get(keyMajor)))
		minor, _ := strconv.Atoi(string(meta.Get(keyMinor)))
		if format > FormatVersion {
			return &Error{path, "written by a newer toolstackd (storage format " + strconv.Itoa(format) + "); run that version or restore a dump", errors.New("format too new")}
		}
		if newer(major, minor, s.model.SchemaMajor, s.model.SchemaMinor) {
			return &Error{path, fmt.Sprintf("written by a newer schema %d.%d than this toolstackd knows (%d.%d); run the newer version or restore a dump",
				major, minor, s.model.SchemaMajor, s.model.SchemaMinor), errors.New("schema too new")}
		}
		for _, u := range upgrades {
			if newer(u.Major, u.Minor, major, minor) {
				s.log.Info("upgrading database", "step", u.Name, "to", fmt.Sprintf("%d.%d", u.Major, u.Minor))
				if err := u.Apply(tx, s.model); err != nil {
					return &Error{path, "upgrade step " + u.Name + " failed", err}
				}
			}
		}
		if err := meta.Put(keyMajor, itoa(s.model.SchemaMajor)); err != nil {
			return &Error{path, "cannot write", err}
		}
		if err := meta.Put(keyMinor, itoa(s.model.SchemaMinor)); err != nil {
			return &Error{path, "cannot write", err}
		}
		return nil
	})
}

func newer(aMajor, aMinor, bMajor, bMinor int) bool {
	return aMajor > bMajor || aMajor == bMajor && aMinor > bMinor
}

// Empty reports whether the file holds no rows yet (a first boot).
func (s *Store) Empty() bool {
	empty := true
	if err := s.bolt.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if string(name) != string(metaBucket) && b.Stats().KeyN > 0 {
				empty = false
			}
			return nil
		})
	}); err != nil {
		// Not a first boot over a file that cannot be read: Load reports
		// the error.
		return false
	}
	return empty
}

// Load fills an empty database from the file and makes the store its
// persister. The database must have been made with Options.Persister set
// to this store.
func (s *Store) Load(d *db.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &Error{s.bolt.Path(), "the file is corrupt (move it aside and restore from a dump or the redo log)", fmt.Errorf("%v", r)}
		}
	}()
	s.d = d
	// Loading allocates a lot of long-lived memory at once: collecting
	// less often while it runs roughly halves the time.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	err = s.bolt.View(func(tx *bolt.Tx) error {
		gen := fileGeneration(tx)
		s.fileGen = gen
		return d.Load(gen, func(l *db.Loader) error {
			for _, c := range s.model.Classes {
				if !c.InDB || !c.Persist {
					continue
				}
				b := tx.Bucket([]byte(c.Name))
				if b == nil {
					continue
				}
				if err := b.ForEach(func(k, v []byte) error {
					created, modified, values, err := decodeRow(c, v)
					if err != nil {
						return &Error{s.bolt.Path(), fmt.Sprintf("row %s of %s is unreadable", k, c.Name), err}
					}
					return l.Row(c, string(k), created, modified, values)
				}); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	go s.run()
	return nil
}

// Observe registers fn to see every batch once it is durable.
func (s *Store) Observe(fn func(*db.Batch)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observers = append(s.observers, fn)
}

// ObserveCommits registers fn to see how long each successful write
// transaction took (a group of commits, fsync included); for metrics.
func (s *Store) ObserveCommits(fn func(time.Duration)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timing = fn
}

// Append queues a committed batch (db.Persister).
func (s *Store) Append(b *db.Batch) {
	s.mu.Lock()
	s.queue = append(s.queue, b)
	s.queued++
	s.mu.Unlock()
	s.cond.Signal()
}

// Flush waits until every batch appended before it has been written (or
// refused, on a file that does not follow another record), or the store
// closed. The pool calls it before it replaces the whole file, so that no
// earlier write lands on top.
func (s *Store) Flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	target := s.queued
	s.flushing++
	s.cond.Broadcast() // a lingering loop writes at once
	for s.handled < target && !s.stopped && s.d != nil {
		s.flushed.Wait()
	}
	s.flushing--
}

// run is the group-commit loop: it takes every queued batch, writes them
// in one bbolt transaction (one sync), and tells the database.
func (s *Store) run() {
	defer func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		s.flushed.Broadcast()
		close(s.done)
	}()
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		s.lingerLocked()
		group := s.queue
		s.queue = nil
		closing := s.closing
		s.mu.Unlock()
		if len(group) == 0 && closing {
			return
		}
		n := len(group)
		if s.following.Load() {
			n = s.follow(group)
			s.lastFollow = time.Now()
		} else {
			s.commit(group, closing)
		}
		s.mu.Lock()
		s.handled += uint64(n)
		s.mu.Unlock()
		s.flushed.Broadcast()
	}
}

// lingerLocked waits, under mu, until Options.FollowLinger has passed
// since the file was last written as a follower, so that the changes of
// that time go into one transaction. It waits only while the file
// follows another record, and not at all while a Flush waits or the
// store closes.
func (s *Store) lingerLocked() {
	wait := time.Until(s.lastFollow.Add(s.linger))
	if wait <= 0 || !s.following.Load() || s.flushing > 0 || s.closing {
		return
	}
	s.lingerGen++
	gen := s.lingerGen
	t := time.AfterFunc(wait, func() {
		s.mu.Lock()
		s.lingerWoke = gen
		s.mu.Unlock()
		s.cond.Broadcast()
	})
	for s.lingerWoke != gen && s.following.Load() && s.flushing == 0 && !s.closing {
		s.cond.Wait()
	}
	t.Stop()
}

// commit writes a group whose writers wait for it: on failure they, and
// every commit built on them, are refused.
func (s *Store) commit(group []*db.Batch, closing bool) {
	if s.broken != nil && !closing && time.Now().Before(s.retryAt) {
		// Writes are failing and the back-off has not run out: leave
		// the disk alone. Commits that need no disk (logins) go
		// through; the first that does fails at once, with every one
		// built on it.
		i := firstPersistent(group)
		if i > 0 {
			s.durable(group[:i])
		}
		if i < len(group) {
			s.refuse()
		}
		return
	}
	start := time.Now()
	if err := s.write(group); err != nil {
		s.writeFailed(err)
		return
	}
	s.mu.Lock()
	timing := s.timing
	s.mu.Unlock()
	if timing != nil {
		timing(time.Since(start))
	}
	s.wrote(group)
	s.durable(group)
}

// wrote notes a successful write after failures.
func (s *Store) wrote(group []*db.Batch) {
	if s.broken != nil && firstPersistent(group) < len(group) {
		if s.alerted {
			s.log.Warn("the database is writable again", "path", s.path, "after", s.broken)
			s.alerted = false
		}
		// The back-off is kept: on a nearly full disk writes that
		// fit in the file's free pages succeed between failures.
		s.broken = nil
	}
}

// follow writes a group while the file follows a durable record kept
// elsewhere: its changes are acknowledged already, so a failed write is
// tried again after the back-off, until it succeeds or the store closes
// (the file is then behind, and brought forward from the record at the
// next start). It returns how many queued batches it handled.
func (s *Store) follow(group []*db.Batch) int {
	n := len(group)
	for {
		if wait := time.Until(s.retryAt); s.broken != nil && wait > 0 {
			time.Sleep(wait)
		}
		err := s.write(group)
		if err == nil {
			s.wrote(group)
			s.durable(group)
			return n
		}
		if !s.following.Load() {
			// Sync came back on (raft stopped): the file is the record
			// again, and a failed write refuses as it does there.
			s.writeFailed(err)
			return n
		}
		s.noteFailure(err)
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			s.log.Error("ALERT: closing with the database file behind the pool's log; it is brought forward at the next start",
				"path", s.path, "err", err)
			return n
		}
		// Writers do not wait for the file, so while the disk refuses
		// writes the queue grows with every change: fold it into the
		// group, one change per row, so that what waits is bounded by
		// the rows changed rather than by the writes.
		var more int
		group, more = s.fold(group)
		n += more
	}
}

// fold merges a group and everything queued behind it into one batch
// holding the last change to each persistent row; it returns the batch
// and how many queued batches it took.
func (s *Store) fold(group []*db.Batch) ([]*db.Batch, int) {
	s.mu.Lock()
	queued := s.queue
	s.queue = nil
	s.mu.Unlock()
	all := append(group, queued...)
	last := db.LastPersistentChanges(all)
	merged := &db.Batch{From: all[0].From, To: all[len(all)-1].To, Changes: make([]db.Change, len(last))}
	for i, ch := range last {
		merged.Changes[i] = *ch
	}
	return []*db.Batch{merged}, len(queued)
}

// durable releases a group that is on disk (or needs no disk).
func (s *Store) durable(group []*db.Batch) {
	// Observers (the redo log) hear of the batches before their writers
	// are released, so that anything a client saw acknowledged is
	// already queued for them.
	s.mu.Lock()
	observers := s.observers
	s.mu.Unlock()
	for _, fn := range observers {
		for _, b := range group {
			fn(b)
		}
	}
	s.d.Durable(group[len(group)-1].To)
}

// refuse fails, without touching the disk, every commit not yet durable,
// with the error of the last failed write.
func (s *Store) refuse() {
	s.d.Abort(refusalOf(s.broken), s.dropQueue)
}

func (s *Store) dropQueue() {
	s.mu.Lock()
	s.handled += uint64(len(s.queue))
	clear(s.queue)
	s.queue = nil
	s.mu.Unlock()
	s.flushed.Broadcast()
}

// writeFailed fails the group that could not be written and every batch
// queued behind it (each was built on the failed ones), undoes them in
// memory, and sets the back-off before the next attempt.
func (s *Store) writeFailed(err error) {
	s.noteFailure(err)
	s.d.Abort(refusalOf(err), s.dropQueue)
}

// noteFailure logs a failed write (at most one ALERT per backoffMemory)
// and sets the back-off before the next attempt.
func (s *Store) noteFailure(err error) {
	s.mu.Lock()
	s.failures++
	s.mu.Unlock()
	now := time.Now()
	// At most one alert per backoffMemory, however often a nearly full
	// disk flips between taking and refusing writes.
	if now.Sub(s.alertAt) > backoffMemory {
		msg := "ALERT: the database cannot be written; the changes were refused and undone, and writes will be retried"
		if s.following.Load() {
			msg = "ALERT: the database file cannot be written; it falls behind the pool's log (nothing is lost), and the write will be retried"
		}
		s.log.Error(msg, "path", s.path, "err", err)
		s.alertAt, s.alerted = now, true
	} else {
		s.log.Debug("the database still cannot be written", "path", s.path, "err", err)
	}
	s.broken = err
	if s.backoff == 0 || now.Sub(s.lastFail) > backoffMemory {
		s.backoff = minRetryInterval
	} else {
		s.backoff = min(2*s.backoff, s.maxRetry)
	}
	s.lastFail = now
	s.retryAt = now.Add(s.backoff)
}

// firstPersistent is the index of the first batch of a group that changes
// a persistent table (others, such as sessions, never touch the file), or
// len(group).
func firstPersistent(group []*db.Batch) int {
	for n, b := range group {
		for i := range b.Changes {
			if b.Changes[i].Class.Persist {
				return n
			}
		}
	}
	return len(group)
}

// write stores a group of batches; it skips the sync when nothing in them
// is persistent (sessions, tasks).
func (s *Store) write(group []*db.Batch) error {
	changes := db.LastPersistentChanges(group)
	if len(changes) == 0 {
		return nil
	}
	gen := group[len(group)-1].To
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if err := s.reopen(); err != nil {
		return err
	}
	s.mu.Lock()
	s.syncs++
	s.mu.Unlock()
	return s.update(gen, func(tx *bolt.Tx) error {
		for _, ch := range changes {
			b, err := tx.CreateBucketIfNotExists([]byte(ch.Class.Name))
			if err != nil {
				return err
			}
			if ch.Op == db.OpDelete {
				if err := b.Delete([]byte(ch.Ref)); err != nil {
					return err
				}
				continue
			}
			if err := b.Put([]byte(ch.Ref), encodeRow(ch.Row)); err != nil {
				return err
			}
		}
		return nil
	})
}

// fileGeneration reads the generation a file records.
func fileGeneration(tx *bolt.Tx) uint64 {
	var gen uint64
	if meta := tx.Bucket(metaBucket); meta != nil {
		gen, _ = strconv.ParseUint(string(meta.Get(keyGen)), 10, 64)
	}
	return gen
}

// update runs one write transaction that brings the file to generation
// gen. A failure, or a panic inside bbolt, leaves the file suspect. It
// runs under fileMu.
func (s *Store) update(gen uint64, fn func(tx *bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("bbolt panicked: %v", r)
		}
		if err != nil {
			s.suspect = true
			err = s.describe(err)
			return
		}
		s.fileGen = gen
	}()
	return s.bolt.Update(func(tx *bolt.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		meta := tx.Bucket(metaBucket)
		if s.mark != nil {
			if m := s.mark(gen); m != nil {
				if err := meta.Put(keyMark, m); err != nil {
					return err
				}
			}
		}
		return meta.Put(keyGen, []byte(strconv.FormatUint(gen, 10)))
	})
}

// SetSync turns fsync after each write on or off. The pool turns it off
// while raft runs: raft's log is then the durable record, and a file that
// lost its last writes (a power cut, or a process that stopped before the
// file caught up) is brought forward from it; failed writes are then tried
// again instead of refused (see the package documentation). Turning it
// back on syncs what was written.
func (s *Store) SetSync(on bool) error {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	// Under mu, so that a loop lingering as a follower (lingerLocked)
	// sees the change or is woken by the Broadcast.
	s.mu.Lock()
	s.following.Store(!on)
	s.mu.Unlock()
	s.cond.Broadcast()
	s.bopts.NoSync = !on
	if s.bolt == nil {
		return nil
	}
	s.bolt.NoSync = !on
	if on {
		return s.bolt.Sync()
	}
	return nil
}

// Mark returns the bytes Options.Mark gave for the last write (nil if
// none).
func (s *Store) Mark() ([]byte, error) {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if err := s.reopen(); err != nil {
		return nil, err
	}
	var m []byte
	err := s.bolt.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(metaBucket); meta != nil {
			m = bytes.Clone(meta.Get(keyMark))
		}
		return nil
	})
	return m, err
}

// describe says what a write error means for the operator and the client.
func (s *Store) describe(err error) error {
	msg := "cannot write"
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		msg = "the disk holding the database is full; free space on the data dir's file system and writes resume by themselves"
	case errors.Is(err, berrors.ErrMaxSizeReached):
		msg = "the database file reached its size limit; writes resume once rows are removed or the limit is raised"
	case errors.Is(err, syscall.EIO):
		msg = "an I/O error (check the disk); writes are retried"
	case errors.Is(err, syscall.EROFS):
		msg = "the data dir's file system is read-only (remount it read-write); writes are retried"
	}
	return &Error{s.path, msg, err}
}

// refusal is what the writers of a failed commit are told: what happened
// and what to do, without the host's paths (the log has them).
type refusal struct{ err *Error }

func (r *refusal) Error() string {
	cause := r.err.Err
	var pe *os.PathError
	var se *os.SyscallError
	switch {
	case errors.As(cause, &pe):
		cause = pe.Err
	case errors.As(cause, &se):
		cause = se.Err
	}
	return r.err.Msg + ": " + cause.Error()
}

func (r *refusal) Unwrap() error { return r.err }

func refusalOf(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return &refusal{e}
	}
	return err
}

// reopen makes a suspect file usable again: it closes and reopens it, so
// that bbolt forgets whatever a failed write left in its memory, and if
// the file's generation is not the last one written (a commit reached the
// file although bbolt reported it failed, and the database undid it), it
// rewrites the file from the database's current, durable state. It runs
// under fileMu.
func (s *Store) reopen() error {
	if !s.suspect {
		return nil
	}
	if s.bolt != nil {
		_ = s.bolt.Close() // already suspect: reopening is the check that counts
		s.bolt = nil
	}
	b, err := s.openBolt()
	if err != nil {
		return s.describe(err)
	}
	s.bolt = b
	var gen uint64
	if err := b.View(func(tx *bolt.Tx) error { gen = fileGeneration(tx); return nil }); err != nil {
		return s.describe(err)
	}
	if gen != s.fileGen && s.following.Load() {
		// The failed group is written again whole: nothing to undo.
		s.fileGen = gen
	} else if gen != s.fileGen {
		if s.d == nil {
			return &Error{s.path, "the file changed under a failed write", fmt.Errorf("generation %d, want %d", gen, s.fileGen)}
		}
		snap := s.d.Snapshot()
		s.log.Warn("a write reported failed reached the database file; rewriting it from memory",
			"path", s.path, "file_generation", gen, "want", s.fileGen, "rewrite_at", snap.Generation())
		if err := s.replaceAll(snap); err != nil {
			return err
		}
	}
	s.suspect = false
	return nil
}

func (s *Store) openBolt() (b *bolt.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the file is corrupt: %v", r)
		}
	}()
	return bolt.Open(s.path, 0o600, s.bopts)
}

// Syncs is how many write transactions the store has made.
func (s *Store) Syncs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncs
}

// Failures is how many write attempts have failed.
func (s *Store) Failures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failures
}

// Close stops the commit loop once the queue is written, and closes the
// file.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.cond.Broadcast()
	if s.d != nil {
		<-s.done
	}
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if s.bolt == nil {
		return nil
	}
	err := s.bolt.Close()
	s.bolt = nil
	return err
}

// ReplaceAll rewrites every persistent table from a snapshot in one
// transaction (used when a whole database is restored).
func (s *Store) ReplaceAll(snap *db.Snapshot) error {
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	if err := s.reopen(); err != nil {
		return err
	}
	return s.replaceAll(snap)
}

// replaceAll runs under fileMu with the file open.
func (s *Store) replaceAll(snap *db.Snapshot) error {
	s.mu.Lock()
	s.syncs++
	s.mu.Unlock()
	return s.update(snap.Generation(), func(tx *bolt.Tx) error {
		for _, c := range s.model.Classes {
			if !c.InDB || !c.Persist {
				continue
			}
			if tx.Bucket([]byte(c.Name)) != nil {
				if err := tx.DeleteBucket([]byte(c.Name)); err != nil {
					return err
				}
			}
			b, err := tx.CreateBucket([]byte(c.Name))
			if err != nil {
				return err
			}
			var perr error
			snap.Ascend(c, func(r *db.Row) bool {
				perr = b.Put([]byte(r.Ref), encodeRow(r))
				return perr == nil
			})
			if perr != nil {
				return perr
			}
		}
		return nil
	})
}

// encodeRow: created, modified (uvarint), then (column, value) pairs of
// the persistent columns that differ from their default, each as a
// uvarint length and bytes.
func encodeRow(r *db.Row) []byte {
	buf := make([]byte, 0, 256)
	buf = binary.AppendUvarint(buf, r.Created)
	buf = binary.AppendUvarint(buf, r.Modified)
	c := r.Class
	for _, f := range c.Fields {
		if !f.Persist || f.Derived {
			continue
		}
		v := r.At(f.Index)
		if schema.Equal(v, c.Base[f.Index]) {
			continue
		}
		buf = appendString(buf, f.Column)
		buf = appendString(buf, schema.FormatExact(f.Type, v))
	}
	return buf
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

var errTruncated = errors.New("truncated row")

func decodeRow(c *schema.Class, b []byte) (created, modified uint64, values []any, err error) {
	var n int
	if created, n = binary.Uvarint(b); n <= 0 {
		return 0, 0, nil, errTruncated
	}
	b = b[n:]
	if modified, n = binary.Uvarint(b); n <= 0 {
		return 0, 0, nil, errTruncated
	}
	b = b[n:]
	values = make([]any, len(c.Fields))
	for len(b) > 0 {
		var col, val string
		if col, b, err = readString(b); err != nil {
			return
		}
		if val, b, err = readString(b); err != nil {
			return
		}
		f := c.Field(col)
		if f == nil {
			return 0, 0, nil, fmt.Errorf("unknown column %q", col)
		}
		if !f.Persist || f.Derived {
			// Never written (encodeRow): a file that has one was not
			// written by this code, and such a column is the running
			// daemon's to fill in, not the file's.
			continue
		}
		v, perr := schema.ParseExact(f.Type, val)
		if perr != nil {
			return 0, 0, nil, fmt.Errorf("column %s: %w", col, perr)
		}
		values[f.Index] = v
	}
	return created, modified, values, nil
}

func readString(b []byte) (string, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return "", nil, errTruncated
	}
	return string(b[k : k+int(n)]), b[k+int(n):], nil
}
