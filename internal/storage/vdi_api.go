package storage

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// vdiContext resolves a VDI argument to its row, its SR's row and the
// SR's mux entry.
func (s *Service) vdiContext(c *api.Call, ref string) (*db.Row, *db.Row, *boundSR, error) {
	vdi, err := c.Lookup(dm.VDI.Class, ref)
	if err != nil {
		return nil, nil, nil, err
	}
	sr, ok := s.db.Snapshot().Get(dm.SR.Class, vdi.String(dm.VDI.SR))
	if !ok {
		return nil, nil, nil, xerr.New(xerr.HandleInvalid, "SR", vdi.String(dm.VDI.SR))
	}
	b, err := s.attached(sr.Ref)
	if err != nil {
		return vdi, sr, nil, err
	}
	return vdi, sr, b, nil
}

func (s *Service) requireCap(b *boundSR, srRef, cap string) error {
	if !b.driver.Info().Has(cap) {
		return xerr.New(xerr.SROperationNotSupported, srRef)
	}
	return nil
}

// checkSpace fails with SR_FULL when need bytes are more than the SR's
// free space (its physical size when it allows overprovisioning).
func (s *Service) checkSpace(ctx context.Context, b *boundSR, sr *db.Row, need int64) error {
	if need <= 0 {
		return nil
	}
	st, err := b.sr.Stat(ctx)
	if err != nil {
		return asBackend(err, smSRUnavailable)
	}
	limit := st.FreeSpace
	if overprovision(sr) {
		limit = st.PhysicalSize
	}
	if need > limit {
		return xerr.New(xerr.SRFull, strconv.FormatInt(need, 10), strconv.FormatInt(limit, 10))
	}
	return nil
}

func recString(rec map[string]any, k string) string { v, _ := rec[k].(string); return v }
func recBool(rec map[string]any, k string) bool     { v, _ := rec[k].(bool); return v }
func recMap(rec map[string]any, k string) map[string]string {
	v, _ := rec[k].(map[string]string)
	return orEmpty(v)
}

// handleVDICreate: VDI.create({SR, virtual_size, name_label, type, ...})
// makes a thin volume.
func (s *Service) handleVDICreate(c *api.Call) (any, error) {
	rec, _ := c.Args[0].(map[string]any)
	srRef := recString(rec, "SR")
	sr, ok := s.db.Snapshot().Get(dm.SR.Class, srRef)
	if !ok {
		return nil, xerr.New(xerr.HandleInvalid, "SR", srRef)
	}
	size, _ := rec["virtual_size"].(int64)
	if size < 0 {
		return nil, xerr.New(xerr.InvalidValue, "virtual_size", strconv.FormatInt(size, 10))
	}
	if size > imageformat.MaxVirtualSize {
		return nil, BackendError(smVDISize, "virtual size "+strconv.FormatInt(size, 10)+" is over the maximum "+strconv.FormatInt(imageformat.MaxVirtualSize, 10))
	}
	typ := recString(rec, "type")
	if typ == "" {
		typ = "user"
	}
	b, err := s.attached(srRef)
	if err != nil {
		return nil, err
	}
	if err := s.requireCap(b, srRef, "VDI_CREATE"); err != nil {
		return nil, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, srRef, "vdi_create"})
	if err != nil {
		return nil, err
	}
	defer done()
	if err := s.checkSpace(c.Ctx, b, sr, size); err != nil {
		return nil, err
	}
	name, desc := recString(rec, "name_label"), recString(rec, "name_description")
	id := newUUID()
	spec := VolumeSpec{UUID: id, Name: name, Description: desc, Size: size, Sharable: recBool(rec, "sharable"), Type: typ,
		ReadOnly: recBool(rec, "read_only"), Time: time.Now().UTC()}
	s.setInflight(srRef, id, true)
	defer s.setInflight(srRef, id, false)
	v, err := b.sr.VolumeCreate(c.Ctx, spec)
	if err != nil {
		return nil, asBackend(err, smVDICreate)
	}
	s.setInflight(srRef, v.Key, true)
	defer s.setInflight(srRef, v.Key, false)
	tags, _ := rec["tags"].([]string)
	var ref string
	_, err = s.db.Update(func(tx *db.Tx) (err error) {
		ref, err = s.insertVDI(tx, srRef, v, vdiExtra{uuid: id, name: &name, desc: &desc, typ: typ, sharable: spec.Sharable,
			readOnly: spec.ReadOnly, otherConfig: recMap(rec, "other_config"), xenstoreData: recMap(rec, "xenstore_data"),
			smConfig: recMap(rec, "sm_config"), tags: tags})
		return err
	})
	if err != nil {
		_ = b.sr.VolumeDestroy(context.Background(), v.Key)
		return nil, err
	}
	s.updateSRStats(c.Ctx, srRef)
	return ref, nil
}

