package ovs

import (
	"net"
	"strings"
	"testing"

	"toolstackd/internal/network/locking"
)

func TestVIFCookie(t *testing.T) {
	c, err := VIFCookie("6f1c1d2e-1111-4a4a-9b9b-0123456789ab")
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(0x74736f1c1d2e1111); c != want {
		t.Errorf("cookie %#x, want %#x", c, want)
	}
	if c&CookieMask != CookieMark {
		t.Errorf("cookie %#x lacks the mark %#x", c, CookieMark)
	}
	for _, bad := range []string{"", "not-a-uuid", "6f1c1d2e-1111-4a4a-9b9b-0123456789ag", "../../etc"} {
		if _, err := VIFCookie(bad); err == nil {
			t.Errorf("VIFCookie(%q) accepted", bad)
		}
	}
}

func TestLockingFlows(t *testing.T) {
	// Unlocked: no rules.
	if fs, err := LockingFlows(port(locking.ModeUnlocked), 7); err != nil || len(fs) != 0 {
		t.Errorf("unlocked: %v %v", fs, err)
	}
	// Disabled: everything from the port dropped.
	fs, err := LockingFlows(port(locking.ModeDisabled), 7)
	if err != nil || len(fs) != 1 || fs[0] != "priority=4000,in_port=7,actions=drop" {
		t.Errorf("disabled: %v %v", fs, err)
	}
	// Locked: xapi's rule set for two IPv4 and one IPv6 address.
	fs, err = LockingFlows(port(locking.ModeLocked), 7)
	if err != nil {
		t.Fatal(err)
	}
	mac := "02:ab:cd:00:00:01"
	want := []string{
		"priority=8000,in_port=7,udp,dl_src=" + mac + ",tp_dst=67,actions=normal",
		"priority=7000,in_port=7,arp,dl_src=" + mac + ",arp_sha=" + mac + ",arp_spa=0.0.0.0,actions=normal",
		"priority=7000,in_port=7,arp,dl_src=" + mac + ",arp_sha=" + mac + ",arp_spa=10.0.0.5,actions=normal",
		"priority=6000,in_port=7,ip,dl_src=" + mac + ",nw_src=10.0.0.5,actions=normal",
		"priority=7000,in_port=7,arp,dl_src=" + mac + ",arp_sha=" + mac + ",arp_spa=10.0.0.6,actions=normal",
		"priority=6000,in_port=7,ip,dl_src=" + mac + ",nw_src=10.0.0.6,actions=normal",
		"priority=8000,in_port=7,icmp6,dl_src=" + mac + ",ipv6_src=fd00::5,icmp_type=135,icmp_code=0,nd_sll=" + mac + ",actions=normal",
		"priority=8000,in_port=7,icmp6,dl_src=" + mac + ",ipv6_src=fd00::5,icmp_type=136,icmp_code=0,nd_target=fd00::5,actions=normal",
		"priority=5000,in_port=7,icmp6,dl_src=" + mac + ",ipv6_src=fd00::5,actions=normal",
		"priority=5000,in_port=7,tcp6,dl_src=" + mac + ",ipv6_src=fd00::5,actions=normal",
		"priority=5000,in_port=7,udp6,dl_src=" + mac + ",ipv6_src=fd00::5,actions=normal",
		"priority=7000,in_port=7,icmp6,icmp_type=135,actions=drop",
		"priority=7000,in_port=7,icmp6,icmp_type=136,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=134,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=137,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=146,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=147,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=151,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=152,actions=drop",
		"priority=6000,in_port=7,icmp6,icmp_type=153,actions=drop",
		"priority=4000,in_port=7,actions=drop",
	}
	if strings.Join(fs, "\n") != strings.Join(want, "\n") {
		t.Errorf("locked rules:\n%s\nwant\n%s", strings.Join(fs, "\n"), strings.Join(want, "\n"))
	}
	// What cannot be enforced is an error, never fewer rules.
	p := port(locking.ModeLocked)
	p.MAC = nil
	if _, err := LockingFlows(p, 7); err == nil {
		t.Error("locked VIF without a MAC accepted")
	}
	if _, err := LockingFlows(port(locking.ModeLocked), 0); err == nil {
		t.Error("port number 0 accepted")
	}
	p = port("bogus")
	if _, err := LockingFlows(p, 7); err == nil {
		t.Error("unknown mode accepted")
	}
	p = port(locking.ModeLocked)
	p.IPv4 = []net.IP{net.ParseIP("fd00::1")}
	if _, err := LockingFlows(p, 7); err == nil {
		t.Error("an IPv6 address in IPv4 accepted")
	}
	p = port(locking.ModeLocked)
	for i := range locking.MaxAddresses {
		p.IPv4 = append(p.IPv4, net.IPv4(10, 1, byte(i>>8), byte(i)))
	}
	if _, err := LockingFlows(p, 7); err == nil {
		t.Error("more than MaxAddresses accepted")
	}
}

func TestBundle(t *testing.T) {
	one := bundle(false, map[uint64][]string{0x7473000000000001: {"priority=4000,in_port=3,actions=drop"}})
	if want := "delete cookie=0x7473000000000001/-1\nadd cookie=0x7473000000000001,priority=4000,in_port=3,actions=drop\n"; one != want {
		t.Errorf("bundle:\n%s\nwant\n%s", one, want)
	}
	all := bundle(true, map[uint64][]string{0x7473000000000001: nil})
	if want := "delete cookie=0x7473000000000000/0xffff000000000000\n"; all != want {
		t.Errorf("bundle of all:\n%s\nwant\n%s", all, want)
	}
}

func TestRecordedPort(t *testing.T) {
	for _, mode := range []string{locking.ModeLocked, locking.ModeUnlocked, locking.ModeDisabled} {
		p := port(mode)
		got, ok := recordedPort(PortExternalIDs(p), InterfaceExternalIDs(p))
		if !ok || got.VIF != p.VIF || got.Mode != mode || got.MAC.String() != p.MAC.String() ||
			len(got.IPv4) != 2 || !got.IPv4[1].Equal(p.IPv4[1]) || len(got.IPv6) != 1 || !got.IPv6[0].Equal(p.IPv6[0]) {
			t.Errorf("%s: read back %+v from %v", mode, got, PortExternalIDs(p))
		}
	}
	// A port without its locking recorded (an older toolstackd's) is
	// not taken as anything.
	p := port(locking.ModeLocked)
	if _, ok := recordedPort(map[string]string{OwnerKey: ownVIF}, InterfaceExternalIDs(p)); ok {
		t.Error("a port without recorded locking read as a VIF's")
	}
	if ids := PortExternalIDs(port("")); ids[KeyLocking] != locking.ModeUnlocked {
		t.Errorf("empty mode recorded as %q", ids[KeyLocking])
	}
}
