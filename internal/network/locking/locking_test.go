package locking

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"toolstackd/internal/testkit/netnstest"
)

var (
	macA    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	macB    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}
	macEvil = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xee}
	ipA     = net.ParseIP("10.88.0.1").To4()
	ipB     = net.ParseIP("10.88.0.2").To4()
	ipSpoof = net.ParseIP("10.88.0.9").To4()
	ip6A    = net.ParseIP("fd00::1")
	ip6B    = net.ParseIP("fd00::2")
	ip6Bad  = net.ParseIP("fd00::9")
)

// lab is a host namespace with a bridge br0 and two guests, A and B,
// each on it through a veth whose host end (portA, portB) is the port.
type lab struct {
	host, a, b *netnstest.Namespace
}

const (
	portA = "vifA"
	portB = "vifB"
)

func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{host: netnstest.New(t), a: netnstest.New(t), b: netnstest.New(t)}
	netnstest.Exec(t, l.host, "ip", "link", "add", "br0", "type", "bridge")
	netnstest.Exec(t, l.host, "ip", "link", "set", "br0", "up")
	for _, g := range []struct {
		ns   *netnstest.Namespace
		port string
		mac  net.HardwareAddr
		ip   net.IP
	}{{l.a, portA, macA, ipA}, {l.b, portB, macB, ipB}} {
		netnstest.Veth(t, l.host, g.port, g.ns, "eth0")
		netnstest.Exec(t, l.host, "ip", "link", "set", g.port, "master", "br0")
		netnstest.Exec(t, g.ns, "ip", "link", "set", "eth0", "address", g.mac.String())
		netnstest.Exec(t, g.ns, "ip", "addr", "add", g.ip.String()+"/24", "dev", "eth0")
		// Quiet guests: no IPv6 traffic of their own in the captures.
		netnstest.Exec(t, g.ns, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
	}
	return l
}

