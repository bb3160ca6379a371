package clients

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"toolstackd/internal/testkit/testdaemon"
)

// rpc is a root session on a test daemon with helpers that fail the test.
type rpc struct {
	t *testing.T
	c *testdaemon.Client
	s string
}

func newRPC(t *testing.T, d *testdaemon.Daemon) *rpc { return &rpc{t: t, c: d.Client(), s: d.Login(t)} }

// call makes a call with the session first and decodes its result into out
// (when not nil).
func (r *rpc) call(out any, method string, args ...any) {
	r.t.Helper()
	raw, err := r.c.Call(method, append([]any{r.s}, args...)...)
	if err != nil {
		r.t.Fatalf("%s: %v", method, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			r.t.Fatalf("%s: %.300s: %v", method, raw, err)
		}
	}
}

func (r *rpc) str(method string, args ...any) string {
	r.t.Helper()
	var s string
	r.call(&s, method, args...)
	return s
}

func (r *rpc) record(class, ref string) map[string]any {
	r.t.Helper()
	var rec map[string]any
	r.call(&rec, class+".get_record", ref)
	return rec
}

// fails makes a call that must fail with code, and returns the error's
// parameters.
func (r *rpc) fails(code, method string, args ...any) []string {
	r.t.Helper()
	raw, err := r.c.Call(method, append([]any{r.s}, args...)...)
	e, ok := testdaemon.AsError(err)
	if !ok || e.Code != code {
		r.t.Fatalf("%s: %.200s %v, want %s", method, raw, err, code)
	}
	return e.Params
}

func (r *rpc) refs(method string, args ...any) []string {
	r.t.Helper()
	var out []string
	r.call(&out, method, args...)
	slices.Sort(out)
	return out
}

// defaultSR is the pool's default SR and its uuid.
func (r *rpc) defaultSR() (string, string) {
	r.t.Helper()
	pool := r.refs("pool.get_all")[0]
	sr := r.str("pool.get_default_SR", pool)
	return sr, r.str("SR.get_uuid", sr)
}

func (r *rpc) template(prefix string) string {
	r.t.Helper()
	var all map[string]map[string]any
	r.call(&all, "VM.get_all_records")
	var names []string
	for ref, rec := range all {
		if rec["is_a_template"] == true && strings.HasPrefix(rec["name_label"].(string), prefix) {
			names = append(names, ref)
		}
	}
	if len(names) != 1 {
		r.t.Fatalf("%d templates called %s...", len(names), prefix)
	}
	return names[0]
}