func (s *Service) handleVDIDestroy(c *api.Call) (any, error) {
	vdi, sr, b, err := s.vdiContext(c, c.String(0))
	if err != nil {
		return nil, err
	}
	if err := s.requireCap(b, sr.Ref, "VDI_DELETE"); err != nil {
		return nil, err
	}
	release, err := s.holdIdleVDI(c, vdi.Ref, sr.Ref, "destroy")
	if err != nil {
		return nil, err
	}
	defer release()
	key := vdi.String(dm.VDI.Location)
	if err := b.sr.VolumeDestroy(c.Ctx, key); err != nil && !xerr.HasCode(err, xerr.SRBackendFailure+"_"+strconv.Itoa(smVDIMissing)) {
		return nil, asBackend(err, smVDIRemove)
	}
	_, err = s.db.Update(func(tx *db.Tx) error {
		if err := s.dropVDIRecord(tx, vdi.Ref); err != nil {
			return err
		}
		return s.refreshSR(tx, sr.Ref)
	})
	s.updateSRStats(c.Ctx, sr.Ref)
	return nil, err
}

// branch serves VDI.snapshot and VDI.clone: a new VDI with the content
// this one has now, made by the driver in constant time.
func (s *Service) branch(c *api.Call, vdiRef dm.VDIRef, op string) (dm.VDIRef, error) {
	vdi, sr, b, err := s.vdiContext(c, string(vdiRef))
	if err != nil {
		return "", err
	}
	cap, srOp := "VDI_CLONE", "vdi_clone"
	if op == "snapshot" {
		cap, srOp = "VDI_SNAPSHOT", "vdi_snapshot"
	}
	if err := s.requireCap(b, sr.Ref, cap); err != nil {
		return "", err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.VDI.Class, vdi.Ref, op}, marked{dm.SR.Class, sr.Ref, srOp})
	if err != nil {
		return "", err
	}
	defer done()
	unlock := s.lock("vdi:" + vdi.Ref)
	defer unlock()
	live, err := s.liveSwitch(vdi.Ref, op)
	if err != nil {
		return "", err
	}
	now := time.Now().UTC()
	name, desc := vdi.String(dm.VDI.NameLabel), vdi.String(dm.VDI.NameDescription)
	id := newUUID()
	spec := VolumeSpec{UUID: id, Name: name, Description: desc, Size: vdiSize(vdi), Sharable: boolField(vdi, dm.VDI.Sharable),
		Type: vdi.String(dm.VDI.Type), IsSnapshot: op == "snapshot", Time: now}
	s.setInflight(sr.Ref, id, true)
	defer s.setInflight(sr.Ref, id, false)
	key := vdi.String(dm.VDI.Location)
	var v Volume
	if op == "snapshot" {
		v, err = b.sr.VolumeSnapshot(c.Ctx, key, spec, live)
	} else {
		v, err = b.sr.VolumeClone(c.Ctx, key, spec, live)
	}
	if err != nil {
		code := smVDIClone
		if op == "snapshot" {
			code = smVDISnapshot
		}
		return "", asBackend(err, code)
	}
	s.setInflight(sr.Ref, v.Key, true)
	defer s.setInflight(sr.Ref, v.Key, false)
	smc := orEmpty(mapField(vdi, dm.VDI.SMConfig))
	for k := range smc {
		if strings.HasPrefix(k, "host_") {
			delete(smc, k)
		}
	}
	x := vdiExtra{uuid: id, name: &name, desc: &desc, typ: vdi.String(dm.VDI.Type), sharable: spec.Sharable,
		otherConfig: mapField(vdi, dm.VDI.OtherConfig), xenstoreData: mapField(vdi, dm.VDI.XenstoreData), smConfig: smc}
	if op == "snapshot" {
		x.isSnapshot, x.snapshotOf, x.snapshotTime = true, vdi.Ref, now
		tags, _ := vdi.Get(dm.VDI.Tags).([]string)
		x.tags = tags
	} else {
		x.onBoot = vdi.String(dm.VDI.OnBoot)
		if x.onBoot == "reset" {
			x.onBoot = ""
		}
	}
	var ref string
	_, err = s.db.Update(func(tx *db.Tx) (err error) {
		ref, err = s.insertVDI(tx, sr.Ref, v, x)
		return err
	})
	if err != nil {
		_ = b.sr.VolumeDestroy(context.Background(), v.Key)
		return "", err
	}
	s.refreshVolume(c.Ctx, vdi.Ref)
	s.updateSRStats(c.Ctx, sr.Ref)
	return dm.VDIRef(ref), nil
}

