package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// Suspend images. As in xapi, a suspended VM's memory lives in a VDI of
// type "suspend" on the suspend SR, named "Suspend image", with the VM's
// uuid in sm_config:vmhint; VM.suspend_VDI names it while the VM is
// Suspended. Being a VDI, it is listed in its SR, counted in the SR's
// sizes and exportable like any disk.
//
// Emulators write and read a memory image as a plain file, and volumes
// are not plain files on every SR (a file SR keeps qcow2 images, a plugin
// may export NBD). So xenops saves the memory into a staging file of its
// own, SaveSuspendImage copies that into the VDI (thin: zero runs are
// not written), and LoadSuspendImage copies a VDI's image back out into
// a staging file for a resume. The staging files are xenops' to remove.
//
// A suspend VDI is untrusted input twice over: a VM record may name any
// VDI, and whoever can write a VDI can write an image. LoadSuspendImage
// reads only a VDI of type suspend whose vmhint is the VM's own uuid, and
// no more data than the VM's memory could make; the image's content is
// checked by xenops (backend.ReadImageMeta) before anything uses it.
// DestroySuspendVDI destroys nothing but a VDI of type suspend, so a
// record naming a user disk as its suspend_VDI cannot get that disk
// deleted by VM.hard_shutdown, resume or destroy.

// Facts from xapi: the VDI's names, type and sm_config keys, and its size
// (memory_static_max * 1.2 * 1.05 plus 100 MiB).
const (
	suspendVDIName      = "Suspend image"
	suspendVDIType      = "suspend"
	smVMHint            = "vmhint"
	smInitialAllocation = "initial_allocation"
	suspendOverhead     = 104857600
)

// SuspendImageSize is the size of the suspend VDI for a VM whose
// memory_static_max is mem, as xapi computes it (a VM's video memory is
// not counted: there are no vGPUs here).
func SuspendImageSize(mem int64) int64 {
	if mem <= 0 {
		return suspendOverhead
	}
	f := float64(mem) * 1.2 * 1.05
	if f >= float64(imageformat.MaxVirtualSize) {
		return imageformat.MaxVirtualSize
	}
	return min(int64(f)+suspendOverhead, imageformat.MaxVirtualSize)
}

// CreateSuspendVDI makes an empty suspend VDI of at least size bytes (and
// at least what xapi gives the VM's memory) for VM vmRef, to belong to
// the VM with uuid forUUID (vmRef's own, or a checkpoint's), on srHint when
// this host has a PBD for it, else on the pool's suspend_image_SR, else on
// this host's suspend_image_sr (xapi's order); VM_NO_SUSPEND_SR when none
// is usable. Not enough room is SR_SUSPEND_SPACE_INSUFFICIENT.
func (s *Service) CreateSuspendVDI(ctx context.Context, vmRef, forUUID, srHint string, size int64) (string, error) {
	snap := s.db.Snapshot()
	vm, ok := snap.Get(dm.VM.Class, vmRef)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VM", vmRef)
	}
	mem, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	size = max(size, SuspendImageSize(mem))
	if size > imageformat.MaxVirtualSize {
		return "", BackendError(smVDISize, "suspend image of "+strconv.FormatInt(size, 10)+" bytes is over the maximum")
	}
	sr, err := s.chooseSuspendSR(snap, vm, srHint)
	if err != nil {
		return "", err
	}
	if forUUID == "" {
		forUUID = vm.UUID()
	}
	return s.newSuspendVDI(ctx, sr, forUUID, size)
}

// chooseSuspendSR picks the SR for a VM's suspend image: VM.suspend_SR
// (given as hint), pool.suspend_image_SR, then this host's
// suspend_image_sr, the first of them this host has a PBD for.
func (s *Service) chooseSuspendSR(snap db.Reader, vm *db.Row, hint string) (string, error) {
	cands := []string{hint}
	for _, p := range snap.All(dm.Pool.Class) {
		cands = append(cands, p.String(dm.Pool.SuspendImageSR))
	}
	if h, ok := snap.Get(dm.Host.Class, s.host); ok {
		cands = append(cands, h.String(dm.Host.SuspendImageSR))
	}
	for _, sr := range cands {
		if sr == "" || sr == schema.NullRef {
			continue
		}
		if _, ok := snap.Get(dm.SR.Class, sr); !ok {
			continue
		}
		for _, pbd := range pbdsOf(snap, sr) {
			if pbd.String(dm.PBD.Host) == s.host {
				return sr, nil
			}
		}
	}
	return "", xerr.New(xerr.VMNoSuspendSR, vm.Ref)
}

