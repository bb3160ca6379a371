package xenops_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/xenops"
	"toolstackd/internal/xenops/sim"
	"toolstackd/internal/xerr"
)

func simEnv(t *testing.T, sc sim.Config, tweak ...func(*xenops.Config)) *env {
	cfg := xenops.Config{Backend: "simulator", Sim: sc}
	for _, f := range tweak {
		f(&cfg)
	}
	return newEnv(t, cfg, envOptions{})
}

func (e *env) sim() *sim.Simulator { return e.m.Backend().(*sim.Simulator) }

func TestSimLifecycle(t *testing.T) {
	e := simEnv(t, sim.Config{})
	vm := e.newVM("life", nil)
	e.addVIF(vm, "0")
	// allowed_operations of a new VM is filled in as soon as it exists.
	var ops []string
	eventually(t, time.Second, "allowed_operations of a new VM", func() bool {
		ops = strSet(e.field("VM", vm, "allowed_operations"))
		return contains(ops, "start")
	})
	if contains(ops, "pause") {
		t.Fatalf("halted VM allowed_operations %v", ops)
	}

	e.call("VM.start", vm, false, false)
	rec := e.record("VM", vm)
	if rec["power_state"] != "Running" || rec["resident_on"] != e.host || rec["domid"].(float64) < 1 {
		t.Fatalf("after start: %v %v %v", rec["power_state"], rec["resident_on"], rec["domid"])
	}
	ops = strSet(rec["allowed_operations"])
	for _, o := range []string{"pause", "clean_shutdown", "hard_shutdown", "hard_reboot", "suspend", "checkpoint"} {
		if !contains(ops, o) {
			t.Errorf("running VM lacks %s in allowed_operations %v", o, ops)
		}
	}
	if contains(ops, "start") {
		t.Errorf("running VM allows start: %v", ops)
	}
	if len(strSet(rec["consoles"])) != 2 {
		t.Errorf("consoles %v", rec["consoles"])
	}
	metrics := e.record("VM_metrics", rec["metrics"].(string))
	if metrics["VCPUs_number"].(float64) != 1 || metrics["memory_actual"].(float64) != 128<<20 {
		t.Errorf("metrics %v", metrics)
	}
	vif := strSet(rec["VIFs"])[0]
	if e.field("VIF", vif, "currently_attached") != true || e.field("VIF", vif, "MAC") == "" {
		t.Errorf("VIF after start: %v", e.record("VIF", vif))
	}
	domid := rec["domid"].(float64)

	e.call("VM.pause", vm)
	if p := e.power(vm); p != "Paused" {
		t.Fatalf("after pause: %s", p)
	}
	e.call("VM.unpause", vm)
	if p := e.power(vm); p != "Running" {
		t.Fatalf("after unpause: %s", p)
	}
	e.call("VM.suspend", vm)
	if p := e.power(vm); p != "Suspended" {
		t.Fatalf("after suspend: %s", p)
	}
	img := filepath.Join(e.dir, "xenops", "suspend", e.field("VM", vm, "uuid").(string)+".img")
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("suspend image: %v", err)
	}
	if e.field("VIF", vif, "currently_attached") != false || len(strSet(e.field("VM", vm, "consoles"))) != 0 {
		t.Error("suspended VM keeps devices attached or consoles")
	}
	e.call("VM.resume", vm, false, false)
	if p := e.power(vm); p != "Running" {
		t.Fatalf("after resume: %s", p)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("suspend image left after resume: %v", err)
	}
	e.call("VM.hard_reboot", vm)
	if d := e.field("VM", vm, "domid").(float64); d == domid || e.power(vm) != "Running" {
		t.Fatalf("hard_reboot: domid %v (was %v), %s", d, domid, e.power(vm))
	}
	e.call("VM.clean_reboot", vm)
	if e.power(vm) != "Running" {
		t.Fatal("clean_reboot")
	}
	e.call("VM.clean_shutdown", vm)
	rec = e.record("VM", vm)
	if rec["power_state"] != "Halted" || rec["resident_on"] != "OpaqueRef:NULL" || rec["domid"].(float64) != -1 {
		t.Fatalf("after clean_shutdown: %v %v %v", rec["power_state"], rec["resident_on"], rec["domid"])
	}
	e.call("VM.start", vm, true, false)
	if p := e.power(vm); p != "Paused" {
		t.Fatalf("start paused: %s", p)
	}
	e.call("VM.hard_shutdown", vm)
	if p := e.power(vm); p != "Halted" {
		t.Fatalf("after hard_shutdown: %s", p)
	}
	e.call("VM.start", vm, false, false)
	e.call("VM.shutdown", vm)
	if p := e.power(vm); p != "Halted" {
		t.Fatalf("after shutdown: %s", p)
	}
	if n := len(e.sim().List()); n != 0 {
		t.Fatalf("%d domains left", n)
	}
	if cur := e.field("VM", vm, "current_operations").(map[string]any); len(cur) != 0 {
		t.Fatalf("current_operations %v", cur)
	}
	e.call("VM.destroy", vm)
	if x := e.try("VM.get_record", vm); x == nil || x.Code != "HANDLE_INVALID" {
		t.Fatalf("VM still there after destroy: %v", x)
	}
}

