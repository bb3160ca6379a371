package pool

import (
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/pool/replica"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

func bootedDB(t *testing.T) (*db.DB, string) {
	t.Helper()
	d := db.New(dm.Model, db.Options{})
	ref, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d, ref
}

func code(err error) string {
	if err == nil {
		return ""
	}
	return xerr.From(err).Code
}

// A host may join only as xapi allows: no running VMs, no shared SRs, no
// other hosts of its own.
func TestJoinable(t *testing.T) {
	d, self := bootedDB(t)
	if err := joinable(d.Snapshot(), self); err != nil {
		t.Fatalf("a fresh host: %v", err)
	}
	var vm string
	if _, err := d.Update(func(tx *db.Tx) (err error) {
		vm, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "running", PowerState: dm.VMPowerStateRunning}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := code(joinable(d.Snapshot(), self)); got != xerr.JoiningHostCannotHaveRunningVMs {
		t.Fatalf("with a running VM: %q", got)
	}
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, vm) }); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.SR.Class, "", (&dm.SRRecord{NameLabel: "nfs", Shared: true}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := code(joinable(d.Snapshot(), self)); got != xerr.JoiningHostCannotContainSharedSRs {
		t.Fatalf("with a shared SR: %q", got)
	}
}

// The rows a joiner brings are its own: its host and what hangs off it,
// not the pool-wide ones (pool, users, templates).
func TestOwnRows(t *testing.T) {
	d, self := bootedDB(t)
	classes := map[string]int{}
	for _, r := range OwnRows(d.Snapshot(), self) {
		classes[r.Class.Name]++
		if !joinClasses[r.Class] {
			t.Errorf("a %s row would be refused by the coordinator", r.Class.Name)
		}
	}
	for _, want := range []*schema.Class{dm.Host.Class, dm.HostMetrics.Class} {
		if classes[want.Name] != 1 {
			t.Errorf("%d %s rows, want 1 (%v)", classes[want.Name], want.Name, classes)
		}
	}
	for _, never := range []*schema.Class{dm.Pool.Class, dm.User.Class} {
		if classes[never.Name] != 0 {
			t.Errorf("%s rows sent", never.Name)
		}
	}
}

