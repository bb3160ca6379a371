package xenops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Live migration inside a pool: VM.pool_migrate (XenMotion with the
// disks on storage both hosts see).
//
// The call runs on the host the VM is resident on, marked pool_migrate
// in the VM's current_operations (and vm_migrate on the destination host
// by the pipeline). After xapi's checks (assertCanMigrate) the source
// opens a migration stream to the destination (MigrationPeers: an
// intra-pool connection upgraded in place, the pool secret and the
// pool's TLS; internal/pool) and the two hosts go through these steps:
//
//  1. header: the source names the VM, itself, the destination and the
//     power state;
//  2. ready: the destination checks that the database agrees (the VM is
//     resident on the source and marked pool_migrate), plans the domain
//     from the database as VM.start does (disks through storage, NICs
//     on their networks with their taps locked) with Spec.Incoming, and
//     reserves its memory;
//  3. the memory: the source's backend streams the running guest
//     (backend.Migrator.SendLive) into the destination's
//     (ReceiveLive), in chunks over the connection;
//  4. received: the destination's domain holds the guest's state,
//     paused; the source's guest is stopped;
//  5. the commit point: the source records the move in the database
//     (resident_on, domid; the devices stay attached) with a normal
//     replicated write, then says go;
//  6. go: the destination adopts the domain (complete, unpaused if the
//     VM was running, the record following it) and takes the VM's RRD,
//     which the source sends next; done; the source destroys its
//     stopped domain without marking the VM halted.
//
// Before the commit, any failure or a cancelled task leaves the VM
// running on the source (SendLive cancels; a guest already stopped is
// resumed) and the destination removes everything it made (no domain,
// no tap, no journal entry). A destination that loses the source after
// step 4 asks the database: resident_on naming it means the move
// committed, so it adopts the domain; otherwise it waits a little for
// the commit to reach its replica, then removes the domain. It does not
// wait for a go that is held up once its replica shows the commit; a
// memory stream that stops moving for 25 s ends the migration, on
// either side (stallReader, stallWriter); and a destination
// whose daemon died after the state arrived settles the kept domain the
// same way at its next start (migrate_recover.go). So the guest runs on
// one host at a time, and a move the database acknowledged is never
// lost.
//
// Options: xapi's keys are accepted; "live" changes nothing (a pool
// migration is always live, as xapi's is), "force" has nothing to skip
// (there is no CPU-compatibility check) and "network" is not needed (the
// stream always takes the pool's own connection). Tuning: the VM's
// other_config:migration_bandwidth (bytes per second; the orchestration
// also holds the stream to it) and other_config:migration_downtime
// (milliseconds) become the backend's MigrateOptions; the bandwidth
// caps a storage migration's disk mirrors as well.
//
// VM.migrate_send to a host of the pool goes through the same steps
// (marked migrate_send); when its vdi_map sends disks to other SRs, the
// destination makes the new disks in step 2, the source mirrors into
// them before step 3 and completes the mirrors at the switchover, and
// the commit of step 5 repoints the VBDs: storagemigrate.go.
//
// A migration to the host the VM runs on is refused
// (OPERATION_NOT_ALLOWED): a backend names domains by VM uuid, so one
// host cannot hold both ends. Storage's hold on the disks (a sharedfs
// VDI's lock) is let go by the source before the destination attaches
// them, and taken back if the move fails; a disk reached over NBD cannot
// move this way (VM_MIGRATE_FAILED).

// MigrationPeers carries migration streams to the other hosts of the
// pool (internal/pool).
type MigrationPeers interface {
	// DialMigration opens a stream to the host hostRef, whose
	// MigrationReceiver (Manager.ServeMigration) gets the other end.
	DialMigration(ctx context.Context, hostRef string) (net.Conn, error)
}

// MetricsArchive hands a VM's round-robin archive from host to host
// (internal/rrdd through the daemon).
type MetricsArchive interface {
	// ExportVM is the VM's RRD as this host has it (nil when it has
	// none).
	ExportVM(uuid string) ([]byte, error)
	// ImportVM takes the VM's RRD from the host it came from.
	ImportVM(uuid string, rrd []byte) error
}

// migrateState is the manager's migration wiring.
type migrateState struct {
	peers   atomic.Pointer[MigrationPeers]
	metrics atomic.Pointer[MetricsArchive]
	last    atomic.Pointer[MigrationTimes]
	// sweeping is set once clearStaleMarks has started.
	sweeping atomic.Bool
}

// SetMigration wires live migration: peers carry the streams, metrics
// (may be nil) the VMs' RRDs.
//
// In a pool it also starts the clearing of marks an earlier run of this
// daemon left on the VMs resident here (an operation cut short by the
// daemon's death, a migration among them): a host in a pool does not
// reset the pool's database at start-up, so this host clears its own.
func (m *Manager) SetMigration(peers MigrationPeers, metrics MetricsArchive) {
	if peers != nil {
		m.mig.peers.Store(&peers)
	}
	if metrics != nil {
		m.mig.metrics.Store(&metrics)
	}
	if peers != nil && m.mig.sweeping.CompareAndSwap(false, true) {
		m.wg.Add(1)
		go m.clearStaleMarks()
	}
}

// staleSweeps are when clearStaleMarks looks, after the start: a mark is
// cleared when two looks in a row find it and no operation here holds
// it (an operation holds its mark from the moment it is made).
var staleSweeps = []time.Duration{2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second}

func (m *Manager) clearStaleMarks() {
	defer m.wg.Done()
	seen := map[string]bool{}
	for _, d := range staleSweeps {
		select {
		case <-m.bg.Done():
			return
		case <-time.After(d):
		}
		now := map[string]bool{}
		var clear [][2]string
		for _, row := range m.db.Snapshot().All(dm.VM.Class) {
			p := row.String(dm.VM.PowerState)
			if row.String(dm.VM.ResidentOn) != m.host || (p != psRunning && p != psPaused) {
				continue
			}
			cur, _ := row.Get(dm.VM.CurrentOperations).(map[string]string)
			for key := range cur {
				id := row.Ref + " " + key
				now[id] = true
				if seen[id] && !m.holds(row.Ref, key) {
					clear = append(clear, [2]string{row.Ref, key})
				}
			}
		}
		seen = now
		if len(clear) == 0 {
			continue
		}
		if _, err := m.db.Update(func(tx *db.Tx) error {
			for _, c := range clear {
				if _, ok := tx.Get(dm.VM.Class, c[0]); !ok || m.holds(c[0], c[1]) {
					continue
				}
				if err := tx.RemoveFromMap(dm.VM.CurrentOperations, c[0], c[1]); err != nil {
					return err
				}
				if err := refreshVM(tx, c[0]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			m.log.Warn("cannot clear operations left by an earlier run", "err", err)
			continue
		}
		m.log.Info("cleared operations left by an earlier run", "marks", len(clear))
	}
}

// holds reports whether an operation running here holds the mark key on
// VM ref.
func (m *Manager) holds(ref, key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.ops[ref][key]
	return ok
}

// Timeouts of the migration protocol. Each bounds one wait for the other
// host, never the memory stream itself (which the backend bounds).
const (
	migrateMsgTimeout  = 30 * time.Second // a message that needs no work
	migratePrepTimeout = 5 * time.Minute  // the destination's domain, built
	migrateRecvTimeout = 5 * time.Minute  // the destination loading the last state
	migrateGoTimeout   = 2 * time.Minute  // the source's commit
	migrateAwaitCommit = 15 * time.Second // a destination that lost the source
)

func (m *Manager) registerMigrate() {
	api.Register(m.srv, m.vmPoolMigrate)
	api.Register(m.srv, m.vmAssertCanMigrate)
	m.registerStorageMigrate()
	m.registerVDIMigrate()
}

// MigrationTimes are the durations of the last migration this host sent
// (for the figures): the whole, the destination's preparation (from the
// start to its ready) and the backend's SendLive.
type MigrationTimes struct {
	Total, Prepare, Send time.Duration
	// Mirror is a storage migration's disk mirrors, from their start to
	// all in sync (0 without disks to move).
	Mirror time.Duration
}

// vmPoolMigrate is VM.pool_migrate on the VM's resident host.
func (m *Manager) vmPoolMigrate(c *api.Call, a dm.VMPoolMigrateArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return dm.Void{}, err
	}
	host, err := c.Lookup(dm.Host.Class, string(a.Host))
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsPoolMigrate, false); err != nil {
		return dm.Void{}, err
	}
	if err := m.assertCanMigrate(snap, row, host.Ref); err != nil {
		return dm.Void{}, err
	}
	if r := row.String(dm.VM.ResidentOn); r != m.host {
		return dm.Void{}, xerr.New(xerr.VMNotResidentHere, row.Ref, m.host)
	}
	err = m.withVMOp(c, row.Ref, dm.VMOperationsPoolMigrate, m.recheck(dm.VMOperationsPoolMigrate, func(o *opCtx) error {
		// Cancelling the coordinator's task ends the migration (safe at
		// any point: before the commit it is undone).
		defer followForwarded(c, o)()
		return m.migrateOut(o, host.Ref, a.Options)
	}))
	if err == nil {
		m.noteMigrated(c.Ctx, row, m.host, host.Ref)
	}
	return dm.Void{}, err
}

// noteMigrated leaves xapi's message about a move (VM_MIGRATED, priority
// 5), as an internal session's message.create on this host.
func (m *Manager) noteMigrated(ctx context.Context, vm *db.Row, from, to string) {
	snap := m.db.Snapshot()
	name := func(ref string) (label, uuid string) {
		if h, ok := snap.Get(dm.Host.Class, ref); ok {
			return h.String(dm.Host.NameLabel), h.UUID()
		}
		return "", ""
	}
	fromName, fromUUID := name(from)
	toName, toUUID := name(to)
	body := fmt.Sprintf("VM '%s' (uuid: %s) migrated from host '%s' (uuid: %s) to host '%s' (uuid: %s)",
		vm.String(dm.VM.NameLabel), vm.UUID(), fromName, fromUUID, toName, toUUID)
	caller, end, err := m.srv.InternalCaller("VM.pool_migrate")
	if err == nil {
		defer end()
		_, err = (&dm.MessageCreateArgs{Name: "VM_MIGRATED", Priority: 5, Cls: dm.ClsVM, ObjUUID: vm.UUID(), Body: body}).
			Call(context.WithoutCancel(ctx), caller)
	}
	if err != nil {
		m.log.Warn("cannot leave the VM_MIGRATED message", "vm", vm.UUID(), "err", err)
	}
}

// vmAssertCanMigrate is VM.assert_can_migrate for a destination in this
// pool (dest["host"] names a host of the pool): xapi's intra-pool
// checks; a destination in another pool gets crosspool.go's.
func (m *Manager) vmAssertCanMigrate(c *api.Call, a dm.VMAssertCanMigrateArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	if !inThisPool(snap, a.Dest) && a.Dest["master"] != "" {
		return dm.Void{}, m.assertCanMigrateRemote(c, row, a) // crosspool.go
	}
	dest, err := destHost(snap, a.Dest)
	if err != nil {
		return dm.Void{}, err
	}
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return dm.Void{}, err
	}
	if p := row.String(dm.VM.PowerState); p != psRunning && p != psPaused && (p != psHalted || len(a.VDIMap) == 0) {
		return dm.Void{}, xerr.New(xerr.VMBadPowerState, row.Ref, powerName(psRunning), powerName(p))
	}
	_, err = m.storageMoves(snap, row, dest, a.VDIMap, a.VIFMap, a.Options)
	return dm.Void{}, err
}

// assertCanMigrate is what xapi checks before a VM may move to host
// dest in the pool (assert_can_boot_here with the destination, the PCI
// rule of check_operation_error): PCI devices, a live and enabled
// destination other than the source, every disk's SR plugged there,
// every VIF's network reachable there, and room for the VM's memory.
func (m *Manager) assertCanMigrate(r db.Reader, vm *db.Row, dest string) error {
	return m.assertCanMigrateMoving(r, vm, dest, nil)
}

// migrateOptions are the backend's options for a VM.
func migrateOptions(vm *db.Row) backend.MigrateOptions {
	var o backend.MigrateOptions
	oc, _ := vm.Get(dm.VM.OtherConfig).(map[string]string)
	if n, err := strconv.ParseInt(oc["migration_bandwidth"], 10, 64); err == nil && n > 0 {
		o.Bandwidth = n
	}
	if n, err := strconv.ParseInt(oc["migration_downtime"], 10, 64); err == nil && n > 0 {
		o.Downtime = time.Duration(n) * time.Millisecond
	}
	return o
}

// followForwarded ties o to the request of a call forwarded without a
// task of its own (the caller's task is then the coordinator's, and
// cancelling it ends the forwarded request): the request's end cancels
// o. The returned func ends the tie.
func followForwarded(c *api.Call, o *opCtx) (stop func()) {
	if c.Task != "" || !c.Forwarded() {
		return func() {}
	}
	ctx, cancel := context.WithCancel(o.ctx)
	unhook := context.AfterFunc(c.Ctx, cancel)
	o.ctx = ctx
	return func() {
		unhook()
		cancel()
	}
}

// outStream is the source's end of a migration stream.
type outStream struct {
	mc   *migConn
	dial func(context.Context) (net.Conn, error) // more streams to the same host (the disks')
	// unhook ends the tie between the stream and o's task (see
	// openStream); false: the task was cancelled first.
	unhook func() bool
}

// dialPeer dials migration streams to dest, a host of this pool.
func dialPeer(pp *MigrationPeers, dest string) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) { return (*pp).DialMigration(ctx, dest) }
}

