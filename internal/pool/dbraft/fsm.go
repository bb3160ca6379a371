package dbraft

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/db"
	"toolstackd/internal/pool/replica"
)

// maxSnapshot bounds a snapshot read from a peer (the whole database).
const maxSnapshot = 4 << 30

// fsm is raft's view of the replicator.
type fsm struct {
	r *Replicator
	// durable, if set, is raft's log: an entry is applied only once it
	// is on this host's disk (see leaderLog).
	durable interface {
		WaitDurable(ctx context.Context, index uint64) error
	}
}

var _ raft.BatchingFSM = fsm{}

func (f fsm) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies committed entries in order. This leader's own
// entries are already in its database: they only settle their flights.
// Anyone else's are applied in one transaction per run of them.
func (f fsm) ApplyBatch(logs []*raft.Log) []any {
	r := f.r
	out := make([]any, len(logs))
	if f.durable != nil && len(logs) > 0 {
		// No deadline: these entries are committed and must be applied,
		// and the syncer always gets there (entries committed are never
		// deleted; Close syncs). Only a failed log ends the wait early.
		if err := f.durable.WaitDurable(context.Background(), logs[len(logs)-1].Index); err != nil {
			f.refuse(logs, out, err)
			return out
		}
	}
	var run [][]replica.Row
	var runIndex uint64
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		r.mu.Lock()
		if l.Index <= r.appliedIndex {
			r.mu.Unlock()
			continue // the file already holds it (a replay after restart)
		}
		if own := r.ownFlight(l.Extensions); own != nil {
			r.mu.Unlock()
			f.applyRun(run, runIndex)
			run = nil
			r.mu.Lock()
			r.settleLocked(own, l.Index, nil)
			r.advance(l.Index, own.lastGen())
			r.mu.Unlock()
			continue
		}
		r.mu.Unlock()
		rows, err := replica.Decode(r.opts.Model, l.Data)
		if err != nil {
			// A committed entry this host cannot read (a newer
			// coordinator's format): say so loudly; skipping it is the
			// only way on.
			r.log.Error("ALERT: a replicated database entry cannot be applied; this host's database may differ from the pool's",
				"index", l.Index, "err", err)
			out[i] = err
			continue
		}
		run = append(run, rows)
		runIndex = l.Index
	}
	f.applyRun(run, runIndex)
	return out
}

// refuse answers entries that cannot be applied because this host's
// log could not make them durable (its disk failed a sync): this
// leader's writers fail, and the host's database no longer follows the
// pool's until it restarts and replays its log.
func (f fsm) refuse(logs []*raft.Log, out []any, err error) {
	r := f.r
	r.log.Error("ALERT: raft's log could not be synced; committed entries are not applied here, restart this host",
		"from", logs[0].Index, "to", logs[len(logs)-1].Index, "err", err)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, l := range logs {
		out[i] = err
		if own := r.ownFlight(l.Extensions); own != nil {
			r.settleLocked(own, l.Index, err)
		}
	}
}

// applyRun applies entries of others in one transaction tagged with the
// last one's index, retrying while an abort (of this host's own writes)
// gets in the way.
func (f fsm) applyRun(run [][]replica.Row, index uint64) {
	if len(run) == 0 {
		return
	}
	r := f.r
	for attempt := 0; ; attempt++ {
		gen, err := r.d.Update(func(tx *db.Tx) error {
			tx.Tag = applied{index}
			for _, rows := range run {
				if err := replica.ApplyTx(tx, rows); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			r.mu.Lock()
			r.advance(index, gen)
			r.mu.Unlock()
			return
		}
		if !errors.Is(err, db.ErrNotDurable) || attempt == 100 {
			r.log.Error("ALERT: replicated database entries could not be applied", "index", index, "err", err)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// advance records that raft index is applied, visible at generation gen.
// It runs under mu.
func (r *Replicator) advance(index, gen uint64) {
	if index <= r.appliedIndex {
		return
	}
	r.appliedIndex, r.appliedGen = index, max(r.appliedGen, gen)
	close(r.appliedCh)
	r.appliedCh = make(chan struct{})
}

// Snapshot captures the state at the last applied index, once what was
// applied is visible (on the leader, its own entries reach the file
// through the completer).
func (f fsm) Snapshot() (raft.FSMSnapshot, error) {
	r := f.r
	r.mu.Lock()
	index, gen := r.appliedIndex, r.appliedGen
	r.mu.Unlock()
	deadline := time.After(30 * time.Second)
	for {
		s := r.d.Snapshot()
		if s.Generation() >= gen {
			return &snapshot{index: index, state: replica.EncodeState(r.opts.Model, s)}, nil
		}
		select {
		case <-s.Done():
		case <-deadline:
			return nil, fmt.Errorf("dbraft: index %d not visible after 30s", index)
		}
	}
}

// Restore replaces the database with a snapshot from the leader.
func (f fsm) Restore(rc io.ReadCloser) error {
	r := f.r
	defer func() { _ = rc.Close() }()
	data, err := io.ReadAll(io.LimitReader(rc, maxSnapshot+1))
	if err != nil {
		return err
	}
	if len(data) > maxSnapshot {
		return fmt.Errorf("dbraft: snapshot over %d bytes", maxSnapshot)
	}
	index, n := binary.Uvarint(data)
	if n <= 0 {
		return fmt.Errorf("dbraft: snapshot without an index")
	}
	rows, err := replica.Decode(r.opts.Model, data[n:])
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.restore = index
	r.mu.Unlock()
	err = replica.Replace(r.d, rows)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restore = 0
	if err != nil {
		return err
	}
	r.appliedIndex = 0 // a snapshot may move a member back as well as on
	r.advance(index, r.d.Generation())
	return nil
}

// snapshot is a captured state: its index, then the state entry.
type snapshot struct {
	index uint64
	state []byte
}

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	var head [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(head[:], s.index)
	if _, err := io.Copy(sink, io.MultiReader(bytes.NewReader(head[:n]), bytes.NewReader(s.state))); err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
