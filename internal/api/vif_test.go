package api_test

import (
	"encoding/json"
	"slices"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// TestVIFAllowedAddressesChecked: VIF.add_ipv4_allowed, add_ipv6_allowed,
// set_ipv4_allowed, set_ipv6_allowed and VIF.create take addresses of
// the field's family, plainly or as address/prefix (what xapi's
// Helpers.assert_is_valid_ip_addr accepts), and refuse anything else
// with INVALID_IP_ADDRESS_SPECIFIED [field], leaving the field as it was.
func TestVIFAllowedAddressesChecked(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	network := str(t, h.ok("network.create", s, map[string]any{"name_label": "n", "other_config": map[string]any{}}))
	var vms []string
	json.Unmarshal(h.ok("VM.get_all", s), &vms)
	vifRec := func(device string, v4, v6 []string) map[string]any {
		return map[string]any{"device": device, "network": network, "VM": vms[0], "MTU": "1500", "MAC": "",
			"other_config": map[string]any{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]any{},
			"ipv4_allowed": v4, "ipv6_allowed": v6}
	}
	vif := str(t, h.ok("VIF.create", s, vifRec("0", []string{"10.0.0.1"}, []string{"fd00::1"})))
	allowed := func(field string) []string {
		var got []string
		json.Unmarshal(h.ok("VIF.get_"+field, s, vif), &got)
		slices.Sort(got)
		return got
	}
	refused := func(field, method string, value any) {
		t.Helper()
		before := allowed(field)
		data := h.fails(xerr.InvalidIPAddressSpecified, method, s, vif, value)
		if !slices.Equal(data, []string{field}) {
			t.Errorf("%s %q: parameters %q, want [%s]", method, value, data, field)
		}
		if after := allowed(field); !slices.Equal(after, before) {
			t.Errorf("%s %q changed %s from %q to %q", method, value, field, before, after)
		}
	}
	for _, bad := range []string{"1.2.3.4; flush ruleset", "999.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4 ", "", "fd00::2",
		"10.0.0.0/33", "10.0.0.0/", "10.0.0.1/24/8", "::ffff:10.0.0.9", "10.0.0.1\n", "host.example"} {
		refused("ipv4_allowed", "VIF.add_ipv4_allowed", bad)
		refused("ipv4_allowed", "VIF.set_ipv4_allowed", []string{"10.0.0.2", bad})
	}
	for _, bad := range []string{"fd00::2; flush ruleset", "fd00:::2", "10.0.0.2", "fe80::1%eth0", "fd00::/129", "fe80::1%eth0/64", "", "gggg::1"} {
		refused("ipv6_allowed", "VIF.add_ipv6_allowed", bad)
		refused("ipv6_allowed", "VIF.set_ipv6_allowed", []string{"fd00::2", bad})
	}
	// Every entry of a set_ list is checked, not only the first.
	refused("ipv4_allowed", "VIF.set_ipv4_allowed", []string{"10.0.0.2", "10.0.0.3", "10.0.0.4;"})

	// What xapi accepts: a plain address or address/prefix of the family.
	h.ok("VIF.add_ipv4_allowed", s, vif, "10.0.0.2")
	h.ok("VIF.add_ipv4_allowed", s, vif, "192.168.0.0/16")
	h.ok("VIF.add_ipv6_allowed", s, vif, "fd00::2")
	h.ok("VIF.add_ipv6_allowed", s, vif, "fd00:1::/64")
	h.ok("VIF.add_ipv6_allowed", s, vif, "::ffff:10.0.0.9")
	if got := allowed("ipv4_allowed"); !slices.Equal(got, []string{"10.0.0.1", "10.0.0.2", "192.168.0.0/16"}) {
		t.Errorf("ipv4_allowed %q", got)
	}
	h.ok("VIF.set_ipv4_allowed", s, vif, []string{"10.1.0.1", "10.2.0.0/24"})
	h.ok("VIF.set_ipv6_allowed", s, vif, []string{"fd00::3"})
	if got := allowed("ipv4_allowed"); !slices.Equal(got, []string{"10.1.0.1", "10.2.0.0/24"}) {
		t.Errorf("ipv4_allowed after set %q", got)
	}
	if got := allowed("ipv6_allowed"); !slices.Equal(got, []string{"fd00::3"}) {
		t.Errorf("ipv6_allowed after set %q", got)
	}
	h.ok("VIF.set_ipv4_allowed", s, vif, []string{})

	// The same check at creation.
	data := h.fails(xerr.InvalidIPAddressSpecified, "VIF.create", s, vifRec("1", []string{"10.0.0.1", "1.2.3.4; flush ruleset"}, nil))
	if !slices.Equal(data, []string{"ipv4_allowed"}) {
		t.Errorf("VIF.create: parameters %q", data)
	}
	data = h.fails(xerr.InvalidIPAddressSpecified, "VIF.create", s, vifRec("1", nil, []string{"10.0.0.1"}))
	if !slices.Equal(data, []string{"ipv6_allowed"}) {
		t.Errorf("VIF.create: parameters %q", data)
	}

	// An entry an older version let in can still be removed.
	if _, err := h.d.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VIF.IPV4Allowed, vif, []string{"1.2.3.4; flush ruleset", "10.0.0.1"})
	}); err != nil {
		t.Fatal(err)
	}
	h.ok("VIF.remove_ipv4_allowed", s, vif, "1.2.3.4; flush ruleset")
	if got := allowed("ipv4_allowed"); !slices.Equal(got, []string{"10.0.0.1"}) {
		t.Errorf("ipv4_allowed after removing the bad entry %q", got)
	}
}
