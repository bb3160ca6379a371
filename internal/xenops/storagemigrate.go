package xenops

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/nbd"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Storage migration inside a pool: VM.migrate_send with a vdi_map that
// sends disks to other SRs (xapi's storage XenMotion), and the
// messages around it (host.migrate_receive, VM.assert_can_migrate).
//
// The destination is a host of this pool (dest["host"]); a dest map
// naming a host this pool does not have (with its "master") goes to
// another pool: crosspool.go. The checks are xapi's: every disk of the VM
// (not its CDs or empty drives) is in vdi_map (VDI_NOT_IN_MAP; an empty
// vdi_map, which xapi refuses so, is taken here as every disk staying,
// as VM.pool_migrate has it, for clients that check a pool migration
// with VM.assert_can_migrate); a VDI
// mapped to the SR it is on stays, and the destination must see that SR
// (VM_REQUIRES_SR), as it must the SR a VDI moves to; a VDI with
// on_boot=reset cannot move (VDI_ON_BOOT_MODE_INCOMPATIBLE_WITH_OPERATION);
// options copy=true is refused inside a pool; vif_map is refused inside
// a pool when it would change a VIF's network, with xapi's message
// (entries naming the network a VIF is on already change nothing);
// every VIF's network must reach the destination (VM_REQUIRES_NETWORK);
// room for the VM's memory (HOST_NOT_ENOUGH_FREE_MEMORY); at most three
// storage migrations from one host at once (TOO_MANY_STORAGE_MIGRATES).
// The disks of the VM's snapshots that vdi_map names (by their own VDI
// or their snapshot_of) go along as copies (storagecopy.go); one left on
// an SR the destination cannot see is VDI_NOT_IN_MAP; so do the memory
// images of its checkpoints on an SR the destination does not see
// (suspendMove). A halted or suspended VM's disks are copied (xapi
// allows VM.migrate_send of both), a suspended one's memory image with
// them; the VM's suspend_SR, if the destination does not see it, is
// cleared (xapi's intra_pool_fix_suspend_sr).
//
// The flow (a running VM; the protocol of migrate.go, with the disks in
// the header and the ready step):
//
//  1. header: the source names the disks that move (VBD, VDI, target SR);
//  2. the destination creates a VDI for each on its target SR (same
//     virtual size, through storage's VDI.create as an internal
//     session; a disk with a Base is a clone made later:
//     storagechain.go), serves the copies' new VDIs (storage.Export)
//     and says ready with the VDIs and a token per export;
//  3. the source opens a storage.Relay per copy: a Unix socket of its
//     own, each connection carried to the destination as another
//     migration stream whose header names the token
//     (Manager.ServeMigration hands it to the export). No port is
//     opened; the bytes travel the pool's authenticated connection. It
//     copies what nothing writes (read-only disks, the snapshots' disks,
//     oldest first, each with a Base asked for with "clone" and sent as
//     what differs from it: storagecopy.go, storagechain.go) and says
//     copied, upon which the destination ends those exports;
//  4. the destination clones the mirrored disks' Bases, plans the
//     incoming domain on the new VDIs in place of the old ones
//     (planMoving) and builds it; the incoming domain serves each new
//     disk as a writable NBD export on a Unix socket of this host
//     (backend.DiskExporter: QEMU's own NBD server, nbd-server-start and
//     block-export-add, as libvirt has it; the emulator that will run
//     the guest is the one process holding the image, so QEMU 7.2's
//     image locking has nothing to refuse, where a qemu-nbd of its own
//     would hold the write lock the incoming QEMU needs at the
//     switchover); "mirrors" carries a token per export;
//  5. the source mirrors each other disk through relays as in 3
//     (backend.DiskMirrorer: a full mirror, what the guest reads, its
//     chain flattened; or, for a disk with a Base, its top image alone
//     onto the clone of its newest snapshot's copy) and waits for every
//     mirror to be in sync, the task's progress following;
//  6. the memory goes as for VM.pool_migrate, with
//     MigrateOptions.BeforeSwitchover completing the mirrors without a
//     pivot once the guest is stopped for the switchover (QEMU's
//     pause-before-switchover): the targets then hold what the disks
//     hold; the destination stops its exports once the state is in;
//  7. the commit point (one replicated write) moves resident_on, points
//     the VBDs at the new VDIs and gives those the old ones' names and
//     snapshot fields; after it the source destroys its stopped domain
//     and then the old VDIs (VDI.destroy), as xapi does.
//
// Before the commit, any failure or a cancelled task (during the copies,
// the mirrors or the memory) cancels the mirrors, leaves the VM running
// on the source with its old disks, and the destination destroys its
// domain and the VDIs it made. A disk and its snapshots arrive sharing
// their history as they did on the source (storagechain.go), as xapi's
// storage migration has them; a disk whose history the source SR cannot
// read (another driver, or a snapshot written since) goes whole. A
// read-only disk of a running VM is copied, not mirrored (as xapi's
// vdi_filter has it; the incoming QEMU opens it read-only, so it could
// not be a mirror's target). A VDI on an SR the destination sees stays
// where it is.

