package cli

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/cli/proto"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// startOn runs VM.start or VM.resume (op) on a VM with --force, or its
// _on form when on=<host> chooses where.
func (c *Ctx) startOn(vm *db.Row, op string, paused bool) error {
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	if on, ok := c.param("on"); ok {
		host, err := c.hostRef(on)
		if err != nil {
			return err
		}
		_, err = c.call(op+"_on", vm.Ref, host, paused, force)
		return err
	}
	_, err = c.call(op, vm.Ref, paused, force)
	return err
}

// addCommands registers the commands written by hand.
func (s *Server) addCommands() {
	s.register("help", "Shows how to use xe: with a command name, that command's parameters; "+
		"with --all, every command.", s.help, func(c *Command) {
		c.positional, c.noSession, c.anyParams = true, true, true
		c.Flags = flagStandard
	})

	// VM lifecycle: these act on the VMs the selectors pick.
	s.addVMPowerCommands()
	s.addVMCopyCommands()
	s.addVMInstallCommands()

	s.addNetworkStorageCommands()
	s.addDeviceCommands()
	s.addUtilityCommands()
	s.addMessageCommands()
}

// addVMPowerCommands registers the commands that start, stop, reboot,
// suspend, resume and pause VMs.
func (s *Server) addVMPowerCommands() {
	s.vmCommand("vm-start", "Starts the selected VMs (on=<host> to choose where, --paused to leave them paused).", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			paused, err := c.boolParam("paused")
			if err != nil {
				return err
			}
			return c.startOn(vm, "VM.start", paused)
		})
	s.vmCommand("vm-shutdown", "Shuts the selected VMs down: cleanly, or at once with --force.", selectOpts{},
		func(c *Ctx, vm *db.Row) error { return c.forced(vm, "VM.hard_shutdown", "VM.clean_shutdown") })
	s.vmCommand("vm-reboot", "Reboots the selected VMs: cleanly, or at once with --force.", selectOpts{},
		func(c *Ctx, vm *db.Row) error { return c.forced(vm, "VM.hard_reboot", "VM.clean_reboot") })
	s.vmCommand("vm-suspend", "Suspends the selected VMs to disk.", selectOpts{},
		func(c *Ctx, vm *db.Row) error { _, err := c.call("VM.suspend", vm.Ref); return err })
	s.vmCommand("vm-resume", "Resumes the selected suspended VMs (on=<host> to choose where).", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			return c.startOn(vm, "VM.resume", false)
		})
	s.vmCommand("vm-pause", "Pauses the selected running VMs.", selectOpts{},
		func(c *Ctx, vm *db.Row) error { _, err := c.call("VM.pause", vm.Ref); return err })
	s.vmCommand("vm-unpause", "Unpauses the selected paused VMs.", selectOpts{},
		func(c *Ctx, vm *db.Row) error { _, err := c.call("VM.unpause", vm.Ref); return err })
}

// addVMCopyCommands registers the commands that clone, copy and
// snapshot VMs.
func (s *Server) addVMCopyCommands() {
	s.vmCommand("vm-clone", "Clones the selected VM, fast where the storage allows, and prints the new VM's uuid.", selectOpts{templates: true},
		func(c *Ctx, vm *db.Row) error {
			ref, err := c.call("VM.clone", vm.Ref, c.require("new-name-label"))
			if err != nil {
				return err
			}
			return c.finishNewVM(ref.(string))
		})
	s.vmCommand("vm-copy", "Copies the selected VM, with full copies of its disks (to sr-uuid if given), and prints the new VM's uuid.",
		selectOpts{templates: true},
		func(c *Ctx, vm *db.Row) error {
			sr, err := c.refOf(dm.SR.Class, c.paramOr("sr-uuid", ""))
			if err != nil {
				return err
			}
			ref, err := c.call("VM.copy", vm.Ref, c.require("new-name-label"), sr)
			if err != nil {
				return err
			}
			return c.finishNewVM(ref.(string))
		})
	s.vmCommand("vm-snapshot", "Snapshots the selected VM and prints the snapshot's uuid.", selectOpts{},
		func(c *Ctx, vm *db.Row) error {
			ignore, err := c.objectRefs(dm.VDI.Class, "ignore-vdi-uuids")
			if err != nil {
				return err
			}
			ref, err := c.call("VM.snapshot", vm.Ref, c.require("new-name-label"), ignore)
			if err != nil {
				return err
			}
			return c.finishNewVM(ref.(string))
		})
}

