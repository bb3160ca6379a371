package xenops

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/netguard"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// The destination's side of a cross-pool migration (crosspool.go):
// POST /migrate?session_id=... on the API's own listener, upgraded in
// place to the migration stream. The session is one of this pool's (the
// dest map's, from host.migrate_receive) and must hold a role that may
// call VM.migrate_send; there is no other way in (no pool secret, no
// port of its own). The first message says what the stream is: a VM
// arriving with its records (Import), or a disk mirror's connection to
// an export an arriving VM serves (Tunnel, bound to that migration by
// the random source name its header carried).

// maxCrossPoolIn bounds the cross-pool streams a host serves at once (a
// migration takes one, plus one per disk it mirrors).
const maxCrossPoolIn = 16

// crossImport is a VM's records as the source sends them: each a map of
// field name to the field's database text (schema.FormatDB), so that
// every type survives the trip. References to the source pool's
// objects are left out; the remote ones come from the maps.
type crossImport struct {
	VM    map[string]string   `json:"vm"`
	Disks []crossDisk         `json:"disks,omitempty"`
	NICs  []map[string]string `json:"nics,omitempty"` // VIF fields, network being this pool's
	// Drives are the VBDs that arrive empty: empty drives, and CDs (the
	// source ejects the VM's; a snapshot's arrives without its disc).
	Drives []map[string]string `json:"drives,omitempty"`
	// Suspend, for a suspended VM, is its memory image (as a
	// checkpoint's: crossSnapshot), numbered after the VM's disks.
	Suspend *crossDisk `json:"suspend,omitempty"`
	// Parent is the uuid of the VM's parent when it is one of Snapshots.
	Parent    string          `json:"parent,omitempty"`
	Snapshots []crossSnapshot `json:"snapshots,omitempty"`
}

// crossSnapshot is a snapshot of the arriving VM: its record (it keeps
// its uuid), its disks (always copied), drives and VIFs.
type crossSnapshot struct {
	UUID   string              `json:"uuid"`
	Time   string              `json:"time"` // snapshot_time, database text
	Parent string              `json:"parent,omitempty"`
	VM     map[string]string   `json:"vm"`
	Disks  []crossDisk         `json:"disks,omitempty"`
	NICs   []map[string]string `json:"nics,omitempty"`
	Drives []map[string]string `json:"drives,omitempty"`
	// Suspend, for a checkpoint, is its memory image: a suspend VDI to
	// make (copied, with no VBD), numbered after the snapshot's disks.
	Suspend *crossDisk `json:"suspend,omitempty"`
}

// crossDisk is one disk of an arriving VM or of one of its snapshots:
// its VBD and the VDI to create for it on this pool's SR (the VDI map's
// "SR" field). The disks are numbered in the header's order, the VM's
// first, then each snapshot's: the moves and ready's answer follow it.
type crossDisk struct {
	VBD    map[string]string `json:"vbd"`
	VDI    map[string]string `json:"vdi"`
	Source string            `json:"source"` // the source's VBD, echoed in ready
	// Copy: copied while nothing writes it (a halted VM's disk, a
	// read-only one, a snapshot's) rather than mirrored.
	Copy bool `json:"copy,omitempty"`
	// ReadOnly: the new VDI is read-only once the move commits (it is
	// written until then).
	ReadOnly bool `json:"read_only,omitempty"`
	// SnapshotOf (a snapshot's VDI) is 1 + the number of the disk whose
	// VDI it is a snapshot of (0: none that moves); SnapshotTime its
	// snapshot_time, database text.
	SnapshotOf   int    `json:"snapshot_of,omitempty"`
	SnapshotTime string `json:"snapshot_time,omitempty"`
	// Base is 1 + the number of the copied disk whose new VDI this one
	// is cloned from before only what differs is sent (storagechain.go;
	// 0: none, the disk goes whole).
	Base int `json:"base,omitempty"`
}

