package persist

import (
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// FuzzDecodeRow reads arbitrary bytes as a row of the file (a damaged or
// foreign file): never a panic, and what is accepted is only persistent
// columns, each a value of its column's type that encodes back to what
// it was read from.
func FuzzDecodeRow(f *testing.F) {
	d := db.New(dm.Model, db.Options{})
	var ref string
	if _, err := d.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "seed", NameDescription: "a\x00b",
			VCPUsMax: 4, OtherConfig: map[string]string{"k": "v"}}).Row())
		return err
	}); err != nil {
		f.Fatal(err)
	}
	row, _ := d.Snapshot().Get(dm.VM.Class, ref)
	_, _, values, err := decodeRow(dm.VM.Class, encodeRow(row))
	if err != nil {
		f.Fatal(err)
	}
	for _, fd := range dm.VM.Class.Fields {
		if fd.Persist && !fd.Derived && values[fd.Index] != nil && !schema.Equal(values[fd.Index], row.At(fd.Index)) {
			f.Fatalf("column %s reads back as %v, was %v", fd.Column, values[fd.Index], row.At(fd.Index))
		}
	}
	f.Add(uint8(0), encodeRow(row))
	f.Add(uint8(1), []byte{1, 2, 4, 'u', 'u', 'i', 'd', 1, 'x'})
	f.Add(uint8(2), []byte{0x80})
	classes := []*schema.Class{dm.VM.Class, dm.Host.Class, dm.VDI.Class, dm.Pool.Class}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		c := classes[int(which)%len(classes)]
		_, _, values, err := decodeRow(c, b)
		if err != nil {
			return
		}
		if len(values) != len(c.Fields) {
			t.Fatalf("%d values for %d fields", len(values), len(c.Fields))
		}
		for i, v := range values {
			if v == nil {
				continue
			}
			fd := c.Fields[i]
			if !fd.Persist || fd.Derived {
				t.Fatalf("column %s is not persistent but was read", fd.Column)
			}
			again, err := schema.ParseExact(fd.Type, schema.FormatExact(fd.Type, v))
			if err != nil || !schema.Equal(again, v) {
				t.Fatalf("column %s: %v does not read back (%v)", fd.Column, v, err)
			}
		}
	})
}
