package network

import (
	"context"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// fakeManagement records what the handlers ask of the daemon.
type fakeManagement struct {
	moves        []string // "ip" or "ip alone"
	done, undone int
	disabled     int
	member, cut  bool
	failMove     error
}

func (f *fakeManagement) MoveTo(_ context.Context, ip string, alone bool) (func(), func(), error) {
	if f.failMove != nil {
		return nil, nil, f.failMove
	}
	if alone {
		ip += " alone"
	}
	f.moves = append(f.moves, ip)
	return func() { f.done++ }, func() { f.undone++ }, nil
}

func (f *fakeManagement) Disable(context.Context) error { f.disabled++; return nil }
func (f *fakeManagement) Member() bool                  { return f.member }
func (f *fakeManagement) CutOff() bool                  { return f.cut }

func (e *env) hostAddress() string {
	row, _ := e.d.Snapshot().Get(dm.Host.Class, e.host)
	return row.String(dm.Host.Address)
}

// The move: the new PIF plugged with its address, the daemon asked to
// listen there, the records moved, and the NIC of the first-boot
// management PIF (never adopted) not touched, before or after.
func TestManagementReconfigureMoves(t *testing.T) {
	e := newEnv(t)
	f := &fakeManagement{}
	RegisterManagement(e.m, f)
	e.scan()
	eth1, eth2 := e.pifOn("eth1", -1), e.pifOn("eth2", -1)

	e.fails(xerr.HandleInvalid, "host.management_reconfigure", "OpaqueRef:nope")
	if err := e.fails(xerr.PIFHasNoNetworkConfiguration, "host.management_reconfigure", eth1); err.Params[0] != eth1 {
		t.Fatalf("params %v", err.Params)
	}
	e.ok("PIF.set_primary_address_type", eth1, "IPv6")
	e.fails(xerr.PIFHasNoV6NetworkConfiguration, "host.management_reconfigure", eth1)
	e.ok("PIF.set_primary_address_type", eth1, "IPv4")
	e.ok("PIF.reconfigure_ip", eth2, "Static", "10.0.1.1", "255.255.255.0", "", "")
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "10.0.0.254", "")
	e.ok("Bond.create", e.network("b"), []string{e.pifOn("eth2", -1), e.pifOn("eth3", -1)}, "", "active-backup", map[string]string{})
	e.fails(xerr.CannotPlugBondSlave, "host.management_reconfigure", eth2)
	e.ok("host.management_reconfigure", e.mgmt) // already management: nothing
	if len(f.moves) != 0 || e.hostAddress() != "192.0.2.10" {
		t.Fatalf("refused calls moved: %v, host.address %s", f.moves, e.hostAddress())
	}

	// The daemon refuses the new address: nothing changes in the records.
	f.failMove = xerr.New(xerr.InternalError, "cannot listen")
	e.fails(xerr.InternalError, "host.management_reconfigure", eth1)
	if e.pif(eth1).Management || !e.pif(e.mgmt).Management || e.hostAddress() != "192.0.2.10" {
		t.Fatal("a failed move changed the records")
	}
	f.failMove = nil

	e.rec.Reset()
	e.ok("host.management_reconfigure", eth1)
	if strings.Join(f.moves, ",") != "10.0.0.1" || f.done != 1 || f.undone != 0 {
		t.Fatalf("moves %v done %d undone %d", f.moves, f.done, f.undone)
	}
	p := e.pif(eth1)
	if !p.Management || !p.CurrentlyAttached || p.OtherConfig[AdoptedKey] != "true" || e.hostAddress() != "10.0.0.1" {
		t.Fatalf("new management PIF %+v, host.address %s", p, e.hostAddress())
	}
	old := e.pif(e.mgmt)
	if old.Management || old.OtherConfig[AdoptedKey] != "false" || !old.CurrentlyAttached {
		t.Fatalf("old management PIF %+v", old)
	}
	for _, c := range e.rec.Calls() {
		if strings.Contains(c, "eth0") {
			t.Fatalf("the first-boot management NIC was touched: %q", e.rec.Calls())
		}
	}
	joined := strings.Join(e.rec.Calls(), "|")
	if !strings.Contains(joined, "xenbr1") || !strings.Contains(joined, "10.0.0.254") {
		t.Fatalf("calls %q: want eth1's bridge with its address and the default route through its gateway", e.rec.Calls())
	}
	// A plan from the database alone still leaves eth0 out, and a plug
	// of the old PIF adopts it as the operator asked.
	if err := e.m.Apply(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, b := range e.m.plan().Bridges {
		for _, port := range b.Ports {
			if port == "eth0" {
				t.Fatalf("eth0 planned into %s", b.Name)
			}
		}
	}
	e.ok("PIF.plug", e.mgmt)
	if e.pif(e.mgmt).OtherConfig[AdoptedKey] != "true" {
		t.Fatal("PIF.plug of the former management PIF did not adopt it")
	}
}

func TestManagementDisableAndLocal(t *testing.T) {
	e := newEnv(t)
	f := &fakeManagement{member: true}
	RegisterManagement(e.m, f)
	e.scan()
	e.fails(xerr.SlaveRequiresManagementInterface, "host.management_disable")
	f.member = false
	e.ok("host.management_disable")
	if f.disabled != 1 || e.pif(e.mgmt).Management || e.pif(e.mgmt).OtherConfig[AdoptedKey] != "false" {
		t.Fatalf("disabled %d, management PIF %+v", f.disabled, e.pif(e.mgmt))
	}
	if e.hostAddress() != "192.0.2.10" {
		t.Fatalf("management_disable changed host.address to %s", e.hostAddress())
	}

	e.fails(xerr.NotInEmergencyMode, "host.local_management_reconfigure", "xenbr1")
	f.cut = true
	e.fails(xerr.InvalidValue, "host.local_management_reconfigure", "nosuch0")
	eth1 := e.pifOn("eth1", -1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	e.ok("host.local_management_reconfigure", "xenbr1")
	if strings.Join(f.moves, ",") != "10.0.0.1 alone" {
		t.Fatalf("moves %v", f.moves)
	}
	// The records follow in the background (here the database takes
	// writes at once).
	waitCond(t, func() bool { return e.pif(eth1).Management && e.hostAddress() == "10.0.0.1" })
}

func TestManagementHAEnabled(t *testing.T) {
	e := newEnv(t)
	RegisterManagement(e.m, &fakeManagement{})
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	if _, err := e.d.Update(func(tx *db.Tx) error {
		for _, p := range tx.All(dm.Pool.Class) {
			if err := tx.Set(dm.Pool.HAEnabled, p.Ref, true); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.fails(xerr.HAIsEnabled, "host.management_reconfigure", eth1)
	e.fails(xerr.HAIsEnabled, "host.management_disable")
	e.fails(xerr.HAIsEnabled, "pool.management_reconfigure", string(e.pif(eth1).Network))
}

func TestPoolManagementReconfigure(t *testing.T) {
	e := newEnv(t)
	f := &fakeManagement{}
	RegisterManagement(e.m, f)
	e.scan()
	bare := e.network("no PIFs")
	if err := e.fails(xerr.PIFNotPresent, "pool.management_reconfigure", bare); err.Params[0] != e.host || err.Params[1] != bare {
		t.Fatalf("params %v", err.Params)
	}
	eth1 := e.pifOn("eth1", -1)
	net1 := string(e.pif(eth1).Network)
	e.fails(xerr.PIFHasNoNetworkConfiguration, "pool.management_reconfigure", net1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "")
	e.ok("pool.management_reconfigure", net1)
	if strings.Join(f.moves, ",") != "10.0.0.1" || !e.pif(eth1).Management {
		t.Fatalf("moves %v, management %v", f.moves, e.pif(eth1).Management)
	}
}

func waitCond(t *testing.T, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		sleepBriefly()
	}
	t.Fatal("condition not met within 5 s")
}

func sleepBriefly() { time.Sleep(10 * time.Millisecond) }
