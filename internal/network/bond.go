package network

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// bondProps checks a bond's properties against its mode as xapi does
// (only lacp takes any) and adds the defaults.
func bondProps(mode dm.BondMode, props map[string]string, strict bool) (map[string]string, error) {
	valid := map[string]func(string) bool{}
	defaults := map[string]string{}
	if mode == dm.BondModeLacp {
		valid["hashing_algorithm"] = func(v string) bool { return v == "src_mac" || v == "tcpudp_ports" }
		valid["lacp-time"] = func(v string) bool { return v == "fast" || v == "slow" }
		valid["lacp-aggregation-key"] = func(v string) bool { _, err := strconv.Atoi(v); return err == nil }
		valid["lacp-fallback-ab"] = func(v string) bool { return v == "true" || v == "false" }
		defaults = map[string]string{"hashing_algorithm": "tcpudp_ports", "lacp-time": "slow", "lacp-fallback-ab": "true"}
	}
	out := map[string]string{}
	for k, v := range props {
		if ok := valid[k]; ok == nil || !ok(v) {
			if strict {
				return nil, xerr.New(xerr.InvalidValue, "properties", fmt.Sprintf("%s = %s", k, v))
			}
			continue
		}
		out[k] = v
	}
	for k, v := range defaults {
		if _, ok := out[k]; !ok {
			out[k] = v
		}
	}
	return out, nil
}

func validMode(mode dm.BondMode) bool {
	return mode == dm.BondModeBalanceSlb || mode == dm.BondModeActiveBackup || mode == dm.BondModeLacp
}

// createBond is Bond.create: xapi_bond.ml's checks, then the master PIF
// and the Bond made, the members' IP configuration moved to the master,
// and the bond plugged, with the kernel's bond in the network's bridge.
// A bond with the management PIF in it is refused
// (PIF_IS_MANAGEMENT_INTERFACE): moving the host's address onto a bond
// is not done here yet.
func (m *Manager) createBond(c *api.Call, a dm.BondCreateArgs) (dm.BondRef, error) {
	members := uniqueMembers(a.Members)
	if len(members) < 2 {
		return "", xerr.New(xerr.PIFBondNeedsMoreMembers)
	}
	network := string(a.Network)
	if err := assertNetworkManaged(c, network); err != nil {
		return "", err
	}
	snap := c.Snapshot()
	recs := make([]dm.PIFRecord, len(members))
	for i, ref := range members {
		if _, err := c.Lookup(dm.PIF.Class, ref); err != nil {
			return "", err
		}
		recs[i], _ = pifRecord(snap, ref)
	}
	host := string(recs[0].Host)
	if err := assertNoOtherLocalPIFs(snap, host, network); err != nil {
		return "", err
	}
	if a.MAC != "" && !macPattern.MatchString(a.MAC) {
		return "", xerr.New(xerr.MACInvalid, a.MAC)
	}
	if !validMode(a.Mode) {
		return "", xerr.New(xerr.InvalidValue, "mode", string(a.Mode))
	}
	props, err := bondProps(a.Mode, a.Properties, true)
	if err != nil {
		return "", err
	}
	primary, err := bondPrimary(members, recs, host)
	if err != nil {
		return "", err
	}
	if host != m.cfg.HostRef {
		if _, err := m.localPIF(c, members[0]); err != nil {
			return "", err
		}
	}
	device := m.bondDevice(snap, host)
	mac, auto := a.MAC, false
	if mac == "" {
		mac, auto = recs[primary].MAC, true
	}
	var bond string
	err = m.change(c.Ctx, func(tx *db.Tx) error {
		master, err := insertBondMaster(tx, device, network, host, mac, recs, primary)
		if err != nil {
			return err
		}
		if bond, err = tx.Insert(dm.Bond.Class, "", (&dm.BondRecord{Master: dm.PIFRef(master), PrimarySlave: dm.PIFRef(members[primary]),
			Mode: a.Mode, Properties: props, AutoUpdateMAC: auto, OtherConfig: map[string]string{}}).Row()); err != nil {
			return err
		}
		if err := enslaveTx(tx, members, bond); err != nil {
			return err
		}
		return plugTx(tx, master)
	})
	return dm.BondRef(bond), err
}

// uniqueMembers is the PIFs of refs, each once, in the order given.
func uniqueMembers(refs []dm.PIFRef) []string {
	members := []string{}
	for _, p := range refs {
		if !slices.Contains(members, string(p)) {
			members = append(members, string(p))
		}
	}
	return members
}

