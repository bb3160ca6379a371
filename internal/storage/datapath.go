package storage

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// Datapaths: how the VM backend gets its disks. A datapath is a named
// reason a VDI is attached on this host ("vbd/<vm uuid>/<vdi uuid>" for a
// VM's disk, "import/<task>" for an upload...). Each moves through the
// state machine of automaton.go; the storage backend follows the VDI's
// superstate, so the first attach attaches the volume and the last detach
// detaches it. The state is kept in DataDir/storage/datapaths.json so
// that a restarted daemon re-attaches what running VMs use.
//
// The VM engineer's view:
//
//	dp := storage.VBDDatapath(vmUUID, vdiUUID)
//	d, err := storage.Attach(ctx, dp, vdiRef, readonly) // d.Kind "file": d.Path in d.Format; "nbd": d.URI
//	err = storage.Activate(ctx, dp, vdiRef)             // before the VM runs
//	storage.SetLiveSnapshotHook(dp, func(ctx, d) error { /* QMP blockdev-snapshot onto d.Path */ })
//	...
//	err = storage.Deactivate(ctx, dp, vdiRef)           // after it stopped
//	err = storage.Detach(ctx, dp, vdiRef)               // or storage.DestroyDatapath(ctx, dp)

// vdiDPs is a VDI's datapaths on this host.
type vdiDPs struct {
	SR    string              `json:"sr"`
	Key   string              `json:"key"`
	DPs   map[string]VDIState `json:"dps"`
	Super VDIState            `json:"super"`
	Path  Datapath            `json:"path"`
}

// VBDDatapath names the datapath of a VM's disk, as xapi does when the VM
// is not running (vbd/<vm uuid>/<vdi uuid>).
func VBDDatapath(vmUUID, vdiUUID string) string { return "vbd/" + vmUUID + "/" + vdiUUID }

// internalDP reports datapaths the storage layer itself opens for
// transfers: a VDI they hold read-write cannot be snapshotted.
// transferDP says whether a datapath is a transfer's: an import, export,
// copy or mirror, which ends on its own and dies with the daemon.
func transferDP(dp string) bool {
	return internalDP(dp) || strings.HasPrefix(dp, "export/")
}

func internalDP(dp string) bool {
	return strings.HasPrefix(dp, "import/") || strings.HasPrefix(dp, "copy/") || strings.HasPrefix(dp, "mirror/")
}

// Attach attaches vdiRef for datapath dp, read-only or read-write.
func (s *Service) Attach(ctx context.Context, dp, vdiRef string, readonly bool) (Datapath, error) {
	m := RW
	if readonly {
		m = RO
	}
	return s.apply(ctx, dp, vdiRef, OpAttach(m))
}

func (s *Service) Activate(ctx context.Context, dp, vdiRef string) error {
	_, err := s.apply(ctx, dp, vdiRef, OpActivate)
	return err
}

func (s *Service) Deactivate(ctx context.Context, dp, vdiRef string) error {
	_, err := s.apply(ctx, dp, vdiRef, OpDeactivate)
	return err
}

func (s *Service) Detach(ctx context.Context, dp, vdiRef string) error {
	_, err := s.apply(ctx, dp, vdiRef, OpDetach)
	if err == nil {
		s.SetLiveSnapshotHook(dp, nil)
	}
	return err
}

// DestroyDatapath deactivates and detaches everything dp holds.
func (s *Service) DestroyDatapath(ctx context.Context, dp string) error {
	s.mu.Lock()
	var vdis []string
	for ref, st := range s.vdis {
		if _, ok := st.DPs[dp]; ok {
			vdis = append(vdis, ref)
		}
	}
	s.mu.Unlock()
	var errs []error
	for _, ref := range vdis {
		if _, err := s.apply(ctx, dp, ref, OpDeactivate); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := s.apply(ctx, dp, ref, OpDetach); err != nil {
			errs = append(errs, err)
		}
	}
	s.SetLiveSnapshotHook(dp, nil)
	return errors.Join(errs...)
}

func (s *Service) SetLiveSnapshotHook(dp string, fn LiveSwitch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fn == nil {
		delete(s.hooks, dp)
	} else {
		s.hooks[dp] = fn
	}
}

// Datapaths lists the datapaths attached on this host: VDI ref -> dp ->
// state.
func (s *Service) Datapaths() map[string]map[string]VDIState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]VDIState{}
	for ref, st := range s.vdis {
		m := map[string]VDIState{}
		for dp, v := range st.DPs {
			m[dp] = v
		}
		out[ref] = m
	}
	return out
}

func (s *Service) attachedDPs(vdiRef string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.vdis[vdiRef]; st != nil {
		return len(st.DPs)
	}
	return 0
}

// writers lists the datapaths holding a VDI read-write.
func (s *Service) writers(vdiRef string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	if st := s.vdis[vdiRef]; st != nil {
		for dp, v := range st.DPs {
			if v.Attached && v.Mode == RW {
				out = append(out, dp)
			}
		}
	}
	sort.Strings(out)
	return out
}

