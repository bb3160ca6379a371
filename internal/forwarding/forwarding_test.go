package forwarding_test

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// The pool used by the golden cases: h1 is the coordinator, h2 a member.
//
//	srShared  shared, plugged on h1 and h2
//	srLocal   plugged on h2 only
//	srDead    a PBD on h2, unplugged
//	vmRun     Running on h2, a disk on srLocal
//	vmHalt    Halted, a disk on srLocal (only h2 can start it)
//	vmAny     Halted, a disk on srShared (any host can)
//	vmSusp    Suspended, a disk on srLocal
const (
	h1, h2                       = "OpaqueRef:host-1", "OpaqueRef:host-2"
	pool                         = "OpaqueRef:pool"
	srShared, srLocal, srDead    = "OpaqueRef:sr-shared", "OpaqueRef:sr-local", "OpaqueRef:sr-dead"
	pbdS1, pbdS2, pbdL2, pbdD2   = "OpaqueRef:pbd-s1", "OpaqueRef:pbd-s2", "OpaqueRef:pbd-l2", "OpaqueRef:pbd-d2"
	vdiRun, vdiHalt, vdiAny      = "OpaqueRef:vdi-run", "OpaqueRef:vdi-halt", "OpaqueRef:vdi-any"
	vdiSusp                      = "OpaqueRef:vdi-susp"
	vmRun, vmHalt, vmAny, vmSusp = "OpaqueRef:vm-run", "OpaqueRef:vm-halt", "OpaqueRef:vm-any", "OpaqueRef:vm-susp"
	vbdRun, vbdHalt              = "OpaqueRef:vbd-run", "OpaqueRef:vbd-halt"
	vifRun                       = "OpaqueRef:vif-run"
	pif2                         = "OpaqueRef:pif-2"
	taskFwd, taskHere            = "OpaqueRef:task-fwd", "OpaqueRef:task-here"
	nowhere                      = "OpaqueRef:nowhere"
)

// insert adds a row with the named fields set and the rest at their
// defaults.
func insert(t testing.TB, tx *db.Tx, c *schema.Class, ref string, fields map[string]any) {
	t.Helper()
	row := make([]any, len(c.Fields))
	for name, v := range fields {
		f := c.Field(name)
		if f == nil {
			t.Fatalf("%s has no field %s", c.Name, name)
		}
		row[f.Index] = v
	}
	if _, err := tx.Insert(c, ref, row); err != nil {
		t.Fatalf("insert %s %s: %v", c.Name, ref, err)
	}
}

func addHost(t testing.TB, tx *db.Tx, ref string) {
	metrics := ref + "-metrics"
	insert(t, tx, dm.HostMetrics.Class, metrics, map[string]any{"live": true})
	insert(t, tx, dm.Host.Class, ref, map[string]any{"name_label": ref, "enabled": true, "metrics": metrics})
}

