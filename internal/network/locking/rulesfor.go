package locking

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// RulesFor reads the locking of the VIF vifRef from a database view and
// returns the Rules for the bridge port (tap) port carrying it. The
// VIF's network_default mode is resolved with its network's
// default_locking_mode, as xapi does; an empty mode counts as the
// field's default (network_default for a VIF, unlocked for a network).
// Addresses are deduplicated; a malformed MAC or address, or more than
// MaxAddresses of them, is an error for a locked VIF.
func RulesFor(snap db.Reader, vifRef, port string) (Rules, error) {
	row, ok := snap.Get(dm.VIF.Class, vifRef)
	if !ok {
		return Rules{}, xerr.New(xerr.HandleInvalid, "VIF", vifRef)
	}
	var vif dm.VIFRecord
	vif.FromRow(snap.Values(row))
	r := Rules{Port: port}
	switch vif.LockingMode {
	case dm.VIFLockingModeLocked:
		r.Mode = ModeLocked
	case dm.VIFLockingModeUnlocked:
		r.Mode = ModeUnlocked
	case dm.VIFLockingModeDisabled:
		r.Mode = ModeDisabled
	case dm.VIFLockingModeNetworkDefault, "":
		nrow, ok := snap.Get(dm.Network.Class, string(vif.Network))
		if !ok {
			return Rules{}, xerr.New(xerr.HandleInvalid, "network", string(vif.Network))
		}
		var nw dm.NetworkRecord
		nw.FromRow(snap.Values(nrow))
		switch nw.DefaultLockingMode {
		case dm.NetworkDefaultLockingModeDisabled:
			r.Mode = ModeDisabled
		case dm.NetworkDefaultLockingModeUnlocked, "":
			r.Mode = ModeUnlocked
		default:
			return Rules{}, fmt.Errorf("locking: network %s: unknown default_locking_mode %q", vif.Network, nw.DefaultLockingMode)
		}
	default:
		return Rules{}, fmt.Errorf("locking: VIF %s: unknown locking_mode %q", vifRef, vif.LockingMode)
	}
	if mac, err := net.ParseMAC(vif.MAC); err == nil && len(mac) == 6 {
		r.MAC = mac
	} else if r.Mode == ModeLocked {
		return Rules{}, fmt.Errorf("locking: VIF %s is locked but its MAC %q is not an Ethernet address", vifRef, vif.MAC)
	}
	if r.Mode != ModeLocked {
		return r, r.Validate()
	}
	var err error
	if r.IPv4, err = parseAddrs(vifRef, "ipv4_allowed", vif.IPV4Allowed, true); err != nil {
		return Rules{}, err
	}
	if r.IPv6, err = parseAddrs(vifRef, "ipv6_allowed", vif.IPV6Allowed, false); err != nil {
		return Rules{}, err
	}
	return r, r.Validate()
}

// parseAddrs parses a VIF's allowed addresses of one family, without
// duplicates, in the database's order. Every entry goes through
// ParseAllowed, whatever wrote the database (an older version did not
// check what the API took), so no rule is ever built from text.
func parseAddrs(vifRef, field string, in []string, v4 bool) ([]net.IP, error) {
	var out []net.IP
	seen := map[string]bool{}
	for _, s := range in {
		ip, err := ParseAllowed(s, v4)
		if err != nil {
			return nil, fmt.Errorf("locking: VIF %s: %.80q in %s %w", vifRef, s, field, err)
		}
		if k := ip.String(); !seen[k] {
			seen[k] = true
			out = append(out, ip)
		}
	}
	return out, nil
}

// Why ParseAllowed refuses an entry.
var (
	errNotAddress  = errors.New("is not an address")
	errWrongFamily = errors.New("is not an address of that family")
	errRange       = errors.New("is an address range, which VIF locking on this host does not take (only single addresses)")
)

// ParseAllowed reads one entry of a VIF's ipv4_allowed (v4) or
// ipv6_allowed for the locking rules: an address of that family, written
// plainly or as a single-address prefix (/32, /128). The API also takes
// wider prefixes, as xapi does; the rules here hold single addresses, so
// those are refused (errRange) and the VIF is not run locked without
// them. An IPv4-mapped IPv6 address is refused in either list: the rules
// cannot tell it from the IPv4 address. The IPv4 result is 4 bytes long,
// the IPv6 one 16.
func ParseAllowed(s string, v4 bool) (net.IP, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		p, perr := netip.ParsePrefix(s)
		if perr != nil {
			return nil, errNotAddress
		}
		if a = p.Addr(); p.Bits() != a.BitLen() {
			return nil, errRange
		}
	}
	switch {
	case a.Zone() != "":
		return nil, errNotAddress
	case v4 && !a.Is4(), !v4 && (!a.Is6() || a.Is4In6()):
		return nil, errWrongFamily
	}
	return net.IP(a.AsSlice()), nil
}
