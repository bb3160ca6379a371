package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"toolstackd/internal/xenops/backend"
)

// Live migration (backend.Migrator) between simulators. The domain's
// state (simState) is sent as JSON in the framed stream of
// backend.MigrateWriter, in migrateSteps pieces, each after a
// "migrate" micro-op (Config.Delays, SetFail): a test can make a
// migration slow, cancel it half-way or make it fail. The guest runs
// during the send and is paused at the end, as QEMU's is; the receiver
// checks the stream's framing, its size and that the state is the
// domain's it was made for. A domain made with Spec.Incoming that a
// restart finds is dropped: its state never arrived.

const (
	migrateSteps = 4
	// maxSimState bounds what ReceiveLive accepts (a real one is a few
	// hundred bytes).
	maxSimState = 1 << 20
)

var _ backend.Migrator = (*Simulator)(nil)

// simState is what a simulated guest's memory and devices amount to.
type simState struct {
	UUID      string
	VCPUs     int
	Memory    int64
	StartTime time.Time
	HotCPUs   []backend.CPUDevice
	// Pages stands in for the guest's memory: a checksum-like figure the
	// receiver must get back intact.
	Pages int64
}

// SendLive implements backend.Migrator.
func (s *Simulator) SendLive(ctx context.Context, uuid string, to io.Writer, o backend.MigrateOptions, progress func(float64)) error {
	s.mu.Lock()
	d, err := s.get(uuid)
	var st simState
	var wasRunning bool
	if err == nil {
		err = backend.RefuseStopped(d.Info.State, d.Spec.VMRef)
		if err == nil && (d.Info.Migrated || d.Spec.Incoming) {
			err = fmt.Errorf("simulator: domain %s is being migrated or has been", uuid)
		}
		st = simState{UUID: uuid, VCPUs: d.Info.VCPUs, Memory: d.Info.Memory, StartTime: d.Info.StartTime,
			HotCPUs: append([]backend.CPUDevice(nil), d.Spec.HotCPUs...), Pages: d.Info.Memory / 4096}
		wasRunning = d.Info.State == backend.DomainRunning
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	b, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	mw, err := backend.NewMigrateWriter(to, "simulator")
	if err != nil {
		return err
	}
	fail := func(err error) error {
		s.mu.Lock()
		if d := s.doms[uuid]; d != nil && wasRunning {
			d.Info.State = backend.DomainRunning
		}
		s.mu.Unlock()
		_ = mw.Abort(err.Error()) // best effort: the stream may be what failed
		return err
	}
	piece := (len(b) + migrateSteps - 1) / migrateSteps
	for i := range migrateSteps {
		if err := s.step(ctx, "migrate"); err != nil {
			return fail(err)
		}
		if i == migrateSteps-1 {
			// The last piece goes with the guest stopped, as QEMU's does.
			s.mu.Lock()
			if d := s.doms[uuid]; d != nil {
				d.Info.State = backend.DomainPaused
			}
			s.mu.Unlock()
			if o.BeforeSwitchover != nil {
				if err := o.BeforeSwitchover(ctx); err != nil {
					return fail(err)
				}
			}
		}
		lo, hi := min(i*piece, len(b)), min((i+1)*piece, len(b))
		if lo < hi {
			if _, err := mw.Write(b[lo:hi]); err != nil {
				return fail(err)
			}
		}
		if progress != nil {
			progress(float64(i+1) / migrateSteps)
		}
	}
	// As with QEMU, the domain is marked migrated before the end frame
	// can reach the destination.
	var snap []byte
	s.mu.Lock()
	if d := s.doms[uuid]; d != nil {
		d.Info.State, d.Info.Migrated = backend.DomainPaused, true
		snap = s.snapshotFile(d)
	}
	s.mu.Unlock()
	s.save(uuid, snap)
	if err := mw.End(); err != nil {
		s.mu.Lock()
		if d := s.doms[uuid]; d != nil {
			d.Info.Migrated = false
			snap = s.snapshotFile(d)
		}
		s.mu.Unlock()
		s.save(uuid, snap)
		return fail(err)
	}
	return nil
}

// ReceiveLive implements backend.Migrator.
func (s *Simulator) ReceiveLive(ctx context.Context, uuid string, from io.Reader) error {
	s.mu.Lock()
	d, err := s.get(uuid)
	if err == nil && !d.Spec.Incoming {
		err = fmt.Errorf("simulator: domain %s was not made for an incoming migration", uuid)
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	type result struct {
		b   []byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(backend.NewMigrateReader(from, "simulator"), maxSimState+1))
		got <- result{b, err}
	}()
	var r result
	select {
	case r = <-got:
	case <-ctx.Done():
		if backend.InterruptIO(from) {
			<-got
		}
		return ctx.Err()
	}
	if r.err != nil {
		return fmt.Errorf("simulator: incoming migration: %w", r.err)
	}
	if len(r.b) > maxSimState {
		return fmt.Errorf("simulator: incoming migration: %w: state over %d bytes", backend.ErrMigrateStream, maxSimState)
	}
	var st simState
	dec := json.NewDecoder(bytes.NewReader(r.b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("simulator: incoming migration: %w: %v", backend.ErrMigrateStream, err)
	}
	if st.UUID != uuid || st.VCPUs <= 0 || st.Memory <= 0 || st.Pages != st.Memory/4096 {
		return fmt.Errorf("simulator: incoming migration: %w: state of %q does not fit domain %s", backend.ErrMigrateStream, st.UUID, uuid)
	}
	if err := s.step(ctx, "migrate"); err != nil {
		return err
	}
	var snap []byte
	s.mu.Lock()
	d = s.doms[uuid]
	if d == nil {
		err = errors.New("simulator: domain " + uuid + " went away during its incoming migration")
	} else {
		d.Info.VCPUs, d.Info.Memory, d.Info.StartTime = st.VCPUs, st.Memory, st.StartTime
		d.Info.State = backend.DomainPaused
		d.Spec.HotCPUs, d.Spec.Incoming = st.HotCPUs, false
		if d.Info.Complete {
			snap = s.snapshotFile(d)
		}
	}
	s.mu.Unlock()
	s.save(uuid, snap)
	return err
}
