package network

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

func TestScanIntroducesNICs(t *testing.T) {
	e := newEnv(t, Link{Name: "docker0", Kind: "bridge"}, Link{Name: "tap0", Kind: "tuntap"})
	e.scan()
	e.scan() // nothing new the second time
	snap := e.d.Snapshot()
	if n := snap.Count(dm.PIF.Class); n != 4 {
		t.Fatalf("%d PIFs, want eth0..eth3", n)
	}
	p := e.pif(e.pifOn("eth2", -1))
	row, _ := snap.Get(dm.Network.Class, string(p.Network))
	if row.String(dm.Network.Bridge) != "xenbr2" || p.MAC != "52:54:00:00:00:02" || p.MTU != 1500 || !p.Physical || p.CurrentlyAttached ||
		p.IPConfigurationMode != dm.IPConfigurationModeNone || !p.Managed {
		t.Fatalf("PIF %+v on %s", p, row.String(dm.Network.Bridge))
	}
	var m dm.PIFMetricsRecord
	mrow, _ := snap.Get(dm.PIFMetrics.Class, string(p.Metrics))
	m.FromRow(snap.Values(mrow))
	if !m.Carrier || m.Speed != 1000 || !m.Duplex || m.VendorID != "8086" || m.DeviceID != "100e" {
		t.Fatalf("metrics %+v", m)
	}
	wantCalls(t, e.rec.Calls())
}

func TestIntroduceAndForget(t *testing.T) {
	e := newEnv(t)
	e.fails(xerr.MACInvalid, "PIF.introduce", e.host, "52:54:00:00:01", "eth1", true)
	e.fails(xerr.CouldNotFindNetworkInterfaceWithSpecifiedDeviceNameAndMACAddress, "PIF.introduce", e.host, "52:54:00:00:00:09", "eth1", true)
	e.fails(xerr.DuplicatePIFDeviceName, "PIF.introduce", e.host, "", "eth0", true)
	p := e.ok("PIF.introduce", e.host, "52:54:00:00:00:01", "eth1", true)
	e.ok("PIF.plug", p)
	e.rec.Reset()
	e.ok("PIF.forget", p)
	wantCalls(t, e.rec.Calls(), "delete xenbr1")
	if strings.Join(kernel(e.rec), "|") != "eth0 device|eth1 device|eth2 device|eth3 device" {
		t.Fatalf("kernel after forget: %q", kernel(e.rec))
	}
	e.fails(xerr.PIFIsManagementInterface, "PIF.forget", e.mgmt)
	e.fails(xerr.PIFIsManagementInterface, "PIF.unplug", e.mgmt)
	e.fails(xerr.PIFIsManagementInterface, "PIF.set_primary_address_type", e.mgmt, "IPv6")
	ref := e.ok("PIF.db_introduce", "eth9", e.d.Snapshot().All(dm.Network.Class)[0].Ref, e.host, "52:54:00:00:00:09", int64(1500), int64(-1),
		true, "None", "", "", "", "", "OpaqueRef:NULL", "OpaqueRef:NULL", false, map[string]string{})
	if e.pif(ref).CurrentlyAttached {
		t.Fatal("db_introduce plugged")
	}
	e.ok("PIF.db_forget", ref)
}

func TestVLANErrors(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	for _, tag := range []int64{-1, 4095} {
		if err := e.fails(xerr.VLANTagInvalid, "VLAN.create", eth1, tag, e.network("bad")); err.Params[0] != fmt.Sprint(tag) {
			t.Fatalf("params %v", err.Params)
		}
	}
	n := e.network("v10")
	vlan := e.ok("VLAN.create", eth1, int64(10), n)
	e.fails(xerr.NetworkAlreadyConnected, "VLAN.create", eth1, int64(11), n)
	if err := e.fails(xerr.PIFVLANExists, "VLAN.create", eth1, int64(10), e.network("again")); err.Params[0] != "eth1" {
		t.Fatalf("params %v", err.Params)
	}
	e.fails(xerr.PIFIsVLAN, "VLAN.create", e.pifOn("eth1", 10), int64(20), e.network("qinq"))
	e.fails(xerr.PIFVLANStillExists, "PIF.forget", eth1)
	e.fails(xerr.PIFIsPhysical, "PIF.destroy", eth1)
	// The old form answers the VLAN's PIF.
	u := e.ok("PIF.create_VLAN", "eth2", e.network("v30"), e.host, int64(30))
	if p := e.pif(u); p.VLAN != 30 || p.Device != "eth2" || !p.CurrentlyAttached {
		t.Fatalf("PIF.create_VLAN made %+v", p)
	}
	e.fails(xerr.InvalidValue, "PIF.create_VLAN", "eth9", e.network("v31"), e.host, int64(31))
	e.ok("PIF.destroy", u)
	// A VM running on the VLAN's network keeps it.
	_, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	if err := e.fails(xerr.VIFInUse, "VLAN.destroy", vlan); err.Params[1] != vif {
		t.Fatalf("params %v", err.Params)
	}
	e.fails(xerr.VIFInUse, "PIF.unplug", e.pifOn("eth1", 10))
}

