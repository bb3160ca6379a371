package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"
	"toolstackd/internal/xenops/qemu/qmp"

	"toolstackd/internal/xenops/backend"
)

// Live migration (backend.Migrator) with QEMU's own migration, carried
// in the framed stream of backend.MigrateWriter/MigrateReader.
//
// Neither QEMU opens a port or a file: each side hands its QEMU one end
// of a socketpair over the monitor (getfd, SCM_RIGHTS) and copies
// between the other end and the caller's stream.
//
//   - The destination's QEMU runs with "-incoming defer -S" (Spec.Incoming);
//     ReceiveLive gives it the socket with migrate-incoming "fd:migin",
//     feeds it the stream's data and returns once QEMU has left
//     "inmigrate" (it is then "paused") and the sender's end frame has
//     arrived with the right total. A QEMU whose load fails exits by
//     itself (QEMU 7): the domain is then unusable, the caller destroys it.
//   - The source's QEMU gets the migration parameters (downtime-limit,
//     max-bandwidth, auto-converge, events, and pause-before-switchover
//     when the caller has a step for the stopped guest:
//     MigrateOptions.BeforeSwitchover runs at "pre-switchover", then
//     migrate-continue) and migrate "fd:migout";
//     SendLive copies what it writes into the caller's stream, polls
//     query-migrate for progress and, when QEMU reports "completed" and
//     its socket has been read to the end, writes the end frame. The
//     guest is then "postmigrate": stopped, its state gone to the other
//     host.
//
// On an error or when ctx ends, SendLive runs migrate_cancel, waits for
// QEMU to settle, resumes a guest that ran (QEMU does so itself unless
// the migration had already completed) and writes an abort frame when
// the stream still works.
//
// The journal says what a restarted daemon finds (settleMigrations):
//
//   - Spec.Incoming still set: the state never arrived (or the daemon died
//     before it knew); the domain is destroyed: no host ever ran it.
//   - Received (the state arrived, the domain never completed): the
//     domain stays paused and DomainInfo.Received says so: the manager
//     adopts it when the database shows the move committed, else
//     destroys it.
//   - Migration "outgoing": the daemon died mid-send, so the end frame
//     was never written and the destination cannot have the guest; the
//     migration is cancelled and a guest that ran runs again here.
//   - Migration "sent": recorded before the end frame is written, so the
//     destination may have the guest. The domain stays paused and
//     DomainInfo.Migrated says so: the manager decides (it destroys it
//     once the destination runs the guest, or Unpauses it when the
//     destination never did).

const (
	migOutgoing = "outgoing"
	migSent     = "sent"

	// migPoll is how often query-migrate and query-status are asked.
	migPoll = 20 * time.Millisecond
	// migSettle bounds the wait for QEMU to finish a migrate_cancel and
	// for a copy goroutine to end once interrupted.
	migSettle = 15 * time.Second
	// migCopyBuf is the copy buffer (and so the largest data frame).
	migCopyBuf = 256 << 10
)

// MigrationStats are QEMU's figures for a domain's last outgoing
// migration, as query-migrate gave them when it completed.
type MigrationStats struct {
	TotalTime   time.Duration // QEMU's total-time: from migrate to completion
	Downtime    time.Duration // QEMU's downtime: the guest stopped at the end
	Transferred int64         // RAM bytes sent
	Bytes       uint64        // bytes of the framed stream's data
}

// MigrationStats returns the figures of the last outgoing migration of
// domain uuid that completed, if any.
func (q *QEMU) MigrationStats(uuid string) (MigrationStats, bool) {
	d, err := q.dom(uuid)
	if err != nil {
		return MigrationStats{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.migStats == nil {
		return MigrationStats{}, false
	}
	return *d.migStats, true
}

// migSocket makes a socketpair and hands one end to QEMU under name
// (getfd); the other is returned, ready for deadlines and Close.
func migSocket(ctx context.Context, mon *qmp.Conn, name string) (*os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu: migration socket: %w", err)
	}
	_, err = qmp.RunFD(ctx, mon, qmp.GetFD{FDName: name}, fds[1])
	_ = syscall.Close(fds[1]) // QEMU has its own copy now (or none)
	if err != nil {
		_ = syscall.Close(fds[0])
		return nil, err
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		_ = syscall.Close(fds[0])
		return nil, err
	}
	return os.NewFile(uintptr(fds[0]), "migration-"+name), nil //nolint:gosec // a fresh fd
}

// copyResult is how a copy goroutine ended.
type copyResult struct {
	n        int64
	err      error
	writeErr bool // err came from the writer
}

// copyOut copies r to w until r ends, telling write errors apart.
func copyOut(w io.Writer, r io.Reader) copyResult {
	buf := make([]byte, migCopyBuf)
	var res copyResult
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				res.err, res.writeErr = err, true
				return res
			}
			res.n += int64(n)
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				res.err = rerr
			}
			return res
		}
	}
}

