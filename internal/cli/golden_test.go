package cli

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// Fixed refs and uuids, so that output is the same on every run.
const (
	gHost     = "OpaqueRef:00000000-0000-0000-0000-000000000001"
	gHostUUID = "11111111-1111-1111-1111-111111111111"
	gVM       = "OpaqueRef:00000000-0000-0000-0000-000000000002"
	gVMUUID   = "22222222-2222-2222-2222-222222222222"
	gVM2      = "OpaqueRef:00000000-0000-0000-0000-000000000003"
	gVM2UUID  = "33333333-3333-3333-3333-333333333333"
	gTmplUUID = "44444444-4444-4444-4444-444444444444"
	gNetUUID  = "55555555-5555-5555-5555-555555555555"
	gNet      = "OpaqueRef:00000000-0000-0000-0000-000000000005"
	gSR       = "OpaqueRef:00000000-0000-0000-0000-000000000006"
	gSRUUID   = "66666666-6666-6666-6666-666666666666"
	gVDI      = "OpaqueRef:00000000-0000-0000-0000-000000000007"
	gVDIUUID  = "77777777-7777-7777-7777-777777777777"
	gVBDUUID  = "88888888-8888-8888-8888-888888888888"
	gCDUUID   = "99999999-9999-9999-9999-999999999999"
	gPoolUUID = "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
)

