package xenops

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Cross-pool migration: VM.migrate_send with a dest map whose host is
// not in this pool (host.migrate_receive asked of another pool), as
// xapi's inter-pool storage XenMotion.
//
// The source talks to the other pool with the session the dest map
// carries: XenAPI calls to its coordinator (dest["master"]) for the
// checks, and a migration stream to the destination host's POST
// /migrate (crosspool_recv.go), authenticated by the same session.
// The destination host's address is its host.address in the other pool;
// where the URLs name no port, this host's own API port is assumed (the
// dest map's URLs name none, as xapi's hosts all listen on 80 and 443).
// With an https master the calls and the stream go over TLS, the other
// pool's hosts checked against the system's roots and the CA
// certificates installed in this pool (Config.ClientTLS).
// The steps:
//
//  1. checks (VM.assert_can_migrate does the same): the session is
//     valid there; every disk is in vdi_map, to an SR of that pool;
//     every VIF is in vif_map, to a network of that pool, or has the MAC
//     of one that is (xapi's infer_vif_map, for the snapshots' VIFs
//     too); the destination host has room for the VM's memory;
//  2. the header carries the VM's records (xapi's metadata import with
//     restore: the VM keeps its uuid) and its snapshots' (xapi's
//     send_snapshots: each keeps its uuid, is_a_snapshot, snapshot_of
//     the VM, snapshot_time and the parent links among them); the
//     destination creates the VM (halted, marked migrate_send), the
//     snapshots, a VDI per disk on its mapped SR, the VBDs and the VIFs,
//     as the remote session, and serves the VDIs that are copied
//     (storage's export);
//  3. the source copies what nothing writes (a read-only disk of the
//     VM, as xapi's vdi_filter has it, the snapshots' disks and the
//     checkpoints' memory images: storagecopy.go's copy; a disk and its
//     snapshots as a chain, storagechain.go, the destination replacing
//     the VDI it made for a disk with a base by a clone of the base's)
//     and says copied, upon which the destination ends those exports,
//     builds the incoming domain on the new VDIs and serves each as an
//     NBD export ("mirrors"); the source mirrors each other disk into
//     its export through a storage.Relay whose connections are more
//     /migrate streams, then sends the memory, the mirrors completing
//     at the switchover, as in a storage migration inside the pool
//     (storagemigrate.go);
//  4. the commit: the source says go once the state is in (from then it
//     never resumes the guest); the destination records the VM running
//     on its host, the VDIs that were read-only read-only again and the
//     snapshots' VDIs snapshots (is_a_snapshot, snapshot_of the new copy
//     of their VDI, snapshot_time), and says done. Without done the
//     source asks the remote pool where the VM is;
//  5. the source destroys its stopped domain, then its snapshots' and
//     VM's records (with the VBDs and VIFs) and the old VDIs, as xapi
//     does after a cross-pool move. VM.migrate_send returns the VM's ref
//     in the other pool.
//
// A snapshot's disk goes to the SR vdi_map gives its VDI, else to that of
// its snapshot_of, else to the other pool's default SR (VDI_NOT_IN_MAP
// when it has none), as xapi's migrate_send' resolves it. A checkpoint's
// memory image (xapi's suspends_vdis) goes to the SR vdi_map gives it,
// else the other pool's suspend image SR, its destination host's, its
// default SR (VDI_NOT_IN_MAP when none); it arrives as a suspend VDI
// (sm_config:vmhint the checkpoint) the checkpoint is suspended on. CDs
// are never copied: xapi (find_cds_to_eject, with vdi_filter
// leaving CDs out of the disks) ejects the VM's CDs with a disc before a
// move to another pool (VBD.eject, unless the VM is suspended; the
// source pool's SR is never the destination's, so every such CD is
// "moving"), does not put the disc back should the move fail, and the
// other pool's import makes every CD whose VDI did not come along an
// empty drive. So here: the VM's CDs are ejected on its queue before
// the stream opens, an ISO VDI in vdi_map is ignored, and the VM and
// its snapshots arrive with their CD drives empty (the drives
// themselves arrive, so the incoming domain has the devices the guest
// has).
//
// Before the commit, any failure or cancel leaves the VM running here,
// and the destination destroys its domain, the VDIs it made and the VM
// and snapshot records (the source also asks the remote pool to destroy
// a VM of that uuid left behind, as xapi does). A halted or suspended
// VM goes the same way without a domain: the destination serves each
// new VDI through storage's export and the source copies its VDIs (and
// its snapshots', and a suspended VM's memory image) into them
// (storagecopy.go's copy, over /migrate streams); go then keeps the
// imported VM, halted or suspended. options copy=true is refused
// with OPERATION_NOT_ALLOWED.

// crossPort is the API port assumed for the other pool's hosts when the
// dest map's URL names none (host.migrate_receive's URLs name none, as
// xapi's hosts all listen on 80 and 443): this host's own.
func (m *Manager) crossPort() string {
	if _, port, err := net.SplitHostPort(m.cfg.ListenAddr); err == nil {
		return port
	}
	return ""
}

// clientTLS is the TLS configuration for the other pool's hosts.
func (m *Manager) clientTLS() *tls.Config {
	if m.cfg.ClientTLS != nil {
		return m.cfg.ClientTLS()
	}
	return nil
}

// inThisPool reports whether dest names a host of this pool.
func inThisPool(r db.Reader, dest map[string]string) bool {
	_, ok := r.Get(dm.Host.Class, dest["host"])
	return ok
}

