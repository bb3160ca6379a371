package xmldb

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// awkward strings: everything the whitespace protection, the S-expression
// quoting and XML escaping must get right.
var awkward = []string{
	"plain", "with space", "two  spaces", " lead and trail ", "tab\there", "line\nbreak",
	"cr\rlf\r\n", "100%", "%.", "%%", "%_", "%", "%n%t%r", `quote"double`, "it's", `back\slash`,
	`\'`, "'", "<&>", "&amp;", "&#10;", "]]>", "()", "('a' 'b')", "(('k' 'v'))",
	"unicode: héllo ✓ 日本 🚀", "\u00a0nbsp\u2028ls", "",
}

type fixtureRefs struct {
	pool, sr         string
	hosts, vms, vdis []string
	vbds, metrics    []string
	session          string
}

// buildDB makes a small pool: two hosts, an SR with VDIs, VMs resident on
// the hosts with VBDs to the VDIs, VM metrics with float and int-keyed
// maps, and awkward strings in labels, maps and sets.
func buildDB(t testing.TB) (*db.DB, fixtureRefs) {
	d := db.New(dm.Model, db.Options{})
	var r fixtureRefs
	mustUpdate(t, d, func(tx *db.Tx) error {
		ins := func(c *schema.Class, row []any) string {
			ref, err := tx.Insert(c, "", row)
			if err != nil {
				t.Fatalf("insert %s: %v", c.Name, err)
			}
			return ref
		}
		set := func(f *schema.Field, ref string, v any) {
			if err := tx.Set(f, ref, v); err != nil {
				t.Fatalf("set %s.%s: %v", f.Class.Name, f.Name, err)
			}
		}
		for i := 0; i < 2; i++ {
			r.hosts = append(r.hosts, ins(dm.Host.Class, (&dm.HostRecord{
				NameLabel: fmt.Sprintf("host %d", i), Hostname: fmt.Sprintf("h%d", i), Address: fmt.Sprintf("192.0.2.%d", i+10),
				Enabled: true, APIVersionMajor: 2, APIVersionMinor: 21,
				SoftwareVersion: map[string]string{"product_version": "8.4.0", "xapi": "25.0"},
				Capabilities:    []string{"xen-3.0-x86_64", "hvm-3.0-x86_64"},
			}).Row()))
		}
		r.sr = ins(dm.SR.Class, (&dm.SRRecord{NameLabel: "Local storage", Type: "ext", ContentType: "user", PhysicalSize: 1 << 40}).Row())
		r.pool = ins(dm.Pool.Class, (&dm.PoolRecord{NameLabel: "pool <one>", Master: dm.HostRef(r.hosts[0]), DefaultSR: dm.SRRef(r.sr)}).Row())
		for i := 0; i < 4; i++ {
			r.vdis = append(r.vdis, ins(dm.VDI.Class, (&dm.VDIRecord{
				NameLabel: awkward[i], SR: dm.SRRef(r.sr), VirtualSize: int64(i+1) << 30, Type: dm.VDITypeUser,
				SMConfig: map[string]string{"vhd-parent": "", "type": "vhd"}, Managed: true,
			}).Row()))
		}
		for i, name := range awkward {
			other := map[string]string{}
			for j, k := range awkward {
				if k != "" {
					other[k] = awkward[(i+j)%len(awkward)]
				}
			}
			rec := &dm.VMRecord{
				NameLabel: name, NameDescription: strings.Join(awkward[:i], "|"),
				PowerState:      []dm.VMPowerState{dm.VMPowerStateHalted, dm.VMPowerStateRunning}[i%2],
				MemoryStaticMax: 4 << 30, MemoryDynamicMax: 4 << 30, MemoryDynamicMin: 1 << 30, MemoryStaticMin: 1 << 30,
				VCPUsMax: 4, VCPUsAtStartup: 2, UserVersion: int64(-i),
				HVMShadowMultiplier: 1.5, HVMBootParams: map[string]string{"order": "cd"},
				Platform: map[string]string{"acpi": "1", "viridian": "true"}, OtherConfig: other,
				Tags:              slices.Clone(awkward),
				BlockedOperations: map[dm.VMOperations]string{dm.VMOperationsStart: name, dm.VMOperationsClone: "x y"},
				SnapshotTime:      time.Date(2024, 2, 29, 23, 59, 58, 0, time.UTC),
			}
			ref := ins(dm.VM.Class, rec.Row())
			r.vms = append(r.vms, ref)
			if i%2 == 1 {
				set(dm.VM.ResidentOn, ref, r.hosts[i%len(r.hosts)])
			}
		}
		for i := 0; i < 6; i++ {
			r.vbds = append(r.vbds, ins(dm.VBD.Class, (&dm.VBDRecord{
				VM: dm.VMRef(r.vms[i%3]), VDI: dm.VDIRef(r.vdis[i%len(r.vdis)]), Userdevice: fmt.Sprint(i),
				Bootable: i == 0, Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk,
				OtherConfig: map[string]string{"owner": "", "note": awkward[i+3]},
			}).Row()))
		}
		m := ins(dm.VMMetrics.Class, (&dm.VMMetricsRecord{
			MemoryActual: 1 << 30, VCPUsNumber: 2,
			VCPUsUtilisation: map[int64]float64{0: 0.25, 1: 1.5e-7, 2: 123456.789},
			VCPUsCPU:         map[int64]int64{0: 3, 1: -1},
			VCPUsFlags:       map[int64][]string{0: {"online", "running"}, 1: {}},
			State:            []string{"a b", "%"},
			StartTime:        time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		}).Row())
		r.metrics = append(r.metrics, m)
		set(dm.VM.Metrics, r.vms[0], m)
		// A non-persistent table: rows that must not be written.
		r.session = ins(dm.Session.Class, (&dm.SessionRecord{ThisHost: dm.HostRef(r.hosts[0]), Pool: true}).Row())
		return nil
	})
	return d, r
}