// ReceiveLive implements backend.Migrator.
func (q *QEMU) ReceiveLive(ctx context.Context, uuid string, from io.Reader) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	d.mu.Lock()
	incoming := d.j.Spec.Incoming
	d.mu.Unlock()
	if !incoming {
		return fmt.Errorf("qemu: domain %s was not made for an incoming migration", uuid)
	}
	// The emulator exits by itself when the stream is bad: that is the
	// failure this call reports, not a crash to notify.
	d.mu.Lock()
	d.stopping = true
	d.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			return
		}
		d.mu.Lock()
		d.stopping = false
		d.mu.Unlock()
	}()

	sock, err := migSocket(ctx, mon, "migin")
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(sock.Close)
	ic := &incomingCopy{q: q, uuid: uuid, sock: sock, from: from, mr: backend.NewMigrateReader(from, "qemu"), copied: make(chan copyResult, 1)}
	if err := qmp.Do(ctx, mon, qmp.MigrateIncoming{URI: "fd:migin"}); err != nil {
		ic.stop()
		return fmt.Errorf("qemu: migrate-incoming: %w", err)
	}
	ic.start()
	if err := awaitIncoming(ctx, d, mon, ic); err != nil {
		ic.stop()
		return err
	}
	ok = true
	d.mu.Lock()
	d.state = backend.DomainPaused
	d.j.Spec.Incoming, d.j.Received = false, true
	d.mu.Unlock()
	return q.save(d)
}

// incomingCopy is the copy of an incoming migration stream into the
// emulator's migration socket, on a goroutine of its own.
type incomingCopy struct {
	q       *QEMU
	uuid    string
	sock    *os.File
	from    io.Reader
	mr      *backend.MigrateReader // reads from
	copied  chan copyResult        // the copy's result
	started bool                   // the copy runs and its result is not read yet
}

// start starts the copy.
func (ic *incomingCopy) start() {
	ic.started = true
	go func() {
		res := copyOut(ic.sock, ic.mr)
		if res.err == nil {
			res.n = int64(ic.mr.Total()) //nolint:gosec // bounded by what arrived
		}
		ic.copied <- res
	}()
}

// stop ends the copy: the socket closes, and the stream is interrupted
// when it can be, the copy then given migSettle to end.
func (ic *incomingCopy) stop() {
	_ = ic.sock.Close()
	if !backend.InterruptIO(ic.from) {
		return // the goroutine ends with the carrier (it holds nothing of ours open)
	}
	if ic.started {
		select {
		case <-ic.copied:
		case <-time.After(migSettle):
			ic.q.log.Warn("qemu: migration stream reader would not stop", "vm", ic.uuid)
		}
	}
}

// awaitIncoming waits until the incoming stream of d has been copied in
// full and the emulator has loaded it (it is paused), polling its status
// every migPoll. An error is the stream's, the emulator's exit or ctx's;
// the caller stops the copy then.
func awaitIncoming(ctx context.Context, d *qemuDomain, mon *qmp.Conn, ic *incomingCopy) error {
	var streamDone, loaded bool
	tick := time.NewTicker(migPoll)
	defer tick.Stop()
	for !streamDone || !loaded {
		select {
		case res := <-ic.copied:
			ic.started = false
			if res.err != nil {
				if res.writeErr {
					select {
					case <-d.exited:
						return incomingExited(d)
					case <-time.After(time.Second):
					}
				}
				return fmt.Errorf("qemu: incoming migration: %w", res.err)
			}
			streamDone = true
		case <-d.exited:
			return incomingExited(d)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if loaded {
				continue
			}
			st, err := qmp.Run(ctx, mon, qmp.QueryStatus{})
			if err != nil {
				continue // the exit or ctx case reports it
			}
			switch st.Status {
			case "inmigrate":
			case "paused", "prelaunch":
				loaded = true
			default:
				return fmt.Errorf("qemu: incoming migration left the emulator %s", st.Status)
			}
		}
	}
	return nil
}

