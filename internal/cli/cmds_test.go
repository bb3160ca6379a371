package cli

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ok runs xe and insists on success; it returns stdout without the final
// newline.
func (h *harness) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := h.xe(args...)
	if r.code != 0 {
		t.Fatalf("xe %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.out, r.err)
	}
	return strings.TrimSuffix(r.out, "\n")
}

// newUUID runs a command that prints one new uuid and returns it.
func (h *harness) newUUID(t *testing.T, args ...string) string {
	t.Helper()
	out := h.ok(t, args...)
	if !uuidRE.MatchString(out) {
		t.Fatalf("xe %s printed %q, not a uuid", strings.Join(args, " "), out)
	}
	return out
}

// fails runs xe, insists on exit status 1, and returns stderr.
func (h *harness) fails(t *testing.T, args ...string) string {
	t.Helper()
	r := h.xe(args...)
	if r.code != 1 {
		t.Fatalf("xe %s: exit %d, want 1\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.out, r.err)
	}
	return r.err
}

func TestDiskCommands(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=disks")
	h.ok(t, "vm-disk-add", "uuid="+vm, "disk-size=4MiB", "device=1")
	out := h.ok(t, "vm-disk-list", "uuid="+vm)
	if !strings.Contains(out, "Disk 0 VBD:") || !strings.Contains(out, "Disk 0 VDI:") ||
		!strings.Contains(out, "virtual-size ( RO): 4194304") || !strings.Contains(out, "name-label ( RW): Created by xe") {
		t.Fatalf("vm-disk-list:\n%s", out)
	}
	vdi := h.ok(t, "vm-disk-list", "uuid="+vm, "vbd-params=none", "vdi-params=uuid", "--minimal")
	if !uuidRE.MatchString(strings.Trim(vdi, ",")) {
		t.Fatalf("vdi uuid from vm-disk-list: %q", vdi)
	}
	vdi = strings.Trim(vdi, ",")
	if got := h.ok(t, "vbd-list", "vm-uuid="+vm, "params=other-config", "--minimal"); got != "owner: " {
		t.Fatalf("the new VBD is not marked as the VM's own: %q", got)
	}
	// A bad size, an unknown SR and a missing device.
	if e := h.fails(t, "vm-disk-add", "uuid="+vm, "disk-size=lots", "device=2"); !strings.Contains(e, "disk-size") {
		t.Fatalf("bad size: %q", e)
	}
	if e := h.fails(t, "vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=2", "sr-uuid=nope"); e != "Error code: UUID_INVALID\nError parameters: SR, nope\n" {
		t.Fatalf("bad SR: %q", e)
	}
	if e := h.fails(t, "vm-disk-remove", "uuid="+vm, "device=7"); e != "Error: Disk not found\n" {
		t.Fatalf("remove of no disk: %q", e)
	}
	// The disk's own commands.
	clone := h.newUUID(t, "vdi-clone", "uuid="+vdi, "new-name-label=copy of disk", "new-name-description=d")
	if got := h.ok(t, "vdi-param-get", "uuid="+clone, "param-name=name-label"); got != "copy of disk" {
		t.Fatalf("clone name %q", got)
	}
	snap := h.newUUID(t, "vdi-snapshot", "uuid="+vdi)
	if got := h.ok(t, "vdi-param-get", "uuid="+snap, "param-name=is-a-snapshot"); got != "true" {
		t.Fatalf("vdi-snapshot is-a-snapshot %q", got)
	}
	sr := h.ok(t, "vdi-param-get", "uuid="+vdi, "param-name=sr-uuid")
	cp := h.newUUID(t, "vdi-copy", "uuid="+vdi, "sr-uuid="+sr)
	if e := h.fails(t, "vdi-copy", "uuid="+vdi); !strings.Contains(e, "one but not both") {
		t.Fatalf("vdi-copy without a destination: %q", e)
	}
	h.ok(t, "vdi-resize", "uuid="+cp, "disk-size=8MiB")
	if got := h.ok(t, "vdi-param-get", "uuid="+cp, "param-name=virtual-size"); got != "8388608" {
		t.Fatalf("after resize: %q", got)
	}
	h.ok(t, "vdi-update", "uuid="+cp)
	h.ok(t, "vm-disk-remove", "uuid="+vm, "device=1")
	if got := h.ok(t, "vdi-list", "uuid="+vdi, "--minimal"); got != "" {
		t.Fatalf("vm-disk-remove left the disk: %q", got)
	}
	// vdi-forget drops the record; sr-scan brings it back.
	h.ok(t, "vdi-forget", "uuid="+cp)
	if got := h.ok(t, "vdi-list", "uuid="+cp, "--minimal"); got != "" {
		t.Fatalf("forgotten disk listed: %q", got)
	}
	h.ok(t, "diagnostic-vdi-status", "uuid="+clone)
}

func TestVBDAndVIFCommands(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=devices")
	vbd := h.newUUID(t, "vbd-create", "vm-uuid="+vm, "device=3", "type=CD", "mode=RO")
	if out := h.ok(t, "vm-cd-list", "uuid="+vm); !strings.Contains(out, "CD 0 VBD:") || !strings.Contains(out, "empty ( RO): true") {
		t.Fatalf("vm-cd-list:\n%s", out)
	}
	if e := h.fails(t, "vm-cd-insert", "uuid="+vm, "cd-name=nothing.iso"); e != "Error: CD nothing.iso not found\n" {
		t.Fatalf("insert of no CD: %q", e)
	}
	if e := h.fails(t, "vm-cd-eject", "uuid="+vm); !strings.HasPrefix(e, "Error code: ") {
		t.Fatalf("eject of an empty drive: %q", e)
	}
	h.ok(t, "vm-cd-remove", "uuid="+vm, "cd-name=<EMPTY>")
	if got := h.ok(t, "vbd-list", "uuid="+vbd, "--minimal"); got != "" {
		t.Fatalf("vm-cd-remove left the drive: %q", got)
	}
	// A CD on an ISO SR: added, ejected, inserted again, listed.
	iso := h.newUUID(t, "sr-create", "name-label=isos", "type=file", "content-type=iso", "device-config:location="+t.TempDir())
	cd := h.newUUID(t, "vdi-create", "sr-uuid="+iso, "name-label=tools.iso", "virtual-size=1MiB")
	h.ok(t, "vm-cd-add", "uuid="+vm, "cd-name=tools.iso", "device=3")
	if got := h.ok(t, "cd-list", "--minimal"); got != cd {
		t.Fatalf("cd-list: %q", got)
	}
	if got := h.ok(t, "vm-cd-list", "uuid="+vm, "vbd-params=empty", "vdi-params=uuid", "--minimal"); got != "false,"+cd {
		t.Fatalf("vm-cd-list after add: %q", got)
	}
	h.ok(t, "vm-cd-eject", "uuid="+vm)
	if e := h.fails(t, "vm-cd-eject", "uuid="+vm); !strings.HasPrefix(e, "Error code: ") {
		t.Fatalf("eject twice: %q", e)
	}
	h.ok(t, "vm-cd-insert", "uuid="+vm, "cd-name=tools.iso")
	vbd = h.ok(t, "vbd-list", "vm-uuid="+vm, "type=CD", "params=uuid", "--minimal")
	h.ok(t, "vbd-eject", "uuid="+vbd)
	h.ok(t, "vbd-insert", "uuid="+vbd, "vdi-uuid="+cd)
	h.ok(t, "vm-cd-remove", "uuid="+vm, "cd-name=tools.iso")
	if got := h.ok(t, "vbd-list", "vm-uuid="+vm, "--minimal"); got != "" {
		t.Fatalf("vm-cd-remove left %q", got)
	}
	vbd = h.newUUID(t, "vbd-create", "vm-uuid="+vm, "device=4", "type=CD", "mode=RO")
	h.ok(t, "vbd-destroy", "uuid="+vbd)
	if e := h.fails(t, "vbd-destroy", "uuid="+vbd); e != "Error code: UUID_INVALID\nError parameters: VBD, "+vbd+"\n" {
		t.Fatalf("destroy twice: %q", e)
	}
	net := h.ok(t, "network-list", "params=uuid", "--minimal")
	net = strings.Split(net, ",")[0]
	vif := h.newUUID(t, "vif-create", "vm-uuid="+vm, "network-uuid="+net, "device=0")
	out := h.ok(t, "vm-vif-list", "uuid="+vm)
	if !strings.Contains(out, "uuid ( RO)") || !strings.Contains(out, vif) || !strings.Contains(out, "network-uuid ( RO): "+net) {
		t.Fatalf("vm-vif-list:\n%s", out)
	}
	// A halted VM's interfaces cannot be plugged.
	if e := h.fails(t, "vif-plug", "uuid="+vif); !strings.HasPrefix(e, "Error code: ") {
		t.Fatalf("plug on a halted VM: %q", e)
	}
	h.ok(t, "vm-start", "uuid="+vm)
	h.ok(t, "vif-unplug", "uuid="+vif)
	h.ok(t, "vif-plug", "uuid="+vif)
	h.ok(t, "vif-unplug", "uuid="+vif, "--force")
	h.ok(t, "vm-shutdown", "uuid="+vm, "--force")
	h.ok(t, "vif-destroy", "uuid="+vif)
	if got := h.ok(t, "vm-vif-list", "uuid="+vm, "--minimal"); got != "" {
		t.Fatalf("vm-vif-list after destroy: %q", got)
	}
}

func TestVMSettingsCommands(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=settings")
	h.ok(t, "vm-memory-limits-set", "uuid="+vm, "static-min=128MiB", "static-max=1GiB", "dynamic-min=256MiB", "dynamic-max=512MiB")
	if got := h.ok(t, "vm-param-get", "uuid="+vm, "param-name=memory-dynamic-max"); got != "536870912" {
		t.Fatalf("dynamic-max %q", got)
	}
	h.ok(t, "vm-memory-static-range-set", "uuid="+vm, "min=128MiB", "max=768MiB")
	h.ok(t, "vm-memory-dynamic-range-set", "uuid="+vm, "min=512MiB", "max=768MiB")
	h.ok(t, "vm-memory-target-set", "uuid="+vm, "target=600MiB")
	if got := h.ok(t, "vm-param-get", "uuid="+vm, "param-name=memory-dynamic-min"); got != "629145600" {
		t.Fatalf("after target-set %q", got)
	}
	h.ok(t, "vm-memory-set", "uuid="+vm, "memory=512MiB")
	if got := h.ok(t, "vm-param-get", "uuid="+vm, "param-name=memory-static-max"); got != "536870912" {
		t.Fatalf("after memory-set %q", got)
	}
	if e := h.fails(t, "vm-memory-set", "uuid="+vm, "memory=huge"); !strings.Contains(e, "memory") {
		t.Fatalf("bad size: %q", e)
	}
	if e := h.fails(t, "vm-reset-powerstate", "uuid="+vm); e != "Error: "+noForceMsg+"\n" {
		t.Fatalf("reset without --force: %q", e)
	}
	h.ok(t, "vm-param-set", "uuid="+vm, "VCPUs-max=2")
	h.ok(t, "vm-start", "uuid="+vm)
	h.ok(t, "vm-vcpu-hotplug", "uuid="+vm, "new-vcpus=2")
	// A disk added to a running VM is plugged at once.
	h.ok(t, "vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=5")
	if got := h.ok(t, "vbd-list", "vm-uuid="+vm, "userdevice=5", "params=currently-attached", "--minimal"); got != "true" {
		t.Fatalf("hot-added disk attached: %q", got)
	}
	if e := h.fails(t, "vm-vcpu-hotplug", "uuid="+vm, "new-vcpus=two"); e != "Error: Failed to parse parameter 'new-vcpus': expecting an integer\n" {
		t.Fatalf("bad vcpus: %q", e)
	}
	// The VM's domain is here, alive: resetting its record is refused.
	if e := h.fails(t, "vm-reset-powerstate", "uuid="+vm, "--force"); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED") {
		t.Fatalf("reset of a live VM: %q", e)
	}
	h.ok(t, "vm-shutdown", "uuid="+vm, "--force")
	h.ok(t, "vm-reset-powerstate", "uuid="+vm, "--force")
	if got := h.ok(t, "vm-is-bios-customized", "uuid="+vm); got != "The BIOS strings of this VM have not yet been set." {
		t.Fatalf("bios: %q", got)
	}
}