// inNS runs fn on a thread in ns's network namespace.
func inNS(ns *netnstest.Namespace, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer func() { _ = orig.Close() }()
		h, err := netns.GetFromPath(ns.Path())
		if err != nil {
			errc <- err
			return
		}
		defer func() { _ = h.Close() }()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// raw is an AF_PACKET socket on a guest's eth0.
type raw struct{ fd int }

func openRaw(t *testing.T, ns *netnstest.Namespace) *raw {
	t.Helper()
	r := &raw{fd: -1}
	err := inNS(ns, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		r.fd = fd
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index})
	})
	if r.fd >= 0 {
		t.Cleanup(func() { _ = unix.Close(r.fd) })
	}
	if err != nil {
		t.Fatalf("packet socket in %s: %v", ns.Name(), err)
	}
	tv := unix.NsecToTimeval((20 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(r.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return r
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// frame is a test frame: what it is, its bytes (ending with a marker of
// its own) and whether the rules should let it through.
type frame struct {
	name   string
	bytes  []byte
	passes bool
}

// deliver sends every frame from one guest and reports, per frame,
// whether the other guest saw it (by its marker) within a second.
func deliver(t *testing.T, from, to *raw, frames []frame) {
	t.Helper()
	// Whatever the receiver queued before is not ours.
	buf := make([]byte, 2048)
	for {
		if _, _, err := unix.Recvfrom(to.fd, buf, unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	for _, f := range frames {
		if _, err := unix.Write(from.fd, f.bytes); err != nil {
			t.Fatalf("sending %s: %v", f.name, err)
		}
	}
	seen := make([]bool, len(frames))
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(to.fd, buf, 0)
		if err != nil {
			continue
		}
		for i, f := range frames {
			if bytes.HasSuffix(buf[:n], f.bytes[len(f.bytes)-8:]) {
				seen[i] = true
			}
		}
	}
	for i, f := range frames {
		if seen[i] != f.passes {
			t.Errorf("%s: reached the other guest = %v, want %v", f.name, seen[i], f.passes)
		}
	}
}

func marker() []byte {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return b
}

func ether(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := append(append([]byte{}, dst...), src...)
	b = binary.BigEndian.AppendUint16(b, typ)
	return append(append(b, payload...), marker()...)
}

var broadcast = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// arp is an ARP request from ethSrc with sender sha/spa asking for tpa.
func arp(ethSrc, sha net.HardwareAddr, spa, tpa net.IP) []byte {
	p := []byte{0, 1, 8, 0, 6, 4, 0, 1}
	p = append(append(p, sha...), spa.To4()...)
	p = append(append(p, make([]byte, 6)...), tpa.To4()...)
	return ether(broadcast, ethSrc, unix.ETH_P_ARP, p)
}

// udp4 is a UDP datagram in IPv4 with a valid header checksum.
func udp4(ethSrc, ethDst net.HardwareAddr, src, dst net.IP, sport, dport uint16) []byte {
	u := binary.BigEndian.AppendUint16(nil, sport)
	u = binary.BigEndian.AppendUint16(u, dport)
	u = binary.BigEndian.AppendUint16(u, 8+8)
	u = append(u, 0, 0) // no checksum
	h := []byte{0x45, 0, 0, 0, 0, 0, 0, 0, 64, unix.IPPROTO_UDP, 0, 0}
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(u)+8))
	h = append(append(h, src.To4()...), dst.To4()...)
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
	return ether(ethDst, ethSrc, unix.ETH_P_IP, append(h, u...))
}

// ip6 is an IPv6 packet carrying l4 (whose payload length counts the
// marker ether appends).
func ip6(ethSrc, ethDst net.HardwareAddr, src, dst net.IP, next byte, l4 []byte) []byte {
	h := []byte{0x60, 0, 0, 0, 0, 0, next, 255}
	binary.BigEndian.PutUint16(h[4:], uint16(len(l4)+8))
	h = append(append(h, src.To16()...), dst.To16()...)
	return ether(ethDst, ethSrc, unix.ETH_P_IPV6, append(h, l4...))
}

func icmp6(typ byte, body ...[]byte) []byte {
	b := []byte{typ, 0, 0, 0}
	for _, p := range body {
		b = append(b, p...)
	}
	return b
}

// ns is a neighbour solicitation for target with a source link-layer
// address option.
func nsol(target net.IP, sll net.HardwareAddr) []byte {
	return icmp6(icmpv6NS, make([]byte, 4), target.To16(), []byte{1, 1}, sll)
}

// nadv is a neighbour advertisement for target with a target link-layer
// address option.
func nadv(target net.IP, tll net.HardwareAddr) []byte {
	return icmp6(icmpv6NA, []byte{0x60, 0, 0, 0}, target.To16(), []byte{2, 1}, tll)
}

func udp6() []byte { return []byte{0x30, 0x39, 0x30, 0x39, 0, 16, 0, 0} }

// lockedFrames are frames from guest A, locked with MAC macA, IPv4 ipA
// and IPv6 ip6A, and whether each must reach B.
func lockedFrames() []frame {
	mcast6 := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	return []frame{
		{"ARP from A's MAC and address", arp(macA, macA, ipA, ipB), true},
		{"ARP probe (sender 0.0.0.0)", arp(macA, macA, net.IPv4zero, ipB), true},
		{"ARP with a spoofed sender address", arp(macA, macA, ipSpoof, ipB), false},
		{"ARP with a spoofed sender MAC", arp(macA, macEvil, ipA, ipB), false},
		{"ARP from another MAC", arp(macEvil, macEvil, ipA, ipB), false},
		{"IPv4 from A's address", udp4(macA, macB, ipA, ipB, 12345, 12345), true},
		{"IPv4 from a spoofed address", udp4(macA, macB, ipSpoof, ipB, 12345, 12345), false},
		{"IPv4 from A's address, another MAC", udp4(macEvil, macB, ipA, ipB, 12345, 12345), false},
		{"DHCP discover from 0.0.0.0", udp4(macA, broadcast, net.IPv4zero, net.IPv4bcast, 68, 67), true},
		{"other UDP from 0.0.0.0", udp4(macA, broadcast, net.IPv4zero, net.IPv4bcast, 68, 69), false},
		{"IPv6 UDP from A's address", ip6(macA, macB, ip6A, ip6B, unix.IPPROTO_UDP, udp6()), true},
		{"IPv6 UDP from a spoofed address", ip6(macA, macB, ip6Bad, ip6B, unix.IPPROTO_UDP, udp6()), false},
		{"IPv6 SCTP from A's address", ip6(macA, macB, ip6A, ip6B, unix.IPPROTO_SCTP, udp6()), false},
		{"NS from A's address and MAC", ip6(macA, mcast6, ip6A, ip6B, unix.IPPROTO_ICMPV6, nsol(ip6B, macA)), true},
		{"NS with a spoofed link-layer address", ip6(macA, mcast6, ip6A, ip6B, unix.IPPROTO_ICMPV6, nsol(ip6B, macEvil)), false},
		{"NS from a spoofed address", ip6(macA, mcast6, ip6Bad, ip6B, unix.IPPROTO_ICMPV6, nsol(ip6B, macA)), false},
		{"NA for A's address", ip6(macA, mcast6, ip6A, ip6B, unix.IPPROTO_ICMPV6, nadv(ip6A, macA)), true},
		{"NA for another address", ip6(macA, mcast6, ip6A, ip6B, unix.IPPROTO_ICMPV6, nadv(ip6Bad, macA)), false},
		{"router advertisement", ip6(macA, mcast6, ip6A, ip6B, unix.IPPROTO_ICMPV6, icmp6(134, make([]byte, 12))), false},
		{"echo request from A's address", ip6(macA, macB, ip6A, ip6B, unix.IPPROTO_ICMPV6, icmp6(128, make([]byte, 4))), true},
	}
}

// forget flushes both guests' neighbour caches, which the frames of
// deliver fill with spoofed entries.
func (l *lab) forget(t *testing.T) {
	t.Helper()
	for _, ns := range []*netnstest.Namespace{l.a, l.b} {
		netnstest.Exec(t, ns, "ip", "neigh", "flush", "dev", "eth0")
	}
}

func allPass(frames []frame, pass bool) []frame {
	out := make([]frame, len(frames))
	for i, f := range frames {
		f.passes = pass
		out[i] = f
	}
	return out
}

// icmpInEchos reads how many ICMP echo requests ns's stack received.
func icmpInEchos(t *testing.T, ns *netnstest.Namespace) int {
	t.Helper()
	out := netnstest.Exec(t, ns, "cat", "/proc/net/snmp")
	var head []string
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Icmp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "InEchos" && i < len(f) {
				n, err := strconv.Atoi(f[i])
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
	}
	t.Fatalf("no Icmp InEchos in %s's /proc/net/snmp", ns.Name())
	return 0
}

// pingFails checks that from cannot ping addr and that to's stack got no
// echo request meanwhile.
func pingFails(t *testing.T, from, to *netnstest.Namespace, addr string) {
	t.Helper()
	before := icmpInEchos(t, to)
	if rtt, err := netnstest.PingErr(from, addr, time.Second); err == nil {
		t.Fatalf("ping %s from %s answered in %v, want no answer", addr, from.Name(), rtt)
	}
	if after := icmpInEchos(t, to); after != before {
		t.Fatalf("%s received %d echo requests, want none", to.Name(), after-before)
	}
}

// nftConn is a connection of the test's own to nf_tables in ns.
func nftConn(t *testing.T, ns *netnstest.Namespace) *nftables.Conn {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.AsLasting())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseLasting() })
	return c
}

