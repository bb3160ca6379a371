package xenops

import (
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu"
	"toolstackd/internal/xerr"
)

// bootPlan is a VM's domain as its record and devices describe it, with
// everything checked before anything is made.
type bootPlan struct {
	spec  *backend.Spec
	disks []backend.Disk
	nics  []backend.NIC
	// Values decided at start that go back into the database.
	userdevices map[string]string // VBD -> userdevice (for "autodetect")
	macs        map[string]string // VIF -> MAC (for VIFs created without one)
	// moved names, for a storage migration's destination, the VDI that
	// stands for each VDI of the record (storagemigrate.go).
	moved map[string]string
}

const (
	minMemory     = 16 << 20
	maxVCPUs      = backend.MaxVCPUs
	maxVBDDevices = 16
	maxVIFDevices = 7
)

// checkMemory is xapi's memory constraint.
func checkMemory(sMin, dMin, dMax, sMax int64) error {
	if !(sMin <= dMin && dMin <= dMax && dMax <= sMax) {
		return xerr.New(xerr.MemoryConstraintViolationOrder)
	}
	return nil
}

func (m *Manager) plan(r db.Reader, ref string) (*bootPlan, error) {
	return m.planMoving(r, ref, nil)
}

// planMoving is plan with the VBDs of the VDIs in moved (old VDI to
// new) planned on the new VDIs.
func (m *Manager) planMoving(r db.Reader, ref string, moved map[string]string) (*bootPlan, error) {
	row, ok := r.Get(dm.VM.Class, ref)
	if !ok {
		return nil, xerr.New(xerr.HandleInvalid, "VM", ref)
	}
	var vm dm.VMRecord
	vm.FromRow(r.Values(row))
	if err := checkMemory(vm.MemoryStaticMin, vm.MemoryDynamicMin, vm.MemoryDynamicMax, vm.MemoryStaticMax); err != nil {
		return nil, err
	}
	if vm.MemoryStaticMax < minMemory {
		return nil, xerr.New(xerr.VMMemorySizeTooLow, ref)
	}
	if vm.VCPUsMax < 1 {
		return nil, xerr.New(xerr.InvalidValue, "VCPUs_max", strconv.FormatInt(vm.VCPUsMax, 10))
	}
	if vm.VCPUsAtStartup < 1 {
		return nil, xerr.New(xerr.VMNoVCPUs, ref)
	}
	if vm.VCPUsAtStartup > vm.VCPUsMax {
		return nil, xerr.New(xerr.InvalidValue, "VCPUs_at_startup", strconv.FormatInt(vm.VCPUsAtStartup, 10))
	}
	if vm.VCPUsMax > maxVCPUs {
		return nil, xerr.New(xerr.VMTooManyVCPUs, ref)
	}
	if pc := hostCPUs(r, m.host); vm.VCPUsMax > int64(pc) {
		return nil, xerr.New(xerr.HostNotEnoughPCPUs, strconv.FormatInt(vm.VCPUsMax, 10), strconv.Itoa(pc))
	}
	spec := &backend.Spec{
		UUID: vm.UUID, Name: vm.NameLabel, VMRef: ref,
		Memory: vm.MemoryStaticMax, Target: vm.MemoryDynamicMax,
		VCPUs: int(vm.VCPUsAtStartup), MaxCPU: int(vm.VCPUsMax), HVM: true,
		Firmware: "bios", BootOrder: vm.HVMBootParams["order"], Platform: map[string]string{},
	}
	for k, v := range vm.Platform {
		spec.Platform[k] = v
	}
	if strings.EqualFold(vm.HVMBootParams["firmware"], "uefi") {
		spec.Firmware = "uefi"
	}
	if vm.PVKernel != "" {
		for _, f := range []struct{ field, path string }{{"PV_kernel", vm.PVKernel}, {"PV_ramdisk", vm.PVRamdisk}} {
			if f.path != "" && !m.kernelAllowed(f.path) {
				return nil, xerr.New(xerr.InvalidValue, f.field, f.path)
			}
		}
		spec.Kernel, spec.Ramdisk = vm.PVKernel, vm.PVRamdisk
		spec.Cmdline = strings.TrimSpace(vm.PVArgs + " " + vm.PVLegacyArgs)
	}
	p := &bootPlan{spec: spec, userdevices: map[string]string{}, macs: map[string]string{}, moved: moved}
	if err := m.planDisks(r, row, p); err != nil {
		return nil, err
	}
	if err := m.planNICs(r, row, p); err != nil {
		return nil, err
	}
	return p, nil
}