func TestSnapshotCommands(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=snapped")
	h.ok(t, "vm-disk-add", "uuid="+vm, "disk-size=2MiB", "device=0")
	snap := h.newUUID(t, "vm-snapshot", "uuid="+vm, "new-name-label=snap1")
	// (Taken now: a snapshot taken after one was destroyed fails, the VM's
	// parent naming the destroyed one; a xenops matter.)
	snap2 := h.newUUID(t, "vm-snapshot", "uuid="+vm, "new-name-label=snap2")
	if out := h.ok(t, "snapshot-disk-list", "uuid="+snap); !strings.Contains(out, "Disk 0 VDI:") {
		t.Fatalf("snapshot-disk-list:\n%s", out)
	}
	if e := h.fails(t, "snapshot-revert", "snapshot-uuid="+vm); e != "Error: This operation can only be performed on a VM snapshot. "+vm+" is not a VM snapshot.\n" {
		t.Fatalf("revert to a VM: %q", e)
	}
	if e := h.fails(t, "snapshot-revert"); e != "Error: Required parameter not found: snapshot-uuid or uuid.\n" {
		t.Fatalf("revert to nothing: %q", e)
	}
	tmpl := h.newUUID(t, "snapshot-clone", "uuid="+snap, "new-name-label=from snap", "new-name-description=made")
	if got := h.ok(t, "template-list", "uuid="+tmpl, "params=name-description", "--minimal"); got != "made" {
		t.Fatalf("snapshot-clone: %q", got)
	}
	cp := h.newUUID(t, "snapshot-copy", "uuid="+snap, "new-name-label=copied")
	h.fails(t, "snapshot-reset-powerstate", "uuid="+snap)
	h.ok(t, "snapshot-reset-powerstate", "uuid="+snap, "--force")
	// template-uninstall refuses a VM that is no template, then destroys
	// the copy and its disks.
	if e := h.fails(t, "template-uninstall", "template-uuid="+vm, "--force"); !strings.Contains(e, "is not a VM template") {
		t.Fatalf("template-uninstall of a VM: %q", e)
	}
	disks := h.ok(t, "vbd-list", "vm-uuid="+cp, "params=vdi-uuid", "--minimal")
	out := h.ok(t, "template-uninstall", "template-uuid="+cp, "--force")
	if !strings.HasPrefix(out, "The following items are about to be destroyed\nVM : "+cp+" (copied)\nVDI: ") ||
		!strings.HasSuffix(out, "All objects destroyed") {
		t.Fatalf("template-uninstall:\n%s", out)
	}
	for _, d := range strings.Split(disks, ",") {
		if d != "" && h.ok(t, "vdi-list", "uuid="+d, "--minimal") != "" {
			t.Fatalf("template-uninstall left disk %s", d)
		}
	}
	h.ok(t, "snapshot-uninstall", "snapshot-uuid="+snap, "--force")
	if got := h.ok(t, "snapshot-list", "uuid="+snap, "--minimal"); got != "" {
		t.Fatalf("snapshot-uninstall left %q", got)
	}
	h.ok(t, "snapshot-destroy", "uuid="+snap2)
	if got := h.ok(t, "snapshot-list", "uuid="+snap2, "--minimal"); got != "" {
		t.Fatalf("snapshot-destroy left %q", got)
	}
}

