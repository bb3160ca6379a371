// Package locking enforces a VIF's locking mode (xapi's VIF.locking_mode
// with ipv4_allowed and ipv6_allowed) on the bridge port that carries
// it, with nf_tables rules in the bridge family, written over netlink.
//
// Everything lives in one table of ours, bridge "toolstackd"; no other
// table is read or changed. Its layout:
//
//	chain prerouting  (hook prerouting, priority -200): iifname vmap @in_ports
//	chain postrouting (hook postrouting, priority -200): oifname vmap @out_ports
//	chain in-<port>   what the port may send (locked or disabled)
//	chain out-<port>  what the port may receive (disabled only drops)
//	set v4-<port>, v6-<port>  its allowed addresses (empty unless locked)
//
// The maps are keyed by the port's interface name, so a port costs one
// map lookup per frame whatever the number of ports, and a port's rules
// may be written before its tap exists. They also outlive the tap, so a
// caller applies a VIF's rules on every plug (unlocked included, which
// removes leftovers) and removes them on unplug. Apply and Remove each
// send one netlink batch, which the kernel applies whole or not at all,
// and neither needs to know what was there before. The prerouting hook
// sees a port's frames before the bridge learns their source MAC and
// whether they are forwarded or go to the host itself, so locking also
// guards the bridge's forwarding table and the host.
//
// What "locked" lets through from the port follows xapi's rules for a
// VIF (xenopsd's setup-vif-rules, Open vSwitch flavour, which is the one
// that handles IPv6 address by address):
//
//   - nothing whose Ethernet source is not the VIF's MAC;
//   - DHCP requests (IPv4, UDP to port 67) from any source address;
//   - ARP (Ethernet/IPv4) whose sender MAC is the VIF's and whose sender
//     address is 0.0.0.0 (a probe) or an allowed IPv4 address;
//   - IPv4 from an allowed address;
//   - neighbour solicitations from an allowed IPv6 address whose first
//     option is a source link-layer address equal to the VIF's MAC, and
//     neighbour advertisements from an allowed address for an allowed
//     address (xapi: for that same address);
//   - no other neighbour discovery, no router advertisements, redirects,
//     mobile prefix or multicast router discovery messages;
//   - TCP, UDP and ICMPv6 from an allowed IPv6 address;
//   - nothing else.
//
// Everything to the port passes, as in xapi. "disabled" drops everything
// from and to the port; "unlocked" has no rules at all.
package locking

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Locking modes, with network_default already resolved.
const (
	ModeLocked   = "locked"
	ModeUnlocked = "unlocked"
	ModeDisabled = "disabled"
)

// MaxAddresses bounds the IPv4 plus IPv6 addresses allowed on one port:
// each costs rules in the port's chain, walked for every frame it sends.
const MaxAddresses = 64

// Names of what this package makes.
const (
	TableName        = "toolstackd"
	preroutingChain  = "prerouting"
	postroutingChain = "postrouting"
	inMapName        = "in_ports"
	outMapName       = "out_ports"
	inPrefix         = "in-"
	outPrefix        = "out-"
	v4Prefix         = "v4-"
	v6Prefix         = "v6-"
)

// Set IDs name sets within one batch only; giving them here keeps the
// library from drawing them from its unsynchronised global counter.
const (
	idInMap = iota + 1
	idOutMap
	idV4
	idV6
)

// bridgeFilterPriority is the bridge family's "filter" priority.
const bridgeFilterPriority = -200

// Rules is one VIF's locking, as the database says it.
type Rules struct {
	Port string           // the bridge port (tap) carrying the VIF
	MAC  net.HardwareAddr // the VIF's MAC
	Mode string           // ModeLocked, ModeUnlocked or ModeDisabled
	IPv4 []net.IP         // allowed source addresses when locked
	IPv6 []net.IP
}

// Locker writes the locking rules of one network namespace.
type Locker struct {
	mu     sync.Mutex
	closed bool
	conn   *nftables.Conn
	table  *nftables.Table
	inMap  *nftables.Set
	outMap *nftables.Set
}