// incomingExited is ReceiveLive's error for an emulator that ended:
// QEMU's own complaint when its log has one.
func incomingExited(d *qemuDomain) error {
	if msg := tailFile(d.j.LogPath, 600); msg != "" {
		return fmt.Errorf("qemu: the incoming emulator failed: %s", msg)
	}
	return errors.New("qemu: the incoming emulator exited")
}

// SendLive implements backend.Migrator.
func (q *QEMU) SendLive(ctx context.Context, uuid string, to io.Writer, o backend.MigrateOptions, progress func(float64)) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return err
	}
	d.mu.Lock()
	state, mig, incoming := d.state, d.j.Migration, d.j.Spec.Incoming
	d.mu.Unlock()
	if err := backend.RefuseStopped(state, d.j.Spec.VMRef); err != nil {
		return err
	}
	if mig != "" || incoming {
		return fmt.Errorf("qemu: domain %s is being migrated or has been", uuid)
	}
	wasRunning := state == backend.DomainRunning
	if err := setMigration(ctx, mon, o); err != nil {
		return err
	}
	mw, err := backend.NewMigrateWriter(to, "qemu")
	if err != nil {
		return err
	}
	if err := q.record(d, func(j *qemuJournal) { j.Migration, j.MigRunning = migOutgoing, wasRunning }); err != nil {
		return err
	}
	sock, err := migSocket(ctx, mon, "migout")
	if err != nil {
		q.undoSend(mon, d, wasRunning, false)
		return err
	}
	defer func(c func() error) { _ = c() }(sock.Close)
	s := &liveSend{q: q, d: d, mon: mon, uuid: uuid, to: to, mw: mw, sock: sock,
		copied: make(chan copyResult, 1), wasRunning: wasRunning, running: true}
	go func() { s.copied <- copyOut(mw, sock) }()
	if err := qmp.Do(ctx, mon, qmp.Migrate{URI: "fd:migout"}); err != nil {
		_ = qmp.Do(context.WithoutCancel(ctx), mon, qmp.CloseFD{FDName: "migout"})
		return s.fail(fmt.Errorf("qemu: migrate: %w", err))
	}
	stats, err := s.watch(ctx, o, progress)
	if err != nil {
		return err
	}
	// Everything QEMU wrote is in the stream. From here the destination
	// may end up running the guest: the journal says so before the end
	// frame can reach it.
	if err := q.record(d, func(j *qemuJournal) { j.Migration = migSent }); err != nil {
		return s.fail(err)
	}
	if err := mw.End(); err != nil {
		s.interrupted = true
		return s.fail(fmt.Errorf("qemu: migration stream: %w", err))
	}
	stats.Bytes = mw.Total()
	d.mu.Lock()
	d.state = backend.DomainPaused
	d.migStats = stats
	d.mu.Unlock()
	if progress != nil {
		progress(1)
	}
	q.log.Info("qemu: live migration sent", "vm", uuid, "total", stats.TotalTime, "downtime", stats.Downtime, "bytes", stats.Bytes)
	return nil
}

