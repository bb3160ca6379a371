package ovs

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
)

// VIF locking without OVN, as OpenFlow rules: what they are, as pure
// functions of a VIFPort and the port's OpenFlow number (tested without
// a switch). locking_ofctl.go writes them.
//
// The rule set is the one xenopsd's vif scripts install on an Open
// vSwitch bridge for a locked VIF (ocaml/xenopsd/scripts/setup-vif-rules,
// its vswitch half), every rule matching the VIF's port (in_port) and
// ending in the bridge's ordinary switching (NORMAL) or a drop:
//
//	8000  DHCP requests (IPv4, UDP to port 67) from the VIF's MAC
//	8000  per allowed IPv6 address: neighbour solicitations from it whose
//	      source link-layer option is the VIF's MAC; neighbour
//	      advertisements from it for itself
//	7000  ARP from the VIF's MAC whose sender MAC is the VIF's and whose
//	      sender address is 0.0.0.0 (a probe) or an allowed IPv4 address
//	7000  any other neighbour solicitation or advertisement: dropped
//	6000  IPv4 from the VIF's MAC and an allowed address
//	6000  router advertisements, redirects, mobile prefix solicitations
//	      and advertisements, multicast router advertisements,
//	      solicitations and terminations (ICMPv6 134, 137, 146, 147,
//	      151, 152, 153): dropped
//	5000  ICMPv6, TCP and UDP over IPv6 from the VIF's MAC and an allowed
//	      address
//	4000  everything else from the port: dropped
//
// Traffic to the VIF is not filtered, as in xapi. A disabled VIF gets the
// last rule alone (nothing it sends passes) and its tap is set down, so
// that nothing reaches it either (xapi takes a disabled VIF off the
// bridge; a tap off the bridge would hand its frames to the host's own
// stack instead). An unlocked VIF has no rules.
//
// Every rule of a VIF carries its cookie (VIFCookie): the top 16 bits say
// the rule is toolstackd's (CookieMark), the other 48 are the first 48
// bits of the VIF's uuid, so that a VIF's rules are replaced or removed
// exactly ("delete cookie=C/-1"), and all of toolstackd's on a bridge at
// once at start-up (CookieMark under CookieMask), whatever port numbers
// they name.

// CookieMark and CookieMask: the top 16 bits of every cookie of ours
// ("ts").
const (
	CookieMark uint64 = 0x7473 << 48
	CookieMask uint64 = 0xffff << 48
)

// VIFCookie is the cookie of a VIF's rules.
func VIFCookie(vifUUID string) (uint64, error) {
	if _, err := TapName(vifUUID); err != nil {
		return 0, err
	}
	hex := strings.ReplaceAll(vifUUID, "-", "")
	low, err := strconv.ParseUint(hex[:12], 16, 64)
	if err != nil {
		return 0, fmt.Errorf("ovs: VIF uuid %q: %w", vifUUID, err)
	}
	return CookieMark | low, nil
}

// Flow priorities (xapi's).
const (
	prioDHCP      = 8000
	prioND        = 8000
	prioARP       = 7000
	prioNDDrop    = 7000
	prioIPv4      = 6000
	prioICMP6Drop = 6000
	prioIPv6      = 5000
	prioDropAll   = 4000
)

// icmp6Dropped are the ICMPv6 types a locked VIF may not send, beyond
// neighbour discovery for addresses it does not have: router
// advertisement (134), redirect (137), mobile prefix solicitation and
// advertisement (146, 147), multicast router advertisement, solicitation
// and termination (151, 152, 153).
var icmp6Dropped = []int{134, 137, 146, 147, 151, 152, 153}

