package xenops

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// The destination's side of a live migration (see migrate.go).

// errMoveAborted is the source's abort before the commit.
var errMoveAborted = errors.New("the source abandoned the migration")

// ServeMigration receives a VM sent over a migration stream
// (pool.MigrationReceiver). It owns conn and closes it.
func (m *Manager) ServeMigration(ctx context.Context, conn net.Conn) {
	defer func() { _ = conn.Close() }()
	mc := newMigConn(conn)
	var h migrateHeader
	if err := mc.recv(&h, migrateMsgTimeout); err != nil {
		m.log.Warn("unreadable migration header", "err", err)
		return
	}
	if h.Tunnel != "" {
		m.serveTunnel(ctx, conn, mc, h) // a storage migration's mirror
		return
	}
	ref, err := m.acceptMigration(h)
	if err != nil {
		m.log.Warn("migration refused", "vm", h.UUID, "source", h.Source, "err", err)
		_ = mc.send(failedMsg(err), migrateMsgTimeout)
		return
	}
	// The VM is busy here from now on: no check of its queue treats the
	// incoming domain as a stray.
	jctx, cancel := context.WithCancel(m.bg)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	key := "migrate-in:" + db.NewRef()
	m.trackOp(ref, key, "pool_migrate_in", cancel)
	defer m.untrackOp(ref, key)
	j := &job{ctx: jctx, name: "VM.pool_migrate (incoming)", run: func(ctx context.Context) error {
		if !liveState(h.Power) {
			return m.copyIn(ctx, mc, h, ref) // a halted or suspended VM's disks (storagecopy.go)
		}
		return m.migrateIn(ctx, mc, h, ref)
	}}
	m.q.submit(ref, j)
	if err := j.wait(); err != nil {
		m.log.Info("incoming migration not taken", "vm", h.UUID, "source", h.Source, "err", err)
		if isCancel(err) {
			_ = mc.send(failedMsg(cancelledErr("")), time.Second)
		}
	}
}

// acceptMigration checks a migration header against the database: the
// VM is the one named, live on the sending host (not this one) and
// marked pool_migrate there, and has no domain here.
func (m *Manager) acceptMigration(h migrateHeader) (string, error) {
	if h.Version != migrateVersion {
		return "", xerr.New(xerr.InternalError, "unknown migration protocol version")
	}
	if h.Dest != m.host {
		return "", xerr.New(xerr.InternalError, "the migration is meant for another host")
	}
	row, ok := m.db.Snapshot().Get(dm.VM.Class, h.VM)
	if !ok || row.UUID() != h.UUID {
		return "", xerr.New(xerr.HandleInvalid, "VM", h.VM)
	}
	if h.Power == psHalted || h.Power == psSuspended {
		return m.acceptCopy(row, h)
	}
	if src := row.String(dm.VM.ResidentOn); src != h.Source || src == m.host {
		return "", xerr.New(xerr.VMNotResidentHere, row.Ref, h.Source)
	}
	if p := row.String(dm.VM.PowerState); p != psRunning && p != psPaused {
		return "", xerr.New(xerr.VMBadPowerState, row.Ref, powerName(psRunning), powerName(p))
	}
	cur, _ := row.Get(dm.VM.CurrentOperations).(map[string]string)
	marked := false
	for _, o := range cur {
		marked = marked || o == string(dm.VMOperationsPoolMigrate) || o == string(dm.VMOperationsMigrateSend)
	}
	if !marked {
		return "", xerr.New(xerr.OperationNotAllowed, "the VM is not being migrated")
	}
	if m.busy(row.Ref) {
		return "", otherOperationInProgress("VM", row.Ref, nil, []string{"pool_migrate"})
	}
	if _, ok := m.be.Info(h.UUID); ok {
		return "", xerr.New(xerr.InternalError, "the VM already has a domain on the destination")
	}
	if _, ok := m.be.(backend.Migrator); !ok {
		return "", xerr.New(xerr.VMMigrateFailed, row.Ref, h.Source, m.host, "the "+m.be.Name()+" backend cannot receive a migration")
	}
	if err := m.checkMoves(m.db.Snapshot(), row.Ref, h.Disks); err != nil {
		return "", err
	}
	return row.Ref, nil
}

