package rafttest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// Entry is one command an FSM applied, in the order it applied them.
type Entry struct {
	Index uint64
	Term  uint64
	Key   string
	Value string
}

// FSM is a deterministic state machine for tests: a map of key to value
// changed by put commands (EncodePut). Apply returns the entry's raft
// index (a uint64), or an error for a command it cannot decode. It keeps
// the list of every entry it applied, so that the histories of the nodes
// can be compared.
type FSM struct {
	mu      sync.Mutex
	kv      map[string]string
	applied []Entry
}

// NewFSM returns an empty FSM.
func NewFSM() *FSM { return &FSM{kv: make(map[string]string)} }

// EncodePut is the command that sets key to value. A key may not contain
// a NUL byte.
func EncodePut(key, value string) []byte {
	b := make([]byte, 0, len(key)+1+len(value))
	b = append(b, key...)
	b = append(b, 0)
	return append(b, value...)
}

// ErrBadCommand is the Apply result for data that is not a put.
var ErrBadCommand = errors.New("rafttest: command is not a put")

// Apply implements raft.FSM.
func (f *FSM) Apply(l *raft.Log) any {
	k, v, ok := bytes.Cut(l.Data, []byte{0})
	if !ok || len(k) == 0 {
		return fmt.Errorf("%w (index %d)", ErrBadCommand, l.Index)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kv[string(k)] = string(v)
	f.applied = append(f.applied, Entry{Index: l.Index, Term: l.Term, Key: string(k), Value: string(v)})
	return l.Index
}

// Get returns the value of key.
func (f *FSM) Get(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.kv[key]
	return v, ok
}

// Len is the number of keys.
func (f *FSM) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.kv)
}

// Applied returns a copy of the entries applied so far.
func (f *FSM) Applied() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Entry(nil), f.applied...)
}

// LastApplied is the index of the last entry applied, 0 before any.
func (f *FSM) LastApplied() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return 0
	}
	return f.applied[len(f.applied)-1].Index
}

type fsmState struct {
	KV      map[string]string
	Applied []Entry
}

// Snapshot implements raft.FSM: the map and the applied history.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := fsmState{KV: make(map[string]string, len(f.kv)), Applied: append([]Entry(nil), f.applied...)}
	for k, v := range f.kv {
		st.KV[k] = v
	}
	return snapshot{st}, nil
}

// Restore implements raft.FSM.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer func() { _ = rc.Close() }()
	var st fsmState
	if err := json.NewDecoder(rc).Decode(&st); err != nil {
		return fmt.Errorf("rafttest: restore: %w", err)
	}
	if st.KV == nil {
		st.KV = make(map[string]string)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kv, f.applied = st.KV, st.Applied
	return nil
}

type snapshot struct{ st fsmState }

func (s snapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(s.st); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (snapshot) Release() {}