func twoHostPool(t testing.TB) *db.DB {
	d := db.New(dm.Model, db.Options{})
	_, err := d.Update(func(tx *db.Tx) error {
		addHost(t, tx, h1)
		addHost(t, tx, h2)
		insert(t, tx, dm.Pool.Class, pool, map[string]any{"master": h1})
		insert(t, tx, dm.SR.Class, srShared, map[string]any{"shared": true})
		insert(t, tx, dm.SR.Class, srLocal, nil)
		insert(t, tx, dm.SR.Class, srDead, nil)
		for ref, f := range map[string][3]any{pbdS1: {h1, srShared, true}, pbdS2: {h2, srShared, true},
			pbdL2: {h2, srLocal, true}, pbdD2: {h2, srDead, false}} {
			insert(t, tx, dm.PBD.Class, ref, map[string]any{"host": f[0], "SR": f[1], "currently_attached": f[2]})
		}
		for ref, sr := range map[string]string{vdiRun: srLocal, vdiHalt: srLocal, vdiAny: srShared, vdiSusp: srLocal} {
			insert(t, tx, dm.VDI.Class, ref, map[string]any{"SR": sr})
		}
		insert(t, tx, dm.VM.Class, vmRun, map[string]any{"power_state": "Running", "resident_on": h2})
		insert(t, tx, dm.VM.Class, vmHalt, map[string]any{"power_state": "Halted"})
		insert(t, tx, dm.VM.Class, vmAny, map[string]any{"power_state": "Halted"})
		insert(t, tx, dm.VM.Class, vmSusp, map[string]any{"power_state": "Suspended", "suspend_VDI": vdiSusp})
		insert(t, tx, dm.VBD.Class, vbdRun, map[string]any{"VM": vmRun, "VDI": vdiRun})
		insert(t, tx, dm.VBD.Class, vbdHalt, map[string]any{"VM": vmHalt, "VDI": vdiHalt})
		insert(t, tx, dm.VBD.Class, "OpaqueRef:vbd-any", map[string]any{"VM": vmAny, "VDI": vdiAny})
		insert(t, tx, dm.VBD.Class, "OpaqueRef:vbd-cd", map[string]any{"VM": vmAny, "VDI": "OpaqueRef:NULL", "type": "CD"})
		insert(t, tx, dm.VIF.Class, vifRun, map[string]any{"VM": vmRun})
		insert(t, tx, dm.PIF.Class, pif2, map[string]any{"host": h2})
		insert(t, tx, dm.Task.Class, taskFwd, map[string]any{"resident_on": h2})
		insert(t, tx, dm.Task.Class, taskHere, nil)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// call names a message and its arguments by parameter name.
type call struct {
	wire string
	args map[string]any
}

func (c call) resolve(t *testing.T, snap db.Reader, self string) (forwarding.Target, error) {
	t.Helper()
	m := dm.Model.Message(c.wire)
	if m == nil {
		t.Fatalf("no message %s", c.wire)
	}
	var args []any
	for i, p := range m.Params {
		if i == 0 && m.TakesSession {
			continue
		}
		args = append(args, c.args[p.Name])
	}
	return forwarding.Resolve(m, args, snap, self)
}

func marks(ms ...string) []string { return ms }

func markStrings(t forwarding.Target) []string {
	var out []string
	for _, m := range t.Marks {
		out = append(out, m.Class.Name+" "+m.Ref+" "+m.Op)
	}
	return out
}

// TestGolden resolves calls in a two-host pool as xapi's message
// forwarding would.
func TestGolden(t *testing.T) {
	snap := twoHostPool(t).Snapshot()
	for _, tc := range []struct {
		name  string
		call  call
		self  string
		kind  schema.RouteKind
		hosts []string
		marks []string
	}{
		{"start of a halted VM goes to the only host that sees its SR", call{"VM.start", map[string]any{"vm": vmHalt}}, h1,
			schema.RoutePlacement, []string{h2}, marks("VM "+vmHalt+" start", "VBD "+vbdHalt+" attach", "host "+h2+" vm_start")},
		{"start of a VM on shared storage prefers the coordinator", call{"VM.start", map[string]any{"vm": vmAny}}, h1,
			schema.RoutePlacement, []string{h1}, marks("VM "+vmAny+" start", "VBD OpaqueRef:vbd-any attach", "VBD OpaqueRef:vbd-cd attach", "host "+h1+" vm_start")},
		{"clean_shutdown of a running VM goes to its resident host", call{"VM.clean_shutdown", map[string]any{"vm": vmRun}}, h1,
			schema.RouteVMResident, []string{h2}, marks("VM " + vmRun + " clean_shutdown")},
		{"clean_shutdown of a halted VM stays on the coordinator", call{"VM.clean_shutdown", map[string]any{"vm": vmHalt}}, h2,
			schema.RouteCoordinator, []string{h1}, marks("VM " + vmHalt + " clean_shutdown")},
		{"hard_shutdown of a suspended VM goes where its SRs are", call{"VM.hard_shutdown", map[string]any{"vm": vmSusp}}, h1,
			schema.RouteSRAccess, []string{h2}, marks("VM " + vmSusp + " hard_shutdown")},
		{"clone goes to a host that sees the VM's SRs", call{"VM.clone", map[string]any{"vm": vmHalt}}, h1,
			schema.RouteSRAccess, []string{h2}, marks("VM " + vmHalt + " clone")},
		{"start_on goes to the named host", call{"VM.start_on", map[string]any{"vm": vmHalt, "host": h2}}, h1,
			schema.RouteHostArg, []string{h2}, marks("VM "+vmHalt+" start_on", "VBD "+vbdHalt+" attach", "host "+h2+" vm_start")},
		{"host.reboot goes to that host", call{"host.reboot", map[string]any{"host": h2}}, h1,
			schema.RouteHostArg, []string{h2}, marks("host " + h2 + " reboot")},
		{"host.set_ntp_mode goes to self", call{"host.set_ntp_mode", map[string]any{"self": h2}}, h1,
			schema.RouteHostArg, []string{h2}, nil},
		{"SR.scan goes to the host with the SR plugged", call{"SR.scan", map[string]any{"sr": srLocal}}, h1,
			schema.RouteSRPlugged, []string{h2}, marks("SR " + srLocal + " scan")},
		{"SR.scan of a shared SR goes to the coordinator", call{"SR.scan", map[string]any{"sr": srShared}}, h2,
			schema.RouteSRPlugged, []string{h1}, marks("SR " + srShared + " scan")},
		{"SR.destroy goes to every host with a PBD, coordinator first", call{"SR.destroy", map[string]any{"sr": srShared}}, h2,
			schema.RouteSRAllPBDs, []string{h1, h2}, marks("SR " + srShared + " destroy")},
		{"SR.forget counts unplugged PBDs", call{"SR.forget", map[string]any{"sr": srDead}}, h1,
			schema.RouteSRAllPBDs, []string{h2}, marks("SR " + srDead + " forget")},
		{"SR.create of a local SR goes to its host", call{"SR.create", map[string]any{"host": h2, "shared": false}}, h1,
			schema.RouteHostArg, []string{h2}, nil},
		{"SR.create of a shared SR stays on the coordinator", call{"SR.create", map[string]any{"host": h2, "shared": true}}, h1,
			schema.RouteCoordinator, []string{h1}, nil},
		{"VDI.destroy goes to a host with its SR plugged", call{"VDI.destroy", map[string]any{"self": vdiRun}}, h1,
			schema.RouteSRPlugged, []string{h2}, marks("SR "+srLocal+" vdi_destroy", "VDI "+vdiRun+" destroy")},
		{"VDI.create reads the SR from its record", call{"VDI.create", map[string]any{"args": map[string]any{"SR": srLocal}}}, h1,
			schema.RouteSRPlugged, []string{h2}, marks("SR " + srLocal + " vdi_create")},
		{"VDI.copy goes to a host seeing both SRs", call{"VDI.copy", map[string]any{"vdi": vdiAny, "sr": srLocal}}, h1,
			schema.RouteSRAccess, []string{h2}, marks("VDI " + vdiAny + " copy")},
		{"PBD.plug goes to the PBD's host and locks the SR", call{"PBD.plug", map[string]any{"self": pbdD2}}, h1,
			schema.RouteObjectHost, []string{h2}, marks("SR " + srDead + " plug")},
		{"PIF.plug goes to the PIF's host", call{"PIF.plug", map[string]any{"self": pif2}}, h1,
			schema.RouteObjectHost, []string{h2}, nil},
		{"Bond.create goes to its first member's host", call{"Bond.create", map[string]any{"members": []string{pif2}}}, h1,
			schema.RouteObjectHost, []string{h2}, nil},
		{"VBD.plug goes to its VM's host", call{"VBD.plug", map[string]any{"self": vbdRun}}, h1,
			schema.RouteVMResident, []string{h2}, marks("VBD " + vbdRun + " plug")},
		{"VIF.unplug_force marks unplug", call{"VIF.unplug_force", map[string]any{"self": vifRun}}, h1,
			schema.RouteVMResident, []string{h2}, marks("VIF " + vifRun + " unplug")},
		{"task.cancel goes where the task was forwarded", call{"task.cancel", map[string]any{"task": taskFwd}}, h1,
			schema.RouteTaskForwarded, []string{h2}, nil},
		{"task.cancel of a task not forwarded stays on the coordinator", call{"task.cancel", map[string]any{"task": taskHere}}, h2,
			schema.RouteTaskForwarded, []string{h1}, nil},
		{"session.login runs where it was received", call{"session.login_with_password", nil}, h2,
			schema.RouteLocal, []string{h2}, nil},
		{"event.from runs where it was received", call{"event.from", nil}, h2,
			schema.RouteLocal, []string{h2}, nil},
		{"an emergency call runs where it was received", call{"host.emergency_ha_disable", nil}, h2,
			schema.RouteLocal, []string{h2}, nil},
		{"VM.get_record runs on the coordinator", call{"VM.get_record", map[string]any{"self": vmRun}}, h2,
			schema.RouteCoordinator, []string{h1}, nil},
		{"VM.get_all_records_where runs on the coordinator", call{"VM.get_all_records_where", map[string]any{"expr": "true"}}, h2,
			schema.RouteCoordinator, []string{h1}, nil},
		{"pool.eject goes to the host and locks the pool", call{"pool.eject", map[string]any{"host": h2}}, h1,
			schema.RouteHostArg, []string{h2}, marks("pool " + pool + " eject")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.call.resolve(t, snap, tc.self)
			if err != nil {
				t.Fatalf("%s: %v", tc.call.wire, err)
			}
			if got.Kind != tc.kind || !slices.Equal(got.Hosts, tc.hosts) {
				t.Errorf("%s: got %s on %v, want %s on %v", tc.call.wire, got.Kind, got.Hosts, tc.kind, tc.hosts)
			}
			if gm := markStrings(got); !slices.Equal(gm, tc.marks) {
				t.Errorf("%s: marks %q, want %q", tc.call.wire, gm, tc.marks)
			}
		})
	}
}

func TestPlacementPrefersAffinityAndSkipsDownHosts(t *testing.T) {
	d := twoHostPool(t)
	m := dm.Model.Message("VM.start")
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.Affinity, vmAny, h2) }); err != nil {
		t.Fatal(err)
	}
	got, err := forwarding.Resolve(m, []any{vmAny, false, false}, d.Snapshot(), h1)
	if err != nil || got.Host() != h2 {
		t.Fatalf("affinity h2: got %v, %v", got.Hosts, err)
	}
	// h2 goes down: a VM only h2 can see has nowhere to start.
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.HostMetrics.Live, h2+"-metrics", false) }); err != nil {
		t.Fatal(err)
	}
	_, err = forwarding.Resolve(m, []any{vmHalt, false, false}, d.Snapshot(), h1)
	if !xerr.HasCode(err, "NO_HOSTS_AVAILABLE") {
		t.Fatalf("h2 down: got %v, want NO_HOSTS_AVAILABLE", err)
	}
	// A disabled host is not chosen either, but a reservation is honoured.
	if _, err := d.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.ScheduledToBeResidentOn, vmHalt, h2)
	}); err != nil {
		t.Fatal(err)
	}
	got, err = forwarding.Resolve(m, []any{vmHalt, false, false}, d.Snapshot(), h1)
	if err != nil || got.Host() != h2 {
		t.Fatalf("reserved on h2: got %v, %v", got.Hosts, err)
	}
}