func vdiSize(r *db.Row) int64 { n, _ := r.Get(dm.VDI.VirtualSize).(int64); return n }

// handleVDIResize: VDI.resize(vdi, size). Disks only grow; an attached
// disk is resized by the VM (resize_online).
func (s *Service) handleVDIResize(c *api.Call, a dm.VDIResizeArgs) (dm.Void, error) {
	vdi, sr, b, err := s.vdiContext(c, string(a.VDI))
	if err != nil {
		return dm.Void{}, err
	}
	if err := s.requireCap(b, sr.Ref, "VDI_RESIZE"); err != nil {
		return dm.Void{}, err
	}
	size := a.Size
	cur := vdiSize(vdi)
	if size < cur {
		return dm.Void{}, xerr.New(xerr.VDITooSmall, vdi.Ref, strconv.FormatInt(cur, 10))
	}
	if size > imageformat.MaxVirtualSize {
		return dm.Void{}, xerr.New(xerr.VDITooLarge, vdi.Ref, strconv.FormatInt(imageformat.MaxVirtualSize, 10))
	}
	release, err := s.holdIdleVDI(c, vdi.Ref, sr.Ref, "resize")
	if err != nil {
		return dm.Void{}, err
	}
	defer release()
	if size == cur {
		return dm.Void{}, nil
	}
	if err := s.checkSpace(c.Ctx, b, sr, size-cur); err != nil {
		return dm.Void{}, err
	}
	v, err := b.sr.VolumeResize(c.Ctx, vdi.String(dm.VDI.Location), size)
	if err != nil {
		return dm.Void{}, asBackend(err, smVDIResize)
	}
	_, err = s.db.Update(func(tx *db.Tx) error { return s.applyVolume(tx, vdi.Ref, v) })
	s.updateSRStats(c.Ctx, sr.Ref)
	return dm.Void{}, err
}

