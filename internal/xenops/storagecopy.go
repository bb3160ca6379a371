package xenops

import (
	"context"
	"maps"
	"net"
	"slices"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/nbd"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// Copies in a storage migration (see storagemigrate.go): the disks
// nothing writes while they move, a halted or suspended VM's (and its
// memory image), a running VM's read-only ones, its snapshots' and its
// checkpoints' memory images, go as copies rather than mirrors.
// Storage serves the VDI on each side (a qemu-nbd of its own:
// storage.ExportReadOnly on the source's old VDI, shared with a guest
// that has it open; storage.Export on the destination's new one, made
// before the incoming domain attaches the VDI and ended, at the source's
// "copied", before the memory comes), and the source reads the one and
// writes the other through a storage.Relay, whose connections are
// migration streams to the destination, as a mirror's are. Runs of
// zeroes are not written (the new VDI reads as zeroes).
//
// A halted or suspended VM moves with VM.migrate_send as xapi's does:
// the call runs on a host that sees the VM's SRs; the migration
// stream's header says Halted or Suspended; the destination makes the new VDIs and serves them (ready),
// the source copies (asking for the clones that copies with a Base
// start from) and says copied, then commits (the VBDs repointed, one replicated
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
	// DiffExtents lists where vdi differs from base, an older snapshot
	// in its history on the same SR (storage.ErrNoSharedHistory where
	// the SR cannot tell: copy it whole).
	DiffExtents(ctx context.Context, vdi, base string) ([]storage.Extent, error)
	// IsOverlayOf reports whether vdi reads as base with its own top
	// image over it.
	IsOverlayOf(ctx context.Context, vdi, base string) (bool, error)
}

// copyPiece is what one read of a copy moves.
const copyPiece = 4 << 20

// ownMove reports whether mv is a disk of VM vm or, for a copy, of one
// of its snapshots, or the suspend image of one of its checkpoints.
func ownMove(r db.Reader, vm string, mv diskMove) bool {
	if mv.Suspend != "" {
		owner, ok := r.Get(dm.VM.Class, mv.Suspend)
		return ok && mv.Copy && mv.VBD == "" && mv.Base == "" && (mv.Suspend == vm || owner.String(dm.VM.SnapshotOf) == vm) &&
			owner.String(dm.VM.SuspendVDI) == mv.VDI
	}
	vbd, ok := r.Get(dm.VBD.Class, mv.VBD)
	if !ok || vbd.String(dm.VBD.VDI) != mv.VDI {
		return false
	}
	owner := vbd.String(dm.VBD.VM)
	if owner == vm {
		return true
	}
	if !mv.Copy {
		return false
	}
	snap, ok := r.Get(dm.VM.Class, owner)
	return ok && snap.String(dm.VM.SnapshotOf) == vm
}

// fixSuspendSR clears the suspend_SR of a VM moving to dest when dest
// does not see it (xapi's intra_pool_fix_suspend_sr: a host-local SR
// left behind).
func fixSuspendSR(tx *db.Tx, vm *db.Row, dest string) error {
	sr := vm.String(dm.VM.SuspendSR)
	if sr == "" || sr == schema.NullRef || hostSeesSR(tx, dest, sr) {
		return nil
	}
	return tx.Set(dm.VM.SuspendSR, vm.Ref, schema.NullRef)
}

// suspendVMHint is the sm_config key of a suspend image VDI naming the
// VM it is for (xapi's).
const suspendVMHint = "vmhint"