// addVMInstallCommands registers the commands that install, uninstall
// and destroy VMs.
func (s *Server) addVMInstallCommands() {
	s.vmCommand("vm-uninstall", "Destroys the selected VM and the disks only it uses. Asks for confirmation unless --force is given.",
		selectOpts{}, func(c *Ctx, vm *db.Row) error { return c.uninstall(vm) })
	s.register("vm-destroy", "Removes the VM with this uuid from the database, leaving its disks.", func(c *Ctx) error {
		ref, err := c.objectRef(dm.VM.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		_, err = c.call("VM.destroy", ref)
		return err
	})
	s.register("vm-install", "Installs a new VM from a template (template=<name or uuid>), with its disks on "+
		"sr-uuid or sr-name-label (default: the pool's default SR), and prints its uuid.", s.vmInstall)
}

// addNetworkStorageCommands registers the commands that create and
// destroy networks, SRs and disks, rescan SRs, and copy a disk's data to
// and from a local file.
func (s *Server) addNetworkStorageCommands() {
	s.register("network-create", "Creates a network and prints its uuid.", s.networkCreate)
	s.register("network-destroy", "Destroys the network with this uuid.", c1("network.destroy", dm.Network.Class))
	s.register("sr-create", "Creates a storage repository of a type (device-config:<key>=<value> for its settings) "+
		"and prints its uuid.", s.srCreate)
	s.register("sr-scan", "Rescans the storage repository with this uuid for disks.", c1("SR.scan", dm.SR.Class))
	s.register("vdi-create", "Creates a disk on a storage repository (virtual-size in bytes, or with a suffix: KiB, MiB, GiB, TiB) "+
		"and prints its uuid.", s.vdiCreate,
		params([]string{"sr-uuid", "name-label", "virtual-size"}, []string{"sm-config:", "sharable", "tags:", "type", "name-description"}))
	s.register("vdi-destroy", "Destroys the disk with this uuid and its data.", c1("VDI.destroy", dm.VDI.Class))
	s.register("vdi-import", "Writes a local file into the disk with this uuid (format=raw by default), uploading it over HTTP.",
		func(c *Ctx) error { return c.vdiTransfer(true) })
	s.register("vdi-export", "Reads the disk with this uuid into a new local file (format=raw by default), downloading it over HTTP.",
		func(c *Ctx) error { return c.vdiTransfer(false) })
}

// networkCreate is network-create.
func (s *Server) networkCreate(c *Ctx) error {
	mtu, err := c.parseValue(schema.Int, c.paramOr("MTU", "1500"), "MTU")
	if err != nil {
		return err
	}
	managed, err := c.boolParamOr("managed", true)
	if err != nil {
		return err
	}
	rec := map[string]any{
		"name_label": c.require("name-label"), "name_description": c.paramOr("name-description", ""),
		"MTU": mtu, "bridge": c.paramOr("bridge", ""), "managed": managed, "other_config": map[string]string{},
	}
	return c.create("network.create", rec)
}

// srCreate is sr-create: on host-uuid, or this host.
func (s *Server) srCreate(c *Ctx) error {
	host := c.s.api.Cfg.HostRef
	if u, ok := c.param("host-uuid"); ok {
		var err error
		if host, err = c.objectRef(dm.Host.Class, u); err != nil {
			return err
		}
	}
	size, err := c.parseValue(schema.Int, c.paramOr("physical-size", "0"), "physical-size")
	if err != nil {
		return err
	}
	shared, err := c.boolParam("shared")
	if err != nil {
		return err
	}
	ref, err := c.call("SR.create", host, c.mapParams("device-config"), size, c.require("name-label"),
		c.paramOr("name-description", ""), c.require("type"), c.paramOr("content-type", ""), shared, c.mapParams("sm-config"))
	if err != nil {
		return err
	}
	return c.printUUID(dm.SR.Class, ref)
}

// vdiCreate is vdi-create: tags:<tag>= gives the disk its tags.
func (s *Server) vdiCreate(c *Ctx) error {
	sr, err := c.objectRef(dm.SR.Class, c.require("sr-uuid"))
	if err != nil {
		return err
	}
	size, err := parseBytes("virtual-size", c.require("virtual-size"))
	if err != nil {
		return err
	}
	sharable, err := c.boolParam("sharable")
	if err != nil {
		return err
	}
	typ, err := c.parseValue(dm.VDI.Type.Type, c.paramOr("type", "user"), "type")
	if err != nil {
		return err
	}
	tags := []string{}
	for k := range c.mapParams("tags") {
		tags = append(tags, k)
	}
	rec := map[string]any{
		"SR": sr, "name_label": c.require("name-label"), "name_description": c.paramOr("name-description", ""),
		"virtual_size": size, "type": typ, "sharable": sharable, "read_only": false,
		"other_config": map[string]string{}, "sm_config": c.mapParams("sm-config"), "tags": tags,
	}
	return c.create("VDI.create", rec)
}

// addDeviceCommands registers the commands that create VBDs and VIFs and
// plug and unplug VBDs.
func (s *Server) addDeviceCommands() {
	s.register("vbd-create", "Creates a virtual block device: attaches a disk (vdi-uuid) to a VM as a device "+
		"(type=Disk or CD, mode=RW or RO), and prints its uuid.", s.vbdCreate)
	s.register("vbd-plug", "Hot-plugs the virtual block device with this uuid into its running VM.", c1("VBD.plug", dm.VBD.Class))
	s.register("vbd-unplug", "Hot-unplugs the virtual block device with this uuid (--force: without the guest's cooperation).",
		func(c *Ctx) error {
			ref, err := c.objectRef(dm.VBD.Class, c.require("uuid"))
			if err != nil {
				return err
			}
			force, err := c.boolParam("force")
			if err != nil {
				return err
			}
			if force {
				_, err = c.call("VBD.unplug_force", ref)
			} else {
				_, err = c.call("VBD.unplug", ref)
			}
			return err
		})
	s.register("vif-create", "Creates a virtual network interface for a VM on a network and prints its uuid "+
		"(mac=random or omitted: one is generated).", s.vifCreate)
}

// addUtilityCommands registers the commands on tasks, events, the
// caller's password, VM consoles and the pool database.
func (s *Server) addUtilityCommands() {
	s.register("task-cancel", "Asks the task with this uuid to stop.", c1("task.cancel", dm.Task.Class))
	s.register("event-wait", "Waits until an object of a class (class=vm, host, ...) has every field=value given "+
		"(field=/=value: differs), then returns.", s.eventWait, func(c *Command) {
		c.accepts = func(*Ctx, string) (bool, error) { return true, nil }
	})
	s.register("user-password-change", "Changes the password of the account the command runs as.", func(c *Ctx) error {
		_, err := c.call("session.change_password", c.paramOr("old", ""), c.require("new"))
		return err
	})
	s.register("console", "Attaches to the text console of the selected VM; Ctrl-] detaches.", s.console)
	s.register("pool-dump-database", "Downloads the pool database, in xapi's state.db format, into a new local file.",
		func(c *Ctx) error {
			_, err := c.transfer(false, c.require("file-name"), "/pool/xmldbdump", nil, "Dump database")
			return err
		})
	s.register("pool-restore-database", "Replaces the pool database with one from a local file made by pool-dump-database.",
		s.restoreDatabase)
}

// addMessageCommands registers the commands that create and destroy
// messages.
func (s *Server) addMessageCommands() {
	s.register("message-create", "Creates a message (an alert) about a VM, host, SR or the pool.", s.messageCreate)
	s.register("message-destroy", "Destroys the messages given by uuid or uuids (a comma-separated list).", s.messageDestroy)
}

// messageCreate is message-create: about the object of the first of
// vm-uuid, pool-uuid, sr-uuid and host-uuid given.
func (s *Server) messageCreate(c *Ctx) error {
	prio, err := strconv.ParseInt(c.require("priority"), 10, 64)
	if err != nil {
		return failf("Priority field should be an integer")
	}
	var cls, id string
	for _, k := range []struct{ param, cls string }{{"vm-uuid", "VM"}, {"pool-uuid", "Pool"}, {"sr-uuid", "SR"}, {"host-uuid", "Host"}} {
		if v, ok := c.param(k.param); ok {
			cls, id = k.cls, v
			break
		}
	}
	if cls == "" {
		return failf("Need one of: vm-uuid, host-uuid, sr-uuid or pool-uuid")
	}
	_, err = c.call("message.create", c.require("name"), prio, cls, id, c.require("body"))
	return err
}

// messageDestroy is message-destroy: uuid= or uuids=, not both.
func (s *Server) messageDestroy(c *Ctx) error {
	one, hasOne := c.param("uuid")
	many, hasMany := c.param("uuids")
	var ids []string
	switch {
	case hasOne && hasMany:
		return failf("Ambiguous arguments; need one of uuid, uuids")
	case hasOne:
		ids = []string{one}
	case hasMany:
		ids = strings.Split(many, ",")
	default:
		return failf("Need one of uuid, uuids")
	}
	refs := make([]string, 0, len(ids))
	for _, id := range ids {
		ref, err := c.call("message.get_by_uuid", id)
		if err != nil {
			return err
		}
		refs = append(refs, ref.(string))
	}
	_, err := c.call("message.destroy_many", refs)
	return err
}

// c1 is a command that calls one method on the object named by uuid.
func c1(method string, cls *schema.Class) func(*Ctx) error {
	return func(c *Ctx) error {
		ref, err := c.objectRef(cls, c.require("uuid"))
		if err != nil {
			return err
		}
		_, err = c.call(method, ref)
		return err
	}
}

// c2 is c1 for a method that also takes a second object: the one the
// parameter param names by uuid, of class other.
func c2(method string, cls *schema.Class, param string, other *schema.Class) func(*Ctx) error {
	return func(c *Ctx) error {
		ref, err := c.objectRef(cls, c.require("uuid"))
		if err != nil {
			return err
		}
		ref2, err := c.objectRef(other, c.require(param))
		if err != nil {
			return err
		}
		_, err = c.call(method, ref, ref2)
		return err
	}
}

// forced calls one method with --force and the other without.
func (c *Ctx) forced(vm *db.Row, hard, clean string) error {
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	m := clean
	if force {
		m = hard
	}
	_, err = c.call(m, vm.Ref)
	return err
}

// create calls a constructor with a record and prints the new object's
// uuid.
func (c *Ctx) create(method string, rec map[string]any) error {
	ref, err := c.call(method, rec)
	if err != nil {
		return err
	}
	return c.printUUID(c.s.api.Model.Message(method).Class, ref)
}

func (c *Ctx) printUUID(cls *schema.Class, ref any) error {
	r, _ := ref.(string)
	row, ok := c.s.api.DB.Snapshot().Get(cls, r)
	if !ok {
		return xerr.New(xerr.HandleInvalid, cls.Name, r)
	}
	c.out.list(row.UUID())
	return nil
}

// finishNewVM gives a cloned, copied or snapshotted VM its description
// and prints its uuid.
func (c *Ctx) finishNewVM(ref string) error {
	if d, ok := c.param("new-name-description"); ok {
		if _, err := c.call("VM.set_name_description", ref, d); err != nil {
			return err
		}
	}
	return c.printUUID(dm.VM.Class, ref)
}

// hostRef finds a host by uuid, name or hostname.
func (c *Ctx) hostRef(s string) (string, error) {
	v := c.s.classes["host"]
	rows, err := c.allRows(v)
	if err != nil {
		return "", err
	}
	for _, r := range rows {
		if r.UUID() == s || r.String(dm.Host.NameLabel) == s || r.String(dm.Host.Hostname) == s {
			return r.Ref, nil
		}
	}
	return "", failf("Host %s not found", s)
}

var srAttr = regexp.MustCompile(`sr="[^"]*"`)

// vmInstall makes a VM from a template: a clone, its disks provisioned.
func (s *Server) vmInstall(c *Ctx) error {
	want, ok := c.param("template")
	if !ok {
		return missingParam("template")
	}
	rows, err := c.allRows(s.classes["template"])
	if err != nil {
		return err
	}
	var matches []*db.Row
	for _, r := range rows {
		if r.Get(dm.VM.IsATemplate) == true && (r.UUID() == want || r.String(dm.VM.NameLabel) == want) {
			matches = append(matches, r)
		}
	}
	switch len(matches) {
	case 0:
		return failf("Template '%s' not found", want)
	case 1:
	default:
		return failf("More than one template is called '%s': give its uuid", want)
	}
	sr := ""
	switch {
	case c.paramOr("sr-uuid", "") != "":
		if _, err := c.objectRef(dm.SR.Class, c.require("sr-uuid")); err != nil {
			return err
		}
		sr = c.require("sr-uuid")
	case c.paramOr("sr-name-label", "") != "":
		srs := c.s.api.DB.Snapshot().ByNameLabel(dm.SR.Class, c.require("sr-name-label"))
		if len(srs) != 1 {
			return failf("Expected exactly one SR called '%s', found %d", c.require("sr-name-label"), len(srs))
		}
		sr = srs[0].UUID()
	}
	res, err := c.call("VM.clone", matches[0].Ref, c.require("new-name-label"))
	if err != nil {
		return err
	}
	vm := res.(string)
	if sr != "" {
		// The template's provisioning spec names the SR of each disk.
		row, _ := c.s.api.DB.Snapshot().Get(dm.VM.Class, vm)
		if oc, _ := row.Get(dm.VM.OtherConfig).(map[string]string); oc["disks"] != "" {
			disks := srAttr.ReplaceAllString(oc["disks"], `sr="`+sr+`"`)
			if _, err := c.call("VM.remove_from_other_config", vm, "disks"); err != nil {
				return err
			}
			if _, err := c.call("VM.add_to_other_config", vm, "disks", disks); err != nil {
				return err
			}
		}
	}
	if _, err := c.call("VM.provision", vm); err != nil {
		return err
	}
	if row, ok := c.s.api.DB.Snapshot().Get(dm.VM.Class, vm); ok && row.Get(dm.VM.IsATemplate) == true {
		if _, err := c.call("VM.set_is_a_template", vm, false); err != nil {
			return err
		}
	}
	return c.printUUID(dm.VM.Class, vm)
}

// uninstall destroys a VM and the disks no other VM uses, after asking.
func (c *Ctx) uninstall(vm *db.Row) error {
	snap := c.s.api.DB.Snapshot()
	var vdis []*db.Row
	vbds, _ := snap.Value(vm, dm.VM.VBDs).([]string)
	for _, ref := range vbds {
		vbd, ok := snap.Get(dm.VBD.Class, ref)
		if !ok || vbd.String(dm.VBD.Type) != string(dm.VBDTypeDisk) {
			continue
		}
		vdi, ok := snap.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI))
		if !ok {
			continue
		}
		shared := false
		users, _ := snap.Value(vdi, dm.VDI.VBDs).([]string)
		for _, u := range users {
			if other, ok := snap.Get(dm.VBD.Class, u); ok && other.String(dm.VBD.VM) != vm.Ref {
				shared = true
			}
		}
		if !shared {
			vdis = append(vdis, vdi)
		}
	}
	force, err := c.boolParam("force")
	if err != nil {
		return err
	}
	if !force {
		c.out.msg("The following items are about to be destroyed")
		c.out.msg(fmt.Sprintf("VM : %s (%s)", vm.UUID(), vm.String(dm.VM.NameLabel)))
		for _, v := range vdis {
			c.out.msg(fmt.Sprintf("VDI: %s (%s)", v.UUID(), v.String(dm.VDI.NameLabel)))
		}
		yes, err := c.confirm()
		if err != nil || !yes {
			return err
		}
	}
	if _, err := c.call("VM.destroy", vm.Ref); err != nil {
		return err
	}
	for _, v := range vdis {
		if _, err := c.call("VDI.destroy", v.Ref); err != nil {
			return err
		}
	}
	return nil
}