func TestSimBadInput(t *testing.T) {
	e := simEnv(t, sim.Config{})
	tpl := e.template("Other install media")
	p := e.fails("VM_IS_TEMPLATE", "VM.start", tpl, false, false)
	if p[0] != tpl || p[1] != "start" {
		t.Errorf("VM_IS_TEMPLATE params %v", p)
	}
	vm := e.newVM("bad", nil)
	e.call("VM.start", vm, false, false)
	p = e.fails("VM_BAD_POWER_STATE", "VM.start", vm, false, false)
	if len(p) != 3 || p[0] != vm || p[1] != "halted" || p[2] != "running" {
		t.Errorf("VM_BAD_POWER_STATE params %v", p)
	}
	p = e.fails("VM_BAD_POWER_STATE", "VM.unpause", vm)
	if p[1] != "paused" || p[2] != "running" {
		t.Errorf("unpause params %v", p)
	}
	e.call("VM.hard_shutdown", vm)
	p = e.fails("VM_BAD_POWER_STATE", "VM.hard_shutdown", vm)
	if p[1] != "paused, suspended, running" || p[2] != "halted" {
		t.Errorf("hard_shutdown params %v", p)
	}
	e.fails("VM_BAD_POWER_STATE", "VM.resume", vm, false, false)

	// Impossible memory and VCPUs.
	e.call("VM.set_memory_dynamic_min", vm, int64(256<<20))
	e.fails("MEMORY_CONSTRAINT_VIOLATION_ORDER", "VM.start", vm, false, false)
	e.fails("MEMORY_CONSTRAINT_VIOLATION_ORDER", "VM.set_memory_dynamic_range", vm, int64(200<<20), int64(100<<20))
	e.call("VM.set_memory_dynamic_range", vm, int64(96<<20), int64(128<<20))
	e.call("VM.set_VCPUs_max", vm, int64(4096))
	e.call("VM.set_VCPUs_at_startup", vm, int64(2))
	e.fails("VM_TOO_MANY_VCPUS", "VM.start", vm, false, false)
	e.call("VM.set_VCPUs_max", vm, int64(250))
	p = e.fails("HOST_NOT_ENOUGH_PCPUS", "VM.start", vm, false, false)
	if p[0] != "250" {
		t.Errorf("HOST_NOT_ENOUGH_PCPUS %v", p)
	}
	e.call("VM.set_VCPUs_max", vm, int64(1))
	e.fails("INVALID_VALUE", "VM.start", vm, false, false) // 2 at startup > 1 max
	e.call("VM.set_VCPUs_at_startup", vm, int64(0))
	e.fails("VM_NO_VCPUS", "VM.start", vm, false, false)
	e.call("VM.set_VCPUs_at_startup", vm, int64(1))

	// A VBD on a VDI that is gone.
	vdi := e.addVDI("gone", "/nonexistent/disk.img", 1<<20)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	p = e.fails("VDI_MISSING", "VM.start", vm, false, false)
	if p[1] != vdi {
		t.Errorf("VDI_MISSING %v", p)
	}
	e.call("VBD.destroy", vbd)

	// A backend that cannot start.
	e.sim().SetFail("check", xerr.New("FAILED_TO_START_EMULATOR", vm, "qemu", "simulated"))
	e.fails("FAILED_TO_START_EMULATOR", "VM.start", vm, false, false)
	e.sim().SetFail("check", nil)
	e.sim().SetFail("device-model", errors.New("boom"))
	e.fails("INTERNAL_ERROR", "VM.start", vm, false, false)
	e.sim().SetFail("device-model", nil)
	if n := len(e.sim().List()); n != 0 {
		t.Fatalf("failed starts left %d domains", n)
	}
	rec := e.record("VM", vm)
	if rec["power_state"] != "Halted" || len(rec["current_operations"].(map[string]any)) != 0 || !contains(strSet(rec["allowed_operations"]), "start") {
		t.Fatalf("after failed starts: %v %v %v", rec["power_state"], rec["current_operations"], rec["allowed_operations"])
	}
	e.call("VM.start", vm, false, false)
	e.fails("VM_BAD_POWER_STATE", "VM.destroy", vm)
	e.fails("INVALID_VALUE", "VM.set_VCPUs_number_live", vm, int64(9))
	e.fails("VM_IS_TEMPLATE", "VM.destroy", tpl)
	e.call("VM.hard_shutdown", vm)
	e.fails("PROVISION_ONLY_ALLOWED_ON_TEMPLATE", "VM.provision", vm)
}

