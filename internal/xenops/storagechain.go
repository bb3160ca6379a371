package xenops

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/nbd"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// Snapshot chains in a storage migration inside a pool, as xapi's
// storage migration handles them: a disk and its snapshots share their
// history on the source SR (a backing chain), and they arrive on the
// destination SR sharing it again, with the shared part sent once.
//
// The source orders the moves of one disk's family going to one SR
// oldest snapshot first, the disk last (chainMoves), and gives each
// after the first a Base: the move before it in the family. Its storage
// says what differs (DiskMover.DiffExtents, from the SR's chain
// metadata; where it cannot tell, the move has no Base and goes whole).
//
//   - A snapshot's disk with a Base: when its turn comes the source asks
//     (step "clone") and the destination clones the Base's new VDI
//     (VDI.clone: constant time on a file SR, the two then share the
//     copied image as a backing file), grows it to the size wanted and
//     serves it; the source then writes only what differs, zeroes
//     included.
//   - The running disk with a Base: it is mirrored with only its top
//     image (backend.MirrorTop) onto a clone of the newest snapshot's
//     new VDI, which the destination makes once the copies are done and
//     before it builds the incoming domain; the source checks first that
//     the disk reads as that snapshot with its top image over it
//     (DiskMover.IsOverlayOf), otherwise the disk is mirrored whole onto
//     a fresh VDI.
//   - A halted VM's disk is copied as a snapshot's is.
//
// xapi makes the same shape another way (a mirror of new writes into a
// leaf that VDI.compose later puts over the copied parent); the result on
// the destination SR is the same: one full image at the bottom, each
// later one holding what changed.
//
// At the commit the new VDIs take the old ones' names, tags and snapshot
// fields (is_a_snapshot, snapshot_time, and snapshot_of pointing at the
// new VDI of the disk that moved with them), as xapi's migration updates
// them on the destination.

// chainMoves gives each move it can its Base, with the extents a copy
// must write: in each family (a disk and the snapshots of it going to
// one SR) every snapshot after the oldest is based on the one before it,
// and the disk on the newest. A move it cannot base goes whole. The
// order of moves is kept (copyOrder says in which order they are
// copied).
func (m *Manager) chainMoves(ctx context.Context, r db.Reader, moves []diskMove) []diskMove {
	mover, ok := m.disks.(DiskMover)
	if !ok || len(moves) < 2 {
		return moves
	}
	type member struct {
		i    int
		snap bool
		at   time.Time
		size int64
		root string // the family: the disk the snapshots were taken of
	}
	ms := make([]member, 0, len(moves))
	for i, mv := range moves {
		x := member{i: i, root: mv.VDI}
		if v, ok := r.Get(dm.VDI.Class, mv.VDI); ok {
			x.size, _ = v.Get(dm.VDI.VirtualSize).(int64)
			if of := v.String(dm.VDI.SnapshotOf); v.Get(dm.VDI.IsASnapshot) == true && of != "" && of != schema.NullRef {
				x.snap, x.root = true, of
				x.at, _ = v.Get(dm.VDI.SnapshotTime).(time.Time)
			}
		}
		ms = append(ms, x)
	}
	// Each family's snapshots oldest first, then its disk.
	slices.SortStableFunc(ms, func(a, b member) int {
		if a.snap != b.snap {
			if a.snap {
				return -1
			}
			return 1
		}
		if !a.snap {
			return 0
		}
		return cmp.Or(cmp.Compare(a.root, b.root), cmp.Compare(moves[a.i].SR, moves[b.i].SR), a.at.Compare(b.at))
	})
	out := slices.Clone(moves)
	last := map[[2]string]member{} // family and SR -> its newest snapshot so far
	for _, x := range ms {
		mv := &out[x.i]
		fam := [2]string{x.root, mv.SR}
		base, has := last[fam]
		if x.snap {
			last[fam] = x
		}
		if !has || base.size > x.size {
			continue
		}
		b := moves[base.i]
		if mv.Copy {
			ext, err := mover.DiffExtents(ctx, mv.VDI, b.VDI)
			if err != nil {
				if !errors.Is(err, storage.ErrNoSharedHistory) {
					m.log.Warn("cannot tell what a disk adds to its snapshot: copying it whole", "vdi", mv.VDI, "base", b.VDI, "err", err)
				}
				continue
			}
			mv.Base, mv.diff = b.VBD, ext
			continue
		}
		over, err := mover.IsOverlayOf(ctx, mv.VDI, b.VDI)
		if err != nil {
			m.log.Warn("cannot tell whether a disk is its snapshot with its top over it: mirroring it whole", "vdi", mv.VDI, "err", err)
		}
		if over {
			mv.Base = b.VBD
		}
	}
	return out
}