// openStream opens o's migration stream to host dest with dial. A dial
// that fails is CANNOT_CONTACT_HOST (the task's cancellation when that
// ended it), except a refusal of the caller's session (SESSION_INVALID,
// RBAC_PERMISSION_DENIED from another pool), passed on as it is. Until
// unhook, cancelling o's task breaks the stream: every wait on it ends,
// and the destination cleans up.
func (m *Manager) openStream(o *opCtx, dest string, dial func(context.Context) (net.Conn, error)) (*outStream, error) {
	conn, err := dial(o.ctx)
	if err != nil {
		if o.ctx.Err() != nil {
			return nil, cancelledErr(o.task)
		}
		m.log.Warn("cannot open a migration stream", "vm", o.uuid, "dest", dest, "err", err)
		if xerr.HasCode(err, xerr.SessionInvalid) || xerr.HasCode(err, xerr.RBACPermissionDenied) {
			return nil, err
		}
		return nil, xerr.New(xerr.CannotContactHost, dest)
	}
	return &outStream{mc: newMigConn(conn), dial: dial, unhook: context.AfterFunc(o.ctx, func() { _ = conn.SetDeadline(time.Now()) })}, nil
}

// openPeer opens o's migration stream to hdr.Dest, a host of this pool,
// sends hdr and waits for ready. A failure after the dial is
// migrateFailed's.
func (m *Manager) openPeer(o *opCtx, pp *MigrationPeers, hdr migrateHeader) (*outStream, migrateMsg, error) {
	out, err := m.openStream(o, hdr.Dest, dialPeer(pp, hdr.Dest))
	if err != nil {
		return nil, migrateMsg{}, err
	}
	if err := out.mc.send(hdr, migrateMsgTimeout); err != nil {
		out.close()
		return nil, migrateMsg{}, m.migrateFailed(o, hdr.Dest, err)
	}
	ready, err := out.mc.recvMsg(stepReady, migratePrepTimeout)
	if err != nil {
		out.close()
		return nil, migrateMsg{}, m.migrateFailed(o, hdr.Dest, err)
	}
	return out, ready, nil
}