// liveSwitch returns what a snapshot or clone of a VDI must call so that
// its running writers follow, or an error when a writer cannot.
func (s *Service) liveSwitch(vdiRef, op string) (LiveSwitch, error) {
	ws := s.writers(vdiRef)
	var hooks []LiveSwitch
	for _, dp := range ws {
		if internalDP(dp) {
			return nil, xerr.New(xerr.VDIInUse, vdiRef, op)
		}
		s.mu.Lock()
		h := s.hooks[dp]
		s.mu.Unlock()
		if h != nil {
			hooks = append(hooks, h)
		} else {
			s.log.Warn("VDI "+op+" while a datapath holds it read-write without a live-snapshot hook: consistent only if nothing writes it now",
				"vdi", vdiRef, "dp", dp)
		}
	}
	if len(hooks) == 0 {
		return nil, nil
	}
	return func(ctx context.Context, d Datapath) error {
		for _, h := range hooks {
			if err := h(ctx, d); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// apply runs one datapath operation: the dp's state moves, and the
// backend follows the VDI's superstate.
func (s *Service) apply(ctx context.Context, dp, vdiRef string, op VDIOp) (Datapath, error) {
	if dp == "" {
		return Datapath{}, xerr.New(xerr.InvalidValue, "dp", dp)
	}
	unlock := s.lock("vdi:" + vdiRef)
	defer unlock()
	row, ok := s.db.Snapshot().Get(dm.VDI.Class, vdiRef)
	if !ok {
		return Datapath{}, xerr.New(xerr.HandleInvalid, "VDI", vdiRef)
	}
	srRef := row.String(dm.VDI.SR)
	st := s.datapathsOf(vdiRef, srRef, row.String(dm.VDI.Location))

	if op.Kind == "attach" && op.Mode == RW && boolField(row, dm.VDI.ReadOnly) {
		return Datapath{}, xerr.New(xerr.VDIReadonly, vdiRef)
	}
	old := st.DPs[dp]
	next, err := Transition(old, op)
	if err != nil {
		return Datapath{}, xerr.New(xerr.OperationNotAllowed, err.Error())
	}
	if next == old && op.Kind != "attach" {
		return st.Path, nil
	}
	oldSuper := st.Super
	if next.Attached {
		st.DPs[dp] = next
	} else {
		delete(st.DPs, dp)
	}
	states := make([]VDIState, 0, len(st.DPs))
	for _, v := range st.DPs {
		states = append(states, v)
	}
	super := Superstate(states)

	b := s.boundSR(srRef)
	if b == nil && (op.Kind == "attach" || op.Kind == "activate") {
		// Letting go works without the SR; taking hold needs it.
		if _, err := s.attached(srRef); err != nil {
			return Datapath{}, err
		}
	}
	if b != nil {
		if err := s.followSuperstate(ctx, b.sr, &st, vdiRef, dp, oldSuper, super); err != nil {
			return Datapath{}, err
		}
	}
	st.Super = super
	s.mu.Lock()
	if len(st.DPs) == 0 {
		delete(s.vdis, vdiRef)
	} else {
		s.vdis[vdiRef] = &st
	}
	s.mu.Unlock()
	s.saveDatapaths()
	s.recordAttachment(vdiRef, super)
	if !super.Attached && oldSuper.Attached && b != nil {
		s.refreshVolume(ctx, vdiRef)
	}
	p := st.Path
	p.DP, p.VDI, p.SR = dp, vdiRef, srRef
	if next.Attached {
		p.ReadOnly = next.Mode == RO
	}
	return p, nil
}

// datapathsOf is a copy of a VDI's datapath state, to change and store
// back, or a fresh one for a VDI no datapath holds.
func (s *Service) datapathsOf(vdiRef, srRef, key string) vdiDPs {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.vdis[vdiRef]
	if cur == nil {
		return vdiDPs{SR: srRef, Key: key, DPs: map[string]VDIState{}}
	}
	st := *cur
	st.DPs = maps.Clone(cur.DPs)
	if st.DPs == nil {
		st.DPs = map[string]VDIState{}
	}
	return st
}

// followSuperstate makes the SR's volume follow the VDI's superstate
// from oldSuper to super: attach (or re-attach read-write), activate,
// deactivate, detach. A new attachment is in st.Path.
func (s *Service) followSuperstate(ctx context.Context, sr SR, st *vdiDPs, vdiRef, dp string, oldSuper, super VDIState) error {
	key := st.Key
	switch {
	case super.Attached && !oldSuper.Attached:
		p, err := sr.VolumeAttach(ctx, key, super.Mode == RO)
		if err != nil {
			return asBackend(err, smVDIUnavailable)
		}
		st.Path = p
	case super.Attached && oldSuper.Mode == RO && super.Mode == RW:
		if st.Path.Kind != "file" {
			return xerr.New(xerr.VDIInUse, vdiRef, "attached read-only by "+strings.Join(keysOf(st.DPs, dp), ", "))
		}
		p, err := sr.VolumeAttach(ctx, key, false)
		if err != nil {
			return asBackend(err, smVDIUnavailable)
		}
		st.Path = p
	}
	if super.Activated && !oldSuper.Activated {
		if err := sr.VolumeActivate(ctx, key, super.Mode == RO); err != nil {
			if !oldSuper.Attached {
				_ = sr.VolumeDetach(ctx, key)
			}
			return asBackend(err, smVDIUnavailable)
		}
	}
	if !super.Activated && oldSuper.Activated {
		if err := sr.VolumeDeactivate(ctx, key); err != nil {
			return asBackend(err, smVDIUnavailable)
		}
	}
	if !super.Attached && oldSuper.Attached {
		if err := sr.VolumeDetach(ctx, key); err != nil {
			return asBackend(err, smVDIUnavailable)
		}
	}
	return nil
}

// recordAttachment mirrors a VDI's superstate into its sm_config
// (host_<host>: RO or RW). The datapath state is what counts; the record
// only mirrors it, so a failure to update it is logged rather than
// reported as a failed attach or detach.
func (s *Service) recordAttachment(vdiRef string, super VDIState) {
	if _, err := s.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VDI.Class, vdiRef); !ok {
			return nil
		}
		k := "host_" + s.host
		was := mapField(mustGet(tx, dm.VDI.Class, vdiRef), dm.VDI.SMConfig)
		m := orEmpty(was)
		if super.Attached {
			m[k] = super.Mode.String()
		} else {
			delete(m, k)
		}
		if !maps.Equal(m, was) {
			if err := tx.Set(dm.VDI.SMConfig, vdiRef, m); err != nil {
				return err
			}
		}
		return s.refreshVDI(tx, vdiRef)
	}); err != nil {
		s.log.Error("cannot record a VDI's attachment in sm_config", "vdi", vdiRef, "err", err)
	}
}

