package locking

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"

	"github.com/google/nftables"
)

// lockingDB holds a network whose default_locking_mode is netMode and
// one VIF on it per entry of vifs, returning the VIFs' refs.
func lockingDB(t *testing.T, netMode dm.NetworkDefaultLockingMode, vifs ...dm.VIFRecord) (*db.DB, []string) {
	t.Helper()
	d := db.New(dm.Model, db.Options{})
	var refs []string
	_, err := d.Update(func(tx *db.Tx) error {
		network, err := tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "net", Bridge: "xenbr0",
			DefaultLockingMode: netMode}).Row())
		if err != nil {
			return err
		}
		vm, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "vm", OtherConfig: map[string]string{}}).Row())
		if err != nil {
			return err
		}
		for i, v := range vifs {
			v.Device, v.Network, v.VM, v.MTU = fmt.Sprint(i), dm.NetworkRef(network), dm.VMRef(vm), 1500
			ref, err := tx.Insert(dm.VIF.Class, "", v.Row())
			if err != nil {
				return err
			}
			refs = append(refs, ref)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, refs
}

func TestRulesFor(t *testing.T) {
	const mac = "02:00:00:00:00:0a"
	many := make([]string, MaxAddresses+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.%d.%d", i/200, i%200+1)
	}
	for _, c := range []struct {
		name    string
		netMode dm.NetworkDefaultLockingMode
		vif     dm.VIFRecord
		want    string // Rules as %v, or "error: <substring>"
	}{
		{"locked", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked,
				IPV4Allowed: []string{"10.88.0.1", "10.88.0.3", "10.88.0.1"}, IPV6Allowed: []string{"fd00::1", "FD00:0::1"}},
			"{tap1 02:00:00:00:00:0a locked [10.88.0.1 10.88.0.3] [fd00::1]}"},
		{"locked without addresses", dm.NetworkDefaultLockingModeDisabled,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked}, "{tap1 02:00:00:00:00:0a locked [] []}"},
		{"unlocked ignores the allowed lists", dm.NetworkDefaultLockingModeDisabled,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeUnlocked, IPV4Allowed: []string{"10.88.0.1"}},
			"{tap1 02:00:00:00:00:0a unlocked [] []}"},
		{"disabled", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeDisabled}, "{tap1 02:00:00:00:00:0a disabled [] []}"},
		{"network default unlocked", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeNetworkDefault}, "{tap1 02:00:00:00:00:0a unlocked [] []}"},
		{"network default disabled", dm.NetworkDefaultLockingModeDisabled,
			dm.VIFRecord{MAC: mac}, "{tap1 02:00:00:00:00:0a disabled [] []}"},
		{"no MAC yet, not locked", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{LockingMode: dm.VIFLockingModeDisabled}, "{tap1  disabled [] []}"},
		{"locked without a MAC", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{LockingMode: dm.VIFLockingModeLocked}, "error: is not an Ethernet address"},
		{"IPv6 in ipv4_allowed", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: []string{"fd00::1"}},
			"error: in ipv4_allowed is not an address of that family"},
		{"IPv4 in ipv6_allowed", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV6Allowed: []string{"10.0.0.1"}},
			"error: in ipv6_allowed is not an address of that family"},
		// What the API takes besides plain addresses, and what a database
		// written before the API checked these fields may hold.
		{"single-address prefixes", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked,
				IPV4Allowed: []string{"10.88.0.1/32", "10.88.0.1"}, IPV6Allowed: []string{"fd00::1/128"}},
			"{tap1 02:00:00:00:00:0a locked [10.88.0.1] [fd00::1]}"},
		{"an IPv4 range", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: []string{"10.88.0.0/24"}},
			"error: in ipv4_allowed is an address range"},
		{"an IPv6 range", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV6Allowed: []string{"fd00::/64"}},
			"error: in ipv6_allowed is an address range"},
		{"text after an address", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: []string{"1.2.3.4; flush ruleset"}},
			`error: "1.2.3.4; flush ruleset" in ipv4_allowed is not an address`},
		{"octet out of range", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: []string{"999.1.1.1"}},
			"error: in ipv4_allowed is not an address"},
		{"IPv6 with a zone", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV6Allowed: []string{"fe80::1%eth0"}},
			"error: in ipv6_allowed is not an address"},
		{"IPv4-mapped in ipv4_allowed", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: []string{"::ffff:10.88.0.1"}},
			"error: in ipv4_allowed is not an address of that family"},
		{"IPv4-mapped in ipv6_allowed", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV6Allowed: []string{"::ffff:10.88.0.1"}},
			"error: in ipv6_allowed is not an address of that family"},
		{"too many addresses", dm.NetworkDefaultLockingModeUnlocked,
			dm.VIFRecord{MAC: mac, LockingMode: dm.VIFLockingModeLocked, IPV4Allowed: many},
			"error: 65 allowed addresses, at most 64 per VIF"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, refs := lockingDB(t, c.netMode, c.vif)
			r, err := RulesFor(d.Snapshot(), refs[0], "tap1")
			if want, isErr := strings.CutPrefix(c.want, "error: "); isErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("RulesFor = %v, %v; want an error with %q", r, err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("{%s %s %s %v %v}", r.Port, r.MAC, r.Mode, ipStrings(r.IPv4), ipStrings(r.IPv6))
			if got != c.want {
				t.Fatalf("RulesFor = %s, want %s", got, c.want)
			}
			if r.Mode == ModeLocked && r.IPv4 != nil && len(r.IPv4[0]) != net.IPv4len {
				t.Fatalf("IPv4 addresses should be 4 bytes, got %d", len(r.IPv4[0]))
			}
		})
	}
}

