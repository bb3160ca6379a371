package xenops

import (
	"context"
	"net"
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/nbd"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// Copies in a storage migration (see storagemigrate.go): the disks
// nothing writes while they move, a halted VM's, a running VM's
// read-only ones and its snapshots', go as copies rather than mirrors.
// Storage serves the VDI on each side (a qemu-nbd of its own:
// storage.ExportReadOnly on the source's old VDI, shared with a guest
// that has it open; storage.Export on the destination's new one, made
// before the incoming domain attaches the VDI and ended, at the source's
// "copied", before the memory comes), and the source reads the one and
// writes the other through a storage.Relay, whose connections are
// migration streams to the destination, as a mirror's are. Runs of
// zeroes are not written (the new VDI reads as zeroes).
//
// A halted VM moves with VM.migrate_send as xapi's does: the call runs
// on a host that sees the VM's SRs; the migration stream's header says
// Halted; the destination makes the new VDIs and serves them (ready),
// the source copies, then commits (the VBDs repointed, one replicated
// write), says go, and destroys the old VDIs once the destination has
// let the new ones go (done). Before the commit a failure or
// cancellation destroys the new VDIs; a destination that loses the
// source asks the database whether the VBDs were repointed.

// DiskMover is what storage migration's copies need of storage: an
// optional interface of Config.Disks (the daemon's storage layer).
type DiskMover interface {
	// ExportVDI serves a VDI of this host as a writable NBD export
	// (VDI_IN_USE while it has another writer). Close undoes it.
	ExportVDI(ctx context.Context, vdi string) (*storage.Export, error)
	// ExportVDIReadOnly serves it read-only, sharing it with a running
	// guest that has it open.
	ExportVDIReadOnly(ctx context.Context, vdi string) (*storage.Export, error)
}

// copyPiece is what one read of a copy moves.
const copyPiece = 4 << 20

// ownVBD reports whether vbd belongs to VM vm or, for a copy, to one of
// its snapshots.
func ownVBD(r db.Reader, vm string, vbd *db.Row, copied bool) bool {
	owner := vbd.String(dm.VBD.VM)
	if owner == vm {
		return true
	}
	if !copied {
		return false
	}
	snap, ok := r.Get(dm.VM.Class, owner)
	return ok && snap.String(dm.VM.SnapshotOf) == vm
}

// snapshotMoves adds to moves the disks of vm's snapshots that go with
// it: those vdi_map names, or whose snapshot_of it names, on another SR
// than theirs. A snapshot's disk that stays must be on an SR the
// destination sees (VDI_NOT_IN_MAP otherwise, as xapi has it when no SR
// is left to map it to).
func snapshotMoves(r db.Reader, vm *db.Row, dest string, vdiMap map[dm.VDIRef]dm.SRRef, moves []diskMove) ([]diskMove, error) {
	for _, s := range strs(r.Value(vm, dm.VM.Snapshots)) {
		snap, ok := r.Get(dm.VM.Class, s)
		if !ok {
			continue
		}
		for _, vbd := range strs(r.Value(snap, dm.VM.VBDs)) {
			row, ok := r.Get(dm.VBD.Class, vbd)
			if !ok || row.Get(dm.VBD.Empty) == true || row.String(dm.VBD.Type) == string(dm.VBDTypeCD) {
				continue
			}
			vdi := row.String(dm.VBD.VDI)
			vrow, ok := r.Get(dm.VDI.Class, vdi)
			if !ok {
				continue
			}
			sr, mapped := vdiMap[dm.VDIRef(vdi)]
			if !mapped {
				sr, mapped = vdiMap[dm.VDIRef(vrow.String(dm.VDI.SnapshotOf))]
			}
			if !mapped || string(sr) == vrow.String(dm.VDI.SR) {
				if !hostSeesSR(r, dest, vrow.String(dm.VDI.SR)) && len(vdiMap) > 0 {
					return nil, xerr.New(xerr.VDINotInMap, vdi)
				}
				continue
			}
			if !hostSeesSR(r, dest, string(sr)) {
				return nil, xerr.New(xerr.VMRequiresSR, vm.Ref, string(sr))
			}
			moves = append(moves, diskMove{VBD: vbd, VDI: vdi, SR: string(sr), Copy: true})
		}
	}
	return moves, nil
}

// copyMovedDisks copies the moves marked Copy to dest's exports, through
// migration streams from dial, progress going from lo to hi.
func (m *Manager) copyMovedDisks(o *opCtx, dest string, hdr migrateHeader, moves []diskMove,
	dial func(context.Context) (net.Conn, error), lo, hi float64) error {
	var copies []diskMove
	for _, mv := range moves {
		if mv.Copy {
			copies = append(copies, mv)
		}
	}
	if len(copies) == 0 {
		return nil
	}
	mover, ok := m.disks.(DiskMover)
	if !ok {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host's storage cannot serve copies")
	}
	n := float64(len(copies))
	for i, mv := range copies {
		err := func() error {
			src, err := mover.ExportVDIReadOnly(o.ctx, mv.VDI)
			if err != nil {
				return err
			}
			defer func() { _ = src.Close() }()
			relay, err := tunnelRelay(dial, hdr, mv.Token)
			if err != nil {
				return err
			}
			defer func() { _ = relay.Close() }()
			base := lo + (hi-lo)*float64(i)/n
			return copyNBD(o.ctx, src.URI(), relay.URI(), func(f float64) { o.prog.Progress(base + (hi-lo)/n*f) })
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// copyNBD copies export from into export to (at least as large),
// skipping runs of zeroes; progress gets the share done.
func copyNBD(ctx context.Context, from, to nbd.URI, progress func(float64)) error {
	dctx, cancel := context.WithTimeout(ctx, migrateMsgTimeout)
	src, err := nbd.Dial(dctx, from)
	if err == nil {
		defer func() { _ = src.Close() }()
	}
	var dst *nbd.Client
	if err == nil {
		dst, err = nbd.Dial(dctx, to)
	}
	cancel()
	if err != nil {
		return err
	}
	defer func() { _ = dst.Close() }()
	size := src.Size()
	if dst.Size() < size {
		return xerr.New(xerr.VDITooSmall, "", "")
	}
	// A peer that stops answering is cut when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = src.Close(); _ = dst.Close() })
	defer stop()
	buf := make([]byte, copyPiece)
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		p := buf[:min(int64(len(buf)), size-off)]
		if _, err := src.ReadAt(p, off); err != nil {
			return err
		}
		if !allZero(p) {
			if _, err := dst.WriteAt(p, off); err != nil {
				return err
			}
		}
		off += int64(len(p))
		if progress != nil {
			progress(float64(off) / float64(size))
		}
	}
	return dst.Flush()
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// copyOut moves a halted VM's disks (VM.migrate_send of a halted VM):
// the source's side, on the VM's queue.
func (m *Manager) copyOut(o *opCtx, dest string, options map[string]string, moves []diskMove) error {
	pp := m.mig.peers.Load()
	if pp == nil {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host has no pool to migrate in")
	}
	if len(moves) == 0 {
		return nil // nothing moves: the VM is where it was (halted VMs live nowhere)
	}
	hdr := migrateHeader{Version: migrateVersion, VM: o.vm, UUID: o.uuid, Source: m.host, Dest: dest, Power: psHalted,
		Task: o.task, Options: options, Disks: moves}
	out, ready, err := m.openPeer(o, pp, hdr)
	if err != nil {
		return err
	}
	defer out.close()
	mc := out.mc
	o.prog.Progress(0.05)
	if err := m.takeReady(o.ctx, moves, ready.Disks); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	if err := m.copyMovedDisks(o, dest, hdr, moves, out.dial, 0.05, 0.95); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	if !out.unhook() {
		return cancelledErr(o.task)
	}
	// The commit point.
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, o.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", o.vm)
		}
		if p := row.String(dm.VM.PowerState); p != psHalted {
			return xerr.New(xerr.VMBadPowerState, o.vm, powerName(psHalted), powerName(p))
		}
		if err := repointVBDs(tx, moves); err != nil {
			return err
		}
		return refreshVM(tx, o.vm)
	}); err != nil {
		_ = mc.send(migrateMsg{Step: stepAbort}, time.Second)
		return m.migrateFailed(o, dest, err)
	}
	_ = mc.c.SetDeadline(time.Time{})
	if err := mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout); err == nil {
		_, err = mc.recvMsg(stepDone, migrateMsgTimeout)
		if err != nil {
			m.log.Warn("disks moved; the destination did not confirm", "vm", o.uuid, "dest", dest, "err", err)
		}
	}
	m.destroyVDIs(o.ctx, oldVDIs(moves), "a storage migration moved away from")
	m.log.Info("halted VM's disks moved", "vm", o.uuid, "dest", dest, "disks", len(moves))
	return nil
}

