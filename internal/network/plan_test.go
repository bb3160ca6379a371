package network

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// render writes a plan as sorted lines for golden comparisons.
func render(p *Plan) string {
	var out []string
	for _, b := range p.Bridges {
		out = append(out, fmt.Sprintf("bridge %s mtu %d ports [%s]", b.Name, b.MTU, strings.Join(b.Ports, " ")))
	}
	for _, b := range p.Bonds {
		var props []string
		for k, v := range b.Props {
			props = append(props, k+"="+v)
		}
		slices.Sort(props)
		out = append(out, fmt.Sprintf("bond %s %s %s members [%s] mtu %d mac %s", b.Name, b.Mode, strings.Join(props, ","),
			strings.Join(b.Members, " "), b.MTU, b.MAC))
	}
	for _, v := range p.VLANs {
		out = append(out, fmt.Sprintf("vlan %s on %s tag %d mtu %d", v.Name, v.Parent, v.Tag, v.MTU))
	}
	for _, v := range p.VXLANs {
		out = append(out, fmt.Sprintf("vxlan %s vni %d %s -> %s mtu %d", v.Name, v.VNI, v.Local, v.Remote, v.MTU))
	}
	if len(p.Up) > 0 {
		out = append(out, "up "+strings.Join(p.Up, " "))
	}
	for c, a := range p.Addrs {
		var s []string
		for _, n := range a {
			s = append(s, n.String())
		}
		out = append(out, fmt.Sprintf("addrs %s [%s]", c, strings.Join(s, " ")))
	}
	if p.Gateway != nil {
		out = append(out, fmt.Sprintf("gateway %s via %s", p.Gateway.IP, p.Gateway.Dev))
	}
	for _, e := range p.Errors {
		out = append(out, fmt.Sprintf("error %v", e.Err))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// A pool of two hosts: h1 (the coordinator) with eth1 plugged and
// addressed, a VLAN on it, a bond of eth2 and eth3, a tunnel over eth1,
// a private network a running VM uses, and the management NIC not
// adopted; h2 with its eth1 and the same tunnel.
func TestPlanGolden(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "10.0.0.254", "10.0.0.53")
	e.ok("PIF.plug", eth1)
	e.ok("VLAN.create", eth1, int64(10), e.network("v10"))
	e.ok("Bond.create", e.network("bond"), []string{e.pifOn("eth2", -1), e.pifOn("eth3", -1)}, "", "balance-slb", map[string]string{})
	tn := e.network("tun")
	e.ok("tunnel.create", eth1, tn, "vxlan")
	priv := e.network("private")
	e.vmWithVIF(priv, dm.VMPowerStateRunning, true)
	stopped := e.network("stopped")
	e.vmWithVIF(stopped, dm.VMPowerStateHalted, false)

	h1 := e.host
	h2 := e.secondHost(tn, "10.0.0.2")
	snap := e.d.Snapshot()
	row, _ := snap.Get(dm.Network.Class, tn)
	h2row, _ := snap.Get(dm.Host.Class, h2)
	vni := VNIFor(row.UUID(), h2row.UUID())
	vx := fmt.Sprintf("vx%06x", vni)

	want1 := strings.Join([]string{
		"addrs xapi0 []", "addrs xapi1 []", "addrs xapi2 []", "addrs xenbr1 [10.0.0.1/24]",
		"bond bond0 balance-tlb miimon=100 members [eth2 eth3] mtu 1500 mac 52:54:00:00:00:02",
		"bridge xapi0 mtu 1500 ports [eth1.10]", "bridge xapi1 mtu 1500 ports [bond0]", "bridge xapi2 mtu 1500 ports [" + vx + "]",
		"bridge xapi3 mtu 1500 ports []", "bridge xenbr1 mtu 1500 ports [eth1]",
		"up eth1", "vlan eth1.10 on eth1 tag 10 mtu 1500",
		fmt.Sprintf("vxlan %s vni %d 10.0.0.1 -> 10.0.0.2 mtu 1500", vx, vni),
	}, "\n")
	if got := render(Compute(snap, h1, nil)); got != sortLines(want1) {
		t.Errorf("h1:\n%s\nwant\n%s", got, sortLines(want1))
	}
	want2 := strings.Join([]string{
		"addrs xapi2 []", "addrs xenbr1 [10.0.0.2/24]",
		"bridge xapi2 mtu 1500 ports [" + vx + "]", "bridge xenbr1 mtu 1500 ports [eth1]",
		fmt.Sprintf("vxlan %s vni %d 10.0.0.2 -> 10.0.0.1 mtu 1500", vx, vni),
	}, "\n")
	if got := render(Compute(snap, h2, nil)); got != sortLines(want2) {
		t.Errorf("h2:\n%s\nwant\n%s", got, sortLines(want2))
	}
	// network.attach / EnsureVIF ask for a network outside the database.
	if got := render(Compute(snap, h2, map[string]bool{stopped: true})); !strings.Contains(got, "bridge xapi4 mtu 1500 ports []") {
		t.Errorf("extra network not planned:\n%s", got)
	}
	// Apply catches up with what changed in the database behind the
	// module's back (h2's tunnel, the VM started), then has nothing to do.
	e.rec.Reset()
	if err := e.m.Apply(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls(), fmt.Sprintf("vxlan %s vni %d local 10.0.0.1 remote 10.0.0.2 port 0 dev  mtu 1500", vx, vni),
		"up "+vx, "master "+vx+" xapi2", "bridge xapi3 mtu 1500", "up xapi3")
	e.rec.Reset()
	if err := e.m.Apply(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantCalls(t, e.rec.Calls())
}

func sortLines(s string) string {
	l := strings.Split(s, "\n")
	slices.Sort(l)
	return strings.Join(l, "\n")
}

// secondHost adds a host with eth1 (on h1's eth1 network, addressed
// ip, plugged) and a tunnel on network tn over it, as that host would
// have made them.
func (e *env) secondHost(tn, ip string) string {
	e.t.Helper()
	eth1 := e.pif(e.pifOn("eth1", -1))
	var h2 string
	_, err := e.d.Update(func(tx *db.Tx) error {
		var err error
		if h2, err = tx.Insert(dm.Host.Class, "", (&dm.HostRecord{NameLabel: "h2", Hostname: "h2", Address: ip, Enabled: true}).Row()); err != nil {
			return err
		}
		t, err := tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: "eth1", Network: eth1.Network, Host: dm.HostRef(h2), MAC: "52:54:00:00:01:01",
			MTU: 1500, VLAN: -1, Physical: true, CurrentlyAttached: true, IPConfigurationMode: dm.IPConfigurationModeStatic, IP: ip,
			Netmask: "255.255.255.0", Managed: true}).Row())
		if err != nil {
			return err
		}
		a, err := tx.Insert(dm.PIF.Class, "", (&dm.PIFRecord{Device: "tunnel0", Network: dm.NetworkRef(tn), Host: dm.HostRef(h2),
			MAC: "02:00:00:00:01:02", MTU: 1500, VLAN: -1, CurrentlyAttached: true, IPConfigurationMode: dm.IPConfigurationModeNone, Managed: true}).Row())
		if err != nil {
			return err
		}
		_, err = tx.Insert(dm.Tunnel.Class, "", (&dm.TunnelRecord{AccessPIF: dm.PIFRef(a), TransportPIF: dm.PIFRef(t),
			Protocol: dm.TunnelProtocolVxlan}).Row())
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return h2
}