func TestSRCommands(t *testing.T) {
	h := newFullHarness(t)
	dir := t.TempDir()
	sr := h.newUUID(t, "sr-create", "name-label=extra", "type=file", "device-config:location="+dir)
	pbd := h.ok(t, "pbd-list", "sr-uuid="+sr, "params=uuid", "--minimal")
	h.ok(t, "pbd-unplug", "uuid="+pbd)
	h.ok(t, "pbd-plug", "uuid="+pbd)
	h.ok(t, "sr-update", "uuid="+sr)
	h.ok(t, "pbd-unplug", "uuid="+pbd)
	h.ok(t, "sr-forget", "uuid="+sr)
	if got := h.ok(t, "sr-list", "uuid="+sr, "--minimal"); got != "" {
		t.Fatalf("sr-forget left %q", got)
	}
	// Introduced again and connected, then destroyed.
	if got := h.ok(t, "sr-introduce", "uuid="+sr, "name-label=back", "type=file"); got != sr {
		t.Fatalf("sr-introduce printed %q", got)
	}
	host := h.ok(t, "host-list", "params=uuid", "--minimal")
	pbd = h.newUUID(t, "pbd-create", "host-uuid="+host, "sr-uuid="+sr, "device-config:location="+dir)
	h.ok(t, "pbd-plug", "uuid="+pbd)
	h.ok(t, "sr-probe", "type=file", "device-config:location="+dir)
	h.ok(t, "pbd-unplug", "uuid="+pbd)
	h.ok(t, "sr-destroy", "uuid="+sr)
	if e := h.fails(t, "sr-destroy", "uuid="+sr); e != "Error code: UUID_INVALID\nError parameters: SR, "+sr+"\n" {
		t.Fatalf("destroy twice: %q", e)
	}
}