// ruleset is what a namespace's tables hold, per table and chain.
type ruleset map[string][]*nftables.Rule

func dump(t *testing.T, c *nftables.Conn, keep func(*nftables.Table) bool) ruleset {
	t.Helper()
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	rs := ruleset{}
	for _, ch := range chains {
		if !keep(ch.Table) {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		rs[fmt.Sprintf("%d/%s/%s", ch.Table.Family, ch.Table.Name, ch.Name)] = rules
	}
	return rs
}

func ours(tb *nftables.Table) bool {
	return tb.Family == nftables.TableFamilyBridge && tb.Name == TableName
}

func theirs(tb *nftables.Table) bool { return !ours(tb) }

func (rs ruleset) count() int {
	n := 0
	for _, r := range rs {
		n += len(r)
	}
	return n
}

// sameRules compares two dumps by chain, rule handle and expressions.
func sameRules(a, b ruleset) bool {
	if len(a) != len(b) {
		return false
	}
	for k, ra := range a {
		rb, ok := b[k]
		if !ok || len(ra) != len(rb) {
			return false
		}
		for i := range ra {
			if ra[i].Handle != rb[i].Handle || !reflect.DeepEqual(ra[i].Exprs, rb[i].Exprs) {
				return false
			}
		}
	}
	return true
}

// addOtherTables puts tables of someone else's in ns, one in our family,
// each with a chain and a rule.
func addOtherTables(t *testing.T, c *nftables.Conn) {
	t.Helper()
	accept := nftables.ChainPolicyAccept
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyBridge} {
		tb := c.AddTable(&nftables.Table{Family: fam, Name: "someone-else"})
		ch := c.AddChain(&nftables.Chain{Name: "forward", Table: tb, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(0), Policy: &accept})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("nothing0")},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("making the other tables: %v", err)
	}
}

