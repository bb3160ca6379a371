package redolog

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

var sampleDeltas = []Delta{
	{Kind: CreateRow, Table: "VM", Ref: "OpaqueRef:1", Fields: [][2]string{{"uuid", "u-1"}, {"name__label", "a"}, {"other_config", ""}}},
	{Kind: CreateRow, Table: "network", Ref: "OpaqueRef:2"},
	{Kind: DeleteRow, Table: "VM", Ref: "OpaqueRef:1"},
	{Kind: WriteField, Table: "pool", Ref: "OpaqueRef:3", Field: "name__description", Value: "abcd"},
	{Kind: WriteField, Table: "", Ref: "", Field: "", Value: ""},
	{Kind: WriteField, Table: "t", Ref: "r", Field: "f", Value: strings.Repeat("\x00\xff|", 100)},
}

func TestDeltaEncodingExact(t *testing.T) {
	for _, c := range []struct {
		d    Delta
		want string
	}{
		{Delta{Kind: CreateRow, Table: "VM", Ref: "r1", Fields: [][2]string{{"k", "vv"}}},
			"CreateRow00000002VM00000002r10000000100000001k00000002vv"},
		{Delta{Kind: CreateRow, Table: "VM", Ref: "r1"},
			"CreateRow00000002VM00000002r100000000"},
		{Delta{Kind: DeleteRow, Table: "host", Ref: "OpaqueRef:x"},
			"DeleteRow00000004host00000011OpaqueRef:x"},
		{Delta{Kind: WriteField, Table: "SR", Ref: "r", Field: "name__label", Value: ""},
			"WriteFiel00000002SR00000001r00000011name__label00000000"},
	} {
		got, err := c.d.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("Encode(%+v) = %q, want %q", c.d, got, c.want)
		}
		back, err := Decode(got)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, c.d) {
			t.Errorf("Decode = %+v, want %+v", back, c.d)
		}
	}
}

func TestDeltaRoundTrip(t *testing.T) {
	for _, d := range sampleDeltas {
		b, err := d.Encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%q): %v", b, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Errorf("round trip: got %+v, want %+v", got, d)
		}
	}
	all, err := EncodeAll(sampleDeltas)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeAll(all)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, sampleDeltas) {
		t.Errorf("DecodeAll: got %+v", back)
	}
	if ds, err := DecodeAll(nil); err != nil || ds != nil {
		t.Errorf("DecodeAll(nil) = %v, %v", ds, err)
	}
}

func TestDeltaDecodeStrict(t *testing.T) {
	full, _ := EncodeAll(sampleDeltas[:1])
	// Every proper prefix is truncated.
	for i := 0; i < len(full); i++ {
		if _, err := Decode(full[:i]); !errors.Is(err, ErrMalformedDelta) {
			t.Errorf("Decode(prefix %d) err = %v", i, err)
		}
		if _, err := DecodeAll(full[:i]); i > 0 && !errors.Is(err, ErrMalformedDelta) {
			t.Errorf("DecodeAll(prefix %d) err = %v", i, err)
		}
	}
	bad := []string{
		"",
		"CreateRo",
		"Createrow00000002VM00000002r100000000",
		"DeleteRow0000000xVM00000002r1",
		"DeleteRow-0000002VM00000002r1",
		"DeleteRow 0000002VM00000002r1",
		"DeleteRow+0000002VM00000002r1",
		"DeleteRow00000002VM00000002r1X",                 // trailing byte
		"DeleteRow00000002VM00000003r1",                  // string runs past the end
		"DeleteRow99999999VM",                            // huge length
		"CreateRow00000002VM00000002r199999999",          // count the input cannot hold
		"CreateRow00000002VM00000002r10000000100000001k", // value missing
		"WriteFiel00000002VM00000002r100000001f",         // value missing
	}
	for _, s := range bad {
		if d, err := Decode([]byte(s)); !errors.Is(err, ErrMalformedDelta) {
			t.Errorf("Decode(%q) = %+v, %v; want ErrMalformedDelta", s, d, err)
		}
	}
}

func TestDeltaEncodeRejects(t *testing.T) {
	for _, d := range []Delta{
		{},
		{Kind: 7, Table: "x"},
		{Kind: DeleteRow, Table: "t", Ref: "r", Field: "f"},
		{Kind: DeleteRow, Table: "t", Ref: "r", Fields: [][2]string{}},
		{Kind: CreateRow, Table: "t", Ref: "r", Value: "v"},
		{Kind: WriteField, Table: "t", Ref: "r", Fields: [][2]string{{"a", "b"}}},
		{Kind: WriteField, Table: strings.Repeat("x", MaxStringLen+1)},
	} {
		if b, err := d.Encode(); err == nil {
			t.Errorf("Encode(%+v) = %q, want error", d, b)
		}
	}
	if _, err := EncodeAll([]Delta{sampleDeltas[0], {}}); err == nil {
		t.Error("EncodeAll with an invalid delta succeeded")
	}
}
