package network_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/xerr"
)

// The VLAN and bond datapaths, made through the XenAPI by the module on
// a real kernel: a host (a namespace whose NICs are veths) and, on the
// other end of its wires, a namespace standing in for the switch and
// another host, configured by hand with iproute2.
//
// The kernels of the machines these tests run on may have no 802.1Q or
// bonding; each part checks for its feature first and, without it,
// skips saying which datapath was not exercised. tests/kernel runs these
// tests again under the distribution's kernel in a VM, where both are
// there.

// apiHost is a network module on netlink in a namespace of its own, with
// an API server to call it through.
type apiHost struct {
	ns    *netnstest.Namespace
	srv   *api.Server
	links *netlinkx.NS
	sess  string
	host  string
}

func newAPIHost(t *testing.T) *apiHost {
	t.Helper()
	ns := netnstest.New(t)
	links, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = links.Close() })
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	hash, err := api.HashPassword("pw", cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	d := db.New(dm.Model, db.Options{})
	facts := api.HostFacts{Hostname: "h1", Address: "192.0.2.10", Device: "eth0", MAC: "52:54:00:00:00:00", CPUs: 2, MemTotal: 8 << 30}
	host, err := api.FirstBoot(d, facts, api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := api.New(d, cfg, quiet)
	t.Cleanup(srv.Close)
	if _, err := network.Register(network.Config{Links: links, Server: srv, HostRef: host, Log: quiet}); err != nil {
		t.Fatal(err)
	}
	h := &apiHost{ns: ns, srv: srv, links: links, host: host}
	h.sess = h.call(t, "session.login_with_password", "root", "pw", "1.0", "test").(string)
	return h
}

func (h *apiHost) call(t *testing.T, method string, args ...any) any {
	t.Helper()
	v, _, err := h.srv.Invoke(context.Background(), h.sess, method, args...)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return v
}

func (h *apiHost) str(t *testing.T, method string, args ...any) string {
	t.Helper()
	s, _ := h.call(t, method, args...).(string)
	return s
}

// pif is the host's PIF of a device (VLAN -1).
func (h *apiHost) pif(t *testing.T, device string) string {
	t.Helper()
	for _, ref := range h.call(t, "PIF.get_all").([]string) {
		if h.str(t, "PIF.get_device", ref) == device && h.call(t, "PIF.get_VLAN", ref) == int64(-1) {
			return ref
		}
	}
	t.Fatalf("no PIF for %s", device)
	return ""
}

func (h *apiHost) network(t *testing.T, name string) string {
	t.Helper()
	return h.str(t, "network.create", map[string]any{"name_label": name, "name_description": "", "MTU": int64(1500),
		"other_config": map[string]any{}})
}

// lacks says, for a kernel feature ("vlan", "bond"), why this kernel
// cannot make it ("" when it can), from a link made in a scratch
// namespace.
func lacks(t *testing.T, kind string) string {
	t.Helper()
	ns := netnstest.New(t)
	l, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	netnstest.Exec(t, ns, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	switch kind {
	case "vlan":
		err = l.AddVLAN("d0.5", "d0", 5, 1500)
	case "bond":
		err = l.AddBond("b0", "active-backup", nil, 1500)
	}
	if errors.Is(err, network.ErrUnsupported) {
		return err.Error()
	}
	if err != nil {
		t.Fatalf("probing %s: %v", kind, err)
	}
	return ""
}

func TestVLANDatapathThroughAPI(t *testing.T) {
	h := newAPIHost(t)
	if why := lacks(t, "vlan"); why != "" {
		t.Skipf("VLAN datapath NOT exercised: this kernel has no 802.1Q (%s); tests/kernel runs it under the distribution's kernel", why)
	}
	peer := netnstest.New(t)
	netnstest.Veth(t, h.ns, "eth1", peer, "p1")
	h.call(t, "PIF.scan", h.host)
	eth1 := h.pif(t, "eth1")

	net42 := h.network(t, "vlan42")
	vlan := h.str(t, "VLAN.create", eth1, int64(42), net42)
	untagged := h.str(t, "VLAN.get_untagged_PIF", vlan)
	h.call(t, "PIF.reconfigure_ip", untagged, "Static", "10.42.0.1", "255.255.255.0", "", "")
	bridge := h.str(t, "network.get_bridge", net42)
	out := netnstest.Exec(t, h.ns, "ip", "-d", "link", "show", "eth1.42")
	if !strings.Contains(out, "vlan protocol 802.1Q id 42") || !strings.Contains(out, "master "+bridge) {
		t.Fatalf("eth1.42 is not VLAN 42 in %s:\n%s", bridge, out)
	}

	// The far end tags its side by hand; untagged traffic must not reach
	// the VLAN.
	netnstest.Exec(t, peer, "ip", "addr", "add", "10.42.0.3/24", "dev", "p1")
	if rtt, err := netnstest.PingErr(peer, "10.42.0.1", time.Second); err == nil {
		t.Fatalf("the VLAN answered untagged traffic (%v)", rtt)
	}
	netnstest.Exec(t, peer, "ip", "addr", "del", "10.42.0.3/24", "dev", "p1")
	netnstest.Exec(t, peer, "ip", "link", "add", "link", "p1", "name", "p1.42", "type", "vlan", "id", "42")
	netnstest.Exec(t, peer, "ip", "addr", "add", "10.42.0.2/24", "dev", "p1.42")
	netnstest.Exec(t, peer, "ip", "link", "set", "p1.42", "up")
	netnstest.Ping(t, peer, "10.42.0.1")

	h.call(t, "VLAN.destroy", vlan)
	if _, err := h.links.Get("eth1.42"); !errors.Is(err, network.ErrNotFound) {
		t.Fatalf("eth1.42 after VLAN.destroy: %v", err)
	}
	if rtt, err := netnstest.PingErr(peer, "10.42.0.1", time.Second); err == nil {
		t.Fatalf("answered (%v) after VLAN.destroy", rtt)
	}
}

func TestBondDatapathThroughAPI(t *testing.T) {
	h := newAPIHost(t)
	if why := lacks(t, "bond"); why != "" {
		t.Skipf("bond datapath NOT exercised: this kernel has no bonding driver (%s); tests/kernel runs it under the distribution's kernel", why)
	}
	// The far end is a switch: a bridge over both wires, with an
	// address of its own.
	sw := netnstest.New(t)
	netnstest.Veth(t, h.ns, "eth2", sw, "p2")
	netnstest.Veth(t, h.ns, "eth3", sw, "p3")
	netnstest.Exec(t, sw, "ip", "link", "add", "br0", "type", "bridge")
	netnstest.Exec(t, sw, "ip", "link", "set", "p2", "master", "br0")
	netnstest.Exec(t, sw, "ip", "link", "set", "p3", "master", "br0")
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.77.0.2/24", "dev", "br0")
	netnstest.Exec(t, sw, "ip", "link", "set", "br0", "up")

	h.call(t, "PIF.scan", h.host)
	eth2, eth3 := h.pif(t, "eth2"), h.pif(t, "eth3")
	nb := h.network(t, "bond")
	bond := h.str(t, "Bond.create", nb, []string{eth2, eth3}, "", "active-backup", map[string]string{})
	master := h.str(t, "Bond.get_master", bond)
	h.call(t, "PIF.plug", master)
	h.call(t, "PIF.reconfigure_ip", master, "Static", "10.77.0.1", "255.255.255.0", "", "")
	dev := h.str(t, "PIF.get_device", master)
	out := netnstest.Exec(t, h.ns, "ip", "-d", "link", "show", dev)
	if !strings.Contains(out, "bond mode active-backup") || !strings.Contains(out, "miimon 100") {
		t.Fatalf("%s is not an active-backup bond watched every 100 ms:\n%s", dev, out)
	}
	for _, nic := range []string{"eth2", "eth3"} {
		if l, err := h.links.Get(nic); err != nil || l.Master != dev {
			t.Fatalf("%s after Bond.create: %+v, %v", nic, l, err)
		}
	}
	netnstest.Ping(t, sw, "10.77.0.1")

	// One member's wire goes down: the bond carries on over the other.
	active := strings.TrimSpace(netnstest.Exec(t, h.ns, "cat", "/sys/class/net/"+dev+"/bonding/active_slave"))
	cut := map[string]string{"eth2": "p2", "eth3": "p3"}[active]
	if cut == "" {
		t.Fatalf("active member %q", active)
	}
	netnstest.Exec(t, sw, "ip", "link", "set", cut, "down")
	start := time.Now()
	if rtt, err := netnstest.PingErr(sw, "10.77.0.1", 5*time.Second); err != nil {
		t.Fatalf("no answer over the bond with %s's wire down: %v", active, err)
	} else {
		t.Logf("answered %v after %s's wire went down (rtt %v)", time.Since(start).Round(time.Millisecond), active, rtt)
	}
	if now := strings.TrimSpace(netnstest.Exec(t, h.ns, "cat", "/sys/class/net/"+dev+"/bonding/active_slave")); now == active {
		t.Fatalf("the bond still uses %s", now)
	}

	h.call(t, "Bond.destroy", bond)
	if _, err := h.links.Get(dev); !errors.Is(err, network.ErrNotFound) {
		t.Fatalf("%s after Bond.destroy: %v", dev, err)
	}
	for _, nic := range []string{"eth2", "eth3"} {
		if l, _ := h.links.Get(nic); l.Master == dev {
			t.Fatalf("%s still in the bond after Bond.destroy", nic)
		}
	}
}

// The errors the module gives without the feature, on a kernel that
// lacks it (the API errors and the nothing-left-behind checks of
// tests/network cover the daemon).
func TestMissingFeatureNamed(t *testing.T) {
	h := newAPIHost(t)
	why := lacks(t, "vlan")
	if why == "" {
		t.Skip("this kernel has 802.1Q: the error for its absence is not exercised here")
	}
	peer := netnstest.New(t)
	netnstest.Veth(t, h.ns, "eth1", peer, "p1")
	h.call(t, "PIF.scan", h.host)
	_, _, err := h.srv.Invoke(context.Background(), h.sess, "VLAN.create", h.pif(t, "eth1"), int64(42), h.network(t, "v"))
	if !xerr.HasCode(err, xerr.InternalError) || !strings.Contains(err.Error(), "8021q") {
		t.Fatalf("VLAN.create without 802.1Q: %v, want INTERNAL_ERROR naming 8021q", err)
	}
}
