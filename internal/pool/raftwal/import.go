package raftwal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"toolstackd/internal/atomicfile"
)

// importBatch is how many entries Import writes with one sync.
const importBatch = 4096

// Import makes dir a log holding every entry of src, unless dir already
// exists (it is then the log, whatever src holds) or src is empty. It
// reports whether it wrote a log.
//
// The entries are written to a directory beside dir (dir with ".import"
// added), synced, and that directory is renamed to dir: after a crash
// there is either no log at dir, and the next Import starts again, or
// all of src's entries. The caller deletes the entries from src after
// Import returns, not before.
func Import(dir string, src raft.LogStore, opts Options) (bool, error) {
	switch _, err := os.Stat(dir); {
	case err == nil:
		return false, nil
	case !errors.Is(err, os.ErrNotExist):
		return false, err
	}
	first, err := src.FirstIndex()
	if err != nil {
		return false, err
	}
	last, err := src.LastIndex()
	if err != nil {
		return false, err
	}
	if first == 0 || last < first {
		return false, nil
	}
	tmp := dir + ".import"
	if err := os.RemoveAll(tmp); err != nil {
		return false, err
	}
	w, err := Open(tmp, opts)
	if err != nil {
		return false, err
	}
	if err := copyLog(w, src, first, last); err != nil {
		_ = w.Close()
		return false, err
	}
	if err := w.Close(); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return false, err
	}
	return true, atomicfile.SyncDir(filepath.Dir(dir))
}

// copyLog stores src's entries first to last in w, a batch a sync.
func copyLog(w *WAL, src raft.LogStore, first, last uint64) error {
	batch := make([]*raft.Log, 0, importBatch)
	for i := first; i <= last; i++ {
		l := new(raft.Log)
		if err := src.GetLog(i, l); err != nil {
			return fmt.Errorf("raftwal: import entry %d of [%d, %d]: %w", i, first, last, err)
		}
		batch = append(batch, l)
		if len(batch) == importBatch || i == last {
			if err := w.StoreLogs(batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}
