package raftwal

import (
	"errors"
	"os"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/safepath"
)

// spareName is the next segment while it is being prepared: it does not
// end in segmentSuffix, so Open never reads it as part of the log (and
// removes it).
const spareName = "spare.zero"

// zeroChunk is how much of a spare is written at a time.
const zeroChunk = 1 << 20

// Zeroed segments (Options.ZeroSegments)
//
// An fdatasync after an append to space reserved by fallocate must also
// commit the file system's journal: ext4 records that the blocks written
// no longer read as zeros. Into blocks that already hold written zeros
// the same append changes no metadata, and the sync is the data and a
// cache flush alone (PostgreSQL zero-fills its WAL segments for the same
// reason). With ZeroSegments a goroutine of the log's own keeps a spare:
// a file of SegmentBytes zeros, written and synced off the writer's path.
// When the next append does not fit in the zeroed part of the current
// segment, and a spare is ready, the spare becomes the next segment
// (renamed, the directory synced): so within moments of Open the log is
// appended to zeroed space, even when it began in a segment that was
// not. When no spare is ready, the log does what it does without them.

// spare is a prepared segment file.
type spare struct {
	f    *os.File
	path string
	size int64
}

// prepareStep is the preparer's step: it makes a spare when there is
// none. A spare that cannot be made (a full disk) is tried again at the
// next kick: each new segment kicks.
func (w *WAL) prepareStep(stop <-chan struct{}) {
	w.mu.RLock()
	need := w.spare == nil && w.failed == nil
	w.mu.RUnlock()
	if !need {
		return
	}
	sp, err := makeSpare(w.dir, w.opts.SegmentBytes, !w.opts.NoSync, stop)
	if err != nil {
		return
	}
	w.mu.Lock()
	if w.spare == nil && w.preparer != nil {
		w.spare, sp = sp, nil
	}
	w.mu.Unlock()
	if sp != nil {
		sp.discard() // the log is closing
	}
}

// makeSpare writes a file of size zeros in dir and syncs it (unless
// told not to). It gives up early when stop is closed.
func makeSpare(dir string, size int64, sync bool, stop <-chan struct{}) (*spare, error) {
	path, err := safepath.JoinName(dir, spareName)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600) //nolint:gosec // the path is under the log's directory (safepath)
	if err != nil {
		return nil, err
	}
	sp := &spare{f: f, path: path, size: size}
	zero := make([]byte, min(size, zeroChunk))
	for off := int64(0); off < size; off += int64(len(zero)) {
		select {
		case <-stop:
			sp.discard()
			return nil, errors.New("raftwal: closing")
		default:
		}
		if _, err := f.WriteAt(zero[:min(int64(len(zero)), size-off)], off); err != nil {
			sp.discard()
			return nil, err
		}
	}
	if sync {
		if err := fdatasync(f); err != nil {
			sp.discard()
			return nil, err
		}
	}
	return sp, nil
}

// discard closes and removes a spare that will not be used.
func (sp *spare) discard() {
	_ = sp.f.Close()
	_ = os.Remove(sp.path)
}

// useSpare makes the spare the segment at path, if one is ready: renamed
// into place and the directory synced. It returns nil, and no error,
// when there is no spare to use (the caller makes an empty file). It
// runs under mu.
func (w *WAL) useSpare(first uint64, path string) (*segment, error) {
	sp := w.spare
	if sp == nil {
		return nil, nil
	}
	w.spare = nil
	if err := os.Rename(sp.path, path); err != nil {
		sp.discard()
		return nil, nil //nolint:nilerr // no spare after all: the caller makes the segment as without one
	}
	if err := atomicfile.SyncDir(w.dir); err != nil {
		_ = sp.f.Close()
		return nil, err
	}
	w.preparer.kick() // the next one (none: the log is closing)
	return &segment{first: first, path: path, f: sp.f, alloc: sp.size, zeroed: sp.size}, nil
}

// stopPreparer ends the preparer, if it runs, and removes its spare; not
// under mu.
func (w *WAL) stopPreparer() {
	w.mu.Lock()
	p := w.preparer
	w.preparer = nil
	w.mu.Unlock()
	if p == nil {
		return
	}
	p.halt()
	w.mu.Lock()
	sp := w.spare
	w.spare = nil
	w.mu.Unlock()
	if sp != nil {
		sp.discard()
	}
}

// removeStaleSpare removes a spare left by a process that stopped while
// it was being made or before it was used.
func removeStaleSpare(dir string) error {
	path, err := safepath.JoinName(dir, spareName)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
