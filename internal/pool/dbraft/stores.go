package dbraft

import (
	"errors"
	"path/filepath"

	"toolstackd/internal/pool/raftstore"
	"toolstackd/internal/pool/raftwal"
)

// logDirName is the directory under StartOptions.Dir holding raft's log.
const logDirName = "log"

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
	s.log, err = raftwal.Open(dir, raftwal.Options{})
	return err
}

func (s *logStores) Close() error {
	return errors.Join(s.log.Close(), s.stable.Close())
}