// newSuspendVDI makes an empty suspend VDI of size bytes on srRef for the
// VM with uuid vmUUID.
func (s *Service) newSuspendVDI(ctx context.Context, srRef, vmUUID string, size int64) (string, error) {
	sr, ok := s.db.Snapshot().Get(dm.SR.Class, srRef)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "SR", srRef)
	}
	b, err := s.attached(srRef)
	if err != nil {
		return "", err
	}
	if err := s.requireCap(b, srRef, "VDI_CREATE"); err != nil {
		return "", err
	}
	done, err := s.mark(ctx, db.NewRef(), marked{dm.SR.Class, srRef, "vdi_create"})
	if err != nil {
		return "", err
	}
	defer done()
	if err := s.checkSpace(ctx, b, sr, size); err != nil {
		if xerr.HasCode(err, xerr.SRFull) {
			return "", xerr.New(xerr.SRSuspendSpaceInsufficient, srRef)
		}
		return "", err
	}
	id := newUUID()
	name, desc := suspendVDIName, suspendVDIName
	spec := VolumeSpec{UUID: id, Name: name, Description: desc, Size: size, Type: suspendVDIType, Time: time.Now().UTC()}
	s.setInflight(srRef, id, true)
	defer s.setInflight(srRef, id, false)
	v, err := b.sr.VolumeCreate(ctx, spec)
	if err != nil {
		return "", asBackend(err, smVDICreate)
	}
	s.setInflight(srRef, v.Key, true)
	defer s.setInflight(srRef, v.Key, false)
	var ref string
	_, err = s.db.Update(func(tx *db.Tx) (err error) {
		ref, err = s.insertVDI(tx, srRef, v, vdiExtra{uuid: id, name: &name, desc: &desc, typ: suspendVDIType,
			smConfig: map[string]string{smVMHint: vmUUID, smInitialAllocation: strconv.FormatInt(size, 10)}})
		return err
	})
	if err != nil {
		if derr := b.sr.VolumeDestroy(context.WithoutCancel(ctx), v.Key); derr != nil {
			s.log.Error("removing a suspend volume without a record", "sr", srRef, "key", v.Key, "err", derr)
		}
		return "", err
	}
	s.updateSRStats(ctx, srRef)
	return ref, nil
}

// suspendVDI is a VDI that must be a suspend image: its row and its SR's
// mux entry. Any other VDI is VDI_INCOMPATIBLE_TYPE.
func (s *Service) suspendVDI(vdiRef string) (*db.Row, *boundSR, error) {
	vdi, ok := s.db.Snapshot().Get(dm.VDI.Class, vdiRef)
	if !ok {
		return nil, nil, xerr.New(xerr.HandleInvalid, "VDI", vdiRef)
	}
	if t := vdi.String(dm.VDI.Type); t != suspendVDIType {
		return vdi, nil, xerr.New(xerr.VDIIncompatibleType, vdiRef, t)
	}
	b, err := s.attached(vdi.String(dm.VDI.SR))
	if err != nil {
		return vdi, nil, err
	}
	return vdi, b, nil
}