// setBases writes the Bases chainMoves gave moves (in the header's order
// of disks) into the import's disks.
func (ci *crossImport) setBases(moves []diskMove) {
	k := 0
	set := func(d *crossDisk) {
		if k < len(moves) {
			d.Base = baseOf(moves, moves[k]) + 1
		}
		k++
	}
	for i := range ci.Disks {
		set(&ci.Disks[i])
	}
	if ci.Suspend != nil {
		set(ci.Suspend)
	}
	for s := range ci.Snapshots {
		for i := range ci.Snapshots[s].Disks {
			set(&ci.Snapshots[s].Disks[i])
		}
		if ci.Snapshots[s].Suspend != nil {
			set(ci.Snapshots[s].Suspend)
		}
	}
}

// crossMoves is the destination's moves of an import: its VBDs and VDIs
// (placeholders of the disks' sizes until a Base's clone replaces
// them), each disk's Base among them, checked.
func crossMoves(made crossMade) ([]diskMove, error) {
	moves := make([]diskMove, len(made.vbds))
	for i := range made.vbds {
		d := made.disks[i]
		moves[i] = diskMove{VBD: made.vbds[i], VDI: made.vdis[i], New: made.vdis[i], SR: d.VDI["SR"], Copy: d.Copy}
		if owner, ok := made.suspend[i]; ok {
			moves[i] = diskMove{VDI: made.vdis[i], New: made.vdis[i], SR: d.VDI["SR"], Copy: true, Suspend: owner}
			if d.Base != 0 {
				return nil, xerr.New(xerr.InternalError, "migration: a suspend image has no base")
			}
		}
		switch {
		case d.Base == 0:
		case d.Base < 0 || d.Base > len(made.vbds):
			return nil, xerr.New(xerr.InternalError, "migration: a disk's base is not one of the disks")
		default:
			moves[i].Base = made.vbds[d.Base-1]
		}
	}
	return moves, checkBases(moves)
}

// cloneInPlace makes moves[i]'s new VDI a clone of its Base's (grown to
// the placeholder's size) in place of the placeholder the import made:
// the clone takes the placeholder's names and other_config, the VBD
// points at it, the placeholder goes.
func (m *Manager) cloneInPlace(ctx context.Context, ie *incomingExports, moves []diskMove, i int, made crossMade) error {
	j := baseOf(moves, moves[i])
	if j < 0 || moves[j].New == "" {
		return xerr.New(xerr.InternalError, "migration: a disk's base has no copy here")
	}
	ie.closeTunnel(moves[j].Token)
	old, ok := m.db.Snapshot().Get(dm.VDI.Class, moves[i].New)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VDI", moves[i].New)
	}
	size, _ := old.Get(dm.VDI.VirtualSize).(int64)
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		return err
	}
	defer end()
	inv := m.internalInvoker(caller)
	drop := func(vdi string) {
		if _, err := inv(context.WithoutCancel(ctx), "VDI.destroy", vdi); err != nil {
			m.log.Warn("cannot destroy a VDI an incoming migration made", "vdi", vdi, "err", err)
		}
	}
	ref, err := m.cloneSized(ctx, inv, moves[j].New, size)
	if err != nil {
		if ref != "" {
			drop(ref)
		}
		return err
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		for _, f := range []*schema.Field{dm.VDI.NameLabel, dm.VDI.NameDescription, dm.VDI.OtherConfig, dm.VDI.Tags} {
			if v := old.Get(f); v != nil {
				if err := tx.Set(f, ref, v); err != nil {
					return err
				}
			}
		}
		if _, ok := tx.Get(dm.VBD.Class, moves[i].VBD); !ok {
			return xerr.New(xerr.HandleInvalid, "VBD", moves[i].VBD)
		}
		return tx.Set(dm.VBD.VDI, moves[i].VBD, ref)
	}); err != nil {
		drop(ref)
		return err
	}
	made.vdis[i], moves[i].New = ref, ref
	drop(old.Ref)
	return nil
}

// allDisks is the header's disks in their order: the VM's, then each
// snapshot's.
func (ci *crossImport) allDisks() []crossDisk {
	out := append([]crossDisk(nil), ci.Disks...)
	if ci.Suspend != nil {
		out = append(out, *ci.Suspend)
	}
	for _, s := range ci.Snapshots {
		out = append(out, s.Disks...)
		if s.Suspend != nil {
			out = append(out, *s.Suspend)
		}
	}
	return out
}

