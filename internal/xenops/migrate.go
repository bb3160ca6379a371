package xenops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
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
// the commit to reach its replica, then removes the domain. So the guest
// runs on one host at a time, and a move the database acknowledged is
// never lost.
//
// Options: xapi's keys are accepted; "live" changes nothing (a pool
// migration is always live, as xapi's is), "force" has nothing to skip
// (there is no CPU-compatibility check) and "network" is not needed (the
// stream always takes the pool's own connection). Tuning: the VM's
// other_config:migration_bandwidth (bytes per second; the orchestration
// also holds the stream to it) and other_config:migration_downtime
// (milliseconds) become the backend's MigrateOptions.
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
}

// MigrationTimes are the durations of the last migration this host sent
// (for the figures): the whole, the destination's preparation (from the
// start to its ready) and the backend's SendLive.
type MigrationTimes struct {
	Total, Prepare, Send time.Duration
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
		if c.Task == "" && c.Forwarded() {
			// The caller's task is the coordinator's: cancelling it ends
			// the forwarded request, and so the migration (safe at any
			// point: before the commit it is undone).
			ctx, cancel := context.WithCancel(o.ctx)
			defer cancel()
			defer context.AfterFunc(c.Ctx, cancel)()
			o.ctx = ctx
		}
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
// checks. A destination in another pool is refused: cross-pool
// migration is not done here.
func (m *Manager) vmAssertCanMigrate(c *api.Call, a dm.VMAssertCanMigrateArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	dest := a.Dest["host"]
	if _, ok := snap.Get(dm.Host.Class, dest); !ok {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "migration to another pool is not supported; dest[host] must name a host of this pool")
	}
	if len(a.VIFMap) > 0 {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "VIF mapping is not allowed for intra-pool migration -all VIFs must be on the same network")
	}
	for vdi, sr := range a.VDIMap {
		if d, ok := snap.Get(dm.VDI.Class, string(vdi)); !ok || d.String(dm.VDI.SR) != string(sr) {
			return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "storage migration (a VDI to another SR) is not supported yet")
		}
	}
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsPoolMigrate, false); err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, m.assertCanMigrate(snap, row, dest)
}