// crossPlan is a checked cross-pool migration.
type crossPlan struct {
	rp    *remotePool
	moves []diskMove // VDI: the source's; SR: the remote SR; in the header's order of disks
	imp   *crossImport
	snaps []string // the VM's snapshots, removed here with it
	eject []string // the VM's CD drives with a disc, ejected before the move
	// source names this move to the other pool (the header's Source):
	// the VM it makes there carries it in its current_operations until
	// the move ends, so that a clean-up destroys only that VM.
	source string
}

// crossFields is a record's fields a create takes, as database text;
// references are left out (the other pool's come from the maps).
func crossFields(r db.Reader, c *schema.Class, row *db.Row) map[string]string {
	out := map[string]string{}
	for _, f := range c.Fields {
		if f.Derived || f.Internal || f.Qualifier == schema.DynamicRO || f == c.UUID || f.Type.Kind == schema.KRef ||
			(f.Type.Kind == schema.KSet && f.Type.Elem.Kind == schema.KRef) {
			continue
		}
		out[f.Name] = schema.FormatDB(f.Type, r.Value(row, f))
	}
	return out
}

// checkCrossPool is xapi's checks of a migration to another pool, and
// what the header will carry.
func (m *Manager) checkCrossPool(ctx context.Context, r db.Reader, vm *db.Row, dest map[string]string,
	vdiMap map[dm.VDIRef]dm.SRRef, vifMap map[dm.VIFRef]dm.NetworkRef, options map[string]string) (*crossPlan, error) {
	if b, err := strconv.ParseBool(options["copy"]); err == nil && b {
		return nil, xerr.New(xerr.OperationNotAllowed, "copy=true to another pool is not supported")
	}
	power := vm.String(dm.VM.PowerState)
	if power != psRunning && power != psPaused && power != psHalted && power != psSuspended {
		return nil, xerr.New(xerr.VMBadPowerState, vm.Ref, powerName(psRunning), powerName(power))
	}
	if pcis := strs(r.Value(vm, dm.VM.AttachedPCIs)); len(pcis) > 0 {
		return nil, xerr.New(xerr.VMHasPCIAttached, vm.Ref)
	}
	var snaps []*db.Row
	for _, s := range strs(r.Value(vm, dm.VM.Snapshots)) {
		row, ok := r.Get(dm.VM.Class, s)
		if !ok {
			continue
		}
		snaps = append(snaps, row)
	}
	rp, err := newRemotePool(dest, m.crossPort(), m.clientTLS())
	if err != nil {
		return nil, err
	}
	cp := &crossPlan{rp: rp, imp: &crossImport{VM: crossFields(r, dm.VM.Class, vm)}, source: newToken()}
	fail := func(err error) (*crossPlan, error) { rp.close(); return nil, err }
	// The session first: every later answer depends on it.
	if _, err := rp.call(ctx, "host.get_uuid", rp.host); err != nil {
		return fail(err)
	}
	cs := &crossSRs{rp: rp, known: map[string]bool{}}
	moved, err := planCrossDisks(ctx, r, vm, power, vdiMap, cs, cp)
	if err != nil {
		return fail(err)
	}
	nics, err := crossNICs(ctx, r, vm, vifMap, cs)
	if err != nil {
		return fail(err)
	}
	cp.imp.NICs = nics
	if cp.imp.Suspend, err = m.crossSuspend(ctx, r, vm, vdiMap, cs, cp); err != nil {
		return fail(err)
	}
	for _, srow := range snaps {
		if err := m.planCrossSnapshot(ctx, r, vm, srow, vdiMap, vifMap, cs, cp, moved); err != nil {
			return fail(err)
		}
	}
	if p, ok := r.Get(dm.VM.Class, vm.String(dm.VM.Parent)); ok && p.String(dm.VM.SnapshotOf) == vm.Ref {
		cp.imp.Parent = p.UUID()
	}
	if !liveState(power) {
		return cp, nil // a halted or suspended VM needs no memory there yet
	}
	if err := checkCrossMemory(ctx, rp, vm); err != nil {
		return fail(err)
	}
	return cp, nil
}

// planCrossDisks adds the VM's disks to cp: each in vdi_map
// (VDI_NOT_IN_MAP), mirrored, or copied when nothing writes it (a halted
// VM's, a read-only one, as xapi's vdi_filter has it). CDs are xapi's
// find_cds_to_eject: the VM's are ejected before the move and arrive
// empty. It returns each moved VDI's 1 + its number among cp.moves.
func planCrossDisks(ctx context.Context, r db.Reader, vm *db.Row, power string, vdiMap map[dm.VDIRef]dm.SRRef,
	cs *crossSRs, cp *crossPlan) (map[string]int, error) {
	moved := map[string]int{}
	for _, vbd := range strs(r.Value(vm, dm.VM.VBDs)) {
		row, ok := r.Get(dm.VBD.Class, vbd)
		if !ok {
			continue
		}
		if row.Get(dm.VBD.Empty) == true || row.String(dm.VBD.Type) == string(dm.VBDTypeCD) {
			cp.imp.Drives = append(cp.imp.Drives, crossFields(r, dm.VBD.Class, row))
			if row.Get(dm.VBD.Empty) != true {
				cp.eject = append(cp.eject, vbd)
			}
			continue
		}
		vdi := row.String(dm.VBD.VDI)
		sr, mapped := vdiMap[dm.VDIRef(vdi)]
		if !mapped {
			return nil, xerr.New(xerr.VDINotInMap, vdi)
		}
		vrow, ok := r.Get(dm.VDI.Class, vdi)
		if !ok {
			return nil, xerr.New(xerr.VDIMissing, schema.NullRef, vdi)
		}
		if vrow.String(dm.VDI.OnBoot) == string(dm.OnBootReset) {
			return nil, xerr.New(xerr.VDIOnBootModeIncompatibleWithOperation)
		}
		if err := cs.check(ctx, string(sr)); err != nil {
			return nil, err
		}
		ro := row.String(dm.VBD.Mode) == string(dm.VBDModeRO) || vrow.Get(dm.VDI.ReadOnly) == true
		d := crossDiskOf(r, row, vrow, string(sr), !liveState(power) || ro)
		cp.moves = append(cp.moves, diskMove{VBD: vbd, VDI: vdi, SR: string(sr), Copy: d.Copy})
		cp.imp.Disks = append(cp.imp.Disks, d)
		moved[vdi] = len(cp.moves)
	}
	return moved, nil
}

