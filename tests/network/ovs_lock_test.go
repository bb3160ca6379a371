package network_test

// VIF locking on the Open vSwitch backend without OVN (OpenFlow rules
// written with ovs-ofctl), with the real daemon and real traffic: two
// simulated VMs' VIFs are ports of an Open vSwitch bridge (userspace
// datapath) in the host's namespace, and each VIF's tap is held by the
// test as QEMU would hold it, relaying frames to and from a tap "eth0"
// in a guest namespace of its own with the kernel's stack on it. The
// guest's frames are checked as they arrive at the other guest.

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"toolstackd/internal/network/ovs"
	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/ovstest"
	"toolstackd/internal/testkit/testdaemon"
)

// openTap attaches to the tap name in the namespace at nsPath (making it
// when it is not there: it then lives as long as the file), as QEMU
// does: no packet information, no virtio header.
func openTap(nsPath, name string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{nil, err}
			return
		}
		defer func() { _ = orig.Close() }()
		defer func() {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			c <- result{nil, err}
			return
		}
		defer func() { _ = h.Close() }()
		if err := netns.Set(h); err != nil {
			c <- result{nil, err}
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- result{nil, fmt.Errorf("/dev/net/tun: %w", err)}
			return
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			_ = unix.Close(fd)
			c <- result{nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)}
			return
		}
		c <- result{os.NewFile(uintptr(fd), "tap "+name), nil}
	}()
	r := <-c
	return r.f, r.err
}

// marker starts every test frame's marker.
var markerPrefix = []byte("tsdlock!")

// guest is a VM's VIF seen from inside: the VIF's tap in the host's
// namespace (host) relayed to eth0 of the guest's namespace, whose
// frames from the switch are also kept (those with a marker) for the
// test to look for.
type guest struct {
	ns   *netnstest.Namespace
	host *os.File
	mu   sync.Mutex
	seen [][]byte
}

// newGuest attaches to the VIF's tap in hostNS and makes the guest's
// namespace with eth0 (the VIF's MAC, addr/24, up).
func newGuest(t *testing.T, hostNS *netnstest.Namespace, tap, mac, addr string) *guest {
	t.Helper()
	g := &guest{ns: netnstest.New(t)}
	var err error
	if g.host, err = openTap(hostNS.Path(), tap); err != nil {
		t.Fatal(err)
	}
	eth, err := openTap(g.ns.Path(), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.host.Close(); _ = eth.Close() })
	netnstest.Exec(t, g.ns, "ip", "link", "set", "eth0", "address", mac, "up")
	netnstest.Exec(t, g.ns, "ip", "addr", "add", addr+"/24", "dev", "eth0")
	netnstest.Exec(t, g.ns, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
	// A copy that fails (the VIF's tap down: a disabled VIF) drops the
	// frame, as the kernel does for QEMU.
	relay := func(from, to *os.File, keep bool) {
		buf := make([]byte, 65536)
		for {
			n, err := from.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrClosed) {
					return
				}
				time.Sleep(5 * time.Millisecond)
				continue
			}
			if keep && bytes.Contains(buf[:n], markerPrefix) {
				g.mu.Lock()
				if len(g.seen) < 10000 {
					g.seen = append(g.seen, bytes.Clone(buf[:n]))
				}
				g.mu.Unlock()
			}
			_, _ = to.Write(buf[:n])
		}
	}
	go relay(g.host, eth, true)
	go relay(eth, g.host, false)
	return g
}

// send puts a frame on the wire as the guest's NIC would; an error (the
// tap is down) is a frame dropped.
func (g *guest) send(frame []byte) { _, _ = g.host.Write(frame) }

// got says whether a frame with marker m reached the guest.
func (g *guest) got(m []byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range g.seen {
		if bytes.Contains(f, m) {
			return true
		}
	}
	return false
}

// newMarker is a marker no other frame carries.
func newMarker() []byte {
	m := make([]byte, 16)
	copy(m, markerPrefix)
	_, _ = rand.Read(m[8:])
	return m
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := append(append([]byte{}, dst...), src...)
	b = binary.BigEndian.AppendUint16(b, typ)
	return append(b, payload...)
}

// arpFrame is an ARP request (op 1) or reply (op 2) with a marker as
// trailer after the ARP body.
func arpFrame(ethSrc, sha net.HardwareAddr, spa, tpa string, op uint16, m []byte) []byte {
	body := []byte{0, 1, 8, 0, 6, 4}
	body = binary.BigEndian.AppendUint16(body, op)
	body = append(body, sha...)
	body = append(body, net.ParseIP(spa).To4()...)
	body = append(body, make([]byte, 6)...)
	body = append(body, net.ParseIP(tpa).To4()...)
	return ether(broadcast, ethSrc, 0x0806, append(body, m...))
}