// confirm asks the user to type "yes".
func (c *Ctx) confirm() (bool, error) {
	c.conn.Send(proto.Print("Type 'yes' to continue"))
	c.conn.Send(proto.Prompt())
	answer, err := c.conn.ReadBlob(4096)
	if err != nil {
		return false, err
	}
	if strings.ToLower(strings.TrimSpace(string(answer))) == "yes" {
		return true, nil
	}
	c.conn.Send(proto.Print("Aborted (you typed: '" + string(answer) + "')"))
	return false, nil
}

// parseBytes reads a size: a number of bytes, or a number with a binary
// suffix (KiB, MiB, GiB, TiB; K, M, G, T alone mean the same).
func parseBytes(name, s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffixes []string
		m        int64
	}{
		{[]string{"KiB", "K", "k", "KB", "kB"}, 1 << 10}, {[]string{"MiB", "M", "MB"}, 1 << 20},
		{[]string{"GiB", "G", "GB"}, 1 << 30}, {[]string{"TiB", "T", "TB"}, 1 << 40},
	} {
		for _, suf := range u.suffixes {
			if rest, ok := strings.CutSuffix(t, suf); ok && rest != "" {
				t, mult = strings.TrimSpace(rest), u.m
				goto parse
			}
		}
	}
parse:
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, failf("Parameter %s must be a size in bytes, optionally with a suffix (KiB, MiB, GiB, TiB): '%s'", name, s)
	}
	return n * mult, nil
}

