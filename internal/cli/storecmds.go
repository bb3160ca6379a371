package cli

import (
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
)

// addStorageCommands registers the commands on disks (VDI), drives (VBD),
// network interfaces (VIF), storage repositories (SR) and their
// connections to hosts (PBD).
func (s *Server) addStorageCommands() {
	s.addSimpleStorageCommands()
	s.addVBDVIFCommands()
	s.addVDICommands()
	s.addSRPBDCommands()
	s.register("diagnostic-vdi-status", "Shows the disk with this uuid and the drives (VBDs) that use it, active first.",
		s.diagnosticVDIStatus)
}

// addSimpleStorageCommands registers the storage commands that call one
// method on the object with this uuid.
func (s *Server) addSimpleStorageCommands() {
	for _, c := range []struct{ name, help, method string }{
		{"vdi-forget", "Removes the disk with this uuid from the database, leaving its data on the SR.", "VDI.forget"},
		{"vdi-update", "Refreshes the database's record of the disk with this uuid from its SR.", "VDI.update"},
		{"vbd-destroy", "Destroys the virtual block device with this uuid (the disk stays).", "VBD.destroy"},
		{"vbd-eject", "Ejects the CD from the CD drive with this uuid.", "VBD.eject"},
		{"vif-destroy", "Destroys the virtual network interface with this uuid.", "VIF.destroy"},
		{"vif-plug", "Hot-plugs the virtual network interface with this uuid into its running VM.", "VIF.plug"},
		{"sr-destroy", "Destroys the storage repository with this uuid and every disk on it.", "SR.destroy"},
		{"sr-forget", "Removes the storage repository with this uuid from the database, leaving its data.", "SR.forget"},
		{"sr-update", "Refreshes the database's record of the storage repository with this uuid.", "SR.update"},
		{"pbd-destroy", "Destroys the host's connection to an SR (a PBD) with this uuid.", "PBD.destroy"},
		{"pbd-plug", "Attaches the SR of the PBD with this uuid to its host.", "PBD.plug"},
		{"pbd-unplug", "Detaches the SR of the PBD with this uuid from its host.", "PBD.unplug"},
	} {
		s.register(c.name, c.help, c1(c.method, s.api.Model.Message(c.method).Params[1].Type.Class))
	}
}

