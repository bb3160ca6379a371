package network

import (
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// vlanMAC is the MAC xapi gives every VLAN PIF.
const vlanMAC = "fe:ff:ff:ff:ff:ff"

// createVLAN is VLAN.create: the checks of xapi_vlan.ml, then the VLAN
// and its untagged PIF made and plugged together with the kernel's
// "<device>.<tag>" link and the network's bridge.
func (m *Manager) createVLAN(c *api.Call, tagged string, tag int64, network string) (string, error) {
	t, err := m.carrierPIF(c, tagged, network)
	if err != nil {
		return "", err
	}
	snap := c.Snapshot()
	switch {
	case !isNull(string(t.BondSlaveOf)):
		return "", xerr.New(xerr.CannotAddVLANToBondSlave, tagged)
	case !isNull(string(t.VLANMasterOf)):
		return "", xerr.New(xerr.PIFIsVLAN, tagged)
	case len(t.TunnelAccessPIFOf) > 0:
		return "", xerr.New(xerr.IsTunnelAccessPIF, tagged)
	}
	if tag < 0 || tag > 4094 {
		return "", xerr.New(xerr.VLANTagInvalid, strconv.FormatInt(tag, 10))
	}
	exists := false
	snap.Ascend(dm.VLAN.Class, func(r *db.Row) bool {
		exists = r.String(dm.VLAN.TaggedPIF) == tagged && r.Get(dm.VLAN.Tag) == tag
		return !exists
	})
	if exists {
		return "", xerr.New(xerr.PIFVLANExists, t.Device)
	}
	// The kernel already has that VLAN, made by someone else.
	if links, err := m.cfg.Links.List(); err == nil {
		for _, l := range links {
			if l.Kind == "vlan" && !l.Ours && l.Tag == int(tag) && l.Parent == t.Device {
				return "", xerr.New(xerr.VLANInUse, t.Device, strconv.FormatInt(tag, 10))
			}
		}
	}
	var vlan string
	err = m.change(c.Ctx, func(tx *db.Tx) error {
		vlan = ""
		untagged, err := tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: t.Device, Network: dm.NetworkRef(network), Host: t.Host,
			MAC: vlanMAC, MTU: t.MTU, VLAN: tag, Metrics: t.Metrics, IPConfigurationMode: dm.IPConfigurationModeNone,
			IPV6ConfigurationMode: dm.IPV6ConfigurationModeNone, PrimaryAddressType: t.PrimaryAddressType, Managed: true,
			OtherConfig: map[string]string{}, Properties: map[string]string{}, Capabilities: []string{}}).Row())
		if err != nil {
			return err
		}
		if vlan, err = tx.Insert(dm.VLAN.Class, "", (&dm.VLANRecord{TaggedPIF: dm.PIFRef(tagged), UntaggedPIF: dm.PIFRef(untagged),
			Tag: tag, OtherConfig: map[string]string{}}).Row()); err != nil {
			return err
		}
		if err := tx.Set(dm.PIF.VLANMasterOf, untagged, vlan); err != nil {
			return err
		}
		return plugTx(tx, untagged)
	})
	return vlan, err
}

// destroyVLAN is VLAN.destroy: its PIF unplugged (with unplug's checks)
// and forgotten, the kernel link and bridge removed.
func (m *Manager) destroyVLAN(c *api.Call, vlan string) error {
	row, err := c.Lookup(dm.VLAN.Class, vlan)
	if err != nil {
		return err
	}
	untagged := row.String(dm.VLAN.UntaggedPIF)
	u, ok := pifRecord(c.Snapshot(), untagged)
	if !ok { // an orphaned record
		return c.Update(func(tx *db.Tx) error { return tx.Delete(dm.VLAN.Class, vlan) })
	}
	if string(u.Host) != m.cfg.HostRef {
		if _, err := m.localPIF(c, untagged); err != nil {
			return err
		}
	}
	if _, ok := c.Snapshot().Get(dm.Bond.Class, string(u.BondSlaveOf)); ok || len(u.BondMasterOf) > 0 {
		return xerr.New(xerr.PIFAlreadyBonded, untagged)
	}
	if u.VLAN < 0 {
		return xerr.New(xerr.PIFIsPhysical, untagged)
	}
	if u.CurrentlyAttached {
		if err := m.checkUnplug(c.Snapshot(), untagged, &u); err != nil {
			return err
		}
	}
	return m.change(c.Ctx, func(tx *db.Tx) error {
		if err := tx.Delete(dm.VLAN.Class, vlan); err != nil {
			return err
		}
		return tx.Delete(dm.PIF.Class, untagged)
	})
}

// createVLANOnDevice is the deprecated PIF.create_VLAN: VLAN.create on
// the host's untagged PIF of the device, answering the new PIF.
func (m *Manager) createVLANOnDevice(c *api.Call, a dm.PIFCreateVLANArgs) (dm.PIFRef, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return "", err
	}
	tagged := ""
	c.Snapshot().Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Host) == string(a.Host) && r.String(dm.PIF.Device) == a.Device && r.Get(dm.PIF.VLAN) == int64(-1) {
			tagged = r.Ref
			return false
		}
		return true
	})
	if tagged == "" {
		return "", xerr.New(xerr.InvalidValue, "device", a.Device)
	}
	vlan, err := m.createVLAN(c, tagged, a.VLAN, string(a.Network))
	if err != nil {
		return "", err
	}
	row, _ := c.Snapshot().Get(dm.VLAN.Class, vlan)
	return dm.PIFRef(row.String(dm.VLAN.UntaggedPIF)), nil
}

// destroyVLANPIF is the deprecated PIF.destroy: VLAN.destroy of a VLAN
// PIF.
func (m *Manager) destroyVLANPIF(c *api.Call, ref string) error {
	row, err := c.Lookup(dm.PIF.Class, ref)
	if err != nil {
		return err
	}
	if v, _ := row.Get(dm.PIF.VLAN).(int64); v < 0 {
		return xerr.New(xerr.PIFIsPhysical, ref)
	}
	return m.destroyVLAN(c, row.String(dm.PIF.VLANMasterOf))
}