// copyOrder is the order in which the copies among moves go: each after
// its Base. An error says a Base is not another copy to the same SR, or
// the Bases go round in a circle (a hostile header).
//
// It takes time linear in the moves, times the longest chain of bases.
func copyOrder(moves []diskMove) ([]int, error) {
	bad := xerr.New(xerr.InternalError, "migration: a disk's base is not another copy to its SR")
	first := make(map[string]int, len(moves)) // VBD -> its first move, as baseOf finds it
	for i, mv := range moves {
		if _, ok := first[mv.VBD]; !ok {
			first[mv.VBD] = i
		}
	}
	base := make([]int, len(moves))
	copies := 0
	for i, mv := range moves {
		base[i] = -1
		if mv.Copy {
			copies++
		}
		if mv.Base == "" {
			continue
		}
		j, ok := first[mv.Base]
		if !ok || j == i || !moves[j].Copy || moves[j].SR != mv.SR {
			return nil, bad
		}
		base[i] = j
	}
	var order []int
	done := make([]bool, len(moves))
	for len(order) < copies {
		progressed := false
		for i, mv := range moves {
			if done[i] || !mv.Copy || base[i] >= 0 && !done[base[i]] {
				continue
			}
			done[i], progressed = true, true
			order = append(order, i)
		}
		if !progressed {
			return nil, bad
		}
	}
	return order, nil
}

// checkBases checks the Bases in a migration's moves (copyOrder).
func checkBases(moves []diskMove) error {
	_, err := copyOrder(moves)
	return err
}

// baseOf is the index of mv's base move in moves (-1: none).
func baseOf(moves []diskMove, mv diskMove) int {
	if mv.Base == "" {
		return -1
	}
	return slices.IndexFunc(moves, func(b diskMove) bool { return b.VBD == mv.Base })
}

// askClone is the source's side of a copy with a Base: the destination
// makes the new VDI of moves[i] from the Base's and serves it; moves[i]
// gets its New and Token.
func askClone(mc *migConn, moves []diskMove, i int) error {
	if mc == nil {
		return xerr.New(xerr.InternalError, "migration: a copy with a base needs the migration's stream")
	}
	ask := moves[i]
	ask.diff = nil
	if err := mc.send(migrateMsg{Step: stepClone, Disk: i + 1, Disks: []diskMove{ask}}, migrateMsgTimeout); err != nil {
		return err
	}
	got, err := mc.recvMsg(stepClone, migratePrepTimeout)
	if err != nil {
		return err
	}
	if got.Disk != i+1 || len(got.Disks) != 1 || got.Disks[0].New == "" || got.Disks[0].Token == "" {
		return xerr.New(xerr.InternalError, "migration: the destination answered for another disk")
	}
	moves[i].New, moves[i].Token = got.Disks[0].New, got.Disks[0].Token
	return nil
}

// copyExtents writes the extents ext of export from into export to (a
// clone of the base they were measured against), zeroes as zeroes.
func copyExtents(ctx context.Context, from, to nbd.URI, ext []storage.Extent, progress func(float64)) error {
	return withNBDPair(ctx, from, to, func(src, dst *nbd.Client) error {
		var total, done int64
		for _, e := range ext {
			total += e.Length
		}
		buf := make([]byte, copyPiece)
		for _, e := range ext {
			if e.Offset+e.Length > src.Size() || e.Offset+e.Length > dst.Size() || e.Offset < 0 || e.Length < 0 {
				return xerr.New(xerr.VDITooSmall, "", "")
			}
			for off, end := e.Offset, e.Offset+e.Length; off < end; {
				if err := ctx.Err(); err != nil {
					return err
				}
				n := min(int64(len(buf)), end-off)
				if e.Zero {
					if err := dst.WriteZeroes(off, n); err != nil {
						return err
					}
				} else {
					p := buf[:n]
					if _, err := src.ReadAt(p, off); err != nil {
						return err
					}
					if _, err := dst.WriteAt(p, off); err != nil {
						return err
					}
				}
				off += n
				done += n
				if progress != nil && total > 0 {
					progress(float64(done) / float64(total))
				}
			}
		}
		return nil
	})
}