// setMigration sets QEMU's migration capabilities and parameters from o.
func setMigration(ctx context.Context, mon *qmp.Conn, o backend.MigrateOptions) error {
	if o.Downtime <= 0 {
		o.Downtime = backend.DefaultDowntime
	}
	if o.Bandwidth <= 0 {
		o.Bandwidth = 8 << 30
	}
	caps := []qmp.MigrationCapabilityStatus{
		{Capability: "events", State: true},
		{Capability: "auto-converge", State: !o.NoAutoConverge},
		// A storage migration completes its mirrors with the guest
		// stopped and before QEMU lets go of the disks.
		{Capability: "pause-before-switchover", State: o.BeforeSwitchover != nil},
	}
	if err := qmp.Do(ctx, mon, qmp.MigrateSetCapabilities{Capabilities: caps}); err != nil {
		return fmt.Errorf("qemu: migration capabilities: %w", err)
	}
	downtime, bandwidth := max(1, o.Downtime.Milliseconds()), o.Bandwidth
	if err := qmp.Do(ctx, mon, qmp.MigrateSetParameters{DowntimeLimit: &downtime, MaxBandwidth: &bandwidth}); err != nil {
		return fmt.Errorf("qemu: migration parameters: %w", err)
	}
	return nil
}

// liveSend is one outgoing live migration: QEMU writes into sock, and
// copyOut moves that into the stream to until it ends (copied).
type liveSend struct {
	q    *QEMU
	d    *qemuDomain
	mon  *qmp.Conn
	uuid string
	to   io.Writer
	mw   *backend.MigrateWriter
	sock *os.File

	copied      chan copyResult
	wasRunning  bool
	running     bool // copyOut has not returned
	interrupted bool // the stream's carrier is broken: no abort frame
}

// fail undoes the send (the guest runs on here), stops the copy and
// tells the destination, when the stream still carries, why; it returns
// err.
func (s *liveSend) fail(err error) error {
	// Closing our end first fails QEMU's writes at once, whatever state
	// its migration thread is in.
	_ = s.sock.Close()
	s.q.undoSend(s.mon, s.d, s.wasRunning, true)
	if s.running {
		select {
		case res := <-s.copied:
			s.running = false
			s.interrupted = res.writeErr
		case <-time.After(migSettle / 3):
			s.interrupted = true
			if !backend.InterruptIO(s.to) {
				break // the goroutine ends with the carrier
			}
			select {
			case <-s.copied:
				s.running = false
			case <-time.After(migSettle):
				s.q.log.Warn("qemu: migration stream writer would not stop", "vm", s.uuid)
			}
		}
	}
	if !s.interrupted && !s.running {
		_ = s.mw.Abort(err.Error())
	}
	return err
}

// watch follows the migration until QEMU has completed it and the copy
// has ended, running o.BeforeSwitchover at the switchover, and returns
// QEMU's figures; any failure is s.fail's.
func (s *liveSend) watch(ctx context.Context, o backend.MigrateOptions, progress func(float64)) (*MigrationStats, error) {
	var stats *MigrationStats
	zeroes := 0
	switched := false
	tick := time.NewTicker(migPoll)
	defer tick.Stop()
	for s.running || stats == nil {
		select {
		case res := <-s.copied:
			s.running = false
			if res.err != nil {
				s.interrupted = res.writeErr
				return nil, s.fail(fmt.Errorf("qemu: migration stream: %w", res.err))
			}
		case <-s.d.exited:
			return nil, s.fail(errors.New("qemu: the emulator exited during the migration"))
		case <-ctx.Done():
			return nil, s.fail(ctx.Err())
		case <-tick.C:
			if stats != nil {
				continue
			}
			st, err := queryMigrate(ctx, s.mon)
			if err != nil {
				continue // the exit or ctx case reports it
			}
			switch st.Status {
			case "completed":
				// QEMU reports completed a moment before it has worked
				// out its figures: ask again, a few times.
				if st.TotalTime == 0 && zeroes < 25 {
					zeroes++
					continue
				}
				stats = &MigrationStats{TotalTime: time.Duration(st.TotalTime) * time.Millisecond,
					Downtime: time.Duration(st.Downtime) * time.Millisecond, Transferred: st.RAM.Transferred}
			case "pre-switchover":
				// The guest is stopped and nothing of its devices sent
				// yet: the caller's step, then on.
				if switched {
					continue
				}
				switched = true
				if err := o.BeforeSwitchover(ctx); err != nil {
					return nil, s.fail(fmt.Errorf("qemu: before the switchover: %w", err))
				}
				if err := qmp.Do(ctx, s.mon, qmp.MigrateContinue{State: "pre-switchover"}); err != nil {
					return nil, s.fail(fmt.Errorf("qemu: migrate-continue: %w", err))
				}
			case "failed", "cancelled":
				return nil, s.fail(fmt.Errorf("qemu: migration %s: %s", st.Status, st.ErrorDesc))
			default:
				if progress != nil && st.RAM.Total > 0 {
					progress(min(0.99, float64(st.RAM.Transferred)/float64(st.RAM.Total)))
				}
			}
		}
	}
	return stats, nil
}