// restorePlan is the domain a resume builds: the VM's record planned as
// for VM.start (identity, firmware, kernel through kernelAllowed, disks
// and NICs with every check), restoring the image's memory. The image is
// untrusted: it contributes only its stream, the VCPUs hot-plugged while
// the guest ran, each checked by backend.CheckHotCPUs, and which of the record's
// device slots were in use (keepSavedDisks). Its uuid, name, kernel,
// paths, taps and bridges are never used.
func (m *Manager) restorePlan(r db.Reader, ref, image string) (*bootPlan, error) {
	meta, err := backend.ReadImageMeta(image)
	if err == nil && meta.Backend != m.be.Name() {
		err = backend.ErrImageBackend
	}
	if err != nil {
		m.log.Warn("unusable suspend image", m.logRef("vm", dm.VM.Class, ref), "image", image, "err", err)
		return nil, xerr.New(xerr.SuspendImageNotAccessible, image)
	}
	p, err := m.plan(r, ref)
	if err != nil {
		return nil, err
	}
	// VCPUs_at_startup counts the VCPUs the guest had running (a live
	// change sets it): those it booted with plus those hot-plugged.
	p.spec.VCPUs -= len(meta.HotCPUs)
	hot, err := backend.CheckHotCPUs(meta.HotCPUs, p.spec)
	if err == nil && p.spec.VCPUs < 1 {
		err = fmt.Errorf("%d hot-plugged VCPUs for %d in all", len(meta.HotCPUs), p.spec.VCPUs+len(meta.HotCPUs))
	}
	if err != nil {
		m.log.Warn("unusable suspend image", m.logRef("vm", dm.VM.Class, ref), "image", image, "err", err)
		return nil, xerr.New(xerr.SuspendImageNotAccessible, image)
	}
	p.spec.RestoreFrom, p.spec.HotCPUs = image, hot
	p.disks, p.nics = keepSavedDisks(p.disks, meta.Disks), keepSavedNICs(p.nics, meta.NICs)
	return p, nil
}

// keepSavedDisks narrows the record's planned disks to those the domain
// had when it was saved (same device slot and kind), so that a drive
// unplugged before the suspend does not reappear. The image can only
// leave planned disks out: every disk kept is the record's own, checked
// by planDisks, and nothing else the image says about it is used.
func keepSavedDisks(planned, saved []backend.Disk) []backend.Disk {
	had := map[string]bool{}
	for _, d := range saved {
		had[d.Device+"/"+strconv.FormatBool(d.CD)] = true
	}
	var out []backend.Disk
	for _, d := range planned {
		if had[d.Device+"/"+strconv.FormatBool(d.CD)] {
			out = append(out, d)
		}
	}
	return out
}

// keepSavedNICs is keepSavedDisks for NICs (by device number).
func keepSavedNICs(planned, saved []backend.NIC) []backend.NIC {
	had := map[string]bool{}
	for _, n := range saved {
		had[n.Device] = true
	}
	var out []backend.NIC
	for _, n := range planned {
		if had[n.Device] {
			out = append(out, n)
		}
	}
	return out
}