// snapshotMoves adds to moves the disks of vm's snapshots that go with
// it: those vdi_map names, or whose snapshot_of it names, on another SR
// than theirs. A snapshot's disk that stays must be on an SR the
// destination sees (VDI_NOT_IN_MAP otherwise, as xapi has it when no SR
// is left to map it to). So do the suspend images of its checkpoints on
// SRs the destination does not see (xapi's suspends_vdis): to the SR
// vdi_map names, else the pool's suspend image SR, else the
// destination's, else the pool's default SR, the first the destination
// sees (VDI_NOT_IN_MAP when none).
func snapshotMoves(r db.Reader, vm *db.Row, dest string, vdiMap map[dm.VDIRef]dm.SRRef, moves []diskMove) ([]diskMove, error) {
	for _, s := range strs(r.Value(vm, dm.VM.Snapshots)) {
		snap, ok := r.Get(dm.VM.Class, s)
		if !ok {
			continue
		}
		if mv, ok, err := suspendMove(r, snap, dest, vdiMap); err != nil {
			return nil, err
		} else if ok {
			moves = append(moves, mv)
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

// suspendMove is the move of checkpoint snap's suspend image, if it must
// move for dest to see it.
func suspendMove(r db.Reader, snap *db.Row, dest string, vdiMap map[dm.VDIRef]dm.SRRef) (diskMove, bool, error) {
	if snap.String(dm.VM.PowerState) != psSuspended {
		return diskMove{}, false, nil
	}
	vdi, ok := r.Get(dm.VDI.Class, snap.String(dm.VM.SuspendVDI))
	if !ok || hostSeesSR(r, dest, vdi.String(dm.VDI.SR)) {
		return diskMove{}, false, nil
	}
	cands := []string{string(vdiMap[dm.VDIRef(vdi.Ref)])}
	for _, p := range r.All(dm.Pool.Class) {
		cands = append(cands, p.String(dm.Pool.SuspendImageSR))
	}
	if h, ok := r.Get(dm.Host.Class, dest); ok {
		cands = append(cands, h.String(dm.Host.SuspendImageSR))
	}
	for _, p := range r.All(dm.Pool.Class) {
		cands = append(cands, p.String(dm.Pool.DefaultSR))
	}
	for _, sr := range cands {
		if _, ok := r.Get(dm.SR.Class, sr); ok && hostSeesSR(r, dest, sr) {
			return diskMove{VDI: vdi.Ref, SR: sr, Copy: true, Suspend: snap.Ref}, true, nil
		}
	}
	return diskMove{}, false, xerr.New(xerr.VDINotInMap, vdi.Ref)
}

// copyChain copies the moves marked Copy to dest's exports, through
// migration streams from dial, progress going from lo to hi, each after
// its Base (copyOrder): for a move with a Base it asks the destination
// over mc for the clone it starts from, and writes only what differs
// from that base.
func (m *Manager) copyChain(o *opCtx, dest string, hdr migrateHeader, moves []diskMove, mc *migConn,
	dial func(context.Context) (net.Conn, error), lo, hi float64) error {
	copies, err := copyOrder(moves)
	if err != nil || len(copies) == 0 {
		return err
	}
	mover, ok := m.disks.(DiskMover)
	if !ok {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host's storage cannot serve copies")
	}
	n := float64(len(copies))
	for k, i := range copies {
		if moves[i].Base != "" {
			if err := askClone(mc, moves, i); err != nil {
				return err
			}
		}
		mv := moves[i]
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
			base := lo + (hi-lo)*float64(k)/n
			progress := func(f float64) { o.prog.Progress(base + (hi-lo)/n*f) }
			if mv.Base != "" {
				return copyExtents(o.ctx, src.URI(), relay.URI(), mv.diff, progress)
			}
			return copyNBD(o.ctx, src.URI(), relay.URI(), progress)
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// withNBDPair connects to exports from and to and runs fn on them, then
// flushes to. A peer that stops answering is cut when ctx ends.
func withNBDPair(ctx context.Context, from, to nbd.URI, fn func(src, dst *nbd.Client) error) error {
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
	stop := context.AfterFunc(ctx, func() { _ = src.Close(); _ = dst.Close() })
	defer stop()
	if err := fn(src, dst); err != nil {
		return err
	}
	return dst.Flush()
}

// copyNBD copies export from into export to (at least as large),
// skipping runs of zeroes; progress gets the share done.
func copyNBD(ctx context.Context, from, to nbd.URI, progress func(float64)) error {
	return withNBDPair(ctx, from, to, func(src, dst *nbd.Client) error {
		size := src.Size()
		if dst.Size() < size {
			return xerr.New(xerr.VDITooSmall, "", "")
		}
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
		return nil
	})
}

func allZero(p []byte) bool {
	for _, b := range p {
		if b != 0 {
			return false
		}
	}
	return true
}

// copyOut moves a halted or suspended VM's disks (VM.migrate_send of a
// VM in power state power, with a suspended one's memory image): the
// source's side, on the VM's queue.
func (m *Manager) copyOut(o *opCtx, dest, power string, options map[string]string, moves []diskMove) error {
	pp := m.mig.peers.Load()
	if pp == nil {
		return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "this host has no pool to migrate in")
	}
	if len(moves) == 0 {
		return nil // nothing moves: the VM is where it was (halted VMs live nowhere)
	}
	hdr, out, ready, err := m.openMoving(o, pp, dest, power, options, moves)
	if err != nil {
		return err
	}
	moves = hdr.Disks
	defer out.close()
	mc := out.mc
	o.prog.Progress(0.05)
	if err := m.takeReady(o.ctx, moves, ready.Disks, false); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	if err := m.copyChain(o, dest, hdr, moves, mc, out.dial, 0.05, 0.95); err != nil {
		return m.migrateFailed(o, dest, err)
	}
	if err := mc.send(migrateMsg{Step: stepCopied}, migrateMsgTimeout); err != nil { // every move is a copy
		return m.migrateFailed(o, dest, err)
	}
	// The commit reads the clones the destination made.
	if err := m.awaitVDIs(o.ctx, slices.Collect(maps.Values(movedSet(moves)))); err != nil {
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
		if p := row.String(dm.VM.PowerState); p != power {
			return xerr.New(xerr.VMBadPowerState, o.vm, powerName(power), powerName(p))
		}
		if err := fixSuspendSR(tx, row, dest); err != nil {
			return err
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
	m.log.Info("a VM's disks moved without a domain", "vm", o.uuid, "dest", dest, "disks", len(moves))
	return nil
}

// acceptCopy checks the header of a halted or suspended VM's disk move:
// the VM is in h.Power and marked migrate_send, and the disks are its
// or its snapshots' (or their memory images).
func (m *Manager) acceptCopy(row *db.Row, h migrateHeader) (string, error) {
	if p := row.String(dm.VM.PowerState); p != h.Power {
		return "", xerr.New(xerr.VMBadPowerState, row.Ref, powerName(h.Power), powerName(p))
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
			return "", xerr.New(xerr.InternalError, "migration: the disks of a VM without a domain are copied")
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
	// The copies take as long as they take: no deadline of our own; a
	// source that fails breaks the stream. Those with a base start from
	// a clone made when the source asks.
	exports, err := m.receiveCopies(ctx, mc, h, moves, migrateMsg{Step: stepReady, Disks: moves},
		func(ie *incomingExports, i int) error { return m.cloneMoved(ctx, ie, moves, i, &newVDIs) })
	defer exports.close(ctx)
	if err != nil {
		return fail(err)
	}
	exports.close(ctx)
	msg, err := mc.recvMsg(stepGo, 0)
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
