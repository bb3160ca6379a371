package plugin

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"strings"
	"testing"

	"toolstackd/internal/rrd"
)

func sampleSources() []Source {
	return []Source{
		{Name: "zeta", Description: "last alphabetically, first in the file", Owner: Owner{Kind: Host}, ValueType: Float, Type: rrd.Gauge, Default: true, Min: 0, Max: math.Inf(1)},
		{Name: "alpha", Owner: Owner{Kind: VM, UUID: "0b9c1d6e-0000-4000-8000-000000000001"}, ValueType: Int64, Type: rrd.Derive, Min: math.Inf(-1), Max: math.Inf(1), Units: "B/s"},
		{Name: "idle", Owner: Owner{Kind: SR, UUID: "5f1c"}, ValueType: Float, Type: rrd.Absolute, Min: 0, Max: 1, Transform: rrd.Inverse},
	}
}

func encode(t *testing.T, ts float64, vals []rrd.Value) []byte {
	t.Helper()
	b, err := Encode(ts, sampleSources(), vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTripKeepsOrder(t *testing.T) {
	vals := []rrd.Value{rrd.FloatValue(1.5), rrd.IntValue(-7), rrd.FloatValue(0.25)}
	b := encode(t, 1_700_000_000.5, vals)
	var r Reader
	got, err := r.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Timestamp != 1_700_000_000.5 {
		t.Errorf("timestamp %v", got.Timestamp)
	}
	if tm, err := got.Time(); err != nil || tm.UnixMilli() != 1_700_000_000_500 {
		t.Errorf("time %v %v", tm, err)
	}
	for _, bad := range []float64{math.NaN(), -1, math.Inf(1), 1e300} {
		if _, err := (Reading{Timestamp: bad}).Time(); !errors.Is(err, ErrPayload) {
			t.Errorf("timestamp %v accepted", bad)
		}
	}
	want := sampleSources()
	for i := range want {
		if got.Sources[i] != want[i] {
			t.Errorf("source %d: %+v, want %+v", i, got.Sources[i], want[i])
		}
	}
	if got.Values[0].F != 1.5 || got.Values[1].Kind != rrd.Int || got.Values[1].I != -7 ||
		got.Values[2].F != 0.25 || got.Values[2].Transform != rrd.Inverse {
		t.Errorf("values %+v", got.Values)
	}
	// Same bytes again: no update.
	if _, err := r.Read(b); !errors.Is(err, ErrNoUpdate) {
		t.Errorf("second read: %v", err)
	}
	// Next tick, same metadata: read from the cache.
	b2 := encode(t, 1_700_000_005, vals)
	if _, err := r.Read(b2); err != nil {
		t.Error(err)
	}
}

func TestBadSnapshotsSkipTheTick(t *testing.T) {
	vals := []rrd.Value{rrd.FloatValue(1), rrd.IntValue(2), rrd.FloatValue(0.5)}
	good := encode(t, 100, vals)
	mod := func(f func(b []byte) []byte) []byte {
		c := append([]byte(nil), good...)
		return f(c)
	}
	cases := map[string]struct {
		b    []byte
		want error
	}{
		"empty":      {nil, ErrTruncated},
		"header":     {mod(func(b []byte) []byte { b[0] = 'd'; return b }), ErrInvalidHeader},
		"torn value": {mod(func(b []byte) []byte { b[offValues+3] ^= 1; return b }), ErrChecksum},
		"torn time":  {mod(func(b []byte) []byte { b[offTime] ^= 1; return b }), ErrChecksum},
		"short":      {good[:offValues+8], ErrTruncated},
		"no meta":    {good[:offValues+24+2], ErrTruncated},
		"meta cut":   {good[:len(good)-3], ErrTruncated},
		"meta crc":   {mod(func(b []byte) []byte { b[len(b)-2] ^= 1; return b }), ErrChecksum},
		"huge count": {mod(func(b []byte) []byte { binary.BigEndian.PutUint32(b[offCount:], 1<<31); return b }), ErrPayload},
		"huge meta": {mod(func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[offValues+24:], 1<<30)
			return b
		}), ErrPayload},
	}
	for name, c := range cases {
		var r Reader
		if _, err := r.Read(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

// build writes a file by hand with the given metadata text and values.
func build(ts uint64, meta string, vals ...uint64) []byte {
	n := len(vals)
	b := make([]byte, fixedLength+8*n+len(meta))
	copy(b, Header)
	binary.BigEndian.PutUint32(b[offMetaCRC:], crc32.ChecksumIEEE([]byte(meta)))
	binary.BigEndian.PutUint32(b[offCount:], uint32(n))
	binary.BigEndian.PutUint64(b[offTime:], ts)
	for i, v := range vals {
		binary.BigEndian.PutUint64(b[offValues+8*i:], v)
	}
	binary.BigEndian.PutUint32(b[offValues+8*n:], uint32(len(meta)))
	copy(b[fixedLength+8*n:], meta)
	binary.BigEndian.PutUint32(b[offDataCRC:], crc32.ChecksumIEEE(b[offTime:offValues+8*n]))
	return b
}

// What the C writer library and older plugins produce: a NUL-terminated
// metadata, an integer timestamp, defaults left out, mixed-case keywords,
// numbers as values where the protocol ignores them.
func TestCompatibility(t *testing.T) {
	meta := `{"datasources":{"b":{"value_type":"int64","type":"Derive","owner":"VM ABC","value":12},"a":{"value_type":"float","min":"0.00","max":"100.00","default":"true","description":"x","description":"ignored"}},"timestamp":5}` + "\x00"
	var r Reader
	got, err := r.Read(build(1_700_000_000, meta, 42, math.Float64bits(2.5)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Timestamp != 1_700_000_000 {
		t.Errorf("integer timestamp read as %v", got.Timestamp)
	}
	b, a := got.Sources[0], got.Sources[1]
	if b.Name != "b" || b.Type != rrd.Derive || b.Owner != (Owner{VM, "abc"}) || b.ValueType != Int64 || !math.IsInf(b.Min, -1) || b.Default {
		t.Errorf("b: %+v", b)
	}
	if a.Name != "a" || a.Type != rrd.Absolute || a.Min != 0 || a.Max != 100 || !a.Default || a.Description != "x" || a.Owner.Kind != Host {
		t.Errorf("a: %+v", a)
	}
	if got.Values[0].I != 42 || got.Values[1].F != 2.5 {
		t.Errorf("values %+v", got.Values)
	}
}

func TestMetadataErrors(t *testing.T) {
	bad := []string{
		``, `[]`, `{}`, `{"datasources":[]}`, `{"datasources":{"a":{}}}`,
		`{"datasources":{"a":{"value_type":"Float"}}}`,
		`{"datasources":{"a":{"value_type":"float","type":"counter"}}}`,
		`{"datasources":{"a":{"value_type":"float","owner":"vm"}}}`,
		`{"datasources":{"a":{"value_type":"float","owner":"vm  x"}}}`,
		`{"datasources":{"a":{"value_type":"float","default":"yes"}}}`,
		`{"datasources":{"a":{"value_type":"float","min":"low"}}}`,
		`{"datasources":{"a":{"value_type":"float","min":0}}}`,
		`{"datasources":{"a":{"value_type":"float","transform":"square"}}}`,
		`{"datasources":{"":{"value_type":"float"}}}`,
		`{"datasources":{"a":{"value_type":"float"}}} junk`,
		`{"datasources":{"a":{"value_type":"float"}}`,
	}
	for _, m := range bad {
		if _, err := ParseMetadata([]byte(m)); !errors.Is(err, ErrPayload) {
			t.Errorf("%q: %v", m, err)
		}
	}
	// The metadata must describe as many sources as there are values.
	var r Reader
	if _, err := r.Read(build(1, `{"datasources":{"a":{"value_type":"float"}}}`, 1, 2)); !errors.Is(err, ErrPayload) {
		t.Errorf("count mismatch: %v", err)
	}
}

// Metadata that fails to parse is not cached: the next snapshot with the
// same metadata is parsed (and fails) again rather than read with stale
// sources.
func TestBadMetadataNotCached(t *testing.T) {
	meta := `{"datasources":{"a":{"value_type":"nope"}}}`
	var r Reader
	if _, err := r.Read(build(math.Float64bits(1), meta, 1)); !errors.Is(err, ErrPayload) {
		t.Fatal(err)
	}
	if _, err := r.Read(build(math.Float64bits(2), meta, 1)); !errors.Is(err, ErrPayload) {
		t.Fatal(err)
	}
}

func TestEncodeMetadataIsStrings(t *testing.T) {
	m, err := EncodeMetadata(sampleSources())
	if err != nil {
		t.Fatal(err)
	}
	s := string(m)
	if !strings.HasPrefix(s, `{"datasources":{"zeta":{`) || !strings.Contains(s, `"min":"-inf"`) || !strings.Contains(s, `"transform":"inverse"`) {
		t.Error(s)
	}
}

func FuzzRead(f *testing.F) {
	vals := []rrd.Value{rrd.FloatValue(1), rrd.IntValue(2), rrd.FloatValue(0.5)}
	good, _ := Encode(100, sampleSources(), vals)
	f.Add(good)
	f.Add(build(1, `{"datasources":{"a":{"value_type":"float"}}}`+"\x00\x00", 1))
	f.Add([]byte("DATASOURCES"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Reader
		// A first read of the file's second half primes the cache (for
		// the same-metadata path), then the whole file.
		_, _ = r.Read(b[len(b)/2:])
		got, err := r.Read(b)
		if err != nil {
			return
		}
		if len(got.Sources) != len(got.Values) {
			t.Fatal("sources and values differ in length")
		}
		// A parsed snapshot re-encodes and reads back the same.
		again, err := Encode(got.Timestamp, got.Sources, got.Values)
		if err != nil {
			return
		}
		var r2 Reader
		back, err := r2.Read(again)
		if err != nil && !errors.Is(err, ErrNoUpdate) {
			t.Fatalf("re-encoded snapshot fails: %v", err)
		}
		if err == nil && len(back.Sources) != len(got.Sources) {
			t.Fatal("re-encoded snapshot lost sources")
		}
	})
}

func FuzzParseMetadata(f *testing.F) {
	m, _ := EncodeMetadata(sampleSources())
	f.Add(m)
	f.Add([]byte(`{"datasources":{"a":{"value_type":"float","owner":"sr x"}},"x":[1,{"y":null}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		srcs, err := ParseMetadata(b)
		if err != nil {
			return
		}
		if len(srcs) > MaxDatasources {
			t.Fatal("too many sources")
		}
		for _, s := range srcs {
			if s.Name == "" {
				t.Fatal("empty name accepted")
			}
		}
	})
}