func TestSimConcurrencyRules(t *testing.T) {
	e := simEnv(t, sim.Config{NoACPI: true})
	vm := e.newVM("busy", nil)
	e.call("VM.start", vm, false, false)
	e.setOC(vm, "clean_shutdown_timeout", "30")
	task := e.async("VM.clean_shutdown", vm)
	eventually(t, 5*time.Second, "clean_shutdown marked", func() bool {
		return len(e.field("VM", vm, "current_operations").(map[string]any)) == 1
	})
	p := e.fails("OTHER_OPERATION_IN_PROGRESS", "VM.pause", vm)
	if len(p) != 4 || p[0] != "VM" || p[1] != vm || p[2] != "clean_shutdown" || p[3] != task {
		t.Errorf("OTHER_OPERATION_IN_PROGRESS %v", p)
	}
	if ops := strSet(e.field("VM", vm, "allowed_operations")); contains(ops, "pause") || !contains(ops, "hard_shutdown") {
		t.Errorf("allowed_operations during clean_shutdown: %v", ops)
	}
	// hard_shutdown may run alongside, and cancels the clean one.
	start := time.Now()
	e.call("VM.hard_shutdown", vm)
	if time.Since(start) > 5*time.Second {
		t.Errorf("hard_shutdown took %v", time.Since(start))
	}
	st, info := e.wait(task, 10*time.Second)
	if st != "cancelled" || info[0] != "TASK_CANCELLED" {
		t.Errorf("clean_shutdown task: %s %v", st, info)
	}
	if e.power(vm) != "Halted" {
		t.Fatal("not halted")
	}
	// A clean shutdown the guest ignores times out.
	e.call("VM.start", vm, false, false)
	e.setOC(vm, "clean_shutdown_timeout", "0.3")
	p = e.fails("VM_SHUTDOWN_TIMEOUT", "VM.clean_shutdown", vm)
	if p[0] != vm || p[1] != "0.3" {
		t.Errorf("VM_SHUTDOWN_TIMEOUT %v", p)
	}
	if e.power(vm) != "Running" {
		t.Fatal("a timed-out clean shutdown must leave the VM running")
	}
	// ... unless the VM's policy says to fall back, or VM.shutdown.
	e.call("VM.shutdown", vm)
	if e.power(vm) != "Halted" {
		t.Fatal("VM.shutdown did not fall back to hard")
	}
	e.call("VM.start", vm, false, false)
	e.setOC(vm, "clean_shutdown_fallback", "hard")
	e.call("VM.clean_shutdown", vm)
	if e.power(vm) != "Halted" {
		t.Fatal("fallback policy")
	}
}