// planCrossSnapshot adds one of the VM's snapshots to cp (xapi's
// vdis_of_snapshots): its record goes with the VM, its disks are copied
// to the SR vdi_map gives the VDI, else its snapshot_of, else the other
// pool's default SR (VDI_NOT_IN_MAP when it has none); its CDs arrive
// empty.
func (m *Manager) planCrossSnapshot(ctx context.Context, r db.Reader, vm, srow *db.Row, vdiMap map[dm.VDIRef]dm.SRRef,
	vifMap map[dm.VIFRef]dm.NetworkRef, cs *crossSRs, cp *crossPlan, moved map[string]int) error {
	s := crossSnapshot{UUID: srow.UUID(), VM: crossFields(r, dm.VM.Class, srow),
		Time: schema.FormatDB(dm.VM.SnapshotTime.Type, srow.Get(dm.VM.SnapshotTime))}
	if p, ok := r.Get(dm.VM.Class, srow.String(dm.VM.Parent)); ok && p.String(dm.VM.SnapshotOf) == vm.Ref {
		s.Parent = p.UUID()
	}
	for _, vbd := range strs(r.Value(srow, dm.VM.VBDs)) {
		row, ok := r.Get(dm.VBD.Class, vbd)
		if !ok {
			continue
		}
		if row.Get(dm.VBD.Empty) == true || row.String(dm.VBD.Type) == string(dm.VBDTypeCD) {
			s.Drives = append(s.Drives, crossFields(r, dm.VBD.Class, row))
			continue
		}
		vrow, ok := r.Get(dm.VDI.Class, row.String(dm.VBD.VDI))
		if !ok {
			continue // a disk without its VDI is left out, as xapi's import does
		}
		sr, mapped := vdiMap[dm.VDIRef(vrow.Ref)]
		if !mapped {
			sr, mapped = vdiMap[dm.VDIRef(vrow.String(dm.VDI.SnapshotOf))]
		}
		sr, err := cs.mapTo(ctx, vrow.Ref, sr, mapped, cs.defaultSR)
		if err != nil {
			return err
		}
		d := crossDiskOf(r, row, vrow, string(sr), true)
		d.SnapshotOf = moved[vrow.String(dm.VDI.SnapshotOf)]
		if vrow.Get(dm.VDI.IsASnapshot) == true {
			d.SnapshotTime = schema.FormatDB(dm.VDI.SnapshotTime.Type, vrow.Get(dm.VDI.SnapshotTime))
		}
		cp.moves = append(cp.moves, diskMove{VBD: vbd, VDI: vrow.Ref, SR: string(sr), Copy: true})
		s.Disks = append(s.Disks, d)
		moved[vrow.Ref] = len(cp.moves)
	}
	var err error
	if s.Suspend, err = m.crossSuspend(ctx, r, srow, vdiMap, cs, cp); err != nil {
		return err
	}
	if s.NICs, err = crossNICs(ctx, r, srow, vifMap, cs); err != nil {
		return err
	}
	cp.imp.Snapshots = append(cp.imp.Snapshots, s)
	cp.snaps = append(cp.snaps, srow.Ref)
	return nil
}

// checkCrossMemory refuses a running VM the other pool's host has not
// the free memory for (HOST_NOT_ENOUGH_FREE_MEMORY). An answer it cannot
// read lets the move go on: the destination reserves the memory as it
// prepares the incoming domain, and refuses there.
func checkCrossMemory(ctx context.Context, rp *remotePool, vm *db.Row) error {
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	metrics, err := rp.str(ctx, "host.get_metrics", rp.host)
	if err != nil {
		return nil //nolint:nilerr // the destination checks again
	}
	raw, err := rp.call(ctx, "host_metrics.get_memory_free", metrics)
	var free json.Number
	if err != nil || json.Unmarshal(raw, &free) != nil {
		return nil //nolint:nilerr // as above
	}
	if n, err := strconv.ParseInt(string(free), 10, 64); err == nil && need > n {
		return xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(n, 0), 10))
	}
	return nil
}

// crossSRs checks the other pool's SRs a migration maps disks to, each
// once.
type crossSRs struct {
	rp    *remotePool
	known map[string]bool
	def   *string // the other pool's default SR, once asked
}

// check asks the other pool whether it has sr (HANDLE_INVALID if not).
func (cs *crossSRs) check(ctx context.Context, sr string) error {
	if cs.known[sr] {
		return nil
	}
	if _, err := cs.rp.call(ctx, "SR.get_uuid", sr); err != nil {
		return err
	}
	cs.known[sr] = true
	return nil
}