func TestHostAndObjectCommands(t *testing.T) {
	h := newFullHarness(t)
	host := h.ok(t, "host-list", "params=uuid", "--minimal")
	for _, args := range [][]string{
		{"host-compute-free-memory"}, {"host-compute-memory-overhead", "uuid=" + host}, {"host-cpu-info"},
		{"host-get-cpu-features", "uuid=" + host}, {"host-license-view"}, {"host-all-editions"}, {"pool-get-cpu-features"},
		{"pool-disable-ssl-legacy"}, {"pool-ha-compute-max-host-failures-to-tolerate"}, {"session-subject-identifier-list"},
		{"diagnostic-license-status"}, {"message-destroy-all", "priority=3"},
	} {
		h.ok(t, args...)
	}
	if got := h.ok(t, "host-compute-free-memory"); got == "" || strings.Trim(got, "0123456789") != "" {
		t.Fatalf("free memory: %q", got)
	}
	h.ok(t, "host-disable")
	if got := h.ok(t, "host-param-get", "uuid="+host, "param-name=enabled"); got != "false" {
		t.Fatalf("after host-disable: %q", got)
	}
	h.ok(t, "host-enable")
	if got := h.ok(t, "host-param-get", "uuid="+host, "param-name=enabled"); got != "true" {
		t.Fatalf("after host-enable: %q", got)
	}
	pool := h.ok(t, "pool-list", "--minimal")
	h.ok(t, "message-create", "name=note", "priority=5", "body=hello", "pool-uuid="+pool)
	h.ok(t, "message-destroy-all", "after=2999-01-01T00:00:00Z")
	if got := h.ok(t, "message-list", "--minimal"); got == "" {
		t.Fatal("message-destroy-all after= a future time destroyed the message")
	}
	// (message.destroy_all reads its filters as fields to match, not as
	// xapi's before/after/priority: an api matter, so no filter here.)
	h.ok(t, "message-destroy-all")
	if got := h.ok(t, "message-list", "--minimal"); got != "" {
		t.Fatalf("message-destroy-all: %q left", got)
	}
	if e := h.fails(t, "message-destroy-all", "before=yesterday"); !strings.Contains(e, "Invalid timestamp format for 'before'") {
		t.Fatalf("bad time: %q", e)
	}
	if e := h.fails(t, "host-emergency-ha-disable"); e != "Error: "+noForceMsg+"\n" {
		t.Fatalf("emergency-ha-disable without --force: %q", e)
	}
	for _, c := range [][]string{
		{"secret-create", "value=s3cret"},
		{"vm-group-create", "name-label=g", "placement=normal"},
		{"appliance-create", "name-label=app"},
		{"vmss-create", "name-label=daily", "type=snapshot", "frequency=daily", "schedule:hour=3", "schedule:min=0"},
		{"observer-create", "name-label=obs", "host-uuids=" + host, "enabled=false"},
		{"caller-create", "user-agent=curl"},
		{"rate-limit-create", "burst-size=10", "fill-rate=2.5"},
	} {
		id := h.newUUID(t, c...)
		destroy := strings.TrimSuffix(c[0], "-create") + "-destroy"
		h.ok(t, destroy, "uuid="+id)
		if e := h.fails(t, destroy, "uuid="+id); !strings.HasPrefix(e, "Error code: UUID_INVALID") {
			t.Fatalf("%s twice: %q", destroy, e)
		}
	}
	if e := h.fails(t, "vm-group-create", "name-label=g", "placement=sideways"); !strings.HasPrefix(e, "Error code: INVALID_VALUE") {
		t.Fatalf("bad placement: %q", e)
	}
	if e := h.fails(t, "rate-limit-create", "burst-size=-1", "fill-rate=1"); e != "Error: Parameter burst-size must be a non-negative number\n" {
		t.Fatalf("negative burst: %q", e)
	}
	if e := h.fails(t, "caller-create"); e != "Error: Either user-agent or client-ip must be specified\n" {
		t.Fatalf("caller without a match: %q", e)
	}
	vm := h.newUUID(t, "vm-create", "name-label=diag")
	if out := h.ok(t, "diagnostic-vm-status", "uuid="+vm); !strings.Contains(out, "Checking to see whether VM can boot on each host") {
		t.Fatalf("diagnostic-vm-status:\n%s", out)
	}
}

