package xenops

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/xenops/backend"
)

// Faults on the destination's side of a migration (see migrate.go).
//
// The memory stream stalls: a destination that gets no byte of the
// guest's state for migrateStall gives up (the stream is cut or held up
// somewhere between the hosts) and removes its incoming domain, as for
// any failure before the commit. In a storage migration the memory
// comes only once the disks are mirrored, however long that takes: the
// wait for its first byte is not bounded this way.
//
// The source's go does not arrive (the stream broke or is held up after
// the destination said received): the source may have recorded the move
// all the same. The destination watches its replica while it waits:
// once the database says the VM is resident here, go gets migrateGoGrace
// more, then the destination adopts the domain without it. A move that
// the database never shows is dropped when the wait for go ends.
//
// The destination's daemon dies after the state arrived (the QEMU
// process outlives it, paused, with the guest's state:
// backend.DomainInfo.Received). At its next start, reconcile settles
// each such domain from the database: a VM recorded as resident here
// (the move committed) is adopted (complete, unpaused if the VM was
// running, the record following the domain); a VM the database places
// elsewhere gets migrateRecoverWait for the commit to reach this
// replica (raft catching up after the restart), then its domain is
// destroyed. A domain that did not keep the state (its emulator died,
// or a backend that keeps no incoming domain across a restart) cannot be
// adopted: the VM is marked Halted, so the database says what runs,
// also when the commit reaches this replica only after the start
// (watchLateCommits). Either way the guest runs on one host at most,
// and only once the database says so.
//
// The source's side is migrate.go's: before the commit it takes the
// guest back when the destination fails or goes silent (bounded by the
// protocol's timeouts), after it the move stands.

const (
	// migrateStall is how long the destination waits for the next byte
	// of the guest's state before it drops the migration.
	migrateStall = 25 * time.Second
	// migrateGoGrace is how long go may still take once this host's
	// replica shows the move committed.
	migrateGoGrace = 5 * time.Second
	// migrateRecoverWait bounds a restarted destination's wait for its
	// replica to show a received migration's commit.
	migrateRecoverWait = time.Minute
)

// errCommitSeen ends the wait for go when the database shows the move
// committed and go did not come.
var errCommitSeen = errors.New("the move is recorded, but the source's go did not arrive")

// awaitGo reads the source's go, watching the database meanwhile (see
// the top of this file). It returns errCommitSeen when it stopped
// waiting because the move is recorded.
func (m *Manager) awaitGo(ctx context.Context, mc *migConn, h migrateHeader) (migrateMsg, error) {
	stop := make(chan struct{})
	done := make(chan struct{})
	var seen atomic.Bool
	go func() {
		defer close(done)
		if !m.residentHere(h.VM, stop, ctx.Done(), migrateGoTimeout) {
			return
		}
		t := time.NewTimer(migrateGoGrace)
		defer t.Stop()
		select {
		case <-stop:
			return
		case <-t.C:
		}
		seen.Store(true)
		_ = mc.c.SetReadDeadline(time.Now()) // ends the read below
	}()
	msg, err := mc.recvMsg(stepGo, migrateGoTimeout)
	close(stop)
	<-done // no deadline is set on the connection from here on
	if err != nil && seen.Load() {
		return msg, errCommitSeen
	}
	return msg, err
}

// residentHere waits until the database says VM ref is resident on
// this host (true), or until bound passes or stop or done is closed
// (false).
func (m *Manager) residentHere(ref string, stop, done <-chan struct{}, bound time.Duration) bool {
	return m.awaitDB(bound, stop, done, func(r db.Reader) (yes, settled bool) {
		row, ok := r.Get(dm.VM.Class, ref)
		if !ok {
			return false, true // gone: it will not be resident here
		}
		here := row.String(dm.VM.ResidentOn) == m.host
		return here, here
	})
}

// awaitDB asks check of the database now and of each later version
// until check says the answer is settled, and returns that answer; it
// gives up (false) once bound passes or stop or done is closed (either
// may be nil).
func (m *Manager) awaitDB(bound time.Duration, stop, done <-chan struct{}, check func(db.Reader) (yes, settled bool)) bool {
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		snap := m.db.Snapshot()
		if yes, settled := check(snap); settled {
			return yes
		}
		select {
		case <-snap.Done():
		case <-deadline.C:
			return false
		case <-stop:
			return false
		case <-done:
			return false
		}
	}
}

