package xmldb

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
)

func readFixture(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/xapi-state.db")
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDecodeXapiFixture reads a small pool written by hand in xapi's
// layout: an older schema, a subset of columns, derived sets present.
func TestDecodeXapiFixture(t *testing.T) {
	dump := decode(t, readFixture(t))
	if dump.SchemaMajor != 5 || dump.SchemaMinor != 786 || dump.Generation != 1234 {
		t.Fatalf("manifest %d.%d gen %d", dump.SchemaMajor, dump.SchemaMinor, dump.Generation)
	}
	const (
		vmRef   = "OpaqueRef:5a1f0c3e-8b2d-4c6e-9f10-2b3c4d5e6f70"
		hostRef = "OpaqueRef:e1f2a3b4-c5d6-4e7f-8091-a2b3c4d5e6f7"
		vbdRef  = "OpaqueRef:b4a2c6e8-0d1f-4e3a-9b5c-7d8e9f0a1b2c"
		vdiRef  = "OpaqueRef:9e7f2b61-5d3c-4a8e-b1f0-6c2d4e8a0b13"
		srRef   = "OpaqueRef:3c1d58e0-7a4b-4e36-8d53-0b2a9f6e1c04"
	)
	for _, c := range []*schema.Class{dm.SR.Class, dm.VBD.Class, dm.VDI.Class, dm.VM.Class, dm.VMMetrics.Class, dm.Host.Class, dm.Pool.Class} {
		if len(dump.Tables[c]) != 1 {
			t.Errorf("%s: %d rows", c.Name, len(dump.Tables[c]))
		}
	}
	if _, ok := dump.Tables[dm.Bond.Class]; !ok {
		t.Error("the empty Bond table has no entry")
	}
	if _, ok := dump.Tables[dm.Session.Class]; ok {
		t.Error("the non-persistent session table has an entry")
	}

	vm := byRef(dump.Tables[dm.VM.Class])[vmRef]
	if vm == nil {
		t.Fatal("VM missing")
	}
	if vm.Created != 30 || vm.Modified != 1200 {
		t.Errorf("VM generations %d/%d", vm.Created, vm.Modified)
	}
	checks := []struct {
		f    *schema.Field
		want any
	}{
		{dm.VM.NameLabel, "my vm"},
		{dm.VM.NameDescription, "A test VM\nsecond line,\ttabbed"},
		{dm.VM.PowerState, "Running"},
		{dm.VM.ResidentOn, hostRef},
		{dm.VM.Affinity, schema.NullRef},
		{dm.VM.MemoryStaticMax, int64(4 << 30)},
		{dm.VM.VCPUsMax, int64(4)},
		{dm.VM.Domid, int64(3)},
		{dm.VM.IsATemplate, false},
		{dm.VM.HVMShadowMultiplier, 1.0},
		{dm.VM.HVMBootPolicy, "BIOS order"},
		{dm.VM.OtherConfig, map[string]string{
			"base_template_name": "Debian Bookworm 12",
			"install-methods":    "cdrom,nfs,http,ftp",
			"note":               `it's "fine" <&> C:\tmp`,
			"quota":              "100%",
		}},
		{dm.VM.HVMBootParams, map[string]string{"firmware": "bios", "order": "cd"}},
		{dm.VM.Platform, map[string]string{"acpi": "1", "apic": "true", "viridian": "true"}},
		{dm.VM.BlockedOperations, map[string]string{"start": "maintenance window (ask ops)"}},
		{dm.VM.AllowedOperations, []string{"clean_shutdown", "hard_shutdown", "snapshot"}},
		{dm.VM.Tags, []string{"prod", "web  tier", "café"}}, // %_ is xapi's legacy two spaces
		{dm.VM.SnapshotTime, schema.Epoch},
		{dm.VM.IsSnapshotFromVMPP, false}, // a Removed field: still a column
		{dm.VM.VBDs, nil},                 // derived: ignored
		{dm.VM.VIFs, nil},
		{dm.VM.Children, nil}, // not in the file
		{dm.VM.NVRAM, nil},    // newer than the file's schema
		{dm.VM.Metrics, "OpaqueRef:7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2910"},
	}
	for _, c := range checks {
		if got := vm.Values[c.f.Index]; !(c.want == nil && got == nil) && !schema.Equal(got, c.want) {
			t.Errorf("VM.%s = %#v, want %#v", c.f.Column, got, c.want)
		}
	}

	host := byRef(dump.Tables[dm.Host.Class])[hostRef]
	if host.Values[dm.Host.NameLabel.Index] != "xs-host 1" || host.Values[dm.Host.Enabled.Index] != true ||
		host.Values[dm.Host.ResidentVMs.Index] != nil ||
		!schema.Equal(host.Values[dm.Host.Capabilities.Index], []string{"xen-3.0-x86_64", "hvm-3.0-x86_64"}) ||
		!schema.Equal(host.Values[dm.Host.LastSoftwareUpdate.Index], time.Date(2024, 1, 15, 10, 20, 30, 0, time.UTC)) {
		t.Errorf("host %#v", host.Values)
	}
	vbd := byRef(dump.Tables[dm.VBD.Class])[vbdRef]
	if vbd.Values[dm.VBD.VM.Index] != vmRef || vbd.Values[dm.VBD.VDI.Index] != vdiRef || vbd.Values[dm.VBD.Mode.Index] != "RW" ||
		!schema.Equal(vbd.Values[dm.VBD.OtherConfig.Index], map[string]string{"owner": ""}) {
		t.Errorf("VBD %#v", vbd.Values)
	}
	vdi := byRef(dump.Tables[dm.VDI.Class])[vdiRef]
	if vdi.Values[dm.VDI.SR.Index] != srRef || vdi.Values[dm.VDI.VirtualSize.Index] != int64(20<<30) || vdi.Values[dm.VDI.VBDs.Index] != nil {
		t.Errorf("VDI %#v", vdi.Values)
	}
	met := dump.Tables[dm.VMMetrics.Class][0]
	if !schema.Equal(met.Values[dm.VMMetrics.VCPUsUtilisation.Index], map[string]float64{"0": 0.25, "1": 0.5}) ||
		!schema.Equal(met.Values[dm.VMMetrics.VCPUsCPU.Index], map[string]int64{"0": 2, "1": 3}) ||
		!schema.Equal(met.Values[dm.VMMetrics.VCPUsFlags.Index], map[string][]string{"0": {"online", "running"}}) {
		t.Errorf("VM_metrics %#v", met.Values)
	}

	// Loaded into a database, the derived sets come back from the child
	// side, and writing it out gives xapi every column.
	d := load(t, dm.Model, dump)
	snap := d.Snapshot()
	row, _ := snap.Get(dm.VM.Class, vmRef)
	if got := snap.Value(row, dm.VM.VBDs); !schema.Equal(got, []string{vbdRef}) {
		t.Errorf("VM.VBDs after load = %v", got)
	}
	h, _ := snap.Get(dm.Host.Class, hostRef)
	if got := snap.Value(h, dm.Host.ResidentVMs); !schema.Equal(got, []string{vmRef}) {
		t.Errorf("host.resident_VMs after load = %v", got)
	}
	out := encode(t, dm.Model, snap)
	for _, want := range []string{
		`VBDs="('` + vbdRef + `')"`,
		`name__label="my%.vm"`,
		`tags="('prod'%.'web%.%.tier'%.'café')"`,
		`NVRAM="()"`,
	} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("re-encoded file lacks %s", want)
		}
	}
}