// openMoving opens the stream of a move of o's VM, in power state power,
// to dest, with its disks in moves (given their Bases: a disk and its
// snapshots go as a chain, storagechain.go): the header sent (its Disks
// are the moves from here on) and the destination's ready read.
func (m *Manager) openMoving(o *opCtx, pp *MigrationPeers, dest, power string, options map[string]string,
	moves []diskMove) (migrateHeader, *outStream, migrateMsg, error) {
	hdr := migrateHeader{Version: migrateVersion, VM: o.vm, UUID: o.uuid, Source: m.host, Dest: dest, Power: power,
		Task: o.task, Options: options, Disks: m.chainMoves(o.ctx, m.db.Snapshot(), moves)}
	out, ready, err := m.openPeer(o, pp, hdr)
	return hdr, out, ready, err
}

// abort tells the destination to drop a move that was not committed
// (best effort, within a second, whether or not the task was cancelled).
func (s *outStream) abort() {
	s.unhook()
	_ = s.mc.c.SetDeadline(time.Time{})
	_ = s.mc.send(migrateMsg{Step: stepAbort}, time.Second)
}

// close ends the stream.
func (s *outStream) close() {
	s.unhook()
	_ = s.mc.c.Close()
}

// sendMemory sends the guest's memory down mc as one chunked stream,
// capped at mopts.Bandwidth, progress going from lo to 0.9; it returns
// how long that took. The chunked stream is left open: the caller ends
// it (cw.Close) once the guest's stop is journalled. On failure the
// guest runs here still.
func (m *Manager) sendMemory(o *opCtx, mig backend.Migrator, mc *migConn, mopts backend.MigrateOptions, lo float64) (cw *chunkWriter, took time.Duration, err error) {
	cw = &chunkWriter{w: mc.w}
	// A destination that stops taking the stream ends the move after
	// migrateStall; the backend can interrupt it (SetWriteDeadline).
	stall := &stallWriter{ctx: o.ctx, w: cw, c: mc.c, d: migrateStall}
	var stream io.Writer = stall
	if mopts.Bandwidth > 0 {
		stream = &rateWriter{ctx: o.ctx, w: stall, rate: mopts.Bandwidth, start: time.Now()}
	}
	t0 := time.Now()
	err = mig.SendLive(o.ctx, o.uuid, stream, mopts, func(f float64) { o.prog.Progress(lo + (0.9-lo)*min(max(f, 0), 1)) })
	return cw, time.Since(t0), err
}