// adoptReceived makes a received incoming domain the VM's after a
// restart, when the database says the VM is resident here and live:
// complete, unpaused if the VM is recorded Running, its taps locked and
// the record following it. It reports whether it adopted the domain.
func (m *Manager) adoptReceived(ctx context.Context, ref string) bool {
	row, ok := m.db.Snapshot().Get(dm.VM.Class, ref)
	if !ok {
		return false
	}
	uuid, power := row.UUID(), row.String(dm.VM.PowerState)
	if row.String(dm.VM.ResidentOn) != m.host || (power != psRunning && power != psPaused) {
		return false
	}
	info, ok := m.be.Info(uuid)
	if !ok || !info.Received || info.State != backend.DomainPaused {
		return false
	}
	if err := m.be.MarkComplete(uuid); err != nil {
		m.log.Error("cannot mark a migrated domain complete", "vm", uuid, "err", err)
		return false
	}
	m.journal(journal.Start, uuid)
	now := psPaused
	if power == psRunning {
		if err := m.be.Unpause(ctx, uuid); err != nil {
			m.log.Error("cannot start a migrated guest", "vm", uuid, "err", err)
		} else {
			now = psRunning
		}
	}
	if info, ok = m.be.Info(uuid); !ok {
		m.log.Error("a migrated domain vanished", "vm", uuid)
		return true
	}
	if _, err := m.db.Update(func(tx *db.Tx) error { return m.setLive(tx, ref, info, now) }); err != nil {
		m.log.Error("cannot record a migrated VM here", "vm", uuid, "err", err)
	}
	m.relockNICs(ctx, info)
	m.log.Warn("took over a VM whose migration here committed before this daemon stopped", "vm", uuid, "power", now)
	return true
}

// settleReceivedLater decides, in the background, the fate of a received
// incoming domain whose VM the database (perhaps not yet caught up)
// places on another host: adopted if the move's commit reaches this
// replica within migrateRecoverWait, destroyed otherwise. The VM counts
// as busy meanwhile, so that no check removes the domain first.
func (m *Manager) settleReceivedLater(ref, uuid string) {
	ctx, cancel := context.WithCancel(m.bg)
	key := "migrate-recover:" + db.NewRef()
	m.trackOp(ref, key, "pool_migrate_in", cancel)
	m.log.Info("an incoming migration's domain outlived a restart: waiting for the database to say whether it committed", "vm", uuid)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		defer m.untrackOp(ref, key)
		committed := m.residentHere(ref, nil, ctx.Done(), migrateRecoverWait)
		if ctx.Err() != nil {
			return
		}
		j := &job{ctx: ctx, name: "VM.pool_migrate (recovery)", run: func(ctx context.Context) error {
			if committed && m.adoptReceived(ctx, ref) {
				return nil
			}
			if info, ok := m.be.Info(uuid); ok && !info.Complete {
				m.log.Warn("an incoming migration never committed: removing its domain", "vm", uuid)
				m.cleanupDomain(ctx, info)
			}
			return nil
		}}
		m.q.submit(ref, j)
		_ = j.wait()
	}()
}