// Placement skips hosts without room for the VM's memory or without its
// networks, and takes the one with the most room.
func TestPlacementByMemoryAndNetworks(t *testing.T) {
	d := twoHostPool(t)
	m := dm.Model.Message("VM.start")
	set := func(fn func(tx *db.Tx) error) {
		t.Helper()
		if _, err := d.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	place := func() (string, error) {
		got, err := forwarding.Resolve(m, []any{vmAny, false, false}, d.Snapshot(), h1)
		if err != nil {
			return "", err
		}
		if got.Placed != vmAny {
			t.Errorf("placed %q, want %s", got.Placed, vmAny)
		}
		return got.Host(), nil
	}
	set(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.MemoryStaticMax, vmAny, int64(1<<30)); err != nil {
			return err
		}
		if err := tx.Set(dm.HostMetrics.MemoryFree, h1+"-metrics", int64(4<<30)); err != nil {
			return err
		}
		return tx.Set(dm.HostMetrics.MemoryFree, h2+"-metrics", int64(8<<30))
	})
	if h, err := place(); err != nil || h != h2 {
		t.Fatalf("most room is h2: got %s, %v", h, err)
	}
	// h2 starts a 5 GiB VM (its metrics say so): h1 has more room now.
	set(func(tx *db.Tx) error { return tx.Set(dm.HostMetrics.MemoryFree, h2+"-metrics", int64(3<<30)) })
	if h, err := place(); err != nil || h != h1 {
		t.Fatalf("h2 holds a 5 GiB VM: got %s, %v", h, err)
	}
	// Neither host has room for 4 GiB more.
	set(func(tx *db.Tx) error { return tx.Set(dm.VM.MemoryStaticMax, vmAny, int64(5<<30)) })
	if _, err := place(); !xerr.HasCode(err, xerr.NoHostsAvailable) {
		t.Fatalf("no room: got %v, want NO_HOSTS_AVAILABLE", err)
	}
	// A network with a PIF only on h2 keeps the VM off h1.
	set(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.MemoryStaticMax, vmAny, int64(1<<30)); err != nil {
			return err
		}
		net := "OpaqueRef:net-h2"
		insert(t, tx, dm.Network.Class, net, map[string]any{"name_label": "h2 only"})
		if err := tx.Set(dm.PIF.Network, pif2, net); err != nil {
			return err
		}
		insert(t, tx, dm.VIF.Class, "OpaqueRef:vif-any", map[string]any{"VM": vmAny, "network": net, "device": "0"})
		return nil
	})
	if h, err := place(); err != nil || h != h2 {
		t.Fatalf("network only on h2: got %s, %v", h, err)
	}
}