func TestSimGuestEvents(t *testing.T) {
	e := simEnv(t, sim.Config{})
	vm := e.newVM("events", nil)
	uuid := e.field("VM", vm, "uuid").(string)
	within := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, time.Second, what, cond)
	}
	e.call("VM.start", vm, false, false)
	e.sim().GuestPowerOff(uuid)
	within("halted after guest power-off", func() bool { return e.power(vm) == "Halted" })

	e.call("VM.set_actions_after_shutdown", vm, "restart")
	e.call("VM.start", vm, false, false)
	d0 := e.field("VM", vm, "domid").(float64)
	e.sim().GuestPowerOff(uuid)
	within("restarted after power-off", func() bool {
		return e.power(vm) == "Running" && e.field("VM", vm, "domid").(float64) != d0
	})

	d1 := e.field("VM", vm, "domid").(float64)
	e.sim().GuestReboot(uuid)
	within("rebooted", func() bool { return e.power(vm) == "Running" && e.field("VM", vm, "domid").(float64) != d1 })

	e.call("VM.set_actions_after_crash", vm, "preserve")
	e.sim().Crash(uuid)
	within("paused after crash (preserve)", func() bool { return e.power(vm) == "Paused" })
	e.call("VM.hard_shutdown", vm)

	e.call("VM.set_actions_after_crash", vm, "restart")
	e.call("VM.start", vm, false, false)
	d2 := e.field("VM", vm, "domid").(float64)
	e.sim().Crash(uuid)
	within("restarted after crash", func() bool { return e.power(vm) == "Running" && e.field("VM", vm, "domid").(float64) != d2 })

	e.sim().Vanish(uuid)
	within("halted after the emulator vanished", func() bool { return e.power(vm) == "Halted" })
	if n := len(e.sim().List()); n != 0 {
		t.Fatalf("%d domains left", n)
	}
}

func TestSimRestart(t *testing.T) {
	dir := shortTempDir(t)
	e := newEnv(t, xenops.Config{Backend: "simulator"}, envOptions{persist: true, dir: dir})
	a := e.newVM("stays", nil)
	b := e.newVM("vanishes", nil)
	e.call("VM.start", a, false, false)
	e.call("VM.start", b, false, false)
	da := e.field("VM", a, "domid")
	bUUID := e.field("VM", b, "uuid").(string)
	e.close()
	// While toolstackd is down, b's domain goes away.
	if err := os.Remove(filepath.Join(dir, "xenops", "sim", bUUID+".json")); err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, xenops.Config{Backend: "simulator"}, envOptions{persist: true, dir: dir})
	if p := e2.power(a); p != "Running" || e2.field("VM", a, "domid") != da {
		t.Fatalf("a after restart: %s domid %v (was %v)", p, e2.field("VM", a, "domid"), da)
	}
	if p := e2.power(b); p != "Halted" {
		t.Fatalf("b after restart: %s", p)
	}
	if ops := strSet(e2.field("VM", a, "allowed_operations")); !contains(ops, "hard_shutdown") {
		t.Fatalf("a allowed_operations %v", ops)
	}
	e2.call("VM.hard_shutdown", a)
	e2.call("VM.start", b, false, false)
}