func TestBondErrors(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1, eth2, eth3 := e.pifOn("eth1", -1), e.pifOn("eth2", -1), e.pifOn("eth3", -1)
	none := map[string]string{}
	e.fails(xerr.PIFBondNeedsMoreMembers, "Bond.create", e.network("b"), []string{eth1}, "", "active-backup", none)
	e.fails(xerr.PIFBondNeedsMoreMembers, "Bond.create", e.network("b"), []string{eth1, eth1}, "", "active-backup", none)
	e.fails(xerr.PIFIsManagementInterface, "Bond.create", e.network("b"), []string{e.mgmt, eth1}, "", "active-backup", none)
	e.fails(xerr.MACInvalid, "Bond.create", e.network("b"), []string{eth1, eth2}, "nope", "active-backup", none)
	if err := e.fails(xerr.InvalidValue, "Bond.create", e.network("b"), []string{eth1, eth2}, "", "active-backup",
		map[string]string{"lacp-time": "fast"}); err.Params[1] != "lacp-time = fast" {
		t.Fatalf("params %v", err.Params)
	}
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	e.ok("PIF.reconfigure_ip", eth2, "Static", "10.0.1.1", "255.255.255.0", "", "")
	e.fails(xerr.PIFBondMoreThanOneIP, "Bond.create", e.network("b"), []string{eth1, eth2}, "", "active-backup", none)
	bond := e.ok("Bond.create", e.network("b"), []string{eth2, eth3}, "02:00:00:00:00:99", "balance-slb", none)
	e.fails(xerr.PIFAlreadyBonded, "Bond.create", e.network("c"), []string{eth1, eth3}, "", "active-backup", none)
	e.fails(xerr.CannotPlugBondSlave, "PIF.plug", eth3)
	e.fails(xerr.CannotAddVLANToBondSlave, "VLAN.create", eth3, int64(5), e.network("v"))
	e.fails(xerr.PIFAlreadyBonded, "PIF.forget", eth3)
	e.fails(xerr.InvalidValue, "Bond.set_property", bond, "lacp-time", "fast")
	row, _ := e.d.Snapshot().Get(dm.Bond.Class, bond)
	master := e.pif(row.String(dm.Bond.Master))
	if master.IP != "10.0.1.1" || master.MAC != "02:00:00:00:00:99" || e.pif(eth2).IP != "" {
		t.Fatalf("IP configuration not moved to the master: %+v", master)
	}
	e.ok("Bond.destroy", bond)
	if p := e.pif(eth2); p.IP != "10.0.1.1" || !isNull(string(p.BondSlaveOf)) {
		t.Fatalf("IP configuration not back on the primary member: %+v", p)
	}
}

