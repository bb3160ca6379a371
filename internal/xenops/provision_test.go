package xenops

import (
	"strings"
	"testing"

	"toolstackd/internal/xerr"
)

// TestParseProvisionXML: the forms xapi's templates, xe and the SDK's
// provision.py write, and xapi's rules for what is not a spec.
func TestParseProvisionXML(t *testing.T) {
	good := []struct {
		in   string
		want []provisionDisk
	}{
		{`<provision><disk device="0" size="10737418240" sr="" bootable="true" type="system"/></provision>`,
			[]provisionDisk{{"0", 10 << 30, "", true, "system"}}},
		// provision.py's toprettyxml: a declaration, indentation, no type.
		{"<?xml version=\"1.0\" ?>\n<provision>\n\t<disk bootable=\"true\" device=\"0\" size=\"1024\" sr=\"0000-0000\"/>\n" +
			"\t<disk bootable=\"false\" device=\"1\" size=\"2048\" sr=\"1111-1111\"/>\n</provision>\n",
			[]provisionDisk{{"0", 1024, "0000-0000", true, "system"}, {"1", 2048, "1111-1111", false, "system"}}},
		// Unknown types are system; bootable is only "true"; OCaml's
		// integer forms; the first of a repeated attribute; comments.
		{`<!-- x --><provision><disk device="2" size="0x10" sr="s" bootable="TRUE" type="user"></disk>` +
			`<disk device="3" size="0o10" sr="s" bootable="true" type="bogus"/></provision>`,
			[]provisionDisk{{"2", 16, "s", false, "user"}, {"3", 8, "s", true, "system"}}},
		{`<provision></provision>`, nil},
		{`<provision><disk device="1" size="5" sr="" bootable="true" type="ephemeral"> </disk></provision>`,
			[]provisionDisk{{"1", 5, "", true, "ephemeral"}}},
	}
	for _, tc := range good {
		got, err := parseProvisionXML(tc.in)
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v", tc.in, got, err)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q disk %d: %+v, want %+v", tc.in, i, got[i], tc.want[i])
			}
		}
	}
	bad := []string{
		``, `not xml`, `<provision>`, `<provision a="b"/>`, `<disks/>`, `<provision/><provision/>`,
		`<provision><disk size="1" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" size="1" bootable="true"/></provision>`,
		`<provision><disk device="0" size="1" sr=""/></provision>`,
		`<provision><disk device="0" size="-1" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" size="0" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" size="1e9" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" size="99999999999999999999" sr="" bootable="true"/></provision>`,
		`<provision><disk device="0" size="1" sr="" bootable="true"><x/></disk></provision>`,
		`<provision><disk device="0" size="1" sr="" bootable="true">text</disk></provision>`,
		`<provision>text</provision>`, `<provision><other/></provision>`,
		`<!DOCTYPE provision [<!ENTITY a "b">]><provision/>`,
		`<p:provision xmlns:p="x"/>`,
		`<provision><disk device="0" size="1" sr="" bootable="true"/>`,
		`<?xml version="1.0" encoding="latin1"?><provision/>`,
		"<provision>" + strings.Repeat(`<disk device="0" size="1" sr="" bootable="true"/>`, maxProvisionDisks+1) + "</provision>",
		"<provision>" + strings.Repeat(" ", maxProvisionXML) + "</provision>",
	}
	for _, in := range bad {
		if _, err := parseProvisionXML(in); !xerr.HasCode(err, xerr.InternalError) {
			t.Errorf("%.80q: %v, want INTERNAL_ERROR", in, err)
		}
	}
}

// FuzzProvisionXML: any text gives disks within the bounds or an
// INTERNAL_ERROR, never a panic.
func FuzzProvisionXML(f *testing.F) {
	for _, s := range []string{
		`<provision><disk device="0" size="10737418240" sr="" bootable="true" type="system"/></provision>`,
		"<?xml version=\"1.0\" ?>\n<provision>\n\t<disk bootable=\"true\" device=\"0\" size=\"1024\" sr=\"x\"/>\n</provision>\n",
		`<provision><disk device="0" size="0x10" sr="s" bootable="1"></disk><!-- c --></provision>`,
		`<provision a="1"/>`, `<provision><disk/></provision>`, ``, `<`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		disks, err := parseProvisionXML(s)
		if err != nil {
			if !xerr.HasCode(err, xerr.InternalError) {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if len(disks) > maxProvisionDisks {
			t.Fatalf("%d disks", len(disks))
		}
		for _, d := range disks {
			if d.Size <= 0 || !provisionTypes[d.Type] {
				t.Fatalf("%+v", d)
			}
		}
	})
}
