package cli

import (
	"fmt"
	"maps"
	"strconv"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// noForceMsg is xapi's refusal of a dangerous command without --force.
const noForceMsg = "This operation is dangerous and may cause data loss. This operation must be forced (use --force)."

// ownerKey in a VBD's other_config marks a disk as belonging to its VM:
// uninstalling the VM destroys it.
const ownerKey = "owner"

// vmCommand registers a command that acts on the VMs the selectors pick
// (several with --multiple).
func (s *Server) vmCommand(name, help string, o selectOpts, op func(c *Ctx, vm *db.Row) error) {
	s.register(name, help, func(c *Ctx) error {
		return c.eachSelected(vmSelector, o, true, func(row *db.Row, _ formatter) error { return op(c, row) })
	})
}

// addVMCommands registers the commands on VMs, their disks, CDs and
// network interfaces, snapshots and templates.
func (s *Server) addVMCommands() {
	s.addVMDiskCommands()
	s.addVMCDCommands()
	s.addVMInfoCommands()
	s.addVMStateCommands()
	s.addMemoryCommands()
	s.addSnapshotCommands()
}

// addVMDiskCommands registers the commands that add, remove and list
// the disks of VMs and snapshots (and list VMs' CD drives).
func (s *Server) addVMDiskCommands() {
	s.vmCommand("vm-disk-add", "Adds a new disk (disk-size, in bytes or with a suffix) to the selected VMs as device "+
		"(one of the VM's allowed-VBD-devices), on sr-uuid or the pool's default SR.", selectOpts{}, (*Ctx).vmDiskAdd)
	s.vmCommand("vm-disk-remove", "Removes the disk at device from the selected VMs and destroys it.", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			vbd, ok := c.vbdAt(vm, c.require("device"))
			if !ok {
				return failf("Disk not found")
			}
			vdi := vbd.String(dm.VBD.VDI)
			if _, err := c.call("VBD.destroy", vbd.Ref); err != nil {
				return err
			}
			_, err := c.call("VDI.destroy", vdi)
			return err
		})
	s.vmCommand("vm-disk-list", "Lists the disks of the selected VMs: each VBD and its VDI (vbd-params= and vdi-params= "+
		"choose the fields).", selectOpts{}, func(c *Ctx, vm *db.Row) error { return c.diskList(vm, false) })
	s.vmCommand("vm-cd-list", "Lists the CD drives of the selected VMs and the CDs in them (vbd-params= and vdi-params= "+
		"choose the fields).", selectOpts{}, func(c *Ctx, vm *db.Row) error { return c.diskList(vm, true) })
	s.register("snapshot-disk-list", "Lists the disks of the snapshot with this uuid (vbd-params= and vdi-params= choose "+
		"the fields).", func(c *Ctx) error {
		snap, err := c.snapshotRow()
		if err != nil {
			return err
		}
		return c.diskList(snap, false)
	})
}

// addVMCDCommands registers the commands that put CDs in VMs' drives,
// take them out, and list the CDs.
func (s *Server) addVMCDCommands() {
	s.vmCommand("vm-cd-add", "Puts the CD called cd-name (a disk on an ISO SR) into a new CD drive of the selected VMs "+
		"at device.", selectOpts{}, func(c *Ctx, vm *db.Row) error {
		cds, err := c.isoVDIs(c.require("cd-name"))
		if err != nil {
			return err
		}
		if len(cds) == 0 {
			return failf("CD %s not found!", c.require("cd-name"))
		}
		return c.addVBD(vm, cds[0].Ref, c.require("device"), dm.VBDTypeCD, dm.VBDModeRO, false)
	})
	s.vmCommand("vm-cd-remove", "Removes the CD drive holding the CD called cd-name (<EMPTY> for an empty drive) from "+
		"the selected VMs.", selectOpts{}, (*Ctx).vmCDRemove)
	s.vmCommand("vm-cd-eject", "Ejects the CD from the selected VM's only CD drive (vbd-eject for a VM with more).",
		selectOpts{}, func(c *Ctx, vm *db.Row) error {
			cds := c.cdDrives(vm, false)
			switch len(cds) {
			case 0:
				return failf("No CDs found")
			case 1:
			default:
				return failf("Two or more CDs found. Please use vbd-eject")
			}
			_, err := c.call("VBD.eject", cds[0].Ref)
			return err
		})
	s.vmCommand("vm-cd-insert", "Inserts the CD called cd-name into the selected VM's only empty CD drive "+
		"(vbd-insert for a VM with more).", selectOpts{}, (*Ctx).vmCDInsert)
	s.register("cd-list", "Lists the CDs: the disks on ISO SRs (params= chooses the fields).", s.cdList)
}

