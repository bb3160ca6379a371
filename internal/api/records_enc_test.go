package api

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/api/wire"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// testRows is the cache the tests' replies use.
var testRows = newRowCache(rowCacheDefault)

// vmsDB is a database after first boot with n VMs copied from the "Other
// install media" template, as tests/load's bigvms mode makes them.
func vmsDB(tb testing.TB, n int) *db.DB {
	tb.Helper()
	d := db.New(dm.Model, db.Options{})
	if _, err := FirstBoot(d, ProbeHost(), BootOptions{}); err != nil {
		tb.Fatal(err)
	}
	var tmpl *db.Row
	for _, r := range d.Snapshot().All(dm.VM.Class) {
		if r.String(dm.VM.NameLabel) == "Other install media" {
			tmpl = r
		}
	}
	if tmpl == nil {
		tb.Fatal("no template")
	}
	fields := map[string]any{}
	for _, f := range dm.VM.Class.Fields {
		if f.Derived || f == dm.VM.Class.UUID {
			continue
		}
		fields[f.Name] = tmpl.At(f.Index)
	}
	fields["is_a_template"] = false
	fields["is_default_template"] = false
	fields["other_config"] = map[string]string{}
	for i := 0; i < n; {
		if _, err := d.Update(func(tx *db.Tx) error {
			for j := 0; j < 500 && i < n; j, i = j+1, i+1 {
				fields["name_label"] = "load-vm-" + strconv.Itoa(i)
				if _, err := tx.Create(dm.VM.Class, "", fields); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			tb.Fatal(err)
		}
	}
	return d
}

func allRecords(d *db.DB, cls *schema.Class) typed {
	snap := d.Snapshot()
	m := dm.Model.Message(cls.Name + ".get_all_records")
	return typed{t: m.Result, v: snap.All(cls), snap: snap, rows: testRows}
}

func BenchmarkVMGetAllRecords(b *testing.B) {
	d := vmsDB(b, 10000)
	defer testRows.setLimit(rowCacheDefault)
	// warm: every row comes from the cache; cold: the cache is emptied
	// before each call, which then fills it; nocache: the cache is off.
	for _, tr := range []string{"json-warm", "xml-warm", "json-cold", "xml-cold", "json-nocache", "xml-nocache"} {
		b.Run(tr, func(b *testing.B) {
			if strings.HasSuffix(tr, "-nocache") {
				testRows.setLimit(0)
			} else {
				testRows.setLimit(rowCacheDefault)
			}
			for b.Loop() {
				if strings.HasSuffix(tr, "-cold") {
					b.StopTimer()
					testRows.setLimit(0)
					testRows.setLimit(rowCacheDefault)
					b.StartTimer()
				}
				v := allRecords(d, dm.VM.Class)
				if strings.HasPrefix(tr, "json") {
					wire.WriteJSONSuccess(io.Discard, nil, v)
				} else {
					wire.WriteXMLSuccess(io.Discard, v)
				}
			}
		})
	}
}

// plainEncoder hides an encoder's Preencoder methods, so that rows written
// through it take the uncached path: the encoding as it was before the
// cache.
type plainEncoder struct{ wire.Encoder }

type uncached struct{ v typed }

func (u uncached) MarshalXenAPI(e wire.Encoder) { u.v.MarshalXenAPI(plainEncoder{e}) }

// replies returns the JSON-RPC 1.0 and XML-RPC replies carrying v.
func replies(t *testing.T, v any) (js, xml []byte) {
	t.Helper()
	var j, x bytes.Buffer
	req := &wire.JSONRequest{Method: "VM.get_all_records", ID: []byte(`7`)}
	if err := wire.WriteJSONSuccess(&j, req, v); err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteXMLSuccess(&x, v); err != nil {
		t.Fatal(err)
	}
	return j.Bytes(), x.Bytes()
}

// sameAsUncached checks that every class's get_all_records, and each
// row's get_record, is byte for byte what the uncached encoder writes,
// in both transports, and returns how many rows were encoded afresh.
func sameAsUncached(t *testing.T, d *db.DB, what string) int64 {
	t.Helper()
	before := testRows.encodes.Load()
	snap := d.Snapshot()
	for _, cls := range dm.Model.Classes {
		m := dm.Model.Message(cls.Name + ".get_all_records")
		if m == nil || !cls.InDB || snap.Count(cls) == 0 {
			continue
		}
		v := typed{t: m.Result, v: snap.All(cls), snap: snap, rows: testRows}
		wantJ, wantX := replies(t, uncached{v})
		for pass := range 2 { // the first may fill the cache, the second reads it
			gotJ, gotX := replies(t, v)
			if !bytes.Equal(gotJ, wantJ) || !bytes.Equal(gotX, wantX) {
				t.Fatalf("%s: %s.get_all_records, pass %d: cached encoding differs:\njson %t xml %t\n%.400s\n%.400s",
					what, cls.Name, pass, bytes.Equal(gotJ, wantJ), bytes.Equal(gotX, wantX), gotJ, wantJ)
			}
		}
		rec := dm.Model.Message(cls.Name + ".get_record")
		for _, r := range snap.All(cls) {
			one := typed{t: rec.Result, v: r, snap: snap, rows: testRows}
			wantJ, wantX := replies(t, uncached{one})
			gotJ, gotX := replies(t, one)
			if !bytes.Equal(gotJ, wantJ) || !bytes.Equal(gotX, wantX) {
				t.Fatalf("%s: %s.get_record %s: cached encoding differs", what, cls.Name, r.Ref)
			}
		}
	}
	return testRows.encodes.Load() - before
}

func update(t *testing.T, d *db.DB, fn func(tx *db.Tx) error) {
	t.Helper()
	if _, err := d.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// TestCachedRecordsAreByteIdentical encodes every class's records, with
// awkward values (markup, control characters, invalid UTF-8, U+2028,
// floats, dates, maps, sets, derived sets) through the cache and without
// it, before and after writes that change stored fields, derived sets
// (a VBD added and removed) and deletions.
func TestCachedRecordsAreByteIdentical(t *testing.T) {
	testRows.setLimit(rowCacheDefault)
	d := vmsDB(t, 50)
	vms := d.Snapshot().All(dm.VM.Class)
	vm, other := vms[len(vms)-1].Ref, vms[len(vms)-2].Ref
	update(t, d, func(tx *db.Tx) error {
		for _, set := range []struct {
			f *schema.Field
			v any
		}{
			{dm.VM.NameLabel, "<b>&amp;\"quoted\" \r\n\ttab \x01 \xff bad é 中 \u2028\u2029 \uFFFE"},
			{dm.VM.NameDescription, strings.Repeat("long ", 3000)},
			{dm.VM.OtherConfig, map[string]string{"z": "last", "a&b": "<x>", "": "empty key", "ü": "\x00"}},
			{dm.VM.Tags, []string{"b", "a", "<tag>"}},
			{dm.VM.HVMShadowMultiplier, 1.0 / 3},
			{dm.VM.SnapshotTime, time.Date(2026, 11, 23, 12, 0, 1, 0, time.UTC)},
			{dm.VM.MemoryStaticMax, int64(-1) << 62},
		} {
			if err := tx.Set(set.f, vm, set.v); err != nil {
				return err
			}
		}
		return nil
	})
	if n := sameAsUncached(t, d, "initial"); n == 0 {
		t.Fatal("nothing went through the cache")
	}
	if n := sameAsUncached(t, d, "unchanged"); n != 0 {
		t.Fatalf("%d unchanged rows were encoded again", n)
	}

	// A stored field of one VM.
	update(t, d, func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, other, "renamed") })
	if n := sameAsUncached(t, d, "renamed"); n != 2 { // one row, two transports
		t.Fatalf("after renaming one VM, %d rows encoded afresh, want 2", n)
	}

	// A derived set: a VBD pointing at the VM touches the VM.
	var vbd string
	update(t, d, func(tx *db.Tx) (err error) {
		rec := dm.VBDRecord{VM: dm.VMRef(vm), VDI: schema.NullRef, Userdevice: "0", Mode: "RW", Type: "Disk", OtherConfig: map[string]string{"k": "v"}}
		vbd, err = tx.Insert(dm.VBD.Class, "", rec.Row())
		return err
	})
	if n := sameAsUncached(t, d, "VBD created"); n != 4 { // the VM and the new VBD
		t.Fatalf("after adding a VBD, %d rows encoded afresh, want 4", n)
	}
	j, _ := replies(t, typed{t: dm.Model.Message("VM.get_record").Result, v: mustRow(t, d, dm.VM.Class, vm), snap: d.Snapshot(), rows: testRows})
	if !bytes.Contains(j, []byte(`"VBDs":["`+vbd+`"]`)) {
		t.Fatalf("the VM's record does not list its new VBD: %.300s", j)
	}
	update(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VBD.Class, vbd) })
	sameAsUncached(t, d, "VBD deleted")
	update(t, d, func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, other) })
	sameAsUncached(t, d, "VM deleted")
}