// Open connects to nf_tables in the network namespace at nsPath ("" for
// the current one) and makes our table, base chains and maps if they
// are not there; ports' rules already there are kept.
func Open(nsPath string) (*Locker, error) {
	opts := []nftables.ConnOption{nftables.AsLasting()}
	if nsPath != "" {
		f, err := os.Open(nsPath) // #nosec G304 -- a namespace file chosen by the caller
		if err != nil {
			return nil, fmt.Errorf("locking: namespace: %w", err)
		}
		// The socket is made in the namespace when the connection is
		// dialled, below; it stays there after the file is closed.
		defer func() { _ = f.Close() }()
		opts = append(opts, nftables.WithNetNSFd(int(f.Fd())))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("locking: netlink: %w", err)
	}
	table := &nftables.Table{Family: nftables.TableFamilyBridge, Name: TableName}
	l := &Locker{
		conn:   conn,
		table:  table,
		inMap:  &nftables.Set{Table: table, ID: idInMap, Name: inMapName, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
		outMap: &nftables.Set{Table: table, ID: idOutMap, Name: outMapName, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict},
	}
	if err := l.setup(); err != nil {
		_ = conn.CloseLasting()
		return nil, err
	}
	return l, nil
}

// setup makes (or remakes, idempotently) the table, its maps and the base
// chains dispatching to the ports' chains, in one batch.
func (l *Locker) setup() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.conn
	c.AddTable(l.table)
	if err := c.AddSet(l.inMap, nil); err != nil {
		return fmt.Errorf("locking: %w", err)
	}
	if err := c.AddSet(l.outMap, nil); err != nil {
		return fmt.Errorf("locking: %w", err)
	}
	accept := nftables.ChainPolicyAccept
	for _, b := range []struct {
		name string
		hook *nftables.ChainHook
		key  expr.MetaKey
		set  *nftables.Set
	}{
		{preroutingChain, nftables.ChainHookPrerouting, expr.MetaKeyIIFNAME, l.inMap},
		{postroutingChain, nftables.ChainHookPostrouting, expr.MetaKeyOIFNAME, l.outMap},
	} {
		ch := c.AddChain(&nftables.Chain{Name: b.name, Table: l.table, Type: nftables.ChainTypeFilter,
			Hooknum: b.hook, Priority: nftables.ChainPriorityRef(bridgeFilterPriority), Policy: &accept})
		// Flushing and adding again in the same batch keeps the one
		// dispatch rule whether or not the chain was there.
		c.FlushChain(ch)
		c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: b.key, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: b.set.Name, SetID: b.set.ID, DestRegister: 0, IsDestRegSet: true},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("locking: making table %s: %w", TableName, err)
	}
	return nil
}

// Close lets the netlink connection go; the rules stay in the kernel.
func (l *Locker) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.conn.CloseLasting()
}

// errClosed is returned by a Locker's methods after Close.
var errClosed = errors.New("locking: Locker closed")

// Apply makes the port's rules those of r, replacing whatever the port
// had, in one batch. Applying the same Rules again changes nothing.
func (l *Locker) Apply(r Rules) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Mode == ModeUnlocked {
		return l.Remove(r.Port)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	c := l.conn
	in, out := l.portChains(r.Port)
	v4, v6 := l.portSets(r.Port)
	c.AddChain(in)
	c.AddChain(out)
	c.FlushChain(in)
	c.FlushChain(out)
	for _, set := range []*nftables.Set{v4, v6} {
		if err := c.AddSet(set, nil); err != nil {
			return l.poison(err)
		}
		c.FlushSet(set)
	}
	var rules [][]expr.Any
	switch r.Mode {
	case ModeDisabled:
		rules = [][]expr.Any{{verdict(expr.VerdictDrop)}}
		c.AddRule(&nftables.Rule{Table: l.table, Chain: out, Exprs: []expr.Any{verdict(expr.VerdictDrop)}})
	case ModeLocked:
		if err := l.fill(v4, r.IPv4, net.IP.To4); err != nil {
			return l.poison(err)
		}
		if err := l.fill(v6, r.IPv6, net.IP.To16); err != nil {
			return l.poison(err)
		}
		rules = lockedRules(r, v4, v6)
	}
	for _, e := range rules {
		c.AddRule(&nftables.Rule{Table: l.table, Chain: in, Exprs: e})
	}
	if err := l.addElements(r.Port, in, out); err != nil {
		return l.poison(err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("locking: %s %s: %w", r.Mode, r.Port, err)
	}
	return nil
}

// fill queues the addresses' entry into set.
func (l *Locker) fill(set *nftables.Set, ips []net.IP, conv func(net.IP) net.IP) error {
	if len(ips) == 0 {
		return nil
	}
	elems := make([]nftables.SetElement, len(ips))
	for i, ip := range ips {
		elems[i] = nftables.SetElement{Key: slices.Clone(conv(ip))}
	}
	return l.conn.SetAddElements(set, elems)
}

// Remove takes every rule of the port away, leaving it unlocked; a port
// without rules is fine.
func (l *Locker) Remove(port string) error {
	if err := validPort(port); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errClosed
	}
	c := l.conn
	in, out := l.portChains(port)
	// Deleting what is not there fails the batch, so everything is
	// first added (a no-op when it exists) and then deleted.
	c.AddChain(in)
	c.AddChain(out)
	if err := l.addElements(port, in, out); err != nil {
		return l.poison(err)
	}
	if err := c.SetDeleteElements(l.inMap, []nftables.SetElement{{Key: ifname(port)}}); err != nil {
		return l.poison(err)
	}
	if err := c.SetDeleteElements(l.outMap, []nftables.SetElement{{Key: ifname(port)}}); err != nil {
		return l.poison(err)
	}
	c.FlushChain(in)
	c.FlushChain(out)
	for _, set := range l.portSetsList(port) {
		if err := c.AddSet(set, nil); err != nil {
			return l.poison(err)
		}
		c.DelSet(set)
	}
	c.DelChain(in)
	c.DelChain(out)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("locking: removing %s: %w", port, err)
	}
	return nil
}