// migrateIn builds the incoming domain, receives the guest and, once the
// move is recorded, runs it here. Until then any failure removes the
// domain and what it holds.
func (m *Manager) migrateIn(ctx context.Context, mc *migConn, h migrateHeader, ref string) (err error) {
	o := m.internalOp(ctx, ref, h.UUID, "pool_migrate_in")
	// A storage migration's disks: new VDIs here, destroyed unless the
	// move commits (after the domain that uses them, deferred below).
	adopted := false
	moves := slices.Clone(h.Disks)
	newVDIs, err := m.createMovedVDIs(ctx, moves)
	defer func() {
		if !adopted {
			m.destroyVDIs(ctx, newVDIs, "an incoming storage migration made")
		}
	}()
	if err != nil {
		return failIncoming(mc, err)
	}
	var exports *incomingExports
	if len(moves) > 0 {
		// A storage migration: the copies first, served before the
		// domain is built (storage attaches their VDIs read-write before
		// the domain attaches them; the disks with a base are clones of
		// copies: storagecopy.go, storagechain.go).
		exports, err = m.receiveCopies(ctx, mc, h, moves, migrateMsg{Step: stepReady, Disks: moves},
			func(ie *incomingExports, i int) error { return m.cloneMoved(ctx, ie, moves, i, &newVDIs) })
		defer exports.close(ctx)
		if err != nil {
			return failIncoming(mc, err)
		}
	}
	// The reservation ends when the domain counts as complete (adopted),
	// or with the migration: never both at once.
	p, release, err := m.planIncoming(ref, movedSet(moves))
	if err != nil {
		return failIncoming(mc, err)
	}
	defer release()
	var made bootMade
	defer func() {
		if !adopted {
			m.undoIncoming(o, &made)
		}
	}()
	defer exports.close(ctx) // before the domain goes (once)
	// A broken stream ends the build as well.
	if err := m.buildDomain(o, p, &made); err != nil {
		return failIncoming(mc, err)
	}
	next := migrateMsg{Step: stepReady}
	if len(moves) > 0 {
		if err := exports.exportMirrors(ctx, h, p, moves); err != nil {
			return failIncoming(mc, err)
		}
		next = migrateMsg{Step: stepMirrors, Disks: moves}
	}
	if err := mc.send(next, migrateMsgTimeout); err != nil {
		return err
	}
	return m.receiveIncoming(ctx, o, mc, h, p, release, exports, &adopted)
}

// failIncoming tells the source of an incoming migration that it failed
// with err, and returns err.
func failIncoming(mc *migConn, err error) error {
	_ = mc.send(failedMsg(err), time.Second)
	return err
}

// receiveIncoming receives the guest's memory into the domain built for
// an incoming migration of h (p its plan), then waits for the source's
// go and adopts the VM; without go, the database decides. *adopted is
// set once the VM is this host's (from then on its domain stays).
func (m *Manager) receiveIncoming(ctx context.Context, o *opCtx, mc *migConn, h migrateHeader, p *bootPlan, release func(),
	exports *incomingExports, adopted *bool) error {
	m.log.Info("receiving a migrating VM", "vm", h.UUID, "source", h.Source)
	t0 := time.Now()
	info, err := m.receiveMemory(ctx, mc, h.UUID, exports, len(h.Disks) > 0) // acceptMigration checked the backend
	if err != nil {
		return failIncoming(mc, err)
	}
	m.log.Debug("migration received", "vm", h.UUID, "took", time.Since(t0))
	// Without go, the database decides.
	settle := func(cause error) error {
		if !m.committedHere(ctx, h) {
			m.log.Warn("lost the source of a migration before its commit: dropping the incoming domain", "vm", h.UUID, "err", cause)
			return cause
		}
		m.log.Warn("lost the source of a migration after its commit: running the VM here", "vm", h.UUID, "err", cause)
		*adopted = true
		m.adoptIncoming(o, p, h, release)
		return nil
	}
	if err := mc.send(migrateMsg{Step: stepReceived, Domid: info.Domid}, migrateMsgTimeout); err != nil {
		return settle(err)
	}
	msg, err := m.awaitGo(ctx, mc, h)
	switch {
	case err == nil:
	case msg.Step == stepAbort:
		return errMoveAborted
	default:
		return settle(err)
	}
	m.testFault(faultDestAfterGo)
	// The commit may not have reached this replica yet: the record is
	// written here on top of it.
	if !m.committedHere(ctx, h) {
		m.log.Warn("told to run a migrated VM whose move this host's replica does not show yet", "vm", h.UUID)
	}
	m.testFault(faultDestCommitted)
	*adopted = true
	m.adoptIncoming(o, p, h, release)
	m.receiveRRD(mc, h)
	_ = mc.send(migrateMsg{Step: stepDone}, migrateMsgTimeout)
	return nil
}