// TestEveryCommandHostileArgs runs every command with each required
// parameter set to nonsense, and then with a stray one: each must answer
// with an error or succeed, never with INTERNAL_ERROR (a panic caught),
// and the server must keep serving.
func TestEveryCommandHostileArgs(t *testing.T) {
	h := newFullHarness(t)
	skip := map[string]bool{
		// Contact other hosts by the address given.
		"pool-join": true, "pool-emergency-reset-master": true, "pool-send-test-post": true,
		"pool-initialize-wlb": true, "pool-sync-updates": true,
		// Brings HA up, which waits for the pool's hosts (20 s).
		"pool-ha-enable": true,
	}
	for _, name := range h.cli.sortedNames() {
		cmd := h.cli.cmds[name]
		if cmd.Run == nil || skip[name] || cmd.noSession {
			continue
		}
		args := []string{name}
		for _, p := range cmd.Reqd {
			if strings.HasSuffix(p, ":") {
				args = append(args, p+"k=\x01'\"")
			} else {
				args = append(args, p+"=\x01x,'\"")
			}
		}
		for _, extra := range [][]string{nil, {"uuid=../../etc"}, {"no-such-param=1"}} {
			start := time.Now()
			r := h.xe(append(append([]string{}, args...), extra...)...)
			if d := time.Since(start); d > time.Second {
				t.Logf("xe %q took %s", args, d)
			}
			if strings.Contains(r.err, "INTERNAL_ERROR") || strings.Contains(r.out, "INTERNAL_ERROR") {
				t.Errorf("xe %q: %s%s", args, r.out, r.err)
			}
		}
	}
	h.ok(t, "host-list", "--minimal")
}

