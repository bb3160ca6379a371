package netlinkx_test

import (
	"errors"
	"flag"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"toolstackd/internal/network"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
)

// The contract of network.Links: one table of behaviours, each run
// against the in-memory Recorder and against netlink in a fresh network
// namespace, with the kernel as the truth. Where the Recorder does not
// behave as the kernel does, the case says so in recorderDiffers and its
// recorder run is skipped with that reason, until the Recorder is
// fixed.
//
// Every namespace starts with:
//   - nic0: a veth marked as a NIC (netnstest.Veth), up, MTU 1500, not
//     ours; its peer is in a second namespace;
//   - other0: a bridge somebody else made (not ours).

type env struct {
	kernel bool
	l      network.Links
	// vlan and bond: whether the kernel can make those links.
	vlan, bond bool
}

type contractCase struct {
	name            string
	recorderDiffers string
	run             func(t *testing.T, e *env)
}

// -recorder-all runs the recorder cases marked as differing too, to
// check a fix of the Recorder.
var recorderAll = flag.Bool("recorder-all", false, "run the recorder cases marked recorderDiffers as well")

var (
	probeOnce            sync.Once
	probeVLAN, probeBond bool
	probeDone            bool
)

// probe tries 802.1Q and bonding with iproute2 in a namespace of its own,
// independently of the code under test.
func probe(t *testing.T) {
	probeOnce.Do(func() {
		if netnstest.Available() != "" {
			return
		}
		ns := netnstest.New(t)
		netnstest.Exec(t, ns, "ip", "link", "add", "p0", "type", "bridge")
		_, err := ns.Run("ip", "link", "add", "link", "p0", "name", "p0.5", "type", "vlan", "id", "5")
		probeVLAN = err == nil
		_, err = ns.Run("ip", "link", "add", "pbond", "type", "bond")
		probeBond = err == nil
		probeDone = true
		t.Logf("kernel: 802.1Q %v, bonding %v", probeVLAN, probeBond)
	})
}

func newRecorderEnv(t *testing.T) *env {
	probe(t)
	r := network.NewRecorder(
		network.Link{Name: "nic0", Kind: "veth", Physical: true, MTU: 1500, Up: true, Carrier: true,
			MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}},
		network.Link{Name: "other0", Kind: "bridge", MTU: 1500},
	)
	e := &env{l: r, vlan: true, bond: true}
	if probeDone {
		e.vlan, e.bond = probeVLAN, probeBond
	}
	r.Unsupported["vlan"] = !e.vlan
	r.Unsupported["bond"] = !e.bond
	return e
}

func newKernelEnv(t *testing.T) *env {
	probe(t)
	ns := netnstest.New(t)
	peer := netnstest.New(t)
	netnstest.Veth(t, ns, "nic0", peer, "peer0")
	netnstest.Exec(t, ns, "ip", "link", "add", "other0", "type", "bridge")
	l, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return &env{kernel: true, l: l, vlan: probeVLAN, bond: probeBond}
}

func TestLinksContract(t *testing.T) {
	for _, c := range contract {
		t.Run(c.name, func(t *testing.T) {
			t.Run("recorder", func(t *testing.T) {
				if c.recorderDiffers != "" && !*recorderAll {
					t.Skip("recorder differs: " + c.recorderDiffers)
				}
				c.run(t, newRecorderEnv(t))
			})
			t.Run("kernel", func(t *testing.T) {
				c.run(t, newKernelEnv(t))
			})
		})
	}
}

func get(t *testing.T, l network.Links, name string) network.Link {
	t.Helper()
	k, err := l.Get(name)
	if err != nil {
		t.Fatalf("Get(%s): %v", name, err)
	}
	return k
}

func ok(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

func absent(t *testing.T, l network.Links, name string) {
	t.Helper()
	_, err := l.Get(name)
	wantErr(t, "Get("+name+")", err, network.ErrNotFound)
}

func cidrs(t *testing.T, ss ...string) []net.IPNet {
	t.Helper()
	out := make([]net.IPNet, 0, len(ss))
	for _, s := range ss {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, net.IPNet{IP: ip, Mask: n.Mask})
	}
	return out
}

