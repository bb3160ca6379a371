package xenops

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
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
}

// crossDisk is one disk of an arriving VM: its VBD and the VDI to create
// for it on this pool's SR (the VDI map's "SR" field).
type crossDisk struct {
	VBD    map[string]string `json:"vbd"`
	VDI    map[string]string `json:"vdi"`
	Source string            `json:"source"` // the source's VBD, echoed in ready
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
	case h.Power != psRunning && h.Power != psPaused && h.Power != psHalted:
		return xerr.New(xerr.VMBadPowerState, h.VM, powerName(psRunning), powerName(h.Power))
	}
	if _, ok := m.db.Snapshot().ByUUID(dm.VM.Class, h.UUID); ok {
		return xerr.New(xerr.OperationNotAllowed, "a VM with uuid "+h.UUID+" exists in this pool already")
	}
	if _, ok := m.be.Info(h.UUID); ok {
		return xerr.New(xerr.InternalError, "the VM already has a domain on the destination")
	}
	if h.Power == psHalted {
		if _, ok := m.disks.(DiskMover); !ok && len(h.Import.Disks) > 0 {
			return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "this host's storage cannot receive copies")
		}
		return nil
	}
	if _, ok := m.be.(backend.Migrator); !ok {
		return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "the "+m.be.Name()+" backend cannot receive a migration")
	}
	if _, ok := m.be.(backend.DiskExporter); !ok && len(h.Import.Disks) > 0 {
		return xerr.New(xerr.VMMigrateFailed, h.VM, "", m.host, "the "+m.be.Name()+" backend cannot receive disks")
	}
	return nil
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
	vm   string
	vdis []string
	vbds []string // in the order of the header's disks
	vifs []string
}

// importCross creates the arriving VM's records as the caller: the VM
// (halted, with the source's uuid, marked migrate_send), a VDI per disk
// on its SR, the VBDs and the VIFs. made is filled as it goes (undo).
func (m *Manager) importCross(ctx context.Context, caller api.Caller, h crossHeader, made *crossMade) error {
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
		return tx.Set(dm.VM.CurrentOperations, made.vm, map[string]string{"migrate-in:" + h.Source[:8]: string(dm.VMOperationsMigrateSend)})
	}); err != nil {
		return err
	}
	for _, d := range h.Import.Disks {
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
		rec, err = crossRecord(dm.VBD.Class, d.VBD, map[string]any{"VM": made.vm, "VDI": ref, "empty": false})
		if err != nil {
			return err
		}
		v, err := caller.InvokeArgs(ctx, "VBD.create", []any{rec})
		if err != nil {
			return err
		}
		vbd, _ := v.(string)
		made.vbds = append(made.vbds, vbd)
	}
	for _, n := range h.Import.NICs {
		rec, err := crossRecord(dm.VIF.Class, n, map[string]any{"VM": made.vm, "network": n["network"]})
		if err != nil {
			return err
		}
		v, err := caller.InvokeArgs(ctx, "VIF.create", []any{rec})
		if err != nil {
			return err
		}
		vif, _ := v.(string)
		made.vifs = append(made.vifs, vif)
	}
	// The plan reads this host's replica: wait for the records there.
	deadline := time.NewTimer(storageReadyTimeout)
	defer deadline.Stop()
	for {
		snap := m.db.Snapshot()
		row, ok := snap.Get(dm.VM.Class, made.vm)
		if ok && len(strs(snap.Value(row, dm.VM.VBDs))) == len(made.vbds) && len(strs(snap.Value(row, dm.VM.VIFs))) == len(made.vifs) {
			return nil
		}
		select {
		case <-snap.Done():
		case <-deadline.C:
			return xerr.New(xerr.InternalError, "the imported VM did not reach this host's replica")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
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
	for _, vbd := range made.vbds {
		if _, err := caller.InvokeArgs(bg, "VBD.destroy", []any{vbd}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Warn("cannot destroy an arriving VM's VBD", "vbd", vbd, "err", err)
		}
	}
	for _, vif := range made.vifs {
		if _, err := caller.InvokeArgs(bg, "VIF.destroy", []any{vif}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Warn("cannot destroy an arriving VM's VIF", "vif", vif, "err", err)
		}
	}
	if made.vm != "" {
		if _, err := caller.InvokeArgs(bg, "VM.destroy", []any{made.vm}); err != nil && !xerr.HasCode(err, xerr.HandleInvalid) {
			m.log.Error("cannot destroy an arriving VM", "vm", made.vm, "err", err)
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
		if hh.Power == psHalted {
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
	moves := make([]diskMove, len(made.vbds))
	for i := range made.vbds {
		moves[i] = diskMove{VBD: made.vbds[i], VDI: made.vdis[i], New: made.vdis[i]}
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
	if err := m.buildDomain(o, p, &bm); err != nil {
		return fail(err)
	}
	exports := &incomingExports{m: m, uuid: h.UUID}
	defer exports.close(ctx)
	if err := exports.exportMirrors(ctx, h, p, moves); err != nil {
		return fail(err)
	}
	if err := mc.send(crossReply{migrateMsg: migrateMsg{Step: stepReady, Disks: moves}, NewVM: h.VM}, migrateMsgTimeout); err != nil {
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

// crossInCopies is crossIn's part for a halted VM: each new VDI served
// for the source's copy; on go the VM is kept, halted.
func (m *Manager) crossInCopies(ctx context.Context, mc *migConn, h migrateHeader, made crossMade) error {
	fail := func(err error) error {
		_ = mc.send(failedMsg(err), time.Second)
		return err
	}
	moves := make([]diskMove, len(made.vbds))
	for i := range made.vbds {
		moves[i] = diskMove{VBD: made.vbds[i], VDI: made.vdis[i], New: made.vdis[i], Copy: true}
	}
	exports, err := m.exportCopies(ctx, h, moves)
	if err != nil {
		return fail(err)
	}
	defer exports.close(ctx)
	if err := mc.send(crossReply{migrateMsg: migrateMsg{Step: stepReady, Disks: moves}, NewVM: h.VM}, migrateMsgTimeout); err != nil {
		return err
	}
	// The copies take as long as they take: a source that fails breaks
	// the stream.
	if _, err := mc.recvMsg(stepGo, 0); err != nil {
		return err
	}
	exports.close(ctx)
	if _, err := m.db.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.CurrentOperations, h.VM, map[string]string{})
	}); err != nil {
		return fail(err)
	}
	_ = mc.send(migrateMsg{Step: stepDone}, migrateMsgTimeout)
	m.log.Info("halted VM arrived from another pool", "vm", h.UUID, "disks", len(moves))
	return nil
}