func TestSimTemplateInstall(t *testing.T) {
	e := simEnv(t, sim.Config{})
	tpl := e.template("Other install media")
	vm := e.str(e.call("VM.clone", tpl, "installed"))
	rec := e.record("VM", vm)
	if rec["is_a_template"] != true || rec["is_default_template"] != false {
		t.Fatalf("clone of a template: is_a_template %v is_default_template %v", rec["is_a_template"], rec["is_default_template"])
	}
	if _, ok := rec["other_config"].(map[string]any)["default_template"]; ok {
		t.Error("clone kept other_config:default_template")
	}
	e.call("VM.provision", vm)
	rec = e.record("VM", vm)
	if rec["is_a_template"] != false || !contains(strSet(rec["allowed_operations"]), "start") {
		t.Fatalf("after provision: %v %v", rec["is_a_template"], rec["allowed_operations"])
	}
	e.call("VM.set_memory_limits", vm, int64(64<<20), int64(128<<20), int64(128<<20), int64(128<<20))
	e.call("VM.start", vm, false, false)
	e.call("VM.hard_shutdown", vm)
	// A user template can be destroyed; a default one cannot.
	e.call("VM.destroy", e.str(e.call("VM.clone", tpl, "scratch")))
	e.fails("VM_IS_TEMPLATE", "VM.destroy", tpl)

	// Snapshot and clone of a VM with a VIF.
	e.addVIF(vm, "0")
	snap := e.str(e.call("VM.snapshot", vm, "snap", []string{}))
	srec := e.record("VM", snap)
	if srec["is_a_snapshot"] != true || srec["snapshot_of"] != vm || srec["is_a_template"] != true || len(strSet(srec["VIFs"])) != 1 {
		t.Fatalf("snapshot: %v", srec)
	}
	clone := e.str(e.call("VM.clone", vm, "clone"))
	crec := e.record("VM", clone)
	if crec["is_a_template"] != false || len(strSet(crec["VIFs"])) != 1 {
		t.Fatalf("clone: %v", crec)
	}
	if e.field("VIF", strSet(crec["VIFs"])[0], "MAC") == e.field("VIF", strSet(e.field("VM", vm, "VIFs"))[0], "MAC") {
		t.Log("clone kept the MAC (it was not autogenerated)")
	}
	cp := e.str(e.call("VM.copy", vm, "copy", "OpaqueRef:NULL"))
	if e.power(cp) != "Halted" {
		t.Fatal("copy")
	}
	// Checkpoint of a running VM: a suspended snapshot; the VM runs on.
	e.call("VM.start", vm, false, false)
	cpt := e.str(e.call("VM.checkpoint", vm, "cp"))
	if e.power(cpt) != "Suspended" || e.power(vm) != "Running" {
		t.Fatalf("checkpoint: snapshot %s, VM %s", e.power(cpt), e.power(vm))
	}
	e.call("VM.hard_shutdown", vm)
	// The checkpoint is the VM's parent; destroying it hands the VM the
	// checkpoint's own parent, so that the next snapshot names no lost VM.
	if p := e.field("VM", vm, "parent"); p != cpt {
		t.Fatalf("parent after checkpoint: %v, want %s", p, cpt)
	}
	grand := e.field("VM", cpt, "parent")
	e.call("VM.destroy", cpt)
	if p := e.field("VM", vm, "parent"); p != grand {
		t.Fatalf("parent after its destroy: %v, want %v", p, grand)
	}
	again := e.str(e.call("VM.snapshot", vm, "again"))
	e.call("VM.destroy", again)
	var n int
	ents, _ := os.ReadDir(filepath.Join(e.dir, "xenops", "suspend"))
	n = len(ents)
	if n != 0 {
		t.Fatalf("%d suspend images left", n)
	}
}