// crossHeader opens a cross-pool stream.
type crossHeader struct {
	migrateHeader
	Import *crossImport `json:"import,omitempty"`
}

// crossReply is the destination's ready: the migrateMsg with the new
// VM's ref.
type crossReply struct {
	migrateMsg
	NewVM string `json:"new_vm,omitempty"`
}

// crossState counts the cross-pool streams served.
type crossState struct {
	active atomic.Int32
}

func (m *Manager) cross() *crossState { return &m.xpool }

// registerCrossPool adds POST /migrate.
func (m *Manager) registerCrossPool(router *mux.Router) {
	router.HandleFunc("/migrate", m.serveCrossPool).Methods(http.MethodPost)
}

// serveCrossPool authenticates the request, upgrades it and hands the
// stream on.
func (m *Manager) serveCrossPool(w http.ResponseWriter, r *http.Request) {
	var roles schema.RoleSet
	if msg := m.srv.Model.Message("VM.migrate_send"); msg != nil {
		roles = msg.Roles
	}
	if roles == 0 {
		roles = schema.RoleSet(0).With(schema.RolePoolAdmin)
	}
	sess := m.srv.HTTPSession(w, r, roles)
	if sess == nil {
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), crossPoolProtocol) {
		w.Header().Set("Upgrade", crossPoolProtocol)
		http.Error(w, "upgrade to "+crossPoolProtocol+" required", http.StatusUpgradeRequired)
		return
	}
	st := m.cross()
	if st.active.Add(1) > maxCrossPoolIn {
		st.active.Add(-1)
		http.Error(w, "too many migrations arriving", http.StatusServiceUnavailable)
		return
	}
	defer st.active.Add(-1)
	c, err := netguard.Upgrade(w, crossPoolProtocol, migrateMsgTimeout)
	if err != nil {
		return
	}
	m.serveCrossStream(context.WithoutCancel(r.Context()), c, m.srv.As(sess))
}

// serveCrossStream reads the first message and serves the stream. It
// owns conn.
func (m *Manager) serveCrossStream(ctx context.Context, conn net.Conn, caller api.Caller) {
	defer func() { _ = conn.Close() }()
	mc := newMigConn(conn)
	var h crossHeader
	if err := mc.recv(&h, migrateMsgTimeout); err != nil {
		m.log.Warn("unreadable cross-pool migration header", "err", err)
		return
	}
	if h.Tunnel != "" {
		m.serveTunnel(ctx, conn, mc, h.migrateHeader)
		return
	}
	if err := m.acceptCrossPool(h); err != nil {
		m.log.Warn("cross-pool migration refused", "vm", h.UUID, "err", err)
		_ = mc.send(failedMsg(err), migrateMsgTimeout)
		return
	}
	jctx, cancel := context.WithCancel(m.bg)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	if err := m.crossIn(jctx, mc, h, caller); err != nil {
		m.log.Info("cross-pool migration not taken", "vm", h.UUID, "err", err)
	}
}

// acceptCrossPool checks a header before anything is made.
func (m *Manager) acceptCrossPool(h crossHeader) error {
	switch {
	case h.Version != migrateVersion:
		return xerr.New(xerr.InternalError, "unknown migration protocol version")
	case h.Dest != m.host:
		return xerr.New(xerr.InternalError, "the migration is meant for another host")
	case h.Import == nil || len(h.Source) < 16:
		return xerr.New(xerr.InternalError, "a cross-pool migration without its records")
	case h.Power != psRunning && h.Power != psPaused && h.Power != psHalted && h.Power != psSuspended:
		return xerr.New(xerr.VMBadPowerState, h.VM, powerName(psRunning), powerName(h.Power))
	}
	snap := m.db.Snapshot()
	seen := map[string]bool{}
	for _, u := range append([]string{h.UUID}, snapshotUUIDs(h.Import)...) {
		if _, err := uuid.Parse(u); err != nil || seen[u] {
			return xerr.New(xerr.InvalidValue, "uuid", clipRemote(u))
		}
		seen[u] = true
		if _, ok := snap.ByUUID(dm.VM.Class, u); ok {
			return xerr.New(xerr.OperationNotAllowed, "a VM with uuid "+u+" exists in this pool already")
		}
	}
	if _, ok := m.be.Info(h.UUID); ok {
		return xerr.New(xerr.InternalError, "the VM already has a domain on the destination")
	}
	copies, mirrors := 0, 0
	for _, d := range h.Import.allDisks() {
		if d.Copy || !liveState(h.Power) {
			copies++
		} else {
			mirrors++
		}
	}
	if _, ok := m.disks.(DiskMover); !ok && copies > 0 {
		return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "this host's storage cannot receive copies")
	}
	if !liveState(h.Power) {
		return nil
	}
	if _, ok := m.be.(backend.Migrator); !ok {
		return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "the "+m.be.Name()+" backend cannot receive a migration")
	}
	if _, ok := m.be.(backend.DiskExporter); !ok && mirrors > 0 {
		return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "the "+m.be.Name()+" backend cannot receive disks")
	}
	return nil
}