// Ports lists the ports that have rules (locked or disabled), for a
// daemon that starts again to drop those of VIFs that are gone.
func (l *Locker) Ports() ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errClosed
	}
	chains, err := l.conn.ListChainsOfTableFamily(nftables.TableFamilyBridge)
	if err != nil {
		return nil, fmt.Errorf("locking: listing chains: %w", err)
	}
	var ports []string
	for _, ch := range chains {
		if ch.Table != nil && ch.Table.Name == TableName && strings.HasPrefix(ch.Name, inPrefix) {
			ports = append(ports, strings.TrimPrefix(ch.Name, inPrefix))
		}
	}
	slices.Sort(ports)
	return ports, nil
}

// portSets are the port's sets of allowed addresses.
func (l *Locker) portSets(port string) (v4, v6 *nftables.Set) {
	return &nftables.Set{Table: l.table, ID: idV4, Name: v4Prefix + port, KeyType: nftables.TypeIPAddr},
		&nftables.Set{Table: l.table, ID: idV6, Name: v6Prefix + port, KeyType: nftables.TypeIP6Addr}
}

func (l *Locker) portSetsList(port string) []*nftables.Set {
	v4, v6 := l.portSets(port)
	return []*nftables.Set{v4, v6}
}

func (l *Locker) portChains(port string) (in, out *nftables.Chain) {
	return &nftables.Chain{Name: inPrefix + port, Table: l.table}, &nftables.Chain{Name: outPrefix + port, Table: l.table}
}

// addElements queues the map entries sending the port's frames to its
// chains; adding an entry that is there already is not an error.
func (l *Locker) addElements(port string, in, out *nftables.Chain) error {
	if err := l.conn.SetAddElements(l.inMap, []nftables.SetElement{{Key: ifname(port),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: in.Name}}}); err != nil {
		return err
	}
	return l.conn.SetAddElements(l.outMap, []nftables.SetElement{{Key: ifname(port),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: out.Name}}})
}

// poison closes the Locker after the library refused to queue part of a
// batch (which validated Rules never make it do): the connection cannot
// drop the half batch already queued, and it must never be sent.
func (l *Locker) poison(err error) error {
	l.closed = true
	_ = l.conn.CloseLasting()
	return fmt.Errorf("locking: building a batch (Locker now closed): %w", err)
}

// Validate checks r before anything is sent to the kernel.
func (r Rules) Validate() error {
	if err := validPort(r.Port); err != nil {
		return err
	}
	switch r.Mode {
	case ModeUnlocked, ModeDisabled:
		return nil
	case ModeLocked:
	default:
		return fmt.Errorf("locking: %s: unknown locking mode %q (want locked, unlocked or disabled)", r.Port, r.Mode)
	}
	if len(r.MAC) != 6 {
		return fmt.Errorf("locking: %s: locked needs the VIF's 6-byte MAC, not %q", r.Port, r.MAC.String())
	}
	if n := len(r.IPv4) + len(r.IPv6); n > MaxAddresses {
		return fmt.Errorf("locking: %s: %d allowed addresses, at most %d per VIF", r.Port, n, MaxAddresses)
	}
	for _, ip := range r.IPv4 {
		if ip.To4() == nil {
			return fmt.Errorf("locking: %s: %q in ipv4_allowed is not an IPv4 address", r.Port, ip.String())
		}
	}
	for _, ip := range r.IPv6 {
		if ip.To4() != nil || ip.To16() == nil {
			return fmt.Errorf("locking: %s: %q in ipv6_allowed is not an IPv6 address", r.Port, ip.String())
		}
	}
	return nil
}

// validPort checks an interface name the way the kernel does.
func validPort(port string) error {
	if port == "" || len(port) >= unix.IFNAMSIZ || port == "." || port == ".." ||
		strings.ContainsAny(port, "/: \t\n\r\x00") {
		return fmt.Errorf("locking: %q is not an interface name", port)
	}
	return nil
}