func TestSimDevices(t *testing.T) {
	r := newResolver()
	e := newEnv(t, xenops.Config{Backend: "simulator", Disks: r}, envOptions{})
	vm := e.newVM("dev", nil)
	img := filepath.Join(e.dir, "disk.img")
	os.WriteFile(img, make([]byte, 1<<20), 0o600)
	vdi := e.addVDI("d", img, 1<<20)
	r.add(vdi, img)
	vbd := e.addVBD(vm, vdi, "1", "Disk", "RW")
	cd := e.addVBD(vm, "OpaqueRef:NULL", "3", "CD", "RO")
	vif := e.addVIF(vm, "0")
	e.fails("VM_BAD_POWER_STATE", "VBD.plug", vbd)
	e.call("VM.start", vm, false, false)
	if e.field("VBD", vbd, "currently_attached") != true || r.inUse() != 1 {
		t.Fatalf("VBD after start: %v, %d attached", e.field("VBD", vbd, "currently_attached"), r.inUse())
	}
	e.fails("DEVICE_ALREADY_ATTACHED", "VBD.plug", vbd)
	e.call("VBD.unplug", vbd)
	if e.field("VBD", vbd, "currently_attached") != false || r.inUse() != 0 {
		t.Fatal("VBD unplug")
	}
	e.fails("DEVICE_ALREADY_DETACHED", "VBD.unplug", vbd)
	e.call("VBD.plug", vbd)
	e.call("VBD.unplug_force", vbd)
	e.call("VBD.plug", vbd)
	iso := filepath.Join(e.dir, "cd.iso")
	os.WriteFile(iso, make([]byte, 1<<16), 0o600)
	isoVDI := e.addVDI("iso", iso, 1<<16)
	r.add(isoVDI, iso)
	e.fails("VBD_NOT_REMOVABLE_MEDIA", "VBD.insert", vbd, isoVDI)
	e.fails("VBD_IS_EMPTY", "VBD.eject", cd)
	e.call("VBD.insert", cd, isoVDI)
	e.fails("VBD_NOT_EMPTY", "VBD.insert", cd, isoVDI)
	if r.inUse() != 2 {
		t.Fatalf("%d attached after insert", r.inUse())
	}
	e.call("VBD.eject", cd)
	e.call("VIF.unplug", vif)
	if e.field("VIF", vif, "currently_attached") != false {
		t.Fatal("VIF unplug")
	}
	e.call("VIF.plug", vif)
	var devs []string
	json.Unmarshal(e.call("VM.get_allowed_VBD_devices", vm), &devs)
	if contains(devs, "1") || contains(devs, "3") || !contains(devs, "0") {
		t.Errorf("allowed VBD devices %v", devs)
	}
	json.Unmarshal(e.call("VM.get_allowed_VIF_devices", vm), &devs)
	if contains(devs, "0") || !contains(devs, "1") {
		t.Errorf("allowed VIF devices %v", devs)
	}
	e.call("VM.set_VCPUs_max", vm, int64(1))
	e.call("VM.set_memory_dynamic_range", vm, int64(64<<20), int64(96<<20))
	if e.field("VM", vm, "memory_target").(float64) != 96<<20 {
		t.Error("memory_target after set_memory_dynamic_range")
	}
	e.call("VM.hard_shutdown", vm)
	if r.inUse() != 0 {
		t.Fatalf("%d VDIs still attached after shutdown", r.inUse())
	}
	e.call("VM.assert_can_boot_here", vm, e.host)
}