// migrateFailed is VM_MIGRATE_FAILED for a move of o's VM to dest.
func (m *Manager) migrateFailed(o *opCtx, dest string, err error) error {
	if o.ctx.Err() != nil {
		return cancelledErr(o.task)
	}
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return xe
	}
	return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, err.Error())
}

// migrateOut is the source's side of a migration, on the VM's queue.
func (m *Manager) migrateOut(o *opCtx, dest string, options map[string]string) error {
	return m.migrateOutMoving(o, dest, options, nil)
}

// migrateOutMoving is migrateOut moving the disks in moves to other SRs
// on the way (storagemigrate.go).
func (m *Manager) migrateOutMoving(o *opCtx, dest string, options map[string]string, moves []diskMove) error {
	t0 := time.Now()
	mig, pp, row, info, err := m.checkMigrateOut(o, dest, moves)
	if err != nil {
		return err
	}
	power := row.String(dm.VM.PowerState)
	o.prog.Progress(0.01)
	// Storage's hold of the disks moves with the VM: it is let go here
	// (the guest keeps its disks open) so that the destination can take
	// it, and taken back if the move fails before its commit.
	if err := m.releaseDisks(o, dest, info, movedSet(moves)); err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			m.reclaimDisks(o, info)
		}
	}()

	// Until the commit, cancelling the task breaks the stream: every wait
	// below ends, and the destination cleans up.
	hdr, out, ready, err := m.openMoving(o, pp, dest, power, options, moves)
	if err != nil {
		return err
	}
	moves = hdr.Disks
	defer out.close()
	prep := time.Since(t0)
	o.prog.Progress(0.1)
	mopts := migrateOptions(row)
	memLo := 0.1
	var mirrorTime time.Duration
	if len(moves) > 0 {
		// The disks first: mirrored while the guest runs, completed at
		// the switchover.
		tm := time.Now()
		sm, err := m.mirrorOut(o, dest, info, hdr, out, ready, moves, mopts.Bandwidth)
		if sm != nil {
			defer sm.cancel(o.ctx)
		}
		if err != nil {
			return err
		}
		mirrorTime = time.Since(tm)
		mopts.BeforeSwitchover = sm.complete
		memLo = 0.5
	}

	// The memory. On failure SendLive leaves the guest running here.
	cw, send, err := m.sendMemory(o, mig, out.mc, mopts, memLo)
	if err != nil {
		m.log.Info("migration failed while sending", "vm", o.uuid, "dest", dest, "err", err)
		return m.migrateFailed(o, dest, err)
	}
	// The guest is stopped here from now on: until the commit, any
	// failure resumes it.
	m.journal(journal.Stop, o.uuid)
	if err := m.switchOver(o, out, cw, dest, power, moves); err != nil {
		return err
	}
	committed = true
	m.leaveMoved(o, out.mc, dest, info, moves)
	total := time.Since(t0)
	m.mig.last.Store(&MigrationTimes{Total: total, Prepare: prep, Send: send, Mirror: mirrorTime})
	m.log.Info("VM migrated", "vm", o.uuid, "dest", dest, "total", total, "send", send, "prepare", prep, "mirror", mirrorTime)
	return nil
}