func keysOf(m map[string]VDIState, except string) []string {
	var out []string
	for k := range m {
		if k != except {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// refreshVolume updates a VDI's sizes from its driver.
func (s *Service) refreshVolume(ctx context.Context, vdiRef string) {
	row, ok := s.db.Snapshot().Get(dm.VDI.Class, vdiRef)
	if !ok {
		return
	}
	b := s.boundSR(row.String(dm.VDI.SR))
	if b == nil {
		return
	}
	v, err := b.sr.VolumeStat(ctx, row.String(dm.VDI.Location))
	if err != nil {
		return
	}
	// Best effort, as the stat above: the next scan records the sizes.
	if _, err := s.db.Update(func(tx *db.Tx) error { return s.applyVolume(tx, vdiRef, v) }); err != nil {
		s.log.Warn("cannot record VDI sizes", "vdi", vdiRef, "err", err)
	}
}

func (s *Service) dpFile() string {
	if s.cfg.DataDir == "" {
		return ""
	}
	return filepath.Join(s.cfg.DataDir, "storage", "datapaths.json")
}

func (s *Service) saveDatapaths() {
	path := s.dpFile()
	if path == "" {
		return
	}
	s.mu.Lock()
	b, err := json.MarshalIndent(s.vdis, "", " ")
	s.mu.Unlock()
	if err != nil {
		return
	}
	_ = os.MkdirAll(filepath.Dir(path), 0o700) // writeFileAtomic reports a failure
	if err := writeFileAtomic(path, b); err != nil {
		s.log.Error("saving datapath state", "err", err)
	}
}

// restoreDatapaths re-attaches, after a restart, what was attached.
func (s *Service) restoreDatapaths(ctx context.Context) {
	path := s.dpFile()
	if path == "" {
		return
	}
	b, err := os.ReadFile(path) //nolint:gosec // DataDir/storage/datapaths.json: operator's dir, fixed name
	if err != nil {
		return
	}
	var saved map[string]*vdiDPs
	if err := json.Unmarshal(b, &saved); err != nil {
		s.log.Error("datapath state unreadable; starting with none", "err", err)
		return
	}
	for vdiRef, st := range saved {
		if st == nil {
			continue
		}
		for dp, v := range st.DPs {
			if transferDP(dp) {
				continue // transfers die with the daemon
			}
			if _, err := s.apply(ctx, dp, vdiRef, OpAttach(v.Mode)); err != nil {
				s.log.Warn("re-attaching a datapath", "dp", dp, "vdi", vdiRef, "err", err)
				continue
			}
			if v.Activated {
				if _, err := s.apply(ctx, dp, vdiRef, OpActivate); err != nil {
					s.log.Warn("re-activating a datapath", "dp", dp, "vdi", vdiRef, "err", err)
				}
			}
		}
	}
	s.saveDatapaths()
}