// DestroySuspendVDI destroys a suspend VDI that no datapath holds. A VDI
// that is already gone is not an error; a VDI of another type is never
// destroyed (VDI_INCOMPATIBLE_TYPE).
func (s *Service) DestroySuspendVDI(ctx context.Context, vdiRef string) error {
	if _, ok := s.db.Snapshot().Get(dm.VDI.Class, vdiRef); !ok {
		return nil
	}
	vdi, b, err := s.suspendVDI(vdiRef)
	if err != nil {
		return err
	}
	srRef := vdi.String(dm.VDI.SR)
	done, err := s.mark(ctx, db.NewRef(), marked{dm.VDI.Class, vdiRef, "destroy"}, marked{dm.SR.Class, srRef, "vdi_destroy"})
	if err != nil {
		return err
	}
	defer done()
	unlock := s.lock("vdi:" + vdiRef)
	defer unlock()
	if s.vdiBusy(s.db.Snapshot(), vdiRef) {
		return xerr.New(xerr.VDIInUse, vdiRef, "destroy")
	}
	err = b.sr.VolumeDestroy(ctx, vdi.String(dm.VDI.Location))
	if err != nil && !xerr.HasCode(err, xerr.SRBackendFailure+"_"+strconv.Itoa(smVDIMissing)) {
		return asBackend(err, smVDIRemove)
	}
	_, err = s.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VDI.Class, vdiRef); !ok {
			return nil
		}
		if err := s.dropVDIRecord(tx, vdiRef); err != nil {
			return err
		}
		return s.refreshSR(tx, srRef)
	})
	s.updateSRStats(ctx, srRef)
	return err
}

// SaveSuspendImage copies the memory image in the file at path into the
// suspend VDI vdiRef, which must be large enough for it.
func (s *Service) SaveSuspendImage(ctx context.Context, vdiRef, path string) error {
	vdi, _, err := s.suspendVDI(vdiRef)
	if err != nil {
		return err
	}
	f, err := os.Open(path) //nolint:gosec // xenops' staging file for this image, a path it built under its own directory
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > vdiSize(vdi) {
		return xerr.New(xerr.VDITooSmall, vdiRef, strconv.FormatInt(st.Size(), 10))
	}
	dpName := "suspend/" + db.NewRef()
	d, detach, err := s.transferAttach(ctx, dpName, vdiRef, true)
	if err != nil {
		return err
	}
	defer detach()
	if appendable(d) {
		// A fresh qcow2 image: write it directly, in order.
		a, err := imageformat.OpenAppender(d.Path)
		if err != nil {
			return BackendError(smVDIUnavailable, err.Error())
		}
		_, err = importRawSeq(ctx, f, a, nil)
		if err != nil {
			return s.suspendCopyError(err)
		}
	} else {
		dev, err := openDevice(ctx, d, true, s.run)
		if err != nil {
			return BackendError(smVDIUnavailable, err.Error())
		}
		_, err = importRaw(ctx, f, dev, nil)
		if ferr := flushDevice(dev); err == nil {
			err = ferr
		}
		if cerr := dev.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return s.suspendCopyError(err)
		}
	}
	s.refreshVolume(ctx, vdiRef)
	s.updateSRStats(ctx, vdi.String(dm.VDI.SR))
	return nil
}

// suspendCopyError names why copying an image failed.
func (s *Service) suspendCopyError(err error) error {
	var xe *xerr.Error
	switch {
	case errors.As(err, &xe):
		return xe
	case isSpaceErr(err):
		return errSpace(err)
	case errors.Is(err, context.Canceled):
		return xerr.New(xerr.TaskCancelled, "")
	}
	return BackendError(smVDIUnavailable, err.Error())
}