// crossSuspend is the header's part for the memory image of vm (a
// suspended VM or a checkpoint; nil for another), added to the plan's
// moves: xapi's suspends_vdis, to the SR vdi_map names, else the other
// pool's suspend image SR, its host's, its default SR (VDI_NOT_IN_MAP
// when it has none). This host must see the image's SR
// (SUSPEND_IMAGE_NOT_ACCESSIBLE).
func (m *Manager) crossSuspend(ctx context.Context, r db.Reader, vm *db.Row, vdiMap map[dm.VDIRef]dm.SRRef,
	cs *crossSRs, cp *crossPlan) (*crossDisk, error) {
	if vm.String(dm.VM.PowerState) != psSuspended {
		return nil, nil
	}
	vrow, ok := r.Get(dm.VDI.Class, vm.String(dm.VM.SuspendVDI))
	if !ok || !hostSeesSR(r, m.host, vrow.String(dm.VDI.SR)) {
		return nil, xerr.New(xerr.SuspendImageNotAccessible, vm.String(dm.VM.SuspendVDI))
	}
	sr, mapped := vdiMap[dm.VDIRef(vrow.Ref)]
	sr, err := cs.mapTo(ctx, vrow.Ref, sr, mapped, cs.suspendSR)
	if err != nil {
		return nil, err
	}
	vf := crossFields(r, dm.VDI.Class, vrow)
	vf["SR"] = string(sr)
	cp.moves = append(cp.moves, diskMove{VDI: vrow.Ref, SR: string(sr), Copy: true, Suspend: vm.Ref})
	return &crossDisk{VDI: vf, Copy: true}, nil
}

// mapTo is the other pool's SR VDI vdi goes to: sr when vdi_map maps
// it, else what fallback names (VDI_NOT_IN_MAP when it names none);
// checked there.
func (cs *crossSRs) mapTo(ctx context.Context, vdi string, sr dm.SRRef, mapped bool,
	fallback func(context.Context) (string, error)) (dm.SRRef, error) {
	if !mapped {
		def, err := fallback(ctx)
		if err != nil {
			return "", err
		}
		if !schema.IsRef(def) || def == schema.NullRef {
			return "", xerr.New(xerr.VDINotInMap, vdi)
		}
		sr = dm.SRRef(def)
	}
	return sr, cs.check(ctx, string(sr))
}

// suspendSR is where the other pool keeps a suspend image nothing maps:
// its pool's suspend image SR, else the destination host's, else its
// default SR (the null ref when it has none of them).
func (cs *crossSRs) suspendSR(ctx context.Context) (string, error) {
	raw, err := cs.rp.call(ctx, "pool.get_all")
	var pools []string
	if err == nil && (json.Unmarshal(raw, &pools) != nil || len(pools) == 0) {
		err = xerr.New(xerr.InternalError, "the other pool has no pool object")
	}
	if err != nil {
		return "", err
	}
	sr, err := cs.rp.str(ctx, "pool.get_suspend_image_SR", pools[0])
	if err == nil && (sr == "" || sr == schema.NullRef) {
		sr, err = cs.rp.str(ctx, "host.get_suspend_image_sr", cs.rp.host)
	}
	if err != nil {
		return "", err
	}
	if sr != "" && sr != schema.NullRef {
		return sr, nil
	}
	return cs.defaultSR(ctx)
}

// defaultSR is the other pool's default SR (the null ref when it has
// none).
func (cs *crossSRs) defaultSR(ctx context.Context) (string, error) {
	if cs.def != nil {
		return *cs.def, nil
	}
	raw, err := cs.rp.call(ctx, "pool.get_all")
	if err != nil {
		return "", err
	}
	var pools []string
	if err := json.Unmarshal(raw, &pools); err != nil || len(pools) == 0 {
		return "", xerr.New(xerr.InternalError, "the other pool has no pool object")
	}
	def, err := cs.rp.str(ctx, "pool.get_default_SR", pools[0])
	if err != nil {
		return "", err
	}
	cs.def = &def
	return def, nil
}

// crossDiskOf is a disk's part of the header: its VBD, and its VDI to be
// made on the other pool's sr.
func crossDiskOf(r db.Reader, vbd, vdi *db.Row, sr string, copied bool) crossDisk {
	vf := crossFields(r, dm.VDI.Class, vdi)
	vf["SR"] = sr
	return crossDisk{VBD: crossFields(r, dm.VBD.Class, vbd), VDI: vf, Source: vbd.Ref, Copy: copied,
		ReadOnly: vdi.Get(dm.VDI.ReadOnly) == true}
}

// crossNICs is the header's VIFs of vm (the VM or one of its snapshots),
// each with the other pool's network: vif_map's, else that of a mapped
// VIF with the same MAC (xapi's infer_vif_map), else VIF_NOT_IN_MAP.
func crossNICs(ctx context.Context, r db.Reader, vm *db.Row, vifMap map[dm.VIFRef]dm.NetworkRef, cs *crossSRs) ([]map[string]string, error) {
	var out []map[string]string
	for _, vif := range strs(r.Value(vm, dm.VM.VIFs)) {
		row, ok := r.Get(dm.VIF.Class, vif)
		if !ok {
			continue
		}
		net, mapped := vifMap[dm.VIFRef(vif)]
		if !mapped {
			mac := row.String(dm.VIF.MAC)
			for v, n := range vifMap {
				if o, ok := r.Get(dm.VIF.Class, string(v)); ok && mac != "" && o.String(dm.VIF.MAC) == mac {
					net, mapped = n, true
					break
				}
			}
		}
		if !mapped {
			return nil, xerr.New(xerr.VIFNotInMap, vif)
		}
		if !cs.known["network:"+string(net)] {
			if _, err := cs.rp.call(ctx, "network.get_uuid", string(net)); err != nil {
				return nil, err
			}
			cs.known["network:"+string(net)] = true
		}
		nf := crossFields(r, dm.VIF.Class, row)
		nf["network"] = string(net)
		out = append(out, nf)
	}
	return out, nil
}