// doc wraps table content in a manifest of the given schema version.
func doc(minor string, tables string) string {
	return `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<database><manifest><pair key="schema_major_vsn" value="5"/><pair key="schema_minor_vsn" value="` + minor +
		`"/><pair key="generation_count" value="7"/></manifest>` + tables + `</database>`
}

const (
	vmA = `<row ref="OpaqueRef:a" uuid="u-a" name__label="a"/>`
	vmB = `<row ref="OpaqueRef:b" uuid="u-b" name__label="b"/>`
)

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		kind  error
		words []string // must appear in the message
	}{
		{"empty", "", ErrTruncated, []string{"no database"}},
		{"not XML", "this is not XML at all", ErrSyntax, nil},
		{"JSON", `{"database": {}}`, ErrSyntax, nil},
		{"broken tag", `<database><<manifest/></database>`, ErrSyntax, nil},
		{"mismatched end", `<database><manifest></table></database>`, ErrSyntax, nil},
		{"bad UTF-8", doc("909", `<table name="VM"><row ref="OpaqueRef:a" name__label="`+"\xff\xfe"+`"/></table>`), ErrSyntax, nil},
		{"control char", doc("909", `<table name="VM"><row ref="OpaqueRef:a" name__label="&#1;"/></table>`), ErrSyntax, nil},
		{"wrong root", `<db/>`, ErrStructure, []string{"<db>"}},
		{"second root", doc("909", "") + `<database/>`, ErrStructure, nil},
		{"text in table", doc("909", `<table name="VM">hello</table>`), ErrStructure, []string{"VM"}},
		{"doctype", `<!DOCTYPE database [<!ENTITY x "y">]>` + doc("909", ""), ErrStructure, nil},
		{"child of row", doc("909", `<table name="VM"><row ref="OpaqueRef:a"><x/></row></table>`), ErrStructure, []string{"<x>"}},
		{"namespaced element", doc("909", `<t:table xmlns:t="urn:x" name="VM"/>`), ErrStructure, nil},
		{"empty database", `<database/>`, ErrManifest, []string{"no manifest"}},
		{"no manifest", `<database><table name="VM"/></database>`, ErrManifest, []string{"manifest"}},
		{"manifest late", `<database><table name="VM"/><manifest/></database>`, ErrManifest, nil},
		{"manifest incomplete", `<database><manifest><pair key="schema_major_vsn" value="5"/></manifest></database>`, ErrManifest, []string{"schema_minor_vsn", "generation_count"}},
		{"manifest bad number", strings.Replace(doc("909", ""), `value="7"`, `value="seven"`, 1), ErrManifest, []string{"generation_count", "seven"}},
		{"two manifests", strings.Replace(doc("909", ""), "</manifest>", "</manifest><manifest/>", 1), ErrManifest, nil},
		{"newer minor", doc("999", ""), ErrSchemaTooNew, []string{"5.999", "5.909"}},
		{"newer major", strings.Replace(doc("0", ""), `value="5"`, `value="6"`, 1), ErrSchemaTooNew, []string{"6.0"}},
		{"unknown table", doc("909", `<table name="Frobnicator"><row ref="OpaqueRef:a"/></table>`), ErrUnknownTable, []string{"Frobnicator"}},
		{"not a db table", doc("909", `<table name="event"/>`), ErrUnknownTable, []string{"event"}},
		{"table twice", doc("909", `<table name="VM"/><table name="VM"/>`), ErrStructure, []string{"twice"}},
		{"table without name", doc("909", `<table/>`), ErrStructure, nil},
		{"unknown column", doc("909", `<table name="VM"><row ref="OpaqueRef:a" flavour="mint"/></table>`), ErrUnknownColumn, []string{"VM", "OpaqueRef:a", "flavour"}},
		{"API name as column", doc("909", `<table name="VM"><row ref="OpaqueRef:a" name_label="x"/></table>`), ErrUnknownColumn, []string{"name_label"}},
		{"namespaced column", doc("909", `<table name="VM"><row xmlns:x="urn:x" ref="OpaqueRef:a" x:uuid="u"/></table>`), ErrUnknownColumn, nil},
		{"column twice", doc("909", `<table name="VM"><row ref="OpaqueRef:a" uuid="u" uuid="v"/></table>`), ErrSyntax, nil},
		{"no ref", doc("909", `<table name="VM"><row uuid="u-a"/></table>`), ErrMissingRef, []string{"VM"}},
		{"ref not a ref", doc("909", `<table name="VM"><row ref="vm-1"/></table>`), ErrBadValue, []string{"vm-1"}},
		{"_ref differs", doc("909", `<table name="VM"><row ref="OpaqueRef:a" _ref="OpaqueRef:b"/></table>`), ErrBadValue, []string{"_ref"}},
		{"bad int", doc("909", `<table name="VM"><row ref="OpaqueRef:a" memory__static_max="lots"/></table>`), ErrBadValue, []string{"VM", "OpaqueRef:a", "memory__static_max", "lots"}},
		{"bad bool", doc("909", `<table name="VM"><row ref="OpaqueRef:a" is_a_template="yes"/></table>`), ErrBadValue, []string{"is_a_template"}},
		{"bad enum", doc("909", `<table name="VM"><row ref="OpaqueRef:a" power_state="Sleeping"/></table>`), ErrBadValue, []string{"power_state", "Sleeping"}},
		{"bad enum in set", doc("909", `<table name="VM"><row ref="OpaqueRef:a" allowed_operations="('start'%.'fly')"/></table>`), ErrBadValue, []string{"allowed_operations"}},
		{"bad ref", doc("909", `<table name="VM"><row ref="OpaqueRef:a" resident_on="host-1"/></table>`), ErrBadValue, []string{"resident_on"}},
		{"bad datetime", doc("909", `<table name="VM"><row ref="OpaqueRef:a" snapshot_time="yesterday"/></table>`), ErrBadValue, []string{"snapshot_time"}},
		{"datetime out of range", doc("909", `<table name="VM"><row ref="OpaqueRef:a" snapshot_time="9999-12-31T23:30:00-01:00"/></table>`), ErrBadValue, []string{"snapshot_time"}},
		{"bad float", doc("909", `<table name="VM"><row ref="OpaqueRef:a" HVM__shadow_multiplier="1,5"/></table>`), ErrBadValue, []string{"HVM__shadow_multiplier"}},
		{"bad map", doc("909", `<table name="VM"><row ref="OpaqueRef:a" other_config="(('k'%.'v')"/></table>`), ErrBadValue, []string{"other_config"}},
		{"map not pairs", doc("909", `<table name="VM"><row ref="OpaqueRef:a" other_config="('k'%.'v')"/></table>`), ErrBadValue, []string{"other_config"}},
		{"bad int map key", doc("909", `<table name="VM_metrics"><row ref="OpaqueRef:a" VCPUs__CPU="(('x'%.'1'))"/></table>`), ErrBadValue, []string{"VCPUs__CPU"}},
		{"bad ctime", doc("909", `<table name="VM"><row ref="OpaqueRef:a" __ctime="-3"/></table>`), ErrBadValue, []string{"__ctime"}},
		{"duplicate ref", doc("909", `<table name="VM">`+vmA+`</table><table name="host"><row ref="OpaqueRef:a"/></table>`), ErrDuplicateRef, []string{"host", "OpaqueRef:a"}},
		{"duplicate uuid", doc("909", `<table name="VM">`+vmA+strings.Replace(vmB, "u-b", "u-a", 1)+`</table>`), ErrDuplicateUUID, []string{"VM", "OpaqueRef:b", "u-a", "already used by row OpaqueRef:a"}},
		{"duplicate uuid across tables", doc("909", `<table name="VM">`+vmA+`</table><table name="host"><row ref="OpaqueRef:h" uuid="u-a"/></table>`), ErrDuplicateUUID, []string{"host", "u-a"}},
		{"truncated", doc("909", `<table name="VM">`+vmA)[:120], ErrTruncated, nil},
		{"truncated after row", strings.TrimSuffix(doc("909", `<table name="VM">`+vmA+`</table>`), "</database>"), ErrTruncated, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(c.in), dm.Model)
			if err == nil {
				t.Fatal("accepted")
			}
			var xe *Error
			if !errors.As(err, &xe) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			if !errors.Is(err, c.kind) {
				t.Fatalf("error %q is not %q", err, c.kind)
			}
			for _, w := range c.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if xe.Line == 0 && c.in != "" {
				t.Errorf("error %q has no position", err)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		check func(t *testing.T, d *Dump)
	}{
		{"older schema, missing columns", doc("100", `<table name="VM">`+vmA+`</table>`), func(t *testing.T, d *Dump) {
			r := d.Tables[dm.VM.Class][0]
			if d.SchemaMinor != 100 || r.Values[dm.VM.NameLabel.Index] != "a" || r.Values[dm.VM.PowerState.Index] != nil || r.Created != 0 {
				t.Errorf("%+v", r)
			}
		}},
		{"older major", strings.Replace(doc("999", ""), `value="5"`, `value="4"`, 1), nil},
		{"no declaration, indented", "<database>\n  <manifest>\n    <pair key=\"schema_major_vsn\" value=\"5\"/><pair key=\"schema_minor_vsn\" value=\"909\"/>\n" +
			"    <pair key=\"generation_count\" value=\"-1\"/><pair key=\"future_key\" value=\"x\"/>\n  </manifest>\n  <!-- a comment -->\n" +
			"  <table name=\"VM\">\n    <row ref=\"OpaqueRef:a\"></row>\n  </table>\n</database>\n", func(t *testing.T, d *Dump) {
			if d.Generation != 0 || len(d.Tables[dm.VM.Class]) != 1 {
				t.Errorf("%+v", d)
			}
		}},
		{"rows of non-persistent tables skipped", doc("909", `<table name="session"><row ref="whatever" bogus="1"/></table><table name="task"/>`), func(t *testing.T, d *Dump) {
			if len(d.Tables) != 0 {
				t.Errorf("%+v", d.Tables)
			}
		}},
		{"derived column ignored unparsed", doc("909", `<table name="VM"><row ref="OpaqueRef:a" VBDs="not even a list"/></table>`), func(t *testing.T, d *Dump) {
			if d.Tables[dm.VM.Class][0].Values[dm.VM.VBDs.Index] != nil {
				t.Error("derived value kept")
			}
		}},
		{"removed field with a bad value dropped", doc("909", `<table name="VM"><row ref="OpaqueRef:a" is_snapshot_from_vmpp="maybe"/></table>`), func(t *testing.T, d *Dump) {
			if d.Tables[dm.VM.Class][0].Values[dm.VM.IsSnapshotFromVMPP.Index] != nil {
				t.Error("bad removed value kept")
			}
		}},
		{"removed field kept when valid", doc("909", `<table name="VM"><row ref="OpaqueRef:a" is_snapshot_from_vmpp="true"/></table>`), func(t *testing.T, d *Dump) {
			if d.Tables[dm.VM.Class][0].Values[dm.VM.IsSnapshotFromVMPP.Index] != true {
				t.Error("removed value lost")
			}
		}},
		{"empty ref reads as null, empty uuids not unique", doc("909", `<table name="VM"><row ref="OpaqueRef:a" uuid="" resident_on=""/><row ref="OpaqueRef:b" uuid=""/></table>`), func(t *testing.T, d *Dump) {
			if d.Tables[dm.VM.Class][0].Values[dm.VM.ResidentOn.Index] != schema.NullRef {
				t.Error("empty ref")
			}
		}},
		{"xapi's lenient escapes", doc("909", `<table name="VM"><row ref="OpaqueRef:a" name__label="%x%_%" name__description="a%%.b"/></table>`), func(t *testing.T, d *Dump) {
			r := d.Tables[dm.VM.Class][0]
			if r.Values[dm.VM.NameLabel.Index] != "%x  %" || r.Values[dm.VM.NameDescription.Index] != "a%.b" {
				t.Errorf("%q %q", r.Values[dm.VM.NameLabel.Index], r.Values[dm.VM.NameDescription.Index])
			}
		}},
		{"ref given twice, same", doc("909", `<table name="VM"><row ref="OpaqueRef:a" _ref="OpaqueRef:a" __mtime="9"/></table>`), func(t *testing.T, d *Dump) {
			if d.Tables[dm.VM.Class][0].Modified != 9 {
				t.Error("mtime")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decode(strings.NewReader(c.in), dm.Model)
			if err != nil {
				t.Fatal(err)
			}
			if c.check != nil {
				c.check(t, d)
			}
		})
	}
}

// TestDecodeTruncations cuts the fixture next to every piece of markup
// (and at every 13th byte between): each prefix must be refused, as
// truncated or not well-formed, never accepted and never a panic.
func TestDecodeTruncations(t *testing.T) {
	data := readFixture(t)
	for n := 0; n < len(data); n++ {
		if n%13 != 0 && !strings.ContainsAny(string(data[max(n-1, 0):n+1]), `<>"=/%&;`) {
			continue
		}
		_, err := Decode(bytes.NewReader(data[:n]), dm.Model)
		if err == nil {
			t.Fatalf("prefix of %d bytes accepted", n)
		}
		if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrSyntax) {
			t.Fatalf("prefix of %d bytes: %v", n, err)
		}
	}
}