// vmCDRemove is vm-cd-remove for vm.
func (c *Ctx) vmCDRemove(vm *db.Row) error {
	name := c.require("cd-name")
	snap := c.s.api.DB.Snapshot()
	for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI))
		var match bool
		if ok {
			sr, _ := snap.Get(dm.SR.Class, vdi.String(dm.VDI.SR))
			match = sr != nil && sr.String(dm.SR.ContentType) == "iso" && vdi.String(dm.VDI.NameLabel) == name
		} else {
			match = name == "<EMPTY>"
		}
		if match {
			_, err := c.call("VBD.destroy", ref)
			return err
		}
	}
	return failf("Disk not found")
}

// vmCDInsert is vm-cd-insert for vm: the CD name must be the only one
// of its name, and vm must have exactly one empty CD drive.
func (c *Ctx) vmCDInsert(vm *db.Row) error {
	name := c.require("cd-name")
	cds, err := c.isoVDIs(name)
	if err != nil {
		return err
	}
	switch len(cds) {
	case 0:
		return failf("CD %s not found", name)
	case 1:
	default:
		return failf("Multiple CDs named %s found. Please use vbd-insert and specify uuids", name)
	}
	drives := c.cdDrives(vm, true)
	switch len(drives) {
	case 0:
		return xerr.New(xerr.VMNoEmptyCDVBD, vm.Ref)
	case 1:
	default:
		return failf("Two or more empty CD devices found. Please use vbd-insert")
	}
	_, err = c.call("VBD.insert", drives[0].Ref, cds[0].Ref)
	return err
}

// cdList is cd-list.
func (s *Server) cdList(c *Ctx) error {
	srs, err := c.allRows(c.s.classes["sr"])
	if err != nil {
		return err
	}
	snap := c.s.api.DB.Snapshot()
	fm := formatter{snap}
	v := c.s.classes["vdi"]
	only := c.pickFields(v, "params", []string{"name-label", "uuid"})
	var recs [][]field
	for _, sr := range srs {
		if sr.String(dm.SR.ContentType) != "iso" {
			continue
		}
		for _, ref := range strs(snap.Value(sr, dm.SR.VDIs)) {
			if vdi, ok := snap.Get(dm.VDI.Class, ref); ok {
				recs = append(recs, fm.record(v, vdi, only))
			}
		}
	}
	c.out.table(recs)
	return nil
}

// addVMInfoCommands registers the commands that list VMs' network
// interfaces and crash dumps and say whether their BIOS is customised.
func (s *Server) addVMInfoCommands() {
	s.register("vm-vif-list", "Lists the network interfaces of the selected VMs (params= chooses the fields).",
		s.vmVIFList, params(nil, []string{"params"}))
	s.vmCommand("vm-crashdump-list", "Lists the crash dumps of the selected VMs.", selectOpts{}, func(c *Ctx, vm *db.Row) error {
		v := c.s.classes["crashdump"]
		snap := c.s.api.DB.Snapshot()
		fm := formatter{snap}
		var recs [][]field
		for _, ref := range strs(snap.Value(vm, dm.VM.CrashDumps)) {
			if row, ok := snap.Get(dm.Crashdump.Class, ref); ok && v != nil {
				recs = append(recs, fm.record(v, row, nil))
			}
		}
		c.out.table(recs)
		return nil
	})
	s.vmCommand("vm-is-bios-customized", "Says whether the BIOS strings of the selected VMs are set, and whether they are "+
		"the generic ones.", selectOpts{}, func(c *Ctx, vm *db.Row) error {
		bios, _ := vm.Get(dm.VM.BIOSStrings).(map[string]string)
		switch {
		case len(bios) == 0:
			c.out.msg("The BIOS strings of this VM have not yet been set.")
		case maps.Equal(bios, genericBIOS):
			c.out.msg("This VM is BIOS-generic.")
		default:
			c.out.msg("This VM is BIOS-customized.")
		}
		return nil
	})
}

