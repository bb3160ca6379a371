package xenops

import (
	"context"
	"slices"
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Device hotplug: VBD.plug/unplug/unplug_force/insert/eject and
// VIF.plug/unplug, each run on the VM's queue.

func (m *Manager) vbdPlug(c *api.Call, ref string) error {
	return m.withDevOp(c, dm.VBD.Class, ref, "plug", func(o *opCtx, vbd *db.Row) error {
		snap := m.db.Snapshot()
		vm, ok := snap.Get(dm.VM.Class, o.vm)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", o.vm)
		}
		dev, err := vbdDevice(snap, vm, vbd)
		if err != nil {
			return err
		}
		info, _ := m.be.Info(o.uuid)
		if slices.ContainsFunc(info.Disks, func(d backend.Disk) bool { return d.Device == dev }) {
			return xerr.New(xerr.DeviceAlreadyExists, dev)
		}
		d, skip, err := m.diskOf(snap, o.vm, vbd, dev)
		if err != nil {
			return err
		}
		if skip {
			return xerr.New(xerr.VBDIsEmpty, vbd.Ref)
		}
		if err := o.run("plug", func(ctx context.Context) error { return m.plugDisk(ctx, o.uuid, d) }); err != nil {
			return err
		}
		_, err = m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VBD.Userdevice, vbd.Ref, dev); err != nil {
				return err
			}
			if err := tx.Set(dm.VBD.Device, vbd.Ref, guestDeviceName(d, vm)); err != nil {
				return err
			}
			return tx.Set(dm.VBD.CurrentlyAttached, vbd.Ref, true)
		})
		return err
	})
}

// vbdDevice is the userdevice a VBD is plugged at: its own, when it is a
// device number in range, or for "autodetect" (or none) the lowest one no
// other VBD of the VM has.
func vbdDevice(r db.Reader, vm, vbd *db.Row) (string, error) {
	dev := vbd.String(dm.VBD.Userdevice)
	if dev != "autodetect" && dev != "" {
		return dev, checkDeviceNumber(dev, maxVBDDevices)
	}
	used := map[string]bool{}
	for _, ref := range strs(r.Value(vm, dm.VM.VBDs)) {
		if v, ok := r.Get(dm.VBD.Class, ref); ok && ref != vbd.Ref {
			used[v.String(dm.VBD.Userdevice)] = true
		}
	}
	free := freeDevices(maxVBDDevices, used)
	if len(free) == 0 {
		return "", xerr.New(xerr.InvalidDevice, "autodetect")
	}
	return free[0], nil
}

// checkDeviceNumber refuses a device that is not a number below n.
func checkDeviceNumber(dev string, n int) error {
	if i, err := strconv.Atoi(dev); err != nil || i < 0 || i >= n {
		return xerr.New(xerr.InvalidDevice, dev)
	}
	return nil
}

// plugDisk attaches a disk's VDI (if it has one) through storage and
// hot-plugs the disk into the domain; the VDI is detached again when the
// hotplug fails.
func (m *Manager) plugDisk(ctx context.Context, uuid string, d backend.Disk) error {
	if d.VDI != "" {
		src, err := m.disks.Attach(ctx, uuid, d.VDI, d.ReadOnly)
		if err != nil {
			return err
		}
		d.Path, d.Format = src.Target(), src.Format
	}
	if err := m.be.PlugDisk(ctx, uuid, d); err != nil {
		if d.VDI != "" {
			_ = m.disks.Detach(context.WithoutCancel(ctx), uuid, d.VDI)
		}
		return err
	}
	return nil
}

// attachedDisk finds a VBD among a domain's disks.
func (m *Manager) attachedDisk(uuid, vbd string) (backend.Disk, bool) {
	info, ok := m.be.Info(uuid)
	if !ok {
		return backend.Disk{}, false
	}
	for _, d := range info.Disks {
		if d.VBD == vbd {
			return d, true
		}
	}
	return backend.Disk{}, false
}

func (m *Manager) vbdUnplug(c *api.Call, ref string, force bool) error {
	name := "unplug"
	if force {
		name = "unplug_force"
	}
	return m.withDevOp(c, dm.VBD.Class, ref, name, func(o *opCtx, vbd *db.Row) error {
		d, ok := m.attachedDisk(o.uuid, vbd.Ref)
		if ok {
			if err := o.run("unplug", func(ctx context.Context) error {
				return m.be.UnplugDisk(ctx, o.uuid, d.Device, force)
			}); err != nil {
				return err
			}
			m.detachAll(o.ctx, o.uuid, []backend.Disk{d})
		}
		_, err := m.db.Update(func(tx *db.Tx) error { return tx.Set(dm.VBD.CurrentlyAttached, vbd.Ref, false) })
		return err
	})
}

