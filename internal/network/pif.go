package network

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// localPIF reads a PIF a handler acts on; the forwarding table sends
// every PIF message to the PIF's host, so one of another host is refused
// rather than changed without its kernel.
func (m *Manager) localPIF(c *api.Call, ref string) (dm.PIFRecord, error) {
	if _, err := c.Lookup(dm.PIF.Class, ref); err != nil {
		return dm.PIFRecord{}, err
	}
	p, _ := pifRecord(c.Snapshot(), ref)
	if string(p.Host) != m.cfg.HostRef {
		return p, xerr.New(xerr.OperationNotAllowed, fmt.Sprintf("PIF %s is on host %s, not this one: the call should have been forwarded there", ref, p.Host))
	}
	return p, nil
}

func assertManaged(ref string, p *dm.PIFRecord) error {
	if !p.Managed {
		return xerr.New(xerr.PIFUnmanaged, ref)
	}
	return nil
}

// carrierPIF makes the checks VLAN.create and tunnel.create share, in
// xapi's order, on the PIF the new link is made on: network is managed,
// the PIF is on this host, the host has no PIF on network yet, and the PIF
// is managed.
func (m *Manager) carrierPIF(c *api.Call, ref, network string) (dm.PIFRecord, error) {
	if err := assertNetworkManaged(c, network); err != nil {
		return dm.PIFRecord{}, err
	}
	p, err := m.localPIF(c, ref)
	if err != nil {
		return p, err
	}
	if err := assertNoOtherLocalPIFs(c.Snapshot(), string(p.Host), network); err != nil {
		return p, err
	}
	return p, assertManaged(ref, &p)
}

// localManagedPIF is localPIF for the handlers that change a PIF the
// toolstack manages: an unmanaged one is PIF_UNMANAGED.
func (m *Manager) localManagedPIF(c *api.Call, ref string) (dm.PIFRecord, error) {
	p, err := m.localPIF(c, ref)
	if err != nil {
		return p, err
	}
	return p, assertManaged(ref, &p)
}

// assertNoOtherLocalPIFs: a host has at most one PIF on a network.
func assertNoOtherLocalPIFs(r db.Reader, host, network string) error {
	var other string
	r.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) == host && row.String(dm.PIF.Network) == network {
			other = row.Ref
			return false
		}
		return true
	})
	if other != "" {
		return xerr.New(xerr.NetworkAlreadyConnected, host, other)
	}
	return nil
}

func assertNetworkManaged(c *api.Call, network string) error {
	row, err := c.Lookup(dm.Network.Class, network)
	if err != nil {
		return err
	}
	if row.Get(dm.Network.Managed) != true {
		return xerr.New(xerr.NetworkUnmanaged, network)
	}
	return nil
}

func haEnabled(r db.Reader) bool {
	on := false
	r.Ascend(dm.Pool.Class, func(row *db.Row) bool { on = row.Get(dm.Pool.HAEnabled) == true; return false })
	return on
}

// setMapKey sets one key of a map field, whether it is there or not.
func setMapKey(tx *db.Tx, f *schema.Field, ref, key, value string) error {
	row, ok := tx.Get(f.Class, ref)
	if !ok {
		return xerr.New(xerr.HandleInvalid, f.Class.Name, ref)
	}
	old, _ := row.Get(f).(map[string]string)
	if v, has := old[key]; has && v == value {
		return nil
	}
	m := cloneMap(old)
	m[key] = value
	return tx.Set(f, ref, m)
}