// acceptCopy checks the header of a halted VM's disk move: the VM is
// halted and marked migrate_send, and the disks are its or its
// snapshots'.
func (m *Manager) acceptCopy(row *db.Row, h migrateHeader) (string, error) {
	if p := row.String(dm.VM.PowerState); p != psHalted {
		return "", xerr.New(xerr.VMBadPowerState, row.Ref, powerName(psHalted), powerName(p))
	}
	cur, _ := row.Get(dm.VM.CurrentOperations).(map[string]string)
	marked := false
	for _, o := range cur {
		marked = marked || o == string(dm.VMOperationsMigrateSend)
	}
	if !marked {
		return "", xerr.New(xerr.OperationNotAllowed, "the VM is not being migrated")
	}
	for _, mv := range h.Disks {
		if !mv.Copy {
			return "", xerr.New(xerr.InternalError, "migration: a halted VM's disks are copied")
		}
	}
	if err := m.checkMoves(m.db.Snapshot(), row.Ref, h.Disks); err != nil {
		return "", err
	}
	return row.Ref, nil
}

// copyIn is the destination's side of a halted VM's disk move.
func (m *Manager) copyIn(ctx context.Context, mc *migConn, h migrateHeader, ref string) error {
	fail := func(err error) error {
		_ = mc.send(failedMsg(err), time.Second)
		return err
	}
	kept := false
	moves := append([]diskMove(nil), h.Disks...)
	newVDIs, err := m.createMovedVDIs(ctx, moves)
	defer func() {
		if !kept {
			m.destroyVDIs(ctx, newVDIs, "an incoming storage migration made")
		}
	}()
	if err != nil {
		return fail(err)
	}
	exports, err := m.exportCopies(ctx, h, moves)
	if err != nil {
		return fail(err)
	}
	defer exports.close(ctx)
	if err := mc.send(migrateMsg{Step: stepReady, Disks: moves}, migrateMsgTimeout); err != nil {
		return err
	}
	// The copies take as long as they take: no deadline of our own; a
	// source that fails breaks the stream.
	msg, err := mc.recvMsg(stepGo, 0)
	exports.close(ctx)
	switch {
	case err == nil:
	case msg.Step == stepAbort:
		return errMoveAborted
	default:
		if kept = m.repointedHere(ctx, moves); !kept {
			return err
		}
		m.log.Warn("lost the source of a disk move after its commit: keeping the disks", "vm", h.UUID, "err", err)
		return nil
	}
	kept = true
	_ = mc.send(migrateMsg{Step: stepDone}, migrateMsgTimeout)
	return nil
}

// repointedHere reports whether the database has the moves' VBDs on the
// new VDIs, now or within a short wait for the commit to reach this
// replica.
func (m *Manager) repointedHere(ctx context.Context, moves []diskMove) bool {
	return m.awaitDB(migrateAwaitCommit, nil, ctx.Done(), func(r db.Reader) (yes, settled bool) {
		for _, mv := range moves {
			if v, ok := r.Get(dm.VBD.Class, mv.VBD); !ok || v.String(dm.VBD.VDI) != mv.New {
				return false, false
			}
		}
		return true, true
	})
}
