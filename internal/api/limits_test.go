package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"toolstackd/internal/api"
	"toolstackd/internal/xerr"
)

// tooLongParams checks INVALID_VALUE's parameters for a refused value:
// the field, then the start of the value and its size against the limit.
func tooLongParams(t *testing.T, d []string, field string, size, limit int) {
	t.Helper()
	if len(d) != 2 || d[0] != field || !strings.HasSuffix(d[1], fmt.Sprintf("(%d bytes; the limit is %d)", size, limit)) ||
		!utf8.ValidString(d[1]) || len(d[1]) > 100 {
		t.Errorf("INVALID_VALUE params %q, want [%s, <start> (%d bytes; the limit is %d)]", d, field, size, limit)
	}
}

// TestStringLimits: names, descriptions, map keys and values and whole
// maps over their limits are refused with INVALID_VALUE before anything
// is written, on every message (implicit constructors and setters,
// explicit task and message calls) and over the in-daemon path; values at
// the limit pass.
func TestStringLimits(t *testing.T) {
	h := newHarness(t)
	l := api.DefaultLimits()
	s := h.login("root", rootPW)
	net := str(t, h.ok("network.create", s, map[string]any{"name_label": "n", "other_config": map[string]any{}}))

	name := strings.Repeat("é", l.NameBytes/2) // exactly NameBytes bytes
	h.ok("network.set_name_label", s, net, name)
	d := h.fails(xerr.InvalidValue, "network.set_name_label", s, net, name+"x")
	tooLongParams(t, d, "name_label", l.NameBytes+1, l.NameBytes)
	if !strings.HasPrefix(d[1], strings.Repeat("é", 16)+"...") {
		t.Errorf("value start %q", d[1])
	}
	if got := str(t, h.ok("network.get_name_label", s, net)); got != name {
		t.Errorf("name_label changed to %d bytes", len(got))
	}
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.create", s, map[string]any{"name_label": name + "x"}),
		"name_label", l.NameBytes+1, l.NameBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "task.create", s, name+"x", ""), "label", l.NameBytes+1, l.NameBytes)

	long := strings.Repeat("d", l.StringBytes)
	h.ok("network.set_name_description", s, net, long)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.set_name_description", s, net, long+"d"),
		"name_description", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.create", s, map[string]any{"name_description": long + "d"}),
		"name_description", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.add_to_other_config", s, net, "k", long+"v"),
		"other_config", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.add_to_other_config", s, net, long+"k", "v"),
		"other_config", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.set_other_config", s, net, map[string]any{"k": long + "v"}),
		"other_config", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "message.create", s, "m", 1, "VM", "uuid", long+"b"),
		"body", l.StringBytes+1, l.StringBytes)
	tooLongParams(t, h.fails(xerr.InvalidValue, "network.add_tags", s, net, long+"t"), "tags", l.StringBytes+1, l.StringBytes)

	// A whole map: many values each within the limit, together over it.
	big := map[string]any{}
	for i := range l.CollectionBytes/l.StringBytes + 1 {
		big[fmt.Sprint(i)] = strings.Repeat("v", l.StringBytes-8)
	}
	d = h.fails(xerr.InvalidValue, "network.set_other_config", s, net, big)
	if len(d) != 2 || d[0] != "other_config" || !strings.HasPrefix(d[1], "a map or set (") {
		t.Errorf("map over its total: %q", d)
	}
	h.fails(xerr.InvalidValue, "network.create", s, map[string]any{"name_label": "m", "other_config": big})
	var oc map[string]string
	json.Unmarshal(h.ok("network.get_other_config", s, net), &oc)
	if len(oc) != 0 {
		t.Errorf("other_config written: %d keys", len(oc))
	}

	// Documents (certificates here) may be larger than other strings; the
	// call then fails on its own (this bare server has no handler).
	cert := strings.Repeat("c", l.StringBytes*4)
	if _, e := h.jsonCall("pool.install_ca_certificate", s, "ca", cert); e == nil || e.Code == xerr.InvalidValue {
		t.Errorf("certificate refused: %v", e)
	}

	// The in-daemon path (the xe CLI server) is held to the same limits.
	_, _, err := h.srv.Invoke(context.Background(), s, "network.set_name_label", net, name+"x")
	if !xerr.HasCode(err, xerr.InvalidValue) {
		t.Errorf("Invoke with a long name: %v", err)
	}
	_, _, err = h.srv.Invoke(context.Background(), s, "network.set_other_config", net, map[string]string{"k": long + "v"})
	if !xerr.HasCode(err, xerr.InvalidValue) {
		t.Errorf("Invoke with a long other_config value: %v", err)
	}
}

// TestStringLimitsConfigurable: the limits are settings; zero turns one off.
func TestStringLimitsConfigurable(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.Limits = api.Limits{NameBytes: 4} })
	s := h.login("root", rootPW)
	h.fails(xerr.InvalidValue, "network.create", s, map[string]any{"name_label": "12345", "other_config": map[string]any{}})
	h.ok("network.create", s, map[string]any{"name_label": "1234", "name_description": strings.Repeat("d", 200<<10), "other_config": map[string]any{}})
}