// plugTx marks a PIF plugged: a management PIF not yet adopted is
// adopted (its NIC goes into the network's bridge with its addresses),
// and a tunnel's access PIF brings its transport PIF up with it.
func plugTx(tx *db.Tx, ref string) error {
	p, ok := pifRecord(tx, ref)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "PIF", ref)
	}
	if (p.Management || p.OtherConfig[AdoptedKey] == "false") && p.OtherConfig[AdoptedKey] != "true" {
		if err := setMapKey(tx, dm.PIF.OtherConfig, ref, AdoptedKey, "true"); err != nil {
			return err
		}
	}
	for _, t := range p.TunnelAccessPIFOf {
		if row, ok := tx.Get(dm.Tunnel.Class, string(t)); ok {
			if tp := row.String(dm.Tunnel.TransportPIF); tp != ref {
				if err := plugTx(tx, tp); err != nil {
					return err
				}
			}
			if err := setMapKey(tx, dm.Tunnel.Status, string(t), "active", "true"); err != nil {
				return err
			}
		}
	}
	if p.CurrentlyAttached {
		return nil
	}
	return tx.Set(dm.PIF.CurrentlyAttached, ref, true)
}

func (m *Manager) plug(c *api.Call, ref string) error {
	p, err := m.localManagedPIF(c, ref)
	if err != nil {
		return err
	}
	if !isNull(string(p.BondSlaveOf)) {
		return xerr.New(xerr.CannotPlugBondSlave, ref)
	}
	for _, t := range p.TunnelAccessPIFOf {
		if row, ok := c.Snapshot().Get(dm.Tunnel.Class, string(t)); ok {
			tp, _ := pifRecord(c.Snapshot(), row.String(dm.Tunnel.TransportPIF))
			if tp.IPConfigurationMode == dm.IPConfigurationModeNone || tp.IPConfigurationMode == "" {
				return xerr.New(xerr.TransportPIFNotConfigured, row.String(dm.Tunnel.TransportPIF))
			}
		}
	}
	return m.change(c.Ctx, func(tx *db.Tx) error { return plugTx(tx, ref) })
}

// assertNoVIFsInUse: the network has no VIF plugged into a running VM
// here.
func assertNoVIFsInUse(r db.Reader, host, network string) error {
	var busy string
	r.Ascend(dm.VIF.Class, func(row *db.Row) bool {
		if row.String(dm.VIF.Network) != network || row.Get(dm.VIF.CurrentlyAttached) != true {
			return true
		}
		vm, ok := r.Get(dm.VM.Class, row.String(dm.VIF.VM))
		if ok && vm.String(dm.VM.ResidentOn) == host {
			if ps := dm.VMPowerState(vm.String(dm.VM.PowerState)); ps == dm.VMPowerStateRunning || ps == dm.VMPowerStatePaused {
				busy = row.Ref
				return false
			}
		}
		return true
	})
	if busy != "" {
		return xerr.New(xerr.VIFInUse, network, busy)
	}
	return nil
}

// checkUnplug is xapi's list of reasons a PIF may not go down.
func (m *Manager) checkUnplug(r db.Reader, ref string, p *dm.PIFRecord) error {
	if err := assertManaged(ref, p); err != nil {
		return err
	}
	if p.CurrentlyAttached && haEnabled(r) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if p.Management {
		return xerr.New(xerr.PIFIsManagementInterface, ref)
	}
	if err := assertNoVIFsInUse(r, m.cfg.HostRef, string(p.Network)); err != nil {
		return err
	}
	if p.DisallowUnplug {
		return xerr.New(xerr.PIFDoesNotAllowUnplug, ref)
	}
	return nil
}

// unplugTx marks a PIF unplugged, with the access PIFs of the tunnels
// it carries.
func unplugTx(tx *db.Tx, ref string) error {
	p, ok := pifRecord(tx, ref)
	if !ok {
		return nil
	}
	for _, t := range p.TunnelTransportPIFOf {
		if row, ok := tx.Get(dm.Tunnel.Class, string(t)); ok {
			if err := unplugTx(tx, row.String(dm.Tunnel.AccessPIF)); err != nil {
				return err
			}
		}
	}
	for _, t := range p.TunnelAccessPIFOf {
		if _, ok := tx.Get(dm.Tunnel.Class, string(t)); ok {
			if err := setMapKey(tx, dm.Tunnel.Status, string(t), "active", "false"); err != nil {
				return err
			}
		}
	}
	if !p.CurrentlyAttached {
		return nil
	}
	return tx.Set(dm.PIF.CurrentlyAttached, ref, false)
}

