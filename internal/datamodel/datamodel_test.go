package datamodel

import (
	"encoding/json"
	"os"
	"testing"

	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

func TestCountsMatchPublishedDatamodel(t *testing.T) {
	var dm struct {
		Classes []struct {
			Fields   []json.RawMessage
			Messages []json.RawMessage
		}
		Enums     map[string][]string
		Relations []json.RawMessage
	}
	b, err := os.ReadFile("datamodel.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dm); err != nil {
		t.Fatal(err)
	}
	wantFields, wantMsgs := 0, 0
	for _, c := range dm.Classes {
		wantFields += len(c.Fields)
		wantMsgs += len(c.Messages)
	}
	if len(Model.Classes) != 72 || len(dm.Classes) != 72 {
		t.Errorf("classes: model %d, json %d, want 72", len(Model.Classes), len(dm.Classes))
	}
	fields, msgs, extras, async, getAllRecords := 0, 0, 0, 0, 0
	for _, c := range Model.Classes {
		for _, f := range c.Fields {
			if !f.Internal {
				fields++
			}
		}
		if c.HasGetAllRecords {
			getAllRecords++
		}
	}
	for _, m := range Model.Messages {
		if m.Extra {
			extras++
		} else {
			msgs++
		}
		if m.Async {
			async++
		}
	}
	if fields != 922 || wantFields != 922 {
		t.Errorf("public fields: %d (json %d), want 922", fields, wantFields)
	}
	if msgs != 2007 || wantMsgs != 2007 {
		t.Errorf("messages: %d (json %d), want 2007", msgs, wantMsgs)
	}
	// get_all_where and get_all_records_where for each class with
	// get_all_records, less message.get_all_records_where which is published.
	if want := 2*getAllRecords - 1; extras != want {
		t.Errorf("extra messages: %d, want %d", extras, want)
	}
	if len(Model.Enums) != len(dm.Enums) {
		t.Errorf("enums: %d, want %d", len(Model.Enums), len(dm.Enums))
	}
	// Two self-relations (subject.roles, role.subroles) are plain sets.
	if len(Model.Relations) != len(dm.Relations)-2 {
		t.Errorf("relations: %d, want %d", len(Model.Relations), len(dm.Relations)-2)
	}
	t.Logf("%d classes, %d fields, %d messages + %d extras, %d with Async, %d relations", len(Model.Classes), fields, msgs, extras, async, len(Model.Relations))
}

func TestLookupsAndMetadata(t *testing.T) {
	vm := Model.Class("VM")
	if vm == nil || Model.ClassFold("vm") != vm || VM.Class != vm {
		t.Fatal("VM class lookup")
	}
	if f := vm.Field("name__label"); f == nil || f != vm.Field("name_label") || f.Column != "name__label" || f != VM.NameLabel {
		t.Fatalf("name_label column: %+v", f)
	}
	if VM.MemoryStaticMax.Column != "memory__static_max" || VM.PowerState.Column != "power_state" {
		t.Error("namespaced columns")
	}
	if VM.PowerState.Type.Kind != schema.KEnum || VM.PowerState.Default != "Halted" {
		t.Errorf("power_state: %v %v", VM.PowerState.Type, VM.PowerState.Default)
	}
	if VBD.VM.Inverse != VM.VBDs || !VM.VBDs.Derived || VM.VBDs.Persist || !VBD.VM.Persist {
		t.Error("VBD.VM <-> VM.VBDs relation")
	}
	if !VM.Groups.ManyToMany || VM.Groups.Inverse != VMGroup.VMs {
		t.Error("VM.groups <-> VM_group.VMs")
	}
	if Task.Session.Internal != true || Session.Tasks.Inverse != Task.Session {
		t.Error("internal task.session drives session.tasks")
	}
	start := Model.Message("VM.start")
	if start == nil || !start.Async || start.Implicit || !start.TakesSession || start.Roles.Has(schema.RoleReadOnly) || !start.Roles.Has(schema.RoleVMOperator) {
		t.Errorf("VM.start: %+v", start)
	}
	if m := Model.Message("VM.get_record"); m == nil || m.Async || !m.Roles.Has(schema.RoleReadOnly) {
		t.Error("VM.get_record")
	}
	if m := Model.Message("session.login_with_password"); m == nil || m.Async || m.TakesSession {
		t.Error("session.login_with_password")
	}
	if m := Model.Message("VM.get_all_records_where"); m == nil || !m.Extra || m.Result.Kind != schema.KMap {
		t.Error("VM.get_all_records_where")
	}
	if m := Model.Message("VM.destroy"); m == nil || !m.Async {
		t.Error("Async.VM.destroy")
	}
}

func TestRecordRowRoundTrip(t *testing.T) {
	for _, c := range Model.Classes {
		row := mapToRow(c, map[string]any{})
		for i, f := range c.Fields {
			if err := schema.Check(f.Type, row[i]); err != nil {
				t.Errorf("%s.%s default: %v", c.Name, f.Name, err)
			}
		}
	}
	r := &VMRecord{UUID: "u", NameLabel: "vm1", PowerState: VMPowerStateRunning, VBDs: []VBDRef{"OpaqueRef:a"},
		OtherConfig: map[string]string{"k": "v"}, MemoryStaticMax: 1 << 30, HVMShadowMultiplier: 1.5,
		BlockedOperations: map[VMOperations]string{VMOperationsStart: "no"}}
	row := r.Row()
	if len(row) != len(VM.Class.Fields) {
		t.Fatal("row length")
	}
	for i, f := range VM.Class.Fields {
		if f.Type.Kind == schema.KEnum {
			continue // a zero-valued record leaves enums empty
		}
		if err := schema.Check(f.Type, row[i]); err != nil {
			t.Errorf("%s: %v", f.Name, err)
		}
	}
	var back VMRecord
	back.FromRow(row)
	if back.NameLabel != "vm1" || back.PowerState != VMPowerStateRunning || back.VBDs[0] != "OpaqueRef:a" ||
		back.OtherConfig["k"] != "v" || back.MemoryStaticMax != 1<<30 || back.BlockedOperations[VMOperationsStart] != "no" {
		t.Errorf("round trip: %+v", back)
	}
	if m := r.Map(); m["name_label"] != "vm1" || VMRecordFromMap(m).NameLabel != "vm1" {
		t.Error("map round trip")
	}
}

func TestErrorCodesArePublished(t *testing.T) {
	b, err := os.ReadFile("errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var published map[string][]string
	if err := json.Unmarshal(b, &published); err != nil {
		t.Fatal(err)
	}
	for _, code := range xerr.Codes {
		if _, ok := published[code]; !ok {
			t.Errorf("%s is not a published error code", code)
		}
	}
}