func TestLockingInNamespaces(t *testing.T) {
	l := newLab(t)
	nft := nftConn(t, l.host)
	addOtherTables(t, nft)
	others := dump(t, nft, theirs)
	if others.count() != 2 {
		t.Fatalf("other tables hold %d rules, want 2", others.count())
	}
	lk, err := Open(l.host.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Close() }()
	rawA, rawB := openRaw(t, l.a), openRaw(t, l.b)
	locked := Rules{Port: portA, MAC: macA, Mode: ModeLocked, IPv4: []net.IP{ipA}, IPv6: []net.IP{ip6A}}

	t.Run("unlocked", func(t *testing.T) {
		if err := lk.Apply(Rules{Port: portA, MAC: macA, Mode: ModeUnlocked}); err != nil {
			t.Fatal(err)
		}
		netnstest.Ping(t, l.a, ipB.String())
		netnstest.Ping(t, l.b, ipA.String())
		deliver(t, rawA, rawB, allPass(lockedFrames(), true))
		l.forget(t)
		if n := dump(t, nft, ours).count(); n != 2 {
			t.Fatalf("our table holds %d rules when unlocked, want the 2 dispatch rules", n)
		}
	})

	t.Run("locked", func(t *testing.T) {
		if err := lk.Apply(locked); err != nil {
			t.Fatal(err)
		}
		netnstest.Ping(t, l.a, ipB.String())
		netnstest.Ping(t, l.b, ipA.String())
		deliver(t, rawA, rawB, lockedFrames())
		l.forget(t)
		// B is not locked: what A may not send, B may.
		deliver(t, rawB, rawA, []frame{
			{"B spoofing an address", udp4(macB, macA, ipSpoof, ipA, 1, 2), true},
			{"B spoofing a MAC", arp(macEvil, macEvil, ipSpoof, ipA), true},
		})
		l.forget(t)
		netnstest.Ping(t, l.a, ipB.String())
	})

	t.Run("apply twice", func(t *testing.T) {
		before := dump(t, nft, ours)
		want := 2 + lockedRuleCount(1, 1)
		if before.count() != want {
			t.Fatalf("our table holds %d rules, want %d", before.count(), want)
		}
		if err := lk.Apply(locked); err != nil {
			t.Fatal(err)
		}
		if after := dump(t, nft, ours); after.count() != want || len(after) != len(before) {
			t.Fatalf("after a second Apply: %d rules in %d chains, want %d in %d", after.count(), len(after), want, len(before))
		}
		// Opening again (a daemon restart) keeps the port's rules.
		lk2, err := Open(l.host.Path())
		if err != nil {
			t.Fatal(err)
		}
		if err := lk2.Close(); err != nil {
			t.Fatal(err)
		}
		if err := lk2.Apply(locked); err == nil {
			t.Fatal("Apply after Close worked")
		}
		if after := dump(t, nft, ours); after.count() != want {
			t.Fatalf("after Open again: %d rules, want %d", after.count(), want)
		}
		if ports, err := lk.Ports(); err != nil || !reflect.DeepEqual(ports, []string{portA}) {
			t.Fatalf("Ports = %v, %v; want [%s]", ports, err, portA)
		}
	})

	t.Run("spoofed IP", func(t *testing.T) {
		l.forget(t)
		netnstest.Exec(t, l.a, "ip", "addr", "flush", "dev", "eth0")
		netnstest.Exec(t, l.a, "ip", "addr", "add", ipSpoof.String()+"/24", "dev", "eth0")
		// A static neighbour so that the echo itself is sent (its ARP
		// would be dropped first otherwise).
		netnstest.Exec(t, l.a, "ip", "neigh", "replace", ipB.String(), "lladdr", macB.String(), "dev", "eth0", "nud", "permanent")
		pingFails(t, l.a, l.b, ipB.String())
		netnstest.Exec(t, l.a, "ip", "neigh", "flush", "dev", "eth0")
		pingFails(t, l.a, l.b, ipB.String())
		if out := netnstest.Exec(t, l.b, "ip", "neigh", "show", ipSpoof.String()); strings.Contains(out, "lladdr") {
			t.Fatalf("B learnt the spoofed address from A's ARP: %s", out)
		}
		netnstest.Exec(t, l.a, "ip", "addr", "flush", "dev", "eth0")
		netnstest.Exec(t, l.a, "ip", "addr", "add", ipA.String()+"/24", "dev", "eth0")
		netnstest.Ping(t, l.a, ipB.String())
	})

	t.Run("spoofed MAC", func(t *testing.T) {
		netnstest.Exec(t, l.a, "ip", "link", "set", "eth0", "address", macEvil.String())
		netnstest.Exec(t, l.b, "ip", "neigh", "flush", "dev", "eth0")
		pingFails(t, l.a, l.b, ipB.String())
		netnstest.Exec(t, l.a, "ip", "link", "set", "eth0", "address", macA.String())
		netnstest.Exec(t, l.a, "ip", "neigh", "flush", "dev", "eth0")
		netnstest.Ping(t, l.a, ipB.String())
	})

	t.Run("disabled", func(t *testing.T) {
		if err := lk.Apply(Rules{Port: portA, MAC: macA, Mode: ModeDisabled}); err != nil {
			t.Fatal(err)
		}
		pingFails(t, l.a, l.b, ipB.String())
		pingFails(t, l.b, l.a, ipA.String())
		deliver(t, rawA, rawB, allPass(lockedFrames(), false))
		deliver(t, rawB, rawA, []frame{
			{"broadcast ARP from B", arp(macB, macB, ipB, ipA), false},
			{"unicast IPv4 from B", udp4(macB, macA, ipB, ipA, 1, 2), false},
		})
		l.forget(t)
		if n := dump(t, nft, ours).count(); n != 4 {
			t.Fatalf("our table holds %d rules when disabled, want 2 dispatch + 2 drops", n)
		}
	})

	t.Run("remove", func(t *testing.T) {
		if err := lk.Remove(portA); err != nil {
			t.Fatal(err)
		}
		if err := lk.Remove(portA); err != nil {
			t.Fatalf("Remove of a port without rules: %v", err)
		}
		if err := lk.Remove(portB); err != nil {
			t.Fatalf("Remove of a port never locked: %v", err)
		}
		rs := dump(t, nft, ours)
		if rs.count() != 2 || len(rs) != 2 {
			t.Fatalf("after Remove our table holds %d rules in %d chains, want 2 in the 2 base chains", rs.count(), len(rs))
		}
		if ports, err := lk.Ports(); err != nil || len(ports) != 0 {
			t.Fatalf("Ports after Remove = %v, %v", ports, err)
		}
		sets, err := nft.GetSets(&nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range sets {
			names = append(names, s.Name)
			if elems, err := nft.GetSetElements(s); err != nil || len(elems) != 0 {
				t.Fatalf("set %s after Remove: %d elements, %v", s.Name, len(elems), err)
			}
		}
		if strings.Join(names, " ") != inMapName+" "+outMapName && strings.Join(names, " ") != outMapName+" "+inMapName {
			t.Fatalf("sets after Remove: %v, want only the two maps", names)
		}
		netnstest.Ping(t, l.a, ipB.String())
		netnstest.Ping(t, l.b, ipA.String())
		deliver(t, rawA, rawB, allPass(lockedFrames(), true))
		l.forget(t)
		// Unlocked again: even a spoofed source goes through.
		netnstest.Exec(t, l.a, "ip", "addr", "add", ipSpoof.String()+"/24", "dev", "eth0")
		if _, err := netnstest.PingErr(l.b, ipSpoof.String(), 3*time.Second); err != nil {
			t.Fatalf("ping of A's second address after Remove: %v", err)
		}
	})

	if after := dump(t, nft, theirs); !sameRules(others, after) {
		t.Fatalf("the other tables changed:\nbefore %v\nafter  %v", others, after)
	}
}

// TestApplyIsAtomic checks that a batch that fails leaves the port's
// previous rules as they were.
func TestApplyIsAtomic(t *testing.T) {
	ns := netnstest.New(t)
	lk, err := Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Close() }()
	nft := nftConn(t, ns)
	r := Rules{Port: "tap7", MAC: macA, Mode: ModeLocked, IPv4: []net.IP{ipA}}
	if err := lk.Apply(r); err != nil {
		t.Fatal(err)
	}
	before := dump(t, nft, ours)
	// A chain of the port's name made by hand with a base-chain hook
	// makes the next batch fail in the kernel (a port chain is regular).
	bad := nft.AddChain(&nftables.Chain{Name: "out-tap8", Table: &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName},
		Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(0)})
	if err := nft.Flush(); err != nil {
		t.Fatal(err)
	}
	err = lk.Apply(Rules{Port: "tap8", MAC: macB, Mode: ModeDisabled})
	if err == nil {
		t.Fatal("Apply onto a base chain worked, want an error")
	}
	t.Logf("Apply failed as it should: %v", err)
	after := dump(t, nft, ours)
	delete(after, fmt.Sprintf("%d/%s/%s", bad.Table.Family, TableName, bad.Name))
	if !sameRules(before, after) {
		t.Fatalf("a failed Apply changed the table:\nbefore %v\nafter  %v", before, after)
	}
}

