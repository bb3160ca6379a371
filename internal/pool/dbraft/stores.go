package dbraft

import (
	"errors"
	"path/filepath"

	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
)

// logDirName is the directory under StartOptions.Dir holding raft's log.
const logDirName = "log"

// logOptions are the log's: segments of 16 MiB, each next one made
// ahead as a file of zeros (raftwal's "Zeroed segments"), so that a sync
// of an append commits no file system journal. 16 MiB bounds the spare
// each host keeps on disk and writes once per 16 MiB of log.
var logOptions = raftwal.Options{SegmentBytes: 16 << 20, ZeroSegments: true}

// logCacheEntries is how many of the newest entries raft reads from
// memory (raft.LogCache) instead of the log's files: the leader reads
// each entry once per follower to send it, and every host once more to
// apply it, each read otherwise a pread, a checksum and a decode.
const logCacheEntries = 512

// logStores are raft's durable state on a host: the log in append-only
// segment files (raftwal: one sync an append), and the term, the vote
// and other small values in raftstore's bbolt file (raft.db), which
// changes only at elections.
//
// Hosts that ran an earlier toolstackd keep raft's log in raft.db too.
// openLogStores moves it: raftwal.Import copies it to the log directory
// (whole or not at all), and the entries are then deleted from raft.db.
// A crash between the two leaves the log directory in place, and the
// next start deletes the copies. An older toolstackd started afterwards
// would not see the moved log: going back is not supported.
type logStores struct {
	log    *raftwal.WAL
	stable *raftstore.Store
}

func openLogStores(dir string) (*logStores, error) {
	stable, err := raftstore.Open(dir, raftstore.Options{})
	if err != nil {
		return nil, err
	}
	s := &logStores{stable: stable}
	if err := s.openLog(filepath.Join(dir, logDirName)); err != nil {
		return nil, errors.Join(err, stable.Close())
	}
	return s, nil
}

func (s *logStores) openLog(dir string) error {
	if _, err := raftwal.Import(dir, s.stable, raftwal.Options{}); err != nil {
		return err
	}
	first, err := s.stable.FirstIndex()
	if err != nil {
		return err
	}
	if first != 0 {
		last, err := s.stable.LastIndex()
		if err != nil {
			return err
		}
		if err := s.stable.DeleteRange(first, last); err != nil {
			return err
		}
	}
	s.log, err = raftwal.Open(dir, logOptions)
	return err
}

func (s *logStores) Close() error {
	return errors.Join(s.log.Close(), s.stable.Close())
}

// leaderLog is the log raft runs on. On the leader, an append of
// commands is written and sent to the followers at once, and synced
// behind (raftwal's StoreLogsAsync): the leader's sync runs alongside
// the followers' instead of before them, which takes one sync off every
// replicated write's path. Anything else (a follower's append, the
// leader's no-op, barrier and configuration entries) is synced before
// StoreLogs returns, as raft expects.
//
// raft counts the leader's own copy toward a commit as soon as StoreLogs
// returns, so an entry may be "committed" before the leader's disk holds
// it. Two gates keep anything from acting on that: the FSM applies an
// entry only once this host's log has it on disk (fsm.ApplyBatch), and an
// append telling followers a commit index is sent only once the leader's
// disk holds it (raftnet.ConservativeGated). So a write is acknowledged,
// and applied anywhere, only once a quorum's disks hold it, the
// leader's among them, as when the leader synced first. A leader that
// loses power with entries not yet synced loses only entries no one
// applied or acknowledged; raft treats them as uncommitted.
type leaderLog struct {
	*raftwal.WAL
	leading func() bool
}

func (l leaderLog) StoreLog(log *raft.Log) error { return l.StoreLogs([]*raft.Log{log}) }

func (l leaderLog) StoreLogs(logs []*raft.Log) error {
	if !l.leading() {
		return l.WAL.StoreLogs(logs)
	}
	for _, e := range logs {
		if e.Type != raft.LogCommand {
			return l.WAL.StoreLogs(logs)
		}
	}
	return l.WAL.StoreLogsAsync(logs)
}
