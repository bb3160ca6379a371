package netlinkx_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/network"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/testkit/netnstest"
)

func open(t testing.TB, ns *netnstest.Namespace) *netlinkx.NS {
	t.Helper()
	l, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// step runs f, failing the test on error and logging how long it took.
func step(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	if err := f(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%-48s %v", what, time.Since(start).Round(time.Microsecond))
}

// TestVXLANDatapath builds two hosts joined by their NICs, a bridge and
// a VXLAN (VNI 100) on each, and a guest plugged into each bridge, and
// checks that the guests reach each other across the tunnel, and no
// longer once it is gone.
func TestVXLANDatapath(t *testing.T) {
	hostA, hostB := netnstest.New(t), netnstest.New(t)
	guestA, guestB := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, hostA, "nic0", hostB, "nic0")
	la, lb := open(t, hostA), open(t, hostB)

	hosts := []struct {
		name        string
		l           network.Links
		host, guest *netnstest.Namespace
		local, peer string
		guestAddr   string
	}{
		{"A", la, hostA, guestA, "192.0.2.1", "192.0.2.2", "10.200.0.1/24"},
		{"B", lb, hostB, guestB, "192.0.2.2", "192.0.2.1", "10.200.0.2/24"},
	}
	total := time.Now()
	for _, h := range hosts {
		l := h.l
		step(t, "host "+h.name+": adopt NIC, address it", func() error {
			if err := l.Adopt("nic0"); err != nil {
				return err
			}
			return l.ReplaceAddrs("nic0", 4, []net.IPNet{{IP: net.ParseIP(h.local), Mask: net.CIDRMask(24, 32)}})
		})
		step(t, "host "+h.name+": bridge xenbr1 (MTU 1450), up", func() error {
			if err := l.AddBridge("xenbr1", 1450); err != nil {
				return err
			}
			return l.SetUp("xenbr1")
		})
		step(t, "host "+h.name+": VXLAN vni 100 over nic0 into xenbr1", func() error {
			if err := l.AddVXLAN("vx100", 100, net.ParseIP(h.local), net.ParseIP(h.peer), 0, "nic0", 1450); err != nil {
				return err
			}
			if err := l.SetMaster("vx100", "xenbr1"); err != nil {
				return err
			}
			return l.SetUp("vx100")
		})
		step(t, "host "+h.name+": guest plugged into xenbr1", func() error {
			// The guest's NIC is a veth whose host end is the VIF (a
			// tap carries no traffic without a VM behind it).
			if _, err := h.guest.Run("ip", "link", "add", "eth0", "mtu", "1450", "type", "veth", "peer", "name", "vif1.0", "netns", h.host.Name()); err != nil {
				return err
			}
			if _, err := h.guest.Run("ip", "addr", "add", h.guestAddr, "dev", "eth0"); err != nil {
				return err
			}
			if _, err := h.guest.Run("ip", "link", "set", "eth0", "up"); err != nil {
				return err
			}
			if err := l.Adopt("vif1.0"); err != nil {
				return err
			}
			if err := l.SetMaster("vif1.0", "xenbr1"); err != nil {
				return err
			}
			return l.SetUp("vif1.0")
		})
	}
	t.Logf("%-48s %v", "both hosts built", time.Since(total).Round(time.Microsecond))

	start := time.Now()
	netnstest.Ping(t, guestA, "10.200.0.2")
	t.Logf("%-48s %v", "first ping A→B answered after", time.Since(start).Round(time.Microsecond))
	netnstest.Ping(t, guestB, "10.200.0.1")

	// The VXLAN learnt guest B's MAC behind host B's address.
	if out := netnstest.Exec(t, hostA, "bridge", "fdb", "show", "dev", "vx100"); !strings.Contains(out, "dst 192.0.2.2") {
		t.Errorf("host A's VXLAN forwarding database names no tunnel to host B:\n%s", out)
	}

	step(t, "host A: delete the tunnel", func() error { return la.Delete("vx100") })
	if _, err := la.Get("vx100"); err == nil {
		t.Fatal("vx100 still on host A")
	}
	if rtt, err := netnstest.PingErr(guestA, "10.200.0.2", time.Second); err == nil {
		t.Fatalf("guest B answered guest A (%v) with the tunnel gone", rtt)
	}
	t.Log("no answer A→B without the tunnel, as expected")
}

// BenchmarkPlugVIF is the time to plug a VIF: AddTap, SetMaster into a
// bridge and SetUp, 1,000 taps per operation in a namespace of its own;
// ns/tap is the figure for one.
func BenchmarkPlugVIF(b *testing.B) {
	ns := netnstest.New(b)
	l := open(b, ns)
	if err := l.AddBridge("xenbr0", 1500); err != nil {
		b.Fatal(err)
	}
	if err := l.SetUp("xenbr0"); err != nil {
		b.Fatal(err)
	}
	const taps = 1000
	names := make([]string, taps)
	for i := range names {
		names[i] = fmt.Sprintf("vif%d.0", i)
	}
	var plugged, unplugged time.Duration
	for b.Loop() {
		start := time.Now()
		for _, n := range names {
			if err := l.AddTap(n, 1500); err != nil {
				b.Fatal(err)
			}
			if err := l.SetMaster(n, "xenbr0"); err != nil {
				b.Fatal(err)
			}
			if err := l.SetUp(n); err != nil {
				b.Fatal(err)
			}
		}
		plugged += time.Since(start)
		b.StopTimer()
		start = time.Now()
		for _, n := range names {
			if err := l.Delete(n); err != nil {
				b.Fatal(err)
			}
		}
		unplugged += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(plugged.Nanoseconds())/float64(b.N*taps), "ns/tap")
	// Not timed above: Delete of each tap, for the figure of unplugging.
	b.ReportMetric(float64(unplugged.Nanoseconds())/float64(b.N*taps), "ns/unplug")
}
