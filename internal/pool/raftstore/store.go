// Package raftstore keeps a raft node's log and its small durable state
// (current term, last vote) in one bbolt file of its own, for
// github.com/hashicorp/raft: a *Store is both a raft.LogStore and a
// raft.StableStore. Snapshots are not kept here; raft's own
// raft.NewFileSnapshotStore serves for them.
//
// The daemon uses it as raft's StableStore only; its log is in
// internal/pool/raftwal, which syncs once an append where a bbolt commit
// syncs twice. Files written before the log moved still hold entries
// here: internal/pool/dbraft moves them to raftwal at start.
//
// # Durability
//
// Every write is one bbolt transaction, and bbolt syncs the file before a
// transaction's commit returns: when StoreLog, StoreLogs, DeleteRange, Set
// or SetUint64 returns nil, the change survives a crash of the process or
// the machine. StoreLogs writes all of its entries in a single transaction
// (one sync for the batch), so after a crash either all of a batch is
// there or none of it; a log written by a sequence of StoreLogs calls is
// therefore always a prefix of what was written, without holes.
//
// # The file
//
// The file is named raft.db in the directory given to Open. It holds three
// buckets: "meta" (the format version), "logs" (entries keyed by their
// index as 8 big-endian bytes, so bbolt's order is index order and
// FirstIndex and LastIndex are one cursor step each) and "stable" (raft's
// keys and values as given).
//
// Entries are in a compact binary form of our own (see encodeLog): a
// format version byte, every field of raft.Log including AppendedAt and
// Extensions, and a CRC-32C. Reading an entry checks the checksum, the
// version, every length against the bytes present and that the stored
// index is the key it was found under; damage is reported as an error
// wrapping ErrCorrupt, never a panic.
//
// A second Open of the same file waits at most Options.LockTimeout for the
// first to close it and then fails, instead of hanging.
package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"toolstackd/internal/safepath"
)

// FileName is the name of the store's file inside its directory.
const FileName = "raft.db"

// storeFormat is the value of meta/format: the layout of the buckets.
const storeFormat = 1

var (
	bucketMeta   = []byte("meta")
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
	keyFormat    = []byte("format")
)

// ErrKeyNotFound is returned by Get and GetUint64 for a key never set. Its
// text is "not found", which is what hashicorp/raft compares against when
// it reads its state on first start.
var ErrKeyNotFound = errors.New("not found")

// Options tune Open. The zero value is what the daemon uses.
type Options struct {
	// LockTimeout bounds the wait for another opener of the file to close
	// it (default 5 s).
	LockTimeout time.Duration
	// NoSync skips the sync at each commit. Only for benchmarks comparing
	// against the synced figures; a store opened so loses writes on a
	// machine crash.
	NoSync bool
}

// Store is a raft.LogStore and raft.StableStore on a bbolt file. It is safe
// for concurrent use.
type Store struct {
	db   *bolt.DB
	path string
}

var (
	_ raft.LogStore    = (*Store)(nil)
	_ raft.StableStore = (*Store)(nil)
)

// Open opens (creating it if needed) the store file in dir.
func Open(dir string, opts Options) (*Store, error) {
	path, err := safepath.JoinName(dir, FileName)
	if err != nil {
		return nil, err
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 5 * time.Second
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: opts.LockTimeout,
		NoSync:  opts.NoSync,
	})
	if err != nil {
		return nil, fmt.Errorf("raftstore: open %s: %w", path, err)
	}
	s := &Store{db: db, path: path}
	if err := s.init(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) init() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyFormat); v != nil {
			if len(v) != 8 {
				return fmt.Errorf("raftstore: %s: bad format marker", s.path)
			}
			if f := binary.BigEndian.Uint64(v); f != storeFormat {
				return fmt.Errorf("raftstore: %s: unknown store format %d", s.path, f)
			}
		} else if err := meta.Put(keyFormat, binary.BigEndian.AppendUint64(nil, storeFormat)); err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bucketLogs); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketStable)
		return err
	})
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Close closes the file. Calls after Close fail.
func (s *Store) Close() error { return s.db.Close() }