// ifname is an interface name as nf_tables compares it: IFNAMSIZ bytes,
// zero padded.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// Ethernet types and offsets used below.
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherARP  = []byte{0x08, 0x06}
	etherIPv6 = []byte{0x86, 0xdd}
	// arpEthIPv4 is the fixed start of an Ethernet/IPv4 ARP packet:
	// hardware type 1, protocol 0x0800, lengths 6 and 4.
	arpEthIPv4 = []byte{0x00, 0x01, 0x08, 0x00, 0x06, 0x04}
)

const (
	icmpv6NS = 135
	icmpv6NA = 136
)

// lockedRules are the rules of a locked port's input chain, in order;
// v4 and v6 are the sets of its allowed addresses. A port costs 7 rules,
// 2 more with IPv4 addresses and 5 more with IPv6 ones, however many
// addresses: the addresses are looked up in the sets.
func lockedRules(r Rules, v4, v6 *nftables.Set) [][]expr.Any {
	mac := []byte(r.MAC)
	var out [][]expr.Any
	add := func(parts ...[]expr.Any) {
		var e []expr.Any
		for _, p := range parts {
			e = append(e, p...)
		}
		out = append(out, e)
	}
	drop, accept := []expr.Any{verdict(expr.VerdictDrop)}, []expr.Any{verdict(expr.VerdictAccept)}
	// Not the VIF's MAC: drop.
	add(match(expr.PayloadBaseLLHeader, 6, mac, expr.CmpOpNeq), drop)
	// DHCP requests, whatever their source address.
	add(match(expr.PayloadBaseLLHeader, 12, etherIPv4, expr.CmpOpEq), l4proto(unix.IPPROTO_UDP),
		match(expr.PayloadBaseTransportHeader, 2, []byte{0, 67}, expr.CmpOpEq), accept)
	// ARP: Ethernet/IPv4, sender MAC the VIF's, sender address 0.0.0.0
	// (a probe) or allowed.
	arp := append(match(expr.PayloadBaseLLHeader, 12, etherARP, expr.CmpOpEq),
		append(match(expr.PayloadBaseNetworkHeader, 0, arpEthIPv4, expr.CmpOpEq),
			match(expr.PayloadBaseNetworkHeader, 8, mac, expr.CmpOpEq)...)...)
	add(arp, match(expr.PayloadBaseNetworkHeader, 14, net.IPv4zero.To4(), expr.CmpOpEq), accept)
	if len(r.IPv4) > 0 {
		add(arp, in(expr.PayloadBaseNetworkHeader, 14, 4, v4), accept)
		add(match(expr.PayloadBaseLLHeader, 12, etherIPv4, expr.CmpOpEq), in(expr.PayloadBaseNetworkHeader, 12, 4, v4), accept)
	}
	var v6from []expr.Any
	icmpv6 := func(typ byte) []expr.Any {
		return append(l4proto(unix.IPPROTO_ICMPV6), match(expr.PayloadBaseTransportHeader, 0, []byte{typ}, expr.CmpOpEq)...)
	}
	if len(r.IPv6) > 0 {
		v6from = append(match(expr.PayloadBaseLLHeader, 12, etherIPv6, expr.CmpOpEq), in(expr.PayloadBaseNetworkHeader, 8, 16, v6)...)
		// Neighbour solicitation whose first option is the source
		// link-layer address (type 1), equal to the VIF's MAC.
		add(v6from, icmpv6(icmpv6NS),
			match(expr.PayloadBaseTransportHeader, 24, []byte{1}, expr.CmpOpEq),
			match(expr.PayloadBaseTransportHeader, 26, mac, expr.CmpOpEq), accept)
		// Neighbour advertisement for an allowed address.
		add(v6from, icmpv6(icmpv6NA), in(expr.PayloadBaseTransportHeader, 8, 16, v6), accept)
	}
	// Any other neighbour discovery, router advertisements, redirects,
	// mobile prefix and multicast router discovery messages: drop.
	for _, rg := range [][2]byte{{134, 137}, {146, 147}, {151, 153}} {
		add(match(expr.PayloadBaseLLHeader, 12, etherIPv6, expr.CmpOpEq), l4proto(unix.IPPROTO_ICMPV6),
			[]expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
				&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{rg[0]}, ToData: []byte{rg[1]}},
			}, drop)
	}
	if len(r.IPv6) > 0 {
		for _, p := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMPV6} {
			add(v6from, l4proto(p), accept)
		}
	}
	add(drop)
	return out
}

// in loads n bytes at offset from base and looks them up in set.
func in(base expr.PayloadBase, offset, n uint32, set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// match loads len(data) bytes at offset from base and compares them.
func match(base expr.PayloadBase, offset uint32, data []byte, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: uint32(len(data))}, // #nosec G115 -- at most 16 bytes
		&expr.Cmp{Op: op, Register: 1, Data: slices.Clone(data)},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func verdict(k expr.VerdictKind) *expr.Verdict { return &expr.Verdict{Kind: k} }