func TestSimHooks(t *testing.T) {
	hooks := shortTempDir(t)
	e := simEnv(t, sim.Config{}, func(c *xenops.Config) {
		c.HooksDir = hooks
		c.HookTimeout = 500 * time.Millisecond
	})
	vm := e.newVM("hooked", nil)
	uuid := e.field("VM", vm, "uuid").(string)
	log := filepath.Join(hooks, "log")
	write := func(hook, name, body string) {
		os.MkdirAll(filepath.Join(hooks, hook), 0o755)
		os.WriteFile(filepath.Join(hooks, hook, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755)
	}
	write("vm-pre-start", "10-log", `echo "pre-start $*" >> `+log)
	write("vm-pre-shutdown", "10-log", `echo "pre-shutdown $*" >> `+log)
	write("vm-post-destroy", "10-log", `echo "post-destroy $*" >> `+log)
	write("vm-pre-reboot", "10-log", `echo "pre-reboot $*" >> `+log)
	e.call("VM.start", vm, false, false)
	e.call("VM.hard_reboot", vm)
	e.call("VM.hard_shutdown", vm)
	b, _ := os.ReadFile(log)
	want := "pre-start -vmuuid " + uuid + " -reason none\n" +
		"pre-reboot -vmuuid " + uuid + " -reason hard-reboot\n" +
		"pre-shutdown -vmuuid " + uuid + " -reason hard-reboot\n" +
		"post-destroy -vmuuid " + uuid + " -reason hard-reboot\n" +
		"pre-start -vmuuid " + uuid + " -reason none\n" +
		"pre-shutdown -vmuuid " + uuid + " -reason hard-shutdown\n" +
		"post-destroy -vmuuid " + uuid + " -reason hard-shutdown\n"
	if string(b) != want {
		t.Errorf("hooks ran:\n%s\nwant:\n%s", b, want)
	}
	write("vm-pre-start", "20-fail", `echo refused; exit 1`)
	p := e.fails("XAPI_HOOK_FAILED", "VM.start", vm, false, false)
	if p[0] != "vm-pre-start/20-fail" || p[1] != "none" || p[3] != "1" {
		t.Errorf("XAPI_HOOK_FAILED %v", p)
	}
	write("vm-pre-start", "20-fail", `exit 3`) // other codes are ignored
	e.call("VM.start", vm, false, false)
	e.call("VM.hard_shutdown", vm)
	write("vm-pre-start", "20-fail", `sleep 30`)
	start := time.Now()
	p = e.fails("XAPI_HOOK_FAILED", "VM.start", vm, false, false)
	if time.Since(start) > 5*time.Second {
		t.Errorf("hook timeout took %v", time.Since(start))
	}
	if e.power(vm) != "Halted" || len(e.sim().List()) != 0 {
		t.Fatal("state after a failed hook")
	}
	_ = p
}

// TestSimCancelEveryStep cancels VM.start at each of its steps in turn and
// checks the VM is left Halted with nothing behind.
func TestSimCancelEveryStep(t *testing.T) {
	r := newResolver()
	var e *env
	var mu sync.Mutex
	var steps []string
	cancelAt := -1
	taskCh := make(chan string, 1)
	cfg := xenops.Config{Backend: "simulator", Disks: r, OnStep: func(vm, op, step string) {
		if op != "start" {
			return
		}
		mu.Lock()
		k := len(steps)
		steps = append(steps, step)
		at := cancelAt
		mu.Unlock()
		if k == at {
			// Cancel through the API, and only then let the step go on.
			e.post("task.cancel", e.sess, <-taskCh)
		}
	}}
	e = newEnv(t, cfg, envOptions{})
	vm := e.newVM("cancel", nil)
	img := filepath.Join(e.dir, "disk.img")
	os.WriteFile(img, make([]byte, 1<<20), 0o600)
	vdi := e.addVDI("d", img, 1<<20)
	r.add(vdi, img)
	e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.addVIF(vm, "0")
	e.call("VM.start", vm, false, false)
	e.call("VM.hard_shutdown", vm)
	mu.Lock()
	all := append([]string(nil), steps...)
	mu.Unlock()
	t.Logf("VM.start steps: %v", all)
	if len(all) < 7 {
		t.Fatalf("only %d steps", len(all))
	}
	for k := range all {
		mu.Lock()
		steps, cancelAt = nil, k
		mu.Unlock()
		task := e.async("VM.start", vm, false, false)
		taskCh <- task
		st, info := e.wait(task, 30*time.Second)
		if st != "cancelled" || len(info) == 0 || info[0] != "TASK_CANCELLED" {
			t.Fatalf("step %d (%s): task %s %v", k, all[k], st, info)
		}
		checkHalted(t, e, vm, "step "+strconv.Itoa(k)+" ("+all[k]+")")
		if r.inUse() != 0 {
			t.Fatalf("step %d (%s): %d VDIs attached", k, all[k], r.inUse())
		}
	}
	mu.Lock()
	cancelAt = -1
	mu.Unlock()
	e.call("VM.start", vm, false, false)
}

// checkHalted checks a VM is validly Halted: record, devices, backend.
func checkHalted(t *testing.T, e *env, vm, when string) {
	t.Helper()
	var rec map[string]any
	eventually(t, 5*time.Second, "current_operations to clear", func() bool {
		rec = e.record("VM", vm)
		return len(rec["current_operations"].(map[string]any)) == 0
	})
	if rec["power_state"] != "Halted" || rec["resident_on"] != "OpaqueRef:NULL" || rec["domid"].(float64) != -1 {
		t.Fatalf("%s: %v %v %v", when, rec["power_state"], rec["resident_on"], rec["domid"])
	}
	if !contains(strSet(rec["allowed_operations"]), "start") {
		t.Fatalf("%s: allowed_operations %v", when, rec["allowed_operations"])
	}
	for _, vbd := range strSet(rec["VBDs"]) {
		if e.field("VBD", vbd, "currently_attached") != false {
			t.Fatalf("%s: VBD attached", when)
		}
	}
	if len(strSet(rec["consoles"])) != 0 {
		t.Fatalf("%s: consoles left", when)
	}
	if _, ok := e.m.Backend().Info(rec["uuid"].(string)); ok {
		t.Fatalf("%s: domain left in the backend", when)
	}
}

// TestSimThousand starts 1,000 VMs at once on one simulated host.
func TestSimThousand(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	e := newEnv(t, xenops.Config{Backend: "simulator", Sim: sim.Config{StepDelay: time.Millisecond}}, envOptions{persist: true, quiet: true})
	vms := make([]string, n)
	for i := range vms {
		vms[i] = e.newVM("storm-"+strconv.Itoa(i), nil)
	}
	var wg sync.WaitGroup
	start := time.Now()
	errs := make(chan error, n)
	for _, vm := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, x := e.rpc("VM.start", e.sess, vm, false, false)
			if x != nil {
				errs <- x
			}
		}()
	}
	wg.Wait()
	calls := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every record Running in the database.
	eventually(t, time.Minute, "all Running", func() bool {
		snap := e.d.Snapshot()
		for _, vm := range vms {
			r, _ := snap.Get(vmClass, vm)
			if r.String(powerField) != "Running" {
				return false
			}
		}
		return true
	})
	all := time.Since(start)
	t.Logf("%d concurrent VM.start on the simulator: calls returned in %v, all Running in the database after %v", n, calls, all)
	if len(e.sim().List()) != n {
		t.Fatalf("%d domains", len(e.sim().List()))
	}
}