// leaveMoved ends a move of o's VM to dest once it is recorded: the VM is
// handed over, and its domain (info) here and the disks it left (the
// old VDIs of moves) go.
func (m *Manager) leaveMoved(o *opCtx, mc *migConn, dest string, info backend.DomainInfo, moves []diskMove) {
	_ = mc.c.SetDeadline(time.Time{})
	o.prog.Progress(0.95)
	m.handOver(o, mc, dest)
	m.removeMovedDomain(o, info)
	m.destroyVDIs(o.ctx, oldVDIs(moves), "a storage migration moved away from")
}

// checkMigrateOut checks that o's VM can move live to dest with its disks
// in moves: the backend can migrate, this host is in a pool, and the VM
// is running here. It returns the backend's migrator, the pool's peers,
// the VM's row and its domain.
func (m *Manager) checkMigrateOut(o *opCtx, dest string, moves []diskMove) (backend.Migrator, *MigrationPeers, *db.Row, backend.DomainInfo, error) {
	mig, ok := m.be.(backend.Migrator)
	if !ok {
		return nil, nil, nil, backend.DomainInfo{}, xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "the "+m.be.Name()+" backend cannot migrate live")
	}
	pp := m.mig.peers.Load()
	if pp == nil {
		return nil, nil, nil, backend.DomainInfo{}, xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host has no pool to migrate in")
	}
	snap := m.db.Snapshot()
	row, ok := snap.Get(dm.VM.Class, o.vm)
	if !ok {
		return nil, nil, nil, backend.DomainInfo{}, xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	if err := m.assertCanMigrateMoving(snap, row, dest, moves); err != nil {
		return nil, nil, nil, backend.DomainInfo{}, err
	}
	info, ok := m.be.Info(o.uuid)
	if !ok || info.State.Stopped() {
		return nil, nil, nil, backend.DomainInfo{}, xerr.New(xerr.VMBadPowerState, o.vm, powerName(psRunning), powerName(psHalted))
	}
	return mig, pp, row, info, nil
}