func TestErrors(t *testing.T) {
	snap := twoHostPool(t).Snapshot()
	for _, tc := range []struct {
		call   call
		code   string
		params []string
	}{
		{call{"host.reboot", map[string]any{"host": nowhere}}, xerr.HandleInvalid, []string{"host", nowhere}},
		{call{"VM.clean_shutdown", map[string]any{"vm": nowhere}}, xerr.HandleInvalid, []string{"VM", nowhere}},
		{call{"PBD.plug", map[string]any{"self": nowhere}}, xerr.HandleInvalid, []string{"PBD", nowhere}},
		{call{"PIF.plug", map[string]any{"self": "OpaqueRef:NULL"}}, xerr.HandleInvalid, []string{"PIF", "OpaqueRef:NULL"}},
		{call{"host.reboot", nil}, xerr.HandleInvalid, []string{"host", "OpaqueRef:NULL"}},
		{call{"SR.scan", map[string]any{"sr": srDead}}, "SR_HAS_NO_PBDS", []string{srDead}},
	} {
		_, err := tc.call.resolve(t, snap, h1)
		var xe *xerr.Error
		if !xerr.HasCode(err, tc.code) || !asXerr(err, &xe) || !slices.Equal(xe.Params, tc.params) {
			t.Errorf("%s %v: got %v, want %s %v", tc.call.wire, tc.call.args, err, tc.code, tc.params)
		}
	}
}