func TestRoundTrip(t *testing.T) {
	d, refs := buildDB(t)
	snap := d.Snapshot()
	out := encode(t, dm.Model, snap)

	if n := bytes.Count(out, []byte("\n")); n != 1 || !bytes.HasPrefix(out, []byte(`<?xml version="1.0" encoding="UTF-8"?>`+"\n<database><manifest>")) {
		t.Fatalf("layout: %d newlines, starts %q", n, out[:min(len(out), 80)])
	}
	// encoding/xml agrees that it is well-formed.
	xd := xml.NewDecoder(bytes.NewReader(out))
	for {
		if _, err := xd.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
	}
	if bytes.Contains(out, []byte(refs.session)) {
		t.Error("a session row was written")
	}
	if !bytes.Contains(out, []byte(`<table name="session"/>`)) {
		t.Error("the session table is not written as an empty element")
	}

	dump := decode(t, out)
	if dump.SchemaMajor != dm.SchemaMajor || dump.SchemaMinor != dm.SchemaMinor || dump.Generation != snap.Generation() {
		t.Fatalf("manifest %d.%d gen %d", dump.SchemaMajor, dump.SchemaMinor, dump.Generation)
	}
	if _, ok := dump.Tables[dm.Session.Class]; ok {
		t.Error("dump has a session table")
	}
	rows := 0
	for _, c := range dm.Model.Classes {
		if !c.InDB || !c.Persist {
			continue
		}
		got := byRef(dump.Tables[c])
		if len(got) != snap.Count(c) {
			t.Fatalf("%s: %d rows, want %d", c.Name, len(got), snap.Count(c))
		}
		snap.Ascend(c, func(row *db.Row) bool {
			rows++
			r := got[row.Ref]
			if r == nil {
				t.Fatalf("%s %s missing", c.Name, row.Ref)
			}
			if r.Created != row.Created || r.Modified != row.Modified {
				t.Errorf("%s %s: generations %d/%d, want %d/%d", c.Name, row.Ref, r.Created, r.Modified, row.Created, row.Modified)
			}
			for _, f := range c.Fields {
				v := r.Values[f.Index]
				if f.Derived {
					if v != nil {
						t.Errorf("%s.%s: derived set read back as %v", c.Name, f.Column, v)
					}
					continue
				}
				if want := row.At(f.Index); !schema.Equal(want, v) {
					t.Errorf("%s %s %s: got %#v, want %#v", c.Name, row.Ref, f.Column, v, want)
				}
			}
			return true
		})
	}
	if rows < 40 {
		t.Fatalf("only %d rows compared", rows)
	}

	// The derived sets were written, for xapi's sake.
	vm0 := refs.vms[0]
	want := fmt.Sprintf(` VBDs="('%s'%%.'%s')"`, min(refs.vbds[0], refs.vbds[3]), max(refs.vbds[0], refs.vbds[3]))
	if !bytes.Contains(out, []byte(want)) {
		t.Errorf("VM %s: derived VBDs not written as %s", vm0, want)
	}

	// Loading the dump into a fresh database gives the same rows back,
	// derived sets included.
	d2 := load(t, dm.Model, dump)
	s2 := d2.Snapshot()
	for _, c := range dm.Model.Classes {
		if !c.Persist {
			continue
		}
		snap.Ascend(c, func(row *db.Row) bool {
			r2, ok := s2.Get(c, row.Ref)
			if !ok {
				t.Fatalf("%s %s not loaded", c.Name, row.Ref)
			}
			for _, f := range c.Fields {
				if a, b := snap.Value(row, f), s2.Value(r2, f); !schema.Equal(a, b) {
					t.Errorf("reloaded %s %s %s: %#v, want %#v", c.Name, row.Ref, f.Column, b, a)
				}
			}
			return true
		})
	}

	// And a dump written back out reads the same again.
	var again bytes.Buffer
	if err := EncodeDump(&again, dm.Model, dump); err != nil {
		t.Fatal(err)
	}
	compareDumps(t, dm.Model, dump, decode(t, again.Bytes()))
}