func (m *Manager) vbdInsert(c *api.Call, a dm.VBDInsertArgs) (dm.Void, error) {
	row, err := c.Lookup(dm.VBD.Class, string(a.VBD))
	if err != nil {
		return dm.Void{}, err
	}
	vdi, err := c.Lookup(dm.VDI.Class, string(a.VDI))
	if err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, m.withDevOp(c, dm.VBD.Class, row.Ref, "insert", func(o *opCtx, vbd *db.Row) error {
		if d, ok := m.attachedDisk(o.uuid, vbd.Ref); ok {
			if err := o.run("insert", func(ctx context.Context) error {
				src, err := m.disks.Attach(ctx, o.uuid, vdi.Ref, true)
				if err != nil {
					return err
				}
				d.VDI, d.Path, d.Format = vdi.Ref, src.Target(), src.Format
				if err := m.be.ChangeMedium(ctx, o.uuid, d); err != nil {
					_ = m.disks.Detach(context.WithoutCancel(ctx), o.uuid, vdi.Ref)
					return err
				}
				return nil
			}); err != nil {
				return err
			}
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VBD.VDI, vbd.Ref, vdi.Ref); err != nil {
				return err
			}
			return tx.Set(dm.VBD.Empty, vbd.Ref, false)
		})
		return err
	})
}

func (m *Manager) vbdEject(c *api.Call, a dm.VBDEjectArgs) (dm.Void, error) {
	return dm.Void{}, m.withDevOp(c, dm.VBD.Class, string(a.VBD), "eject", func(o *opCtx, vbd *db.Row) error {
		if d, ok := m.attachedDisk(o.uuid, vbd.Ref); ok {
			old := d.VDI
			if err := o.run("eject", func(ctx context.Context) error {
				d.VDI, d.Path, d.Format = "", "", ""
				return m.be.ChangeMedium(ctx, o.uuid, d)
			}); err != nil {
				return err
			}
			m.detachAll(o.ctx, o.uuid, []backend.Disk{{VDI: old}})
		}
		_, err := m.db.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VBD.VDI, vbd.Ref, schema.NullRef); err != nil {
				return err
			}
			return tx.Set(dm.VBD.Empty, vbd.Ref, true)
		})
		return err
	})
}

func (m *Manager) vifPlug(c *api.Call, ref string) error {
	return m.withDevOp(c, dm.VIF.Class, ref, "plug", func(o *opCtx, vif *db.Row) error {
		dev := vif.String(dm.VIF.Device)
		if err := checkDeviceNumber(dev, maxVIFDevices); err != nil {
			return err
		}
		info, _ := m.be.Info(o.uuid)
		if slices.ContainsFunc(info.NICs, func(n backend.NIC) bool { return n.Device == dev }) {
			return xerr.New(xerr.DeviceAlreadyExists, dev)
		}
		nic, err := m.nicOf(m.db.Snapshot(), o.vm, vif)
		if err != nil {
			return err
		}
		if err := o.run("plug", func(ctx context.Context) error {
			if err := m.ensureNIC(ctx, &nic); err != nil {
				return err
			}
			if err := m.be.PlugNIC(ctx, o.uuid, nic); err != nil {
				m.releaseNICs(context.WithoutCancel(ctx), []string{vif.Ref})
				return err
			}
			if err := m.lockNIC(ctx, o.uuid, vif.Ref); err != nil {
				// Not left plugged without its rules.
				bg := context.WithoutCancel(ctx)
				_ = m.be.UnplugNIC(bg, o.uuid, nic.Device)
				m.releaseNICs(bg, []string{vif.Ref})
				return err
			}
			return nil
		}); err != nil {
			return err
		}
		_, err = m.db.Update(func(tx *db.Tx) error {
			if vif.String(dm.VIF.MAC) == "" {
				if err := tx.Set(dm.VIF.MAC, vif.Ref, nic.MAC); err != nil {
					return err
				}
			}
			return tx.Set(dm.VIF.CurrentlyAttached, vif.Ref, true)
		})
		return err
	})
}

func (m *Manager) vifUnplug(c *api.Call, ref string) error {
	return m.withDevOp(c, dm.VIF.Class, ref, "unplug", func(o *opCtx, vif *db.Row) error {
		dev := vif.String(dm.VIF.Device)
		info, _ := m.be.Info(o.uuid)
		for _, n := range info.NICs {
			if n.VIF == vif.Ref {
				dev = n.Device
			}
		}
		if err := o.run("unplug", func(ctx context.Context) error { return m.be.UnplugNIC(ctx, o.uuid, dev) }); err != nil {
			return err
		}
		_, err := m.db.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.CurrentlyAttached, vif.Ref, false) })
		m.releaseNICs(context.WithoutCancel(o.ctx), []string{vif.Ref})
		return err
	})
}