// liveState reports whether a VM in power state p has a domain (running
// or paused): it moves live; a halted or suspended one has only its
// disks (and memory image) copied.
func liveState(p string) bool { return p == psRunning || p == psPaused }

// maxStorageMigrates is xapi's bound on the storage migrations a host
// sends at once.
const maxStorageMigrates = 3

// storageReadyTimeout bounds the wait for the destination's new VDIs to
// reach this host's replica.
const storageReadyTimeout = 30 * time.Second

// diskMove is one disk a storage migration moves.
type diskMove struct {
	VBD   string `json:"vbd"`
	VDI   string `json:"vdi"`             // the VDI it is on now
	SR    string `json:"sr"`              // the SR it moves to
	New   string `json:"new,omitempty"`   // the destination's VDI (ready)
	Token string `json:"token,omitempty"` // the destination's export (ready)
	// Copy: the VDI is copied while nothing writes it (a halted VM's
	// disk, a snapshot's) rather than mirrored from the running domain.
	Copy bool `json:"copy,omitempty"`
	// Base is the VBD of an earlier copy this disk starts from on the
	// destination (storagechain.go): its new VDI is a clone of that
	// one's, and only what differs is sent.
	Base string `json:"base,omitempty"`
	// Suspend names the checkpoint (a snapshot of the VM with its
	// memory) whose suspend image VDI is this move's, copied with no VBD.
	Suspend string `json:"suspend,omitempty"`
	// diff, on the source, is what a copy with a Base writes.
	diff []storage.Extent
}

// key names a move among a migration's: its VBD, or the checkpoint whose
// suspend image it is.
func (mv diskMove) key() string {
	if mv.Suspend != "" {
		return "suspend/" + mv.Suspend
	}
	return mv.VBD
}

// storageState is the manager's part of storage migrations: the exports
// an incoming one serves (by token) and how many are being sent.
type storageState struct {
	tunnels sync.Map // token -> *tunnelEnd
	sending sync.Mutex
	active  int
}

// tunnelEnd is an export an incoming migration serves to its source.
type tunnelEnd struct {
	source string // the host that may connect
	vm     string
	e      *storage.Export
}

func (m *Manager) registerStorageMigrate() {
	api.Register(m.srv, m.vmMigrateSend)
	api.Register(m.srv, m.hostMigrateReceive)
}

// hostMigrateReceive is host.migrate_receive: xapi's dest map for a
// migration to host over network. The "session_id" is the caller's own
// session (xapi opens a new one for the same subject; inside a pool the
// map is only passed back to VM.migrate_send, which does not use it),
// the URLs name the host's address on the network and the coordinator's.
func (m *Manager) hostMigrateReceive(c *api.Call, a dm.HostMigrateReceiveArgs) (map[string]string, error) {
	host, err := c.Lookup(dm.Host.Class, string(a.Host))
	if err != nil {
		return nil, err
	}
	network, err := c.Lookup(dm.Network.Class, string(a.Network))
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	var pif *db.Row
	for _, p := range strs(snap.Value(network, dm.Network.PIFs)) {
		if r, ok := snap.Get(dm.PIF.Class, p); ok && r.String(dm.PIF.Host) == host.Ref {
			pif = r
			break
		}
	}
	if pif == nil {
		return nil, xerr.New(xerr.HostCannotAttachNetwork, host.Ref, network.Ref)
	}
	ip, mode := pif.String(dm.PIF.IP), pif.String(dm.PIF.IPConfigurationMode)
	if pif.String(dm.PIF.PrimaryAddressType) == string(dm.PrimaryAddressTypeIPV6) {
		mode = pif.String(dm.PIF.IPV6ConfigurationMode)
		ip = ""
		for _, a := range strs(snap.Value(pif, dm.PIF.IPV6)) {
			if addr, _, _ := cutSlash(a); addr != "" && !isLinkLocal(addr) {
				ip = "[" + addr + "]"
				break
			}
		}
	}
	if ip == "" {
		if mode == "" || mode == "None" {
			return nil, xerr.New(xerr.PIFHasNoNetworkConfiguration, pif.Ref)
		}
		return nil, xerr.New(xerr.InterfaceHasNoIP, pif.Ref)
	}
	session := ""
	if c.Session != nil {
		session = c.Session.Ref
	}
	master := ip
	for _, p := range snap.All(dm.Pool.Class) {
		if h, ok := snap.Get(dm.Host.Class, p.String(dm.Pool.Master)); ok && h.String(dm.Host.Address) != "" {
			master = h.String(dm.Host.Address)
		}
	}
	q := "?session_id=" + session
	return map[string]string{
		"SM":         "http://" + ip + "/services/SM" + q,
		"xenops":     "http://" + ip + "/services/xenops" + q,
		"host":       host.Ref,
		"session_id": session,
		"master":     "http://" + master + "/",
	}, nil
}