func mustRow(t *testing.T, d *db.DB, c *schema.Class, ref string) *db.Row {
	t.Helper()
	r, ok := d.Snapshot().Get(c, ref)
	if !ok {
		t.Fatalf("no %s %s", c.Name, ref)
	}
	return r
}

// TestRowCacheIsBounded fills a small cache with more records than fit:
// it stays under its bound, and what it writes is still right.
func TestRowCacheIsBounded(t *testing.T) {
	defer testRows.setLimit(rowCacheDefault)
	const limit = 256 << 10
	testRows.setLimit(limit)
	d := vmsDB(t, 300) // about 3 MB of records in both transports
	for range 3 {
		sameAsUncached(t, d, "bounded")
		if s := testRows.size.Load(); s > limit {
			t.Fatalf("cache holds %d bytes, bound %d", s, limit)
		}
	}
	if n := testRows.entries.Load(); n == 0 || n > limit/rowEntryOverhead {
		t.Fatalf("%d entries", n)
	}
	var held, count int64
	testRows.m.Range(func(_, v any) bool {
		held += v.(*rowEntry).cost()
		count++
		return true
	})
	if held != testRows.size.Load() || count != testRows.entries.Load() {
		t.Fatalf("accounting: %d bytes in %d entries, counted %d in %d", held, count, testRows.size.Load(), testRows.entries.Load())
	}
	testRows.setLimit(0)
	if s, n := testRows.size.Load(), testRows.entries.Load(); s != 0 || n != 0 {
		t.Fatalf("turned off, the cache still holds %d bytes in %d entries", s, n)
	}
	if n := sameAsUncached(t, d, "off"); n != 0 {
		t.Fatalf("the cache is off but %d rows went through it", n)
	}
}