func indexKey(i uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), i) }

func keyIndex(k []byte) (uint64, error) {
	if len(k) != 8 {
		return 0, fmt.Errorf("%w: log key of %d bytes", ErrCorrupt, len(k))
	}
	return binary.BigEndian.Uint64(k), nil
}

// FirstIndex returns the lowest index stored, 0 when the log is empty.
func (s *Store) FirstIndex() (uint64, error) {
	return s.edgeIndex(func(c *bolt.Cursor) ([]byte, []byte) { return c.First() })
}

// LastIndex returns the highest index stored, 0 when the log is empty.
func (s *Store) LastIndex() (uint64, error) {
	return s.edgeIndex(func(c *bolt.Cursor) ([]byte, []byte) { return c.Last() })
}

// edgeIndex reads the index of the entry a cursor move lands on.
func (s *Store) edgeIndex(move func(*bolt.Cursor) ([]byte, []byte)) (uint64, error) {
	var idx uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		k, _ := move(tx.Bucket(bucketLogs).Cursor())
		if k == nil {
			return nil
		}
		var err error
		idx, err = keyIndex(k)
		return err
	})
	return idx, err
}

// GetLog fills log with the entry at index, or returns raft.ErrLogNotFound.
func (s *Store) GetLog(index uint64, log *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(indexKey(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		var l raft.Log
		if err := decodeLog(v, &l); err != nil {
			return fmt.Errorf("raftstore: entry %d: %w", index, err)
		}
		if l.Index != index {
			return fmt.Errorf("raftstore: entry %d: %w: holds index %d", index, ErrCorrupt, l.Index)
		}
		*log = l
		return nil
	})
}

// StoreLog stores one entry.
func (s *Store) StoreLog(log *raft.Log) error { return s.StoreLogs([]*raft.Log{log}) }

// StoreLogs stores the entries in one transaction: all of them or, on
// error, none. An entry at an index already present replaces it.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	for i, l := range logs {
		if l == nil {
			return fmt.Errorf("raftstore: StoreLogs: entry %d is nil", i)
		}
		if len(l.Data) > MaxEntryBytes || len(l.Extensions) > MaxEntryBytes {
			return fmt.Errorf("raftstore: StoreLogs: entry %d is larger than %d bytes", l.Index, MaxEntryBytes)
		}
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		for _, l := range logs {
			// bbolt keeps the value slice until the commit: each entry
			// needs its own buffer.
			v := encodeLog(make([]byte, 0, 32+len(l.Data)+len(l.Extensions)), l)
			if err := b.Put(indexKey(l.Index), v); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange deletes the entries with indexes min to max inclusive.
func (s *Store) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		maxKey := indexKey(max)
		// Collect first, then delete: deleting under a live cursor is
		// easy to get wrong in bbolt.
		var keys [][]byte
		c := b.Cursor()
		for k, _ := c.Seek(indexKey(min)); k != nil && bytes.Compare(k, maxKey) <= 0; k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set stores val under key.
func (s *Store) Set(key, val []byte) error {
	if len(key) == 0 {
		return errors.New("raftstore: empty stable key")
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketStable).Put(bytes.Clone(key), bytes.Clone(val))
	})
}

// Get returns the value stored under key, or ErrKeyNotFound.
func (s *Store) Get(key []byte) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketStable).Get(key)
		if v == nil {
			return ErrKeyNotFound
		}
		out = bytes.Clone(v)
		if out == nil {
			out = []byte{}
		}
		return nil
	})
	return out, err
}

// SetUint64 stores val under key as 8 big-endian bytes.
func (s *Store) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 returns the number stored under key by SetUint64, or
// ErrKeyNotFound.
func (s *Store) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raftstore: stable key %q holds %d bytes, not a uint64", key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}