func (m *Manager) unplug(c *api.Call, ref string) error {
	p, err := m.localPIF(c, ref)
	if err != nil {
		return err
	}
	snap := c.Snapshot()
	if err := m.checkUnplug(snap, ref, &p); err != nil {
		return err
	}
	for _, t := range p.TunnelTransportPIFOf {
		if row, ok := snap.Get(dm.Tunnel.Class, string(t)); ok {
			a := row.String(dm.Tunnel.AccessPIF)
			if ap, ok := pifRecord(snap, a); ok {
				if err := m.checkUnplug(snap, a, &ap); err != nil {
					return err
				}
			}
		}
	}
	return m.change(c.Ctx, func(tx *db.Tx) error { return unplugTx(tx, ref) })
}

// bridgeFor names the bridge of a NIC's own network as xapi does:
// xenbrN for ethN, br<device> otherwise.
func bridgeFor(device string) string {
	if n, ok := strings.CutPrefix(device, "eth"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		return "xenbr" + n
	}
	return "br" + device
}

// introduceTx makes the PIF of a NIC (and its network, found by bridge
// name or made, and its PIF_metrics) as PIF.introduce and PIF.scan do.
func introduceTx(tx *db.Tx, host string, l Link, mac string, managed bool) (string, error) {
	bridge := ""
	if managed {
		bridge = bridgeFor(l.Name)
	}
	network := ""
	if bridge != "" {
		tx.Ascend(dm.Network.Class, func(r *db.Row) bool {
			if r.String(dm.Network.Bridge) == bridge {
				network = r.Ref
				return false
			}
			return true
		})
	}
	if network == "" {
		var err error
		network, err = tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "Pool-wide network associated with " + l.Name,
			MTU: 1500, Bridge: bridge, Managed: managed, OtherConfig: map[string]string{}, Purpose: []dm.NetworkPurpose{},
			DefaultLockingMode: dm.NetworkDefaultLockingModeUnlocked}).Row())
		if err != nil {
			return "", err
		}
	}
	metrics, err := tx.Insert(dm.PIFMetrics.Class, "", metricsOf(l).Row())
	if err != nil {
		return "", err
	}
	mtu := int64(l.MTU)
	if mtu <= 0 {
		mtu = 1500
	}
	return tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: l.Name, Network: dm.NetworkRef(network), Host: dm.HostRef(host),
		MAC: mac, MTU: mtu, VLAN: -1, Metrics: dm.PIFMetricsRef(metrics), Physical: true,
		IPConfigurationMode: dm.IPConfigurationModeNone, IPV6ConfigurationMode: dm.IPV6ConfigurationModeNone,
		PrimaryAddressType: dm.PrimaryAddressTypeIPV4, Managed: managed, OtherConfig: map[string]string{},
		Properties: map[string]string{"gro": "on"}, Capabilities: []string{}}).Row())
}

func metricsOf(l Link) *dm.PIFMetricsRecord {
	return &dm.PIFMetricsRecord{Carrier: l.Carrier, Speed: int64(l.Speed), Duplex: l.Duplex == "full",
		VendorID: l.Vendor, DeviceID: l.Device, LastUpdated: time.Now().UTC(), OtherConfig: map[string]string{}}
}