// vmVIFList is vm-vif-list.
func (s *Server) vmVIFList(c *Ctx) error {
	v := c.s.classes["vif"]
	only := c.pickFields(v, "params", []string{"uuid", "device", "MAC", "network-uuid", "network-name-label", "vm-name-label"})
	// Every selected VM, --multiple or not, as xapi lists them.
	vms, fm, err := c.selectRows(vmSelector, selectOpts{})
	if err != nil {
		return err
	}
	if len(vms) == 0 {
		return failf("No matching VMs found")
	}
	var recs [][]field
	for _, vm := range vms {
		for _, ref := range strs(fm.snap.Value(vm, dm.VM.VIFs)) {
			if vif, ok := fm.snap.Get(dm.VIF.Class, ref); ok {
				recs = append(recs, fm.record(v, vif, only))
			}
		}
	}
	c.out.table(recs)
	return nil
}

// addVMStateCommands registers the commands that reset a VM's power
// state, change its VCPUs live and checkpoint it.
func (s *Server) addVMStateCommands() {
	s.vmCommand("vm-reset-powerstate", "Records the selected VMs as halted without touching their domains, for a VM whose "+
		"host is gone (--force required).", selectOpts{}, func(c *Ctx, vm *db.Row) error {
		_, err := c.call("VM.power_state_reset", vm.Ref)
		return err
	})
	s.cmds["vm-reset-powerstate"].Run = forcedOnly(s.cmds["vm-reset-powerstate"].Run)
	s.vmCommand("vm-vcpu-hotplug", "Sets the number of VCPUs of the selected running VMs to new-vcpus.", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			n, err := strconv.ParseInt(strings.TrimSpace(c.require("new-vcpus")), 10, 64)
			if err != nil {
				return failf("Failed to parse parameter 'new-vcpus': expecting an integer")
			}
			_, err = c.call("VM.set_VCPUs_number_live", vm.Ref, n)
			return err
		})
	s.vmCommand("vm-checkpoint", "Checkpoints the selected VM (disks and memory) and prints the checkpoint's uuid.",
		selectOpts{}, func(c *Ctx, vm *db.Row) error {
			ref, err := c.call("VM.checkpoint", vm.Ref, c.require("new-name-label"))
			if err != nil {
				return err
			}
			return c.finishNewVM(ref.(string))
		})
}

// genericBIOS are the BIOS strings of a VM not made to look like a
// particular machine (xapi's generic set).
var genericBIOS = map[string]string{
	"bios-vendor": "Xen", "bios-version": "", "system-manufacturer": "Xen", "system-product-name": "HVM domU",
	"system-version": "", "system-serial-number": "", "baseboard-manufacturer": "", "baseboard-product-name": "",
	"baseboard-version": "", "baseboard-serial-number": "", "baseboard-asset-tag": "", "baseboard-location-in-chassis": "",
	"enclosure-asset-tag": "", "hp-rombios": "", "oem-1": "Xen", "oem-2": "MS_VM_CERT/SHA1/bdbeb6e0a816d43fa6d3fe8aaef04c2bad9d3e3d",
}

// forcedOnly wraps a command that refuses to run without --force.
func forcedOnly(run func(*Ctx) error) func(*Ctx) error {
	return func(c *Ctx) error {
		force, err := c.boolParam("force")
		if err != nil {
			return err
		}
		if !force {
			return failf("%s", noForceMsg)
		}
		return run(c)
	}
}