func csum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// udp4Frame is a broadcast UDP datagram carrying the marker.
func udp4Frame(ethSrc net.HardwareAddr, src, dst string, sport, dport uint16, m []byte) []byte {
	udp := binary.BigEndian.AppendUint16(nil, sport)
	udp = binary.BigEndian.AppendUint16(udp, dport)
	udp = binary.BigEndian.AppendUint16(udp, uint16(8+len(m)))
	udp = append(udp, 0, 0)
	udp = append(udp, m...)
	ip := []byte{0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0}
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	ip = append(ip, net.ParseIP(src).To4()...)
	ip = append(ip, net.ParseIP(dst).To4()...)
	binary.BigEndian.PutUint16(ip[10:], csum(ip))
	return ether(broadcast, ethSrc, 0x0800, append(ip, udp...))
}

// ip6Frame is an IPv6 packet to all nodes (ff02::1) with next header
// next and body l4 followed by the marker.
func ip6Frame(ethSrc net.HardwareAddr, src string, next byte, l4, m []byte) []byte {
	payload := append(append([]byte{}, l4...), m...)
	h := []byte{0x60, 0, 0, 0, 0, 0, next, 255}
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h = append(h, net.ParseIP(src).To16()...)
	h = append(h, net.ParseIP("ff02::1").To16()...)
	return ether(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, ethSrc, 0x86dd, append(h, payload...))
}

// nsol is a neighbour solicitation for target with a source link-layer
// address option.
func nsol(target string, sll net.HardwareAddr) []byte {
	b := []byte{135, 0, 0, 0, 0, 0, 0, 0}
	b = append(b, net.ParseIP(target).To16()...)
	return append(append(b, 1, 1), sll...)
}

// frameCase is a frame a guest sends and whether it must reach the other
// guest.
type frameCase struct {
	what  string
	frame []byte
	pass  bool
	m     []byte
}