// migrateInKey is the current_operations key of a VM arriving from
// another pool, from the move's source token.
func migrateInKey(source string) string { return "migrate-in:" + source[:min(8, len(source))] }

// snapshotUUIDs lists the uuids of an import's snapshots.
func snapshotUUIDs(ci *crossImport) []string {
	out := make([]string, 0, len(ci.Snapshots))
	for _, s := range ci.Snapshots {
		out = append(out, s.UUID)
	}
	return out
}

// crossRecord turns the sent fields of class c into a create call's
// record: the fields a create takes, the missing ones zero.
func crossRecord(c *schema.Class, fields map[string]string, set map[string]any) (map[string]any, error) {
	rec := map[string]any{}
	for _, f := range c.Fields {
		if f.Derived || f.Internal || f.Qualifier == schema.DynamicRO || f == c.UUID {
			continue
		}
		if v, ok := set[f.Name]; ok {
			rec[f.Name] = v
			continue
		}
		s, ok := fields[f.Name]
		if !ok || f.Type.Kind == schema.KRef || (f.Type.Kind == schema.KSet && f.Type.Elem.Kind == schema.KRef) {
			if f.HasDefault {
				continue
			}
			rec[f.Name] = f.Zero()
			continue
		}
		v, err := schema.ParseDB(f.Type, s)
		if err != nil {
			return nil, xerr.New(xerr.InvalidValue, c.Name+"."+f.Name, clipRemote(s))
		}
		rec[f.Name] = v
	}
	return rec, nil
}

// crossMade is what an arriving VM's import made here.
type crossMade struct {
	vm    string
	snaps []string    // the snapshots' VMs
	disks []crossDisk // the header's disks, in order
	vdis  []string    // a VDI per disk, in the header's order
	vbds  []string    // a VBD per disk, in the header's order ("" for a suspend image)
	// suspend names the checkpoint whose suspend image each such disk
	// is (by its number among the disks).
	suspend map[int]string
	drives  []string // the empty drives' VBDs
	vifs    []string
	// want is what each VM made should have once this host's replica
	// has it all: its VBDs and VIFs.
	want map[string][2]int
}