// addMemoryCommands registers vm-memory-*: each parses byte sizes (with
// suffixes) and calls one setter on the selected VMs, as xapi's do.
func (s *Server) addMemoryCommands() {
	withCtl := selectOpts{controlDomains: true}
	withAll := selectOpts{controlDomains: true, templates: true}
	sizes := func(c *Ctx, names ...string) ([]any, error) {
		out := make([]any, len(names))
		for i, n := range names {
			v, err := parseBytes(n, c.require(n))
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	set := func(name, help, method string, o selectOpts, params ...string) {
		s.vmCommand(name, help, o, func(c *Ctx, vm *db.Row) error {
			args, err := sizes(c, params...)
			if err != nil {
				return err
			}
			_, err = c.call(method, append([]any{vm.Ref}, args...)...)
			return err
		})
	}
	set("vm-memory-set", "Sets every memory limit of the selected VMs to memory (bytes, or with a suffix).",
		"VM.set_memory", withAll, "memory")
	set("vm-memory-limits-set", "Sets the four memory limits of the selected VMs at once.", "VM.set_memory_limits", withAll,
		"static-min", "static-max", "dynamic-min", "dynamic-max")
	set("vm-memory-dynamic-range-set", "Sets the dynamic memory range (min, max) of the selected VMs.",
		"VM.set_memory_dynamic_range", withAll, "min", "max")
	set("vm-memory-static-range-set", "Sets the static memory range (min, max) of the selected halted VMs.",
		"VM.set_memory_static_range", withAll, "min", "max")
	target := func(name, help, param string) {
		s.vmCommand(name, help, withCtl, func(c *Ctx, vm *db.Row) error {
			t, err := parseBytes(param, c.require(param))
			if err != nil {
				return err
			}
			_, err = c.call("VM.set_memory_dynamic_range", vm.Ref, t, t)
			return err
		})
	}
	target("vm-memory-target-set", "Sets the memory target of the selected VMs: both ends of the dynamic range.", "target")
	target("vm-memory-balloon", "Balloons the selected VMs to target: both ends of the dynamic range.", "target")
	s.vmCommand("vm-memory-shadow-multiplier-set", "Sets the shadow memory multiplier of the selected running VMs.",
		withCtl, func(c *Ctx, vm *db.Row) error {
			m, err := strconv.ParseFloat(strings.TrimSpace(c.require("multiplier")), 64)
			if err != nil {
				return failf("Failed to parse parameter 'multiplier': expecting a number")
			}
			_, err = c.call("VM.set_shadow_multiplier_live", vm.Ref, m)
			return err
		})
	s.vmCommand("vm-memory-target-wait", "Waits until the memory of the selected running VMs reaches their target.",
		withCtl, func(c *Ctx, vm *db.Row) error {
			_, err := c.call("VM.wait_memory_target_live", vm.Ref)
			return err
		})
	s.vmCommand("vm-compute-memory-overhead", "Prints the memory overhead of the selected VMs, in bytes.", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			v, err := c.call("VM.compute_memory_overhead", vm.Ref)
			if err != nil {
				return err
			}
			c.out.msg(fmt.Sprint(v))
			return nil
		})
	s.vmCommand("vm-compute-maximum-memory", "Prints the most memory the selected VM could be given on its host "+
		"(total=<bytes> of free memory to assume; --approximate allows more than the VM's static maximum).", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			total, err := parseBytes("total", c.require("total"))
			if err != nil {
				return err
			}
			approx, err := c.boolParam("approximate")
			if err != nil {
				return err
			}
			v, err := c.call("VM.maximise_memory", vm.Ref, total, approx)
			if err != nil {
				return err
			}
			c.out.msg(fmt.Sprint(v))
			return nil
		})
}