// vmMigrateSendRemote is VM.migrate_send to another pool.
func (m *Manager) vmMigrateSendRemote(c *api.Call, a dm.VMMigrateSendArgs, row *db.Row) (dm.VMRef, error) {
	snap := c.Snapshot()
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return "", err
	}
	if r := row.String(dm.VM.ResidentOn); r != m.host && liveState(row.String(dm.VM.PowerState)) {
		return "", xerr.New(xerr.VMNotResidentHere, row.Ref, m.host)
	}
	cp, err := m.checkCrossPool(c.Ctx, snap, row, a.Dest, a.VDIMap, a.VIFMap, a.Options)
	if err != nil {
		return "", err
	}
	defer cp.rp.close()
	done, err := m.storageSlot()
	if err != nil {
		return "", err
	}
	defer done()
	var newVM string
	err = m.withVMOp(c, row.Ref, dm.VMOperationsMigrateSend, m.recheck(dm.VMOperationsMigrateSend, func(o *opCtx) error {
		var err error
		if power := row.String(dm.VM.PowerState); !liveState(power) {
			newVM, err = m.crossCopyOut(o, cp, power, a.Options)
		} else {
			newVM, err = m.crossOut(o, cp, a.Options)
		}
		return err
	}))
	if err != nil {
		return "", err
	}
	m.forgetMovedVM(c.Ctx, row.Ref, cp.snaps, oldVDIs(cp.moves))
	return dm.VMRef(newVM), nil
}

// crossOut sends the VM to the other pool; it returns the VM's ref
// there.
func (m *Manager) crossOut(o *opCtx, cp *crossPlan, options map[string]string) (string, error) {
	t0 := time.Now()
	mig, row, info, err := m.checkCrossOut(o, cp)
	if err != nil {
		return "", err
	}
	power := row.String(dm.VM.PowerState)
	o.prog.Progress(0.01)
	xs, err := m.crossOpen(o, cp, power, options)
	if err != nil {
		return "", err
	}
	defer xs.close()
	newVM := xs.ready.NewVM
	o.prog.Progress(0.1)
	mopts := migrateOptions(row)
	memLo := 0.1
	var mirrorTime time.Duration
	tm := time.Now()
	sm, err := m.crossDisks(o, cp, xs, info, mopts.Bandwidth)
	if sm != nil {
		defer sm.cancel(o.ctx)
	}
	if err != nil {
		return "", err
	}
	if sm != nil {
		mirrorTime = time.Since(tm)
		mopts.BeforeSwitchover = sm.complete
		memLo = 0.5
	}
	cw, send, err := m.sendMemory(o, mig, xs.mc, mopts, memLo)
	if err != nil {
		return "", m.crossFailed(o, cp, err)
	}
	m.journal(journal.Stop, o.uuid)
	if err := m.crossSwitchOver(o, cp, xs, cw, power, newVM); err != nil {
		return "", err
	}
	o.prog.Progress(0.95)
	m.removeMovedDomain(o, info)
	total := time.Since(t0)
	m.mig.last.Store(&MigrationTimes{Total: total, Send: send, Mirror: mirrorTime})
	m.log.Info("VM migrated to another pool", "vm", o.uuid, "dest", cp.rp.host, "total", total, "send", send, "mirror", mirrorTime)
	return newVM, nil
}

// checkCrossOut checks that o's VM can move live to the other pool: the
// backend can migrate and the VM runs here. It returns the backend's
// migrator, the VM's row and its domain.
func (m *Manager) checkCrossOut(o *opCtx, cp *crossPlan) (backend.Migrator, *db.Row, backend.DomainInfo, error) {
	mig, ok := m.be.(backend.Migrator)
	if !ok {
		return nil, nil, backend.DomainInfo{}, xerr.New(xerr.VMMigrateFailed, o.vm, m.host, cp.rp.host, "the "+m.be.Name()+" backend cannot migrate live")
	}
	row, ok := m.db.Snapshot().Get(dm.VM.Class, o.vm)
	if !ok {
		return nil, nil, backend.DomainInfo{}, xerr.New(xerr.HandleInvalid, "VM", o.vm)
	}
	info, ok := m.be.Info(o.uuid)
	if !ok || info.State.Stopped() {
		return nil, nil, backend.DomainInfo{}, xerr.New(xerr.VMBadPowerState, o.vm, powerName(psRunning), powerName(psHalted))
	}
	return mig, row, info, nil
}