// --- the destination ---------------------------------------------------

// cloneMoved makes the new VDI of moves[i] as a clone of its base's new
// VDI (grown to the old VDI's size), after ending the base's copy export
// if it still runs. made gets the VDI.
func (m *Manager) cloneMoved(ctx context.Context, ie *incomingExports, moves []diskMove, i int, made *[]string) error {
	mv := moves[i]
	j := baseOf(moves, mv)
	if j < 0 || moves[j].New == "" || mv.New != "" {
		return xerr.New(xerr.InternalError, "migration: a disk's base has no copy here")
	}
	ie.closeTunnel(moves[j].Token)
	old, ok := m.db.Snapshot().Get(dm.VDI.Class, mv.VDI)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VDI", mv.VDI)
	}
	size, _ := old.Get(dm.VDI.VirtualSize).(int64)
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		return err
	}
	defer end()
	ref, err := m.cloneSized(ctx, m.internalInvoker(caller), moves[j].New, size)
	if ref != "" {
		*made = append(*made, ref)
		moves[i].New = ref
	}
	return err
}

// invoker runs a storage call and returns the ref it answers, if any.
type invoker func(ctx context.Context, method string, args ...any) (string, error)

// callerInvoker runs storage calls as c's caller.
func callerInvoker(m *Manager, c *api.Call) invoker {
	return func(ctx context.Context, method string, args ...any) (string, error) {
		if c == nil || c.Session == nil || c.Session.Ref == "" {
			return "", xerr.New(xerr.OperationNotAllowed, method+" needs a XenAPI session")
		}
		v, _, err := m.srv.Invoke(ctx, c.Session.Ref, method, args...)
		ref, _ := v.(string)
		return ref, err
	}
}

// internalInvoker runs storage calls as caller, an internal session,
// where their routes say (invokeHere).
func (m *Manager) internalInvoker(caller api.Caller) invoker {
	return func(ctx context.Context, method string, args ...any) (string, error) {
		return m.invokeHere(ctx, caller, method, args)
	}
}

// cloneSized clones VDI base with inv and grows the clone to size when
// it is smaller. It returns the clone even on a later error (to undo).
func (m *Manager) cloneSized(ctx context.Context, inv invoker, base string, size int64) (string, error) {
	ref, err := inv(ctx, "VDI.clone", base, map[string]string{})
	if err != nil {
		return "", err
	}
	if !schema.IsRef(ref) {
		return "", xerr.New(xerr.InternalError, "VDI.clone returned no VDI")
	}
	if err := m.awaitVDIs(ctx, []string{ref}); err != nil {
		return ref, err
	}
	if cl, ok := m.db.Snapshot().Get(dm.VDI.Class, ref); ok {
		if have, _ := cl.Get(dm.VDI.VirtualSize).(int64); size > have {
			if _, err := inv(ctx, "VDI.resize", ref, size); err != nil {
				return ref, err
			}
		}
	}
	return ref, nil
}

