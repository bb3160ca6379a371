package network

import (
	"crypto/sha256"
	"fmt"
	"net"
	"slices"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// AdoptedKey is the PIF.other_config key that marks a management PIF
// whose NIC toolstackd has taken over: "true" once the operator plugged
// it (PIF.plug). Until then the NIC that carried the host's address
// when toolstackd first started is left exactly as the distribution set
// it up: it is not put in a bridge, not made ours, not changed.
const AdoptedKey = "toolstackd-adopted"

// Plan is the kernel state this host should have for the networks in
// the database: what Compute derives and Manager.Apply makes real.
type Plan struct {
	Bridges []Bridge
	Bonds   []Bond
	VLANs   []VLAN
	VXLANs  []VXLAN
	// Up lists NICs under a VLAN that must be up without being a
	// bridge port or a bond member.
	Up []string
	// Addrs are the IPv4 addresses wanted on the bridge of a plugged
	// PIF: absent bridges are left alone (DHCP), empty means none (mode
	// None).
	Addrs map[string][]net.IPNet
	// Gateway is the IPv4 default route through the management PIF when
	// that is Static with a gateway.
	Gateway *Gateway
	// Addrs6 and Gateway6 are the same for IPv6 (Static: the PIF's IPv6
	// addresses; None: none; Autoconf: left to the kernel; DHCP: left
	// to the DHCPv6 client, dhcp6clients.go). Link-local addresses are
	// never touched.
	Addrs6   map[string][]net.IPNet
	Gateway6 *Gateway
	// GRO is the generic receive offload wanted on a device (a plugged
	// PIF's "gro" property, properties.go).
	GRO map[string]bool
	// Errors are PIFs that could not be planned, left out of the rest.
	Errors []PlanError
}

// Bridge is a network's Linux bridge and its ports.
type Bridge struct {
	Name    string
	MTU     int
	Network string // the network's ref
	Ports   []string
}

// Bond is a bond device and its member NICs.
type Bond struct {
	Name    string
	Mode    string // the Linux driver's mode
	Props   map[string]string
	Members []string
	MTU     int
	MAC     net.HardwareAddr
}

// VLAN is an 802.1Q link "<parent>.<tag>".
type VLAN struct {
	Name, Parent string
	Tag, MTU     int
}

// VXLAN is one point-to-point VXLAN link of a tunnel network.
type VXLAN struct {
	Name          string
	VNI           int
	Local, Remote net.IP
	MTU           int
}

// Gateway is a default route.
type Gateway struct {
	IP  net.IP
	Dev string
}

// PlanError says why a PIF is not in the plan.
type PlanError struct {
	PIF string
	Err error
}

// Compute is the kernel state host should have, from a view of the
// database. extra are networks asked for outside the database (VIFs
// being plugged, network.attach). It reads only, and only this host's
// share: a remote host's PIFs matter only as the far end of a tunnel.
func Compute(r db.Reader, host string, extra map[string]bool) *Plan {
	c := &planner{r: r, host: host, p: &Plan{Addrs: map[string][]net.IPNet{}, Addrs6: map[string][]net.IPNet{}},
		bonds: map[string]bool{}, vlans: map[string]bool{}, up: map[string]bool{}}
	c.run(extra)
	return c.p
}

type planner struct {
	r     db.Reader
	host  string
	p     *Plan
	bonds map[string]bool
	vlans map[string]bool
	up    map[string]bool
}

func isNull(ref string) bool { return ref == "" || ref == schema.NullRef }

func pifRecord(r db.Reader, ref string) (dm.PIFRecord, bool) {
	var rec dm.PIFRecord
	row, ok := r.Get(dm.PIF.Class, ref)
	if !ok {
		return rec, false
	}
	rec.FromRow(r.Values(row))
	return rec, true
}

// adopted reports whether a PIF may be bridged: every PIF but a
// management PIF the operator has not plugged since toolstackd started
// managing the host, and such a PIF after management moved away from it
// (AdoptedKey "false", see management.go) until it is plugged.
func adopted(p *dm.PIFRecord) bool {
	switch p.OtherConfig[AdoptedKey] {
	case "true":
		return true
	case "false":
		return false
	}
	return !p.Management
}

func mtuOf(r db.Reader, network string) int {
	row, ok := r.Get(dm.Network.Class, network)
	if !ok {
		return 1500
	}
	if m, _ := row.Get(dm.Network.MTU).(int64); m > 0 {
		return int(m)
	}
	return 1500
}

func (c *planner) run(extra map[string]bool) {
	r := c.r
	want := map[string]bool{}
	local := map[string]dm.PIFRecord{} // network -> this host's PIF on it
	var pifs []dm.PIFRecord
	var refs []string
	r.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) != c.host {
			return true
		}
		var p dm.PIFRecord
		p.FromRow(r.Values(row))
		pifs, refs = append(pifs, p), append(refs, row.Ref)
		return true
	})
	for _, p := range pifs {
		if !isNull(string(p.BondSlaveOf)) {
			continue // a member: part of its bond, never a port of its own network
		}
		if old, dup := local[string(p.Network)]; !dup || (!old.CurrentlyAttached && p.CurrentlyAttached) {
			local[string(p.Network)] = p
		}
		if !p.CurrentlyAttached || !p.Managed {
			continue
		}
		if !adopted(&p) {
			continue // its NIC, addresses and routes are the distribution's
		}
		want[string(p.Network)] = true
	}
	r.Ascend(dm.VIF.Class, func(row *db.Row) bool {
		if row.Get(dm.VIF.CurrentlyAttached) != true {
			return true
		}
		vm, ok := r.Get(dm.VM.Class, row.String(dm.VIF.VM))
		if !ok || vm.String(dm.VM.ResidentOn) != c.host {
			return true
		}
		if ps := dm.VMPowerState(vm.String(dm.VM.PowerState)); ps == dm.VMPowerStateRunning || ps == dm.VMPowerStatePaused {
			want[row.String(dm.VIF.Network)] = true
		}
		return true
	})
	for n := range extra {
		want[n] = true
	}
	nets := make([]string, 0, len(want))
	for n := range want {
		if _, ok := r.Get(dm.Network.Class, n); ok {
			nets = append(nets, n)
		}
	}
	slices.Sort(nets)
	for _, n := range nets {
		row, _ := r.Get(dm.Network.Class, n)
		br := Bridge{Name: row.String(dm.Network.Bridge), MTU: mtuOf(r, n), Network: n}
		if br.Name == "" {
			c.p.Errors = append(c.p.Errors, PlanError{Err: xerr.New(xerr.BridgeNotAvailable, n)})
			continue
		}
		if p, ok := local[n]; ok && p.CurrentlyAttached && p.Managed && adopted(&p) {
			ref := c.refOf(pifs, refs, &p)
			ports, err := c.ports(ref, &p, br.MTU)
			if err != nil {
				c.p.Errors = append(c.p.Errors, PlanError{PIF: ref, Err: err})
			} else {
				br.Ports = append(br.Ports, ports...)
				c.address(ref, &p, br.Name)
				c.gro(&p)
			}
		}
		slices.Sort(br.Ports)
		c.p.Bridges = append(c.p.Bridges, br)
	}
	slices.SortFunc(c.p.Bridges, func(a, b Bridge) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(c.p.Bonds, func(a, b Bond) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(c.p.VLANs, func(a, b VLAN) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(c.p.VXLANs, func(a, b VXLAN) int { return strings.Compare(a.Name, b.Name) })
	for d := range c.up {
		c.p.Up = append(c.p.Up, d)
	}
	slices.Sort(c.p.Up)
}

func (c *planner) refOf(pifs []dm.PIFRecord, refs []string, p *dm.PIFRecord) string {
	for i := range pifs {
		if pifs[i].UUID == p.UUID {
			return refs[i]
		}
	}
	return ""
}

// address records the IPv4 configuration of a plugged PIF on its
// bridge, and the default route of the management PIF.
func (c *planner) address(ref string, p *dm.PIFRecord, carrier string) {
	switch p.IPConfigurationMode {
	case dm.IPConfigurationModeStatic:
		ip, mask := net.ParseIP(p.IP).To4(), net.ParseIP(p.Netmask).To4()
		if ip == nil || mask == nil {
			c.p.Errors = append(c.p.Errors, PlanError{PIF: ref, Err: xerr.New(xerr.InvalidIPAddressSpecified, "IP")})
			return
		}
		c.p.Addrs[carrier] = []net.IPNet{{IP: ip, Mask: net.IPMask(mask)}}
		if gw := net.ParseIP(p.Gateway).To4(); p.Management && gw != nil {
			c.p.Gateway = &Gateway{IP: gw, Dev: carrier}
		}
	case dm.IPConfigurationModeNone:
		c.p.Addrs[carrier] = []net.IPNet{}
	}
	switch p.IPV6ConfigurationMode {
	case dm.IPV6ConfigurationModeStatic:
		addrs := []net.IPNet{}
		for _, a := range p.IPV6 {
			n, ok := parseIPv6CIDR(a)
			if !ok {
				c.p.Errors = append(c.p.Errors, PlanError{PIF: ref, Err: xerr.New(xerr.InvalidIPAddressSpecified, "IPv6")})
				return
			}
			addrs = append(addrs, n)
		}
		c.p.Addrs6[carrier] = addrs
		if gw := net.ParseIP(p.IPV6Gateway); p.Management && gw != nil && gw.To4() == nil {
			c.p.Gateway6 = &Gateway{IP: gw, Dev: carrier}
		}
	case dm.IPV6ConfigurationModeNone:
		c.p.Addrs6[carrier] = []net.IPNet{}
	}
}

// parseIPv6CIDR reads "address/prefix" of an IPv6 address, keeping the
// host's address (not the network's).
func parseIPv6CIDR(s string) (net.IPNet, bool) {
	ip, n, err := net.ParseCIDR(s)
	if err != nil || ip.To4() != nil {
		return net.IPNet{}, false
	}
	return net.IPNet{IP: ip, Mask: n.Mask}, true
}

// ports are the links a plugged PIF puts in its network's bridge,
// planning the bonds, VLANs and VXLAN links they need.
func (c *planner) ports(ref string, p *dm.PIFRecord, mtu int) ([]string, error) {
	switch {
	case len(p.TunnelAccessPIFOf) > 0:
		return c.tunnel(ref, p, mtu)
	case !isNull(string(p.VLANMasterOf)):
		dev, err := c.vlan(p, mtu)
		if err != nil {
			return nil, err
		}
		return []string{dev}, nil
	case len(p.BondMasterOf) > 0:
		return []string{p.Device}, c.bond(ref, p, mtu)
	case p.Physical:
		return []string{p.Device}, nil
	}
	return nil, xerr.New(xerr.PIFConfigurationError, ref, "PIF is neither physical, a bond, a VLAN nor a tunnel")
}

// lower makes sure the device a VLAN sits on exists and is up, and
// names it.
func (c *planner) lower(ref string, mtu int) (string, error) {
	t, ok := pifRecord(c.r, ref)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "PIF", ref)
	}
	switch {
	case len(t.BondMasterOf) > 0:
		return t.Device, c.bond(ref, &t, mtuOf(c.r, string(t.Network)))
	case !isNull(string(t.BondSlaveOf)):
		return "", xerr.New(xerr.CannotAddVLANToBondSlave, ref)
	case t.Physical:
		c.up[t.Device] = true
		if adopted(&t) {
			c.gro(&t)
		}
		return t.Device, nil
	}
	return "", xerr.New(xerr.PIFIsVLAN, ref)
}