// handleVDIIntroduce: VDI.introduce(uuid, name_label, name_description, SR,
// type, sharable, read_only, other_config, location, xenstore_data,
// sm_config, managed, virtual_size, physical_utilisation,
// metadata_of_pool, is_a_snapshot, snapshot_time, snapshot_of).
func (s *Service) handleVDIIntroduce(c *api.Call, a dm.VDIIntroduceArgs) (dm.VDIRef, error) {
	id := a.UUID
	sr, err := c.Lookup(dm.SR.Class, string(a.SR))
	if err != nil {
		return "", err
	}
	b, err := s.attached(sr.Ref)
	if err != nil {
		return "", err
	}
	loc := a.Location
	if loc == "" {
		return "", xerr.New(xerr.VDILocationMissing, sr.Ref, loc)
	}
	if id != "" && !isUUID(id) {
		return "", xerr.New(xerr.UUIDInvalid, "VDI", id)
	}
	// A location is a volume key, relative to its SR: nothing absolute
	// or climbing with "..".
	if checkVolumeKey(loc) != nil {
		return "", xerr.New(xerr.VDILocationMissing, sr.Ref, clip(loc, 200))
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.SR.Class, sr.Ref, "vdi_introduce"})
	if err != nil {
		return "", err
	}
	defer done()
	var v Volume
	if in, ok := b.sr.(Introducer); ok {
		v, err = in.VolumeIntroduce(c.Ctx, loc)
	} else {
		v, err = b.sr.VolumeStat(c.Ctx, loc)
	}
	if err != nil {
		if xerr.HasCode(err, xerr.TaskCancelled) {
			return "", err
		}
		return "", xerr.New(xerr.VDILocationMissing, sr.Ref, loc)
	}
	name, desc := a.NameLabel, a.NameDescription
	managed := true
	if c.Given("managed") {
		managed = a.Managed
	}
	x := vdiExtra{uuid: id, name: &name, desc: &desc, typ: string(a.Type), sharable: a.Sharable, readOnly: a.ReadOnly,
		otherConfig: orEmpty(a.OtherConfig), xenstoreData: orEmpty(a.XenstoreData), smConfig: orEmpty(a.SMConfig), managed: &managed, isSnapshot: a.IsASnapshot,
		snapshotTime: a.SnapshotTime}
	if r := string(a.SnapshotOf); r != "" && r != schema.NullRef {
		x.snapshotOf = r
	}
	var ref string
	err = c.Update(func(tx *db.Tx) (err error) {
		for _, other := range vdisOf(tx, sr.Ref) {
			if other.String(dm.VDI.Location) == loc {
				return xerr.New(xerr.LocationNotUnique, sr.Ref, loc)
			}
		}
		if id != "" {
			if _, taken := tx.ByUUID(dm.VDI.Class, id); taken {
				return xerr.New(xerr.UUIDInvalid, "VDI", id)
			}
		}
		ref, err = s.insertVDI(tx, sr.Ref, v, x)
		return err
	})
	return dm.VDIRef(ref), err
}

func (s *Service) handleVDIForget(c *api.Call, a dm.VDIForgetArgs) (dm.Void, error) {
	vdi, err := c.Lookup(dm.VDI.Class, string(a.VDI))
	if err != nil {
		return dm.Void{}, err
	}
	srRef := vdi.String(dm.VDI.SR)
	objs := []marked{{dm.VDI.Class, vdi.Ref, "forget"}}
	if _, ok := s.db.Snapshot().Get(dm.SR.Class, srRef); ok {
		objs = append(objs, marked{dm.SR.Class, srRef, "vdi_forget"})
	}
	done, err := s.mark(c.Ctx, opKey(c), objs...)
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	if s.vdiBusy(s.db.Snapshot(), vdi.Ref) {
		return dm.Void{}, xerr.New(xerr.VDIInUse, vdi.Ref, "forget")
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return tx.Delete(dm.VDI.Class, vdi.Ref) })
}

func (s *Service) handleVDIUpdate(c *api.Call, a dm.VDIUpdateArgs) (dm.Void, error) {
	vdi, sr, b, err := s.vdiContext(c, string(a.VDI))
	if err != nil {
		return dm.Void{}, err
	}
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.VDI.Class, vdi.Ref, "update"}, marked{dm.SR.Class, sr.Ref, "vdi_update"})
	if err != nil {
		return dm.Void{}, err
	}
	defer done()
	v, err := b.sr.VolumeStat(c.Ctx, vdi.String(dm.VDI.Location))
	if err != nil {
		return dm.Void{}, asBackend(err, smVDIUnavailable)
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return s.applyVolume(tx, vdi.Ref, v) })
}

