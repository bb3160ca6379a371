package network

import (
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

func TestSetPropertyGRO(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	if got := e.pif(eth1).Properties["gro"]; got != "on" {
		t.Fatalf("a scanned NIC's gro is %q, want xapi's default on", got)
	}
	x := e.fails(xerr.InvalidValue, "PIF.set_property", eth1, "tso", "on")
	if len(x.Params) != 2 || x.Params[0] != "properties" || x.Params[1] != "tso = on" {
		t.Fatalf("params %q", x.Params)
	}
	e.fails(xerr.InvalidValue, "PIF.set_property", eth1, "gro", "maybe")

	// Unplugged: the database only.
	e.rec.Reset()
	e.ok("PIF.set_property", eth1, "gro", "off")
	wantCalls(t, e.rec.Calls())
	if got := e.pif(eth1).Properties["gro"]; got != "off" {
		t.Fatalf("gro %q after set_property off", got)
	}
	// Plugging applies it, after the bridge.
	e.ok("PIF.plug", eth1)
	if on, _ := e.rec.GRO("eth1"); on {
		t.Fatal("gro still on after plugging a PIF whose gro is off")
	}
	// Plugged: the kernel at once; the same value twice changes nothing.
	e.rec.Reset()
	e.ok("PIF.set_property", eth1, "gro", "on")
	wantCalls(t, e.rec.Calls(), "gro on eth1")
	e.rec.Reset()
	e.ok("PIF.set_property", eth1, "gro", "on")
	wantCalls(t, e.rec.Calls())

	// A VLAN PIF has no properties.
	vlan := e.ok("PIF.create_VLAN", "eth2", e.network("v"), e.host, int64(7))
	e.fails(xerr.CannotChangePIFProperties, "PIF.set_property", vlan, "gro", "off")

	// The management NIC the distribution configured: recorded, the NIC
	// left alone.
	e.rec.Reset()
	e.ok("PIF.set_property", e.mgmt, "gro", "off")
	wantCalls(t, e.rec.Calls())

	// A kernel that refuses rolls the record back.
	e.rec.FailOn = "gro off eth1"
	e.call("PIF.set_property", eth1, "gro", "off")
	if got := e.pif(eth1).Properties["gro"]; got != "on" {
		t.Fatalf("gro %q in the database after the kernel refused", got)
	}
}

func TestPoolCreateVLANFromPIF(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	net := e.network("vlan9")
	v, err := e.call("pool.create_VLAN_from_PIF", eth1, net, int64(9))
	if err != nil {
		t.Fatal(err)
	}
	pifs, _ := v.([]string)
	if len(pifs) != 1 {
		t.Fatalf("pool.create_VLAN_from_PIF made %q, want one PIF on the one live host", pifs)
	}
	p := e.pif(pifs[0])
	if p.VLAN != 9 || string(p.Network) != net || !p.CurrentlyAttached {
		t.Fatalf("VLAN PIF %+v", p)
	}
	// A second time: the VLAN exists, nothing more is made.
	again := e.network("again")
	before := e.counts()
	e.fails(xerr.PIFVLANExists, "pool.create_VLAN_from_PIF", eth1, again, int64(9))
	if after := e.counts(); after != before {
		t.Fatalf("a failed pool.create_VLAN_from_PIF left %s, was %s", after, before)
	}
	// The deprecated pool.create_VLAN by device.
	v, err = e.call("pool.create_VLAN", "eth3", e.network("dev"), int64(11))
	if err != nil {
		t.Fatal(err)
	}
	if pifs, _ := v.([]string); len(pifs) != 1 || e.pif(pifs[0]).VLAN != 11 {
		t.Fatalf("pool.create_VLAN made %v", v)
	}
	n := 0
	e.d.Snapshot().Ascend(dm.VLAN.Class, func(*db.Row) bool { n++; return true })
	if n != 2 {
		t.Fatalf("%d VLANs, want 2", n)
	}
}

func TestGetManagementInterface(t *testing.T) {
	e := newEnv(t)
	if got := e.ok("host.get_management_interface", e.host); got != e.mgmt {
		t.Fatalf("management interface %s, want %s", got, e.mgmt)
	}
	e.fails(xerr.HandleInvalid, "host.get_management_interface", "OpaqueRef:nope")
}