func TestRulesForUnknownVIF(t *testing.T) {
	d, _ := lockingDB(t, dm.NetworkDefaultLockingModeUnlocked)
	_, err := RulesFor(d.Snapshot(), "OpaqueRef:nope", "tap1")
	if !errors.Is(err, xerr.New(xerr.HandleInvalid)) {
		t.Fatalf("RulesFor of an unknown VIF = %v, want HANDLE_INVALID", err)
	}
}

func ipStrings(ips []net.IP) []string {
	out := []string{}
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

func TestValidate(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}
	for _, c := range []struct {
		r    Rules
		want string
	}{
		{Rules{Port: "tap1", Mode: ModeUnlocked}, ""},
		{Rules{Port: "tap1", Mode: ModeDisabled}, ""},
		{Rules{Port: "tap1", Mode: ModeLocked, MAC: mac}, ""},
		{Rules{Port: "", Mode: ModeUnlocked}, "not an interface name"},
		{Rules{Port: "a-very-long-name0", Mode: ModeUnlocked}, "not an interface name"},
		{Rules{Port: "tap 1", Mode: ModeUnlocked}, "not an interface name"},
		{Rules{Port: "tap1", Mode: "network_default"}, "unknown locking mode"},
		{Rules{Port: "tap1", Mode: ModeLocked}, "6-byte MAC"},
		{Rules{Port: "tap1", Mode: ModeLocked, MAC: mac, IPv4: []net.IP{net.ParseIP("fd00::1")}}, "not an IPv4 address"},
		{Rules{Port: "tap1", Mode: ModeLocked, MAC: mac, IPv6: []net.IP{net.ParseIP("10.0.0.1")}}, "not an IPv6 address"},
		{Rules{Port: "tap1", Mode: ModeLocked, MAC: mac, IPv6: make([]net.IP, MaxAddresses+1)}, "at most 64"},
	} {
		err := c.r.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.r, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want %q", c.r, err, c.want)
		}
	}
}

// TestLockedRuleCount pins the cost of a locked port, in rules.
func TestLockedRuleCount(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}
	r := Rules{Port: "tap1", Mode: ModeLocked, MAC: mac, IPv4: []net.IP{net.ParseIP("10.0.0.1")},
		IPv6: []net.IP{net.ParseIP("fd00::1")}}
	set := &nftables.Set{Name: "__set0"}
	if n := len(lockedRules(r, set, set)); n != lockedRuleCount(1, 1) {
		t.Fatalf("%d rules, want %d", n, lockedRuleCount(1, 1))
	}
}

// lockedRuleCount is the number of rules of a locked port's input chain
// with v4 IPv4 and v6 IPv6 addresses allowed.
func lockedRuleCount(v4, v6 int) int { return 7 + 2*min(v4, 1) + 5*min(v6, 1) }