// vdiTransfer is vdi-import (put) and vdi-export.
func (c *Ctx) vdiTransfer(put bool) error {
	ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
	if err != nil {
		return err
	}
	format := c.paramOr("format", "raw")
	q := url.Values{"vdi": {ref}, "format": {format}}
	path, label := "/export_raw_vdi", "VDI export"
	if put {
		path, label = "/import_raw_vdi", "VDI import"
	} else if base, ok := c.param("base"); ok {
		b, err := c.objectRef(dm.VDI.Class, base)
		if err != nil {
			return err
		}
		q.Set("base", b)
	}
	_, err = c.transfer(put, c.require("filename"), path, q, label)
	return err
}

func (s *Server) vbdCreate(c *Ctx) error {
	vm, err := c.objectRef(dm.VM.Class, c.require("vm-uuid"))
	if err != nil {
		return err
	}
	vdi, err := c.refOf(dm.VDI.Class, c.paramOr("vdi-uuid", ""))
	if err != nil {
		return err
	}
	typ, err := c.parseValue(dm.VBD.Type.Type, c.paramOr("type", "Disk"), "type")
	if err != nil {
		return err
	}
	mode, err := c.parseValue(dm.VBD.Mode.Type, c.paramOr("mode", "RW"), "mode")
	if err != nil {
		return err
	}
	bootable, err := c.boolParam("bootable")
	if err != nil {
		return err
	}
	unpluggable, err := c.boolParamOr("unpluggable", true)
	if err != nil {
		return err
	}
	rec := map[string]any{
		"VM": vm, "VDI": vdi, "userdevice": c.require("device"), "bootable": bootable, "mode": mode, "type": typ,
		"unpluggable": unpluggable, "empty": vdi == schema.NullRef, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
	}
	return c.create("VBD.create", rec)
}

