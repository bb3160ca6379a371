package wire

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// vmFields mimics the 90-odd fields of a VM record: strings, enums, refs,
// ints, floats, bools, dates, string maps and ref sets.
var vmFields = []struct {
	name string
	kind byte // s string, i int, f float, b bool, t time, m map, l set
}{
	{"uuid", 's'}, {"allowed_operations", 'l'}, {"current_operations", 'm'}, {"name_label", 's'},
	{"name_description", 's'}, {"power_state", 's'}, {"user_version", 'i'}, {"is_a_template", 'b'},
	{"is_default_template", 'b'}, {"suspend_VDI", 's'}, {"resident_on", 's'},
	{"scheduled_to_be_resident_on", 's'}, {"affinity", 's'}, {"memory_overhead", 'i'},
	{"memory_target", 'i'}, {"memory_static_max", 'i'}, {"memory_dynamic_max", 'i'},
	{"memory_dynamic_min", 'i'}, {"memory_static_min", 'i'}, {"VCPUs_params", 'm'}, {"VCPUs_max", 'i'},
	{"VCPUs_at_startup", 'i'}, {"actions_after_softreboot", 's'}, {"actions_after_shutdown", 's'},
	{"actions_after_reboot", 's'}, {"actions_after_crash", 's'}, {"consoles", 'l'}, {"VIFs", 'l'},
	{"VBDs", 'l'}, {"VUSBs", 'l'}, {"crash_dumps", 'l'}, {"VTPMs", 'l'}, {"PV_bootloader", 's'},
	{"PV_kernel", 's'}, {"PV_ramdisk", 's'}, {"PV_args", 's'}, {"PV_bootloader_args", 's'},
	{"PV_legacy_args", 's'}, {"HVM_boot_policy", 's'}, {"HVM_boot_params", 'm'},
	{"HVM_shadow_multiplier", 'f'}, {"platform", 'm'}, {"PCI_bus", 's'}, {"other_config", 'm'},
	{"domid", 'i'}, {"domarch", 's'}, {"last_boot_CPU_flags", 'm'}, {"is_control_domain", 'b'},
	{"metrics", 's'}, {"guest_metrics", 's'}, {"last_booted_record", 's'}, {"recommendations", 's'},
	{"xenstore_data", 'm'}, {"ha_always_run", 'b'}, {"ha_restart_priority", 's'}, {"is_a_snapshot", 'b'},
	{"snapshot_of", 's'}, {"snapshots", 'l'}, {"snapshot_time", 't'}, {"transportable_snapshot_id", 's'},
	{"blobs", 'm'}, {"tags", 'l'}, {"blocked_operations", 'm'}, {"snapshot_info", 'm'},
	{"snapshot_metadata", 's'}, {"parent", 's'}, {"children", 'l'}, {"bios_strings", 'm'},
	{"protection_policy", 's'}, {"is_snapshot_from_vmpp", 'b'}, {"snapshot_schedule", 's'},
	{"is_vmss_snapshot", 'b'}, {"appliance", 's'}, {"start_delay", 'i'}, {"shutdown_delay", 'i'},
	{"order", 'i'}, {"VGPUs", 'l'}, {"attached_PCIs", 'l'}, {"suspend_SR", 's'}, {"version", 'i'},
	{"generation_id", 's'}, {"hardware_platform_version", 'i'}, {"has_vendor_device", 'b'},
	{"requires_reboot", 'b'}, {"reference_label", 's'}, {"domain_type", 's'}, {"NVRAM", 'm'},
	{"pending_guidances", 'l'}, {"pending_guidances_recommended", 'l'}, {"pending_guidances_full", 'l'},
}