func TestReconfigureIP(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	for _, c := range []struct{ ip, mask, gw, dns, param string }{
		{"10.0.0.300", "255.255.255.0", "", "", "IP"},
		{"", "255.255.255.0", "", "", "IP"},
		{"10.0.0.1", "255.0.255.0", "", "", "netmask"},
		{"10.0.0.1", "", "", "", "netmask"},
		{"10.0.0.1", "255.255.255.0", "gw", "", "gateway"},
		{"10.0.0.1", "255.255.255.0", "", "8.8.8.8,dns", "DNS"},
	} {
		if err := e.fails(xerr.InvalidIPAddressSpecified, "PIF.reconfigure_ip", eth1, "Static", c.ip, c.mask, c.gw, c.dns); err.Params[0] != c.param {
			t.Fatalf("%+v: params %v", c, err.Params)
		}
	}
	err := e.fails(xerr.PIFConfigurationError, "PIF.reconfigure_ip", eth1, "DHCP", "", "", "", "")
	if !strings.Contains(err.Params[1], "DHCP") {
		t.Fatalf("unclear: %v", err)
	}
	e.fails(xerr.PIFIsManagementInterface, "PIF.reconfigure_ip", e.mgmt, "None", "", "", "", "")
	// The management NIC not adopted keeps the distribution's address.
	e.rec.Reset()
	e.ok("PIF.reconfigure_ip", e.mgmt, "Static", "192.0.2.10", "255.255.255.0", "192.0.2.1", "")
	wantCalls(t, e.rec.Calls())
	e.ok("PIF.plug", eth1)
	e.rec.Reset()
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "10.0.0.254", "10.0.0.53,2001:db8::53")
	wantCalls(t, e.rec.Calls(), "addrs xenbr1 4 10.0.0.1/24")
	if p := e.pif(eth1); p.DNS != "10.0.0.53" || p.Gateway != "10.0.0.254" || p.IPConfigurationMode != dm.IPConfigurationModeStatic {
		t.Fatalf("PIF %+v", p)
	}
	e.rec.Reset()
	e.ok("PIF.reconfigure_ip", eth1, "None", "", "", "", "")
	wantCalls(t, e.rec.Calls(), "addrs xenbr1 4 ")
}

