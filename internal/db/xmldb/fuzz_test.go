package xmldb

import (
	"bytes"
	"errors"
	"os"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// FuzzDecode: Decode never panics and refuses only with an *Error; what it
// accepts writes back out (EncodeDump) to a file that reads to the same
// values and writes to the same bytes again; and, where the rows load into
// a database, the database writes (Encode) a file that reads back too.
func FuzzDecode(f *testing.F) {
	if data, err := os.ReadFile("testdata/xapi-state.db"); err == nil {
		f.Add(data)
	}
	small := db.New(dm.Model, db.Options{})
	mustUpdate(f, small, func(tx *db.Tx) error {
		vm, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "a b%c", Tags: []string{"x'y", `\`},
			OtherConfig: map[string]string{"k": "<v>\n"}}).Row())
		if err != nil {
			return err
		}
		_, err = tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(vm), Mode: dm.VBDModeRO}).Row())
		return err
	})
	var b bytes.Buffer
	if err := Encode(&b, dm.Model, small.Snapshot()); err != nil {
		f.Fatal(err)
	}
	f.Add(b.Bytes())
	for _, s := range []string{
		doc("909", `<table name="VM">`+vmA+vmB+`</table>`),
		doc("909", `<table name="VM_metrics"><row ref="OpaqueRef:m" VCPUs__utilisation="(('0'%.'0.1234567890123456'))" VCPUs__flags="(('1'%.('a')))" start_time="2024-01-02T03:04:05.5+01:00"/></table>`),
		doc("909", `<table name="host"><row ref="OpaqueRef:h" name__label="%_%x%" virtual_hardware_platform_versions="('0'%.'1')" other_config="(('k'%.'1')%.('k'%.'2'))"/></table>`),
		doc("100", `<table name="VM"><row ref="OpaqueRef:a" power_state="Running" is_a_template="TRUE" resident_on=""/></table><table name="session"><row ref="x"/></table>`),
		`<database><manifest/></database>`,
		"<a",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d1, err := Decode(bytes.NewReader(data), dm.Model)
		if err != nil {
			var xe *Error
			if !errors.As(err, &xe) {
				t.Fatalf("error %v (%T) is not an *Error", err, err)
			}
			return
		}
		var e1, e2 bytes.Buffer
		if err := EncodeDump(&e1, dm.Model, d1); err != nil {
			t.Fatal(err)
		}
		d2, err := Decode(bytes.NewReader(e1.Bytes()), dm.Model)
		if err != nil {
			t.Fatalf("re-encoded dump does not decode: %v\n%s", err, e1.Bytes())
		}
		compareDumps(t, dm.Model, d1, d2)
		if err := EncodeDump(&e2, dm.Model, d2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(e1.Bytes(), e2.Bytes()) {
			t.Fatalf("second encoding differs:\n%s\n%s", e1.Bytes(), e2.Bytes())
		}

		// Through a database, where the rows can be loaded.
		store, err := tryLoad(dm.Model, d1)
		if err != nil {
			return
		}
		var e3 bytes.Buffer
		if err := Encode(&e3, dm.Model, store.Snapshot()); err != nil {
			t.Fatal(err)
		}
		d3, err := Decode(bytes.NewReader(e3.Bytes()), dm.Model)
		if err != nil {
			t.Fatalf("database dump does not decode: %v\n%s", err, e3.Bytes())
		}
		for c, rows := range d1.Tables {
			got := byRef(d3.Tables[c])
			for _, r := range rows {
				r3 := got[r.Ref]
				if r3 == nil {
					t.Fatalf("%s %s lost through the database", c.Name, r.Ref)
				}
				for _, f := range c.Fields {
					v := r.Values[f.Index]
					if v == nil || f.ManyToMany || f.Derived || f == c.UUID && v == "" {
						continue
					}
					if !sameStored(f.Type, v, r3.Values[f.Index]) {
						t.Fatalf("%s %s %s: %#v through the database became %#v", c.Name, r.Ref, f.Column, v, r3.Values[f.Index])
					}
				}
			}
		}
	})
}