// crossDisks moves o's disks to the other pool while the guest runs:
// what nothing writes (read-only disks, the snapshots') is copied first;
// the destination then ends those exports and builds its domain, and the
// other disks are mirrored until they are in step (the mirrors complete
// at the switchover). It returns the mirrors (nil when no disk is
// mirrored), the caller's to cancel, even with an error; a failure is
// crossFailed's.
func (m *Manager) crossDisks(o *opCtx, cp *crossPlan, xs *crossStream, info backend.DomainInfo, bandwidth int64) (*sourceMirrors, error) {
	mc := xs.mc
	th := xs.hdr.migrateHeader
	th.VM = xs.ready.NewVM
	lo := 0.15
	if slices.ContainsFunc(xs.moves, func(mv diskMove) bool { return mv.Copy }) {
		if err := m.copyChain(o, cp.rp.host, th, xs.moves, mc, xs.dial, 0.1, 0.2); err != nil {
			return nil, m.crossFailed(o, cp, err)
		}
		if err := mc.send(migrateMsg{Step: stepCopied}, migrateMsgTimeout); err != nil {
			return nil, m.crossFailed(o, cp, err)
		}
		lo = 0.2
	}
	built, err := mc.recvMsg(stepMirrors, migratePrepTimeout)
	if err == nil {
		err = takeTokens(xs.moves, built.Disks)
	}
	if err != nil {
		return nil, m.crossFailed(o, cp, err)
	}
	if len(xs.moves) == 0 {
		return nil, nil
	}
	sm, err := m.startMirrors(o, cp.rp.host, info, xs.moves, th, xs.dial, bandwidth)
	if err != nil {
		return nil, m.crossFailed(o, cp, err)
	}
	o.prog.Progress(lo) // the mirrors run
	if err := sm.wait(o, lo, 0.5); err != nil {
		return sm, m.crossFailed(o, cp, err)
	}
	return sm, nil
}

// crossSwitchOver ends a move to the other pool whose guest is stopped
// here, its memory sent down cw: it waits for the destination to have
// received it all, then tells it to go, the commit point. Before the
// commit, or when the other pool says it does not have newVM, a failure
// resumes the guest here (in power state power). It returns nil once the
// other pool has the VM.
func (m *Manager) crossSwitchOver(o *opCtx, cp *crossPlan, xs *crossStream, cw *chunkWriter, power, newVM string) error {
	rp, mc := cp.rp, xs.mc
	rollback := func(cause error) error {
		xs.abort()
		m.resumeAfterFailedMove(o, power)
		return m.crossFailed(o, cp, cause)
	}
	if err := cw.Close(); err != nil {
		return rollback(err)
	}
	if _, err := mc.recvMsg(stepReceived, migrateRecvTimeout); err != nil {
		return rollback(err)
	}
	if o.ctx.Err() != nil || !xs.unhook() {
		return rollback(context.Canceled)
	}
	// The commit point: go. From here the guest never runs here again
	// unless the other pool says it does not have it.
	_ = mc.c.SetDeadline(time.Time{})
	committed := false
	if err := mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout); err == nil {
		committed = m.sendRRD(o, mc) == nil
	}
	if !committed {
		switch moved, known := m.remoteHas(o.ctx, rp, newVM); {
		case !known:
			m.log.Error("cannot tell whether the other pool took the VM: the guest stays stopped here", "vm", o.uuid)
			return xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination pool did not confirm the move")
		case !moved:
			return rollback(xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination did not take the VM"))
		}
	}
	return nil
}

// remoteHas asks the other pool whether newVM runs on the destination
// host (the final word once go may have been lost): known is false when
// it cannot be asked. It waits for the destination to settle first.
func (m *Manager) remoteHas(ctx context.Context, rp *remotePool, newVM string) (moved, known bool) {
	bg := context.WithoutCancel(ctx)
	deadline := time.Now().Add(migrateGoTimeout + migrateMsgTimeout)
	for time.Now().Before(deadline) {
		p, err := rp.str(bg, "VM.get_power_state", newVM)
		if xerr.HasCode(err, xerr.HandleInvalid) {
			return false, true
		}
		if err == nil && (p == psRunning || p == psPaused) {
			on, err := rp.str(bg, "VM.get_resident_on", newVM)
			if err == nil {
				return on == rp.host, true
			}
		}
		time.Sleep(time.Second)
	}
	return false, false
}

// cleanRemote destroys a VM of uuid the other pool may hold after a
// failed migration, and the snapshots of it with the uuids in snaps, as
// xapi does (the destination removes them itself when it sees the
// failure; this is the second try). Only the VM this move made there
// goes, the one marked with its source token: a VM of that uuid the
// other pool had already (the reason it refused the move) is left alone,
// with its snapshots.
func (m *Manager) cleanRemote(ctx context.Context, rp *remotePool, uuid, source string, snaps []string) {
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), remoteCallTimeout)
	defer cancel()
	ref, err := rp.str(bg, "VM.get_by_uuid", uuid)
	if err != nil {
		return
	}
	var ops map[string]string
	if raw, err := rp.call(bg, "VM.get_current_operations", ref); err != nil || json.Unmarshal(raw, &ops) != nil {
		return
	}
	if _, ours := ops[migrateInKey(source)]; !ours {
		return
	}
	for _, su := range snaps {
		ref, err := rp.str(bg, "VM.get_by_uuid", su)
		if err != nil {
			continue
		}
		// Only a snapshot of the VM that was arriving.
		of, err := rp.str(bg, "VM.get_snapshot_of", ref)
		if err != nil {
			continue
		}
		if u, err := rp.str(bg, "VM.get_uuid", of); err != nil || u != uuid {
			continue
		}
		if _, err := rp.call(bg, "VM.destroy", ref); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Warn("cannot destroy a snapshot left in the other pool", "vm", su, "err", err)
		}
	}
	if p, err := rp.str(bg, "VM.get_power_state", ref); err == nil && p == psHalted {
		if _, err := rp.call(bg, "VM.destroy", ref); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) &&
			!xerr.HasCode(err, xerr.OtherOperationInProgress) {
			m.log.Warn("cannot destroy a VM left in the other pool", "vm", uuid, "err", err)
		}
	}
}

