package netlinkx_test

import (
	"errors"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"

	"toolstackd/internal/network"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
)

// What only the kernel shows: the details of links made, as iproute2
// reports them, independently of the code under test.

func TestKernelDetails(t *testing.T) {
	ns, peer := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, ns, "nic0", peer, "peer0")
	l := open(t, ns)

	// A veth marked as a NIC is physical; veth's ethtool reports
	// 10000 Mbit/s full duplex.
	n, err := l.Get("nic0")
	if err != nil {
		t.Fatal(err)
	}
	if !n.Physical || n.Speed != 10000 || n.Duplex != "full" || !n.Carrier {
		t.Errorf("nic0 = %+v, want physical, 10000 full, carrier", n)
	}
	if p, _ := l.Get("peer0"); p.Name != "" {
		t.Errorf("peer0 visible in the other namespace: %+v", p)
	}

	// Adopting keeps the NIC mark.
	if err := l.Adopt("nic0"); err != nil {
		t.Fatal(err)
	}
	out := netnstest.Exec(t, ns, "ip", "-d", "link", "show", "nic0")
	if !strings.Contains(out, "alias toolstackd toolstackd-nic") {
		t.Errorf("nic0 after Adopt:\n%s", out)
	}

	// A persistent tap owned by root, with a vnet header, no packet
	// information.
	if err := l.AddTap("tap0", 1500); err != nil {
		t.Fatal(err)
	}
	out = netnstest.Exec(t, ns, "ip", "-d", "link", "show", "tap0")
	for _, w := range []string{"tun type tap", "pi off", "vnet_hdr on", "persist on", "user root", "alias toolstackd"} {
		if !strings.Contains(out, w) {
			t.Errorf("tap0 lacks %q:\n%s", w, out)
		}
	}

	// VXLAN with its endpoints, the IANA port and learning.
	if err := l.AddVXLAN("vx0", 42, net.ParseIP("192.0.2.1"), net.ParseIP("192.0.2.2"), 0, "nic0", 1450); err != nil {
		t.Fatal(err)
	}
	out = netnstest.Exec(t, ns, "ip", "-d", "link", "show", "vx0")
	for _, w := range []string{"vxlan id 42", "remote 192.0.2.2", "local 192.0.2.1", "dev nic0", "dstport 4789", "mtu 1450"} {
		if !strings.Contains(out, w) {
			t.Errorf("vx0 lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "nolearning") {
		t.Errorf("vx0 does not learn:\n%s", out)
	}
	// Multicast group, own port.
	if err := l.AddVXLAN("vx1", 43, nil, net.ParseIP("239.1.1.1"), 8472, "nic0", 1450); err != nil {
		t.Fatal(err)
	}
	out = netnstest.Exec(t, ns, "ip", "-d", "link", "show", "vx1")
	for _, w := range []string{"vxlan id 43", "group 239.1.1.1", "dstport 8472"} {
		if !strings.Contains(out, w) {
			t.Errorf("vx1 lacks %q:\n%s", w, out)
		}
	}

	// ReplaceAddrs leaves the kernel's IPv6 link-local address alone.
	if err := l.ReplaceAddrs("nic0", 6, []net.IPNet{{IP: net.ParseIP("fd00::1"), Mask: net.CIDRMask(64, 128)}}); err != nil {
		t.Fatal(err)
	}
	out = netnstest.Exec(t, ns, "ip", "-6", "addr", "show", "dev", "nic0")
	if !strings.Contains(out, "fe80::") || !strings.Contains(out, "fd00::1/64") {
		t.Errorf("nic0 IPv6 addresses:\n%s", out)
	}

	// A bond's and a VLAN's failures leave nothing behind, and name
	// the module.
	before := linkList(t, ns)
	if err := l.AddVLAN("nic0.7", "nic0", 7, 1500); err != nil && !errors.Is(err, network.ErrUnsupported) {
		t.Errorf("AddVLAN: %v", err)
	} else if err != nil {
		t.Logf("AddVLAN: %v", err)
	}
	if err := l.AddBond("bond0", "802.3ad", map[string]string{"miimon": "100", "lacp_rate": "fast", "xmit_hash_policy": "layer3+4"}, 1500); err != nil && !errors.Is(err, network.ErrUnsupported) {
		t.Errorf("AddBond: %v", err)
	} else if err != nil {
		t.Logf("AddBond: %v", err)
		if after := linkList(t, ns); after != before {
			t.Errorf("links changed by failed creations:\n%s\nwas\n%s", after, before)
		}
	}
	if err := l.AddBond("bond1", "nonsense", nil, 0); err == nil || errors.Is(err, network.ErrUnsupported) {
		t.Errorf("AddBond with an unknown mode: %v", err)
	}
	if err := l.AddBond("bond1", "active-backup", map[string]string{"frobnicate": "1"}, 0); err == nil || errors.Is(err, network.ErrUnsupported) {
		t.Errorf("AddBond with an unknown property: %v", err)
	}
}

// Open("") is the process's own namespace: read only here (the host's
// links are never changed by tests).
func TestOpenOwnNamespaceReadOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root")
	}
	l, err := netlinkx.Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ls, err := l.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ls {
		t.Logf("%s kind=%s physical=%v speed=%d duplex=%s vendor=%s device=%s ours=%v",
			k.Name, k.Kind, k.Physical, k.Speed, k.Duplex, k.Vendor, k.Device, k.Ours)
		if k.Name == "lo" && k.Physical {
			t.Error("lo reported physical")
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.List(); err == nil {
		t.Fatal("List after Close succeeded")
	}
}

func TestOpenMissingNamespace(t *testing.T) {
	if _, err := netlinkx.Open("/nonexistent/netns"); err == nil {
		t.Fatal("Open of a missing namespace succeeded")
	}
}

// peerNetns is how `ip -o link` names a veth peer's namespace: by name,
// or by id when the name cannot be read at that moment.
var peerNetns = regexp.MustCompile(` link-netns(id)? \S+`)

// linkList is the namespace's links as `ip -o link` lists them, without
// what other tests' namespaces change meanwhile: ip's complaint about a
// peer namespace being removed as it looks ("Error: Peer netns reference
// is invalid.") and the peer namespace's name.
func linkList(t *testing.T, ns *netnstest.Namespace) string {
	t.Helper()
	var keep []string
	for _, line := range strings.Split(netnstest.Exec(t, ns, "ip", "-o", "link"), "\n") {
		if !strings.HasPrefix(line, "Error:") {
			keep = append(keep, peerNetns.ReplaceAllString(line, ""))
		}
	}
	return strings.Join(keep, "\n")
}