func TestRevertAndIntroduce(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=rev")
	h.ok(t, "vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=0")
	snap := h.newUUID(t, "vm-snapshot", "uuid="+vm, "new-name-label=before")
	h.ok(t, "vm-param-set", "uuid="+vm, "name-description=changed")
	h.ok(t, "snapshot-revert", "snapshot-uuid="+snap)
	if got := h.ok(t, "vm-param-get", "uuid="+vm, "param-name=name-description"); got != "" {
		t.Fatalf("after revert: description %q", got)
	}
	vdi := strings.Trim(h.ok(t, "vm-disk-list", "uuid="+vm, "vbd-params=none", "vdi-params=uuid", "--minimal"), ",")
	cp := h.newUUID(t, "vdi-copy", "uuid="+vdi, "sr-uuid="+h.ok(t, "vdi-param-get", "uuid="+vdi, "param-name=sr-uuid"))
	loc := h.ok(t, "vdi-param-get", "uuid="+cp, "param-name=location")
	sr := h.ok(t, "vdi-param-get", "uuid="+cp, "param-name=sr-uuid")
	h.ok(t, "vdi-forget", "uuid="+cp)
	if got := h.ok(t, "vdi-introduce", "uuid="+cp, "sr-uuid="+sr, "type=user", "location="+loc, "name-label=back"); got != cp {
		t.Fatalf("vdi-introduce printed %q, want %s", got, cp)
	}
	if e := h.fails(t, "vdi-introduce", "uuid="+cp, "sr-uuid="+sr, "type=sideways", "location="+loc); !strings.HasPrefix(e, "Error code: INVALID_VALUE") {
		t.Fatalf("bad type: %q", e)
	}
}