// scan introduces every physical NIC of this host that has no PIF, and
// refreshes the metrics of those that have.
func (m *Manager) scan(c *api.Call, host string) error {
	if _, err := c.Lookup(dm.Host.Class, host); err != nil {
		return err
	}
	if host != m.cfg.HostRef {
		return xerr.New(xerr.OperationNotAllowed, "PIF.scan runs on the host scanned; the call should have been forwarded to "+host)
	}
	links, err := m.cfg.Links.List()
	if err != nil {
		return kernelErr("listing links", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return c.Update(func(tx *db.Tx) error {
		known := map[string]string{} // device -> metrics
		tx.Ascend(dm.PIF.Class, func(r *db.Row) bool {
			if r.String(dm.PIF.Host) == host && r.Get(dm.PIF.VLAN) == int64(-1) {
				known[r.String(dm.PIF.Device)] = r.String(dm.PIF.Metrics)
			}
			return true
		})
		for _, l := range links {
			if !l.Physical {
				continue
			}
			if mref, ok := known[l.Name]; ok {
				if _, ok := tx.Get(dm.PIFMetrics.Class, mref); ok {
					mr := metricsOf(l)
					if err := setFields(tx, dm.PIFMetrics.Class, mref, map[string]any{"carrier": mr.Carrier, "speed": mr.Speed,
						"duplex": mr.Duplex, "vendor_id": mr.VendorID, "device_id": mr.DeviceID, "last_updated": mr.LastUpdated}); err != nil {
						return err
					}
				}
				continue
			}
			if _, err := introduceTx(tx, host, l, strings.ToLower(l.MAC.String()), true); err != nil {
				return err
			}
		}
		return nil
	})
}

var macPattern = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)

func (m *Manager) introduce(c *api.Call, a dm.PIFIntroduceArgs) (dm.PIFRef, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return "", err
	}
	if string(a.Host) != m.cfg.HostRef {
		return "", xerr.New(xerr.OperationNotAllowed, "PIF.introduce runs on the host; the call should have been forwarded to "+string(a.Host))
	}
	links, err := m.cfg.Links.List()
	if err != nil {
		return "", kernelErr("listing links", err)
	}
	mac := strings.ToLower(a.MAC)
	var link *Link
	for i := range links {
		if links[i].Name == a.Device {
			link = &links[i]
		}
	}
	if mac == "" && link != nil {
		mac = strings.ToLower(link.MAC.String())
	}
	if !macPattern.MatchString(mac) {
		return "", xerr.New(xerr.MACInvalid, mac)
	}
	dup := false
	c.Snapshot().Ascend(dm.PIF.Class, func(r *db.Row) bool {
		dup = r.String(dm.PIF.Host) == string(a.Host) && r.String(dm.PIF.Device) == a.Device
		return !dup
	})
	if dup {
		return "", xerr.New(xerr.DuplicatePIFDeviceName, a.Device)
	}
	if link == nil || !strings.EqualFold(link.MAC.String(), mac) {
		return "", xerr.New(xerr.CouldNotFindNetworkInterfaceWithSpecifiedDeviceNameAndMACAddress, a.Device, mac)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var ref string
	err = c.Update(func(tx *db.Tx) (err error) {
		ref, err = introduceTx(tx, string(a.Host), *link, mac, a.Managed)
		return err
	})
	return dm.PIFRef(ref), err
}

func (m *Manager) forget(c *api.Call, ref string) error {
	p, err := m.localPIF(c, ref)
	if err != nil {
		return err
	}
	snap := c.Snapshot()
	switch {
	case p.Management:
		return xerr.New(xerr.PIFIsManagementInterface, ref)
	case !isNull(string(p.BondSlaveOf)) || len(p.BondMasterOf) > 0:
		if _, ok := snap.Get(dm.Bond.Class, string(p.BondSlaveOf)); ok || len(p.BondMasterOf) > 0 {
			return xerr.New(xerr.PIFAlreadyBonded, ref)
		}
	}
	if len(p.VLANSlaveOf) > 0 || p.VLAN != -1 {
		return xerr.New(xerr.PIFVLANStillExists, ref)
	}
	if len(p.TunnelTransportPIFOf) > 0 || len(p.TunnelAccessPIFOf) > 0 {
		return xerr.New(xerr.PIFTunnelStillExists, ref)
	}
	if p.CurrentlyAttached && haEnabled(snap) {
		return xerr.New(xerr.HAIsEnabled)
	}
	return m.change(c.Ctx, func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.PIFMetrics.Class, string(p.Metrics)); ok {
			if err := tx.Delete(dm.PIFMetrics.Class, string(p.Metrics)); err != nil {
				return err
			}
		}
		return tx.Delete(dm.PIF.Class, ref)
	})
}