// forgetMovedVM removes a VM that moved to another pool from this one:
// its snapshots (with their VBDs and VIFs), its record (halted first,
// with its VBDs, VIFs and metrics, as VM.destroy does) and then the old
// VDIs.
func (m *Manager) forgetMovedVM(ctx context.Context, vm string, snaps, vdis []string) {
	bg := context.WithoutCancel(ctx)
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, vm)
		if !ok {
			return nil
		}
		for f, v := range map[*schema.Field]any{dm.VM.PowerState: psHalted, dm.VM.ResidentOn: schema.NullRef,
			dm.VM.Domid: int64(-1), dm.VM.CurrentOperations: map[string]string{}} {
			if err := tx.Set(f, vm, v); err != nil {
				return err
			}
		}
		for _, vbd := range strs(tx.Value(row, dm.VM.VBDs)) {
			if _, ok := tx.Get(dm.VBD.Class, vbd); ok {
				if err := tx.Set(dm.VBD.CurrentlyAttached, vbd, false); err != nil {
					return err
				}
			}
		}
		return m.noteFreeMemory(tx)
	}); err != nil {
		m.log.Error("cannot reset a VM that moved to another pool", "vm", vm, "err", err)
		return
	}
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		m.log.Error("cannot remove a VM that moved to another pool", "vm", vm, "err", err)
		return
	}
	defer end()
	snap := m.db.Snapshot()
	for _, ref := range append(slices.Clone(snaps), vm) {
		if row, ok := snap.Get(dm.VM.Class, ref); ok {
			for _, vbd := range strs(snap.Value(row, dm.VM.VBDs)) {
				if _, err := caller.InvokeArgs(bg, "VBD.destroy", []any{vbd}); err != nil {
					m.log.Warn("cannot destroy a moved VM's VBD", "vbd", vbd, "err", err)
				}
			}
			for _, vif := range strs(snap.Value(row, dm.VM.VIFs)) {
				if _, err := caller.InvokeArgs(bg, "VIF.destroy", []any{vif}); err != nil {
					m.log.Warn("cannot destroy a moved VM's VIF", "vif", vif, "err", err)
				}
			}
		}
		if _, err := caller.InvokeArgs(bg, "VM.destroy", []any{ref}); err != nil {
			m.log.Error("cannot destroy a VM that moved to another pool", "vm", ref, "err", err)
		}
	}
	m.destroyVDIs(bg, vdis, "a cross-pool migration moved away from")
}

// assertCanMigrateRemote is VM.assert_can_migrate for a destination in
// another pool: the checks of checkCrossPool.
func (m *Manager) assertCanMigrateRemote(c *api.Call, row *db.Row, a dm.VMAssertCanMigrateArgs) error {
	snap := c.Snapshot()
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return err
	}
	cp, err := m.checkCrossPool(c.Ctx, snap, row, a.Dest, a.VDIMap, a.VIFMap, a.Options)
	if err != nil {
		return err
	}
	cp.rp.close()
	return nil
}

// crossStream is a migration stream to the other pool's destination
// host, past the destination's ready.
type crossStream struct {
	*outStream
	hdr   crossHeader // the header sent
	ready crossReply
	moves []diskMove // the plan's, with the destination's VDIs and export tokens
}

// crossOpen opens o's migration stream to the other pool's destination
// host, sends the header (the VM's records, power its power state) and
// waits for ready: the new VM there, and a VDI and export per disk. A
// failure is crossFailed's.
func (m *Manager) crossOpen(o *opCtx, cp *crossPlan, power string, options map[string]string) (*crossStream, error) {
	// The VM's CDs are ejected first (xapi's eject_cds), and its disks
	// and snapshots given their bases (a chain: storagechain.go).
	if err := m.ejectCDs(o, cp.eject); err != nil {
		return nil, err
	}
	m.chainCross(o.ctx, cp)
	rp := cp.rp
	addr, err := rp.hostAddr(o.ctx)
	if err != nil {
		return nil, err
	}
	out, err := m.openStream(o, rp.host, func(ctx context.Context) (net.Conn, error) { return rp.dialMigrate(ctx, addr) })
	if err != nil {
		return nil, err
	}
	xs := &crossStream{outStream: out, hdr: crossHeader{migrateHeader: migrateHeader{Version: migrateVersion,
		VM: o.vm, UUID: o.uuid, Source: cp.source, Dest: rp.host, Power: power, Options: options}, Import: cp.imp}}
	failed := func(err error) (*crossStream, error) {
		err = m.crossFailed(o, cp, err)
		out.close()
		return nil, err
	}
	if err := out.mc.send(xs.hdr, migrateMsgTimeout); err != nil {
		return failed(err)
	}
	if err := out.mc.recv(&xs.ready, migratePrepTimeout); err != nil {
		return failed(err)
	}
	if xs.ready.Step == stepFailed {
		return failed(xs.ready.asError())
	}
	if xs.ready.Step != stepReady || !schema.IsRef(xs.ready.NewVM) || len(xs.ready.Disks) != len(cp.moves) {
		return failed(xerr.New(xerr.InternalError, "migration: an unexpected answer from the destination"))
	}
	xs.moves = append([]diskMove(nil), cp.moves...)
	for i := range xs.moves {
		xs.moves[i].New, xs.moves[i].Token = xs.ready.Disks[i].New, xs.ready.Disks[i].Token
	}
	return xs, nil
}

// chainCross gives the plan's disks their Bases (storagechain.go): a
// disk and its snapshots go to the other pool as a chain, as inside one.
func (m *Manager) chainCross(ctx context.Context, cp *crossPlan) {
	cp.moves = m.chainMoves(ctx, m.db.Snapshot(), cp.moves)
	cp.imp.setBases(cp.moves)
}

