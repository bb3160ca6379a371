package datamodel

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"toolstackd/internal/schema"
)

// TestEveryMessageHasARoute: the generated table covers the 2007
// published messages and the get_all_where variants, and nothing else.
func TestEveryMessageHasARoute(t *testing.T) {
	published, extra := 0, 0
	counts := map[schema.RouteKind]int{}
	for _, m := range Model.Messages {
		r := RouteOf(m)
		if r == nil {
			t.Errorf("%s has no route", m.Wire)
			continue
		}
		counts[r.Kind]++
		if m.Extra {
			extra++
		} else {
			published++
		}
	}
	if published != 2007 || extra == 0 {
		t.Errorf("routed %d published messages and %d extras, want 2007 and some", published, extra)
	}
	if len(routes) != len(Model.Messages) {
		t.Errorf("the table has %d routes for %d messages", len(routes), len(Model.Messages))
	}
	for wire := range routes {
		if Model.Message(wire) == nil {
			t.Errorf("route for unknown message %s", wire)
		}
	}
	for _, k := range schema.RouteKinds() {
		t.Logf("%-15s %4d", k, counts[k])
	}
}

// TestRoutesJSONIsInTheTable: each entry of routes.json is what the table
// holds for its message (the generator ran on this data).
func TestRoutesJSONIsInTheTable(t *testing.T) {
	var data struct {
		Messages map[string]struct {
			Route   string
			Targets []string
			Marks   []string
		}
	}
	b, err := os.ReadFile("routes.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &data); err != nil {
		t.Fatal(err)
	}
	if len(data.Messages) < 200 {
		t.Fatalf("routes.json lists %d messages", len(data.Messages))
	}
	for wire, e := range data.Messages {
		m := Model.Message(wire)
		if m == nil {
			t.Errorf("routes.json names unknown message %s", wire)
			continue
		}
		r := RouteOf(m)
		var targets, marks []string
		for _, p := range r.Targets {
			targets = append(targets, string(p))
		}
		for _, mk := range r.Marks {
			marks = append(marks, string(mk.On)+":"+mk.Op)
		}
		if r.Kind.String() != e.Route || !slices.Equal(targets, e.Targets) || !slices.Equal(marks, e.Marks) {
			t.Errorf("%s: table has %s %v %v, routes.json %s %v %v", wire, r.Kind, targets, marks, e.Route, e.Targets, e.Marks)
		}
	}
}

// TestGoldenRoutes spot-checks rules taken from xapi's message forwarding.
func TestGoldenRoutes(t *testing.T) {
	for _, tc := range []struct {
		wire    string
		kind    schema.RouteKind
		targets []schema.Path
		marks   []schema.Mark
	}{
		{"VM.start", schema.RoutePlacement, []schema.Path{"vm"},
			[]schema.Mark{{On: "vm", Op: "start"}, {On: "vm.VBDs", Op: "attach"}, {On: "vm.VIFs", Op: "attach"}, {On: "$target", Op: "vm_start"}}},
		{"VM.clean_shutdown", schema.RouteVMResident, []schema.Path{"vm"}, []schema.Mark{{On: "vm", Op: "clean_shutdown"}}},
		{"VM.clone", schema.RouteSRAccess, []schema.Path{"vm"}, []schema.Mark{{On: "vm", Op: "clone"}}},
		{"host.reboot", schema.RouteHostArg, []schema.Path{"host"}, []schema.Mark{{On: "host", Op: "reboot"}}},
		{"SR.scan", schema.RouteSRPlugged, []schema.Path{"sr"}, []schema.Mark{{On: "sr", Op: "scan"}}},
		{"SR.destroy", schema.RouteSRAllPBDs, []schema.Path{"sr"}, []schema.Mark{{On: "sr", Op: "destroy"}}},
		{"PBD.plug", schema.RouteObjectHost, []schema.Path{"self.host"}, []schema.Mark{{On: "self.SR", Op: "plug"}}},
		{"task.cancel", schema.RouteTaskForwarded, []schema.Path{"task"}, nil},
		{"session.login_with_password", schema.RouteLocal, nil, nil},
		{"event.from", schema.RouteLocal, nil, nil},
		{"host.emergency_ha_disable", schema.RouteLocal, nil, nil},
		{"VM.get_record", schema.RouteCoordinator, nil, nil},
		{"VM.set_name_label", schema.RouteCoordinator, nil, nil},
		{"VM.get_all_records_where", schema.RouteCoordinator, nil, nil},
		{"VDI.create", schema.RouteSRPlugged, []schema.Path{"args.SR"}, []schema.Mark{{On: "args.SR", Op: "vdi_create"}}},
	} {
		r := RouteOf(Model.Message(tc.wire))
		if r.Kind != tc.kind || !slices.Equal(r.Targets, tc.targets) || !slices.Equal(r.Marks, tc.marks) {
			t.Errorf("%s: %s %v %v, want %s %v %v", tc.wire, r.Kind, r.Targets, r.Marks, tc.kind, tc.targets, tc.marks)
		}
	}
	if r := RouteOf(Model.Message("VM.hard_shutdown")); r.Else != schema.RouteSRAccess {
		t.Errorf("VM.hard_shutdown of a suspended VM: else %s, want sr_access", r.Else)
	}
	if r := RouteOf(Model.Message("SR.create")); r.CoordinatorIf != "shared" {
		t.Errorf("SR.create: coordinator_if %q, want shared", r.CoordinatorIf)
	}
}