// setFields sets several fields, by name, of one row of cls.
func setFields(tx *db.Tx, cls *schema.Class, ref string, fields map[string]any) error {
	for name, v := range fields {
		if err := tx.Set(cls.Field(name), ref, v); err != nil {
			return err
		}
	}
	return nil
}

// dnsByFamily splits a comma-separated list of DNS servers into IPv4
// and IPv6 addresses; bad says an entry is not an address.
func dnsByFamily(list string) (v4, v6 []string, bad bool) {
	for _, d := range strings.Split(list, ",") {
		d = strings.TrimSpace(d)
		switch ip := net.ParseIP(d); {
		case d == "":
		case ip == nil:
			bad = true
		case ip.To4() != nil:
			v4 = append(v4, d)
		default:
			v6 = append(v6, d)
		}
	}
	return v4, v6, bad
}

// validIPv4 is xapi's test of an address parameter.
func validIPv4(s string) bool {
	ip := net.ParseIP(s)
	return ip != nil && ip.To4() != nil && !strings.Contains(s, ":")
}

// validMask is a dotted IPv4 netmask with contiguous ones.
func validMask(s string) bool {
	if !validIPv4(s) {
		return false
	}
	ones, bits := net.IPMask(net.ParseIP(s).To4()).Size()
	return bits == 32 && ones > 0
}

func (m *Manager) reconfigureIP(c *api.Call, a dm.PIFReconfigureIPArgs) error {
	ref := string(a.Self)
	p, err := m.localManagedPIF(c, ref)
	if err != nil {
		return err
	}
	switch a.Mode {
	case dm.IPConfigurationModeNone, dm.IPConfigurationModeDHCP, dm.IPConfigurationModeStatic:
	default:
		return xerr.New(xerr.InvalidValue, "mode", string(a.Mode))
	}
	same := a.Mode == dm.IPConfigurationModeStatic && p.IPConfigurationMode == a.Mode && p.IP == a.IP &&
		p.Netmask == a.Netmask && p.Gateway == a.Gateway
	if !same && p.CurrentlyAttached && haEnabled(c.Snapshot()) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if a.Mode == dm.IPConfigurationModeStatic {
		if !validIPv4(a.IP) {
			return xerr.New(xerr.InvalidIPAddressSpecified, "IP")
		}
		if !validMask(a.Netmask) {
			return xerr.New(xerr.InvalidIPAddressSpecified, "netmask")
		}
	}
	for _, f := range [][2]string{{"IP", a.IP}, {"netmask", a.Netmask}, {"gateway", a.Gateway}} {
		if f[1] != "" && !validIPv4(f[1]) {
			return xerr.New(xerr.InvalidIPAddressSpecified, f[0])
		}
	}
	// The PIF's DNS keeps its IPv6 servers; IPv6 ones given here are
	// reconfigure_ipv6's.
	dns4, _, bad := dnsByFamily(a.DNS)
	if bad {
		return xerr.New(xerr.InvalidIPAddressSpecified, "DNS")
	}
	_, dns6, _ := dnsByFamily(p.DNS)
	if p.Management && a.Mode == dm.IPConfigurationModeNone && p.PrimaryAddressType != dm.PrimaryAddressTypeIPV6 {
		return xerr.New(xerr.PIFIsManagementInterface, ref)
	}
	if a.Mode == dm.IPConfigurationModeDHCP && m.cfg.DHCP == nil {
		why := "toolstackd runs none"
		if m.cfg.DHCPMissing != "" {
			why = m.cfg.DHCPMissing
		}
		return xerr.New(xerr.PIFConfigurationError, ref,
			"no DHCP client is available on this host ("+why+"): configure the PIF Static, or None")
	}
	err = m.change(c.Ctx, func(tx *db.Tx) error {
		return setFields(tx, dm.PIF.Class, ref, map[string]any{"ip_configuration_mode": string(a.Mode), "IP": a.IP,
			"netmask": a.Netmask, "gateway": a.Gateway, "DNS": strings.Join(append(dns4, dns6...), ",")})
	})
	if err != nil || a.Mode != dm.IPConfigurationModeDHCP || !p.CurrentlyAttached {
		m.syncDHCP() // a client leaving DHCP mode stops now: DHCP again soon after must start a new one
		return err
	}
	dev := p.Device
	if adopted(&p) {
		if row, ok := c.Snapshot().Get(dm.Network.Class, string(p.Network)); ok {
			dev = row.String(dm.Network.Bridge)
		}
	}
	if err := m.cfg.DHCP(c.Ctx, dev); err != nil {
		return xerr.New(xerr.PIFConfigurationError, ref, "DHCP on "+dev+": "+err.Error())
	}
	return nil
}