var (
	benchMap  = map[string]string{"vga": "std", "videoram": "8", "apic": "true", "device-model": "qemu-upstream-compat", "secureboot": "false"}
	benchSet  = []string{"OpaqueRef:5f1c3e0a-1b2c-4d5e-8f90-123456789abc", "OpaqueRef:0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "OpaqueRef:99887766-5544-3322-1100-ffeeddccbbaa"}
	benchTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
)

// vmRecord writes itself through the Encoder, as generated record types will.
type vmRecord struct{ id int }

func (r vmRecord) MarshalXenAPI(e Encoder) {
	e.BeginStruct()
	for _, f := range vmFields {
		e.Member(f.name)
		switch f.kind {
		case 's':
			e.String("OpaqueRef:5f1c3e0a-1b2c-4d5e-8f90-123456789abc")
		case 'i':
			e.Int(4294967296 + int64(r.id))
		case 'f':
			e.Float(1.5)
		case 'b':
			e.Bool(r.id%2 == 0)
		case 't':
			e.Time(benchTime)
		case 'm':
			e.BeginStruct()
			for _, k := range []string{"vga", "videoram", "apic", "device-model", "secureboot"} {
				e.Member(k)
				e.String(benchMap[k])
			}
			e.EndStruct()
		case 'l':
			e.BeginArray()
			for _, s := range benchSet {
				e.String(s)
			}
			e.EndArray()
		}
	}
	e.EndStruct()
}

// vmMap is the same record as a neutral map.
func vmMap() map[string]any {
	m := make(map[string]any, len(vmFields))
	for _, f := range vmFields {
		switch f.kind {
		case 's':
			m[f.name] = "OpaqueRef:5f1c3e0a-1b2c-4d5e-8f90-123456789abc"
		case 'i':
			m[f.name] = int64(4294967296)
		case 'f':
			m[f.name] = 1.5
		case 'b':
			m[f.name] = true
		case 't':
			m[f.name] = benchTime
		case 'm':
			m[f.name] = benchMap
		case 'l':
			m[f.name] = benchSet
		}
	}
	return m
}

// allRecords is a VM.get_all_records reply streamed from one record per ref.
type allRecords []string

func newAllRecords(n int) allRecords {
	refs := make(allRecords, n)
	for i := range refs {
		refs[i] = fmt.Sprintf("OpaqueRef:%08d-0000-0000-0000-000000000000", i)
	}
	return refs
}

func (refs allRecords) MarshalXenAPI(e Encoder) {
	e.BeginStruct()
	for i, ref := range refs {
		e.Member(ref)
		vmRecord{i}.MarshalXenAPI(e)
	}
	e.EndStruct()
}

func benchWrite(b *testing.B, write func(io.Writer) error) {
	var size countingWriter
	if err := write(&size); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := write(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}

func BenchmarkEncodeVMRecord(b *testing.B) {
	m := vmMap()
	b.Run("XML/Marshaler", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteXMLSuccess(w, vmRecord{}) })
	})
	b.Run("JSON/Marshaler", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteJSONSuccess(w, nil, vmRecord{}) })
	})
	b.Run("XML/map", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteXMLSuccess(w, m) })
	})
	b.Run("JSON/map", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteJSONSuccess(w, nil, m) })
	})
}

func BenchmarkEncodeAllRecords10k(b *testing.B) {
	all := newAllRecords(10000)
	b.Run("XML", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteXMLSuccess(w, all) })
	})
	b.Run("JSON", func(b *testing.B) {
		benchWrite(b, func(w io.Writer) error { return WriteJSONSuccess(w, nil, all) })
	})
}

func BenchmarkDecodeRequest(b *testing.B) {
	python := readFixture(b, "python_get_record.xml")
	xo := readFixture(b, "xo_set_other_config.xml")
	event := readFixture(b, "xo_event_from.xml")
	jsonBody := []byte(`{"id":0,"jsonrpc":"2.0","method":"VM.get_record","params":["OpaqueRef:abc","OpaqueRef:9f1c"]}`)
	for _, tc := range []struct {
		name string
		body []byte
	}{{"XML/python_get_record", python}, {"XML/xo_event_from", event}, {"XML/xo_set_other_config", xo}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := DecodeXMLRequest(bytes.NewReader(tc.body)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("JSON/get_record", func(b *testing.B) {
		b.SetBytes(int64(len(jsonBody)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeJSONRequest(jsonBody); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestVMRecordBenchShape(t *testing.T) {
	if n := len(vmFields); n < 85 || n > 95 {
		t.Fatalf("%d fields, want about 90", n)
	}
	// The streamed record and the map produce the same bytes (same order
	// aside), and both parse.
	x := XMLValueFragment(vmRecord{})
	if !strings.Contains(x, "<name>snapshot_time</name><value><dateTime.iso8601>20240506T07:08:09Z</dateTime.iso8601></value>") {
		t.Fatalf("unexpected record encoding: %.200s", x)
	}
	if _, params, err := DecodeXMLRequest(strings.NewReader(call1(x))); err != nil || len(params[0].(map[string]any)) != len(vmFields) {
		t.Fatalf("record does not parse back: %v", err)
	}
}