func (c *planner) vlan(p *dm.PIFRecord, mtu int) (string, error) {
	row, ok := c.r.Get(dm.VLAN.Class, string(p.VLANMasterOf))
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VLAN", string(p.VLANMasterOf))
	}
	tag, _ := row.Get(dm.VLAN.Tag).(int64)
	parent, err := c.lower(row.String(dm.VLAN.TaggedPIF), mtu)
	if err != nil {
		return "", err
	}
	name := VLANName(parent, int(tag))
	if !c.vlans[name] {
		c.vlans[name] = true
		c.p.VLANs = append(c.p.VLANs, VLAN{Name: name, Parent: parent, Tag: int(tag), MTU: mtu})
	}
	return name, nil
}

// VLANName is the kernel name of a VLAN: "<parent>.<tag>".
func VLANName(parent string, tag int) string { return fmt.Sprintf("%s.%d", parent, tag) }

func (c *planner) bond(ref string, p *dm.PIFRecord, mtu int) error {
	if c.bonds[p.Device] {
		return nil
	}
	row, ok := c.r.Get(dm.Bond.Class, string(p.BondMasterOf[0]))
	if !ok {
		return xerr.New(xerr.HandleInvalid, "Bond", string(p.BondMasterOf[0]))
	}
	var b dm.BondRecord
	b.FromRow(c.r.Values(row))
	mode, props := LinuxBond(b.Mode, b.Properties)
	bond := Bond{Name: p.Device, Mode: mode, Props: props, MTU: mtu}
	if mac, err := net.ParseMAC(p.MAC); err == nil {
		bond.MAC = mac
	}
	for _, s := range b.Slaves {
		if m, ok := pifRecord(c.r, string(s)); ok {
			bond.Members = append(bond.Members, m.Device)
		}
	}
	if len(bond.Members) == 0 {
		return xerr.New(xerr.PIFBondNeedsMoreMembers)
	}
	slices.Sort(bond.Members)
	c.bonds[p.Device] = true
	c.p.Bonds = append(c.p.Bonds, bond)
	return nil
}