// TestEncodeCutsWhatXMLCannotCarry: strings with control characters or
// broken UTF-8 are cut to their longest valid prefix, as xapi does, and
// the file stays readable.
func TestEncodeCutsWhatXMLCannotCarry(t *testing.T) {
	d := db.New(dm.Model, db.Options{})
	var ref string
	mustUpdate(t, d, func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{
			NameLabel:   "bell\x07rest",
			OtherConfig: map[string]string{"ok": "fine", "bad\x00key": "v", "k": "broken\xffutf8", "nc": "\uFFFEx"},
			Tags:        []string{"good", "es\x1bc"},
		}).Row())
		return
	})
	dump := decode(t, encode(t, dm.Model, d.Snapshot()))
	r := byRef(dump.Tables[dm.VM.Class])[ref]
	if got := r.Values[dm.VM.NameLabel.Index]; got != "bell" {
		t.Errorf("name_label %q", got)
	}
	wantOC := map[string]string{"ok": "fine", "bad": "v", "k": "broken", "nc": ""}
	if got := r.Values[dm.VM.OtherConfig.Index]; !schema.Equal(got, wantOC) {
		t.Errorf("other_config %#v", got)
	}
	if got := r.Values[dm.VM.Tags.Index]; !schema.Equal(got, []string{"good", "es"}) {
		t.Errorf("tags %#v", got)
	}
}