// cutSlash splits an address/prefix.
func cutSlash(s string) (addr, prefix string, ok bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func isLinkLocal(addr string) bool {
	ip := net.ParseIP(addr)
	return ip != nil && ip.IsLinkLocalUnicast()
}

// destHost is the host a dest map names, in this pool: a dest map
// without the other pool's master is refused here.
func destHost(r db.Reader, dest map[string]string) (string, error) {
	h := dest["host"]
	if _, ok := r.Get(dm.Host.Class, h); !ok {
		return "", xerr.New(xerr.OperationNotAllowed, "migration to another pool is not supported; dest[host] must name a host of this pool")
	}
	return h, nil
}

// storageMoves checks a migration of vm to host dest with vdi_map and
// vif_map as xapi does (see the top of this file) and returns the disks
// that move. With no moves the checks are VM.pool_migrate's.
func (m *Manager) storageMoves(r db.Reader, vm *db.Row, dest string, vdiMap map[dm.VDIRef]dm.SRRef,
	vifMap map[dm.VIFRef]dm.NetworkRef, options map[string]string) ([]diskMove, error) {
	if b, err := strconv.ParseBool(options["copy"]); err == nil && b {
		return nil, xerr.New(xerr.OperationNotAllowed, "Copy mode is disallowed on intra pool storage migration, try efficient alternatives, for example, VM.copy/clone.")
	}
	var moves []diskMove
	for _, vbd := range strs(r.Value(vm, dm.VM.VBDs)) {
		row, ok := r.Get(dm.VBD.Class, vbd)
		if !ok || row.Get(dm.VBD.Empty) == true || row.String(dm.VBD.Type) == string(dm.VBDTypeCD) {
			continue
		}
		vdi := row.String(dm.VBD.VDI)
		sr, mapped := vdiMap[dm.VDIRef(vdi)]
		if !mapped && len(vdiMap) == 0 {
			continue // no map at all: every disk stays (VM.pool_migrate's checks)
		}
		if !mapped {
			return nil, xerr.New(xerr.VDINotInMap, vdi)
		}
		vrow, ok := r.Get(dm.VDI.Class, vdi)
		if !ok {
			return nil, xerr.New(xerr.VDIMissing, schema.NullRef, vdi)
		}
		if string(sr) == vrow.String(dm.VDI.SR) {
			continue
		}
		if _, ok := r.Get(dm.SR.Class, string(sr)); !ok {
			return nil, xerr.New(xerr.HandleInvalid, "SR", string(sr))
		}
		if vrow.String(dm.VDI.OnBoot) == string(dm.OnBootReset) {
			return nil, xerr.New(xerr.VDIOnBootModeIncompatibleWithOperation)
		}
		if !hostSeesSR(r, dest, string(sr)) {
			return nil, xerr.New(xerr.VMRequiresSR, vm.Ref, string(sr))
		}
		// Copied rather than mirrored: a halted VM's disks, and a
		// read-only disk (as xapi's vdi_filter has it: the incoming
		// domain opens it read-only, so it cannot be a mirror's target).
		ro := row.String(dm.VBD.Mode) == string(dm.VBDModeRO) || vrow.Get(dm.VDI.ReadOnly) == true
		moves = append(moves, diskMove{VBD: vbd, VDI: vdi, SR: string(sr), Copy: ro || !liveState(vm.String(dm.VM.PowerState))})
	}
	for vif, net := range vifMap {
		row, ok := r.Get(dm.VIF.Class, string(vif))
		if !ok || row.String(dm.VIF.VM) != vm.Ref || row.String(dm.VIF.Network) != string(net) {
			return nil, xerr.New(xerr.OperationNotAllowed, "VIF mapping is not allowed for intra-pool migration -all VIFs must be on the same network")
		}
	}
	moves, err := snapshotMoves(r, vm, dest, vdiMap, moves)
	if err != nil {
		return nil, err
	}
	// A suspended VM's own memory image, as its checkpoints'.
	if mv, ok, err := suspendMove(r, vm, dest, vdiMap); err != nil {
		return nil, err
	} else if ok {
		moves = append(moves, mv)
	}
	return moves, m.assertCanMigrateMoving(r, vm, dest, moves)
}

// vmMigrateSend is VM.migrate_send on the VM's resident host, for a
// destination in this pool.
func (m *Manager) vmMigrateSend(c *api.Call, a dm.VMMigrateSendArgs) (dm.VMRef, error) {
	row, err := c.Lookup(dm.VM.Class, string(a.VM))
	if err != nil {
		return "", err
	}
	snap := c.Snapshot()
	if !inThisPool(snap, a.Dest) && a.Dest["master"] != "" {
		return m.vmMigrateSendRemote(c, a, row) // to another pool: crosspool.go
	}
	dest, err := destHost(snap, a.Dest)
	if err != nil {
		return "", err
	}
	v := vmCheckOf(snap, row)
	if err := v.checkOp(dm.VMOperationsMigrateSend, false); err != nil {
		return "", err
	}
	power := row.String(dm.VM.PowerState)
	if power != psRunning && power != psPaused && power != psHalted && power != psSuspended {
		return "", xerr.New(xerr.VMBadPowerState, row.Ref, powerName(psRunning), powerName(power))
	}
	moves, err := m.storageMoves(snap, row, dest, a.VDIMap, a.VIFMap, a.Options)
	if err != nil {
		return "", err
	}
	if r := row.String(dm.VM.ResidentOn); liveState(power) && r != m.host {
		return "", xerr.New(xerr.VMNotResidentHere, row.Ref, m.host)
	}
	if len(moves) > 0 {
		done, err := m.storageSlot()
		if err != nil {
			return "", err
		}
		defer done()
	}
	err = m.withVMOp(c, row.Ref, dm.VMOperationsMigrateSend, m.recheck(dm.VMOperationsMigrateSend, func(o *opCtx) error {
		defer followForwarded(c, o)()
		if !liveState(power) {
			return m.copyOut(o, dest, power, a.Options, moves)
		}
		return m.migrateOutMoving(o, dest, a.Options, moves)
	}))
	if err != nil {
		return "", err
	}
	if liveState(power) {
		m.noteMigrated(c.Ctx, row, m.host, dest)
	}
	return a.VM, nil
}

// movedSet is the VDIs moves takes away.
func movedSet(moves []diskMove) map[string]string {
	out := make(map[string]string, len(moves))
	for _, mv := range moves {
		out[mv.VDI] = mv.New
	}
	return out
}

// storageSlot takes one of the maxStorageMigrates places for storage
// migrations sending from this host (TOO_MANY_STORAGE_MIGRATES when none
// is free); done gives it back.
func (m *Manager) storageSlot() (done func(), err error) {
	m.stor.sending.Lock()
	defer m.stor.sending.Unlock()
	if m.stor.active >= maxStorageMigrates {
		return nil, xerr.New(xerr.TooManyStorageMigrates, strconv.Itoa(maxStorageMigrates))
	}
	m.stor.active++
	return func() {
		m.stor.sending.Lock()
		m.stor.active--
		m.stor.sending.Unlock()
	}, nil
}

// newToken is a random name for an export.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sourceMirrors is the source's side of the disks of one storage
// migration: a relay and a mirror per disk.
type sourceMirrors struct {
	m      *Manager
	uuid   string
	dest   string
	moves  []diskMove
	device map[string]string // VBD -> the domain's disk
	relays []*storage.Relay
	begun  []string // devices whose mirror started
	done   bool     // completed: nothing to cancel
}

// tunnelRelay is a storage.Relay whose connections are migration
// streams from dial, each opened with hdr carrying tunnel: the token of
// the destination's disk export the connection is carried to.
func tunnelRelay(dial func(context.Context) (net.Conn, error), hdr migrateHeader, tunnel string) (*storage.Relay, error) {
	hdr.Tunnel, hdr.Options, hdr.Disks = tunnel, nil, nil
	return storage.NewRelay("", func(ctx context.Context) (net.Conn, error) {
		c, err := dial(ctx)
		if err != nil {
			return nil, err
		}
		if err := newMigConn(c).send(hdr, migrateMsgTimeout); err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	})
}

// startMirrors opens a relay per disk, its connections migration
// streams to dest from dial, and starts its mirror; bandwidth (0: none)
// caps each mirror's bulk copy: the VM's
// other_config:migration_bandwidth holds its disks as it does its memory.
func (m *Manager) startMirrors(o *opCtx, dest string, info backend.DomainInfo, moves []diskMove, hdr migrateHeader,
	dial func(context.Context) (net.Conn, error), bandwidth int64) (*sourceMirrors, error) {
	dmr, ok := m.be.(backend.DiskMirrorer)
	if !ok {
		return nil, xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "the "+m.be.Name()+" backend cannot mirror disks")
	}
	sm := &sourceMirrors{m: m, uuid: o.uuid, dest: dest, moves: moves, device: map[string]string{}}
	for _, d := range info.Disks {
		sm.device[d.VBD] = d.Device
	}
	for _, mv := range moves {
		if mv.Copy {
			continue // copied apart (storagecopy.go)
		}
		dev, ok := sm.device[mv.VBD]
		if !ok {
			sm.cancel(o.ctx)
			return nil, xerr.New(xerr.VMMigrateFailed, o.vm, m.host, dest, "the domain has no disk for VBD "+mv.VBD)
		}
		relay, err := tunnelRelay(dial, hdr, mv.Token)
		if err != nil {
			sm.cancel(o.ctx)
			return nil, err
		}
		sm.relays = append(sm.relays, relay)
		t := backend.MirrorTarget{URI: relay.URI().String(), Sync: backend.MirrorFull, Bandwidth: bandwidth}
		if mv.Base != "" {
			t.Sync = backend.MirrorTop // onto a clone of its newest snapshot's copy
		}
		// A mirror a dead daemon left (its relay gone) is cleared first:
		// the VM's queue runs one operation at a time, so none is ours.
		if err := dmr.CancelMirror(o.ctx, o.uuid, dev); err != nil {
			sm.cancel(o.ctx)
			return nil, err
		}
		if err := dmr.StartMirror(o.ctx, o.uuid, dev, t); err != nil {
			sm.cancel(o.ctx)
			return nil, err
		}
		sm.begun = append(sm.begun, dev)
	}
	return sm, nil
}