func sameAddrs(t *testing.T, l network.Links, name string, family int, want ...string) {
	t.Helper()
	as, err := l.Addrs(name, family)
	ok(t, "Addrs", err)
	got := make([]string, 0, len(as))
	for _, a := range as {
		got = append(got, a.String())
	}
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	if !slices.Equal(got, w) {
		t.Fatalf("Addrs(%s, %d) = %v, want %v", name, family, got, w)
	}
}

func names(t *testing.T, l network.Links) []string {
	t.Helper()
	ls, err := l.List()
	ok(t, "List", err)
	out := make([]string, 0, len(ls))
	for _, k := range ls {
		out = append(out, k.Name)
	}
	return out
}

var contract = []contractCase{
	{name: "bridge made twice is one bridge", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "AddBridge again", e.l.AddBridge("br0", 1500))
		b := get(t, e.l, "br0")
		if b.Kind != "bridge" || !b.Ours || b.Physical || b.MTU != 1500 || b.Up {
			t.Fatalf("br0 = %+v", b)
		}
		ok(t, "AddBridge with another MTU", e.l.AddBridge("br0", 1400))
		if m := get(t, e.l, "br0").MTU; m != 1400 {
			t.Fatalf("MTU %d after AddBridge(1400)", m)
		}
		n := 0
		for _, s := range names(t, e.l) {
			if s == "br0" {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("br0 listed %d times", n)
		}
	}},
	{name: "MTU, state and MAC change", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "SetMTU", e.l.SetMTU("br0", 9000))
		if m := get(t, e.l, "br0").MTU; m != 9000 {
			t.Fatalf("MTU %d, want 9000", m)
		}
		ok(t, "SetUp", e.l.SetUp("br0"))
		if !get(t, e.l, "br0").Up {
			t.Fatal("br0 not up after SetUp")
		}
		ok(t, "SetDown", e.l.SetDown("br0"))
		if get(t, e.l, "br0").Up {
			t.Fatal("br0 up after SetDown")
		}
		mac := net.HardwareAddr{0x02, 0x00, 0x00, 0xaa, 0xbb, 0xcc}
		ok(t, "SetMAC", e.l.SetMAC("br0", mac))
		if m := get(t, e.l, "br0").MAC; m.String() != mac.String() {
			t.Fatalf("MAC %v, want %v", m, mac)
		}
	}},
	{name: "bridge MTU set is kept when a port joins", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 9000))
		ok(t, "Adopt", e.l.Adopt("nic0"))
		ok(t, "SetMaster", e.l.SetMaster("nic0", "br0"))
		if m := get(t, e.l, "br0").MTU; m != 9000 {
			t.Fatalf("br0 MTU %d after a 1500 port joined, want 9000", m)
		}
		ok(t, "AddBridge 1400", e.l.AddBridge("br1", 1400))
		ok(t, "AddTap", e.l.AddTap("tap0", 1500))
		ok(t, "SetMaster", e.l.SetMaster("tap0", "br1"))
		if m := get(t, e.l, "br1").MTU; m != 1400 {
			t.Fatalf("br1 MTU %d after a 1500 port joined, want 1400", m)
		}
	}},
	{name: "bridge at the default MTU follows its ports", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "AddTap", e.l.AddTap("tap0", 9000))
		ok(t, "SetMaster", e.l.SetMaster("tap0", "br0"))
		if m := get(t, e.l, "br0").MTU; m != 9000 {
			t.Fatalf("br0 MTU %d with its only port at 9000, want 9000", m)
		}
	}},
	{name: "NIC enslaved after Adopt", run: func(t *testing.T, e *env) {
		n := get(t, e.l, "nic0")
		if !n.Physical || n.Ours || n.Kind != "veth" || !n.Up {
			t.Fatalf("nic0 = %+v", n)
		}
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		wantErr(t, "SetMaster before Adopt", e.l.SetMaster("nic0", "br0"), network.ErrNotOurs)
		ok(t, "Adopt", e.l.Adopt("nic0"))
		ok(t, "Adopt again", e.l.Adopt("nic0"))
		n = get(t, e.l, "nic0")
		if !n.Ours || !n.Physical {
			t.Fatalf("adopted nic0 = %+v", n)
		}
		ok(t, "SetMaster", e.l.SetMaster("nic0", "br0"))
		if m := get(t, e.l, "nic0").Master; m != "br0" {
			t.Fatalf("nic0 master %q", m)
		}
		ok(t, "SetMaster none", e.l.SetMaster("nic0", ""))
		if m := get(t, e.l, "nic0").Master; m != "" {
			t.Fatalf("nic0 master %q after freeing", m)
		}
		wantErr(t, "Adopt(nosuch)", e.l.Adopt("nosuch"), network.ErrNotFound)
	}},
	{name: "Disown gives an adopted NIC back", run: func(t *testing.T, e *env) {
		ok(t, "Adopt", e.l.Adopt("nic0"))
		ok(t, "Disown", e.l.Disown("nic0"))
		ok(t, "Disown again", e.l.Disown("nic0"))
		n := get(t, e.l, "nic0")
		if n.Ours || !n.Physical {
			t.Fatalf("disowned nic0 = %+v", n)
		}
		wantErr(t, "SetUp after Disown", e.l.SetUp("nic0"), network.ErrNotOurs)
		wantErr(t, "Disown(nosuch)", e.l.Disown("nosuch"), network.ErrNotFound)
	}},
	{name: "links not ours are refused", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		wantErr(t, "SetUp", e.l.SetUp("nic0"), network.ErrNotOurs)
		wantErr(t, "SetDown", e.l.SetDown("nic0"), network.ErrNotOurs)
		wantErr(t, "SetMTU", e.l.SetMTU("nic0", 1400), network.ErrNotOurs)
		wantErr(t, "SetMAC", e.l.SetMAC("nic0", net.HardwareAddr{2, 0, 0, 0, 0, 9}), network.ErrNotOurs)
		wantErr(t, "ReplaceAddrs", e.l.ReplaceAddrs("nic0", 4, cidrs(t, "192.0.2.9/24")), network.ErrNotOurs)
		wantErr(t, "SetMaster", e.l.SetMaster("nic0", "br0"), network.ErrNotOurs)
		wantErr(t, "SetMaster none", e.l.SetMaster("nic0", ""), network.ErrNotOurs)
		wantErr(t, "Delete nic0", e.l.Delete("nic0"), network.ErrNotOurs)
		wantErr(t, "Delete other0", e.l.Delete("other0"), network.ErrNotOurs)
		if err := e.l.AddBridge("other0", 1400); err == nil {
			t.Fatal("AddBridge over somebody else's bridge succeeded")
		}
		n := get(t, e.l, "nic0")
		if n.MTU != 1500 || !n.Up || n.Ours {
			t.Fatalf("nic0 changed: %+v", n)
		}
		o := get(t, e.l, "other0")
		if o.Ours || o.Kind != "bridge" || o.MTU != 1500 {
			t.Fatalf("other0 changed: %+v", o)
		}
		sameAddrs(t, e.l, "nic0", 4)
	}},
	{name: "enslaving into a bridge not ours is refused", run: func(t *testing.T, e *env) {
		ok(t, "Adopt", e.l.Adopt("nic0"))
		wantErr(t, "SetMaster", e.l.SetMaster("nic0", "other0"), network.ErrNotOurs)
		if m := get(t, e.l, "nic0").Master; m != "" {
			t.Fatalf("nic0 master %q", m)
		}
	}},
	{name: "deleting a bridge frees its ports", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "Adopt", e.l.Adopt("nic0"))
		ok(t, "SetMaster nic0", e.l.SetMaster("nic0", "br0"))
		ok(t, "AddTap", e.l.AddTap("tap0", 1500))
		ok(t, "SetMaster tap0", e.l.SetMaster("tap0", "br0"))
		ok(t, "Delete", e.l.Delete("br0"))
		absent(t, e.l, "br0")
		for _, p := range []string{"nic0", "tap0"} {
			if m := get(t, e.l, p).Master; m != "" {
				t.Fatalf("%s master %q after its bridge went", p, m)
			}
		}
		ok(t, "Delete again", e.l.Delete("br0"))
		ok(t, "Delete(nosuch)", e.l.Delete("nosuch"))
	}},
	{name: "tap", run: func(t *testing.T, e *env) {
		ok(t, "AddTap", e.l.AddTap("tap0", 1500))
		k := get(t, e.l, "tap0")
		if k.Kind != "tuntap" || !k.Ours || k.Physical || k.MTU != 1500 {
			t.Fatalf("tap0 = %+v", k)
		}
		ok(t, "AddTap again", e.l.AddTap("tap0", 1500))
		ok(t, "AddTap with another MTU", e.l.AddTap("tap0", 9000))
		if m := get(t, e.l, "tap0").MTU; m != 9000 {
			t.Fatalf("tap0 MTU %d", m)
		}
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		if err := e.l.AddTap("br0", 1500); err == nil {
			t.Fatal("AddTap over a bridge succeeded")
		}
		if k := get(t, e.l, "br0").Kind; k != "bridge" {
			t.Fatalf("br0 became %s", k)
		}
		ok(t, "Delete", e.l.Delete("tap0"))
		absent(t, e.l, "tap0")
	}},
	{name: "VXLAN over a NIC", run: func(t *testing.T, e *env) {
		ok(t, "Adopt", e.l.Adopt("nic0"))
		ok(t, "ReplaceAddrs", e.l.ReplaceAddrs("nic0", 4, cidrs(t, "192.0.2.1/24")))
		ok(t, "AddVXLAN", e.l.AddVXLAN("vx0", 42, net.ParseIP("192.0.2.1"), net.ParseIP("192.0.2.2"), 0, "nic0", 1450))
		v := get(t, e.l, "vx0")
		if v.Kind != "vxlan" || v.Parent != "nic0" || v.Tag != 42 || v.MTU != 1450 || !v.Ours {
			t.Fatalf("vx0 = %+v", v)
		}
		ok(t, "AddVXLAN again", e.l.AddVXLAN("vx0", 42, net.ParseIP("192.0.2.1"), net.ParseIP("192.0.2.2"), 0, "nic0", 1450))
		wantErr(t, "AddVXLAN over nosuch", e.l.AddVXLAN("vx1", 43, nil, net.ParseIP("192.0.2.2"), 0, "nosuch", 1450), network.ErrNotFound)
		absent(t, e.l, "vx1")
		ok(t, "Delete", e.l.Delete("vx0"))
		absent(t, e.l, "vx0")
	}},
	{name: "a VXLAN goes with the link under it", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "AddVXLAN", e.l.AddVXLAN("vx0", 7, nil, nil, 0, "br0", 1450))
		ok(t, "Delete", e.l.Delete("br0"))
		absent(t, e.l, "vx0")
	}},
	{name: "addresses replaced exactly", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "SetUp", e.l.SetUp("br0"))
		ok(t, "ReplaceAddrs", e.l.ReplaceAddrs("br0", 4, cidrs(t, "10.1.0.1/24", "10.1.0.2/24", "10.2.0.1/16")))
		sameAddrs(t, e.l, "br0", 4, "10.1.0.1/24", "10.1.0.2/24", "10.2.0.1/16")
		// Drops the primary 10.1.0.1, which takes its secondary
		// 10.1.0.2 with it in the kernel: that one must stay.
		ok(t, "ReplaceAddrs", e.l.ReplaceAddrs("br0", 4, cidrs(t, "10.1.0.2/24", "10.3.0.1/24")))
		sameAddrs(t, e.l, "br0", 4, "10.1.0.2/24", "10.3.0.1/24")
		ok(t, "ReplaceAddrs v6", e.l.ReplaceAddrs("br0", 6, cidrs(t, "fd00:1::1/64")))
		sameAddrs(t, e.l, "br0", 6, "fd00:1::1/64")
		sameAddrs(t, e.l, "br0", 4, "10.1.0.2/24", "10.3.0.1/24")
		ok(t, "ReplaceAddrs none", e.l.ReplaceAddrs("br0", 4, nil))
		sameAddrs(t, e.l, "br0", 4)
		sameAddrs(t, e.l, "br0", 6, "fd00:1::1/64")
	}},
	{name: "default gateway set and removed", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "SetUp", e.l.SetUp("br0"))
		ok(t, "ReplaceAddrs", e.l.ReplaceAddrs("br0", 4, cidrs(t, "10.9.0.2/24")))
		ok(t, "ReplaceAddrs v6", e.l.ReplaceAddrs("br0", 6, cidrs(t, "fd00:9::2/64")))
		gw, dev, err := e.l.DefaultGateway(4)
		ok(t, "DefaultGateway", err)
		if gw != nil || dev != "" {
			t.Fatalf("default gateway %v %q before any", gw, dev)
		}
		ok(t, "SetDefaultGateway", e.l.SetDefaultGateway(4, net.ParseIP("10.9.0.1"), "br0"))
		ok(t, "SetDefaultGateway v6", e.l.SetDefaultGateway(6, net.ParseIP("fd00:9::1"), "br0"))
		for _, w := range []struct {
			fam int
			gw  string
		}{{4, "10.9.0.1"}, {6, "fd00:9::1"}} {
			gw, dev, err = e.l.DefaultGateway(w.fam)
			ok(t, "DefaultGateway", err)
			if !gw.Equal(net.ParseIP(w.gw)) || dev != "br0" {
				t.Fatalf("IPv%d default gateway %v %q", w.fam, gw, dev)
			}
		}
		ok(t, "SetDefaultGateway again", e.l.SetDefaultGateway(4, net.ParseIP("10.9.0.254"), "br0"))
		gw, _, _ = e.l.DefaultGateway(4)
		if !gw.Equal(net.ParseIP("10.9.0.254")) {
			t.Fatalf("default gateway %v after replacing it", gw)
		}
		ok(t, "remove", e.l.SetDefaultGateway(4, nil, ""))
		gw, dev, err = e.l.DefaultGateway(4)
		ok(t, "DefaultGateway", err)
		if gw != nil || dev != "" {
			t.Fatalf("default gateway %v %q after removing it", gw, dev)
		}
		if gw, _, _ = e.l.DefaultGateway(6); gw == nil {
			t.Fatal("removing the IPv4 gateway removed the IPv6 one")
		}
	}},
	{name: "an unreachable gateway is refused", run: func(t *testing.T, e *env) {
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		ok(t, "SetUp", e.l.SetUp("br0"))
		ok(t, "ReplaceAddrs", e.l.ReplaceAddrs("br0", 4, cidrs(t, "10.9.0.2/24")))
		if err := e.l.SetDefaultGateway(4, net.ParseIP("203.0.113.1"), "br0"); err == nil {
			t.Fatal("unreachable gateway accepted")
		}
		if gw, _, _ := e.l.DefaultGateway(4); gw != nil {
			t.Fatalf("default gateway %v", gw)
		}
	}},
	{name: "a gateway through a link not ours is refused", run: func(t *testing.T, e *env) {
		wantErr(t, "via nic0", e.l.SetDefaultGateway(4, net.ParseIP("192.0.2.254"), "nic0"), network.ErrNotOurs)
		wantErr(t, "via nosuch", e.l.SetDefaultGateway(4, net.ParseIP("192.0.2.254"), "nosuch"), network.ErrNotFound)
		if gw, _, _ := e.l.DefaultGateway(4); gw != nil {
			t.Fatalf("default gateway %v", gw)
		}
	}},
	{name: "unknown links", run: func(t *testing.T, e *env) {
		absent(t, e.l, "nosuch")
		wantErr(t, "Adopt", e.l.Adopt("nosuch"), network.ErrNotFound)
		wantErr(t, "SetUp", e.l.SetUp("nosuch"), network.ErrNotFound)
		wantErr(t, "SetMTU", e.l.SetMTU("nosuch", 1500), network.ErrNotFound)
		wantErr(t, "SetMaster", e.l.SetMaster("nosuch", ""), network.ErrNotFound)
		wantErr(t, "ReplaceAddrs", e.l.ReplaceAddrs("nosuch", 4, nil), network.ErrNotFound)
		ok(t, "AddBridge", e.l.AddBridge("br0", 1500))
		wantErr(t, "SetMaster to nosuch", e.l.SetMaster("br0", "nosuch"), network.ErrNotFound)
		wantErr(t, "AddVLAN on nosuch", e.l.AddVLAN("nosuch.5", "nosuch", 5, 1500), network.ErrNotFound)
		absent(t, e.l, "nosuch.5")
	}},
	{name: "addresses of an unknown link", run: func(t *testing.T, e *env) {
		_, err := e.l.Addrs("nosuch", 4)
		wantErr(t, "Addrs", err, network.ErrNotFound)
	}},
	{name: "VLAN", run: func(t *testing.T, e *env) {
		before := names(t, e.l)
		err := e.l.AddVLAN("nic0.5", "nic0", 5, 1500)
		if !e.vlan {
			wantErr(t, "AddVLAN without 802.1Q", err, network.ErrUnsupported)
			absent(t, e.l, "nic0.5")
			if after := names(t, e.l); !slices.Equal(before, after) {
				t.Fatalf("links %v after a failed AddVLAN, %v before", after, before)
			}
			return
		}
		ok(t, "AddVLAN", err)
		v := get(t, e.l, "nic0.5")
		if v.Kind != "vlan" || v.Parent != "nic0" || v.Tag != 5 || !v.Ours {
			t.Fatalf("nic0.5 = %+v", v)
		}
	}},
	{name: "bond", run: func(t *testing.T, e *env) {
		before := names(t, e.l)
		err := e.l.AddBond("bond0", "active-backup", map[string]string{"miimon": "100", "updelay": "200"}, 1500)
		if !e.bond {
			wantErr(t, "AddBond without bonding", err, network.ErrUnsupported)
			absent(t, e.l, "bond0")
			if after := names(t, e.l); !slices.Equal(before, after) {
				t.Fatalf("links %v after a failed AddBond, %v before", after, before)
			}
			return
		}
		ok(t, "AddBond", err)
		b := get(t, e.l, "bond0")
		if b.Kind != "bond" || !b.Ours {
			t.Fatalf("bond0 = %+v", b)
		}
	}},
	{name: "unsupported errors name the kernel module", run: func(t *testing.T, e *env) {
		if e.vlan && e.bond {
			t.Skip("this kernel has 802.1Q and bonding")
		}
		if !e.vlan {
			err := e.l.AddVLAN("nic0.5", "nic0", 5, 1500)
			if err == nil || !strings.Contains(err.Error(), "8021q") {
				t.Fatalf("AddVLAN: %v, want the module 8021q named", err)
			}
		}
		if !e.bond {
			err := e.l.AddBond("bond0", "802.3ad", map[string]string{"lacp_rate": "fast", "xmit_hash_policy": "layer3+4"}, 1500)
			if err == nil || !strings.Contains(err.Error(), "bonding") {
				t.Fatalf("AddBond: %v, want the module bonding named", err)
			}
		}
	}},
}