// handleVDISetOnBoot: VDI.set_on_boot(vdi, persist|reset).
func (s *Service) handleVDISetOnBoot(c *api.Call, a dm.VDISetOnBootArgs) (dm.Void, error) {
	vdi, sr, b, err := s.vdiContext(c, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	value := string(a.Value)
	if value != "persist" && value != "reset" {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "on_boot", value)
	}
	if value == vdi.String(dm.VDI.OnBoot) {
		return dm.Void{}, nil
	}
	rs, ok := b.sr.(Resetter)
	if !ok || !b.driver.Info().Has("VDI_RESET_ON_BOOT") {
		return dm.Void{}, xerr.New(xerr.SROperationNotSupported, sr.Ref)
	}
	release, err := s.holdIdleVDI(c, vdi.Ref, sr.Ref, "set_on_boot")
	if err != nil {
		return dm.Void{}, err
	}
	defer release()
	if err := rs.SetResetOnBoot(c.Ctx, vdi.String(dm.VDI.Location), value == "reset"); err != nil {
		return dm.Void{}, asBackend(err, smGeneral)
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return tx.Set(dm.VDI.OnBoot, vdi.Ref, value) })
}

func (s *Service) handleVDISetAllowCaching(c *api.Call, a dm.VDISetAllowCachingArgs) (dm.Void, error) {
	vdi, err := c.Lookup(dm.VDI.Class, string(a.Self))
	if err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return tx.Set(dm.VDI.AllowCaching, vdi.Ref, a.Value) })
}

// handleVDISetName keeps the driver's copy of a VDI's name in step.
func (s *Service) handleVDISetName(c *api.Call, ref dm.VDIRef, f *schema.Field, value string) (dm.Void, error) {
	vdi, err := s.setName(c, dm.VDI.Class, string(ref), f, value)
	if err != nil {
		return dm.Void{}, err
	}
	if b := s.boundSR(vdi.String(dm.VDI.SR)); b != nil {
		if err := b.sr.VolumeSetName(c.Ctx, vdi.String(dm.VDI.Location), vdi.String(dm.VDI.NameLabel), vdi.String(dm.VDI.NameDescription)); err != nil {
			s.log.Debug("recording VDI name with its storage", "vdi", vdi.UUID(), "err", err)
		}
	}
	return dm.Void{}, nil
}

// holdIdleVDI readies a VDI for an operation that needs it idle: the VDI
// is marked with op and its SR with vdi_<op>, the VDI's lock is taken,
// and no datapath of this host or plugged VBD may hold it (VDI_IN_USE).
// release gives the lock and the marks back.
func (s *Service) holdIdleVDI(c *api.Call, vdiRef, srRef, op string) (release func(), err error) {
	done, err := s.mark(c.Ctx, opKey(c), marked{dm.VDI.Class, vdiRef, op}, marked{dm.SR.Class, srRef, "vdi_" + op})
	if err != nil {
		return nil, err
	}
	unlock := s.lock("vdi:" + vdiRef)
	// A transfer's datapath goes just after its last byte: a client that
	// acts on the VDI as soon as it has that byte (XO destroys a snapshot
	// right after exporting it) waits for it, and is refused only if a
	// transfer still holds the VDI after transferSettle.
	settle := time.Now().Add(transferSettle)
	for s.vdiBusy(s.db.Snapshot(), vdiRef) {
		if !s.onlyTransfers(vdiRef) || time.Now().After(settle) || c.Ctx.Err() != nil {
			unlock()
			done()
			return nil, xerr.New(xerr.VDIInUse, vdiRef, op)
		}
		unlock()
		time.Sleep(10 * time.Millisecond)
		unlock = s.lock("vdi:" + vdiRef)
	}
	return func() { unlock(); done() }, nil
}

// transferSettle bounds how long an operation that needs a VDI idle
// waits for transfers that hold it to end.
const transferSettle = 5 * time.Second