// TestCachedRecordsUnderConcurrentWrites reads get_all_records from
// several goroutines while rows change, and checks each reply against the
// uncached encoding of the same snapshot (run it with -race).
func TestCachedRecordsUnderConcurrentWrites(t *testing.T) {
	testRows.setLimit(rowCacheDefault)
	d := vmsDB(t, 100)
	refs := d.Snapshot().All(dm.VM.Class)
	m := dm.Model.Message("VM.get_all_records")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r := refs[i%len(refs)].Ref
			if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, r, "w"+strconv.Itoa(i)) }); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	errs := make(chan error, 4)
	var readers sync.WaitGroup
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for range 20 {
				snap := d.Snapshot()
				v := typed{t: m.Result, v: snap.All(dm.VM.Class), snap: snap, rows: testRows}
				var a, b bytes.Buffer
				wire.WriteJSONSuccess(&a, nil, v)
				wire.WriteJSONSuccess(&b, nil, uncached{v})
				var x, y bytes.Buffer
				wire.WriteXMLSuccess(&x, v)
				wire.WriteXMLSuccess(&y, uncached{v})
				if !bytes.Equal(a.Bytes(), b.Bytes()) || !bytes.Equal(x.Bytes(), y.Bytes()) {
					errs <- fmt.Errorf("a reply differs from the uncached encoding of its snapshot")
					return
				}
			}
		}()
	}
	readers.Wait()
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestRowOlderThanItsSnapshot: a handler's row can be older than the
// snapshot its reply is written with (a VBD was added to the VM in
// between). Such a row is written as before, with the snapshot's derived
// sets, whether or not it is in the cache, and that mixed encoding is not
// kept for the row.
func TestRowOlderThanItsSnapshot(t *testing.T) {
	testRows.setLimit(rowCacheDefault)
	d := vmsDB(t, 2)
	old := d.Snapshot()
	vm := old.All(dm.VM.Class)[0]
	rt := dm.Model.Message("VM.get_record").Result
	check := func(what string, snap *db.Snapshot) {
		t.Helper()
		v := typed{t: rt, v: vm, snap: snap, rows: testRows}
		wantJ, wantX := replies(t, uncached{v})
		gotJ, gotX := replies(t, v)
		if !bytes.Equal(gotJ, wantJ) || !bytes.Equal(gotX, wantX) {
			t.Fatalf("%s: got\n%.300s\nwant\n%.300s", what, gotJ, wantJ)
		}
	}
	check("the row with its own snapshot", old) // fills the cache
	var vbd string
	update(t, d, func(tx *db.Tx) (err error) {
		rec := dm.VBDRecord{VM: dm.VMRef(vm.Ref), VDI: schema.NullRef, Userdevice: "0", Mode: "RW", Type: "Disk"}
		vbd, err = tx.Insert(dm.VBD.Class, "", rec.Row())
		return err
	})
	check("the old row with the newer snapshot", d.Snapshot())
	if j, _ := replies(t, typed{t: rt, v: vm, snap: d.Snapshot(), rows: testRows}); !bytes.Contains(j, []byte(vbd)) {
		t.Fatal("the newer snapshot's VBD is missing")
	}
	check("the row with its own snapshot again", old)
}