// addSnapshotCommands registers the snapshot- and template- commands.
func (s *Server) addSnapshotCommands() {
	onSnap := func(name, help string, run func(c *Ctx, snap *db.Row) error) {
		s.register(name, help, func(c *Ctx) error {
			snap, err := c.snapshotRow()
			if err != nil {
				return err
			}
			return run(c, snap)
		})
	}
	onSnap("snapshot-revert", "Reverts the VM a snapshot (snapshot-uuid or uuid) was taken of to that snapshot.",
		func(c *Ctx, snap *db.Row) error {
			_, err := c.call("VM.revert", snap.Ref)
			return err
		})
	newFrom := func(c *Ctx, snap *db.Row, method string, extra ...any) error {
		args := append([]any{snap.Ref, c.require("new-name-label")}, extra...)
		ref, err := c.call(method, args...)
		if err != nil {
			return err
		}
		return c.finishNewVM(ref.(string))
	}
	onSnap("snapshot-clone", "Makes a new template from a snapshot with fast disk clones, and prints its uuid.",
		func(c *Ctx, snap *db.Row) error { return newFrom(c, snap, "VM.clone") })
	onSnap("snapshot-copy", "Makes a new template from a snapshot with full disk copies (to sr-uuid if given), "+
		"and prints its uuid.", func(c *Ctx, snap *db.Row) error {
		sr, err := c.refOf(dm.SR.Class, c.paramOr("sr-uuid", ""))
		if err != nil {
			return err
		}
		return newFrom(c, snap, "VM.copy", sr)
	})
	onSnap("snapshot-destroy", "Destroys a snapshot, leaving its disks.", func(c *Ctx, snap *db.Row) error {
		if snap.String(dm.VM.PowerState) != string(dm.VMPowerStateHalted) {
			if _, err := c.call("VM.hard_shutdown", snap.Ref); err != nil {
				return err
			}
		}
		_, err := c.call("VM.destroy", snap.Ref)
		return err
	})
	onSnap("snapshot-reset-powerstate", "Records a snapshot as halted (--force required).", func(c *Ctx, snap *db.Row) error {
		_, err := c.call("VM.power_state_reset", snap.Ref)
		return err
	})
	s.cmds["snapshot-reset-powerstate"].Run = forcedOnly(s.cmds["snapshot-reset-powerstate"].Run)
	onSnap("snapshot-uninstall", "Destroys a snapshot and the disks it owns; asks first unless --force is given.",
		func(c *Ctx, snap *db.Row) error { return c.uninstallOwned([]*db.Row{snap}) })
	s.register("template-uninstall", "Destroys a custom template and the disks it owns; asks first unless --force is given.",
		func(c *Ctx) error {
			id := c.require("template-uuid")
			ref, err := c.objectRef(dm.VM.Class, id)
			if err != nil {
				return err
			}
			row, ok := c.s.api.DB.Snapshot().Get(dm.VM.Class, ref)
			if !ok || row.Get(dm.VM.IsATemplate) != true {
				return failf("This operation can only be performed on a VM template. %s is not a VM template.", id)
			}
			return c.uninstallOwned([]*db.Row{row})
		})
}

// snapshotRow is the snapshot named by snapshot-uuid or uuid.
func (c *Ctx) snapshotRow() (*db.Row, error) {
	id, ok := c.param("snapshot-uuid")
	if !ok {
		if id, ok = c.param("uuid"); !ok {
			return nil, failf("Required parameter not found: snapshot-uuid or uuid.")
		}
	}
	ref, err := c.objectRef(dm.VM.Class, id)
	if err != nil {
		return nil, err
	}
	row, ok := c.s.api.DB.Snapshot().Get(dm.VM.Class, ref)
	if !ok || row.Get(dm.VM.IsASnapshot) != true {
		return nil, failf("This operation can only be performed on a VM snapshot. %s is not a VM snapshot.", id)
	}
	return row, nil
}