// importCross creates the arriving VM's records as the caller: the VM
// (halted, with the source's uuid, marked migrate_send), a VDI per disk
// on its SR, the VBDs (the drives empty) and the VIFs; then its
// snapshots likewise (with their uuids, is_a_snapshot, snapshot_of the
// new VM and their snapshot_time) and the parent links among them. made
// is filled as it goes (undo).
func (m *Manager) importCross(ctx context.Context, caller api.Caller, h crossHeader, made *crossMade) error {
	made.want = map[string][2]int{}
	made.disks = h.Import.allDisks()
	rec, err := crossRecord(dm.VM.Class, h.Import.VM, map[string]any{"is_a_template": false})
	if err != nil {
		return err
	}
	v, err := caller.InvokeArgs(ctx, "VM.create", []any{rec})
	if err != nil {
		return err
	}
	made.vm, _ = v.(string)
	if !schema.IsRef(made.vm) {
		return xerr.New(xerr.InternalError, "VM.create returned no VM")
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.UUID, made.vm, h.UUID); err != nil {
			return err
		}
		return tx.Set(dm.VM.CurrentOperations, made.vm, map[string]string{migrateInKey(h.Source): string(dm.VMOperationsMigrateSend)})
	}); err != nil {
		return err
	}
	if err := m.importDevices(ctx, caller, made, made.vm, h.Import.Disks, h.Import.Drives, h.Import.NICs); err != nil {
		return err
	}
	if h.Import.Suspend != nil {
		if h.Power != psSuspended {
			return xerr.New(xerr.InternalError, "migration: a memory image for a VM that is not suspended")
		}
		if err := m.importSuspend(ctx, caller, made, made.vm, h.UUID, *h.Import.Suspend); err != nil {
			return err
		}
	}
	byUUID, err := m.importCrossSnapshots(ctx, caller, h, made)
	if err != nil {
		return err
	}
	if err := m.linkCrossParents(h, made.vm, byUUID); err != nil {
		return err
	}
	// The plan reads this host's replica: wait for the records there.
	arrived := m.awaitDB(storageReadyTimeout, nil, ctx.Done(), func(snap db.Reader) (bool, bool) {
		for vm, n := range made.want {
			row, ok := snap.Get(dm.VM.Class, vm)
			if !ok || len(strs(snap.Value(row, dm.VM.VBDs))) != n[0] || len(strs(snap.Value(row, dm.VM.VIFs))) != n[1] {
				return false, false
			}
		}
		return true, true
	})
	switch {
	case arrived:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return xerr.New(xerr.InternalError, "the imported VM did not reach this host's replica")
}