// lockedCases are the frames of a guest with MAC mac, allowed addresses
// 10.77.0.2 and fd77::2: what passes when locked (the rest passes only
// when unlocked).
func lockedCases(mac net.HardwareAddr) []frameCase {
	evil := net.HardwareAddr{0x02, 0, 0, 0, 0, 0xee}
	var cs []frameCase
	add := func(what string, pass bool, build func(m []byte) []byte) {
		m := newMarker()
		cs = append(cs, frameCase{what: what, frame: build(m), pass: pass, m: m})
	}
	add("IPv4 from the allowed address", true, func(m []byte) []byte { return udp4Frame(mac, "10.77.0.2", "10.77.0.255", 9, 9, m) })
	add("IPv4 from a spoofed address", false, func(m []byte) []byte { return udp4Frame(mac, "10.77.0.99", "10.77.0.255", 9, 9, m) })
	add("IPv4 from the allowed address and a spoofed MAC", false, func(m []byte) []byte { return udp4Frame(evil, "10.77.0.2", "10.77.0.255", 9, 9, m) })
	add("DHCP request from 0.0.0.0", true, func(m []byte) []byte { return udp4Frame(mac, "0.0.0.0", "255.255.255.255", 68, 67, m) })
	add("ARP request from the allowed address", true, func(m []byte) []byte { return arpFrame(mac, mac, "10.77.0.2", "10.77.0.1", 1, m) })
	add("ARP probe (sender 0.0.0.0)", true, func(m []byte) []byte { return arpFrame(mac, mac, "0.0.0.0", "10.77.0.2", 1, m) })
	add("ARP request from a spoofed address", false, func(m []byte) []byte { return arpFrame(mac, mac, "10.77.0.99", "10.77.0.1", 1, m) })
	add("ARP reply with a spoofed sender MAC", false, func(m []byte) []byte { return arpFrame(mac, evil, "10.77.0.2", "10.77.0.1", 2, m) })
	add("IPv6 UDP from the allowed address", true, func(m []byte) []byte {
		return ip6Frame(mac, "fd77::2", 17, []byte{0, 9, 0, 9, 0, byte(8 + 16), 0, 0}, m)
	})
	add("IPv6 UDP from a spoofed address", false, func(m []byte) []byte {
		return ip6Frame(mac, "fd77::99", 17, []byte{0, 9, 0, 9, 0, byte(8 + 16), 0, 0}, m)
	})
	add("neighbour solicitation from the allowed address", true, func(m []byte) []byte { return ip6Frame(mac, "fd77::2", 58, nsol("fd77::1", mac), m) })
	add("neighbour solicitation with a spoofed link-layer address", false, func(m []byte) []byte { return ip6Frame(mac, "fd77::2", 58, nsol("fd77::1", evil), m) })
	add("router advertisement", false, func(m []byte) []byte {
		return ip6Frame(mac, "fd77::2", 58, []byte{134, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, m)
	})
	return cs
}

// deliver sends the cases from g and says which did not do at peer what
// they should ("" when all did).
func deliver(from, to *guest, cases []frameCase) string {
	for _, c := range cases {
		from.send(c.frame)
	}
	deadline := time.Now().Add(time.Second)
	for {
		var wrong []string
		for _, c := range cases {
			if got := to.got(c.m); got != c.pass {
				wrong = append(wrong, fmt.Sprintf("%s: arrived %v, want %v", c.what, got, c.pass))
			}
		}
		// Frames that must not pass are only known not to once the
		// time is up.
		if len(wrong) == 0 && time.Now().After(deadline) {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(wrong, "; ")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func withPass(cases []frameCase, pass bool) []frameCase {
	out := make([]frameCase, len(cases))
	for i, c := range cases {
		c.pass = pass
		c.m = newMarker()
		// The frame's marker is its last 16 bytes: replace it.
		c.frame = append(bytes.Clone(c.frame[:len(c.frame)-16]), c.m...)
		out[i] = c
	}
	return out
}

// TestOVSVIFLocking: a locked VIF on the Open vSwitch backend (no OVN)
// passes only what xapi lets a locked VIF send, its guest can talk from
// its allowed address and not from another; unlocked passes everything,
// disabled nothing either way; changing the mode of the running VIF
// takes effect; the rules follow a restart of the daemon and go with
// the VM.
func TestOVSVIFLocking(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	host := netnstest.New(t)
	o := ovstest.Start(t, host.Name())
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "openvswitch", "--network-namespace", host.Path(), "--ovs-db", o.DB}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}

	network := r.str("network.create", map[string]any{"name_label": "ovs-locking", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}})
	bridge := r.str("network.get_bridge", network)
	mkVM := func(name, mode string, v4, v6 []string) (vm, vif, mac, tap string) {
		vm = r.str("VM.create", testdaemon.VMRecord(name))
		rec := vifRecord(vm, network)
		rec["locking_mode"], rec["ipv4_allowed"], rec["ipv6_allowed"] = mode, v4, v6
		vif = r.str("VIF.create", rec)
		mac = r.str("VIF.get_MAC", vif)
		var err error
		if tap, err = ovs.TapName(r.str("VIF.get_uuid", vif)); err != nil {
			t.Fatal(err)
		}
		return vm, vif, mac, tap
	}
	gvm, gvif, gmac, gtap := mkVM("guest", "locked", []string{"10.77.0.2"}, []string{"fd77::2"})
	pvm, _, pmac, ptap := mkVM("peer", "unlocked", []string{}, []string{})
	start := time.Now()
	r.call("VM.start", gvm, false, false)
	t.Logf("VM.start with a locked VIF on Open vSwitch: %v", time.Since(start).Round(time.Millisecond))
	r.call("VM.start", pvm, false, false)

	c, _ := ovs.VIFCookie(r.str("VIF.get_uuid", gvif))
	cookie := fmt.Sprintf("%#x", c)
	if n := len(o.Flows(t, bridge, cookie, "-1")); n == 0 {
		t.Fatalf("no rules of the locked VIF on %s:\n%s", bridge, o.Ofctl(t, "dump-flows", bridge))
	}
	g := newGuest(t, host, gtap, gmac, "10.77.0.2")
	p := newGuest(t, host, ptap, pmac, "10.77.0.1")
	mac, _ := net.ParseMAC(gmac)
	cases := lockedCases(mac)

	// Locked.
	if wrong := deliver(g, p, cases); wrong != "" {
		t.Errorf("locked: %s\n%s", wrong, o.Ofctl(t, "dump-flows", bridge))
	}
	if _, err := netnstest.PingErr(g.ns, "10.77.0.1", 5*time.Second); err != nil {
		t.Errorf("locked: the guest cannot reach its peer from its allowed address: %v", err)
	}
	// The guest takes an address it is not allowed: it is cut off.
	spoof := func(from, to string) {
		netnstest.Exec(t, g.ns, "ip", "addr", "del", from+"/24", "dev", "eth0")
		netnstest.Exec(t, g.ns, "ip", "addr", "add", to+"/24", "dev", "eth0")
		netnstest.Exec(t, g.ns, "ip", "neigh", "flush", "all")
		netnstest.Exec(t, p.ns, "ip", "neigh", "flush", "all")
	}
	spoof("10.77.0.2", "10.77.0.99")
	if _, err := netnstest.PingErr(g.ns, "10.77.0.1", 2*time.Second); err == nil {
		t.Error("locked: the guest reaches its peer from a spoofed address")
	}

	// Unlocked, live: everything passes, the spoofed address too.
	r.call("VIF.set_locking_mode", gvif, "unlocked")
	waitFor(t, "unlocked VIF passes everything", 30*time.Second, func() (bool, string) {
		w := deliver(g, p, withPass(cases, true))
		return w == "", w
	})
	if _, err := netnstest.PingErr(g.ns, "10.77.0.1", 5*time.Second); err != nil {
		t.Errorf("unlocked: the guest cannot reach its peer from any address: %v", err)
	}
	if n := len(o.Flows(t, bridge, cookie, "-1")); n != 0 {
		t.Errorf("unlocked: %d rules left", n)
	}
	spoof("10.77.0.99", "10.77.0.2")

	// Disabled, live: nothing from the guest, nothing to it.
	r.call("VIF.set_locking_mode", gvif, "disabled")
	waitFor(t, "disabled VIF passes nothing", 30*time.Second, func() (bool, string) {
		w := deliver(g, p, withPass(cases, false))
		return w == "", w
	})
	m := newMarker()
	toGuest := []frameCase{{what: "a broadcast from the peer", frame: udp4Frame(pmac2(t, pmac), "10.77.0.1", "10.77.0.255", 9, 9, m), m: m}}
	if w := deliver(p, g, toGuest); w != "" {
		t.Errorf("disabled: a broadcast from the peer reached the guest: %s", w)
	}
	if _, err := netnstest.PingErr(g.ns, "10.77.0.1", 2*time.Second); err == nil {
		t.Error("disabled: the guest reaches its peer")
	}

	// Locked again, live.
	r.call("VIF.set_locking_mode", gvif, "locked")
	waitFor(t, "locked again", 30*time.Second, func() (bool, string) {
		w := deliver(g, p, lockedCases(mac))
		return w == "", w
	})
	if _, err := netnstest.PingErr(g.ns, "10.77.0.1", 5*time.Second); err != nil {
		t.Errorf("locked again: the guest cannot reach its peer: %v", err)
	}

	// A restart of the daemon writes the rules again from the ports (as
	// they were: here lost by hand meanwhile).
	before := o.Flows(t, bridge, cookie, "-1")
	o.Ofctl(t, "del-flows", bridge, "cookie="+cookie+"/-1")
	d = d.Restart()
	r = &rpc{t: t, c: d.Client(), s: d.Login(t)}
	if after := o.Flows(t, bridge, cookie, "-1"); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("rules after a restart:\n%s\nwant\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if wrong := deliver(g, p, lockedCases(mac)); wrong != "" {
		t.Errorf("locked after a restart: %s", wrong)
	}

	// The rules go with the VM.
	r.call("VM.hard_shutdown", gvm)
	waitFor(t, "rules gone after VM.hard_shutdown", 30*time.Second, func() (bool, string) {
		fs := o.Flows(t, bridge, cookie, "-1")
		return len(fs) == 0, strings.Join(fs, "\n")
	})
}

// pmac2 parses a MAC, failing the test.
func pmac2(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOVSLockingWithoutOfctl: on the Open vSwitch backend without OVN
// and without ovs-ofctl, a VM with a locked VIF does not start, with a
// XenAPI error naming what is missing; one with an unlocked VIF does.
func TestOVSLockingWithoutOfctl(t *testing.T) {
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	host := netnstest.New(t)
	o := ovstest.Start(t, host.Name())
	// A PATH without ovs-ofctl (nothing else the daemon runs here is
	// looked up there).
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator", Env: []string{"PATH=" + t.TempDir()},
		ExtraArgs: []string{"--network-backend", "openvswitch", "--network-namespace", host.Path(), "--ovs-db", o.DB}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	locked := ovsVM(t, r, "locked", []string{"192.0.2.7"})
	_, err := r.try("VM.start", locked.vm, false, false)
	e := errCode(t, "VM.start of a locked VIF without ovs-ofctl", err)
	if e.Code != "INTERNAL_ERROR" || !strings.Contains(strings.Join(e.Params, " "), "ovs-ofctl") ||
		!strings.Contains(strings.Join(e.Params, " "), "openvswitch-switch") {
		t.Errorf("error %s %v, want INTERNAL_ERROR naming ovs-ofctl and its package", e.Code, e.Params)
	}
	if out, err := o.TryVsctl("port-to-br", locked.tap); err == nil {
		t.Errorf("a port of the refused VIF is on %s", out)
	}
	if got := r.str("VM.get_power_state", locked.vm); got != "Halted" {
		t.Errorf("the refused VM is %s", got)
	}
	r.call("VIF.set_locking_mode", locked.vif, "unlocked")
	r.call("VM.start", locked.vm, false, false)
	if got := o.Vsctl(t, "port-to-br", locked.tap); got != locked.bridge {
		t.Errorf("unlocked VIF's port on %q, want %s", got, locked.bridge)
	}
}