// wait waits for every mirror to be in sync, progress going from lo to
// hi.
func (sm *sourceMirrors) wait(o *opCtx, lo, hi float64) error {
	dmr := sm.m.be.(backend.DiskMirrorer)
	n := float64(len(sm.begun))
	if n == 0 {
		return nil
	}
	for i, dev := range sm.begun {
		base := lo + (hi-lo)*float64(i)/n
		err := dmr.WaitMirrorReady(o.ctx, sm.uuid, dev, func(f float64) {
			o.prog.Progress(base + (hi-lo)/n*min(max(f, 0), 1))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// complete ends every mirror without a pivot (the guest is stopped).
func (sm *sourceMirrors) complete(ctx context.Context) error {
	dmr := sm.m.be.(backend.DiskMirrorer)
	for _, dev := range sm.begun {
		if err := dmr.CompleteMirror(ctx, sm.uuid, dev, false); err != nil {
			return err
		}
	}
	sm.done = true
	return nil
}

// cancel ends the mirrors that run and closes the relays. A mirror the
// backend cannot end (a target gone silent) ends once the relay is cut.
func (sm *sourceMirrors) cancel(ctx context.Context) {
	if dmr, ok := sm.m.be.(backend.DiskMirrorer); ok && !sm.done {
		bg, stop := context.WithTimeout(context.WithoutCancel(ctx), migrateMsgTimeout)
		defer stop()
		var stuck []string
		for _, dev := range sm.begun {
			if err := dmr.CancelMirror(bg, sm.uuid, dev); err != nil {
				stuck = append(stuck, dev)
			}
		}
		sm.close()
		for _, dev := range stuck {
			if err := dmr.CancelMirror(bg, sm.uuid, dev); err != nil {
				sm.m.log.Error("cannot cancel a disk mirror", "vm", sm.uuid, "device", dev, "err", err)
			}
		}
	}
	sm.close()
}

// close closes the relays.
func (sm *sourceMirrors) close() {
	for _, r := range sm.relays {
		_ = r.Close()
	}
	sm.relays = nil
}

// takeReady reads the destination's VDIs and tokens from a ready or
// mirrors message into moves and waits until this host's replica has
// the VDIs. In ready (mirrors false) the destination has made every VDI
// but those with a Base and serves the copies among them; in mirrors,
// every VDI is made and every mirrored one served.
func (m *Manager) takeReady(ctx context.Context, moves []diskMove, got []diskMove, mirrors bool) error {
	if len(got) != len(moves) {
		return xerr.New(xerr.InternalError, "migration: the destination answered for other disks")
	}
	var refs []string
	for i, mv := range moves {
		g := got[i]
		wantNew := mirrors || mv.Base == ""
		wantToken := (mirrors && !mv.Copy) || (!mirrors && mv.Copy && mv.Base == "")
		if g.VBD != mv.VBD || g.VDI != mv.VDI || (wantNew && g.New == "") || (wantToken && g.Token == "") {
			return xerr.New(xerr.InternalError, "migration: the destination answered for other disks")
		}
		if wantNew {
			moves[i].New = g.New
			refs = append(refs, g.New)
		}
		if wantToken {
			moves[i].Token = g.Token
		}
	}
	return m.awaitVDIs(ctx, refs)
}

// repointVBDs is the storage half of the commit: the VBDs (and the
// checkpoints' suspend_VDI) use the new VDIs (which keep the old ones'
// read_only, names and snapshot fields).
func repointVBDs(tx *db.Tx, moves []diskMove) error {
	if err := carryVDIFields(tx, moves); err != nil {
		return err
	}
	for _, mv := range moves {
		if mv.Suspend != "" {
			if _, ok := tx.Get(dm.VM.Class, mv.Suspend); !ok {
				return xerr.New(xerr.HandleInvalid, "VM", mv.Suspend)
			}
			if err := tx.Set(dm.VM.SuspendVDI, mv.Suspend, mv.New); err != nil {
				return err
			}
			continue
		}
		old, ok := tx.Get(dm.VDI.Class, mv.VDI)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VDI", mv.VDI)
		}
		if _, ok := tx.Get(dm.VDI.Class, mv.New); !ok {
			return xerr.New(xerr.HandleInvalid, "VDI", mv.New)
		}
		if _, ok := tx.Get(dm.VBD.Class, mv.VBD); !ok {
			return xerr.New(xerr.HandleInvalid, "VBD", mv.VBD)
		}
		if err := tx.Set(dm.VBD.VDI, mv.VBD, mv.New); err != nil {
			return err
		}
		if old.Get(dm.VDI.ReadOnly) == true {
			if err := tx.Set(dm.VDI.ReadOnly, mv.New, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// destroyVDIs destroys vdis (what a committed storage migration left
// behind, or what a failed one made) as an internal session.
func (m *Manager) destroyVDIs(ctx context.Context, vdis []string, why string) {
	if len(vdis) == 0 {
		return
	}
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		m.log.Error("cannot destroy disks "+why, "vdis", vdis, "err", err)
		return
	}
	defer end()
	bg := context.WithoutCancel(ctx)
	for _, v := range vdis {
		if _, err := m.invokeHere(bg, caller, "VDI.destroy", []any{v}); err != nil {
			m.log.Error("cannot destroy a disk "+why, "vdi", v, "err", err)
		}
	}
}

// --- the destination ---------------------------------------------------

// checkMoves checks the disks a migration header says move against the
// database: each a VBD of the VM on the VDI named, to an SR plugged here.
func (m *Manager) checkMoves(r db.Reader, vm string, moves []diskMove) error {
	seen := map[string]bool{}
	for _, mv := range moves {
		if seen[mv.key()] || !ownMove(r, vm, mv) {
			return xerr.New(xerr.InternalError, "migration: the disks to move are not the VM's")
		}
		if _, ok := m.disks.(DiskMover); mv.Copy && !ok {
			return xerr.New(xerr.VMMigrateFailed, vm, "", m.host, "this host's storage cannot receive copies")
		}
		seen[mv.key()] = true
		if _, ok := r.Get(dm.SR.Class, mv.SR); !ok {
			return xerr.New(xerr.HandleInvalid, "SR", mv.SR)
		}
		if !hostSeesSR(r, m.host, mv.SR) {
			return xerr.New(xerr.VMRequiresSR, vm, mv.SR)
		}
	}
	if err := checkBases(moves); err != nil {
		return err
	}
	if slices.ContainsFunc(moves, func(mv diskMove) bool { return !mv.Copy }) {
		if _, ok := m.be.(backend.DiskExporter); !ok {
			return xerr.New(xerr.VMMigrateFailed, vm, "", m.host, "the "+m.be.Name()+" backend cannot receive disks")
		}
	}
	return nil
}

// createMovedVDIs makes the destination's VDIs, like the old ones, on
// their target SRs, but for the moves with a Base (cloneMoved makes
// those); it returns what it made even on error (for undo).
func (m *Manager) createMovedVDIs(ctx context.Context, moves []diskMove) ([]string, error) {
	if len(moves) == 0 {
		return nil, nil
	}
	caller, end, err := m.srv.InternalCaller("VM.migrate_send")
	if err != nil {
		return nil, err
	}
	defer end()
	var made []string
	snap := m.db.Snapshot()
	for i, mv := range moves {
		if mv.Base != "" {
			continue
		}
		old, ok := snap.Get(dm.VDI.Class, mv.VDI)
		if !ok {
			return made, xerr.New(xerr.HandleInvalid, "VDI", mv.VDI)
		}
		rec := map[string]any{
			"SR": mv.SR, "name_label": old.String(dm.VDI.NameLabel), "name_description": old.String(dm.VDI.NameDescription),
			"virtual_size": old.Get(dm.VDI.VirtualSize), "type": old.String(dm.VDI.Type), "sharable": old.Get(dm.VDI.Sharable) == true,
			"read_only": false, "other_config": old.Get(dm.VDI.OtherConfig), "xenstore_data": map[string]string{},
			"sm_config": map[string]string{}, "tags": old.Get(dm.VDI.Tags),
		}
		if mv.Suspend != "" {
			// A suspend image names the VM it is for (xapi's vmhint).
			smc, _ := old.Get(dm.VDI.SMConfig).(map[string]string)
			rec["sm_config"] = map[string]string{suspendVMHint: smc[suspendVMHint]}
		}
		for k, v := range rec {
			if v == nil {
				delete(rec, k)
			}
		}
		for _, f := range dm.VDI.Class.Fields {
			if _, given := rec[f.Name]; given || f.Derived || f.HasDefault || f.Qualifier == schema.DynamicRO || f == dm.VDI.UUID {
				continue
			}
			rec[f.Name] = f.Zero()
		}
		ref, err := m.invokeHere(ctx, caller, "VDI.create", []any{rec})
		if err != nil {
			return made, err
		}
		if !schema.IsRef(ref) {
			return made, xerr.New(xerr.InternalError, "VDI.create returned no VDI")
		}
		made = append(made, ref)
		moves[i].New = ref
	}
	// The plan reads this host's replica: wait for the VDIs there.
	return made, m.awaitVDIs(ctx, made)
}

// incomingExports are the exports an incoming storage migration serves.
type incomingExports struct {
	m      *Manager
	uuid   string
	tokens []string // the mirrors'
	copies []string // the copies'
	devs   []string
	once   sync.Once
}

// exportCopies serves each new VDI that is copied (storage's export:
// before the incoming domain attaches the VDIs, as a VDI attached
// read-only cannot then be attached read-write) and fills the moves'
// tokens; exportMirrors serves, through the incoming domain p built,
// each new disk that is mirrored. close ends both; closeCopies the
// copies' (once copied, before the incoming domain takes its disks).
func (m *Manager) exportCopies(ctx context.Context, h migrateHeader, moves []diskMove) (*incomingExports, error) {
	ie := &incomingExports{m: m, uuid: h.UUID}
	for i, mv := range moves {
		if !mv.Copy || mv.Base != "" {
			continue // a copy with a Base is served once cloned (serveCopyPhase)
		}
		if err := ie.exportCopy(ctx, h, moves, i); err != nil {
			ie.close(ctx)
			return nil, err
		}
	}
	return ie, nil
}

// exportCopy serves the new VDI of moves[i], a copy, and fills its
// token.
func (ie *incomingExports) exportCopy(ctx context.Context, h migrateHeader, moves []diskMove, i int) error {
	m := ie.m
	e, err := m.disks.(DiskMover).ExportVDI(ctx, moves[i].New) // checkMoves checked it
	if err != nil {
		return err
	}
	tok := newToken()
	m.stor.tunnels.Store(tok, &tunnelEnd{source: h.Source, vm: h.VM, e: e})
	ie.copies = append(ie.copies, tok)
	moves[i].Token = tok
	return nil
}

// closeTunnel ends the export of token, if it still runs.
func (ie *incomingExports) closeTunnel(tok string) {
	if v, ok := ie.m.stor.tunnels.LoadAndDelete(tok); ok {
		_ = v.(*tunnelEnd).e.Close()
	}
}

func (ie *incomingExports) exportMirrors(ctx context.Context, h migrateHeader, p *bootPlan, moves []diskMove) error {
	m := ie.m
	for i, mv := range moves {
		if mv.Copy {
			continue
		}
		ex := m.be.(backend.DiskExporter) // checkMoves checked it
		dev := ""
		for _, d := range p.disks {
			if d.VBD == mv.VBD {
				dev = d.Device
			}
		}
		if dev == "" {
			return xerr.New(xerr.InternalError, "the incoming domain has no disk for VBD "+mv.VBD)
		}
		uri, err := ex.ExportDisk(ctx, h.UUID, dev, storage.ExportName)
		if err != nil {
			return err
		}
		ie.devs = append(ie.devs, dev)
		u, err := nbd.ParseURI(uri)
		if err != nil {
			return err
		}
		tok := newToken()
		m.stor.tunnels.Store(tok, &tunnelEnd{source: h.Source, vm: h.VM, e: storage.ExportOf(u)})
		ie.tokens = append(ie.tokens, tok)
		moves[i].Token = tok
	}
	return nil
}

// closeCopies ends the copies' exports (storage's hold of the new VDIs
// read-write).
func (ie *incomingExports) closeCopies() {
	for _, tok := range ie.copies {
		ie.closeTunnel(tok)
	}
}

// close ends the tunnels and the exports (once).
func (ie *incomingExports) close(ctx context.Context) {
	if ie == nil {
		return
	}
	ie.once.Do(func() {
		ie.closeCopies()
		for _, tok := range ie.tokens {
			ie.closeTunnel(tok)
		}
		ex, ok := ie.m.be.(backend.DiskExporter)
		if !ok {
			return
		}
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), migrateMsgTimeout)
		defer cancel()
		for _, dev := range ie.devs {
			if err := ex.UnexportDisk(bg, ie.uuid, dev); err != nil {
				ie.m.log.Warn("cannot stop exporting an incoming disk", "vm", ie.uuid, "device", dev, "err", err)
			}
		}
	})
}

// serveTunnel carries a source's mirror connection to the export its
// header names.
func (m *Manager) serveTunnel(ctx context.Context, conn net.Conn, mc *migConn, h migrateHeader) {
	v, ok := m.stor.tunnels.Load(h.Tunnel)
	if !ok {
		m.log.Warn("a disk tunnel for no export", "source", h.Source)
		return
	}
	t := v.(*tunnelEnd)
	if t.source != h.Source || t.vm != h.VM || h.Dest != m.host {
		m.log.Warn("a disk tunnel from another host than the migration's", "source", h.Source)
		return
	}
	if err := t.e.Serve(ctx, &readerConn{Conn: conn, r: mc.r}); err != nil && !errors.Is(err, io.EOF) {
		m.log.Debug("disk tunnel ended", "vm", h.UUID, "err", err)
	}
}

// readerConn is a connection whose reads go through r (bytes already
// buffered from it).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// assertCanMigrateMoving is assertCanMigrate for a migration that moves
// the disks in moves: their SRs need not be seen by dest.
func (m *Manager) assertCanMigrateMoving(r db.Reader, vm *db.Row, dest string, moves []diskMove) error {
	if pcis := strs(r.Value(vm, dm.VM.AttachedPCIs)); len(pcis) > 0 {
		return xerr.New(xerr.VMHasPCIAttached, vm.Ref)
	}
	host, ok := r.Get(dm.Host.Class, dest)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "host", dest)
	}
	if dest == vm.String(dm.VM.ResidentOn) && liveState(vm.String(dm.VM.PowerState)) {
		return xerr.New(xerr.OperationNotAllowed, "the VM already runs on this host (a migration to the same host is not supported)")
	}
	if live, known := forwarding.MetricsLive(r, host); !live || !known {
		return xerr.New(xerr.HostNotLive)
	}
	if host.Get(dm.Host.Enabled) != true {
		return xerr.New(xerr.HostDisabled, dest)
	}
	if len(moves) == 0 {
		if err := whyNotOn(r, vm, dest); err != nil {
			return err
		}
	} else {
		moved := movedSet(moves)
		// The SRs of the disks that stay (CDs among them).
		for _, vbd := range strs(r.Value(vm, dm.VM.VBDs)) {
			row, ok := r.Get(dm.VBD.Class, vbd)
			if !ok || row.Get(dm.VBD.Empty) == true {
				continue
			}
			vdi := row.String(dm.VBD.VDI)
			if _, gone := moved[vdi]; gone {
				continue
			}
			if v, ok := r.Get(dm.VDI.Class, vdi); ok && !hostSeesSR(r, dest, v.String(dm.VDI.SR)) {
				return xerr.New(xerr.VMRequiresSR, vm.Ref, v.String(dm.VDI.SR))
			}
		}
		for _, n := range vmNetworks(r, vm) {
			if !hostOnNetwork(r, dest, n) {
				return xerr.New(xerr.VMRequiresNetwork, vm.Ref, n)
			}
		}
	}
	need, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	if metrics, ok := r.Get(dm.HostMetrics.Class, host.String(dm.Host.Metrics)); ok && liveState(vm.String(dm.VM.PowerState)) {
		free, _ := metrics.Get(dm.HostMetrics.MemoryFree).(int64)
		if need > free {
			return xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(free, 0), 10))
		}
	}
	return nil
}