// addVBDVIFCommands registers the commands that put a CD in a drive and
// unplug or move a network interface.
func (s *Server) addVBDVIFCommands() {
	s.register("vbd-insert", "Inserts the CD with vdi-uuid into the empty CD drive with this uuid.",
		c2("VBD.insert", dm.VBD.Class, "vdi-uuid", dm.VDI.Class))
	s.register("vif-unplug", "Hot-unplugs the virtual network interface with this uuid (--force: without the guest's "+
		"cooperation).", func(c *Ctx) error {
		ref, err := c.objectRef(dm.VIF.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		force, err := c.boolParam("force")
		if err != nil {
			return err
		}
		m := "VIF.unplug"
		if force {
			m = "VIF.unplug_force"
		}
		_, err = c.call(m, ref)
		return err
	})
	s.register("vif-move", "Moves the virtual network interface with this uuid to the network network-uuid.",
		c2("VIF.move", dm.VIF.Class, "network-uuid", dm.Network.Class))
}

// driverParams lets a command take driver-params:<key>=<value>.
func driverParams(cmd *Command) {
	cmd.accepts = func(_ *Ctx, k string) (bool, error) { return hasMapPrefix(k, "driver-params"), nil }
}

// addVDICommands registers the commands that clone, snapshot, copy, move,
// resize and introduce disks.
func (s *Server) addVDICommands() {
	s.register("vdi-clone", "Clones the disk with this uuid (fast, where the SR can) and prints the new disk's uuid.",
		s.vdiClone, driverParams)
	s.register("vdi-snapshot", "Snapshots the disk with this uuid and prints the snapshot's uuid.", func(c *Ctx) error {
		ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		v, err := c.call("VDI.snapshot", ref, c.mapParams("driver-params"))
		if err != nil {
			return err
		}
		return c.printUUID(dm.VDI.Class, v)
	}, driverParams)
	s.register("vdi-copy", "Copies the disk with this uuid to a new disk on sr-uuid, or into the disk into-vdi-uuid "+
		"(base-vdi-uuid: only the blocks that differ from it), and prints the uuid of the copy.", s.vdiCopy)
	s.register("vdi-pool-migrate", "Moves the disk with this uuid, in use by a running VM, to sr-uuid while the VM "+
		"runs, and prints the uuid of the disk it becomes.", s.vdiPoolMigrate)
	s.register("vdi-resize", "Resizes the disk with this uuid to disk-size (bytes, or with a suffix); online=true "+
		"for a disk in use by a running VM.", func(c *Ctx) error {
		ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
		if err != nil {
			return err
		}
		size, err := parseBytes("disk-size", c.require("disk-size"))
		if err != nil {
			return err
		}
		m := "VDI.resize"
		if c.paramOr("online", "") == "true" {
			m = "VDI.resize_online"
		}
		_, err = c.call(m, ref, size)
		return err
	})
	s.register("vdi-introduce", "Makes a database record for a disk already on an SR (at location) and prints its uuid.",
		s.vdiIntroduce)
}

// vdiClone is vdi-clone: the clone gets new-name-label and
// new-name-description when they are given.
func (s *Server) vdiClone(c *Ctx) error {
	ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
	if err != nil {
		return err
	}
	v, err := c.call("VDI.clone", ref, c.mapParams("driver-params"))
	if err != nil {
		return err
	}
	if l, ok := c.param("new-name-label"); ok {
		if _, err := c.call("VDI.set_name_label", v, l); err != nil {
			return err
		}
	}
	if d, ok := c.param("new-name-description"); ok {
		if _, err := c.call("VDI.set_name_description", v, d); err != nil {
			return err
		}
	}
	return c.printUUID(dm.VDI.Class, v)
}

// vdiCopy is vdi-copy: to a new disk on sr-uuid or into the disk
// into-vdi-uuid, one of the two.
func (s *Server) vdiCopy(c *Ctx) error {
	ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
	if err != nil {
		return err
	}
	base, err := c.refOf(dm.VDI.Class, c.paramOr("base-vdi-uuid", ""))
	if err != nil {
		return err
	}
	srID, hasSR := c.param("sr-uuid")
	intoID, hasInto := c.param("into-vdi-uuid")
	if hasSR == hasInto {
		return failf("Please specify one but not both of: a destination sr-uuid (I will create a fresh VDI); " +
			"or a destination into-vdi-uuid (I will copy the blocks into this VDI)")
	}
	sr, into := schema.NullRef, schema.NullRef
	if hasSR {
		sr, err = c.objectRef(dm.SR.Class, srID)
	} else {
		into, err = c.objectRef(dm.VDI.Class, intoID)
	}
	if err != nil {
		return err
	}
	v, err := c.call("VDI.copy", ref, sr, base, into)
	if err != nil {
		return err
	}
	return c.printUUID(dm.VDI.Class, v)
}

// vdiPoolMigrate is vdi-pool-migrate: dest-img-format, when given, goes
// in the call's options.
func (s *Server) vdiPoolMigrate(c *Ctx) error {
	ref, err := c.objectRef(dm.VDI.Class, c.require("uuid"))
	if err != nil {
		return err
	}
	sr, err := c.objectRef(dm.SR.Class, c.require("sr-uuid"))
	if err != nil {
		return err
	}
	options := map[string]string{}
	if f, ok := c.param("dest-img-format"); ok {
		options["dest-img-format"] = f
	}
	v, err := c.call("VDI.pool_migrate", ref, sr, options)
	if err != nil {
		return err
	}
	return c.printUUID(dm.VDI.Class, v)
}

// vdiIntroduce is vdi-introduce.
func (s *Server) vdiIntroduce(c *Ctx) error {
	sr, err := c.objectRef(dm.SR.Class, c.require("sr-uuid"))
	if err != nil {
		return err
	}
	typ, err := c.parseValue(dm.VDI.Type.Type, c.require("type"), "type")
	if err != nil {
		return err
	}
	var flags [3]bool
	for i, k := range []string{"sharable", "read-only", "managed"} {
		if flags[i], err = c.boolParam(k); err != nil {
			return err
		}
	}
	v, err := c.call("VDI.introduce", c.require("uuid"), c.paramOr("name-label", ""), c.paramOr("name-description", ""),
		sr, typ, flags[0], flags[1], c.mapParams("other-config"), c.require("location"), c.mapParams("xenstore-data"),
		c.mapParams("sm-config"), flags[2], int64(0), int64(0), schema.NullRef, false, schema.Epoch, schema.NullRef)
	if err != nil {
		return err
	}
	return c.printUUID(dm.VDI.Class, v)
}

// addSRPBDCommands registers the commands that introduce and probe
// storage repositories and connect them to hosts.
func (s *Server) addSRPBDCommands() {
	s.register("sr-introduce", "Makes a database record for an existing storage repository and prints its uuid "+
		"(pbd-create and pbd-plug then attach it).", func(c *Ctx) error {
		shared, err := c.boolParam("shared")
		if err != nil {
			return err
		}
		v, err := c.call("SR.introduce", c.require("uuid"), c.require("name-label"), c.paramOr("name-description", ""),
			c.require("type"), c.paramOr("content-type", ""), shared, c.mapParams("sm-config"))
		if err != nil {
			return err
		}
		return c.printUUID(dm.SR.Class, v)
	})
	s.register("sr-probe", "Asks a storage driver (type) what it finds with the device-config given, on host-uuid or "+
		"this host, and prints its answer.", func(c *Ctx) error {
		host := c.s.api.Cfg.HostRef
		if u, ok := c.param("host-uuid"); ok {
			var err error
			if host, err = c.objectRef(dm.Host.Class, u); err != nil {
				return err
			}
		}
		v, err := c.call("SR.probe", host, c.mapParams("device-config"), c.require("type"), c.mapParams("sm-config"))
		if err != nil {
			return err
		}
		txt, _ := v.(string)
		c.out.list(txt)
		return nil
	})
	s.register("pbd-create", "Creates a connection (PBD) between a host and an SR, with device-config:<key>=<value> "+
		"settings, and prints its uuid.", func(c *Ctx) error {
		host, err := c.objectRef(dm.Host.Class, c.require("host-uuid"))
		if err != nil {
			return err
		}
		sr, err := c.objectRef(dm.SR.Class, c.require("sr-uuid"))
		if err != nil {
			return err
		}
		return c.create("PBD.create", map[string]any{"host": host, "SR": sr, "device_config": c.mapParams("device-config"),
			"other_config": map[string]string{}})
	})
}

// diagnosticVDIStatus is diagnostic-vdi-status.
func (s *Server) diagnosticVDIStatus(c *Ctx) error {
	vdi, fm, err := c.rowByUUID(c.s.classes["vdi"], c.require("uuid"))
	if err != nil {
		return err
	}
	vdiView, vbdView := c.s.classes["vdi"], c.s.classes["vbd"]
	c.out.table([][]field{fm.record(vdiView, vdi, fieldSet("uuid", "name-label", "sr-uuid", "mode", "read-only",
		"sharable", "storage-lock"))})
	only := fieldSet("uuid", "userdevice", "device", "empty", "mode", "type", "storage-lock")
	var active, inactive [][]field
	for _, ref := range strs(fm.snap.Value(vdi, dm.VDI.VBDs)) {
		vbd, ok := fm.snap.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		if vbd.Get(dm.VBD.CurrentlyAttached) == true {
			active = append(active, fm.record(vbdView, vbd, only))
		} else {
			inactive = append(inactive, fm.record(vbdView, vbd, only))
		}
	}
	if len(active) == 0 {
		c.out.list("no active VBDs.")
	} else {
		c.out.list("active VBDs:")
		c.out.table(active)
	}
	if len(inactive) > 0 {
		c.out.list("inactive VBDs:")
		c.out.table(inactive)
	}
	return nil
}

// hasMapPrefix reports whether k is prefix:<key> or prefix-<key> (the
// form some of xapi's commands list).
func hasMapPrefix(k, prefix string) bool {
	return len(k) > len(prefix)+1 && k[:len(prefix)] == prefix && (k[len(prefix)] == ':' || k[len(prefix)] == '-')
}

func fieldSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