// LinuxBond maps a XenAPI bond mode and its properties to the Linux
// bonding driver's: balance-slb (Open vSwitch's source-MAC balancing,
// which needs nothing of the switch) becomes balance-tlb, which needs
// nothing of the switch either (balance-xor would want a static link
// aggregation on the switch); active-backup stays; lacp becomes 802.3ad
// with hashing_algorithm src_mac/tcpudp_ports as xmit_hash_policy
// layer2/layer3+4 and lacp-time as lacp_rate. Links are watched with
// miimon every 100 ms.
func LinuxBond(mode dm.BondMode, props map[string]string) (string, map[string]string) {
	out := map[string]string{"miimon": "100"}
	switch mode {
	case dm.BondModeActiveBackup:
		return "active-backup", out
	case dm.BondModeLacp:
		out["xmit_hash_policy"] = "layer3+4"
		if props["hashing_algorithm"] == "src_mac" {
			out["xmit_hash_policy"] = "layer2"
		}
		out["lacp_rate"] = "slow"
		if props["lacp-time"] == "fast" {
			out["lacp_rate"] = "fast"
		}
		return "802.3ad", out
	}
	return "balance-tlb", out
}

// tunnel plans the VXLAN links of a tunnel's access PIF. The hosts with
// a tunnel on the network are joined as a star, not a full mesh: Linux
// bridges forward between ports, so a mesh of three or more would loop
// broadcasts. The hub is the pool's coordinator when it has a tunnel on
// the network, otherwise the host with the smallest uuid among those
// that have one; it links to every other, and every other links to it.
// Each link has a VNI of its own (VNIFor), as the kernel allows one
// VXLAN device per VNI and port.
func (c *planner) tunnel(ref string, p *dm.PIFRecord, mtu int) ([]string, error) {
	r := c.r
	tun, ok := r.Get(dm.Tunnel.Class, string(p.TunnelAccessPIFOf[0]))
	if !ok {
		return nil, xerr.New(xerr.HandleInvalid, "tunnel", string(p.TunnelAccessPIFOf[0]))
	}
	transport, ok := pifRecord(r, tun.String(dm.Tunnel.TransportPIF))
	local := net.ParseIP(transport.IP)
	if !ok || local == nil {
		return nil, xerr.New(xerr.TransportPIFNotConfigured, tun.String(dm.Tunnel.TransportPIF))
	}
	netRow, _ := r.Get(dm.Network.Class, string(p.Network))
	netUUID := ""
	if netRow != nil {
		netUUID = netRow.UUID()
	}
	// The far ends: every other host with a tunnel on this network.
	ends := map[string]net.IP{} // host ref -> transport IP
	r.Ascend(dm.Tunnel.Class, func(row *db.Row) bool {
		a, ok := pifRecord(r, row.String(dm.Tunnel.AccessPIF))
		if !ok || a.Network != p.Network {
			return true
		}
		t, _ := pifRecord(r, row.String(dm.Tunnel.TransportPIF))
		ends[string(a.Host)] = net.ParseIP(t.IP)
		return true
	})
	uuidOf := func(h string) string {
		if row, ok := r.Get(dm.Host.Class, h); ok {
			return row.UUID()
		}
		return h
	}
	hub := ""
	r.Ascend(dm.Pool.Class, func(row *db.Row) bool {
		if _, has := ends[row.String(dm.Pool.Master)]; has {
			hub = row.String(dm.Pool.Master)
		}
		return false
	})
	if hub == "" {
		for h := range ends {
			if hub == "" || uuidOf(h) < uuidOf(hub) {
				hub = h
			}
		}
	}
	var far []string
	if hub == c.host {
		for h := range ends {
			if h != c.host {
				far = append(far, h)
			}
		}
	} else if _, ok := ends[hub]; ok {
		far = append(far, hub)
	}
	slices.Sort(far)
	var ports []string
	for _, h := range far {
		remote := ends[h]
		if remote == nil {
			continue // its transport PIF has no address yet
		}
		spoke := h
		if h == hub {
			spoke = c.host
		}
		vni := VNIFor(netUUID, uuidOf(spoke))
		name := fmt.Sprintf("vx%06x", vni)
		if slices.ContainsFunc(c.p.VXLANs, func(v VXLAN) bool { return v.Name == name }) {
			c.p.Errors = append(c.p.Errors, PlanError{PIF: ref, Err: xerr.New(xerr.PIFConfigurationError, ref,
				fmt.Sprintf("VNI %d of the link to host %s is used by another tunnel here", vni, h))})
			continue
		}
		c.p.VXLANs = append(c.p.VXLANs, VXLAN{Name: name, VNI: vni, Local: local, Remote: remote, MTU: mtu})
		ports = append(ports, name)
	}
	return ports, nil
}

// VNIFor is the VNI of the link between a tunnel network's hub and one
// of its spokes: the first 24 bits of SHA-256("<network uuid>/<spoke
// host uuid>"), never 0. Both ends compute the same number from the
// database, and it does not change while the network and host exist.
func VNIFor(networkUUID, spokeUUID string) int {
	h := sha256.Sum256([]byte(strings.ToLower(networkUUID) + "/" + strings.ToLower(spokeUUID)))
	v := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	if v == 0 {
		v = 1
	}
	return v
}