func queryMigrate(ctx context.Context, mon *qmp.Conn) (qmp.MigrationInfo, error) {
	return qmp.Run(ctx, mon, qmp.QueryMigrate{})
}

// undoSend cancels an outgoing migration and waits for QEMU to settle;
// a guest that ran before runs again; the journal forgets the
// migration. started says whether migrate may have been issued.
func (q *QEMU) undoSend(mon *qmp.Conn, d *qemuDomain, wasRunning, started bool) {
	bg, cancel := context.WithTimeout(context.Background(), migSettle)
	defer cancel()
	if started {
		_ = qmp.Do(bg, mon, qmp.MigrateCancel{})
		for bg.Err() == nil {
			st, err := queryMigrate(bg, mon)
			if err != nil {
				break
			}
			if st.Status == "" || st.Status == "none" || st.Status == "cancelled" || st.Status == "failed" || st.Status == "completed" {
				break
			}
			select {
			case <-bg.Done():
			case <-time.After(migPoll):
			}
		}
	}
	if wasRunning {
		// QEMU restarts a guest whose migration failed or was cancelled
		// itself; one that completed (the end frame was never sent, so
		// the destination cannot run it) is restarted here.
		if st, err := qmp.Run(bg, mon, qmp.QueryStatus{}); err == nil && st.Status != "running" {
			if err := qmp.Do(bg, mon, qmp.Cont{}); err != nil {
				q.log.Warn("qemu: resuming the guest after a failed migration", "vm", d.j.UUID, "err", err)
			}
		}
	}
	d.mu.Lock()
	if wasRunning {
		d.state = backend.DomainRunning
	}
	d.mu.Unlock()
	if err := q.record(d, func(j *qemuJournal) { j.Migration, j.MigRunning = "", false }); err != nil {
		q.log.Warn("qemu: saving domain state", "vm", d.j.UUID, "err", err)
	}
}

// forgetSent clears a sent migration's mark once the guest runs here
// again (Unpause after a destination that failed).
func (q *QEMU) forgetSent(uuid string) error {
	d, err := q.dom(uuid)
	if err != nil {
		return nil
	}
	d.mu.Lock()
	sent := d.j.Migration == migSent
	d.mu.Unlock()
	if !sent {
		return nil
	}
	return q.record(d, func(j *qemuJournal) { j.Migration, j.MigRunning = "", false })
}

// settleMigrations applies the journal's migration marks after New has
// re-attached every domain (see the top of this file).
func (q *QEMU) settleMigrations() {
	doms := q.domains()
	for _, d := range doms {
		d.mu.Lock()
		uuid, incoming, mig, ran, mon := d.j.UUID, d.j.Spec.Incoming, d.j.Migration, d.j.MigRunning, d.mon
		gone := d.state == backend.DomainGone
		d.mu.Unlock()
		switch {
		case incoming:
			q.log.Info("qemu: destroying a domain whose incoming migration never completed", "vm", uuid)
			ctx, cancel := context.WithTimeout(context.Background(), migSettle)
			if err := q.Destroy(ctx, uuid); err != nil {
				q.log.Warn("qemu: destroying an unfinished incoming domain", "vm", uuid, "err", err)
			}
			cancel()
		case mig == migOutgoing && !gone && mon != nil:
			q.log.Info("qemu: cancelling an outgoing migration cut short by a restart", "vm", uuid)
			q.undoSend(mon, d, ran, true)
		case mig == migOutgoing:
			if err := q.record(d, func(j *qemuJournal) { j.Migration, j.MigRunning = "", false }); err != nil {
				q.log.Warn("qemu: saving domain state", "vm", uuid, "err", err)
			}
		case mig == migSent:
			q.log.Info("qemu: domain was migrated away before the restart; left paused for the manager", "vm", uuid)
		}
	}
}
