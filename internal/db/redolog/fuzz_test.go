package redolog

import (
	"bytes"
	"errors"
	"testing"
)

func FuzzDecodeDelta(f *testing.F) {
	for _, d := range sampleDeltas {
		b, _ := d.Encode()
		f.Add(b)
	}
	all, _ := EncodeAll(sampleDeltas)
	f.Add(all)
	for _, s := range []string{"", "CreateRow", "DeleteRow0000000", "WriteFiel00000001a", "CreateRow00000001t00000001r99999999"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err == nil {
			re, err := d.Encode()
			if err != nil {
				t.Fatalf("decoded %+v does not encode: %v", d, err)
			}
			if !bytes.Equal(re, b) {
				t.Fatalf("re-encoding differs:\n%q\n%q", re, b)
			}
		} else if !errors.Is(err, ErrMalformedDelta) {
			t.Fatalf("error %v does not wrap ErrMalformedDelta", err)
		}
		ds, err := DecodeAll(b)
		if err == nil {
			re, err := EncodeAll(ds)
			if err != nil || !bytes.Equal(re, b) {
				t.Fatalf("DecodeAll/EncodeAll round trip: %v", err)
			}
		}
	})
}

var fuzzHalves = []int64{256, 300, 1024}

// fuzzSeedImages builds real logs in various states.
func fuzzSeedImages(f *testing.F) {
	for hi, half := range fuzzHalves {
		d, mem := newMemDevice(f, half)
		f.Add(byte(hi), mem.bytes())
		m := newMarker()
		mustWriteDB(f, d, 3, m, []byte("db three"))
		f.Add(byte(hi), mem.bytes())
		d.WriteDelta(4, m, []byte("WriteFiel00000001t00000001r00000001f00000001v"))
		d.WriteDelta(9, m, []byte("x"))
		f.Add(byte(hi), mem.bytes())
		m2 := newMarker()
		mustWriteDB(f, d, 10, m2, bytes.Repeat([]byte("d"), int(half)/3))
		d.WriteDelta(11, m2, []byte("eleven"))
		f.Add(byte(hi), mem.bytes())
		img := mem.bytes()
		f.Add(byte(hi), img[:len(img)-30])
	}
}

// FuzzDeviceRead: Read on arbitrary contents never panics and yields a
// well-formed sequence; a writer on the same contents can always append
// or write a database, and Read then shows exactly that.
func FuzzDeviceRead(f *testing.F) {
	fuzzSeedImages(f)
	f.Fuzz(func(t *testing.T, sel byte, img []byte) {
		half := fuzzHalves[int(sel)%len(fuzzHalves)]
		ro, err := openMemImage(t, img, half, true)
		if err != nil {
			if !errors.Is(err, ErrNotRedoLog) {
				t.Fatalf("open: %v", err)
			}
			return
		}
		recs, err := collect(ro)
		if err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Read: %v", err)
		}
		checkWellFormed(t, recs)
		if r, err := ReadState(ro); err == nil && r.Gen != recs[0].Gen {
			t.Fatalf("ReadState gen %d, Read gen %d", r.Gen, recs[0].Gen)
		}

		w, err := openMemImage(t, img, half, false)
		if err != nil {
			t.Fatalf("writable open: %v", err)
		}
		if len(recs) > 0 && recs[len(recs)-1].Gen < MaxGeneration {
			last := recs[len(recs)-1].Gen
			err := w.WriteDelta(last+1, recs[0].Marker, []byte("fuzz delta"))
			switch {
			case err == nil:
				after, err := collect(w)
				if err != nil {
					t.Fatalf("Read after WriteDelta: %v", err)
				}
				if len(after) != len(recs)+1 || after[len(recs)].Gen != last+1 || string(after[len(recs)].Data) != "fuzz delta" {
					t.Fatalf("after WriteDelta: %d records, had %d", len(after), len(recs))
				}
				for i := range recs {
					if after[i].Gen != recs[i].Gen || !bytes.Equal(after[i].Data, recs[i].Data) {
						t.Fatalf("record %d changed by WriteDelta", i)
					}
				}
			case errors.Is(err, ErrNoSpace), errors.Is(err, ErrNoDatabase):
			default:
				t.Fatalf("WriteDelta: %v", err)
			}
		}
		m := newMarker()
		if err := w.WriteDB(7, m, bytes.NewReader([]byte("fuzz db"))); err != nil {
			t.Fatalf("WriteDB: %v", err)
		}
		after, err := collect(w)
		if err != nil || len(after) != 1 || after[0].Gen != 7 || after[0].Marker != m || string(after[0].Data) != "fuzz db" {
			t.Fatalf("after WriteDB: %+v, %v", after, err)
		}
		// The readable state from before is still in the other half.
		if len(recs) > 0 && after[0].Half == recs[0].Half {
			t.Fatalf("WriteDB overwrote the half holding the state")
		}
	})
}

func collect(d Device) ([]Record, error) {
	var recs []Record
	err := d.Read(func(r Record) error { recs = append(recs, r); return nil })
	return recs, err
}

func checkWellFormed(t *testing.T, recs []Record) {
	t.Helper()
	for i, r := range recs {
		if (i == 0) != (r.Kind == RecordDB) {
			t.Fatalf("record %d is %v", i, r.Kind)
		}
		if i > 0 {
			if r.Gen <= recs[i-1].Gen || r.Marker != recs[0].Marker || r.Half != recs[0].Half {
				t.Fatalf("record %d (gen %d half %d) after gen %d half %d", i, r.Gen, r.Half, recs[i-1].Gen, recs[0].Half)
			}
			if len(r.Data) == 0 {
				t.Fatalf("empty delta record %d", i)
			}
		}
		if len(r.Marker) != MarkerSize {
			t.Fatalf("marker %q", r.Marker)
		}
	}
}