func TestMasterAddress(t *testing.T) {
	p := &Pool{cfg: Config{Port: "8080"}}
	for in, want := range map[string]string{"127.0.0.2": "127.0.0.2:8080", "127.0.0.2:9000": "127.0.0.2:9000", "[::1]:80": "[::1]:80"} {
		if got, err := p.masterAddress(in); err != nil || got != want {
			t.Errorf("masterAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := p.masterAddress(""); code(err) != xerr.InvalidValue {
		t.Errorf("an empty master address: %v", err)
	}
}

// What goes with a host: its own storage and VMs and their devices, not
// a shared SR nor what sits on other hosts; a joiner brings its control
// domain and storage but no PIFs or other VMs.
func TestHostRecords(t *testing.T) {
	d, self := bootedDB(t)
	ids := map[string]string{}
	_, err := d.Update(func(tx *db.Tx) error {
		ins := func(name string, c *schema.Class, row []any) string {
			ref, err := tx.Insert(c, "", row)
			if err != nil {
				t.Fatal(err)
			}
			ids[name] = ref
			return ref
		}
		local := ins("local", dm.SR.Class, (&dm.SRRecord{NameLabel: "local"}).Row())
		shared := ins("shared", dm.SR.Class, (&dm.SRRecord{NameLabel: "nfs", Shared: true}).Row())
		ins("pbd", dm.PBD.Class, (&dm.PBDRecord{Host: dm.HostRef(self), SR: dm.SRRef(local)}).Row())
		ins("sharedpbd", dm.PBD.Class, (&dm.PBDRecord{Host: dm.HostRef(self), SR: dm.SRRef(shared)}).Row())
		disk := ins("vdi", dm.VDI.Class, (&dm.VDIRecord{SR: dm.SRRef(local)}).Row())
		ins("sharedvdi", dm.VDI.Class, (&dm.VDIRecord{SR: dm.SRRef(shared)}).Row())
		vm := ins("vm", dm.VM.Class, (&dm.VMRecord{NameLabel: "guest", ResidentOn: dm.HostRef(self)}).Row())
		ins("vbd", dm.VBD.Class, (&dm.VBDRecord{VM: dm.VMRef(vm), VDI: dm.VDIRef(disk), Userdevice: "0"}).Row())
		ins("elsewhere", dm.VM.Class, (&dm.VMRecord{NameLabel: "not here"}).Row())
		net := ins("net", dm.Network.Class, (&dm.NetworkRecord{NameLabel: "n"}).Row())
		ins("pif", dm.PIF.Class, (&dm.PIFRecord{Host: dm.HostRef(self), Network: dm.NetworkRef(net)}).Row())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	has := func(rows []*db.Row) map[string]bool {
		in := map[string]bool{}
		for _, r := range rows {
			for name, ref := range ids {
				if r.Ref == ref {
					in[name] = true
				}
			}
		}
		return in
	}
	host, _ := d.Snapshot().Get(dm.Host.Class, self)
	leaving := has(hostRecords(d.Snapshot(), host, true))
	for _, name := range []string{"local", "pbd", "sharedpbd", "vdi", "vm", "vbd", "pif"} {
		if !leaving[name] {
			t.Errorf("a leaving host's records lack %s", name)
		}
	}
	for _, name := range []string{"shared", "sharedvdi", "elsewhere", "net"} {
		if leaving[name] {
			t.Errorf("a leaving host's records hold %s", name)
		}
	}
	joining := has(OwnRows(d.Snapshot(), self))
	for _, name := range []string{"vm", "vbd", "shared"} {
		if joining[name] {
			t.Errorf("a joiner would bring %s", name)
		}
	}
	if !joining["vdi"] || !joining["pbd"] || !joining["pif"] || !joining["net"] {
		t.Errorf("a joiner would not bring its storage and its PIFs with their networks: %v", joining)
	}
}

// A joiner's network whose bridge the pool has is dropped and its PIFs
// put on the pool's; another network joins as it is.
func TestMergeNetworks(t *testing.T) {
	pool := db.New(dm.Model, db.Options{})
	var poolNet string
	if _, err := pool.Update(func(tx *db.Tx) (err error) {
		poolNet, err = tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "pool", Bridge: "xenbr0"}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	row := func(c *schema.Class, ref string, values []any) replica.Row {
		return replica.Row{Op: replica.OpPut, Class: c, Ref: ref, Values: values}
	}
	mgmt, other := "OpaqueRef:joiner-mgmt", "OpaqueRef:joiner-other"
	rows := []replica.Row{
		row(dm.PIF.Class, "OpaqueRef:pif0", (&dm.PIFRecord{Device: "eth0", Network: dm.NetworkRef(mgmt)}).Row()),
		row(dm.Network.Class, mgmt, (&dm.NetworkRecord{NameLabel: "joiner's", Bridge: "xenbr0"}).Row()),
		row(dm.PIF.Class, "OpaqueRef:pif1", (&dm.PIFRecord{Device: "eth1", Network: dm.NetworkRef(other)}).Row()),
		row(dm.Network.Class, other, (&dm.NetworkRecord{NameLabel: "only the joiner's", Bridge: "xenbr1"}).Row()),
	}
	out := mergeNetworks(pool.Snapshot(), rows)
	nets := map[string]bool{}
	pifs := map[string]string{}
	for _, r := range out {
		switch r.Class {
		case dm.Network.Class:
			nets[r.Ref] = true
		case dm.PIF.Class:
			pifs[r.Ref], _ = r.Values[dm.PIF.Network.Index].(string)
		}
	}
	if nets[mgmt] || !nets[other] || len(nets) != 1 {
		t.Errorf("networks kept: %v, want only %s", nets, other)
	}
	if pifs["OpaqueRef:pif0"] != poolNet || pifs["OpaqueRef:pif1"] != other {
		t.Errorf("PIFs' networks: %v, want pif0 on the pool's %s", pifs, poolNet)
	}
}

// A joiner's rows are checked as hostile input (issue 29, finding 4): its
// own objects, all new to the pool, or nothing.
func TestCheckJoinRows(t *testing.T) {
	pool, poolHost := bootedDB(t)
	joiner, joinerHost := bootedDB(t)
	own := func() []replica.Row {
		t.Helper()
		rows, err := replica.Decode(dm.Model, replica.EncodeRows(OwnRows(joiner.Snapshot(), joinerHost)))
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	uuid := func(d *db.DB, ref string) string {
		r, _ := d.Snapshot().Get(dm.Host.Class, ref)
		return r.UUID()
	}
	jUUID := uuid(joiner, joinerHost)
	snap := pool.Snapshot()
	if err := checkJoinRows(snap, jUUID, own()); err != nil {
		t.Fatalf("a fresh host's own rows: %v", err)
	}
	poolRow := func(c *schema.Class, ref string) replica.Row {
		r, ok := snap.Get(c, ref)
		if !ok {
			t.Fatalf("no %s %s", c.Name, ref)
		}
		return replica.Row{Op: replica.OpPut, Class: c, Ref: r.Ref, Values: r.Stored()}
	}
	var template string
	snap.Ascend(dm.VM.Class, func(r *db.Row) bool {
		if r.Get(dm.VM.IsATemplate) == true {
			template = r.Ref
			return false
		}
		return true
	})
	cases := map[string]func([]replica.Row) []replica.Row{
		"the coordinator's host row, renamed": func(rows []replica.Row) []replica.Row {
			r := poolRow(dm.Host.Class, poolHost)
			r.Values[dm.Host.NameLabel.Index] = "forged"
			return append(rows, r)
		},
		"another uuid on the host row": func(rows []replica.Row) []replica.Row {
			for _, r := range rows {
				if r.Class == dm.Host.Class {
					r.Values[dm.Host.UUID.Index] = uuid(pool, poolHost)
				}
			}
			return rows
		},
		"a second host row": func(rows []replica.Row) []replica.Row {
			for _, r := range rows {
				if r.Class == dm.Host.Class {
					v := append([]any(nil), r.Values...)
					v[dm.Host.UUID.Index] = "00000000-0000-0000-0000-000000000001"
					return append(rows, replica.Row{Op: replica.OpPut, Class: dm.Host.Class, Ref: "OpaqueRef:second", Values: v})
				}
			}
			return rows
		},
		"a pool template made a control domain": func(rows []replica.Row) []replica.Row {
			r := poolRow(dm.VM.Class, template)
			r.Values[dm.VM.IsControlDomain.Index] = true
			return append(rows, r)
		},
		"a new guest VM on the joiner": func(rows []replica.Row) []replica.Row {
			for _, r := range rows {
				if r.Class == dm.VM.Class {
					v := append([]any(nil), r.Values...)
					v[dm.VM.IsControlDomain.Index] = false
					v[dm.VM.UUID.Index] = "00000000-0000-0000-0000-000000000002"
					return append(rows, replica.Row{Op: replica.OpPut, Class: dm.VM.Class, Ref: "OpaqueRef:guest", Values: v})
				}
			}
			return rows
		},
	}
	for name, change := range cases {
		if err := checkJoinRows(snap, jUUID, change(own())); code(err) != xerr.InvalidValue {
			t.Errorf("%s: %v, want INVALID_VALUE", name, err)
		}
	}
}
