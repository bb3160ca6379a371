package ovs_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/network/ovs"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/ovstest"
)

// open starts an Open vSwitch of the test's own with ovs-vswitchd in a
// fresh namespace and opens a Switch on it (with OVN when nb is set).
func open(t *testing.T, nb string) (*ovs.Switch, *ovstest.OVS, *netnstest.Namespace) {
	t.Helper()
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	ns := netnstest.New(t)
	o := ovstest.Start(t, ns.Name())
	kernel, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kernel.Close() })
	sw, err := ovs.Open(context.Background(), ovs.Config{DB: o.DB, Kernel: kernel, OVN: nb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sw.Close() })
	return sw, o, ns
}

func vifPort(bridge, mode string) network.VIFPort {
	mac, _ := net.ParseMAC("02:00:00:aa:bb:01")
	return network.VIFPort{VIF: "11111111-2222-4333-8444-555555555555", VM: "66666666-7777-4888-8999-000000000000",
		Network: "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", Bridge: bridge, MAC: mac, MTU: 1400, Mode: mode,
		IPv4: []net.IP{net.ParseIP("192.0.2.10").To4()}}
}

func linkOf(t *testing.T, sw network.Links, name string) (network.Link, bool) {
	t.Helper()
	ls, err := sw.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Name == name {
			return l, true
		}
	}
	return network.Link{}, false
}

