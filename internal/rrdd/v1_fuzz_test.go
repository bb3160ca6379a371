package rrdd

import (
	"errors"
	"testing"

	"toolstackd/internal/rrd/plugin"
)

// FuzzParseV1 feeds arbitrary payloads to the protocol v1 reader (a
// plugin's file is anyone's who can write it): an error wraps
// plugin.ErrPayload, never a panic, and a
// reading has a value for each source.
func FuzzParseV1(f *testing.F) {
	f.Add([]byte(`{"timestamp":1700000000.5,"datasources":{` +
		`"g":{"description":"g","owner":"vm ` + testVMUUID + `","value":"0.25","value_type":"float",` +
		`"type":"gauge","default":"true","units":"%","min":"0.00","max":"100.00"},` +
		`"c":{"value":"9007199254740993","value_type":"INT64","type":"derive","transform":"bogus"},` +
		`"p":{"value":1.5}}}`))
	f.Add([]byte(`{"timestamp":"1","datasources":{}}`))
	f.Add([]byte(`{"datasources":{"a":{"value":1}},"timestamp":2,"x":[1,{"y":null}]}`))
	f.Add([]byte(`{"timestamp":1,"datasources":{"a":{"value":"1e400","value_type":"int64"}}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		r, err := parseV1(payload)
		if err != nil {
			if !errors.Is(err, plugin.ErrPayload) {
				t.Fatalf("an error that is not ErrPayload's: %v", err)
			}
			return
		}
		if len(r.Sources) != len(r.Values) {
			t.Fatalf("%d sources, %d values", len(r.Sources), len(r.Values))
		}
	})
}
