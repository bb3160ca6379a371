package ovs_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"toolstackd/internal/network/locking"
	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/network/ovs"
	"toolstackd/internal/xerr"
)

// tapUp says whether a link in the namespace is administratively up.
func tapUp(t *testing.T, run func(...string) (string, error), name string) bool {
	t.Helper()
	out, err := run("ip", "-o", "link", "show", name)
	if err != nil {
		t.Fatalf("ip link show %s: %v %s", name, err, out)
	}
	flags := out[strings.Index(out, "<"):strings.Index(out, ">")]
	return strings.Contains(flags, ",UP") || strings.Contains(flags, "<UP")
}

// TestSwitchLocking writes a VIF's locking as OpenFlow rules on a real
// ovs-vswitchd (userspace datapath) without OVN, and reads them back with
// ovs-ofctl: through the modes, a backend's tap, a restart of the
// switch (rules written again, leftovers removed, others' rules kept),
// the unplug, and without ovs-ofctl.
func TestSwitchLocking(t *testing.T) {
	sw, o, ns := open(t, "")
	ctx := context.Background()
	if err := sw.AddBridge("xenbr7", 1500); err != nil {
		t.Fatal(err)
	}
	p := vifPort("xenbr7", locking.ModeLocked)
	tap, _ := ovs.TapName(p.VIF)
	c, _ := ovs.VIFCookie(p.VIF)
	cookie := fmt.Sprintf("%#x", c)
	flows := func() []string { return o.Flows(t, "xenbr7", cookie, "-1") }
	ofport := func(name string) string { return o.Vsctl(t, "get", "Interface", name, "ofport") }

	// Locked: xapi's rules on the VIF's port, its locking recorded.
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	got := flows()
	want, err := ovs.LockingFlows(p, atoi(t, ofport(tap)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || !strings.Contains(strings.Join(got, "\n"), "arp_spa=192.0.2.10") ||
		!strings.Contains(strings.Join(got, "\n"), "nw_src=192.0.2.10") {
		t.Fatalf("locked: %d rules, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for _, f := range got {
		if !strings.Contains(f+" ", "in_port="+ofport(tap)+",") && !strings.Contains(f, "in_port="+ofport(tap)+" ") {
			t.Errorf("a rule not on the VIF's port: %s", f)
		}
	}
	if got := o.Vsctl(t, "get", "Port", tap, "external_ids:toolstackd-locking-mode", "external_ids:toolstackd-ipv4-allowed"); got != "locked\n\"192.0.2.10\"" {
		t.Errorf("recorded locking: %q", got)
	}
	if err := sw.PlugVIF(ctx, p); err != nil { // idempotent
		t.Fatal(err)
	}
	if n := len(flows()); n != len(want) {
		t.Errorf("after a second plug: %d rules, want %d", n, len(want))
	}

	// Disabled: one rule dropping everything from the port, the tap down.
	p.Mode = locking.ModeDisabled
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := flows(); len(got) != 1 || !strings.Contains(got[0], "actions=drop") || !strings.Contains(got[0], "priority=4000") {
		t.Errorf("disabled: rules %q", got)
	}
	if tapUp(t, ns.Run, tap) {
		t.Error("disabled: the tap is up")
	}
	// Unlocked: no rules, the tap up again.
	p.Mode = locking.ModeUnlocked
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := flows(); len(got) != 0 {
		t.Errorf("unlocked: rules %q", got)
	}
	if !tapUp(t, ns.Run, tap) {
		t.Error("unlocked: the tap is down")
	}

	// A restart of the daemon (a new Switch on the same Open vSwitch)
	// writes the rules again from the ports: lost rules come back, rules
	// of ours left by a port that is gone go, others' rules stay.
	p.Mode = locking.ModeLocked
	if err := sw.PlugVIF(ctx, p); err != nil {
		t.Fatal(err)
	}
	before := flows()
	o.Ofctl(t, "del-flows", "xenbr7", "cookie="+cookie+"/-1")
	o.Ofctl(t, "add-flow", "xenbr7", "cookie=0x7473aaaaaaaaaaaa,priority=4000,in_port=99,actions=drop")
	o.Ofctl(t, "add-flow", "xenbr7", "cookie=0x99,priority=10,in_port=98,actions=drop")
	kernel, err := netlinkx.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kernel.Close() })
	sw2, err := ovs.Open(ctx, ovs.Config{DB: o.DB, Kernel: kernel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sw2.Close() })
	if after := flows(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("rules after a restart:\n%s\nbefore:\n%s", strings.Join(after, "\n"), strings.Join(before, "\n"))
	}
	if got := o.Flows(t, "xenbr7", "0x7473aaaaaaaaaaaa", "-1"); len(got) != 0 {
		t.Errorf("a leftover rule of ours stayed: %q", got)
	}
	if got := o.Flows(t, "xenbr7", "0x99", "-1"); len(got) != 1 {
		t.Errorf("another's rule did not stay: %q", got)
	}
	sw = sw2

	// A VM backend's tap takes the VIF: the rules follow it; they go
	// when the tap is deleted, and come back when a tap of that name is
	// made again and handed over (a domain's reboot: the module's
	// Locker call).
	if err := sw.AddTap("tsvif5.0", 1500); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetMaster("tsvif5.0", "xenbr7"); err != nil {
		t.Fatal(err)
	}
	q := p
	q.Tap = "tsvif5.0"
	if err := sw.PlugVIF(ctx, q); err != nil {
		t.Fatal(err)
	}
	got = flows()
	if len(got) != len(want) {
		t.Errorf("rules after the backend's tap took the VIF:\n%s", strings.Join(got, "\n"))
	}
	for _, f := range got {
		if !strings.Contains(f, "in_port="+ofport("tsvif5.0")+",") && !strings.Contains(f, "in_port="+ofport("tsvif5.0")+" ") {
			t.Errorf("a rule not on the backend's tap: %s", f)
		}
	}
	if err := sw.Delete("tsvif5.0"); err != nil {
		t.Fatal(err)
	}
	if got := flows(); len(got) != 0 {
		t.Errorf("rules left after the backend's tap went: %q", got)
	}
	if err := sw.AddTap("tsvif5.0", 1500); err != nil {
		t.Fatal(err)
	}
	if err := sw.SetMaster("tsvif5.0", "xenbr7"); err != nil {
		t.Fatal(err)
	}
	if err := sw.Apply(locking.Rules{Port: "tsvif5.0", MAC: p.MAC, Mode: locking.ModeLocked, IPv4: p.IPv4}); err != nil {
		t.Fatal(err)
	}
	if got := flows(); len(got) != len(want) {
		t.Errorf("rules after the tap was made again: %q", got)
	}
	if got := strings.Trim(o.Vsctl(t, "get", "Interface", "tsvif5.0", "external_ids:xs-vif-uuid"), `"`); got != p.VIF {
		t.Errorf("identity of the tap made again: %q", got)
	}

	// Unplug: the rules go with the port.
	if err := sw.UnplugVIF(ctx, p.VIF); err != nil {
		t.Fatal(err)
	}
	if got := flows(); len(got) != 0 {
		t.Errorf("rules left after unplug: %q", got)
	}
	if got := o.Flows(t, "xenbr7", fmt.Sprintf("%#x", ovs.CookieMark), fmt.Sprintf("%#x", ovs.CookieMask)); len(got) != 0 {
		t.Errorf("rules of ours left: %q", got)
	}

	// Without ovs-ofctl a VIF that must be locked or disabled is refused
	// with a XenAPI error naming what is missing, and nothing is made;
	// an unlocked one is plugged.
	sw3, err := ovs.Open(ctx, ovs.Config{DB: o.DB, Kernel: kernel, Ofctl: "none"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sw3.Close() })
	for _, mode := range []string{locking.ModeLocked, locking.ModeDisabled} {
		err := sw3.PlugVIF(ctx, vifPort("xenbr7", mode))
		if !xerr.HasCode(err, xerr.InternalError) || !strings.Contains(err.Error(), "ovs-ofctl") || !strings.Contains(err.Error(), "openvswitch-switch") {
			t.Errorf("%s VIF without ovs-ofctl: %v", mode, err)
		}
		if out, err := o.TryVsctl("port-to-br", tap); err == nil {
			t.Errorf("%s VIF without ovs-ofctl: a port was made on %s", mode, out)
		}
		if err := sw3.Apply(locking.Rules{Port: tap, Mode: mode}); !xerr.HasCode(err, xerr.InternalError) {
			t.Errorf("%s: Apply without ovs-ofctl: %v", mode, err)
		}
	}
	if err := sw3.PlugVIF(ctx, vifPort("xenbr7", locking.ModeUnlocked)); err != nil {
		t.Errorf("unlocked VIF without ovs-ofctl: %v", err)
	}
	if err := sw3.UnplugVIF(ctx, p.VIF); err != nil {
		t.Fatal(err)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}