// TestSwitchBridgesAndPorts drives the Switch as the network module's
// reconciler does, against a real ovsdb-server and ovs-vswitchd
// (userspace datapath), and checks what ovs-vsctl and the kernel say.
func TestSwitchBridgesAndPorts(t *testing.T) {
	sw, o, ns := open(t, "")
	if dp := sw.Datapath(); !strings.Contains(o.Vsctl(t, "get", "Open_vSwitch", ".", "datapath_types"), dp) {
		t.Fatalf("datapath %q not among ovs-vswitchd's", dp)
	}
	t.Logf("datapath type: %s", sw.Datapath())

	// A bridge: marked ours, of the chosen datapath, its device in the
	// namespace at the MTU asked, and brought up through the kernel.
	if err := sw.AddBridge("xenbr7", 1400); err != nil {
		t.Fatal(err)
	}
	if got := o.Vsctl(t, "get", "Bridge", "xenbr7", "datapath_type", "external_ids:toolstackd"); got != sw.Datapath()+"\n\"bridge\"" && got != sw.Datapath()+"\nbridge" {
		t.Errorf("bridge columns: %q", got)
	}
	if err := sw.SetUp("xenbr7"); err != nil {
		t.Fatal(err)
	}
	if out := netnstest.Exec(t, ns, "ip", "-o", "link", "show", "xenbr7"); !strings.Contains(out, "mtu 1400") || !strings.Contains(out, "UP") {
		t.Errorf("device of the bridge: %s", out)
	}
	if l, ok := linkOf(t, sw, "xenbr7"); !ok || l.Kind != "bridge" || !l.Ours {
		t.Errorf("List says of xenbr7: %+v (present %v)", l, ok)
	}
	// MTU through mtu_request.
	if err := sw.SetMTU("xenbr7", 1450); err != nil {
		t.Fatal(err)
	}
	if got := o.Vsctl(t, "get", "Interface", "xenbr7", "mtu_request"); got != "1450" {
		t.Errorf("mtu_request %s, want 1450", got)
	}

	// A NIC as a port, and freed again.
	peer := netnstest.New(t)
	netnstest.Veth(t, ns, "eth1", peer, "sw1")
	if err := sw.Adopt("eth1"); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetMaster("eth1", "xenbr7"); err != nil {
		t.Fatal(err)
	}
	if got := o.Vsctl(t, "port-to-br", "eth1"); got != "xenbr7" {
		t.Errorf("eth1 on %q, want xenbr7", got)
	}
	if l, _ := linkOf(t, sw, "eth1"); l.Master != "xenbr7" || !l.Physical {
		t.Errorf("List says of eth1: %+v", l)
	}
	if err := sw.SetMaster("eth1", ""); err != nil {
		t.Fatal(err)
	}
	if out, err := o.TryVsctl("port-to-br", "eth1"); err == nil {
		t.Errorf("eth1 still a port of %s", out)
	}

	// A VIF: its tap as a port with xapi's external_ids, gone on unplug.
	p := vifPort("xenbr7", locking.ModeUnlocked)
	tap, _ := ovs.TapName(p.VIF)
	if err := sw.PlugVIF(context.Background(), p); err != nil {
		t.Fatal(err, o.Vsctl(t, "get", "Open_vSwitch", ".", "next_cfg", "cur_cfg"), o.Vsctl(t, "show"))
	}
	if err := sw.PlugVIF(context.Background(), p); err != nil { // idempotent
		t.Fatal(err)
	}
	if got := o.Vsctl(t, "port-to-br", tap); got != "xenbr7" {
		t.Errorf("tap %s on %q", tap, got)
	}
	ids := o.Vsctl(t, "get", "Interface", tap, "external_ids")
	for _, want := range []string{`iface-id="` + p.VIF + `"`, `vm-id="` + p.VM + `"`, `attached-mac="02:00:00:aa:bb:01"`,
		`iface-status=active`, `xs-vif-uuid="` + p.VIF + `"`, `xs-network-uuid="` + p.Network + `"`} {
		if !strings.Contains(ids, want) {
			t.Errorf("external_ids of %s lack %s: %s", tap, want, ids)
		}
	}
	if out := netnstest.Exec(t, ns, "ip", "-d", "-o", "link", "show", tap); !strings.Contains(out, "tun type tap") {
		t.Errorf("tap device: %s", out)
	}
	if err := sw.UnplugVIF(context.Background(), p.VIF); err != nil {
		t.Fatal(err)
	}
	if out, err := o.TryVsctl("port-to-br", tap); err == nil {
		t.Errorf("tap %s still a port of %s after unplug", tap, out)
	}
	if _, err := ns.Run("ip", "link", "show", tap); err == nil {
		t.Errorf("tap %s still in the namespace after unplug", tap)
	}
	// A VM backend's own tap (QEMU's through the module's PlugTap: made,
	// put on the bridge, then handed over through LockVIF) takes the
	// VIF's identity; the switch's own tap for the VIF goes.
	if err := sw.PlugVIF(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if err := sw.AddTap("tsvif5.0", 1400); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetMaster("tsvif5.0", "xenbr7"); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetUp("tsvif5.0"); err != nil {
		t.Fatal(err)
	}
	q := p
	q.Tap = "tsvif5.0"
	if err := sw.PlugVIF(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if got := strings.Trim(o.Vsctl(t, "get", "Interface", "tsvif5.0", "external_ids:iface-id"), `"`); got != p.VIF {
		t.Errorf("iface-id of the backend's tap: %q", got)
	}
	if out, err := o.TryVsctl("port-to-br", tap); err == nil {
		t.Errorf("the switch's own tap %s still a port of %s", tap, out)
	}
	if _, err := ns.Run("ip", "link", "show", tap); err == nil {
		t.Errorf("the switch's own tap %s still in the namespace", tap)
	}
	// The backend removes its tap through the module: the port goes too.
	if err := sw.Delete("tsvif5.0"); err != nil {
		t.Fatal(err)
	}
	if out, err := o.TryVsctl("port-to-br", "tsvif5.0"); err == nil {
		t.Errorf("port tsvif5.0 left on %s after its tap was deleted", out)
	}
	if err := sw.UnplugVIF(context.Background(), p.VIF); err != nil {
		t.Fatal(err)
	}

	// What toolstackd did not make is left alone.
	o.Vsctl(t, "add-br", "foreign", "--", "set", "Bridge", "foreign", "datapath_type=netdev", "--",
		"add-port", "foreign", "fport", "--", "set", "Interface", "fport", "type=internal")
	if l, ok := linkOf(t, sw, "foreign"); !ok || l.Ours || l.Kind != "bridge" {
		t.Errorf("List says of foreign: %+v (present %v)", l, ok)
	}
	if err := sw.Delete("foreign"); !errors.Is(err, network.ErrNotOurs) {
		t.Errorf("Delete(foreign) = %v, want ErrNotOurs", err)
	}
	if err := sw.SetMaster("fport", ""); !errors.Is(err, network.ErrNotOurs) {
		t.Errorf("SetMaster(fport, \"\") = %v, want ErrNotOurs", err)
	}
	o.Vsctl(t, "br-exists", "foreign")

	if err := sw.Delete("xenbr7"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.TryVsctl("br-exists", "xenbr7"); err == nil {
		t.Error("xenbr7 still there after Delete")
	}
	if err := ovstest.Eventually(10*time.Second, func() bool { _, err := ns.Run("ip", "link", "show", "xenbr7"); return err != nil }); err != nil {
		t.Error("the device of xenbr7 stayed after Delete")
	}
}

// TestSwitchOVN plugs a VIF in OVN mode and reads the logical switch and
// port back with ovn-nbctl, through changes of the VIF's locking, a
// move to another network and the unplug.
func TestSwitchOVN(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	n := ovstest.StartOVN(t)
	sw, o, _ := open(t, n.NB)
	if err := sw.AddBridge("xenbr8", 1500); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := vifPort("xenbr8", locking.ModeLocked)
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := n.Nbctl(t, "--bare", "--columns=name", "find", "Logical_Switch", "name="+p.Network); got != p.Network {
		t.Fatalf("logical switch of the network: %q", got)
	}
	if got := n.Nbctl(t, "lsp-list", p.Network); !strings.Contains(got, p.VIF) {
		t.Errorf("lsp-list %s: %q", p.Network, got)
	}
	if got := n.Nbctl(t, "lsp-get-addresses", p.VIF); got != "02:00:00:aa:bb:01 192.0.2.10" {
		t.Errorf("addresses %q", got)
	}
	if got := n.Nbctl(t, "lsp-get-port-security", p.VIF); got != "02:00:00:aa:bb:01 192.0.2.10" {
		t.Errorf("port_security %q", got)
	}
	tap, _ := ovs.TapName(p.VIF)
	if got := o.Vsctl(t, "get", "Interface", tap, "external_ids:iface-id"); strings.Trim(got, `"`) != p.VIF {
		t.Errorf("iface-id %q", got)
	}

	// Unlocked: no port security; disabled: the port is disabled.
	p.Mode = locking.ModeUnlocked
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := n.Nbctl(t, "lsp-get-port-security", p.VIF); got != "" {
		t.Errorf("unlocked: port_security %q", got)
	}
	p.Mode = locking.ModeDisabled
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := n.Nbctl(t, "lsp-get-enabled", p.VIF); got != "disabled" {
		t.Errorf("disabled: enabled %q", got)
	}

	// A second VIF on the same network shares the switch (one switch).
	q := p
	q.VIF, q.Mode = "21111111-2222-4333-8444-555555555556", locking.ModeUnlocked
	q.MAC, _ = net.ParseMAC("02:00:00:aa:bb:02")
	if err := sw.PlugVIF(ctx, q); err != nil {
		t.Fatal(err)
	}
	if got := n.Nbctl(t, "--bare", "--columns=_uuid", "find", "Logical_Switch", "name="+p.Network); strings.Count(got, "-") != 4 {
		t.Errorf("switches named %s: %q, want one", p.Network, got)
	}

	// VIF.move: the port moves to another bridge and its logical port
	// to the other network's switch.
	if err := sw.AddBridge("xenbr9", 1500); err != nil {
		t.Fatal(err)
	}
	moved := q
	moved.Bridge, moved.Network = "xenbr9", "bbbbbbbb-bbbb-4ccc-8ddd-eeeeeeeeeeee"
	if err := sw.PlugVIF(ctx, moved); err != nil {
		t.Fatal(err)
	}
	qtap, _ := ovs.TapName(q.VIF)
	if got := o.Vsctl(t, "port-to-br", qtap); got != "xenbr9" {
		t.Errorf("moved port on %q, want xenbr9", got)
	}
	if got := n.Nbctl(t, "lsp-list", moved.Network); !strings.Contains(got, q.VIF) {
		t.Errorf("lsp-list of the new network: %q", got)
	}
	if got := n.Nbctl(t, "lsp-list", p.Network); strings.Contains(got, q.VIF) {
		t.Errorf("the moved port is still on the old network's switch: %q", got)
	}
	if err := sw.UnplugVIF(ctx, q.VIF); err != nil {
		t.Fatal(err)
	}
	if err := sw.UnplugVIF(ctx, p.VIF); err != nil {
		t.Fatal(err)
	}
	if got := n.Nbctl(t, "lsp-list", p.Network); got != "" {
		t.Errorf("ports left after unplug: %q", got)
	}
	if _, err := n.TryNbctl("ls-list"); err != nil {
		t.Fatal(err)
	}
}