// receiveMemory receives the guest's memory into the incoming domain of
// uuid (the backend is a Migrator: the header's check said so) and reads
// the stream's end; then the disks' exports end (their mirrors completed
// before the switchover). It returns the domain. mirrored: the source
// mirrors disks before it sends, so the first byte may be long in coming.
func (m *Manager) receiveMemory(ctx context.Context, mc *migConn, uuid string, exports *incomingExports, mirrored bool) (backend.DomainInfo, error) {
	cr := &chunkReader{c: mc.c, r: mc.r}
	err := m.be.(backend.Migrator).ReceiveLive(ctx, uuid, &stallReader{r: cr, c: mc.c, d: migrateStall, waitFirst: mirrored})
	if err == nil {
		err = cr.drain(maxChunk)
	}
	if err != nil {
		return backend.DomainInfo{}, err
	}
	exports.close(ctx)
	info, ok := m.be.Info(uuid)
	if !ok {
		return backend.DomainInfo{}, xerr.New(xerr.InternalError, "the incoming domain vanished")
	}
	return info, nil
}

// planIncoming plans the incoming domain of VM ref, the VBDs of the
// VDIs in moved on their new VDIs, checks it with the backend and
// reserves its memory. release ends the reservation; calls after the
// first do nothing.
func (m *Manager) planIncoming(ref string, moved map[string]string) (p *bootPlan, release func(), err error) {
	p, err = m.planMoving(m.db.Snapshot(), ref, moved)
	if err != nil {
		return nil, nil, err
	}
	p.spec.Incoming, p.spec.AutoStart = true, false
	if err := m.be.Check(p.spec); err != nil {
		return nil, nil, err
	}
	if err := m.reserve(p.spec.Memory); err != nil {
		return nil, nil, err
	}
	var unreserve sync.Once
	return p, func() { unreserve.Do(func() { m.reserved.Add(-p.spec.Memory) }) }, nil
}

// committedHere settles an incoming migration whose source went silent
// after the guest's state arrived: the move committed if the database
// says the VM is resident here, now or within a short wait for the
// commit to reach this replica.
func (m *Manager) committedHere(ctx context.Context, h migrateHeader) bool {
	return m.residentHere(h.VM, nil, ctx.Done(), migrateAwaitCommit)
}

// adoptIncoming makes the received domain the VM's: complete (release
// then ends its memory reservation), started if the VM was running, and
// the record following it (domid, devices, consoles, metrics, this
// host's free memory).
func (m *Manager) adoptIncoming(o *opCtx, p *bootPlan, h migrateHeader, release func()) {
	bg := context.WithoutCancel(o.ctx)
	if err := m.be.MarkComplete(h.UUID); err != nil {
		m.log.Error("cannot mark a migrated domain complete", "vm", h.UUID, "err", err)
	}
	release() // the domain's memory now counts as a complete domain's
	m.journal(journal.Start, h.UUID)
	power := psPaused
	if h.Power == psRunning {
		if err := m.be.Unpause(bg, h.UUID); err != nil {
			m.log.Error("cannot start a migrated guest", "vm", h.UUID, "err", err)
		} else {
			power = psRunning
		}
	}
	info, ok := m.be.Info(h.UUID)
	if !ok {
		m.log.Error("a migrated domain vanished", "vm", h.UUID)
		return
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		if err := setExisting(tx, dm.VBD.Class, dm.VBD.Userdevice, p.userdevices); err != nil {
			return err
		}
		if err := setExisting(tx, dm.VIF.Class, dm.VIF.MAC, p.macs); err != nil {
			return err
		}
		return m.setLive(tx, o.vm, info, power)
	}); err != nil {
		m.log.Error("cannot record a migrated VM here", "vm", h.UUID, "err", err)
	}
}

// receiveRRD takes the VM's RRD the source sends after go.
func (m *Manager) receiveRRD(mc *migConn, h migrateHeader) {
	_ = mc.c.SetReadDeadline(time.Now().Add(migrateMsgTimeout))
	defer func() { _ = mc.c.SetReadDeadline(time.Time{}) }()
	cr := &chunkReader{c: mc.c, r: mc.r}
	b, err := io.ReadAll(io.LimitReader(cr, maxRRDBytes+1))
	if err == nil && len(b) > maxRRDBytes {
		err = errors.New("the RRD is too large")
	}
	if err != nil {
		m.log.Warn("no RRD came with a migrated VM", "vm", h.UUID, "err", err)
		return
	}
	mp := m.mig.metrics.Load()
	if mp == nil || len(b) == 0 {
		return
	}
	if err := (*mp).ImportVM(h.UUID, b); err != nil {
		m.log.Warn("cannot keep a migrated VM's RRD", "vm", h.UUID, "err", err)
	}
}

// undoIncoming removes what an incoming migration made here. No journal
// entry: the guest never ran here.
func (m *Manager) undoIncoming(o *opCtx, b *bootMade) {
	bg := context.WithoutCancel(o.ctx)
	if b.domain {
		if err := m.be.Destroy(bg, o.uuid); err != nil {
			m.log.Error("removing an incoming domain", "vm", o.uuid, "err", err)
		}
	}
	m.detachAll(bg, o.uuid, b.attached)
	m.releaseNICs(bg, slices.Clone(b.vifs))
}