// uninstallOwned destroys VMs and the disks they own (VBDs marked with
// ownerKey, and a suspend image), after listing them and asking (unless
// --force), as xapi's uninstall does.
func (c *Ctx) uninstallOwned(vms []*db.Row) error {
	snap := c.s.api.DB.Snapshot()
	type plan struct {
		vm   *db.Row
		vdis []string
	}
	var plans []plan
	var lines []string
	vdiLine := func(vdi *db.Row) string {
		shared := ""
		if len(strs(snap.Value(vdi, dm.VDI.VBDs))) > 1 {
			shared = " ** WARNING: disk is shared by other VMs"
		}
		return fmt.Sprintf("VDI: %s (%s) %s", vdi.UUID(), vdi.String(dm.VDI.NameLabel), shared)
	}
	for _, vm := range vms {
		p := plan{vm: vm}
		lines = append(lines, fmt.Sprintf("VM : %s (%s)", vm.UUID(), vm.String(dm.VM.NameLabel)))
		for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
			vbd, ok := snap.Get(dm.VBD.Class, ref)
			if !ok {
				continue
			}
			oc, _ := vbd.Get(dm.VBD.OtherConfig).(map[string]string)
			if _, owned := oc[ownerKey]; !owned {
				continue
			}
			if vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI)); ok {
				p.vdis = append(p.vdis, vdi.Ref)
				lines = append(lines, vdiLine(vdi))
			}
		}
		if vdi, ok := snap.Get(dm.VDI.Class, vm.String(dm.VM.SuspendVDI)); ok {
			p.vdis = append(p.vdis, vdi.Ref)
			lines = append(lines, vdiLine(vdi))
		}
		plans = append(plans, p)
	}
	c.out.msg("The following items are about to be destroyed")
	for _, l := range lines {
		c.out.msg(l)
	}
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	if !force {
		yes, err := c.confirm()
		if err != nil || !yes {
			return err
		}
	}
	for _, p := range plans {
		if p.vm.String(dm.VM.PowerState) != string(dm.VMPowerStateHalted) {
			if _, err := c.call("VM.hard_shutdown", p.vm.Ref); err != nil {
				return err
			}
		}
		if _, err := c.call("VM.destroy", p.vm.Ref); err != nil {
			return err
		}
		for _, vdi := range p.vdis {
			if _, err := c.call("VDI.destroy", vdi); err != nil {
				return err
			}
		}
	}
	c.out.msg("All objects destroyed")
	return nil
}

// vmDiskAdd makes a disk and attaches it to a VM as its own (plugged at
// once if the VM runs); the disk is destroyed again if that fails.
func (c *Ctx) vmDiskAdd(vm *db.Row) error {
	size, err := parseBytes("disk-size", c.require("disk-size"))
	if err != nil {
		return err
	}
	sr := c.paramOr("sr-uuid", "")
	if sr == "" {
		if sr = c.defaultSR(); sr == "" {
			return failf("No default Pool SR set; you must specify an SR on the commandline")
		}
	}
	srRef, err := c.objectRef(dm.SR.Class, sr)
	if err != nil {
		return err
	}
	const label = "Created by xe"
	rec := map[string]any{
		"SR": srRef, "name_label": label, "name_description": label, "virtual_size": size, "type": string(dm.VDITypeUser),
		"sharable": false, "read_only": false, "other_config": map[string]string{}, "xenstore_data": map[string]string{},
		"sm_config": map[string]string{"vmhint": vm.UUID()}, "tags": []string{},
	}
	vdi, err := c.call("VDI.create", rec)
	if err != nil {
		return err
	}
	if err := c.addVBD(vm, vdi.(string), c.require("device"), dm.VBDTypeDisk, dm.VBDModeRW, true); err != nil {
		if _, derr := c.call("VDI.destroy", vdi); derr != nil {
			c.s.log.Warn("cli: vm-disk-add: destroying the new disk", "err", derr)
		}
		return err
	}
	return nil
}

// defaultSR is the uuid of the pool's default SR, or "".
func (c *Ctx) defaultSR() string {
	snap := c.s.api.DB.Snapshot()
	for _, p := range snap.All(dm.Pool.Class) {
		if sr, ok := snap.Get(dm.SR.Class, p.String(dm.Pool.DefaultSR)); ok {
			return sr.UUID()
		}
	}
	return ""
}

// addVBD attaches a disk or CD to a VM and plugs it if the VM is
// running, as xapi's create_vbd_and_plug does (a failed plug leaves the
// drive unplugged). owned marks the disk as
// the VM's (destroyed with it by uninstall).
func (c *Ctx) addVBD(vm *db.Row, vdi, device string, typ dm.VBDType, mode dm.VBDMode, owned bool) error {
	oc := map[string]string{}
	if owned {
		oc[ownerKey] = ""
	}
	rec := map[string]any{
		"VM": vm.Ref, "VDI": vdi, "userdevice": device, "bootable": false, "mode": string(mode), "type": string(typ),
		"unpluggable": true, "empty": vdi == schema.NullRef, "other_config": oc,
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
	}
	vbd, err := c.call("VBD.create", rec)
	if err != nil {
		return err
	}
	// As in xapi, a drive that cannot be hot-plugged stays, unplugged.
	if row, ok := c.s.api.DB.Snapshot().Get(dm.VM.Class, vm.Ref); ok && row.String(dm.VM.PowerState) == string(dm.VMPowerStateRunning) {
		if _, err := c.call("VBD.plug", vbd); err != nil {
			c.s.log.Debug("cli: the new VBD was not hot-plugged", "vm", vm.UUID(), "err", err)
		}
	}
	return nil
}