// mirrorOut moves o's disks in moves to dest while the guest runs: what
// nothing writes (the snapshots' disks) is copied, then, once the
// destination has built its domain on the new disks, the others are
// mirrored until they are in step; the mirrors complete at the
// switchover. The mirrors it returns, when not nil, are the caller's to
// cancel, even with an error.
func (m *Manager) mirrorOut(o *opCtx, dest string, info backend.DomainInfo, hdr migrateHeader, out *outStream,
	ready migrateMsg, moves []diskMove, bandwidth int64) (*sourceMirrors, error) {
	mc := out.mc
	if err := m.takeReady(o.ctx, moves, ready.Disks, false); err != nil {
		return nil, m.migrateFailed(o, dest, err)
	}
	if err := m.copyChain(o, dest, hdr, moves, mc, out.dial, 0.1, 0.2); err != nil {
		return nil, m.migrateFailed(o, dest, err)
	}
	if slices.ContainsFunc(moves, func(mv diskMove) bool { return mv.Copy }) {
		if err := mc.send(migrateMsg{Step: stepCopied}, migrateMsgTimeout); err != nil {
			return nil, m.migrateFailed(o, dest, err)
		}
	}
	built, err := mc.recvMsg(stepMirrors, migratePrepTimeout)
	if err == nil {
		err = m.takeReady(o.ctx, moves, built.Disks, true)
	}
	if err != nil {
		return nil, m.migrateFailed(o, dest, err)
	}
	sm, err := m.startMirrors(o, dest, info, moves, hdr, out.dial, bandwidth)
	if err != nil {
		return nil, m.migrateFailed(o, dest, err)
	}
	if err := sm.wait(o, 0.2, 0.5); err != nil {
		m.log.Info("storage migration failed while mirroring", "vm", o.uuid, "dest", dest, "err", err)
		return sm, m.migrateFailed(o, dest, err)
	}
	return sm, nil
}

