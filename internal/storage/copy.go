package storage

import (
	"context"
	"strconv"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

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
	var need int64
	for _, e := range sdev.extents() {
		if !e.Zero {
			need += e.Length
		}
	}
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
	var ranges []Extent
	var total, done int64
	for _, e := range src.extents() {
		if !e.Zero {
			ranges = append(ranges, e)
			total += e.Length
		}
	}
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
