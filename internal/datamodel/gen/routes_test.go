package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"toolstackd/internal/datamodel"
)

// TestRoutesRejectBadData: an entry naming anything the model does not
// have stops the generator.
func TestRoutesRejectBadData(t *testing.T) {
	m := datamodel.Model
	for _, tc := range []struct {
		name  string
		entry map[string]jsonRoute
		class map[string]jsonRoute
		want  string
	}{
		{"unknown message", map[string]jsonRoute{"VM.fly": {Route: "coordinator"}}, nil, `no message "VM.fly"`},
		{"unknown class", nil, map[string]jsonRoute{"spaceship": {Route: "local"}}, `no class "spaceship"`},
		{"unknown kind", map[string]jsonRoute{"VM.start": {Route: "somewhere"}}, nil, `unknown route "somewhere"`},
		{"unknown parameter", map[string]jsonRoute{"VM.start": {Route: "placement", Targets: []string{"vmm"}}}, nil, `no parameter "vmm"`},
		{"unknown field", map[string]jsonRoute{"PBD.plug": {Route: "object_host", Targets: []string{"self.hots"}}}, nil, `PBD has no field "hots"`},
		{"not a ref", map[string]jsonRoute{"PBD.plug": {Route: "object_host", Targets: []string{"self.uuid"}}}, nil, "not a ref"},
		{"wrong class", map[string]jsonRoute{"PBD.plug": {Route: "object_host", Targets: []string{"self.SR"}}}, nil, "ends at SR"},
		{"missing target", map[string]jsonRoute{"host.reboot": {Route: "host_arg"}}, nil, "takes 1 targets"},
		{"bad op", map[string]jsonRoute{"VM.start": {Route: "placement", Targets: []string{"vm"}, Marks: []string{"vm:fly"}}}, nil, `"fly" is not a vm_operations`},
		{"no current_operations", map[string]jsonRoute{"PBD.plug": {Route: "object_host", Targets: []string{"self.host"}, Marks: []string{"self:plug"}}}, nil, "PBD has no current_operations"},
		{"bad coordinator_if", map[string]jsonRoute{"SR.create": {Route: "host_arg", Targets: []string{"host"}, CoordinatorIf: "name_label"}}, nil, "not a bool parameter"},
		{"else off vm_resident", map[string]jsonRoute{"SR.scan": {Route: "sr_plugged", Targets: []string{"sr"}, Else: "sr_access"}}, nil, "only for vm_resident"},
	} {
		jr := &jsonRoutes{Default: jsonRoute{Route: "coordinator"}, Messages: tc.entry, Classes: tc.class}
		_, err := buildRoutes(m, jr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	// The default alone routes every message, and so does the checked-in
	// data.
	routes, err := buildRoutes(m, &jsonRoutes{Default: jsonRoute{Route: "coordinator"}})
	if err != nil || len(routes) != len(m.Messages) {
		t.Fatalf("default only: %d routes, %v", len(routes), err)
	}
	b, err := os.ReadFile("../routes.json")
	if err != nil {
		t.Fatal(err)
	}
	var jr jsonRoutes
	if err := json.Unmarshal(b, &jr); err != nil {
		t.Fatal(err)
	}
	if routes, err = buildRoutes(m, &jr); err != nil || len(routes) != len(m.Messages) {
		t.Fatalf("routes.json: %d routes, %v", len(routes), err)
	}
}
