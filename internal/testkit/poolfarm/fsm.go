package poolfarm

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// discardFSM is a light host's state machine: it applies nothing (the
// entries arrive and are acknowledged; nobody reads them), snapshots
// nothing, and restores a snapshot by reading it to the end.
type discardFSM struct{}

func (discardFSM) Apply(*raft.Log) any { return nil }

func (discardFSM) Snapshot() (raft.FSMSnapshot, error) { return emptySnapshot{}, nil }

func (discardFSM) Restore(rc io.ReadCloser) error {
	_, err := io.Copy(io.Discard, rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return err
}

type emptySnapshot struct{}

func (emptySnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (emptySnapshot) Release()                             {}

// discardSnapshots is a light host's raft.SnapshotStore: it keeps the
// newest snapshot's metadata only. A snapshot installed by the leader is
// counted as it arrives (Host.SnapshotBytes) and dropped, so Open gives
// its metadata and an empty body; raft then restores discardFSM from it.
// The memory a light host holds is so independent of the pool's database.
type discardSnapshots struct {
	host *Host
	mu   sync.Mutex
	last *raft.SnapshotMeta
}

var errNoSnapshot = errors.New("poolfarm: no such snapshot")

func (s *discardSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, _ raft.Transport) (raft.SnapshotSink, error) {
	meta := &raft.SnapshotMeta{Version: version, ID: fmt.Sprintf("%d-%d", term, index), Index: index, Term: term,
		Configuration: conf, ConfigurationIndex: confIndex}
	return &discardSink{store: s, meta: meta}, nil
}

func (s *discardSnapshots) List() ([]*raft.SnapshotMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		return nil, nil
	}
	m := *s.last
	return []*raft.SnapshotMeta{&m}, nil
}

func (s *discardSnapshots) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil || s.last.ID != id {
		return nil, nil, fmt.Errorf("%w: %q", errNoSnapshot, id)
	}
	m := *s.last
	m.Size = 0 // the body was not kept
	return &m, io.NopCloser(eofReader{}), nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// discardSink counts a snapshot's bytes and keeps its metadata on Close.
type discardSink struct {
	store *discardSnapshots
	meta  *raft.SnapshotMeta
	n     int64
}

func (k *discardSink) Write(p []byte) (int, error) {
	k.n += int64(len(p))
	return len(p), nil
}

func (k *discardSink) Close() error {
	k.meta.Size = k.n
	k.store.host.SnapshotBytes.Add(k.n)
	k.store.mu.Lock()
	k.store.last = k.meta
	k.store.mu.Unlock()
	return nil
}

func (k *discardSink) ID() string    { return k.meta.ID }
func (k *discardSink) Cancel() error { return nil }