// importCrossSnapshots makes the VM's snapshots (and checkpoints) that
// came with it, each with its devices and memory image, and returns
// their new refs by uuid.
func (m *Manager) importCrossSnapshots(ctx context.Context, caller api.Caller, h crossHeader, made *crossMade) (map[string]string, error) {
	byUUID := map[string]string{}
	for _, s := range h.Import.Snapshots {
		rec, err := crossRecord(dm.VM.Class, s.VM, nil)
		if err != nil {
			return nil, err
		}
		t, err := schema.ParseDB(dm.VM.SnapshotTime.Type, s.Time)
		if err != nil {
			return nil, xerr.New(xerr.InvalidValue, "VM.snapshot_time", clipRemote(s.Time))
		}
		v, err := caller.InvokeArgs(ctx, "VM.create", []any{rec})
		if err != nil {
			return nil, err
		}
		ref, _ := v.(string)
		if !schema.IsRef(ref) {
			return nil, xerr.New(xerr.InternalError, "VM.create returned no VM")
		}
		made.snaps = append(made.snaps, ref)
		byUUID[s.UUID] = ref
		if _, err := m.db.Update(func(tx *db.Tx) error {
			for f, v := range map[*schema.Field]any{dm.VM.UUID: s.UUID, dm.VM.IsASnapshot: true,
				dm.VM.SnapshotOf: made.vm, dm.VM.SnapshotTime: t} {
				if err := tx.Set(f, ref, v); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if err := m.importDevices(ctx, caller, made, ref, s.Disks, s.Drives, s.NICs); err != nil {
			return nil, err
		}
		if s.Suspend != nil {
			if err := m.importSuspend(ctx, caller, made, ref, s.UUID, *s.Suspend); err != nil {
				return nil, err
			}
		}
	}
	return byUUID, nil
}

// linkCrossParents sets the parent links among what arrived: the VM's
// and each snapshot's, where the parent came too.
func (m *Manager) linkCrossParents(h crossHeader, vm string, byUUID map[string]string) error {
	_, err := m.db.Update(func(tx *db.Tx) error {
		if p, ok := byUUID[h.Import.Parent]; ok {
			if err := tx.Set(dm.VM.Parent, vm, p); err != nil {
				return err
			}
		}
		for _, s := range h.Import.Snapshots {
			if p, ok := byUUID[s.Parent]; ok {
				if err := tx.Set(dm.VM.Parent, byUUID[s.UUID], p); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return err
}

// importSuspend makes the suspend image VDI of snap (of uuid: a
// checkpoint, or the suspended VM itself), as xapi's: type suspend,
// sm_config:vmhint naming it, and records snap suspended on it. The
// image arrives as a copy.
func (m *Manager) importSuspend(ctx context.Context, caller api.Caller, made *crossMade, snap, uuid string, d crossDisk) error {
	rec, err := crossRecord(dm.VDI.Class, d.VDI, map[string]any{"SR": d.VDI["SR"], "read_only": false, "type": "suspend",
		"sm_config": map[string]string{suspendVMHint: uuid}, "xenstore_data": map[string]string{}})
	if err != nil {
		return err
	}
	ref, err := m.invokeHere(ctx, caller, "VDI.create", []any{rec})
	if err != nil {
		return err
	}
	if made.suspend == nil {
		made.suspend = map[int]string{}
	}
	made.suspend[len(made.vdis)] = snap
	made.vdis = append(made.vdis, ref)
	made.vbds = append(made.vbds, "")
	_, err = m.db.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.SuspendVDI, snap, ref); err != nil {
			return err
		}
		return tx.Set(dm.VM.PowerState, snap, psSuspended)
	})
	return err
}

// importDevices creates the disks (a VDI on its SR and a VBD each), the
// empty drives and the VIFs of vm, one of the arriving VMs.
func (m *Manager) importDevices(ctx context.Context, caller api.Caller, made *crossMade, vm string,
	disks []crossDisk, drives, nics []map[string]string) error {
	for _, d := range disks {
		sr := d.VDI["SR"]
		rec, err := crossRecord(dm.VDI.Class, d.VDI, map[string]any{"SR": sr, "read_only": false, "sm_config": map[string]string{},
			"xenstore_data": map[string]string{}})
		if err != nil {
			return err
		}
		ref, err := m.invokeHere(ctx, caller, "VDI.create", []any{rec})
		if err != nil {
			return err
		}
		made.vdis = append(made.vdis, ref)
		vbd, err := crossCreate(ctx, caller, dm.VBD.Class, d.VBD, map[string]any{"VM": vm, "VDI": ref, "empty": false})
		if err != nil {
			return err
		}
		made.vbds = append(made.vbds, vbd)
	}
	for _, d := range drives {
		vbd, err := crossCreate(ctx, caller, dm.VBD.Class, d, map[string]any{"VM": vm, "VDI": schema.NullRef, "empty": true})
		if err != nil {
			return err
		}
		made.drives = append(made.drives, vbd)
	}
	for _, n := range nics {
		vif, err := crossCreate(ctx, caller, dm.VIF.Class, n, map[string]any{"VM": vm, "network": n["network"]})
		if err != nil {
			return err
		}
		made.vifs = append(made.vifs, vif)
	}
	made.want[vm] = [2]int{len(disks) + len(drives), len(nics)}
	return nil
}

// crossCreate makes a record of class c (a VBD or a VIF) from the
// header's fields and set, as caller: its ref.
func crossCreate(ctx context.Context, caller api.Caller, c *schema.Class, fields map[string]string, set map[string]any) (string, error) {
	rec, err := crossRecord(c, fields, set)
	if err != nil {
		return "", err
	}
	v, err := caller.InvokeArgs(ctx, c.Name+".create", []any{rec})
	if err != nil {
		return "", err
	}
	ref, _ := v.(string)
	return ref, nil
}

// finishCrossImport is the destination's part of the commit for the
// disks: the VDIs that were read-only are again, and the snapshots'
// VDIs are snapshots (of the new copies of their VDIs) with their
// snapshot_time.
func (m *Manager) finishCrossImport(made crossMade) error {
	_, err := m.db.Update(func(tx *db.Tx) error {
		for i, d := range made.disks {
			if i >= len(made.vdis) {
				break
			}
			vdi := made.vdis[i]
			if _, ok := tx.Get(dm.VDI.Class, vdi); !ok {
				return xerr.New(xerr.HandleInvalid, "VDI", vdi)
			}
			if d.ReadOnly {
				if err := tx.Set(dm.VDI.ReadOnly, vdi, true); err != nil {
					return err
				}
			}
			if d.SnapshotTime == "" {
				continue
			}
			t, err := schema.ParseDB(dm.VDI.SnapshotTime.Type, d.SnapshotTime)
			if err != nil {
				return xerr.New(xerr.InvalidValue, "VDI.snapshot_time", clipRemote(d.SnapshotTime))
			}
			of := schema.NullRef
			if d.SnapshotOf > 0 && d.SnapshotOf <= len(made.vdis) {
				of = made.vdis[d.SnapshotOf-1]
			}
			for f, v := range map[*schema.Field]any{dm.VDI.IsASnapshot: true, dm.VDI.SnapshotOf: of, dm.VDI.SnapshotTime: t} {
				if err := tx.Set(f, vdi, v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return err
}

// undoImport destroys what importCross made, as an internal session
// (the remote session may have ended), else as the caller.
func (m *Manager) undoImport(ctx context.Context, caller api.Caller, made *crossMade) {
	bg := context.WithoutCancel(ctx)
	if internal, end, err := m.srv.InternalCaller("VM.migrate_send"); err == nil {
		defer end()
		caller = internal
	}
	if made.vm != "" {
		if _, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(dm.VM.Class, made.vm); !ok {
				return nil
			}
			return tx.Set(dm.VM.CurrentOperations, made.vm, map[string]string{})
		}); err != nil {
			m.log.Error("cannot clear an arriving VM's mark", "vm", made.vm, "err", err)
		}
	}
	for _, vbd := range append(slices.Clone(made.vbds), made.drives...) {
		if _, err := caller.InvokeArgs(bg, "VBD.destroy", []any{vbd}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Warn("cannot destroy an arriving VM's VBD", "vbd", vbd, "err", err)
		}
	}
	for _, vif := range made.vifs {
		if _, err := caller.InvokeArgs(bg, "VIF.destroy", []any{vif}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Warn("cannot destroy an arriving VM's VIF", "vif", vif, "err", err)
		}
	}
	for _, vm := range append(slices.Clone(made.snaps), made.vm) {
		if vm == "" {
			continue
		}
		if _, err := caller.InvokeArgs(bg, "VM.destroy", []any{vm}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Error("cannot destroy an arriving VM", "vm", vm, "err", err)
		}
	}
	m.destroyVDIs(bg, made.vdis, "an incoming cross-pool migration made")
}

// crossIn imports the VM, builds the incoming domain on the new disks,
// serves them to the source's mirrors, receives the guest and, on go,
// records the VM running here. Until go any failure removes the domain
// and the records.
func (m *Manager) crossIn(ctx context.Context, mc *migConn, h crossHeader, caller api.Caller) error {
	fail := func(err error) error {
		_ = mc.send(failedMsg(err), time.Second)
		return err
	}
	var made crossMade
	adopted := false
	defer func() {
		if !adopted {
			m.undoImport(ctx, caller, &made)
		}
	}()
	if err := m.importCross(ctx, caller, h, &made); err != nil {
		return fail(err)
	}
	ref := made.vm
	hh := h.migrateHeader
	hh.VM = ref
	// The VM's queue: nothing else runs on it while it arrives.
	errc := make(chan error, 1)
	key := "migrate-in:" + db.NewRef()
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.trackOp(ref, key, "pool_migrate_in", cancel)
	defer m.untrackOp(ref, key)
	j := &job{ctx: jctx, name: "VM.migrate_send (incoming from another pool)", run: func(ctx context.Context) error {
		var err error
		if !liveState(hh.Power) {
			err = m.crossInCopies(ctx, mc, hh, made)
		} else {
			err = m.crossInDomain(ctx, mc, hh, made)
		}
		if err == nil {
			adopted = true
		}
		errc <- err
		return err
	}}
	m.q.submit(ref, j)
	if err := j.wait(); err != nil {
		select {
		case ran := <-errc:
			return ran
		default:
			return fail(err) // never ran
		}
	}
	return nil
}

// crossInDomain is crossIn's part on the VM's queue.
func (m *Manager) crossInDomain(ctx context.Context, mc *migConn, h migrateHeader, made crossMade) error {
	o := m.internalOp(ctx, h.VM, h.UUID, "pool_migrate_in")
	fail := func(err error) error {
		_ = mc.send(failedMsg(err), time.Second)
		return err
	}
	moves, err := crossMoves(made)
	if err != nil {
		return fail(err)
	}
	// The copies first, served before the domain is built (storage
	// attaches their VDIs read-write before the domain attaches them:
	// storagecopy.go); a disk with a Base is a clone of a copy
	// (storagechain.go), made when the source asks or, for a mirrored
	// one, once the copies are done.
	exports, err := m.receiveCopies(ctx, mc, h, moves, crossReply{migrateMsg: migrateMsg{Step: stepReady, Disks: moves}, NewVM: h.VM},
		func(ie *incomingExports, i int) error { return m.cloneInPlace(ctx, ie, moves, i, made) })
	defer exports.close(ctx)
	if err != nil {
		return fail(err)
	}
	p, release, err := m.planIncoming(h.VM, nil)
	if err != nil {
		return fail(err)
	}
	defer release()
	adopted := false
	var bm bootMade
	defer func() {
		if !adopted {
			m.undoIncoming(o, &bm)
		}
	}()
	defer exports.close(ctx) // before the domain goes (once)
	if err := m.buildDomain(o, p, &bm); err != nil {
		return fail(err)
	}
	if err := exports.exportMirrors(ctx, h, p, moves); err != nil {
		return fail(err)
	}
	if err := mc.send(migrateMsg{Step: stepMirrors, Disks: moves}, migrateMsgTimeout); err != nil {
		return err
	}
	m.log.Info("receiving a VM from another pool", "vm", h.UUID)
	info, err := m.receiveMemory(ctx, mc, h.UUID, exports, len(moves) > 0) // acceptCrossPool checked the backend
	if err != nil {
		return fail(err)
	}
	if err := mc.send(migrateMsg{Step: stepReceived, Domid: info.Domid}, migrateMsgTimeout); err != nil {
		return err
	}
	// Without go the move did not happen: the source still has the VM.
	if _, err := mc.recvMsg(stepGo, migrateGoTimeout); err != nil {
		return err
	}
	// The commit point: the VM runs here and this pool's record says so.
	adopted = true
	m.adoptIncoming(o, p, h, release)
	if err := m.finishCrossImport(made); err != nil {
		m.log.Error("cannot record an arrived VM's disks as they were", "vm", h.VM, "err", err)
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.CurrentOperations, h.VM, map[string]string{})
	}); err != nil {
		m.log.Error("cannot clear an arrived VM's mark", "vm", h.VM, "err", err)
	}
	m.receiveRRD(mc, h)
	_ = mc.send(migrateMsg{Step: stepDone}, migrateMsgTimeout)
	m.log.Info("VM arrived from another pool", "vm", h.UUID)
	return nil
}

// crossInCopies is crossIn's part for a halted or suspended VM: each new VDI served
// for the source's copy; on go the VM is kept, halted or suspended.
func (m *Manager) crossInCopies(ctx context.Context, mc *migConn, h migrateHeader, made crossMade) error {
	fail := func(err error) error {
		_ = mc.send(failedMsg(err), time.Second)
		return err
	}
	moves, err := crossMoves(made)
	if err != nil {
		return fail(err)
	}
	for i := range moves {
		moves[i].Copy = true // a halted VM's disks are all copied
	}
	// The copies take as long as they take: a source that fails breaks
	// the stream.
	exports, err := m.receiveCopies(ctx, mc, h, moves, crossReply{migrateMsg: migrateMsg{Step: stepReady, Disks: moves}, NewVM: h.VM},
		func(ie *incomingExports, i int) error { return m.cloneInPlace(ctx, ie, moves, i, made) })
	defer exports.close(ctx)
	if err != nil {
		return fail(err)
	}
	if _, err := mc.recvMsg(stepGo, 0); err != nil {
		return err
	}
	exports.close(ctx)
	if err := m.finishCrossImport(made); err != nil {
		return fail(err)
	}
	if _, err := m.db.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.CurrentOperations, h.VM, map[string]string{})
	}); err != nil {
		return fail(err)
	}
	_ = mc.send(migrateMsg{Step: stepDone}, migrateMsgTimeout)
	m.log.Info("VM arrived from another pool, not running", "vm", h.UUID, "disks", len(moves))
	return nil
}