// reconfigureIPv6 is PIF.reconfigure_ipv6: None (no global IPv6 address),
// Static (the one address/prefix given, and the gateway on the
// management PIF), Autoconf (the kernel's SLAAC: addresses left to it)
// or DHCP (dhclient -6, dhcp6.go; refused without it, naming the
// package to install).
func (m *Manager) reconfigureIPv6(c *api.Call, a dm.PIFReconfigureIPV6Args) error {
	ref := string(a.Self)
	p, err := m.localManagedPIF(c, ref)
	if err != nil {
		return err
	}
	switch a.Mode {
	case dm.IPV6ConfigurationModeNone, dm.IPV6ConfigurationModeDHCP, dm.IPV6ConfigurationModeStatic, dm.IPV6ConfigurationModeAutoconf:
	default:
		return xerr.New(xerr.InvalidValue, "mode", string(a.Mode))
	}
	var addrs []string
	if a.Mode == dm.IPV6ConfigurationModeStatic {
		if _, ok := parseIPv6CIDR(a.IPV6); !ok {
			return xerr.New(xerr.InvalidIPAddressSpecified, "IPv6")
		}
		addrs = []string{a.IPV6}
	}
	if a.Gateway != "" {
		if ip := net.ParseIP(a.Gateway); ip == nil || ip.To4() != nil {
			return xerr.New(xerr.InvalidIPAddressSpecified, "gateway")
		}
	}
	// The PIF's DNS keeps its IPv4 servers; only IPv6 ones may be given.
	given4, dns6, bad := dnsByFamily(a.DNS)
	if bad || len(given4) > 0 {
		return xerr.New(xerr.InvalidIPAddressSpecified, "DNS")
	}
	dns4, _, _ := dnsByFamily(p.DNS)
	same := a.Mode == p.IPV6ConfigurationMode && slices.Equal(addrs, p.IPV6) && a.Gateway == p.IPV6Gateway
	if !same && p.CurrentlyAttached && haEnabled(c.Snapshot()) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if p.Management && a.Mode == dm.IPV6ConfigurationModeNone && p.PrimaryAddressType == dm.PrimaryAddressTypeIPV6 {
		return xerr.New(xerr.PIFIsManagementInterface, ref)
	}
	if a.Mode == dm.IPV6ConfigurationModeDHCP && m.dhcp6 == nil {
		why := "toolstackd runs none: dhclient, Debian package " + DHCP6Package
		if m.cfg.DHCP6Missing != "" {
			why = m.cfg.DHCP6Missing
		}
		return xerr.New(xerr.PIFConfigurationError, ref,
			"no DHCPv6 client is available on this host ("+why+"): configure the PIF Static, Autoconf or None")
	}
	if addrs == nil {
		addrs = []string{}
	}
	err = m.change(c.Ctx, func(tx *db.Tx) error {
		return setFields(tx, dm.PIF.Class, ref, map[string]any{"ipv6_configuration_mode": string(a.Mode), "IPv6": addrs,
			"ipv6_gateway": a.Gateway, "DNS": strings.Join(append(dns4, dns6...), ",")})
	})
	if err != nil || a.Mode != dm.IPV6ConfigurationModeDHCP || !p.CurrentlyAttached {
		m.syncDHCP6() // a client leaving DHCP mode stops now, not at Watch's next look
		return err
	}
	// The client (dhcp6clients.go), and its first lease waited for.
	if err := m.startDHCP6(c.Ctx, ref); err != nil {
		return xerr.New(xerr.PIFConfigurationError, ref, "DHCPv6: "+err.Error())
	}
	return nil
}