func (s *Server) vifCreate(c *Ctx) error {
	vm, err := c.objectRef(dm.VM.Class, c.require("vm-uuid"))
	if err != nil {
		return err
	}
	netRef, err := c.objectRef(dm.Network.Class, c.require("network-uuid"))
	if err != nil {
		return err
	}
	mac := c.paramOr("mac", "")
	if mac == "random" {
		mac = ""
	}
	mtu := int64(1500)
	if n, ok := c.s.api.DB.Snapshot().Get(dm.Network.Class, netRef); ok {
		mtu, _ = n.Get(dm.Network.MTU).(int64)
	}
	rec := map[string]any{
		"device": c.require("device"), "network": netRef, "VM": vm, "MAC": mac, "MTU": mtu,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
	}
	return c.create("VIF.create", rec)
}

// eventWait waits until an object of a class matches every condition.
func (s *Server) eventWait(c *Ctx) error {
	cls := c.require("class")
	v := s.classes[strings.ToLower(cls)]
	if v == nil {
		if mc := s.api.Model.ClassFold(cls); mc != nil {
			v = s.classes[cliClassName(mc)]
		}
	}
	if v == nil {
		return failf("Unknown class '%s'", cls)
	}
	type cond struct {
		f   filter
		neg bool
	}
	var conds []cond
	for _, p := range c.params {
		if p.k == "class" || standardParams[p.k] {
			continue
		}
		val, neg := strings.CutPrefix(p.v, "/=")
		f, err := v.parseFilter(p.k, val)
		if err != nil {
			return err
		}
		conds = append(conds, cond{f, neg})
	}
	ctx, stop := c.watchClient()
	defer stop()
	for {
		snap := s.api.DB.Snapshot()
		rows, err := c.allRows(v)
		if err != nil {
			return err
		}
		fm := formatter{snap}
		for _, r := range rows {
			ok := true
			for _, cd := range conds {
				if cd.f.match(fm, r) == cd.neg {
					ok = false
					break
				}
			}
			if ok {
				return nil
			}
		}
		select {
		case <-snap.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watchClient returns a context that ends when the client hangs up, for
// commands that wait without talking to it. It must be stopped before
// the command talks to the client again.
func (c *Ctx) watchClient() (context.Context, func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.conn.Flush()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		_, _ = c.conn.R.Read(b[:]) // any outcome, data, EOF or error, means the client moved
		cancel()
	}()
	return ctx, func() {
		cancel()
		// Unblock the reader; the conversation is over for reading.
		c.nc.SetReadDeadline(time.Now())
		<-done
		c.nc.SetReadDeadline(time.Time{})
	}
}

// console connects the client's terminal to a VM's text console.
func (s *Server) console(c *Ctx) error {
	return c.eachSelected(vmSelector, selectOpts{controlDomains: true}, false, func(vm *db.Row, fm formatter) error {
		var loc string
		consoles, _ := fm.snap.Value(vm, dm.VM.Consoles).([]string)
		for _, ref := range consoles {
			if con, ok := fm.snap.Get(dm.Console.Class, ref); ok && con.String(dm.Console.Protocol) == string(dm.ConsoleProtocolVt100) {
				loc = con.String(dm.Console.Location)
				break
			}
		}
		if loc == "" {
			c.conn.Send(proto.PrintStderr("No text console available\n"))
			return &exitError{1}
		}
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		c.conn.Send(proto.HTTPConnect(loc + sep + "session_id=" + url.QueryEscape(c.session)))
		m, err := c.recv()
		if err != nil {
			return err
		}
		if !m.Is(proto.KindResponse, proto.TagOK) {
			return failf("Failure")
		}
		return nil
	})
}

// restoreDatabase reads the file from the client and hands it to the
// database restore endpoint in-process (the endpoint reads the whole
// body before it answers, which an HTTP upload by xe cannot wait for).
func (s *Server) restoreDatabase(c *Ctx) error {
	dry, err := c.boolParam("dry-run")
	if err != nil {
		return err
	}
	if dry {
		return failf("dry-run is not supported by toolstackd: a restore checks the whole file before it changes anything")
	}
	data, err := c.loadFile(c.require("file-name"), "database file", 1<<30)
	if err != nil {
		return err
	}
	code, body, err := c.serveLocal("PUT", "/pool/xmldbdump", nil, strings.NewReader(string(data)))
	if err != nil {
		return err
	}
	if code != 200 {
		return failf("%s", strings.TrimSpace(body))
	}
	return nil
}
