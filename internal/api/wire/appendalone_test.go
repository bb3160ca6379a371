package wire

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestAppendAloneMatchesEncodeAlone: AppendAlone writes the same bytes as
// EncodeAlone after whatever dst already holds, including values larger
// than an encoder's flush size, and those bytes inside a struct member
// come out as the direct encoding does.
func TestAppendAloneMatchesEncodeAlone(t *testing.T) {
	vals := []any{
		"<&>\"\r\n\t\x01\xff\u2028",
		map[string]any{"z": []any{int64(-1), Int32(7), 0.5, true, nil, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), []byte{0, 1}}, "a": map[string]string{"k": "v"}},
		[]string{strings.Repeat("long ", 5000), "x"},
	}
	for _, mk := range []func(w *bytes.Buffer) Preencoder{
		func(w *bytes.Buffer) Preencoder { return NewXMLEncoder(w) },
		func(w *bytes.Buffer) Preencoder { return NewJSONEncoder(w) },
	} {
		for i, v := range vals {
			var direct, pre bytes.Buffer
			d, p := mk(&direct), mk(&pre)
			want := p.EncodeAlone(v)
			got := p.AppendAlone([]byte("prefix"), v)
			if !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
				t.Fatalf("%s value %d: AppendAlone %.200q, EncodeAlone %.200q", p.Kind(), i, got, want)
			}
			d.BeginStruct()
			d.Member("m")
			Encode(d, v)
			d.EndStruct()
			p.BeginStruct()
			p.Member("m")
			p.Preencoded(got[6:])
			p.EndStruct()
			d.(interface{ Flush() error }).Flush()
			p.(interface{ Flush() error }).Flush()
			if !bytes.Equal(direct.Bytes(), pre.Bytes()) {
				t.Fatalf("%s value %d: preencoded member differs", p.Kind(), i)
			}
		}
	}
}