// kernelAllowed keeps guests from booting arbitrary host files: kernels
// come from the configured directories only.
func (m *Manager) kernelAllowed(path string) bool {
	if !filepath.IsAbs(path) {
		return false
	}
	clean := filepath.Clean(path)
	if real, err := filepath.EvalSymlinks(clean); err == nil {
		clean = real
	}
	for _, dir := range m.cfg.KernelDirs {
		d := filepath.Clean(dir)
		if real, err := filepath.EvalSymlinks(d); err == nil {
			d = real
		}
		if strings.HasPrefix(clean, d+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

func (m *Manager) planDisks(r db.Reader, vm *db.Row, p *bootPlan) error {
	type vbdInfo struct {
		row    *db.Row
		device string
	}
	var vbds []vbdInfo
	used := map[string]string{}
	var auto []*db.Row
	for _, ref := range strs(r.Value(vm, dm.VM.VBDs)) {
		row, ok := r.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		dev := row.String(dm.VBD.Userdevice)
		if dev == "autodetect" || dev == "" {
			auto = append(auto, row)
			continue
		}
		n, err := strconv.Atoi(dev)
		if err != nil || n < 0 || n >= maxVBDDevices {
			return xerr.New(xerr.InvalidDevice, dev)
		}
		dev = strconv.Itoa(n)
		if other, dup := used[dev]; dup {
			_ = other
			return xerr.New(xerr.VMDuplicateVBDDevice, vm.Ref, ref, dev)
		}
		used[dev] = ref
		vbds = append(vbds, vbdInfo{row, dev})
	}
	for _, row := range auto {
		dev := ""
		for n := 0; n < maxVBDDevices; n++ {
			if _, taken := used[strconv.Itoa(n)]; !taken {
				dev = strconv.Itoa(n)
				break
			}
		}
		if dev == "" {
			return xerr.New(xerr.InvalidDevice, "autodetect")
		}
		used[dev] = row.Ref
		p.userdevices[row.Ref] = dev
		vbds = append(vbds, vbdInfo{row, dev})
	}
	// Read-write disks before read-only ones: a VDI attached read-only
	// cannot then be attached read-write.
	sort.SliceStable(vbds, func(i, j int) bool {
		ri := vbds[i].row.String(dm.VBD.Mode) == string(dm.VBDModeRW)
		rj := vbds[j].row.String(dm.VBD.Mode) == string(dm.VBDModeRW)
		if ri != rj {
			return ri
		}
		a, _ := strconv.Atoi(vbds[i].device)
		b, _ := strconv.Atoi(vbds[j].device)
		return a < b
	})
	for _, v := range vbds {
		d, skip, err := m.diskOfMoved(r, vm.Ref, v.row, v.device, p.moved)
		if err != nil {
			return err
		}
		if !skip {
			p.disks = append(p.disks, d)
		}
	}
	return nil
}

// diskOf describes a VBD for the backend, checking its VDI can be used.
// skip is true for an empty disk drive, which has nothing to attach.
func (m *Manager) diskOf(r db.Reader, vm string, row *db.Row, device string) (backend.Disk, bool, error) {
	return m.diskOfMoved(r, vm, row, device, nil)
}

// diskOfMoved is diskOf with the VBD's VDI replaced as moved says.
func (m *Manager) diskOfMoved(r db.Reader, vm string, row *db.Row, device string, moved map[string]string) (backend.Disk, bool, error) {
	cd := row.String(dm.VBD.Type) == string(dm.VBDTypeCD)
	d := backend.Disk{VBD: row.Ref, Device: device, CD: cd, Bootable: row.Get(dm.VBD.Bootable) == true,
		ReadOnly: cd || row.String(dm.VBD.Mode) == string(dm.VBDModeRO)}
	if cd {
		if _, _, ok := qemu.IDESlot(device); !ok {
			return d, false, xerr.New(xerr.InvalidDevice, device)
		}
	}
	if row.Get(dm.VBD.Empty) == true {
		return d, !cd, nil
	}
	vdi := row.String(dm.VBD.VDI)
	if n, ok := moved[vdi]; ok {
		vdi = n
	}
	vrow, ok := r.Get(dm.VDI.Class, vdi)
	if !ok {
		return d, false, xerr.New(xerr.VDIMissing, schema.NullRef, vdi)
	}
	sr := vrow.String(dm.VDI.SR)
	if vrow.Get(dm.VDI.Missing) == true {
		return d, false, xerr.New(xerr.VDIMissing, sr, vdi)
	}
	if err := m.assertSRReachable(r, vm, sr); err != nil {
		return d, false, err
	}
	if vrow.Get(dm.VDI.ReadOnly) == true {
		d.ReadOnly = true
	}
	if err := assertVDIFree(r, vm, vrow, d.ReadOnly); err != nil {
		return d, false, err
	}
	d.VDI = vdi
	return d, false, nil
}

// assertSRReachable: once storage plugs PBDs, a VDI's SR must be plugged
// on this host.
func (m *Manager) assertSRReachable(r db.Reader, vm, sr string) error {
	srRow, ok := r.Get(dm.SR.Class, sr)
	if !ok {
		return nil
	}
	pbds := strs(r.Value(srRow, dm.SR.PBDs))
	if len(pbds) == 0 {
		return nil
	}
	for _, pbd := range pbds {
		if p, ok := r.Get(dm.PBD.Class, pbd); ok && p.String(dm.PBD.Host) == m.host && p.Get(dm.PBD.CurrentlyAttached) == true {
			return nil
		}
	}
	return xerr.New(xerr.VMRequiresSR, vm, sr)
}

// assertVDIFree: a VDI that is not sharable is used read-write by one
// running VM at most.
func assertVDIFree(r db.Reader, vm string, vdi *db.Row, readonly bool) error {
	if vdi.Get(dm.VDI.Sharable) == true {
		return nil
	}
	for _, vbd := range strs(r.Value(vdi, dm.VDI.VBDs)) {
		other, ok := r.Get(dm.VBD.Class, vbd)
		if !ok || other.String(dm.VBD.VM) == vm || other.Get(dm.VBD.CurrentlyAttached) != true {
			continue
		}
		if !readonly || other.String(dm.VBD.Mode) == string(dm.VBDModeRW) {
			return xerr.New(xerr.VDIInUse, vdi.Ref, "start")
		}
	}
	return nil
}

func (m *Manager) planNICs(r db.Reader, vm *db.Row, p *bootPlan) error {
	var rows []*db.Row
	seen := map[string]bool{}
	for _, ref := range strs(r.Value(vm, dm.VM.VIFs)) {
		row, ok := r.Get(dm.VIF.Class, ref)
		if !ok {
			continue
		}
		dev := row.String(dm.VIF.Device)
		n, err := strconv.Atoi(dev)
		if err != nil || n < 0 || n >= maxVIFDevices {
			return xerr.New(xerr.InvalidDevice, dev)
		}
		if seen[dev] {
			return xerr.New(xerr.DeviceAlreadyExists, dev)
		}
		seen[dev] = true
		rows = append(rows, row)
	}
	// Stable device order: guests name NICs by discovery order.
	sort.Slice(rows, func(i, j int) bool {
		a, _ := strconv.Atoi(rows[i].String(dm.VIF.Device))
		b, _ := strconv.Atoi(rows[j].String(dm.VIF.Device))
		return a < b
	})
	for _, row := range rows {
		n, err := m.nicOf(r, vm.Ref, row)
		if err != nil {
			return err
		}
		if row.String(dm.VIF.MAC) == "" {
			p.macs[row.Ref] = n.MAC
		}
		p.nics = append(p.nics, n)
	}
	return nil
}

// nicOf describes a VIF for the backend.
func (m *Manager) nicOf(r db.Reader, vm string, row *db.Row) (backend.NIC, error) {
	net := row.String(dm.VIF.Network)
	nrow, ok := r.Get(dm.Network.Class, net)
	if !ok {
		return backend.NIC{}, xerr.New(xerr.VMRequiresNetwork, vm, net)
	}
	mac := strings.ToLower(row.String(dm.VIF.MAC))
	if mac == "" {
		mac = macFor(row.UUID())
	}
	mtu, _ := row.Get(dm.VIF.MTU).(int64)
	if mtu <= 0 {
		mtu, _ = nrow.Get(dm.Network.MTU).(int64)
	}
	return backend.NIC{VIF: row.Ref, Device: row.String(dm.VIF.Device), MAC: mac, MTU: mtu, Bridge: nrow.String(dm.Network.Bridge)}, nil
}

// macFor derives a locally administered unicast MAC from a seed.
func macFor(seed string) string {
	h := sha256.Sum256([]byte(seed))
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", h[0], h[1], h[2], h[3], h[4])
}