// TestSDKInstallProvision follows the XenServer SDK's install.py: clone a
// Debian template, add a VIF, rewrite the template's disk spec with the
// default SR's uuid as provision.py does (minidom's pretty print, which
// drops the type attribute), provision and start.
func TestSDKInstallProvision(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	r := newRPC(t, d)
	tpl := r.template("Debian")
	var oc map[string]string
	r.call(&oc, "VM.get_other_config", tpl)
	if !strings.Contains(oc["disks"], `device="0"`) || !strings.Contains(oc["disks"], `bootable="true"`) {
		t.Fatalf("template's disks: %q", oc["disks"])
	}
	vm := r.str("VM.clone", tpl, "new")
	var net []string
	r.call(&net, "network.get_all")
	r.call(nil, "VIF.create", map[string]any{"device": "0", "network": net[0], "VM": vm, "MAC": "", "MTU": "1500",
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]any{}, "other_config": map[string]any{}})
	r.call(nil, "VM.set_PV_args", vm, "non-interactive")
	sr, srUUID := r.defaultSR()
	// The SR of a test may sit on a small disk: a 10 GiB thin disk needs
	// overprovisioning to be promised there.
	r.call(nil, "SR.add_to_sm_config", sr, "overprovision", "true")
	r.call(&oc, "VM.get_other_config", vm)
	size := regexp.MustCompile(`size="(\d+)"`).FindStringSubmatch(oc["disks"])
	if size == nil {
		t.Fatalf("clone's disks: %q", oc["disks"])
	}
	spec := fmt.Sprintf("<?xml version=\"1.0\" ?>\n<provision>\n\t<disk bootable=\"true\" device=\"0\" size=\"%s\" sr=\"%s\"/>\n</provision>\n",
		size[1], srUUID)
	r.call(nil, "VM.remove_from_other_config", vm, "disks")
	r.call(nil, "VM.add_to_other_config", vm, "disks", spec)
	vdisBefore := r.refs("VDI.get_all")
	r.call(nil, "VM.provision", vm)

	rec := r.record("VM", vm)
	if rec["is_a_template"] != false {
		t.Fatal("still a template after provision")
	}
	if _, ok := rec["other_config"].(map[string]any)["disks"]; ok {
		t.Error("other_config:disks kept after provision")
	}
	vbds := rec["VBDs"].([]any)
	if len(vbds) != 1 {
		t.Fatalf("VBDs %v", vbds)
	}
	vbd := r.record("VBD", vbds[0].(string))
	if vbd["userdevice"] != "0" || vbd["bootable"] != true || vbd["mode"] != "RW" || vbd["type"] != "Disk" || vbd["unpluggable"] != false {
		t.Errorf("VBD %v", vbd)
	}
	if _, ok := vbd["other_config"].(map[string]any)["owner"]; !ok {
		t.Errorf("VBD other_config %v: no owner", vbd["other_config"])
	}
	vdi := r.record("VDI", vbd["VDI"].(string))
	if vdi["SR"] != sr || fmt.Sprintf("%.0f", vdi["virtual_size"]) != size[1] || vdi["type"] != "system" ||
		vdi["name_label"] != "0" || vdi["name_description"] != "Created by template provisioner" ||
		vdi["sm_config"].(map[string]any)["vmhint"] != rec["uuid"] {
		t.Errorf("VDI %v", vdi)
	}
	if after := r.refs("VDI.get_all"); len(after) != len(vdisBefore)+1 {
		t.Errorf("%d VDIs before, %d after", len(vdisBefore), len(after))
	}
	r.call(nil, "VM.start", vm, false, true)
	if p := r.str("VM.get_power_state", vm); p != "Running" {
		t.Fatalf("power state %s", p)
	}
	r.call(nil, "VM.hard_shutdown", vm)

	// xe vm-install's form: the template's own spec with sr="" goes to
	// the pool's default SR.
	vm2 := r.str("VM.clone", tpl, "second")
	r.call(nil, "VM.provision", vm2)
	vbd2 := r.record("VBD", r.record("VM", vm2)["VBDs"].([]any)[0].(string))
	if r.str("VDI.get_SR", vbd2["VDI"].(string)) != sr {
		t.Error("an empty sr did not mean the default SR")
	}
}

