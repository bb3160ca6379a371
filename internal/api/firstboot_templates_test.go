package api

import (
	"encoding/xml"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// templateDisks returns each template's other_config:disks, by name.
func templateDisks(d *db.DB) map[string]string {
	out := map[string]string{}
	for _, r := range d.Snapshot().All(dm.VM.Class) {
		if r.Get(dm.VM.IsATemplate) == true {
			oc, _ := r.Get(dm.VM.OtherConfig).(map[string]string)
			out[r.String(dm.VM.NameLabel)] = oc["disks"]
		}
	}
	return out
}

// TestBuiltinTemplatesProvision: the built-in templates for a known
// system carry a provisioning spec like xapi's (one bootable system disk
// at device 0, sr left to the client), the generic one none.
func TestBuiltinTemplatesProvision(t *testing.T) {
	d := db.New(dm.Model, db.Options{})
	host, err := FirstBoot(d, ProbeHost(), BootOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := templateDisks(d)
	if len(got) != 4 || got["Other install media"] != "" {
		t.Fatalf("templates %v", got)
	}
	for name, spec := range got {
		if name == "Other install media" {
			continue
		}
		var p struct {
			XMLName xml.Name `xml:"provision"`
			Disks   []struct {
				Device   string `xml:"device,attr"`
				Size     int64  `xml:"size,attr"`
				SR       string `xml:"sr,attr"`
				Bootable string `xml:"bootable,attr"`
				Type     string `xml:"type,attr"`
			} `xml:"disk"`
		}
		if err := xml.Unmarshal([]byte(spec), &p); err != nil || len(p.Disks) != 1 {
			t.Fatalf("%s: %q %v", name, spec, err)
		}
		if disk := p.Disks[0]; disk.Device != "0" || disk.Size < 8<<30 || disk.SR != "" || disk.Bootable != "true" || disk.Type != "system" {
			t.Errorf("%s: %+v", name, disk)
		}
	}

	// A database made before the specs: a restart adds the missing ones
	// and leaves one an administrator changed.
	var debian, ubuntu string
	for _, r := range d.Snapshot().All(dm.VM.Class) {
		switch r.String(dm.VM.NameLabel) {
		case "Debian Bookworm 12":
			debian = r.Ref
		case "Ubuntu Noble Numbat 24.04":
			ubuntu = r.Ref
		}
	}
	custom := `<provision><disk device="0" size="1073741824" sr="" bootable="true" type="system"/></provision>`
	if _, err := d.Update(func(tx *db.Tx) error {
		if err := tx.RemoveFromMap(dm.VM.OtherConfig, debian, "disks"); err != nil {
			return err
		}
		return tx.Set(dm.VM.OtherConfig, ubuntu, map[string]string{"disks": custom})
	}); err != nil {
		t.Fatal(err)
	}
	if err := StartupReset(d, host, ProbeHost()); err != nil {
		t.Fatal(err)
	}
	after := templateDisks(d)
	if after["Debian Bookworm 12"] != got["Debian Bookworm 12"] || after["Ubuntu Noble Numbat 24.04"] != custom ||
		after["Other install media"] != "" {
		t.Fatalf("after restart: %v", after)
	}
	// Again: nothing changes.
	if err := StartupReset(d, host, ProbeHost()); err != nil {
		t.Fatal(err)
	}
	if again := templateDisks(d); again["Debian Bookworm 12"] != after["Debian Bookworm 12"] {
		t.Fatalf("second restart: %v", again)
	}
}