// LoadSuspendImage copies the memory image of VM vmRef out of its suspend
// VDI vdiRef into a new file at path (sparse: zero runs are holes). The
// VDI must be a suspend VDI made for this VM (sm_config:vmhint) and hold
// no more data than the VM's memory can make; anything else, and a VDI
// that cannot be read, is SUSPEND_IMAGE_NOT_ACCESSIBLE.
func (s *Service) LoadSuspendImage(ctx context.Context, vmRef, vdiRef, path string) error {
	refuse := func(why string, args ...any) error {
		s.log.Warn("refusing a suspend VDI", append([]any{"vm_ref", vmRef, "vdi", vdiRef, "why", why}, args...)...)
		return xerr.New(xerr.SuspendImageNotAccessible, vdiRef)
	}
	vm, ok := s.db.Snapshot().Get(dm.VM.Class, vmRef)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "VM", vmRef)
	}
	vdi, _, err := s.suspendVDI(vdiRef)
	if err != nil {
		return refuse("not a usable suspend VDI", "err", err)
	}
	if smc := mapField(vdi, dm.VDI.SMConfig); smc[smVMHint] != vm.UUID() {
		return refuse("made for another VM", smVMHint, clip(smc[smVMHint], 100))
	}
	mem, _ := vm.Get(dm.VM.MemoryStaticMax).(int64)
	limit := SuspendImageSize(mem)
	dev, done, err := s.transferDP(ctx, "suspend/"+db.NewRef(), vdiRef, false)
	if err != nil {
		return refuse("cannot attach", "err", err)
	}
	defer done()
	ranges, data := dev.dataExtents()
	var end int64
	if n := len(ranges); n > 0 {
		end = ranges[n-1].Offset + ranges[n-1].Length
	}
	if data > limit {
		return refuse("more data than the VM's memory makes", "bytes", data, "limit", limit)
	}
	if err := s.guardFor(filepath.Dir(path)).check(data); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600) //nolint:gosec // xenops' staging file for this image, a path it built under its own directory
	if err != nil {
		return err
	}
	err = readOrdered(ctx, dev.r, ranges, func(off int64, b []byte) error {
		if imageformat.IsZero(b) {
			return nil
		}
		_, err := f.WriteAt(b, off)
		return err
	})
	if err == nil {
		err = f.Truncate(end)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if rerr := os.Remove(path); rerr != nil && !os.IsNotExist(rerr) { //nolint:gosec // as above
			s.log.Warn("removing a partial suspend image copy", "path", path, "err", rerr)
		}
		if isSpaceErr(err) {
			return errSpace(err)
		}
		if ctx.Err() != nil {
			return xerr.New(xerr.TaskCancelled, "")
		}
		return refuse("cannot read", "err", err)
	}
	return nil
}

// CopySuspendVDI makes a copy of suspend VDI vdiRef for the VM with uuid
// vmUUID (a clone or snapshot of the VM it belongs to), on srRef (the null
// ref: the original's SR), and returns its ref.
func (s *Service) CopySuspendVDI(ctx context.Context, vdiRef, vmUUID, srRef string) (string, error) {
	src, _, err := s.suspendVDI(vdiRef)
	if err != nil {
		return "", err
	}
	if srRef == "" || srRef == schema.NullRef {
		srRef = src.String(dm.VDI.SR)
	}
	sdev, sdone, err := s.transferDP(ctx, "suspend/"+db.NewRef(), vdiRef, false)
	if err != nil {
		return "", err
	}
	defer sdone()
	ref, err := s.newSuspendVDI(ctx, srRef, vmUUID, max(vdiSize(src), sdev.size))
	if err != nil {
		return "", err
	}
	if err := s.copySuspendData(ctx, sdev, ref); err != nil {
		if derr := s.DestroySuspendVDI(context.WithoutCancel(ctx), ref); derr != nil {
			s.log.Error("removing a half-made suspend VDI", "vdi", ref, "err", derr)
		}
		return "", s.suspendCopyError(err)
	}
	s.refreshVolume(ctx, ref)
	if row, ok := s.db.Snapshot().Get(dm.VDI.Class, ref); ok {
		s.updateSRStats(ctx, row.String(dm.VDI.SR))
	}
	return ref, nil
}

// copySuspendData copies a device's data into the new (empty) VDI dst.
func (s *Service) copySuspendData(ctx context.Context, src *device, dst string) error {
	d, detach, err := s.transferAttach(ctx, "suspend/"+db.NewRef(), dst, true)
	if err != nil {
		return err
	}
	defer detach()
	if appendable(d) {
		return copyAppend(ctx, src, d.Path, func(int64, int64) {})
	}
	ddev, err := openDevice(ctx, d, true, s.run)
	if err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	err = copyDevice(ctx, src, ddev, true, nil)
	if cerr := ddev.Close(); err == nil {
		err = cerr
	}
	return err
}