// bondPrimary checks, as xapi_bond.ml does, that the PIFs members (recs
// their records) can make a bond on host: managed, in no bond, VLAN or
// tunnel, not the management interface, on that host, with the same
// primary address type and properties and, at most one of them, an IP
// configuration. It returns the index of the primary member: the one
// with an IP configuration, else the first.
func bondPrimary(members []string, recs []dm.PIFRecord, host string) (int, error) {
	primary, withIP := -1, 0
	for i, p := range recs {
		ref := members[i]
		if err := assertManaged(ref, &p); err != nil {
			return 0, err
		}
		switch {
		case !isNull(string(p.BondSlaveOf)) || len(p.BondMasterOf) > 0:
			return 0, xerr.New(xerr.PIFAlreadyBonded, ref)
		case !isNull(string(p.VLANMasterOf)):
			return 0, xerr.New(xerr.PIFVLANExists, p.Device)
		case len(p.TunnelAccessPIFOf) > 0:
			return 0, xerr.New(xerr.IsTunnelAccessPIF, ref)
		case p.Management:
			return 0, xerr.New(xerr.PIFIsManagementInterface, ref)
		case len(p.VLANSlaveOf) > 0:
			return 0, xerr.New(xerr.PIFVLANStillExists, ref)
		case len(p.TunnelTransportPIFOf) > 0:
			return 0, xerr.New(xerr.PIFTunnelStillExists, ref)
		}
		if string(p.Host) != host {
			return 0, xerr.New(xerr.PIFCannotBondCrossHost)
		}
		if p.IPConfigurationMode != dm.IPConfigurationModeNone && p.IPConfigurationMode != "" {
			withIP++
			if primary < 0 {
				primary = i
			}
		}
	}
	if primary < 0 {
		primary = 0
	}
	for i, p := range recs {
		if p.PrimaryAddressType != recs[primary].PrimaryAddressType {
			return 0, xerr.New(xerr.PIFIncompatiblePrimaryAddressType, members[i])
		}
		if !maps.Equal(p.Properties, recs[0].Properties) {
			return 0, xerr.New(xerr.IncompatiblePIFProperties)
		}
	}
	if withIP > 1 {
		return 0, xerr.New(xerr.PIFBondMoreThanOneIP)
	}
	return primary, nil
}

// insertBondMaster records the master PIF of a new bond, device on host,
// and its metrics: on network, with mac, the IP configuration of the
// primary member (recs the members' records) and the first member's
// properties; it may not be unplugged if a member may not. It returns
// the master's ref.
func insertBondMaster(tx *db.Tx, device, network, host, mac string, recs []dm.PIFRecord, primary int) (string, error) {
	ps := recs[primary]
	disallow := false
	for _, p := range recs {
		disallow = disallow || p.DisallowUnplug
	}
	metrics, err := tx.Insert(dm.PIFMetrics.Class, "", (&dm.PIFMetricsRecord{OtherConfig: map[string]string{}}).Row())
	if err != nil {
		return "", err
	}
	return tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: device, Network: dm.NetworkRef(network), Host: dm.HostRef(host),
		MAC: mac, MTU: int64(mtuOf(tx, network)), VLAN: -1, Metrics: dm.PIFMetricsRef(metrics),
		IPConfigurationMode: ps.IPConfigurationMode, IP: ps.IP, Netmask: ps.Netmask, Gateway: ps.Gateway, DNS: ps.DNS,
		IPV6ConfigurationMode: dm.IPV6ConfigurationModeNone, PrimaryAddressType: ps.PrimaryAddressType, Managed: true,
		DisallowUnplug: disallow, OtherConfig: map[string]string{}, Properties: cloneMap(recs[0].Properties), Capabilities: []string{}}).Row())
}

// enslaveTx makes the PIFs members bond's members: their IP
// configuration cleared (the master has it), pluggable, and attached.
func enslaveTx(tx *db.Tx, members []string, bond string) error {
	for _, ref := range members {
		if err := tx.Set(dm.PIF.BondSlaveOf, ref, bond); err != nil {
			return err
		}
		if err := clearIPTx(tx, ref); err != nil {
			return err
		}
		if err := tx.Set(dm.PIF.DisallowUnplug, ref, false); err != nil {
			return err
		}
		if err := tx.Set(dm.PIF.CurrentlyAttached, ref, true); err != nil {
			return err
		}
	}
	return nil
}

func clearIPTx(tx *db.Tx, ref string) error {
	return setFields(tx, dm.PIF.Class, ref, map[string]any{"ip_configuration_mode": string(dm.IPConfigurationModeNone),
		"IP": "", "netmask": "", "gateway": "", "DNS": ""})
}

// cloneMap is maps.Clone, but never nil (a record's map field is written
// as an empty map, not left out).
func cloneMap(a map[string]string) map[string]string {
	out := make(map[string]string, len(a))
	for k, v := range a {
		out[k] = v
	}
	return out
}

// bondDevice is "bond<N>" with the smallest N no bond PIF of the host
// and no link of the kernel has.
func (m *Manager) bondDevice(r db.Reader, host string) string {
	used := map[string]bool{}
	r.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) == host {
			used[row.String(dm.PIF.Device)] = true
		}
		return true
	})
	if links, err := m.cfg.Links.List(); err == nil {
		for _, l := range links {
			if !l.Ours {
				used[l.Name] = true
			}
		}
	}
	for n := 0; ; n++ {
		if name := fmt.Sprintf("bond%d", n); !used[name] {
			return name
		}
	}
}