// onlyTransfers says whether every datapath holding a VDI is a transfer's
// (an export, import, copy or mirror) and no VBD of it is
// attached: a hold that ends on its own.
func (s *Service) onlyTransfers(vdiRef string) bool {
	for _, vbd := range vbdsOf(s.db.Snapshot(), vdiRef) {
		if boolField(vbd, dm.VBD.CurrentlyAttached) {
			return false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.vdis[vdiRef]
	if st == nil {
		return true
	}
	for dp := range st.DPs {
		if !transferDP(dp) {
			return false
		}
	}
	return true
}

// handleVDICopy: VDI.copy(vdi, sr, base_vdi, into_vdi) copies a VDI's
// content into a new VDI on sr, or into an existing VDI (into_vdi). The
// copy is sparse: zero runs are not written. base_vdi is accepted and
// ignored (the whole content is copied, which is always correct).
func (s *Service) handleVDICopy(c *api.Call, a dm.VDICopyArgs) (dm.VDIRef, error) {
	src, _, _, err := s.vdiContext(c, string(a.VDI))
	if err != nil {
		return "", err
	}
	snap := s.db.Snapshot()
	into := string(a.IntoVDI)
	var dstRow, dstSR *db.Row
	var dstB *boundSR
	if into != "" && into != schema.NullRef {
		if dstRow, dstSR, dstB, err = s.vdiContext(c, into); err != nil {
			return "", err
		}
		if vdiSize(dstRow) < vdiSize(src) {
			return "", xerr.New(xerr.VDITooSmall, dstRow.Ref, strconv.FormatInt(vdiSize(src), 10))
		}
		if boolField(dstRow, dm.VDI.ReadOnly) {
			return "", xerr.New(xerr.VDIReadonly, dstRow.Ref)
		}
	} else {
		srRef := string(a.SR)
		var ok bool
		if dstSR, ok = snap.Get(dm.SR.Class, srRef); !ok {
			return "", xerr.New(xerr.HandleInvalid, "SR", srRef)
		}
		if dstB, err = s.attached(srRef); err != nil {
			return "", err
		}
		if err := s.requireCap(dstB, srRef, "VDI_CREATE"); err != nil {
			return "", err
		}
	}
	key := opKey(c)
	objs := []marked{{dm.VDI.Class, src.Ref, "copy"}, {dm.SR.Class, dstSR.Ref, "vdi_copy"}}
	if dstRow != nil {
		objs = append(objs, marked{dm.VDI.Class, dstRow.Ref, "copy"})
	}
	done, err := s.mark(c.Ctx, key, objs...)
	if err != nil {
		return "", err
	}
	defer done()
	ctx := c.Ctx
	srcDP := "copy/" + key + "/src"
	sdev, sdone, err := s.transferDP(ctx, srcDP, src.Ref, false)
	if err != nil {
		return "", err
	}
	defer sdone()
	_, need := sdev.dataExtents()
	// The disk reserve (see spaceGuard): the amount is known up front.
	if l, ok := dstB.sr.(localDirer); ok {
		if err := s.guardFor(l.localDir()).check(need); err != nil {
			return "", err
		}
	}
	fresh := dstRow == nil
	if fresh {
		if err := s.checkSpace(ctx, dstB, dstSR, need); err != nil {
			return "", err
		}
		ref, err := s.newVDILike(ctx, dstB, dstSR.Ref, src)
		if err != nil {
			return "", err
		}
		dstRow = mustGet(s.db.Snapshot(), dm.VDI.Class, ref)
	} else if s.vdiBusy(s.db.Snapshot(), dstRow.Ref) {
		return "", xerr.New(xerr.VDIInUse, dstRow.Ref, "copy")
	}
	err = s.copyInto(ctx, c, key, sdev, dstRow, fresh)
	if err != nil {
		if fresh {
			s.destroyQuietly(dstB, dstRow)
		}
		if ctx.Err() != nil {
			return "", xerr.New(xerr.TaskCancelled, c.Task)
		}
		if xe, ok := err.(*xerr.Error); ok {
			return "", xe
		}
		if isSpaceErr(err) {
			return "", errSpace(err)
		}
		return "", xerr.New(xerr.VDICopyFailed)
	}
	s.refreshVolume(ctx, dstRow.Ref)
	s.updateSRStats(ctx, dstSR.Ref)
	return dm.VDIRef(dstRow.Ref), nil
}

func (s *Service) copyInto(ctx context.Context, c *api.Call, key string, sdev *device, dst *db.Row, fresh bool) error {
	dpName := "copy/" + key + "/dst"
	d, detach, err := s.transferAttach(ctx, dpName, dst.Ref, true)
	if err != nil {
		return err
	}
	defer detach()
	var mu sync.Mutex
	var last time.Time
	progress := func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(last) > 500*time.Millisecond {
			last = time.Now()
			c.SetProgress(0.99 * float64(done) / float64(max(total, 1)))
		}
	}
	if fresh && appendable(d) {
		err = copyAppend(ctx, sdev, d.Path, progress)
	} else {
		var ddev *device
		if ddev, err = openDevice(ctx, d, true, s.run); err != nil {
			return BackendError(smVDIUnavailable, err.Error())
		}
		err = copyDevice(ctx, sdev, ddev, fresh, progress)
		if cerr := ddev.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.log.Warn("VDI copy failed", "into", dst.UUID(), "err", err)
	}
	return err
}

// copyAppend copies a device's data into an empty qcow2 image in order.
func copyAppend(ctx context.Context, src *device, path string, progress func(done, total int64)) error {
	a, err := imageformat.OpenAppender(path)
	if err != nil {
		return err
	}
	ranges, total := src.dataExtents()
	var done int64
	err = readOrdered(ctx, src.r, ranges, func(off int64, b []byte) error {
		done += int64(len(b))
		progress(done, total)
		return a.Write(off, b)
	})
	if cerr := a.Commit(); err == nil {
		err = cerr
	}
	return err
}

// newVDILike makes an empty VDI on an SR with another VDI's size and
// names.
func (s *Service) newVDILike(ctx context.Context, b *boundSR, srRef string, src *db.Row) (string, error) {
	id := newUUID()
	name, desc := src.String(dm.VDI.NameLabel), src.String(dm.VDI.NameDescription)
	spec := VolumeSpec{UUID: id, Name: name, Description: desc, Size: vdiSize(src), Sharable: boolField(src, dm.VDI.Sharable),
		Type: src.String(dm.VDI.Type), Time: time.Now().UTC()}
	s.setInflight(srRef, id, true)
	defer s.setInflight(srRef, id, false)
	v, err := b.sr.VolumeCreate(ctx, spec)
	if err != nil {
		return "", asBackend(err, smVDICreate)
	}
	var ref string
	_, err = s.db.Update(func(tx *db.Tx) (err error) {
		ref, err = s.insertVDI(tx, srRef, v, vdiExtra{uuid: id, name: &name, desc: &desc, typ: spec.Type, sharable: spec.Sharable,
			otherConfig: mapField(src, dm.VDI.OtherConfig), xenstoreData: mapField(src, dm.VDI.XenstoreData)})
		return err
	})
	if err != nil {
		_ = b.sr.VolumeDestroy(context.Background(), v.Key)
		return "", err
	}
	return ref, nil
}

// destroyQuietly removes a VDI made by a failed operation.
func (s *Service) destroyQuietly(b *boundSR, vdi *db.Row) {
	if err := b.sr.VolumeDestroy(context.Background(), vdi.String(dm.VDI.Location)); err != nil {
		s.log.Error("removing a half-made VDI", "vdi", vdi.UUID(), "err", err)
	}
	// Cleanup after a failure that the caller reports: log this one.
	if _, err := s.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VDI.Class, vdi.Ref); ok {
			return s.dropVDIRecord(tx, vdi.Ref)
		}
		return nil
	}); err != nil {
		s.log.Error("removing a half-made VDI's record", "vdi", vdi.UUID(), "err", err)
	}
}