func TestReconfigureIPv6(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	for _, c := range []struct{ mode, ip, gw, dns, param string }{
		{"Static", "2001:db8::1", "", "", "IPv6"},
		{"Static", "10.0.0.1/24", "", "", "IPv6"},
		{"Static", "2001:db8::1/64", "10.0.0.1", "", "gateway"},
		{"Static", "2001:db8::1/64", "", "2001:db8::53,8.8.8.8", "DNS"},
	} {
		if err := e.fails(xerr.InvalidIPAddressSpecified, "PIF.reconfigure_ipv6", eth1, c.mode, c.ip, c.gw, c.dns); err.Params[0] != c.param {
			t.Fatalf("%+v: params %v", c, err.Params)
		}
	}
	e.fails(xerr.InvalidValue, "PIF.reconfigure_ipv6", eth1, "Magic", "", "", "")
	// DHCP is refused only on a host without a DHCPv6 client, naming the
	// package (dhcp6_test.go runs one).
	if err := e.fails(xerr.PIFConfigurationError, "PIF.reconfigure_ipv6", eth1, "DHCP", "", "", ""); !strings.Contains(err.Params[1], DHCP6Package) {
		t.Fatalf("unclear: %v", err)
	}
	e.m.dhcp6 = newDHCP6Clients(e.m, &scriptedDHCP6{lease: []string{"BOUND6", "2001:db8::7", "128", "", "", "", "", ""}})
	t.Cleanup(e.m.stopDHCP6)
	e.ok("PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	if p := e.pif(eth1); p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeDHCP || len(p.IPV6) != 0 {
		t.Fatalf("DHCP on an unplugged PIF: %+v", p)
	}
	// What xapi refuses is refused with DHCP too.
	e.fails(xerr.InvalidIPAddressSpecified, "PIF.reconfigure_ipv6", eth1, "DHCP", "", "10.0.0.1", "")
	e.fails(xerr.InvalidIPAddressSpecified, "PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "8.8.8.8")
	e.ok("PIF.plug", eth1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "10.0.0.53")
	// The DHCPv6 client (started as the database asks) applies its lease
	// on its own goroutine: wait for it, so that it does not land among
	// the calls checked below.
	deadline := time.Now().Add(30 * time.Second)
	for p := e.pif(eth1); len(p.IPV6) != 1 || p.IPV6[0] != "2001:db8::7/128"; p = e.pif(eth1) {
		if time.Now().After(deadline) {
			t.Fatalf("the DHCPv6 lease was not applied: %+v", p)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.rec.Reset()
	e.ok("PIF.reconfigure_ipv6", eth1, "Static", "2001:db8::1/64", "2001:db8::fffe", "2001:db8::53")
	wantCalls(t, e.rec.Calls(), "addrs xenbr1 6 2001:db8::1/64")
	p := e.pif(eth1)
	if p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeStatic || len(p.IPV6) != 1 || p.IPV6[0] != "2001:db8::1/64" ||
		p.IPV6Gateway != "2001:db8::fffe" || p.DNS != "10.0.0.53,2001:db8::53" {
		t.Fatalf("PIF %+v", p)
	}
	// Autoconf leaves the addresses to the kernel; None removes them.
	e.rec.Reset()
	e.ok("PIF.reconfigure_ipv6", eth1, "Autoconf", "", "", "")
	wantCalls(t, e.rec.Calls())
	e.ok("PIF.reconfigure_ipv6", eth1, "None", "", "", "")
	wantCalls(t, e.rec.Calls(), "addrs xenbr1 6 ")
}

func TestTunnel(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	tn := e.network("tun")
	e.fails(xerr.TransportPIFNotConfigured, "tunnel.create", eth1, tn, "vxlan")
	if err := e.fails(xerr.ValueNotSupported, "tunnel.create", eth1, tn, "gre"); !strings.Contains(err.Params[2], "VXLAN") {
		t.Fatalf("unclear: %v", err)
	}
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	h2 := e.secondHost(tn, "10.0.0.2")
	br := e.bridgeOf(tn)
	e.rec.Reset()
	tun := e.ok("tunnel.create", eth1, tn, "vxlan")
	snap := e.d.Snapshot()
	nrow, _ := snap.Get(dm.Network.Class, tn)
	hrow, _ := snap.Get(dm.Host.Class, h2)
	vni := VNIFor(nrow.UUID(), hrow.UUID())
	vx := fmt.Sprintf("vx%06x", vni)
	// The transport PIF comes up with the tunnel.
	wantCalls(t, e.rec.Calls(), fmt.Sprintf("vxlan %s vni %d local 10.0.0.1 remote 10.0.0.2 port 0 dev  mtu 1500", vx, vni), "up "+vx,
		"bridge "+br+" mtu 1500", "up "+br, "master "+vx+" "+br,
		"bridge xenbr1 mtu 1500", "up xenbr1", "adopt eth1", "master eth1 xenbr1", "up eth1",
		"addrs xenbr1 4 10.0.0.1/24")
	row, _ := snap.Get(dm.Tunnel.Class, tun)
	a := e.pif(row.String(dm.Tunnel.AccessPIF))
	if st, _ := row.Get(dm.Tunnel.Status).(map[string]string); st["active"] != "true" || a.Device != "tunnel0" || !a.CurrentlyAttached ||
		!e.pif(eth1).CurrentlyAttached {
		t.Fatalf("tunnel %v access %+v", st, a)
	}
	e.fails(xerr.IsTunnelAccessPIF, "VLAN.create", string(row.String(dm.Tunnel.AccessPIF)), int64(3), e.network("v"))
	e.fails(xerr.PIFTunnelStillExists, "PIF.forget", eth1)
	e.rec.Reset()
	e.ok("tunnel.destroy", tun)
	wantCalls(t, e.rec.Calls(), "delete "+vx, "delete "+br)
}

// Three hosts join a tunnel network as a star around the coordinator.
func TestTunnelStar(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	tn := e.network("tun")
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	h2 := e.secondHost(tn, "10.0.0.2")
	h3 := e.secondHost(tn, "10.0.0.3")
	e.ok("tunnel.create", eth1, tn, "vxlan")
	snap := e.d.Snapshot()
	remotes := func(h string) []string {
		var out []string
		for _, v := range Compute(snap, h, nil).VXLANs {
			out = append(out, v.Remote.String())
		}
		slices.Sort(out)
		return out
	}
	if got := remotes(e.host); !slices.Equal(got, []string{"10.0.0.2", "10.0.0.3"}) {
		t.Fatalf("hub links %v", got)
	}
	if got := remotes(h2); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("h2 links %v", got)
	}
	if got := remotes(h3); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Fatalf("h3 links %v", got)
	}
	if Compute(snap, h2, nil).VXLANs[0].VNI == Compute(snap, h3, nil).VXLANs[0].VNI {
		t.Fatal("two links of the hub share a VNI")
	}
}