// takeTokens reads the destination's mirrors message: a token for each
// mirrored disk.
func takeTokens(moves, got []diskMove) error {
	if len(got) != len(moves) {
		return xerr.New(xerr.InternalError, "migration: the destination answered for other disks")
	}
	for i := range moves {
		if moves[i].Copy {
			continue
		}
		if got[i].Token == "" || got[i].New == "" {
			return xerr.New(xerr.InternalError, "migration: the destination answered for other disks")
		}
		moves[i].New, moves[i].Token = got[i].New, got[i].Token
	}
	return nil
}

// crossFailed is the error of a cross-pool migration that failed before
// its commit (the task's cancellation when that ended it), once the
// other pool is asked to destroy a VM left behind.
func (m *Manager) crossFailed(o *opCtx, cp *crossPlan, err error) error {
	rp := cp.rp
	if o.ctx.Err() != nil {
		err = cancelledErr(o.task)
	}
	m.cleanRemote(o.ctx, rp, o.uuid, cp.source, snapshotUUIDs(cp.imp))
	return m.migrateFailed(o, rp.host, err)
}

// crossCopyOut sends a halted VM to the other pool: its records, then
// its disks copied into the new VDIs there; it returns the VM's ref
// there.
func (m *Manager) crossCopyOut(o *opCtx, cp *crossPlan, power string, options map[string]string) (string, error) {
	rp := cp.rp
	if _, ok := m.disks.(DiskMover); !ok && len(cp.moves) > 0 {
		return "", xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "this host's storage cannot serve copies")
	}
	xs, err := m.crossOpen(o, cp, power, options)
	if err != nil {
		return "", err
	}
	defer xs.close()
	mc := xs.mc
	failed := func(err error) (string, error) { return "", m.crossFailed(o, cp, err) }
	o.prog.Progress(0.05)
	th := xs.hdr.migrateHeader
	th.VM = xs.ready.NewVM
	if err := m.copyChain(o, rp.host, th, xs.moves, mc, xs.dial, 0.05, 0.95); err != nil {
		return failed(err)
	}
	if slices.ContainsFunc(xs.moves, func(mv diskMove) bool { return mv.Copy }) {
		if err := mc.send(migrateMsg{Step: stepCopied}, migrateMsgTimeout); err != nil {
			return failed(err)
		}
	}
	if !xs.unhook() {
		return failed(context.Canceled)
	}
	// The commit point: go; the destination keeps the VM.
	_ = mc.c.SetDeadline(time.Time{})
	err = mc.send(migrateMsg{Step: stepGo}, migrateMsgTimeout)
	if err == nil {
		_, err = mc.recvMsg(stepDone, migrateMsgTimeout)
	}
	if err != nil {
		if kept, known := m.remoteKept(o.ctx, rp, xs.ready.NewVM); !known || !kept {
			return failed(xerr.New(xerr.VMMigrateFailed, o.vm, m.host, rp.host, "the destination pool did not confirm the move"))
		}
	}
	m.log.Info("halted VM moved to another pool", "vm", o.uuid, "dest", rp.host, "disks", len(cp.moves))
	return xs.ready.NewVM, nil
}

// ejectCDs ejects the VM's CDs in vbds before it moves to another pool,
// as xapi's migrate_send does (they arrive empty there, and stay ejected
// here should the move fail): the medium taken out of a running domain,
// storage's hold let go, the VBD empty.
func (m *Manager) ejectCDs(o *opCtx, vbds []string) error {
	for _, ref := range vbds {
		row, ok := m.db.Snapshot().Get(dm.VBD.Class, ref)
		if !ok || row.Get(dm.VBD.Empty) == true {
			continue
		}
		if d, ok := m.attachedDisk(o.uuid, ref); ok && d.VDI != "" {
			old := d.VDI
			d.VDI, d.Path, d.Format = "", "", ""
			if err := m.be.ChangeMedium(o.ctx, o.uuid, d); err != nil {
				if o.ctx.Err() != nil {
					return cancelledErr(o.task)
				}
				return err
			}
			m.detachAll(o.ctx, o.uuid, []backend.Disk{{VDI: old}})
		}
		if _, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VBD.Class, ref); !ok {
				return nil
			}
			if err := tx.Set(dm.VBD.VDI, ref, schema.NullRef); err != nil {
				return err
			}
			if err := tx.Set(dm.VBD.Empty, ref, true); err != nil {
				return err
			}
			return refreshDev(tx, dm.VBD.Class, ref)
		}); err != nil {
			return err
		}
		m.log.Info("CD ejected for a move to another pool", "vm", o.uuid, "vbd", ref)
	}
	return nil
}

// remoteKept asks the other pool whether a halted VM it imported is
// kept (its migration mark cleared) or dropped.
func (m *Manager) remoteKept(ctx context.Context, rp *remotePool, newVM string) (kept, known bool) {
	bg := context.WithoutCancel(ctx)
	deadline := time.Now().Add(migrateGoTimeout)
	for time.Now().Before(deadline) {
		raw, err := rp.call(bg, "VM.get_current_operations", newVM)
		if xerr.HasCode(err, xerr.HandleInvalid) {
			return false, true
		}
		var ops map[string]string
		if err == nil && json.Unmarshal(raw, &ops) == nil && len(ops) == 0 {
			return true, true
		}
		time.Sleep(time.Second)
	}
	return false, false
}