// switchOver ends a move whose guest is stopped here, its memory sent
// down cw: it waits for the destination to have received it all, then
// records the move, the commit point. Before the commit a failure
// resumes the guest here (in power state power) and tells the
// destination to drop the move. It returns nil once the move is
// recorded.
func (m *Manager) switchOver(o *opCtx, out *outStream, cw *chunkWriter, dest, power string, moves []diskMove) error {
	mc := out.mc
	rollback := func(cause error) error {
		out.abort()
		m.resumeAfterFailedMove(o, power)
		return m.migrateFailed(o, dest, cause)
	}
	if err := cw.Close(); err != nil {
		return rollback(err)
	}
	rec, err := mc.recvMsg(stepReceived, migrateRecvTimeout)
	if err != nil {
		return rollback(err)
	}
	if o.ctx.Err() != nil {
		return rollback(o.ctx.Err())
	}
	// The commit point: from here the task can no longer be cancelled.
	if !out.unhook() {
		return rollback(context.Canceled)
	}
	if err := m.commitMove(o, dest, rec.Domid, moves); err != nil {
		switch moved, known := m.settleCommit(o, dest); {
		case !known:
			// Neither host may run the guest until the database is sure:
			// it stays stopped here, and this host's next start resumes
			// it if the move was not recorded (checkState).
			m.log.Error("cannot tell whether a migration was recorded: the guest stays stopped", "vm", o.uuid, "dest", dest, "err", err)
			_ = mc.send(migrateMsg{Step: stepAbort}, time.Second)
			return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "the database could not record the move: "+err.Error())
		case !moved:
			m.log.Error("cannot record a migration: the VM stays here", "vm", o.uuid, "dest", dest, "err", err)
			return rollback(err)
		}
		m.log.Warn("recording a migration reported an error, but the database has it", "vm", o.uuid, "err", err)
	}
	return nil
}

// handOver tells the destination to go, sends the VM's RRD and waits for
// the destination to have adopted the VM. The move is recorded already:
// a failure here is logged (the destination adopts the domain from the
// database on its own).
func (m *Manager) handOver(o *opCtx, mc *migConn, dest string) {
	if err := mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout); err != nil {
		m.log.Warn("migration recorded, but the destination did not hear go", "vm", o.uuid, "dest", dest, "err", err)
		return
	}
	if err := m.sendRRD(o, mc); err != nil {
		m.log.Warn("migration recorded; the destination did not confirm", "vm", o.uuid, "dest", dest, "err", err)
	}
}

// sendRRD sends the VM's RRD after go (none when it cannot be read or
// is larger than maxRRDBytes) and waits for the destination's done.
func (m *Manager) sendRRD(o *opCtx, mc *migConn) error {
	var rrd []byte
	if mp := m.mig.metrics.Load(); mp != nil {
		b, err := (*mp).ExportVM(o.uuid)
		if err != nil {
			m.log.Warn("cannot read a migrating VM's RRD", "vm", o.uuid, "err", err)
		} else if len(b) <= maxRRDBytes {
			rrd = b
		}
	}
	_ = mc.c.SetWriteDeadline(time.Now().Add(migrateMsgTimeout))
	cw := &chunkWriter{w: mc.w}
	_, err := cw.Write(rrd)
	if err == nil {
		err = cw.Close()
	}
	_ = mc.c.SetWriteDeadline(time.Time{})
	if err == nil {
		_, err = mc.recvMsg(stepDone, migrateMsgTimeout)
	}
	return err
}

// commitMove records that the VM now runs on dest in domain domid: the
// commit point of a migration. The devices stay attached; the consoles
// go (the destination makes its own); this host's free memory grows.
func (m *Manager) commitMove(o *opCtx, dest string, domid int64, moves []diskMove) error {
	_, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, o.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", o.vm)
		}
		if row.String(dm.VM.ResidentOn) != m.host {
			return xerr.New(xerr.VMNotResidentHere, o.vm, m.host)
		}
		for f, v := range map[*schema.Field]any{
			dm.VM.ResidentOn: dest, dm.VM.Domid: domid, dm.VM.ScheduledToBeResidentOn: schema.NullRef,
		} {
			if err := tx.Set(f, o.vm, v); err != nil {
				return err
			}
		}
		for _, c := range strs(tx.Value(row, dm.VM.Consoles)) {
			if _, ok := tx.Get(dm.Console.Class, c); ok {
				if err := tx.Delete(dm.Console.Class, c); err != nil {
					return err
				}
			}
		}
		if _, err := setMetrics(tx, row.String(dm.VM.Metrics), map[*schema.Field]any{dm.VMMetrics.LastUpdated: time.Now().UTC()}); err != nil {
			return err
		}
		if err := m.noteFreeMemory(tx); err != nil {
			return err
		}
		if err := fixSuspendSR(tx, row, dest); err != nil {
			return err
		}
		if err := repointVBDs(tx, moves); err != nil {
			return err
		}
		return refreshVM(tx, o.vm)
	})
	return err
}