// goldenFixture is a small pool with fixed ids: a host, two VMs (one
// with a comma and a backslash in its name), a template, a network, an
// SR with a disk attached to a VM, and an empty CD drive.
func goldenFixture(t testing.TB, d *db.DB, hash string) string {
	_, err := d.Update(func(tx *db.Tx) error {
		ins := func(c *schema.Class, ref string, row []any) {
			if _, err := tx.Insert(c, ref, row); err != nil {
				t.Fatalf("insert %s: %v", c.Name, err)
			}
		}
		ins(dm.User.Class, "", (&dm.UserRecord{ShortName: "root", Fullname: "root", PasswordHash: hash}).Row())
		ins(dm.Host.Class, gHost, (&dm.HostRecord{UUID: gHostUUID, NameLabel: "host1", NameDescription: "the host",
			Hostname: "host1.example", Address: "192.0.2.1", Enabled: true}).Row())
		ins(dm.Pool.Class, "OpaqueRef:00000000-0000-0000-0000-00000000000a", (&dm.PoolRecord{UUID: gPoolUUID, NameLabel: "pool1", Master: dm.HostRef(gHost),
			DefaultSR: dm.SRRef(gSR)}).Row())
		ins(dm.SR.Class, gSR, (&dm.SRRecord{UUID: gSRUUID, NameLabel: "Local storage", Type: "dir", ContentType: "user",
			PhysicalSize: 1 << 40}).Row())
		ins(dm.VDI.Class, gVDI, (&dm.VDIRecord{UUID: gVDIUUID, NameLabel: "disk0", SR: dm.SRRef(gSR), VirtualSize: 10 << 30,
			Type: dm.VDITypeUser, Sharable: false}).Row())
		ins(dm.VM.Class, gVM, (&dm.VMRecord{UUID: gVMUUID, NameLabel: "web", NameDescription: "a web server",
			PowerState: dm.VMPowerStateHalted, MemoryStaticMax: 1 << 30, VCPUsMax: 2, VCPUsAtStartup: 2,
			OtherConfig: map[string]string{"owner": "alice", "tier": "front"}, Tags: []string{"prod", "web"},
			DomainType: dm.DomainTypeHVM}).Row())
		ins(dm.VM.Class, gVM2, (&dm.VMRecord{UUID: gVM2UUID, NameLabel: `odd, name\here`, PowerState: dm.VMPowerStateRunning,
			DomainType: dm.DomainTypePV}).Row())
		ins(dm.VM.Class, "OpaqueRef:00000000-0000-0000-0000-000000000004", (&dm.VMRecord{UUID: gTmplUUID, NameLabel: "Base template", NameDescription: "for tests",
			IsATemplate: true, DomainType: dm.DomainTypeHVM}).Row())
		ins(dm.Network.Class, gNet, (&dm.NetworkRecord{UUID: gNetUUID, NameLabel: "net0", Bridge: "xenbr0", MTU: 1500,
			Managed: true, OtherConfig: map[string]string{"k": "v"}}).Row())
		ins(dm.VBD.Class, "OpaqueRef:00000000-0000-0000-0000-000000000008", (&dm.VBDRecord{UUID: gVBDUUID, VM: dm.VMRef(gVM), VDI: dm.VDIRef(gVDI), Userdevice: "0",
			Device: "xvda", Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk, Bootable: true}).Row())
		ins(dm.VBD.Class, "OpaqueRef:00000000-0000-0000-0000-000000000009", (&dm.VBDRecord{UUID: gCDUUID, VM: dm.VMRef(gVM), Userdevice: "3", Mode: dm.VBDModeRO,
			Type: dm.VBDTypeCD, Empty: true}).Row())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return gHost
}

// TestGolden checks record and --minimal output, and error output,
// against the files in testdata/golden (go test -update rewrites them).
func TestGolden(t *testing.T) {
	h := newHarness(t, goldenFixture)
	cases := []struct {
		name string
		args []string
	}{
		{"vm-list", []string{"vm-list"}},
		{"vm-list-minimal", []string{"vm-list", "--minimal"}},
		{"vm-list-names-minimal", []string{"vm-list", "params=name-label", "--minimal"}},
		{"vm-list-filter", []string{"vm-list", "power-state=running"}},
		{"vm-list-filter-map", []string{"vm-list", "other-config:owner=alice", "params=uuid,name-label,other-config"}},
		{"vm-list-filter-set", []string{"vm-list", "tags:contains=prod", "--minimal"}},
		{"vm-list-all-templates", []string{"template-list"}},
		{"vm-param-list", []string{"vm-param-list", "uuid=" + gVMUUID}},
		{"vm-param-get", []string{"vm-param-get", "uuid=" + gVMUUID, "param-name=other-config"}},
		{"vm-param-get-key", []string{"vm-param-get", "uuid=" + gVMUUID, "param-name=other-config", "param-key=tier"}},
		{"vm-param-get-missing-key", []string{"vm-param-get", "uuid=" + gVMUUID, "param-name=other-config", "param-key=nope"}},
		{"vm-param-get-unknown-field", []string{"vm-param-get", "uuid=" + gVMUUID, "param-name=nope"}},
		{"vbd-list", []string{"vbd-list", "params=all"}},
		{"network-list", []string{"network-list"}},
		{"pool-list", []string{"pool-list"}},
		{"sr-list-minimal", []string{"sr-list", "--minimal"}},
		{"host-param-get", []string{"host-param-get", "uuid=" + gHostUUID, "param-name=name-label"}},
		{"unknown-command", []string{"vm-frobnicate"}},
		{"missing-param", []string{"vm-param-get", "uuid=" + gVMUUID}},
		{"unknown-param", []string{"network-destroy", "uuid=x", "colour=blue"}},
		{"bad-uuid", []string{"vm-param-list", "uuid=00000000-dead-beef-0000-000000000000"}},
		{"bad-int", []string{"vm-param-set", "uuid=" + gVMUUID, "VCPUs-max=many"}},
		{"read-only", []string{"vm-param-set", "uuid=" + gVMUUID, "power-state=running"}},
		{"not-implemented", []string{"vm-start", "vm=web"}},
		{"no-match", []string{"vm-shutdown", "vm=nothing-called-this"}},
		{"syntax", []string{"vm-list", "oops"}},
		{"help-vm-start", []string{"help", "vm-start"}},
		{"bad-password", []string{"vm-list", "-pw", "wrong"}},
		{"vm-disk-list", []string{"vm-disk-list", "vm=web"}},
		{"vm-cd-list", []string{"vm-cd-list", "vm=web"}},
		{"vm-disk-list-params", []string{"vm-disk-list", "vm=web", "vbd-params=uuid,device", "vdi-params=all"}},
		{"diagnostic-vdi-status", []string{"diagnostic-vdi-status", "uuid=" + gVDIUUID}},
		{"snapshot-revert-not-snapshot", []string{"snapshot-revert", "uuid=" + gVMUUID}},
		{"vm-reset-powerstate-unforced", []string{"vm-reset-powerstate", "vm=web"}},
		{"no-user", []string{"vm-list", "-u", "", "-pw", "x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.xe(c.args...)
			got := fmt.Sprintf("$ xe %s\n%s--- stderr\n%s--- exit %d\n", strings.Join(c.args, " "), r.out, r.err, r.code)
			path := filepath.Join("testdata", "golden", c.name+".txt")
			if *update {
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to make it)", err)
			}
			if got != string(want) {
				t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// TestRecordLayout checks the padding rule by itself.
func TestRecordLayout(t *testing.T) {
	got := formatRecord([]field{{"uuid ( RO)", "u"}, {"name-label ( RW)", "n"}, {"x (SRO)", ""}})
	want := "uuid ( RO)          : u\n    name-label ( RW): n\n             x (SRO): \n"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
	if e := escapeMinimal(`a,b\c`); e != `a\,b\\c` {
		t.Fatalf("escape: %s", e)
	}
}