// TestSimCancelMidStep cancels operations while a slow step runs: they
// stop promptly and leave the VM valid.
func TestSimCancelMidStep(t *testing.T) {
	e := simEnv(t, sim.Config{Delays: map[string]time.Duration{"device-model": time.Minute, "suspend": time.Minute}})
	vm := e.newVM("slow", nil)
	task := e.async("VM.start", vm, false, false)
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	e.call("task.cancel", task)
	st, _ := e.wait(task, 30*time.Second)
	if st != "cancelled" || time.Since(start) > 5*time.Second {
		t.Fatalf("start: %s after %v", st, time.Since(start))
	}
	checkHalted(t, e, vm, "start cancelled mid-step")

	e.sim().SetDelay("device-model", 0)
	e.call("VM.start", vm, false, false)
	task = e.async("VM.suspend", vm)
	time.Sleep(200 * time.Millisecond)
	e.call("task.cancel", task)
	if st, _ := e.wait(task, 30*time.Second); st != "cancelled" {
		t.Fatalf("suspend: %s", st)
	}
	if p := e.power(vm); p != "Running" {
		t.Fatalf("a cancelled suspend must leave the VM running, not %s", p)
	}
	ents, _ := os.ReadDir(filepath.Join(e.dir, "xenops", "suspend"))
	if len(ents) != 0 {
		t.Fatalf("suspend image left: %v", ents)
	}
	eventually(t, time.Second, "current_operations to clear", func() bool {
		return len(e.field("VM", vm, "current_operations").(map[string]any)) == 0
	})
}

func TestSimHostMemory(t *testing.T) {
	e := simEnv(t, sim.Config{}, func(c *xenops.Config) { c.HostMemory = 200 << 20 })
	a := e.newVM("a", nil)
	b := e.newVM("b", nil)
	e.call("VM.start", a, false, false)
	p := e.fails("HOST_NOT_ENOUGH_FREE_MEMORY", "VM.start", b, false, false)
	if p[0] != strconv.Itoa(128<<20) || p[1] != strconv.Itoa(72<<20) {
		t.Errorf("HOST_NOT_ENOUGH_FREE_MEMORY %v", p)
	}
	e.fails("HOST_NOT_ENOUGH_FREE_MEMORY", "VM.assert_can_boot_here", b, e.host)
	e.call("VM.hard_shutdown", a)
	e.call("VM.start", b, false, false)
}