// destroyBond is Bond.destroy: the master's IP configuration goes back
// to the primary member, the members are plugged on their own networks
// if the bond was, and the Bond and master PIF are forgotten.
func (m *Manager) destroyBond(c *api.Call, bond string) error {
	row, err := c.Lookup(dm.Bond.Class, bond)
	if err != nil {
		return err
	}
	snap := c.Snapshot()
	var b dm.BondRecord
	b.FromRow(snap.Values(row))
	master, ok := pifRecord(snap, string(b.Master))
	if ok {
		if _, err := m.localPIF(c, string(b.Master)); err != nil {
			return err
		}
		if master.Management {
			if haEnabled(snap) {
				return xerr.New(xerr.HACannotChangeBondStatusOfMgmtIface)
			}
			return xerr.New(xerr.PIFIsManagementInterface, string(b.Master))
		}
		if len(master.VLANSlaveOf) > 0 {
			return xerr.New(xerr.PIFVLANStillExists, string(b.Master))
		}
		if len(master.TunnelTransportPIFOf) > 0 {
			return xerr.New(xerr.PIFTunnelStillExists, string(b.Master))
		}
	}
	return m.change(c.Ctx, func(tx *db.Tx) error {
		primary := string(b.PrimarySlave)
		if ok {
			if _, has := tx.Get(dm.PIF.Class, primary); has {
				if err := setFields(tx, dm.PIF.Class, primary, map[string]any{"ip_configuration_mode": string(master.IPConfigurationMode),
					"IP": master.IP, "netmask": master.Netmask, "gateway": master.Gateway, "DNS": master.DNS}); err != nil {
					return err
				}
				if master.DisallowUnplug {
					if err := tx.Set(dm.PIF.DisallowUnplug, primary, true); err != nil {
						return err
					}
				}
			}
		}
		if err := tx.Delete(dm.Bond.Class, bond); err != nil {
			return err
		}
		if ok {
			if err := tx.Delete(dm.PIF.Class, string(b.Master)); err != nil {
				return err
			}
			if _, has := tx.Get(dm.PIFMetrics.Class, string(master.Metrics)); has {
				if err := tx.Delete(dm.PIFMetrics.Class, string(master.Metrics)); err != nil {
					return err
				}
			}
		}
		for _, s := range b.Slaves {
			if _, has := tx.Get(dm.PIF.Class, string(s)); !has {
				continue
			}
			if err := tx.Set(dm.PIF.BondSlaveOf, string(s), schema.NullRef); err != nil {
				return err
			}
			if err := tx.Set(dm.PIF.CurrentlyAttached, string(s), ok && master.CurrentlyAttached); err != nil {
				return err
			}
		}
		return nil
	})
}

// setBondMode is Bond.set_mode: the properties that do not suit the new
// mode are dropped, its defaults added, and the kernel's bond is made
// again in the new mode.
func (m *Manager) setBondMode(c *api.Call, bond string, mode dm.BondMode) error {
	row, err := c.Lookup(dm.Bond.Class, bond)
	if err != nil {
		return err
	}
	if !validMode(mode) {
		return xerr.New(xerr.InvalidValue, "mode", string(mode))
	}
	old, _ := row.Get(dm.Bond.Properties).(map[string]string)
	props, _ := bondProps(mode, old, false)
	return m.rebond(c, row, func(tx *db.Tx) error {
		if err := tx.Set(dm.Bond.Mode, bond, string(mode)); err != nil {
			return err
		}
		return tx.Set(dm.Bond.Properties, bond, props)
	})
}

// setBondProperty is Bond.set_property, checked against the bond's mode.
func (m *Manager) setBondProperty(c *api.Call, bond, name, value string) error {
	row, err := c.Lookup(dm.Bond.Class, bond)
	if err != nil {
		return err
	}
	mode := dm.BondMode(row.String(dm.Bond.Mode))
	if _, err := bondProps(mode, map[string]string{name: value}, true); err != nil {
		return err
	}
	props, _ := row.Get(dm.Bond.Properties).(map[string]string)
	props = cloneMap(props)
	props[name] = value
	return m.rebond(c, row, func(tx *db.Tx) error { return tx.Set(dm.Bond.Properties, bond, props) })
}

// rebond commits a change of a bond's mode or properties, making the
// kernel's bond again when the bond is up here (the bonding driver
// changes mode only on an empty bond).
func (m *Manager) rebond(c *api.Call, row *db.Row, mutate func(tx *db.Tx) error) error {
	master, ok := pifRecord(c.Snapshot(), row.String(dm.Bond.Master))
	if !ok {
		return c.Update(mutate)
	}
	if _, err := m.localPIF(c, row.String(dm.Bond.Master)); err != nil {
		return err
	}
	return m.change(c.Ctx, mutate, master.Device)
}
