package ovs

import (
	"net"
	"slices"
	"strings"
	"testing"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
)

func port(mode string) network.VIFPort {
	mac, _ := net.ParseMAC("02:AB:cd:00:00:01")
	return network.VIFPort{VIF: "6f1c1d2e-1111-4a4a-9b9b-0123456789ab", VM: "0a0b0c0d-2222-4b4b-8c8c-0123456789ab",
		Network: "9e9e9e9e-3333-4c4c-8d8d-0123456789ab", Bridge: "xenbr1", MAC: mac, MTU: 1500, Mode: mode,
		IPv4: []net.IP{net.ParseIP("10.0.0.5").To4(), net.ParseIP("10.0.0.6").To4()}, IPv6: []net.IP{net.ParseIP("fd00::5")}}
}

func TestInterfaceExternalIDs(t *testing.T) {
	p := port(locking.ModeUnlocked)
	got := InterfaceExternalIDs(p)
	want := map[string]string{
		"iface-id": p.VIF, "vm-id": p.VM, "attached-mac": "02:ab:cd:00:00:01", "iface-status": "active",
		"xs-vif-uuid": p.VIF, "xs-vm-uuid": p.VM, "xs-network-uuid": p.Network, "toolstackd": "vif",
	}
	if !mapsEqual(got, want) {
		t.Fatalf("external_ids\n got %v\nwant %v", got, want)
	}
	// A VIF whose VM or network uuid is unknown does not write empty keys.
	p.VM, p.Network, p.MAC = "", "", nil
	got = InterfaceExternalIDs(p)
	for _, k := range []string{"vm-id", "xs-vm-uuid", "xs-network-uuid", "attached-mac"} {
		if _, ok := got[k]; ok {
			t.Errorf("key %s written without a value: %v", k, got)
		}
	}
}

func TestTapName(t *testing.T) {
	got, err := TapName("6F1C1D2E-1111-4a4a-9b9b-0123456789ab")
	if err != nil || got != "tsv6f1c1d2e1111" || len(got) > 15 {
		t.Fatalf("TapName = %q, %v", got, err)
	}
	for _, bad := range []string{"", "x", "../../etc/passwd", "6f1c1d2e-1111-4a4a-9b9b-0123456789a", "6f1c1d2e-1111-4a4a-9b9b-0123456789az", "6f1c1d2e 111 4a4a 9b9b 0123456789ab"} {
		if n, err := TapName(bad); err == nil {
			t.Errorf("TapName(%q) = %q, want an error", bad, n)
		}
	}
}

func TestLogicalSwitchPortColumns(t *testing.T) {
	const all = "02:ab:cd:00:00:01 10.0.0.5 10.0.0.6 fd00::5"
	for _, c := range []struct {
		mode     string
		addrs    []string
		security []string
		enabled  bool
	}{
		{locking.ModeLocked, []string{all}, []string{all}, true},
		{locking.ModeUnlocked, []string{all}, nil, true},
		{locking.ModeDisabled, []string{all}, []string{"02:ab:cd:00:00:01"}, false},
	} {
		p := port(c.mode)
		if got := LSPAddresses(p); !slices.Equal(got, c.addrs) {
			t.Errorf("%s: addresses %q, want %q", c.mode, got, c.addrs)
		}
		if got := LSPPortSecurity(p); !slices.Equal(got, c.security) {
			t.Errorf("%s: port_security %q, want %q", c.mode, got, c.security)
		}
		if got := LSPEnabled(p); got != c.enabled {
			t.Errorf("%s: enabled %v, want %v", c.mode, got, c.enabled)
		}
	}
	// Locked with no allowed addresses: the MAC alone.
	p := port(locking.ModeLocked)
	p.IPv4, p.IPv6 = nil, nil
	if got := LSPPortSecurity(p); !slices.Equal(got, []string{"02:ab:cd:00:00:01"}) {
		t.Errorf("locked without addresses: port_security %q", got)
	}
	// No MAC: OVN's "unknown", no port security to write.
	p.MAC = nil
	if got := LSPAddresses(p); !slices.Equal(got, []string{"unknown"}) || LSPPortSecurity(p) != nil {
		t.Errorf("no MAC: addresses %q port_security %q", got, LSPPortSecurity(p))
	}
}

func TestChooseDatapath(t *testing.T) {
	for _, c := range []struct {
		supported []string
		module    bool
		want, got string
		err       bool
	}{
		{[]string{"netdev", "system"}, true, "", "system", false},
		{[]string{"netdev", "system"}, false, "", "netdev", false},
		{[]string{"netdev"}, true, "auto", "netdev", false},
		{[]string{"netdev", "system"}, true, "netdev", "netdev", false},
		{[]string{"netdev", "system"}, false, "system", "", true},
		{[]string{"netdev"}, true, "system", "", true},
		{nil, true, "", "", true},
	} {
		got, err := ChooseDatapath(c.supported, c.module, c.want)
		if got != c.got || (err != nil) != c.err {
			t.Errorf("ChooseDatapath(%v, %v, %q) = %q, %v; want %q (error %v)", c.supported, c.module, c.want, got, err, c.got, c.err)
		}
	}
}

func TestMissing(t *testing.T) {
	if m := Missing("unix:/nonexistent/openvswitch/db.sock"); m == "" || !strings.Contains(m, "/nonexistent/openvswitch/db.sock") || !strings.Contains(m, "openvswitch-switch") {
		t.Errorf("Missing names neither the socket nor the package: %q", m)
	}
	if m := Missing("tcp:127.0.0.1:6640"); m != "" {
		t.Errorf("Missing for tcp: %q", m)
	}
}