// watchLateCommits runs for migrateRecoverWait after reconcile: the
// database this host started with may lag behind the pool's (its
// replica catches up once raft runs), so a migration here that committed
// before the restart may show up only now. A VM the database comes to
// place here, live, with no domain here and no operation of this host on
// it (a destination that did not keep the incoming domain) is checked
// as after any change to its domain: it is marked Halted (checkState),
// so that the database says what runs.
func (m *Manager) watchLateCommits() {
	defer m.wg.Done()
	deadline := time.NewTimer(migrateRecoverWait)
	defer deadline.Stop()
	checked := map[string]bool{}
	for {
		snap := m.db.Snapshot()
		if h, ok := snap.Get(dm.Host.Class, m.host); ok {
			for _, ref := range strs(snap.Value(h, dm.Host.ResidentVMs)) {
				row, ok := snap.Get(dm.VM.Class, ref)
				if !ok || checked[ref] || row.Get(dm.VM.IsControlDomain) == true {
					continue
				}
				if p := row.String(dm.VM.PowerState); p != psRunning && p != psPaused {
					continue
				}
				if _, has := m.be.Info(row.UUID()); has || m.busy(ref) {
					continue
				}
				checked[ref] = true
				m.log.Warn("the database places a VM here that has no domain here (a migration that committed before a restart?)", "vm", row.UUID())
				m.notify(row.UUID())
			}
		}
		select {
		case <-m.bg.Done():
			return
		case <-deadline.C:
			return
		case <-snap.Done():
		}
		// Catching up comes in bursts of writes: look again at most a few
		// times a second.
		select {
		case <-m.bg.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stallReader is the memory stream as the destination's backend reads
// it: each read that waits longer than d for a byte fails (the
// connection's read deadline); with waitFirst, the wait for the first
// byte is not bounded. A deadline set from outside
// (backend.InterruptIO) ends reads for good.
type stallReader struct {
	r         io.Reader
	c         net.Conn
	d         time.Duration
	waitFirst bool

	mu          sync.Mutex
	interrupted bool
	got         bool // a byte has come
}

func (s *stallReader) Read(p []byte) (int, error) {
	s.mu.Lock()
	if s.interrupted {
		s.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	}
	if s.got || !s.waitFirst {
		_ = s.c.SetReadDeadline(time.Now().Add(s.d))
	} else {
		_ = s.c.SetReadDeadline(time.Time{})
	}
	s.mu.Unlock()
	n, err := s.r.Read(p)
	if n > 0 {
		s.mu.Lock()
		s.got = true
		s.mu.Unlock()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) && !s.wasInterrupted() {
		err = errStalled
	}
	return n, err
}

func (s *stallReader) wasInterrupted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.interrupted
}

// SetReadDeadline sets the connection's read deadline; one in the past
// ends every later read.
func (s *stallReader) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !t.IsZero() && !t.After(time.Now()) {
		s.interrupted = true
	}
	return s.c.SetReadDeadline(t)
}

// stallWriter is the memory stream as the source's backend writes it
// (the other half of stallReader): a write that cannot hand its bytes on
// within d fails (the connection's write deadline), so that a
// destination cut off ends the migration, the guest running here as
// before, instead of holding it until TCP gives up. Writes also end with
// ctx (the task cancelled). SetWriteDeadline, which backend.InterruptIO
// calls when the backend gives up, ends writes for good.
type stallWriter struct {
	ctx context.Context
	w   io.Writer
	c   net.Conn
	d   time.Duration

	mu          sync.Mutex
	interrupted bool
}

func (s *stallWriter) Write(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	if s.interrupted {
		s.mu.Unlock()
		return 0, os.ErrDeadlineExceeded
	}
	_ = s.c.SetWriteDeadline(time.Now().Add(s.d))
	s.mu.Unlock()
	n, err := s.w.Write(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.mu.Lock()
		if !s.interrupted && s.ctx.Err() == nil {
			err = errSendStalled
		}
		s.mu.Unlock()
	}
	return n, err
}

// SetWriteDeadline with a time past interrupts the stream
// (backend.InterruptIO).
func (s *stallWriter) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !t.IsZero() && !t.After(time.Now()) {
		s.interrupted = true
	}
	return s.c.SetWriteDeadline(t)
}

// errSendStalled is a memory stream the destination stopped taking.
var errSendStalled = errors.New("the migration stream stalled: the destination took no data for " + migrateStall.String())

// errStalled is a memory stream that stopped moving.
var errStalled = errors.New("the migration stream stalled: no data from the source for " + migrateStall.String())

// The test fault points: tests (tests/pool/migrate/migrate_fault_test.go) make a
// daemon crash at an exact step of a migration by setting
// TOOLSTACKD_TEST_FAULTS to a directory and creating in it a file named
// after the point. The daemon removes the file (so the fault strikes
// once) and kills itself with SIGKILL, as a crash there would. Without
// the variable nothing happens.
const (
	faultDestAfterGo   = "migrate-in-after-go"  // the destination, go just read
	faultDestCommitted = "migrate-in-committed" // the destination, its replica showing the commit
)

var faultDir = sync.OnceValue(func() string { return os.Getenv("TOOLSTACKD_TEST_FAULTS") })

// testFault strikes at point if a test asked for it.
func (m *Manager) testFault(point string) {
	dir := faultDir()
	if dir == "" {
		return
	}
	if err := os.Remove(filepath.Join(dir, point)); err != nil {
		return
	}
	m.log.Warn("test fault: the daemon kills itself", "point", point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not caught: this never returns
}