// LockingFlows is the rules (ovs-ofctl's flow syntax, without the
// cookie) enforcing p.Mode on OpenFlow port ofport: none for an unlocked
// VIF. A locked VIF needs a MAC.
func LockingFlows(p network.VIFPort, ofport int) ([]string, error) {
	if ofport <= 0 {
		return nil, fmt.Errorf("ovs: VIF %s: no OpenFlow port number (%d)", p.VIF, ofport)
	}
	in := "in_port=" + strconv.Itoa(ofport)
	flow := func(prio int, match, action string) string {
		return fmt.Sprintf("priority=%d,%s,%s,actions=%s", prio, in, match, action)
	}
	switch p.Mode {
	case locking.ModeUnlocked, "":
		return nil, nil
	case locking.ModeDisabled:
		return []string{fmt.Sprintf("priority=%d,%s,actions=drop", prioDropAll, in)}, nil
	case locking.ModeLocked:
	default:
		return nil, fmt.Errorf("ovs: VIF %s: unknown locking mode %q", p.VIF, p.Mode)
	}
	if len(p.MAC) != 6 {
		return nil, fmt.Errorf("ovs: VIF %s is locked but has no Ethernet MAC", p.VIF)
	}
	if len(p.IPv4)+len(p.IPv6) > locking.MaxAddresses {
		return nil, fmt.Errorf("ovs: VIF %s: more than %d allowed addresses", p.VIF, locking.MaxAddresses)
	}
	mac := p.MAC.String()
	out := []string{
		flow(prioDHCP, "udp,dl_src="+mac+",tp_dst=67", "normal"),
		flow(prioARP, "arp,dl_src="+mac+",arp_sha="+mac+",arp_spa=0.0.0.0", "normal"),
	}
	for _, ip := range p.IPv4 {
		v4 := ip.To4()
		if v4 == nil {
			return nil, fmt.Errorf("ovs: VIF %s: %v in ipv4_allowed is not an IPv4 address", p.VIF, ip)
		}
		a := v4.String()
		out = append(out,
			flow(prioARP, "arp,dl_src="+mac+",arp_sha="+mac+",arp_spa="+a, "normal"),
			flow(prioIPv4, "ip,dl_src="+mac+",nw_src="+a, "normal"))
	}
	for _, ip := range p.IPv6 {
		if ip.To4() != nil || len(ip) != net.IPv6len {
			return nil, fmt.Errorf("ovs: VIF %s: %v in ipv6_allowed is not an IPv6 address", p.VIF, ip)
		}
		a := ip.String()
		out = append(out,
			flow(prioND, "icmp6,dl_src="+mac+",ipv6_src="+a+",icmp_type=135,icmp_code=0,nd_sll="+mac, "normal"),
			flow(prioND, "icmp6,dl_src="+mac+",ipv6_src="+a+",icmp_type=136,icmp_code=0,nd_target="+a, "normal"))
		for _, proto := range []string{"icmp6", "tcp6", "udp6"} {
			out = append(out, flow(prioIPv6, proto+",dl_src="+mac+",ipv6_src="+a, "normal"))
		}
	}
	out = append(out,
		flow(prioNDDrop, "icmp6,icmp_type=135", "drop"),
		flow(prioNDDrop, "icmp6,icmp_type=136", "drop"))
	for _, typ := range icmp6Dropped {
		out = append(out, flow(prioICMP6Drop, "icmp6,icmp_type="+strconv.Itoa(typ), "drop"))
	}
	out = append(out, fmt.Sprintf("priority=%d,%s,actions=drop", prioDropAll, in))
	return out, nil
}

// bundle is the input of `ovs-ofctl --bundle add-flows`: each VIF's
// rules removed by its cookie, then the rules given added with it; one
// OpenFlow bundle, applied whole or not at all. With all set, every
// rule of ours on the bridge goes first.
func bundle(all bool, vifs map[uint64][]string) string {
	var b strings.Builder
	if all {
		fmt.Fprintf(&b, "delete cookie=%#x/%#x\n", CookieMark, CookieMask)
	}
	for cookie, flows := range vifs {
		if !all {
			fmt.Fprintf(&b, "delete cookie=%#x/-1\n", cookie)
		}
		for _, f := range flows {
			fmt.Fprintf(&b, "add cookie=%#x,%s\n", cookie, f)
		}
	}
	return b.String()
}

// The locking a VIF's port was given, kept in its Port row's external_ids
// so that the rules can be written again at start-up from the switch's
// database alone (the Interface row keeps xapi's keys).
const (
	KeyLocking = "toolstackd-locking-mode"
	KeyIPv4    = "toolstackd-ipv4-allowed"
	KeyIPv6    = "toolstackd-ipv6-allowed"
)

// PortExternalIDs are the external_ids of a VIF's Port row: ours, and
// its locking (mode, allowed addresses comma-separated).
func PortExternalIDs(p network.VIFPort) map[string]string {
	mode := p.Mode
	if mode == "" {
		mode = locking.ModeUnlocked
	}
	ids := map[string]string{OwnerKey: ownVIF, KeyLocking: mode}
	join := func(ips []net.IP) string {
		s := make([]string, len(ips))
		for i, ip := range ips {
			s[i] = ip.String()
		}
		return strings.Join(s, ",")
	}
	if len(p.IPv4) > 0 {
		ids[KeyIPv4] = join(p.IPv4)
	}
	if len(p.IPv6) > 0 {
		ids[KeyIPv6] = join(p.IPv6)
	}
	return ids
}

// recordedPort reads back what PortExternalIDs and InterfaceExternalIDs
// wrote: the VIF's uuid, MAC and locking (ok false when the rows are not
// a VIF's, or were written before the locking was recorded).
func recordedPort(portIDs, ifaceIDs map[string]string) (network.VIFPort, bool) {
	p := network.VIFPort{VIF: ifaceIDs[KeyXSVIF], Mode: portIDs[KeyLocking]}
	if p.VIF == "" || p.Mode == "" {
		return p, false
	}
	if mac, err := net.ParseMAC(ifaceIDs[KeyAttachedMAC]); err == nil {
		p.MAC = mac
	}
	for _, s := range strings.Split(portIDs[KeyIPv4], ",") {
		if ip := net.ParseIP(s).To4(); ip != nil {
			p.IPv4 = append(p.IPv4, ip)
		}
	}
	for _, s := range strings.Split(portIDs[KeyIPv6], ",") {
		if ip := net.ParseIP(s); ip != nil && ip.To4() == nil {
			p.IPv6 = append(p.IPv6, ip)
		}
	}
	return p, true
}