// assertCanMigrate is what xapi checks before a VM may move to host
// dest in the pool (assert_can_boot_here with the destination, the PCI
// rule of check_operation_error): PCI devices, a live and enabled
// destination other than the source, every disk's SR plugged there,
// every VIF's network reachable there, and room for the VM's memory.
func (m *Manager) assertCanMigrate(r db.Reader, vm *db.Row, dest string) error {
	if pcis := strs(r.Value(vm, dm.VM.AttachedPCIs)); len(pcis) > 0 {
		return xerr.New(xerr.VMHasPCIAttached, vm.Ref)
	}
	host, ok := r.Get(dm.Host.Class, dest)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "host", dest)
	}
	if dest == vm.String(dm.VM.ResidentOn) {
		return xerr.New(xerr.OperationNotAllowed, "the VM already runs on this host (a migration to the same host is not supported)")
	}
	if live, known := forwarding.MetricsLive(r, host); !live || !known {
		return xerr.New(xerr.HostNotLive)
	}
	if host.Get(dm.Host.Enabled) != true {
		return xerr.New(xerr.HostDisabled, dest)
	}
	if err := whyNotOn(r, vm, dest); err != nil {
		return err
	}
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	if metrics, ok := r.Get(dm.HostMetrics.Class, host.String(dm.Host.Metrics)); ok {
		free, _ := metrics.Get(dm.HostMetrics.MemoryFree).(int64)
		if need > free {
			return xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(free, 0), 10))
		}
	}
	return nil
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
	t0 := time.Now()
	mig, ok := m.be.(backend.Migrator)
	if !ok {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "the "+m.be.Name()+" backend cannot migrate live")
	}
	pp := m.mig.peers.Load()
	if pp == nil {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host has no pool to migrate in")
	}
	snap := m.db.Snapshot()
	row, ok := snap.Get(dm.VM.Class, o.vm)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	if err := m.assertCanMigrate(snap, row, dest); err != nil {
		return err
	}
	power := row.String(dm.VM.PowerState)
	info, ok := m.be.Info(o.uuid)
	if !ok || info.State.Stopped() {
		return xerr.New(xerr.VMBadPowerState, o.vm, powerName(psRunning), powerName(psHalted))
	}
	o.prog.Progress(0.01)
	// Storage's hold of the disks moves with the VM: it is let go here
	// (the guest keeps its disks open) so that the destination can take
	// it, and taken back if the move fails before its commit.
	if err := m.releaseDisks(o, dest, info); err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			m.reclaimDisks(o, info)
		}
	}()

	conn, err := (*pp).DialMigration(o.ctx, dest)
	if err != nil {
		if o.ctx.Err() != nil {
			return cancelledErr(o.task)
		}
		m.log.Warn("cannot open a migration stream", "vm", o.uuid, "dest", dest, "err", err)
		return xerr.New(xerr.CannotContactHost, dest)
	}
	defer func() { _ = conn.Close() }()
	mc := newMigConn(conn)
	// Until the commit, cancelling the task breaks the stream: every wait
	// below ends, and the destination cleans up.
	unhook := context.AfterFunc(o.ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer unhook()

	hdr := migrateHeader{Version: migrateVersion, VM: o.vm, UUID: o.uuid, Source: m.host, Dest: dest, Power: power,
		Task: o.task, Options: options}
	if err := mc.send(hdr, migrateMsgTimeout); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	if _, err := mc.recvMsg(stepReady, migratePrepTimeout); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	prep := time.Since(t0)
	o.prog.Progress(0.1)

	// The memory. On failure SendLive leaves the guest running here.
	cw := &chunkWriter{w: mc.w}
	mopts := migrateOptions(row)
	var stream io.Writer = cw
	if mopts.Bandwidth > 0 {
		stream = &rateWriter{ctx: o.ctx, w: cw, rate: mopts.Bandwidth, start: time.Now()}
	}
	ts := time.Now()
	err = mig.SendLive(o.ctx, o.uuid, stream, mopts, func(f float64) { o.prog.Progress(0.1 + 0.8*min(max(f, 0), 1)) })
	send := time.Since(ts)
	if err != nil {
		m.log.Info("migration failed while sending", "vm", o.uuid, "dest", dest, "err", err)
		return m.migrateFailed(o, dest, err)
	}
	// The guest is stopped here from now on: until the commit, any
	// failure resumes it.
	m.journal(journal.Stop, o.uuid)
	rollback := func(cause error) error {
		unhook()
		_ = conn.SetDeadline(time.Time{})
		_ = mc.send(migrateMsg{Step: stepAbort}, time.Second)
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
	if !unhook() {
		return rollback(context.Canceled)
	}
	if err := m.commitMove(o, dest, rec.Domid); err != nil {
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
	committed = true
	_ = conn.SetDeadline(time.Time{})
	o.prog.Progress(0.95)
	m.handOver(o, mc, dest)
	m.removeMovedDomain(o, info)
	total := time.Since(t0)
	m.mig.last.Store(&MigrationTimes{Total: total, Prepare: prep, Send: send})
	m.log.Info("VM migrated", "vm", o.uuid, "dest", dest, "total", total, "send", send, "prepare", prep)
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
	if err != nil {
		m.log.Warn("migration recorded; the destination did not confirm", "vm", o.uuid, "dest", dest, "err", err)
	}
}

// commitMove records that the VM now runs on dest in domain domid: the
// commit point of a migration. The devices stay attached; the consoles
// go (the destination makes its own); this host's free memory grows.
func (m *Manager) commitMove(o *opCtx, dest string, domid int64) error {
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
func (m *Manager) releaseDisks(o *opCtx, dest string, info backend.DomainInfo) error {
	for _, d := range info.Disks {
		if d.VDI != "" && strings.Contains(d.Path, "://") {
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
