package pool

import (
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
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
	for _, r := range ownRows(d.Snapshot(), self) {
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
