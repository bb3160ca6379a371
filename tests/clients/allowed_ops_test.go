package clients

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/testkit/testdaemon"
)

// opsChecker reads every object's allowed_operations and
// current_operations, from event.from as they change and from
// get_all_records at the end, and holds them to the values xapi
// publishes (typed clients generated from xapi's datamodel refuse a
// record with a value they do not know).
type opsChecker struct {
	r      *rpc
	token  string
	seen   map[string]int // class -> records checked
	values map[string]map[string]bool
}

func (o *opsChecker) check(class, ref string, rec map[string]any) {
	t := o.r.t
	t.Helper()
	if _, ok := rec["allowed_operations"]; !ok {
		return
	}
	o.seen[class]++
	if o.values[class] == nil {
		o.values[class] = map[string]bool{}
	}
	allowed, _ := rec["allowed_operations"].([]any)
	for _, v := range allowed {
		o.values[class]["allowed:"+fmt.Sprint(v)] = true
		if s, _ := v.(string); !dm.PublishedAllowedOp(class, s) {
			t.Errorf("%s %s: allowed_operations holds %v, which xapi never lists", class, ref, v)
		}
	}
	current, _ := rec["current_operations"].(map[string]any)
	for _, v := range current {
		o.values[class]["current:"+fmt.Sprint(v)] = true
		if s, _ := v.(string); !dm.PublishedCurrentOp(class, s) {
			t.Errorf("%s %s: current_operations holds %v, which xapi never writes", class, ref, v)
		}
	}
}

// events checks every record event.from reports since the last call.
func (o *opsChecker) events() {
	o.r.t.Helper()
	var batch struct {
		Events []struct {
			Class     string         `json:"class"`
			Operation string         `json:"operation"`
			Ref       string         `json:"ref"`
			Snapshot  map[string]any `json:"snapshot"`
		} `json:"events"`
		Token string `json:"token"`
	}
	o.r.call(&batch, "event.from", []string{"*"}, o.token, 0.0)
	o.token = batch.Token
	for _, e := range batch.Events {
		if e.Snapshot != nil {
			o.check(canonicalClass(e.Class), e.Ref, e.Snapshot)
		}
	}
}

// canonicalClass is a class's name as the datamodel spells it (event.from
// writes it in lower case).
func canonicalClass(name string) string {
	if c := dm.Model.ClassFold(name); c != nil {
		return c.Name
	}
	return name
}

// all checks every record of every class that has allowed_operations.
func (o *opsChecker) all() {
	o.r.t.Helper()
	for _, class := range dm.PublishedOpClasses() {
		var recs map[string]map[string]any
		raw, err := o.r.c.Call(class+".get_all_records", o.r.s)
		if err != nil {
			o.r.t.Fatalf("%s.get_all_records: %v", class, err)
		}
		if err := json.Unmarshal(raw, &recs); err != nil {
			o.r.t.Fatalf("%s.get_all_records: %v", class, err)
		}
		for ref, rec := range recs {
			o.check(class, ref, rec)
		}
	}
}

// TestAllowedOperationsArePublished: after the usual activity (a VM
// installed from a template, disks made, attached, copied, the VM
// started, paused, a CD inserted, tasks), every allowed_operations and
// current_operations ever reported holds only values xapi publishes.
func TestAllowedOperationsArePublished(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	r := newRPC(t, d)
	o := &opsChecker{r: r, seen: map[string]int{}, values: map[string]map[string]bool{}}
	o.events()

	sr, _ := r.defaultSR()
	r.call(nil, "SR.add_to_sm_config", sr, "overprovision", "true")
	vm := r.str("VM.clone", r.template("Debian"), "ops")
	r.call(nil, "VM.provision", vm)
	var nets []string
	r.call(&nets, "network.get_all")
	r.call(nil, "VIF.create", map[string]any{"device": "0", "network": nets[0], "VM": vm, "MAC": "", "MTU": "1500",
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]any{}, "other_config": map[string]any{}})
	mem := fmt.Sprint(256 << 20)
	r.call(nil, "VM.set_memory_limits", vm, mem, mem, mem, mem)
	cd := r.str("VBD.create", map[string]any{"VM": vm, "VDI": "OpaqueRef:NULL", "userdevice": "3", "bootable": false,
		"mode": "RO", "type": "CD", "empty": true, "other_config": map[string]any{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]any{}})
	data := r.str("VDI.create", map[string]any{"name_label": "data", "name_description": "", "SR": sr,
		"virtual_size": 64 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]any{},
		"xenstore_data": map[string]any{}, "sm_config": map[string]any{}, "tags": []any{}})
	o.events()
	r.call(nil, "VBD.create", map[string]any{"VM": vm, "VDI": data, "userdevice": "1", "bootable": false,
		"mode": "RW", "type": "Disk", "empty": false, "other_config": map[string]any{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]any{}})
	o.events()

	// A copy that takes a while, watched as it runs: the SR and the VDI
	// are marked meanwhile.
	task := r.str("Async.VDI.copy", data, sr)
	deadline := time.Now().Add(30 * time.Second)
	for r.str("task.get_status", task) == "pending" {
		o.events()
		o.check("VDI", data, r.record("VDI", data))
		o.check("SR", sr, r.record("SR", sr))
		if time.Now().After(deadline) {
			t.Fatal("VDI.copy did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := r.str("task.get_status", task); st != "success" {
		t.Fatalf("VDI.copy: %s %v", st, r.record("task", task)["error_info"])
	}
	r.call(nil, "VDI.snapshot", data, map[string]any{})
	o.events()

	r.call(nil, "VM.start", vm, false, true)
	o.events()
	var vbds []string
	r.call(&vbds, "VM.get_VBDs", vm)
	for _, vbd := range vbds {
		o.check("VBD", vbd, r.record("VBD", vbd))
	}
	r.call(nil, "VM.pause", vm)
	o.events()
	r.call(nil, "VM.unpause", vm)
	r.call(nil, "VBD.unplug", cd)
	o.events()
	r.call(nil, "VM.hard_shutdown", vm)
	o.events()
	r.call(nil, "VM.snapshot", vm, "snap")
	o.events()
	o.all()

	// The classes that matter were seen, with the values clients look
	// for.
	for _, c := range []string{"VM", "VBD", "VIF", "VDI", "SR", "host", "pool", "task", "network"} {
		if o.seen[c] == 0 {
			t.Errorf("no %s record was checked", c)
		}
	}
	for class, want := range map[string][]string{"VM": {"allowed:start", "allowed:hard_shutdown"},
		"SR": {"allowed:vdi_create", "allowed:scan"}, "VDI": {"allowed:clone", "allowed:destroy"},
		"VBD": {"allowed:attach"}, "task": {"allowed:cancel"}} {
		for _, v := range want {
			if !o.values[class][v] {
				var have []string
				for h := range o.values[class] {
					have = append(have, h)
				}
				t.Errorf("%s never showed %s (saw %s)", class, v, strings.Join(have, " "))
			}
		}
	}
	t.Logf("records checked: %v; SR %v; VDI %v", o.seen, o.values["SR"], o.values["VDI"])
}