// BenchmarkApply1000Ports locks 1,000 ports, then measures replacing one
// port's rules with all 1,000 in place (the rules part of plugging a VIF).
func BenchmarkApply1000Ports(b *testing.B) {
	ns := netnstest.New(b)
	lk, err := Open(ns.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = lk.Close() }()
	rules := func(i int) Rules {
		mac := net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}
		return Rules{Port: fmt.Sprintf("tap%d.0", i), MAC: mac, Mode: ModeLocked,
			IPv4: []net.IP{net.IPv4(10, 0, byte(i>>8), byte(i))}}
	}
	start := time.Now()
	for i := range 1000 {
		if err := lk.Apply(rules(i)); err != nil {
			b.Fatal(err)
		}
	}
	first := time.Since(start)
	i := 0
	for b.Loop() {
		if err := lk.Apply(rules(i % 1000)); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(first.Microseconds())/1000, "µs/new-port")
}

// BenchmarkPlugVIF is the whole plug as the QEMU backend does it (a tap
// made with iproute2, put on the bridge, up) plus its locking rules.
func BenchmarkPlugVIF(b *testing.B) {
	ns := netnstest.New(b)
	ip := func(args ...string) {
		if out, err := exec.Command("ip", append([]string{"-n", ns.Name()}, args...)...).CombinedOutput(); err != nil { // #nosec G204 -- test
			b.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	lk, err := Open(ns.Path())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = lk.Close() }()
	var lockTime time.Duration
	i := 0
	for b.Loop() {
		// A bridge takes at most 1,024 ports: a new one every 1,000.
		br := fmt.Sprintf("br%d", i/1000)
		if i%1000 == 0 {
			ip("link", "add", br, "type", "bridge")
			ip("link", "set", br, "up")
		}
		tap := fmt.Sprintf("tap%d.0", i)
		ip("tuntap", "add", "dev", tap, "mode", "tap")
		ip("link", "set", "dev", tap, "master", br)
		ip("link", "set", "dev", tap, "mtu", "1500", "up")
		t0 := time.Now()
		if err := lk.Apply(Rules{Port: tap, MAC: macA, Mode: ModeLocked, IPv4: []net.IP{ipA}}); err != nil {
			b.Fatal(err)
		}
		lockTime += time.Since(t0)
		i++
	}
	b.ReportMetric(float64(lockTime.Microseconds())/float64(i), "µs-locking/op")
}

// TestApplyMaxAddresses loads a port with the most addresses allowed and
// checks the kernel holds the rules expected, and refuses one more.
func TestApplyMaxAddresses(t *testing.T) {
	ns := netnstest.New(t)
	lk, err := Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lk.Close() }()
	r := Rules{Port: "tap9", MAC: macA, Mode: ModeLocked}
	for i := range MaxAddresses / 2 {
		r.IPv4 = append(r.IPv4, net.IPv4(10, 1, 0, byte(i+1)))
		r.IPv6 = append(r.IPv6, net.ParseIP(fmt.Sprintf("fd00::%x", i+1)))
	}
	if err := lk.Apply(r); err != nil {
		t.Fatal(err)
	}
	want := 2 + lockedRuleCount(MaxAddresses/2, MaxAddresses/2)
	if n := dump(t, nftConn(t, ns), ours).count(); n != want {
		t.Fatalf("%d rules in the kernel, want %d", n, want)
	}
	r.IPv4 = append(r.IPv4, net.IPv4(10, 1, 1, 1))
	if err := lk.Apply(r); err == nil || !strings.Contains(err.Error(), "at most 64") {
		t.Fatalf("Apply with %d addresses: %v", MaxAddresses+1, err)
	}
}
