package persist

import (
	"sync"
	"time"
)

// Progress is the commit loop's counters, for the daemon's watchdog:
// batches queued since the store opened and batches written, refused or
// dropped. The loop is stuck when queued stays ahead of a handled that
// does not move.
func (s *Store) Progress() (queued, handled uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued, s.handled
}

// MaxFreeze bounds Freeze.
const MaxFreeze = 10 * time.Minute

// Freeze holds the file for d (at most MaxFreeze), so that the commit
// loop blocks at its next write as on a hung disk; thaw ends it early. It
// is a debug hook, for the test of the watchdog: writers wait until the
// file is released.
func (s *Store) Freeze(d time.Duration) (thaw func()) {
	d = min(d, MaxFreeze)
	s.fileMu.Lock()
	var once sync.Once
	thaw = func() { once.Do(s.fileMu.Unlock) }
	time.AfterFunc(d, thaw)
	return thaw
}