func (m *Manager) setPrimaryAddressType(c *api.Call, a dm.PIFSetPrimaryAddressTypeArgs) error {
	ref := string(a.Self)
	p, err := m.localPIF(c, ref)
	if err != nil {
		return err
	}
	if p.CurrentlyAttached && haEnabled(c.Snapshot()) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if p.Management {
		return xerr.New(xerr.PIFIsManagementInterface, ref)
	}
	switch a.PrimaryAddressType {
	case dm.PrimaryAddressTypeIPV4, dm.PrimaryAddressTypeIPV6:
	default:
		return xerr.New(xerr.InvalidValue, "primary_address_type", string(a.PrimaryAddressType))
	}
	return c.Update(func(tx *db.Tx) error { return tx.Set(dm.PIF.PrimaryAddressType, ref, string(a.PrimaryAddressType)) })
}

// dbIntroduce is PIF.db_introduce: the record only, as xapi's
// pool_introduce makes it (never plugged).
func dbIntroduce(c *api.Call, a dm.PIFDbIntroduceArgs) (dm.PIFRef, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return "", err
	}
	if _, err := c.Lookup(dm.Network.Class, string(a.Network)); err != nil {
		return "", err
	}
	var ref string
	err := c.Update(func(tx *db.Tx) error {
		metrics, err := tx.Insert(dm.PIFMetrics.Class, "", (&dm.PIFMetricsRecord{OtherConfig: map[string]string{}}).Row())
		if err != nil {
			return err
		}
		oc := a.OtherConfig
		if oc == nil {
			oc = map[string]string{}
		}
		props := a.Properties
		if props == nil {
			props = map[string]string{}
		}
		ref, err = tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: a.Device, Network: a.Network, Host: a.Host, MAC: a.MAC,
			MTU: a.MTU, VLAN: a.VLAN, Metrics: dm.PIFMetricsRef(metrics), Physical: a.Physical, IPConfigurationMode: a.IPConfigurationMode,
			IP: a.IP, Netmask: a.Netmask, Gateway: a.Gateway, DNS: a.DNS, VLANMasterOf: a.VLANMasterOf, Management: a.Management,
			OtherConfig: oc, DisallowUnplug: a.DisallowUnplug, IPV6ConfigurationMode: a.IPV6ConfigurationMode, IPV6: a.IPV6,
			IPV6Gateway: a.IPV6Gateway, PrimaryAddressType: a.PrimaryAddressType, Managed: a.Managed, Properties: props,
			Capabilities: []string{}}).Row())
		return err
	})
	return dm.PIFRef(ref), err
}

func dbForget(c *api.Call, ref string) error {
	if _, err := c.Lookup(dm.PIF.Class, ref); err != nil {
		return err
	}
	return c.Update(func(tx *db.Tx) error { return tx.Delete(dm.PIF.Class, ref) })
}
