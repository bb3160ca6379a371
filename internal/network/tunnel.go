package network

import (
	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// createTunnel is tunnel.create: xapi_tunnel.ml's checks, then the
// access PIF ("tunnel<N>") and the tunnel made and plugged together
// with the network's bridge and its VXLAN links (see Compute). Only
// VXLAN is offered: GRE is refused with VALUE_NOT_SUPPORTED. xapi's
// check that every host runs Open vSwitch does not apply.
func (m *Manager) createTunnel(c *api.Call, a dm.TunnelCreateArgs) (dm.TunnelRef, error) {
	transport := string(a.TransportPIF)
	network := string(a.Network)
	switch a.Protocol {
	case dm.TunnelProtocolVxlan:
	case dm.TunnelProtocolGre:
		return "", xerr.New(xerr.ValueNotSupported, "protocol", string(a.Protocol),
			"toolstackd makes tunnels with the Linux kernel's VXLAN only; GRE tunnels are not offered")
	default:
		return "", xerr.New(xerr.InvalidValue, "protocol", string(a.Protocol))
	}
	t, err := m.carrierPIF(c, transport, network)
	if err != nil {
		return "", err
	}
	snap := c.Snapshot()
	switch {
	case !isNull(string(t.BondSlaveOf)):
		return "", xerr.New(xerr.CannotAddTunnelToBondSlave, transport)
	case len(t.TunnelAccessPIFOf) > 0:
		return "", xerr.New(xerr.IsTunnelAccessPIF, transport)
	case t.IPConfigurationMode == dm.IPConfigurationModeNone || t.IPConfigurationMode == "":
		return "", xerr.New(xerr.TransportPIFNotConfigured, transport)
	}
	device := tunnelDevice(snap, string(t.Host))
	var tunnel string
	err = m.change(c.Ctx, func(tx *db.Tx) error {
		access, err := tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: device, Network: dm.NetworkRef(network), Host: t.Host,
			MAC: api.RandomMAC(), MTU: int64(mtuOf(tx, network)), VLAN: -1, Metrics: t.Metrics,
			IPConfigurationMode: dm.IPConfigurationModeNone, IPV6ConfigurationMode: dm.IPV6ConfigurationModeNone,
			PrimaryAddressType: t.PrimaryAddressType, Managed: true, OtherConfig: map[string]string{},
			Properties: map[string]string{}, Capabilities: []string{}}).Row())
		if err != nil {
			return err
		}
		if tunnel, err = tx.Insert(dm.Tunnel.Class, "", (&dm.TunnelRecord{AccessPIF: dm.PIFRef(access), TransportPIF: dm.PIFRef(transport),
			Status: map[string]string{"active": "false"}, OtherConfig: map[string]string{}, Protocol: a.Protocol}).Row()); err != nil {
			return err
		}
		return plugTx(tx, access)
	})
	return dm.TunnelRef(tunnel), err
}

// tunnelDevice is "tunnel<N>" with the smallest N no PIF of the host has.
func tunnelDevice(r db.Reader, host string) string {
	used := map[string]bool{}
	r.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) == host {
			used[row.String(dm.PIF.Device)] = true
		}
		return true
	})
	for n := 0; ; n++ {
		if name := "tunnel" + itoa(n); !used[name] {
			return name
		}
	}
}

// destroyTunnel is tunnel.destroy: the access PIF unplugged and
// forgotten with the tunnel.
func (m *Manager) destroyTunnel(c *api.Call, tunnel string) error {
	row, err := c.Lookup(dm.Tunnel.Class, tunnel)
	if err != nil {
		return err
	}
	access := row.String(dm.Tunnel.AccessPIF)
	p, ok := pifRecord(c.Snapshot(), access)
	if ok {
		if _, err := m.localPIF(c, access); err != nil {
			return err
		}
		if p.CurrentlyAttached {
			if err := m.checkUnplug(c.Snapshot(), access, &p); err != nil {
				return err
			}
		}
	}
	return m.change(c.Ctx, func(tx *db.Tx) error {
		if err := tx.Delete(dm.Tunnel.Class, tunnel); err != nil {
			return err
		}
		if ok {
			return tx.Delete(dm.PIF.Class, access)
		}
		return nil
	})
}