// serveCopyPhase answers the source's clone requests until it says its
// copies are done (step "copied"): clone makes the new VDI of moves[i]
// from its Base's, which is then served.
func (m *Manager) serveCopyPhase(ctx context.Context, mc *migConn, h migrateHeader, ie *incomingExports, moves []diskMove,
	clone func(i int) error) error {
	for {
		var msg migrateMsg
		if err := mc.recv(&msg, 0); err != nil {
			return err
		}
		switch msg.Step {
		case stepCopied:
			return nil
		case stepFailed:
			return msg.asError()
		case stepClone:
		default:
			return xerr.New(xerr.InternalError, "migration: expected \"clone\" or \"copied\", got "+strconv.Quote(msg.Step))
		}
		i := msg.Disk - 1
		if i < 0 || i >= len(moves) || !moves[i].Copy || moves[i].Base == "" || moves[i].Token != "" {
			return xerr.New(xerr.InternalError, "migration: a clone request for a disk that has none")
		}
		if err := clone(i); err != nil {
			return err
		}
		if err := ie.exportCopy(ctx, h, moves, i); err != nil {
			return err
		}
		if err := mc.send(migrateMsg{Step: stepClone, Disk: i + 1, Disks: []diskMove{moves[i]}}, migrateMsgTimeout); err != nil {
			return err
		}
	}
}

// receiveCopies is the destination's copy phase: it serves the copies'
// new VDIs (exportCopies), says ready (the message given), answers the
// source's clone requests until it says copied, ends the copies'
// exports and makes the mirrored disks' clones. clone makes moves[i]'s
// new VDI from its Base's. The caller closes what it returns, also on
// error.
func (m *Manager) receiveCopies(ctx context.Context, mc *migConn, h migrateHeader, moves []diskMove, ready any,
	clone func(ie *incomingExports, i int) error) (*incomingExports, error) {
	ie, err := m.exportCopies(ctx, h, moves)
	if err != nil {
		return nil, err
	}
	if err := mc.send(ready, migrateMsgTimeout); err != nil {
		return ie, err
	}
	cl := func(i int) error { return clone(ie, i) }
	if slices.ContainsFunc(moves, func(mv diskMove) bool { return mv.Copy }) {
		// No deadline of our own: a source that fails breaks the stream.
		if err := m.serveCopyPhase(ctx, mc, h, ie, moves, cl); err != nil {
			return ie, err
		}
		ie.closeCopies()
	}
	return ie, cloneMirrorBases(moves, cl)
}

// cloneMirrorBases makes the new VDIs of the mirrored disks that have a
// Base (after the copies: each from its newest snapshot's copy).
func cloneMirrorBases(moves []diskMove, clone func(i int) error) error {
	for i, mv := range moves {
		if mv.Copy || mv.Base == "" {
			continue
		}
		if err := clone(i); err != nil {
			return err
		}
	}
	return nil
}

// awaitVDIs waits until this host's replica has every VDI in refs.
func (m *Manager) awaitVDIs(ctx context.Context, refs []string) error {
	if m.awaitDB(storageReadyTimeout, nil, ctx.Done(), func(r db.Reader) (yes, settled bool) {
		all := !slices.ContainsFunc(refs, func(ref string) bool { _, ok := r.Get(dm.VDI.Class, ref); return !ok })
		return all, all
	}) {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return xerr.New(xerr.InternalError, "migration: new VDIs did not reach this host's replica")
}

// carryVDIFields is the commit's part for the new VDIs' records: each
// takes its old VDI's names, tags and snapshot fields, snapshot_of
// pointing at the new VDI of a disk that moved along.
func carryVDIFields(tx *db.Tx, moves []diskMove) error {
	newOf := movedSet(moves)
	for _, mv := range moves {
		old, ok := tx.Get(dm.VDI.Class, mv.VDI)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VDI", mv.VDI)
		}
		of := old.String(dm.VDI.SnapshotOf)
		if n, moved := newOf[of]; moved && n != "" {
			of = n
		}
		for f, v := range map[*schema.Field]any{
			dm.VDI.NameLabel: old.Get(dm.VDI.NameLabel), dm.VDI.NameDescription: old.Get(dm.VDI.NameDescription),
			dm.VDI.Tags: old.Get(dm.VDI.Tags), dm.VDI.IsASnapshot: old.Get(dm.VDI.IsASnapshot),
			dm.VDI.SnapshotTime: old.Get(dm.VDI.SnapshotTime), dm.VDI.SnapshotOf: of,
		} {
			if v == nil {
				continue
			}
			if err := tx.Set(f, mv.New, v); err != nil {
				return err
			}
		}
	}
	return nil
}