type errReader struct{ data []byte }

var errDisk = errors.New("disk on fire")

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, errDisk
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestDecodeReadError(t *testing.T) {
	_, err := Decode(&errReader{data: readFixture(t)[:500]}, dm.Model)
	var xe *Error
	if !errors.Is(err, errDisk) || errors.As(err, &xe) {
		t.Fatalf("got %v, want the read error unwrapped from any *Error", err)
	}
}

func TestUnprotect(t *testing.T) {
	for in, want := range map[string]string{
		"":           "",
		"plain":      "plain",
		"%.%t%n%r%%": " \t\n\r%",
		"%_":         "  ",
		"%":          "%",
		"a%":         "a%",
		"%z":         "%z",
		"%%.":        "%.",
		"%%%.":       "% ",
		"50%%%":      "50%%",
	} {
		if got := unprotect(in); got != want {
			t.Errorf("unprotect(%q) = %q, want %q", in, got, want)
		}
	}
	for _, s := range awkward {
		b, ok := appendValue(nil, s, true)
		if !ok {
			t.Fatalf("appendValue(%q) refused", s)
		}
		if bytes.ContainsAny(b, " \t\n\r<>\"") {
			t.Errorf("appendValue(%q) = %q leaves raw characters", s, b)
		}
	}
	for _, s := range []string{"\x00", "a\x1fb", "\xff", "\xed\xa0\x80", "\uffff"} {
		if _, ok := appendValue(nil, s, true); ok {
			t.Errorf("appendValue(%q) accepted", s)
		}
	}
}
