package replica

import (
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// benchVM is a VM as a client makes it (the fields XO and the tests
// set), after a start: the row a replicated write of one of its fields
// carries whole.
func benchVM() *dm.VMRecord {
	return &dm.VMRecord{
		UUID: "3f5a1b2c-1111-2222-3333-444455556666", NameLabel: "latency-1", PowerState: "Running",
		AllowedOperations: []dm.VMOperations{"hard_shutdown", "clean_shutdown", "pause", "suspend", "hard_reboot", "clean_reboot"},
		UserVersion:       1, MemoryTarget: 128 << 20, MemoryStaticMax: 128 << 20, MemoryDynamicMax: 128 << 20,
		MemoryDynamicMin: 128 << 20, MemoryStaticMin: 64 << 20, VCPUsMax: 1, VCPUsAtStartup: 1,
		ActionsAfterShutdown: "destroy", ActionsAfterReboot: "restart", ActionsAfterCrash: "destroy",
		HVMBootPolicy: "BIOS order", HVMBootParams: map[string]string{"order": "cd"}, HVMShadowMultiplier: 1,
		Platform:    map[string]string{"acpi": "1", "apic": "true", "pae": "true", "viridian": "true", "nx": "true"},
		OtherConfig: map[string]string{"xo:resource_set": "abc", "base_template_name": "Debian Bookworm 12"},
		Domid:       7, DomainType: "hvm", ResidentOn: "OpaqueRef:5f2e-host", Metrics: "OpaqueRef:9a1b-metrics",
		Tags: []string{"web", "prod"}, NameDescription: "a description",
	}
}

func BenchmarkDecodePut(b *testing.B) {
	d := db.New(dm.Model, db.Options{})
	var ref string
	if _, err := d.Update(func(tx *db.Tx) (err error) {
		if _, err = tx.Insert(dm.Host.Class, "OpaqueRef:5f2e-host", (&dm.HostRecord{NameLabel: "h"}).Row()); err != nil {
			return err
		}
		if _, err = tx.Insert(dm.VMMetrics.Class, "OpaqueRef:9a1b-metrics", (&dm.VMMetricsRecord{}).Row()); err != nil {
			return err
		}
		ref, err = tx.Insert(dm.VM.Class, "", benchVM().Row())
		return err
	}); err != nil {
		b.Fatal(err)
	}
	g := d.Generation()
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, ref, "x") }); err != nil {
		b.Fatal(err)
	}
	entry := encodeSince(b, d, g, Encode)
	b.SetBytes(int64(len(entry)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(dm.Model, entry); err != nil {
			b.Fatal(err)
		}
	}
}