// vbdAt is a VM's VBD at a userdevice.
func (c *Ctx) vbdAt(vm *db.Row, device string) (*db.Row, bool) {
	snap := c.s.api.DB.Snapshot()
	for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
		if vbd, ok := snap.Get(dm.VBD.Class, ref); ok && vbd.String(dm.VBD.Userdevice) == device {
			return vbd, true
		}
	}
	return nil, false
}

// cdDrives are a VM's CD drives (only the empty ones if empty).
func (c *Ctx) cdDrives(vm *db.Row, empty bool) []*db.Row {
	snap := c.s.api.DB.Snapshot()
	var out []*db.Row
	for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if ok && vbd.String(dm.VBD.Type) == string(dm.VBDTypeCD) && (!empty || vbd.Get(dm.VBD.Empty) == true) {
			out = append(out, vbd)
		}
	}
	return out
}

// isoVDIs are the disks called name on ISO SRs.
func (c *Ctx) isoVDIs(name string) ([]*db.Row, error) {
	res, err := c.call("VDI.get_by_name_label", name)
	if err != nil {
		return nil, err
	}
	snap := c.s.api.DB.Snapshot()
	var out []*db.Row
	for _, ref := range strs(res) {
		vdi, ok := snap.Get(dm.VDI.Class, ref)
		if !ok {
			continue
		}
		if sr, ok := snap.Get(dm.SR.Class, vdi.String(dm.VDI.SR)); ok && sr.String(dm.SR.ContentType) == "iso" {
			out = append(out, vdi)
		}
	}
	return out, nil
}

// diskList prints a VM's disks (or CD drives): each VBD, then its VDI if
// it has one, under "Disk N VBD:" and "Disk N VDI:" headings.
func (c *Ctx) diskList(vm *db.Row, cds bool) error {
	snap := c.s.api.DB.Snapshot()
	fm := formatter{snap}
	vbdView, vdiView := c.s.classes["vbd"], c.s.classes["vdi"]
	vbdDefaults, what := []string{"uuid", "vm-name-label", "userdevice"}, "Disk "
	typ := string(dm.VBDTypeDisk)
	if cds {
		vbdDefaults, what, typ = append(vbdDefaults, "empty"), "CD ", string(dm.VBDTypeCD)
	}
	vbdOnly := c.pickFields(vbdView, "vbd-params", vbdDefaults)
	vdiOnly := c.pickFields(vdiView, "vdi-params", []string{"uuid", "name-label", "virtual-size", "sr-name-label"})
	n := 0
	for _, ref := range strs(snap.Value(vm, dm.VM.VBDs)) {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if !ok || vbd.String(dm.VBD.Type) != typ {
			continue
		}
		head := what + strconv.Itoa(n)
		c.out.msg(head + " VBD:")
		c.out.table([][]field{fm.record(vbdView, vbd, vbdOnly)})
		if vbd.Get(dm.VBD.Empty) != true {
			if vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI)); ok {
				c.out.msg(head + " VDI:")
				c.out.table([][]field{fm.record(vdiView, vdi, vdiOnly)})
			}
		}
		n++
	}
	return nil
}

// pickFields is the set of fields a record shows: those the parameter
// key names (all: every field), or the defaults.
func (c *Ctx) pickFields(v *classView, key string, defaults []string) map[string]bool {
	names := defaults
	if p, ok := c.param(key); ok {
		if p == "all" {
			return nil
		}
		names = strings.Split(p, ",")
	}
	only := make(map[string]bool, len(names))
	for _, n := range names {
		if fv := v.lookup(strings.TrimSpace(n)); fv != nil {
			only[fv.name] = true
		}
	}
	return only
}

// strs reads a set of refs or strings.
func strs(v any) []string {
	s, _ := v.([]string)
	return s
}
