package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// newUUID runs a command that prints the uuid of what it made.
func (d *daemon) newUUID(args ...string) string {
	d.t.Helper()
	out := d.ok(args...)
	if !uuidRE.MatchString(out) {
		d.t.Fatalf("xe %s printed %q, not a uuid", strings.Join(args, " "), out)
	}
	return out
}

// TestCommonCommands drives the commands of xe's short list (xe help)
// on disks, CDs, interfaces, snapshots, templates, storage and memory
// through the real xe against the daemon on the simulator: outputs as
// xapi prints them (the new object's uuid), errors with their codes.
func TestCommonCommands(t *testing.T) {
	d := startDaemon(t)
	vm := d.makeVMs(1, "common-")[0]
	sr := d.ok("pool-param-get", "uuid="+d.ok("pool-list", "--minimal"), "param-name=default-SR")

	// Disks: add on the default SR, list, remove.
	d.ok("vm-disk-add", "vm=common-0", "disk-size=4MiB", "device=1")
	out := d.ok("vm-disk-list", "vm=common-0")
	if !strings.Contains(out, "Disk 0 VBD:") || !strings.Contains(out, "virtual-size ( RO): 4194304") {
		t.Fatalf("vm-disk-list:\n%s", out)
	}
	vdi := strings.Trim(d.ok("vm-disk-list", "uuid="+vm, "vbd-params=none", "vdi-params=uuid", "--minimal"), ",")
	if !uuidRE.MatchString(vdi) {
		t.Fatalf("disk uuid %q", vdi)
	}
	if e := d.fails("vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=2", "sr-uuid=nope"); e != "Error code: UUID_INVALID\nError parameters: SR, nope\n" {
		t.Fatalf("vm-disk-add on no SR: %q", e)
	}

	// The disk's own commands: snapshot, clone, copy, resize, update,
	// forget and introduce again.
	snapVDI := d.newUUID("vdi-snapshot", "uuid="+vdi)
	clone := d.newUUID("vdi-clone", "uuid="+vdi, "new-name-label=cloned")
	if got := d.ok("vdi-param-get", "uuid="+clone, "param-name=name-label"); got != "cloned" {
		t.Fatalf("vdi-clone name %q", got)
	}
	cp := d.newUUID("vdi-copy", "uuid="+vdi, "sr-uuid="+sr)
	d.ok("vdi-resize", "uuid="+cp, "disk-size=8MiB")
	if got := d.ok("vdi-param-get", "uuid="+cp, "param-name=virtual-size"); got != "8388608" {
		t.Fatalf("after vdi-resize: %q", got)
	}
	d.ok("vdi-update", "uuid="+cp)
	loc := d.ok("vdi-param-get", "uuid="+cp, "param-name=location")
	d.ok("vdi-forget", "uuid="+cp)
	if got := d.ok("vdi-introduce", "uuid="+cp, "sr-uuid="+sr, "type=user", "location="+loc); got != cp {
		t.Fatalf("vdi-introduce printed %q", got)
	}
	for _, v := range []string{snapVDI, clone, cp} {
		d.ok("vdi-destroy", "uuid="+v)
	}

	// CDs: an ISO SR with one CD; add, eject, insert, list, remove.
	isoDir := filepath.Join(d.dir, "isos")
	if err := os.MkdirAll(isoDir, 0o755); err != nil {
		t.Fatal(err)
	}
	iso := d.newUUID("sr-create", "name-label=isos", "type=file", "content-type=iso", "device-config:location="+isoDir)
	cd := d.newUUID("vdi-create", "sr-uuid="+iso, "name-label=tools.iso", "virtual-size=1MiB")
	d.ok("vm-cd-add", "uuid="+vm, "cd-name=tools.iso", "device=3")
	if got := d.ok("vm-cd-list", "uuid="+vm, "vbd-params=empty", "vdi-params=uuid", "--minimal"); got != "false,"+cd {
		t.Fatalf("vm-cd-list: %q", got)
	}
	d.ok("vm-cd-eject", "uuid="+vm)
	d.ok("vm-cd-insert", "uuid="+vm, "cd-name=tools.iso")
	if e := d.fails("vm-cd-insert", "uuid="+vm, "cd-name=nothing.iso"); e != "Error: CD nothing.iso not found\n" {
		t.Fatalf("insert of no CD: %q", e)
	}
	d.ok("vm-cd-remove", "uuid="+vm, "cd-name=tools.iso")
	if got := d.ok("vm-cd-list", "uuid="+vm, "--minimal"); got != "" {
		t.Fatalf("vm-cd-list after remove: %q", got)
	}
	vbd := d.newUUID("vbd-create", "vm-uuid="+vm, "device=4", "type=CD", "mode=RO")
	d.ok("vbd-destroy", "uuid="+vbd)

	// Interfaces: listed, plugged and unplugged while the VM runs,
	// destroyed.
	net := strings.Split(d.ok("network-list", "params=uuid", "--minimal"), ",")[0]
	vif := d.newUUID("vif-create", "vm-uuid="+vm, "network-uuid="+net, "device=0")
	if out := d.ok("vm-vif-list", "uuid="+vm); !strings.Contains(out, "uuid ( RO)") || !strings.Contains(out, vif) {
		t.Fatalf("vm-vif-list:\n%s", out)
	}

	// Memory and VCPUs.
	d.ok("vm-memory-limits-set", "uuid="+vm, "static-min=128MiB", "static-max=1GiB", "dynamic-min=256MiB", "dynamic-max=512MiB")
	d.ok("vm-memory-static-range-set", "uuid="+vm, "min=128MiB", "max=768MiB")
	d.ok("vm-memory-dynamic-range-set", "uuid="+vm, "min=256MiB", "max=512MiB")
	d.ok("vm-memory-set", "uuid="+vm, "memory=512MiB")
	if got := d.ok("vm-param-get", "uuid="+vm, "param-name=memory-static-max"); got != "536870912" {
		t.Fatalf("after vm-memory-set: %q", got)
	}
	d.ok("vm-param-set", "uuid="+vm, "VCPUs-max=2", "VCPUs-at-startup=1")
	d.ok("vm-start", "uuid="+vm)
	d.ok("vm-memory-target-set", "uuid="+vm, "target=400MiB")
	d.ok("vm-vcpu-hotplug", "uuid="+vm, "new-vcpus=2")
	// A disk added to the running VM is plugged, and then cannot be
	// removed; it grows online.
	d.ok("vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=5")
	if got := d.ok("vbd-list", "vm-uuid="+vm, "userdevice=5", "params=currently-attached", "--minimal"); got != "true" {
		t.Fatalf("hot-added disk attached: %q", got)
	}
	if e := d.fails("vm-disk-remove", "uuid="+vm, "device=5"); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED\n") {
		t.Fatalf("removing a plugged disk: %q", e)
	}
	hot := d.ok("vbd-list", "vm-uuid="+vm, "userdevice=5", "params=vdi-uuid", "--minimal")
	d.ok("vdi-resize", "uuid="+hot, "disk-size=2MiB", "online=true")
	d.ok("vif-unplug", "uuid="+vif)
	d.ok("vif-plug", "uuid="+vif)
	d.ok("vif-unplug", "uuid="+vif, "--force")
	if e := d.fails("vm-reset-powerstate", "uuid="+vm); !strings.Contains(e, "must be forced (use --force)") {
		t.Fatalf("reset without --force: %q", e)
	}
	d.ok("vif-plug", "uuid="+vif)
	if e := d.fails("vif-destroy", "uuid="+vif); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED\n") {
		t.Fatalf("destroying a plugged VIF: %q", e)
	}
	d.ok("vm-shutdown", "uuid="+vm, "--force")
	d.ok("vm-reset-powerstate", "uuid="+vm, "--force")
	d.ok("vm-disk-remove", "uuid="+vm, "device=5")
	d.ok("vif-destroy", "uuid="+vif)

	// Copies, snapshots and templates.
	cpVM := d.newUUID("vm-copy", "vm=common-0", "new-name-label=common-copy", "sr-uuid="+sr)
	snap := d.newUUID("vm-snapshot", "uuid="+vm, "new-name-label=snap")
	if out := d.ok("snapshot-disk-list", "uuid="+snap); !strings.Contains(out, "Disk 0 VDI:") {
		t.Fatalf("snapshot-disk-list:\n%s", out)
	}
	d.ok("vm-param-set", "uuid="+vm, "name-description=after the snapshot")
	d.ok("snapshot-revert", "snapshot-uuid="+snap)
	if got := d.ok("vm-param-get", "uuid="+vm, "param-name=name-description"); got == "after the snapshot" {
		t.Fatalf("snapshot-revert left the description %q", got)
	}
	if e := d.fails("snapshot-revert", "snapshot-uuid="+vm); !strings.Contains(e, "is not a VM snapshot") {
		t.Fatalf("revert to a VM: %q", e)
	}
	tmpl := d.newUUID("snapshot-clone", "uuid="+snap, "new-name-label=common-template")
	tmpl2 := d.newUUID("snapshot-copy", "uuid="+snap, "new-name-label=common-template-2")
	out = d.ok("template-uninstall", "template-uuid="+tmpl2, "--force")
	if !strings.HasPrefix(out, "The following items are about to be destroyed\nVM : "+tmpl2) || !strings.HasSuffix(out, "All objects destroyed") {
		t.Fatalf("template-uninstall:\n%s", out)
	}
	d.ok("template-uninstall", "template-uuid="+tmpl, "--force")
	d.ok("snapshot-uninstall", "uuid="+snap, "--force")
	if got := d.ok("snapshot-list", "uuid="+snap, "--minimal"); got != "" {
		t.Fatalf("snapshot-uninstall left %q", got)
	}
	d.ok("vm-uninstall", "uuid="+cpVM, "--force")
	d.ok("vm-disk-remove", "uuid="+vm, "device=1")
	if got := d.ok("vdi-list", "uuid="+vdi, "--minimal"); got != "" {
		t.Fatalf("vm-disk-remove left the disk %q", got)
	}

	// Storage repositories: probe, update, forget, introduce, destroy.
	extra := filepath.Join(d.dir, "extra-sr")
	if err := os.MkdirAll(extra, 0o755); err != nil {
		t.Fatal(err)
	}
	d.ok("sr-probe", "type=file", "device-config:location="+extra)
	xsr := d.newUUID("sr-create", "name-label=extra", "type=file", "device-config:location="+extra)
	d.ok("sr-update", "uuid="+xsr)
	pbd := d.ok("pbd-list", "sr-uuid="+xsr, "params=uuid", "--minimal")
	d.ok("pbd-unplug", "uuid="+pbd)
	d.ok("sr-forget", "uuid="+xsr)
	if got := d.ok("sr-introduce", "uuid="+xsr, "name-label=extra again", "type=file"); got != xsr {
		t.Fatalf("sr-introduce printed %q", got)
	}
	host := d.ok("host-list", "params=uuid", "--minimal")
	pbd = d.newUUID("pbd-create", "host-uuid="+host, "sr-uuid="+xsr, "device-config:location="+extra)
	d.ok("pbd-plug", "uuid="+pbd)
	d.ok("pbd-unplug", "uuid="+pbd)
	d.ok("sr-destroy", "uuid="+xsr)
	if e := d.fails("sr-destroy", "uuid="+xsr); e != "Error code: UUID_INVALID\nError parameters: SR, "+xsr+"\n" {
		t.Fatalf("sr-destroy twice: %q", e)
	}
	if e := d.fails("sr-probe", "type=nosuchtype"); !strings.HasPrefix(e, "Error code: SR_UNKNOWN_DRIVER") {
		t.Fatalf("probe of no driver: %q", e)
	}
}