// settleCommit finds out what a commit that failed did: a write that
// failed (a lost leadership) may still be applied later, ahead of any
// write made after it. So a second write is made (the VM's metrics'
// last_updated), and once it is in, the database's resident_on is the
// final word: moved says whether it names dest. known is false when that
// write fails as well.
func (m *Manager) settleCommit(o *opCtx, dest string) (moved, known bool) {
	ctx := context.WithoutCancel(o.ctx)
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			row, ok := tx.Get(dm.VM.Class, o.vm)
			if !ok {
				return nil
			}
			_, err := setMetrics(tx, row.String(dm.VM.Metrics), map[*schema.Field]any{dm.VMMetrics.LastUpdated: time.Now().UTC()})
			return err
		})
		if err == nil {
			row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
			return ok && row.String(dm.VM.ResidentOn) == dest, true
		}
	}
	return false, false
}

// resumeAfterFailedMove runs the guest here again after its state was
// sent but the move not recorded.
func (m *Manager) resumeAfterFailedMove(o *opCtx, power string) {
	bg := context.WithoutCancel(o.ctx)
	m.journal(journal.Start, o.uuid)
	if power != psRunning {
		return
	}
	if err := m.be.Unpause(bg, o.uuid); err != nil {
		m.log.Error("cannot resume a guest after a failed migration", "vm", o.uuid, "err", err)
		return
	}
	m.log.Info("migration undone: the guest runs here again", "vm", o.uuid)
}

// removeMovedDomain destroys the stopped domain of a VM that moved away,
// with its disks' attachments here and its networks' hold. The VM's
// record is the destination's now.
func (m *Manager) removeMovedDomain(o *opCtx, info backend.DomainInfo) {
	bg := context.WithoutCancel(o.ctx)
	if err := m.be.Destroy(bg, o.uuid); err != nil {
		m.log.Error("cannot remove the domain of a VM that moved away", "vm", o.uuid, "err", err)
	}
	m.detachAll(bg, o.uuid, info.Disks)
	vifs := make([]string, 0, len(info.NICs))
	for _, n := range info.NICs {
		vifs = append(vifs, n.VIF)
	}
	m.releaseNICs(bg, vifs)
}

// releaseDisks lets go of storage's hold on a migrating VM's disks on
// this host (the guest keeps them open), so that the destination can
// attach them. A disk reached over NBD cannot move this way: its export
// would go from under the guest.
func (m *Manager) releaseDisks(o *opCtx, dest string, info backend.DomainInfo, moved map[string]string) error {
	for _, d := range info.Disks {
		if _, mirrored := moved[d.VDI]; !mirrored && d.VDI != "" && strings.Contains(d.Path, "://") {
			return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "disk "+d.Device+" is reached over NBD; such disks cannot move live")
		}
	}
	m.detachAll(context.WithoutCancel(o.ctx), o.uuid, info.Disks)
	return nil
}

// reclaimDisks takes storage's hold on the disks back after a move that
// failed before its commit, waiting for the destination to let them go
// (a bounded wait; a disk it cannot take back is logged: the guest still
// has it open).
func (m *Manager) reclaimDisks(o *opCtx, info backend.DomainInfo) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(o.ctx), migrateMsgTimeout)
	defer cancel()
	seen := map[string]bool{}
	for _, d := range info.Disks {
		if d.VDI == "" || seen[d.VDI] {
			continue
		}
		seen[d.VDI] = true
		for {
			_, err := m.disks.Attach(ctx, o.uuid, d.VDI, d.ReadOnly)
			if err == nil {
				break
			}
			if !xerr.HasCode(err, xerr.VDIInUse) || ctx.Err() != nil {
				m.log.Error("cannot take a disk back after a failed migration", "vm", o.uuid, "vdi", d.VDI, "err", err)
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// LastMigration is the timing of the last migration this host sent.
func (m *Manager) LastMigration() (MigrationTimes, bool) {
	t := m.mig.last.Load()
	if t == nil {
		return MigrationTimes{}, false
	}
	return *t, true
}