func asXerr(err error, out **xerr.Error) bool {
	e, ok := err.(*xerr.Error)
	*out = e
	return ok
}

// TestSingleHost: on a pool of one host every message resolves to this
// host, whatever its arguments, and never fails.
func TestSingleHost(t *testing.T) {
	d := db.New(dm.Model, db.Options{})
	if _, err := d.Update(func(tx *db.Tx) error {
		addHost(t, tx, h1)
		insert(t, tx, dm.Pool.Class, pool, map[string]any{"master": h1})
		insert(t, tx, dm.VM.Class, vmRun, map[string]any{"power_state": "Running", "resident_on": h1})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	snap := d.Snapshot()
	for _, m := range dm.Model.Messages {
		// Every ref argument names the running VM or nothing at all.
		args := make([]any, 0, len(m.Params))
		for i, p := range m.Params {
			if i == 0 && m.TakesSession {
				continue
			}
			var v any
			if p.Type.Kind == schema.KRef {
				v = nowhere
				if p.Type.Class == dm.VM.Class {
					v = vmRun
				}
			}
			args = append(args, v)
		}
		got, err := forwarding.Resolve(m, args, snap, h1)
		if err != nil || !slices.Equal(got.Hosts, []string{h1}) {
			t.Errorf("%s: got %v, %v; want this host", m.Wire, got.Hosts, err)
		}
	}
	// The marks are still there: a single host locks as a pool would.
	got, _ := forwarding.Resolve(dm.Model.Message("VM.clean_shutdown"), []any{vmRun}, snap, h1)
	if gm := markStrings(got); !slices.Equal(gm, []string{"VM " + vmRun + " clean_shutdown"}) {
		t.Errorf("marks %q", gm)
	}
	// An empty database (before the first host row) resolves to self too.
	got, err := forwarding.Resolve(dm.Model.Message("host.reboot"), []any{h2}, db.New(dm.Model, db.Options{}).Snapshot(), h2)
	if err != nil || got.Host() != h2 {
		t.Errorf("empty database: %v, %v", got.Hosts, err)
	}
}

// TestEveryMessageInAPool: with made-up arguments every message resolves
// in a pool to real hosts or to a XenAPI error, never a panic.
func TestEveryMessageInAPool(t *testing.T) {
	snap := twoHostPool(t).Snapshot()
	for _, m := range dm.Model.Messages {
		for _, ref := range []string{"", nowhere, vmRun, srLocal, h2} {
			args := make([]any, 0, len(m.Params))
			for i, p := range m.Params {
				if i == 0 && m.TakesSession {
					continue
				}
				switch p.Type.Kind {
				case schema.KRef:
					args = append(args, ref)
				case schema.KSet:
					args = append(args, []string{ref})
				default:
					args = append(args, nil)
				}
			}
			got, err := forwarding.Resolve(m, args, snap, h1)
			if err != nil {
				if _, ok := err.(*xerr.Error); !ok {
					t.Errorf("%s(%s): %T %v", m.Wire, ref, err, err)
				}
				continue
			}
			if len(got.Hosts) == 0 {
				t.Errorf("%s(%s): no hosts", m.Wire, ref)
			}
			for _, h := range got.Hosts {
				if h != h1 && h != h2 {
					t.Errorf("%s(%s): host %q", m.Wire, ref, h)
				}
			}
		}
	}
}

// TestErrorCodes checks the codes Resolve raises against errors.json.
func TestErrorCodes(t *testing.T) {
	b, err := os.ReadFile("../datamodel/errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var published map[string][]string
	if err := json.Unmarshal(b, &published); err != nil {
		t.Fatal(err)
	}
	for code, n := range map[string]int{"SR_HAS_NO_PBDS": 1, "NO_HOSTS_AVAILABLE": 0, xerr.HandleInvalid: 2} {
		params, ok := published[code]
		if !ok || len(params) != n {
			t.Errorf("%s: published %v (%t), Resolve gives %d parameters", code, params, ok, n)
		}
	}
}

// BenchmarkResolve: go test -bench Resolve ./internal/forwarding/
func BenchmarkResolve(b *testing.B) {
	snap := twoHostPool(b).Snapshot()
	for _, bc := range []struct {
		wire string
		args []any
	}{
		{"VM.get_record", []any{vmRun}},
		{"VM.clean_shutdown", []any{vmRun}},
		{"VM.start", []any{vmHalt, false, false}},
	} {
		m := dm.Model.Message(bc.wire)
		b.Run(bc.wire, func(b *testing.B) {
			for b.Loop() {
				if _, err := forwarding.Resolve(m, bc.args, snap, h1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