// TestProvisionBadSpecs: specs that are not ones, or that cannot be
// honoured, fail with xapi's codes and leave no disk behind and the
// template a template.
func TestProvisionBadSpecs(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	r := newRPC(t, d)
	tpl := r.template("Debian")
	_, srUUID := r.defaultSR()
	disk := func(dev, size, sr string) string {
		return fmt.Sprintf(`<disk device="%s" size="%s" sr="%s" bootable="false" type="user"/>`, dev, size, sr)
	}
	missing := "00000000-0000-0000-0000-000000000000"
	for _, tc := range []struct {
		name, spec, code string
		params           []string
	}{
		{"not XML", `<provision><disk`, "INTERNAL_ERROR", nil},
		{"wrong root", `<disks/>`, "INTERNAL_ERROR", nil},
		{"no size", `<provision><disk device="0" sr="" bootable="true"/></provision>`, "INTERNAL_ERROR", nil},
		{"bad size", "<provision>" + disk("0", "ten", "") + "</provision>", "INTERNAL_ERROR", nil},
		{"negative size", "<provision>" + disk("0", "-5", "") + "</provision>", "INTERNAL_ERROR", nil},
		{"entity", `<!DOCTYPE p [<!ENTITY x "y">]><provision/>`, "INTERNAL_ERROR", nil},
		{"unknown SR", "<provision>" + disk("0", "1048576", srUUID) + disk("1", "1048576", missing) + "</provision>",
			"UUID_INVALID", []string{"sr", missing}},
		{"same device twice", "<provision>" + disk("1", "1048576", "") + disk("1", "1048576", "") + "</provision>",
			"DEVICE_ALREADY_EXISTS", []string{"1"}},
		{"same device written two ways", "<provision>" + disk("1", "1048576", "") + disk("01", "1048576", "") + "</provision>",
			"DEVICE_ALREADY_EXISTS", []string{"1"}},
		{"device name", "<provision>" + disk("xvda", "1048576", "") + "</provision>", "INVALID_DEVICE", []string{"xvda"}},
		{"device out of range", "<provision>" + disk("999", "1048576", "") + "</provision>", "INVALID_DEVICE", []string{"999"}},
		// The first disk is made, the second cannot be: the first goes.
		{"second disk too big", "<provision>" + disk("0", "1048576", "") + disk("1", "4611686018427387904", "") + "</provision>",
			"", nil},
		{"too many disks", "<provision>" + strings.Repeat(disk("0", "1", ""), 100) + "</provision>", "INTERNAL_ERROR", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.t = t
			vm := r.str("VM.clone", tpl, "bad-"+tc.name)
			r.call(nil, "VM.remove_from_other_config", vm, "disks")
			r.call(nil, "VM.add_to_other_config", vm, "disks", tc.spec)
			before := r.refs("VDI.get_all")
			raw, err := r.c.Call("VM.provision", r.s, vm)
			e, ok := testdaemon.AsError(err)
			switch {
			case !ok:
				t.Fatalf("provision: %s %v, want a XenAPI error", raw, err)
			case tc.code != "" && (e.Code != tc.code || tc.params != nil && !slices.Equal(e.Params, tc.params)):
				t.Fatalf("provision: %v, want %s %v", e, tc.code, tc.params)
			}
			t.Logf("provision: %v", e)
			if after := r.refs("VDI.get_all"); !slices.Equal(after, before) {
				t.Errorf("VDIs changed: %d before, %d after", len(before), len(after))
			}
			rec := r.record("VM", vm)
			if rec["is_a_template"] != true || len(rec["VBDs"].([]any)) != 0 || rec["other_config"].(map[string]any)["disks"] != tc.spec {
				t.Errorf("after a failed provision: template %v, VBDs %v, disks %v", rec["is_a_template"], rec["VBDs"],
					rec["other_config"].(map[string]any)["disks"])
			}
			if ops := rec["current_operations"].(map[string]any); len(ops) != 0 {
				t.Errorf("current_operations %v", ops)
			}
			r.call(nil, "VM.destroy", vm)
		})
	}
	r.t = t
	// Only a template is provisioned.
	vm := r.str("VM.clone", tpl, "twice")
	r.call(nil, "VM.provision", vm)
	r.fails("PROVISION_ONLY_ALLOWED_ON_TEMPLATE", "VM.provision", vm)
	if !d.Alive() {
		t.Fatal("the daemon died")
	}
}

// TestTemplateSpecAfterUpgrade: a database whose built-in templates have
// no provisioning spec (one made before they had) gets it back when the
// daemon starts on it; a spec an administrator changed is kept.
func TestTemplateSpecAfterUpgrade(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	r := newRPC(t, d)
	debian, ubuntu := r.template("Debian"), r.template("Ubuntu")
	var oc map[string]string
	r.call(&oc, "VM.get_other_config", debian)
	spec := oc["disks"]
	custom := `<provision><disk device="0" size="1073741824" sr="" bootable="true" type="system"/></provision>`
	r.call(nil, "VM.remove_from_other_config", debian, "disks")
	r.call(nil, "VM.remove_from_other_config", ubuntu, "disks")
	r.call(nil, "VM.add_to_other_config", ubuntu, "disks", custom)
	d = d.Restart()
	r = newRPC(t, d)
	r.call(&oc, "VM.get_other_config", debian)
	if oc["disks"] != spec {
		t.Errorf("Debian's spec after restart: %q, want %q", oc["disks"], spec)
	}
	r.call(&oc, "VM.get_other_config", ubuntu)
	if oc["disks"] != custom {
		t.Errorf("Ubuntu's changed spec after restart: %q", oc["disks"])
	}
}
