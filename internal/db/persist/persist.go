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
package persist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

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
}

// Store is an open database file.
type Store struct {
	bolt  *bolt.DB
	model *schema.Model
	log   *slog.Logger
	d     *db.DB

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*db.Batch
	closing bool
	failed  error
	done    chan struct{}
	syncs   int // bbolt transactions written, for tests of group commit
	// Observers see every batch after it is on disk, in order (the redo
	// log uses this).
	observers []func(*db.Batch)
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
	b, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, NoSync: opts.NoSync,
		FreelistType: bolt.FreelistMapType, MaxSize: opts.MaxSize})
	if err != nil {
		msg := "cannot open"
		switch {
		case errors.Is(err, bolt.ErrTimeout):
			msg = "another toolstackd holds it"
		case errors.Is(err, bolt.ErrInvalid), errors.Is(err, bolt.ErrChecksum), errors.Is(err, bolt.ErrVersionMismatch):
			msg = "the file is corrupt or truncated (move it aside and restore from a dump or the redo log)"
		case errors.Is(err, os.ErrPermission):
			msg = "no permission to write it (check the data dir's owner and mode)"
		case errors.Is(err, syscall.EROFS):
			msg = "the data dir is on a read-only file system (remount it read-write, or pick another --data-dir)"
		}
		return nil, &Error{path, msg, err}
	}
	s = &Store{bolt: b, model: m, log: opts.Log, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	if err := s.checkSchema(path, opts.Upgrades); err != nil {
		b.Close()
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
			meta.Put(keyFormat, itoa(FormatVersion))
			meta.Put(keyMajor, itoa(s.model.SchemaMajor))
			meta.Put(keyMinor, itoa(s.model.SchemaMinor))
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
		meta.Put(keyMajor, itoa(s.model.SchemaMajor))
		meta.Put(keyMinor, itoa(s.model.SchemaMinor))
		return nil
	})
}

func newer(aMajor, aMinor, bMajor, bMinor int) bool {
	return aMajor > bMajor || aMajor == bMajor && aMinor > bMinor
}

// Empty reports whether the file holds no rows yet (a first boot).
func (s *Store) Empty() bool {
	empty := true
	s.bolt.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if string(name) != string(metaBucket) && b.Stats().KeyN > 0 {
				empty = false
			}
			return nil
		})
	})
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
		var gen uint64
		if meta := tx.Bucket(metaBucket); meta != nil {
			gen, _ = strconv.ParseUint(string(meta.Get(keyGen)), 10, 64)
		}
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

// Append queues a committed batch (db.Persister).
func (s *Store) Append(b *db.Batch) {
	s.mu.Lock()
	s.queue = append(s.queue, b)
	s.mu.Unlock()
	s.cond.Signal()
}

// run is the group-commit loop: it takes every queued batch, writes them
// in one bbolt transaction (one sync), and tells the database.
func (s *Store) run() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		group := s.queue
		s.queue = nil
		closing, failed := s.closing, s.failed
		observers := s.observers
		s.mu.Unlock()
		if len(group) == 0 && closing {
			return
		}
		last := group[len(group)-1].To
		if failed != nil {
			s.d.Fail(failed)
			continue
		}
		if err := s.write(group); err != nil {
			s.log.Error("ALERT: the database can no longer be written; writes are refused until toolstackd restarts",
				"path", s.bolt.Path(), "err", err)
			s.mu.Lock()
			s.failed = err
			s.mu.Unlock()
			s.d.Fail(err)
			continue
		}
		// Observers (the redo log) hear of the batches before their writers
		// are released, so that anything a client saw acknowledged is
		// already queued for them.
		for _, fn := range observers {
			for _, b := range group {
				fn(b)
			}
		}
		s.d.Durable(last)
	}
}

type rowKey struct {
	c   *schema.Class
	ref string
}

// write stores a group of batches; it skips the sync when nothing in them
// is persistent (sessions, tasks).
func (s *Store) write(group []*db.Batch) error {
	latest := map[rowKey]*db.Change{}
	var order []rowKey
	for _, b := range group {
		for i := range b.Changes {
			ch := &b.Changes[i]
			if !ch.Class.Persist {
				continue
			}
			k := rowKey{ch.Class, ch.Ref}
			if _, seen := latest[k]; !seen {
				order = append(order, k)
			}
			latest[k] = ch
		}
	}
	if len(order) == 0 {
		return nil
	}
	gen := group[len(group)-1].To
	s.mu.Lock()
	s.syncs++
	s.mu.Unlock()
	return s.bolt.Update(func(tx *bolt.Tx) error {
		for _, k := range order {
			ch := latest[k]
			b, err := tx.CreateBucketIfNotExists([]byte(k.c.Name))
			if err != nil {
				return err
			}
			if ch.Op == db.OpDelete {
				if err := b.Delete([]byte(k.ref)); err != nil {
					return err
				}
				continue
			}
			if err := b.Put([]byte(k.ref), encodeRow(ch.Row)); err != nil {
				return err
			}
		}
		return tx.Bucket(metaBucket).Put(keyGen, []byte(strconv.FormatUint(gen, 10)))
	})
}

// Syncs is how many write transactions the store has made.
func (s *Store) Syncs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncs
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
	return s.bolt.Close()
}

// ReplaceAll rewrites every persistent table from a snapshot in one
// transaction (used when a whole database is restored).
func (s *Store) ReplaceAll(snap *db.Snapshot) error {
	s.mu.Lock()
	s.syncs++
	s.mu.Unlock()
	return s.bolt.Update(func(tx *bolt.Tx) error {
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
		return tx.Bucket(metaBucket).Put(keyGen, []byte(strconv.FormatUint(snap.Generation(), 10)))
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
		buf = appendString(buf, schema.FormatDB(f.Type, v))
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
		v, perr := schema.ParseDB(f.Type, val)
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