// oldVDIs lists the old VDIs of moves.
func oldVDIs(moves []diskMove) []string {
	out := make([]string, 0, len(moves))
	for _, mv := range moves {
		if !slices.Contains(out, mv.VDI) {
			out = append(out, mv.VDI)
		}
	}
	return out
}

// invokeHere runs a storage call as the internal caller where its route
// says (a call of an internal session on a member would otherwise go
// whole to the coordinator, which may not have the SR plugged): as its
// Async form, waiting for the task. It returns the result's ref, if
// any.
func (m *Manager) invokeHere(ctx context.Context, caller api.Caller, method string, args []any) (string, error) {
	v, err := caller.InvokeArgs(ctx, "Async."+method, args)
	if err != nil {
		return "", err
	}
	task, _ := v.(string)
	defer func() { _, _ = caller.InvokeArgs(context.WithoutCancel(ctx), "task.destroy", []any{task}) }()
	for {
		snap := m.db.Snapshot()
		row, ok := snap.Get(dm.Task.Class, task)
		if !ok {
			return "", xerr.New(xerr.HandleInvalid, "task", task)
		}
		switch row.String(dm.Task.Status) {
		case string(dm.TaskStatusTypeSuccess):
			return refIn.FindString(row.String(dm.Task.Result)), nil
		case string(dm.TaskStatusTypeFailure), string(dm.TaskStatusTypeCancelled):
			info := strs(row.Get(dm.Task.ErrorInfo))
			if len(info) == 0 {
				return "", xerr.New(xerr.InternalError, method+" failed")
			}
			return "", xerr.New(info[0], info[1:]...)
		}
		select {
		case <-snap.Done():
		case <-ctx.Done():
			_, _ = caller.InvokeArgs(context.WithoutCancel(ctx), "task.cancel", []any{task})
			return "", ctx.Err()
		}
	}
}

// refIn finds a ref in a task's result.
var refIn = regexp.MustCompile(`OpaqueRef:[0-9A-Za-z-]+`)