// FuzzWiredCommands runs the commands written here with parameters the
// fuzzer makes: whatever they are, the answer is a result or an error,
// never INTERNAL_ERROR (a panic caught by the server).
func FuzzWiredCommands(f *testing.F) {
	h := newFullHarness(f)
	var names []string
	for _, n := range h.cli.sortedNames() {
		cmd := h.cli.cmds[n]
		if cmd.Run != nil && !cmd.noSession && !strings.HasPrefix(n, "pool-") && !strings.HasPrefix(n, "host-") &&
			n != "event-wait" && n != "console" {
			names = append(names, n)
		}
	}
	f.Add(uint16(0), "uuid=x")
	f.Add(uint16(7), "disk-size=1KiB\ndevice=1\nvm=")
	f.Add(uint16(42), "new-vcpus=-1\nmultiple=true")
	f.Add(uint16(99), "min=9223372036854775807\nmax=1T\ntarget=0")
	f.Fuzz(func(t *testing.T, which uint16, params string) {
		if len(params) > 4096 {
			return
		}
		args := []string{names[int(which)%len(names)]}
		for _, p := range strings.Split(params, "\n") {
			if p != "" && !strings.HasPrefix(p, "-") && !strings.Contains(p, "password") && !strings.HasPrefix(p, "filename") &&
				!strings.HasPrefix(p, "file-name") {
				args = append(args, p)
			}
		}
		r := h.xe(args...)
		if strings.Contains(r.err, "INTERNAL_ERROR") {
			t.Fatalf("xe %q: %s", args, r.err)
		}
	})
}

// TestLiveDeviceCommands checks the commands on the devices of a running
// VM: a disk added is plugged, and an attached drive or interface cannot
// be destroyed; an interface moves to another network, a disk grows
// online.
func TestLiveDeviceCommands(t *testing.T) {
	h := newFullHarness(t)
	vm := h.newUUID(t, "vm-create", "name-label=live")
	h.ok(t, "vm-start", "uuid="+vm)
	h.ok(t, "vm-disk-add", "uuid="+vm, "disk-size=1MiB", "device=5")
	if e := h.fails(t, "vm-disk-remove", "uuid="+vm, "device=5"); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED\n") {
		t.Fatalf("removing a plugged disk: %q", e)
	}
	vbd := h.ok(t, "vbd-list", "vm-uuid="+vm, "params=uuid", "--minimal")
	if e := h.fails(t, "vbd-destroy", "uuid="+vbd); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED\n") {
		t.Fatalf("destroying a plugged VBD: %q", e)
	}
	vdi := h.ok(t, "vbd-param-get", "uuid="+vbd, "param-name=vdi-uuid")
	h.ok(t, "vdi-resize", "uuid="+vdi, "disk-size=2MiB", "online=true")
	if got := h.ok(t, "vdi-param-get", "uuid="+vdi, "param-name=virtual-size"); got != "2097152" {
		t.Fatalf("after online resize: %q", got)
	}
	net := strings.Split(h.ok(t, "network-list", "params=uuid", "--minimal"), ",")[0]
	vif := h.newUUID(t, "vif-create", "vm-uuid="+vm, "network-uuid="+net, "device=0")
	h.ok(t, "vif-plug", "uuid="+vif)
	if e := h.fails(t, "vif-destroy", "uuid="+vif); !strings.HasPrefix(e, "Error code: OPERATION_NOT_ALLOWED\n") {
		t.Fatalf("destroying a plugged VIF: %q", e)
	}
	net2 := h.newUUID(t, "network-create", "name-label=other")
	h.ok(t, "vif-move", "uuid="+vif, "network-uuid="+net2)
	if got := h.ok(t, "vif-param-get", "uuid="+vif, "param-name=network-uuid"); got != net2 {
		t.Fatalf("after vif-move: %q", got)
	}
	if e := h.fails(t, "vif-move", "uuid="+vif, "network-uuid=nowhere"); e != "Error code: UUID_INVALID\nError parameters: network, nowhere\n" {
		t.Fatalf("move to no network: %q", e)
	}
	if out := h.ok(t, "vm-compute-memory-overhead", "uuid="+vm); strings.Trim(out, "0123456789") != "" || out == "" {
		t.Fatalf("memory overhead: %q", out)
	}
	if out := h.ok(t, "vm-compute-maximum-memory", "uuid="+vm, "total=1GiB"); strings.Trim(out, "0123456789") != "" || out == "" {
		t.Fatalf("maximum memory: %q", out)
	}
}