// tinyModel is a three-table model small enough for a byte-exact golden.
func tinyModel(t testing.TB) *schema.Model {
	m, err := schema.Build(5, 1, []schema.ClassSpec{
		{Name: "host", Persist: true, GenEvents: true, InDB: true, Fields: []schema.FieldSpec{
			{Name: "uuid", Type: "string", Qualifier: "RO/runtime"},
			{Name: "name_label", Column: "name__label", Type: "string", Qualifier: "RW", HasDefault: true, Default: `""`},
			{Name: "other_config", Type: "(string -> string) map", Qualifier: "RW", HasDefault: true, Default: "{}"},
			{Name: "resident_VMs", Type: "VM ref set", Qualifier: "RO/runtime"},
		}},
		{Name: "VM", Persist: true, GenEvents: true, InDB: true, Fields: []schema.FieldSpec{
			{Name: "uuid", Type: "string", Qualifier: "RO/runtime"},
			{Name: "name_label", Column: "name__label", Type: "string", Qualifier: "RW", HasDefault: true, Default: `""`},
			{Name: "power_state", Type: "enum vm_power_state", Qualifier: "RO/runtime", HasDefault: true, Default: "Halted"},
			{Name: "resident_on", Type: "host ref", Qualifier: "RO/runtime", HasDefault: true, Default: "Null"},
			{Name: "tags", Type: "string set", Qualifier: "RW", HasDefault: true, Default: "{}"},
			{Name: "memory", Type: "int", Qualifier: "RW", HasDefault: true, Default: "0"},
			{Name: "shadow", Type: "float", Qualifier: "RW", HasDefault: true, Default: "1."},
		}},
		{Name: "session", InDB: true, Fields: []schema.FieldSpec{
			{Name: "uuid", Type: "string", Qualifier: "RO/runtime"},
		}},
		{Name: "event", Fields: []schema.FieldSpec{
			{Name: "id", Type: "int", Qualifier: "RO/runtime"},
		}},
	}, []schema.EnumSpec{{Name: "vm_power_state", Values: []string{"Halted", "Running"}}},
		[]schema.RelationSpec{{Class: "VM", Field: "resident_on", InverseClass: "host", InverseField: "resident_VMs"}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestGoldenLayout(t *testing.T) {
	m := tinyModel(t)
	d := db.New(m, db.Options{})
	host, vm, session := m.Class("host"), m.Class("VM"), m.Class("session")
	mustUpdate(t, d, func(tx *db.Tx) error {
		if _, err := tx.Create(host, "OpaqueRef:h1", map[string]any{"uuid": "u-h1", "name_label": "h<1>",
			"other_config": map[string]string{"k": `v"&`, "z": "tab\there"}}); err != nil {
			return err
		}
		if _, err := tx.Create(vm, "OpaqueRef:v1", map[string]any{"uuid": "u-v1", "name_label": "my vm",
			"resident_on": "OpaqueRef:h1", "tags": []string{"a b", "it's", "100%"}, "memory": int64(42)}); err != nil {
			return err
		}
		_, err := tx.Create(session, "OpaqueRef:s1", map[string]any{"uuid": "u-s1"})
		return err
	})
	got := encode(t, m, d.Snapshot())
	want := `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<database><manifest><pair key="schema_major_vsn" value="5"/><pair key="schema_minor_vsn" value="1"/><pair key="generation_count" value="3"/></manifest>` +
		`<table name="VM"><row ref="OpaqueRef:v1" __ctime="2" __mtime="2" _ref="OpaqueRef:v1" memory="42" name__label="my%.vm" power_state="Halted" resident_on="OpaqueRef:h1" shadow="1." tags="('a%.b'%.'it\'s'%.'100%%')" uuid="u-v1"/></table>` +
		`<table name="host"><row ref="OpaqueRef:h1" __ctime="1" __mtime="2" _ref="OpaqueRef:h1" name__label="h&lt;1&gt;" other_config="(('k'%.'v&quot;&amp;')%.('z'%.'tab%there'))" resident_VMs="('OpaqueRef:v1')" uuid="u-h1"/></table>` +
		`<table name="session"/></database>`
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}

	// The tiny file reads back under its own model.
	dump, err := Decode(bytes.NewReader(got), m)
	if err != nil {
		t.Fatal(err)
	}
	r := dump.Tables[vm][0]
	if r.Values[vm.Field("name_label").Index] != "my vm" || !schema.Equal(r.Values[vm.Field("tags").Index], []string{"a b", "it's", "100%"}) ||
		r.Values[vm.Field("shadow").Index] != 1.0 {
		t.Fatalf("read back %#v", r.Values)
	}
	var again bytes.Buffer
	if err := EncodeDump(&again, m, dump); err != nil {
		t.Fatal(err)
	}
	// EncodeDump leaves out the derived set it never read; otherwise the
	// bytes are the same.
	if w := strings.Replace(want, ` resident_VMs="('OpaqueRef:v1')"`, "", 1); again.String() != w {
		t.Fatalf("EncodeDump\n%s\nwant\n%s", again.String(), w)
	}
}

func TestEncodeEmptyDatabase(t *testing.T) {
	out := encode(t, dm.Model, db.New(dm.Model, db.Options{}).Snapshot())
	dump := decode(t, out)
	if dump.Generation != 0 {
		t.Errorf("generation %d", dump.Generation)
	}
	n := 0
	for _, c := range dm.Model.Classes {
		if c.InDB {
			n++
			if !bytes.Contains(out, []byte(`<table name="`+c.Name+`"/>`)) {
				t.Errorf("table %s not written", c.Name)
			}
		}
	}
	if got := bytes.Count(out, []byte("<table ")); got != n {
		t.Errorf("%d tables, want %d", got, n)
	}
	// Sorted by name, in byte order.
	names := []string{}
	for _, part := range strings.Split(string(out), `<table name="`)[1:] {
		names = append(names, part[:strings.IndexByte(part, '"')])
	}
	if !slices.IsSorted(names) {
		t.Errorf("tables not sorted: %v", names)
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.after -= len(p); w.after < 0 {
		return 0, io.ErrClosedPipe
	}
	return len(p), nil
}

func TestEncodeWriteError(t *testing.T) {
	d, _ := buildDB(t)
	if err := Encode(&failWriter{after: 1000}, dm.Model, d.Snapshot()); err == nil {
		t.Fatal("no error from a failing writer")
	}
}
