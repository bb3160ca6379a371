package xenops_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xenops"
	"toolstackd/internal/xenops/qemu"
	"toolstackd/internal/xenops/sim"
)

// --- XML-RPC, as xe and XenAPI.py speak it ---------------------------

func xmlValue(v any) string {
	switch x := v.(type) {
	case string:
		var b bytes.Buffer
		xml.EscapeText(&b, []byte(x))
		return "<value><string>" + b.String() + "</string></value>"
	case bool:
		if x {
			return "<value><boolean>1</boolean></value>"
		}
		return "<value><boolean>0</boolean></value>"
	case int:
		return fmt.Sprintf("<value><string>%d</string></value>", x)
	case float64:
		return fmt.Sprintf("<value><double>%g</double></value>", x)
	case map[string]string:
		m := map[string]any{}
		for k, v := range x {
			m[k] = v
		}
		return xmlValue(m)
	case []string:
		s := "<value><array><data>"
		for _, e := range x {
			s += xmlValue(e)
		}
		return s + "</data></array></value>"
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		s := "<value><struct>"
		for _, k := range keys {
			s += "<member><name>" + k + "</name>" + xmlValue(x[k]) + "</member>"
		}
		return s + "</struct></value>"
	}
	panic(fmt.Sprintf("xmlValue %T", v))
}

// xmlrpc calls method over XML-RPC with the session first and returns
// the raw response body.
func (e *env) xmlrpc(method string, params ...any) string {
	e.t.Helper()
	body := "<?xml version='1.0'?><methodCall><methodName>" + method + "</methodName><params>"
	for _, p := range append([]any{e.sess}, params...) {
		body += "<param>" + xmlValue(p) + "</param>"
	}
	body += "</params></methodCall>"
	resp, err := http.Post(e.url+"/", "text/xml", strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// --- Finding 1: constructors make objects in their initial state -----

// TestVMCreateIgnoresRuntimeState: VM.create over XML-RPC with
// power_state=Suspended and a suspend_VDI naming some VDI (whose content
// the caller controls) makes a Halted VM with no suspend image, which
// cannot be resumed. The same for the runtime fields of VBDs and VIFs.
func TestVMCreateIgnoresRuntimeState(t *testing.T) {
	e := simEnv(t, sim.Config{})
	vdi := e.addVDI("crafted-image", filepath.Join(e.dir, "crafted.img"), 1<<20)
	call := testdaemon.VMRecord("forged-suspended")
	call["power_state"] = "Suspended"
	call["suspend_VDI"] = vdi
	call["last_booted_record"] = "forged"
	call["last_boot_CPU_flags"] = map[string]string{"vendor": "forged"}
	resp := e.xmlrpc("VM.create", call)
	if !strings.Contains(resp, "<name>Status</name><value>Success</value>") && !strings.Contains(resp, "Success") {
		t.Fatalf("VM.create over XML-RPC: %s", resp)
	}
	i := strings.Index(resp, "OpaqueRef:")
	if i < 0 {
		t.Fatalf("no ref in %s", resp)
	}
	vm := resp[i : i+strings.IndexByte(resp[i:], '<')]
	got := e.record("VM", vm)
	if got["power_state"] != "Halted" || got["suspend_VDI"] != "OpaqueRef:NULL" || got["last_booted_record"] != "" ||
		len(got["last_boot_CPU_flags"].(map[string]any)) != 0 || got["domid"] != -1.0 || got["resident_on"] != "OpaqueRef:NULL" {
		t.Fatalf("VM.create took runtime state from the caller: power_state %v suspend_VDI %v last_booted_record %q last_boot_CPU_flags %v domid %v resident_on %v",
			got["power_state"], got["suspend_VDI"], got["last_booted_record"], got["last_boot_CPU_flags"], got["domid"], got["resident_on"])
	}
	if p := e.fails("VM_BAD_POWER_STATE", "VM.resume", vm, false, false); len(p) < 3 || p[2] != "halted" {
		t.Fatalf("VM.resume params %v", p)
	}
	// Devices are created unplugged whatever the caller says.
	vbd := e.str(e.call("VBD.create", map[string]any{
		"VM": vm, "VDI": vdi, "userdevice": "1", "bootable": false, "mode": "RW", "type": "Disk",
		"unpluggable": true, "empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{}, "currently_attached": true,
	}))
	if e.field("VBD", vbd, "currently_attached") != false {
		t.Fatal("VBD.create took currently_attached=true from the caller")
	}
	vif := e.str(e.call("VIF.create", map[string]any{
		"device": "0", "network": e.network(), "VM": vm, "MAC": "", "MTU": 1500, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}, "locking_mode": "network_default",
		"ipv4_allowed": []string{}, "ipv6_allowed": []string{}, "currently_attached": true,
	}))
	if e.field("VIF", vif, "currently_attached") != false {
		t.Fatal("VIF.create took currently_attached=true from the caller")
	}
}

// --- Finding 1: suspend images are untrusted input -------------------

// craftImage writes a suspend image in toolstackd's format with the given
// metadata (any JSON) and stream, as someone who can write a suspend VDI
// could.
func craftImage(t *testing.T, path string, meta any, stream uint64, data []byte) {
	t.Helper()
	mb, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	b.WriteString("TOOLSTACKD-SUSPEND-1\n")
	hdr := func(typ, n uint64) {
		var h [16]byte
		binary.BigEndian.PutUint64(h[:8], typ)
		binary.BigEndian.PutUint64(h[8:], n)
		b.Write(h[:])
	}
	hdr(1, uint64(len(mb)))
	b.Write(mb)
	hdr(stream, uint64(len(data)))
	b.Write(data)
	hdr(0xFF, 0)
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// hostileMeta is image metadata naming host files and another identity.
func hostileMeta(backend string, vbd, vdi string) map[string]any {
	return map[string]any{
		"Backend": backend,
		"Spec": map[string]any{
			"UUID": "../../../../tmp/not-this-vm", "Name": "evil", "VMRef": "OpaqueRef:evil",
			"Memory": 64 << 20, "Target": 64 << 20, "VCPUs": 1, "MaxCPU": 1, "HVM": true, "Firmware": "uefi",
			"Kernel": "/etc/shadow", "Ramdisk": "/etc/../etc/shadow", "Cmdline": "init=/bin/sh",
			"Platform": map[string]string{"disk-bus": "ide"},
		},
		"Disks": []map[string]any{
			{"VBD": vbd, "VDI": vdi, "Device": "0", "Path": "/etc/shadow", "Format": "raw"},
			{"VBD": "OpaqueRef:x", "Device": "1", "Path": "../../../etc/shadow", "Format": "raw"},
		},
		"NICs": []map[string]any{{"VIF": "OpaqueRef:y", "Device": "0", "Bridge": "br-host", "Tap": "eth0", "Mode": "tap", "MAC": "02:00:00:00:00:01"}},
	}
}

// TestResumeIgnoresHostileImage: an image whose metadata names
// /etc/shadow as kernel and disk, ../ paths, another uuid and name
// resumes with the VM record's identity and devices (simulator backend:
// the domain's spec is what a real backend would turn into a command
// line). Images that cannot be made safe are refused with
// SUSPEND_IMAGE_NOT_ACCESSIBLE and leave the VM Suspended.
func TestResumeIgnoresHostileImage(t *testing.T) {
	r := newResolver()
	e := simEnv(t, sim.Config{}, func(c *xenops.Config) { c.Disks = r })
	disk := filepath.Join(e.dir, "disk0.raw")
	os.WriteFile(disk, make([]byte, 4096), 0o600)
	vdi := e.addVDI("disk0", disk, 4096)
	r.add(vdi, disk)
	vm := e.newVM("victim", nil)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	vif := e.addVIF(vm, "0")
	uuid := e.uuidOf(vm)
	e.call("VM.start", vm, false, false)
	e.call("VM.suspend", vm)
	img := filepath.Join(e.dir, "xenops", "suspend", uuid+".img")
	stream := []byte(`{"simulated-memory":134217728}`)

	craftImage(t, img, hostileMeta("simulator", vbd, vdi), 3, stream)
	e.call("VM.resume", vm, false, false)
	if p := e.power(vm); p != "Running" {
		t.Fatalf("after resume: %s", p)
	}
	spec, ok := e.sim().DomainSpec(uuid)
	if !ok {
		t.Fatal("no domain for the VM's own uuid")
	}
	if spec.UUID != uuid || spec.Name != "victim" || spec.Kernel != "" || spec.Ramdisk != "" || spec.Cmdline != "" ||
		spec.Firmware != "bios" || spec.Platform["disk-bus"] != "" || spec.Memory != 128<<20 {
		t.Fatalf("resume took the domain from the image: %+v", spec)
	}
	info, _ := e.sim().Info(uuid)
	if len(info.Disks) != 1 || info.Disks[0].Path != disk || info.Disks[0].VBD != vbd {
		t.Fatalf("resumed with disks %+v, want only %s", info.Disks, disk)
	}
	if len(info.NICs) != 1 || info.NICs[0].Device != "0" || info.NICs[0].Tap == "eth0" || info.NICs[0].Bridge == "br-host" ||
		info.NICs[0].MAC == "02:00:00:00:00:01" || info.NICs[0].VIF != vif {
		t.Fatalf("resumed with NICs %+v", info.NICs)
	}
	for _, d := range e.sim().List() {
		if d.UUID != uuid {
			t.Fatalf("a domain for another uuid: %q", d.UUID)
		}
	}

	// Refused: hot-plugged "VCPUs" that are other devices, images of
	// another backend, broken framing, trailing garbage in the metadata.
	bad := map[string]func(path string){
		"loader device as VCPU": func(p string) {
			m := hostileMeta("simulator", vbd, vdi)
			m["HotCPUs"] = []map[string]any{{"ID": "cpu-hot-1-0-0", "Args": map[string]any{"driver": "loader", "file": "/etc/shadow", "id": "cpu-hot-1-0-0"}}}
			craftImage(t, p, m, 3, stream)
		},
		"qemu image on the simulator": func(p string) { craftImage(t, p, hostileMeta("qemu", vbd, vdi), 2, stream) },
		"unknown metadata field": func(p string) {
			m := hostileMeta("simulator", vbd, vdi)
			m["Exec"] = "/bin/sh"
			craftImage(t, p, m, 3, stream)
		},
		"truncated": func(p string) {
			craftImage(t, p, hostileMeta("simulator", vbd, vdi), 3, stream)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-20], 0o600)
		},
		"not an image": func(p string) { os.WriteFile(p, []byte("root:$6$x:19000:0:99999:7:::\n"), 0o600) },
	}
	e.call("VM.hard_shutdown", vm)
	for name, craft := range bad {
		e.call("VM.start", vm, false, false)
		e.call("VM.suspend", vm)
		craft(img)
		if p := e.fails("SUSPEND_IMAGE_NOT_ACCESSIBLE", "VM.resume", vm, false, false); len(p) != 1 {
			t.Fatalf("%s: params %v", name, p)
		}
		if p := e.power(vm); p != "Suspended" {
			t.Fatalf("%s: after a refused resume: %s", name, p)
		}
		craftImage(t, img, map[string]any{"Backend": "simulator"}, 3, stream)
		e.call("VM.resume", vm, false, false)
		e.call("VM.hard_shutdown", vm)
	}
}

// setSuspended puts a VM in the state a suspend leaves it in, as if an
// image had been written for it earlier.
func (e *env) setSuspended(vm string) {
	e.t.Helper()
	_, err := e.d.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.PowerState, vm, "Suspended")
	})
	if err != nil {
		e.t.Fatal(err)
	}
}

// TestResumeCannotDeleteOutsideStateDir: the QEMU backend clears a
// domain's state directory before making it. An image naming a uuid of
// "../../victim" made the daemon delete the victim directory; the uuid
// now comes from the database and every removal stays below the state
// directory. The emulator is /bin/false: nothing needs to boot.
func TestResumeCannotDeleteOutsideStateDir(t *testing.T) {
	e := newEnv(t, xenops.Config{Backend: "qemu", QEMU: qemu.Config{Binary: "/bin/false", Accel: "tcg"}}, envOptions{})
	victim := filepath.Join(e.dir, "victim")
	os.MkdirAll(victim, 0o700)
	os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o600)
	vm := e.newVM("evil", nil)
	uuid := e.uuidOf(vm)
	e.setSuspended(vm)
	// StateDir is <dir>/xenops/qemu: ../../victim is <dir>/victim.
	meta := hostileMeta("qemu", "", "")
	meta["Spec"].(map[string]any)["UUID"] = "../../victim"
	meta["Disks"] = []any{}
	craftImage(t, filepath.Join(e.dir, "xenops", "suspend", uuid+".img"), meta, 2, []byte("QEVM"))
	x := e.try("VM.resume", vm, false, false)
	if x == nil {
		t.Fatal("resume with /bin/false as the emulator succeeded")
	}
	if _, err := os.Stat(filepath.Join(victim, "precious")); err != nil {
		t.Fatalf("resuming a crafted image deleted a directory outside the state directory: %v", err)
	}
	if p := e.power(vm); p != "Suspended" {
		t.Fatalf("after a failed resume: %s (%v)", p, x)
	}
	t.Logf("resume failed as expected: %v", x)
}

// TestAutoAccelFallsBackToTCG: with accel "auto", a QEMU that aborts
// under KVM as it does on nested KVM ("failed to set MSR") makes the
// backend choose TCG, and the host record says so and why.
func TestAutoAccelFallsBackToTCG(t *testing.T) {
	fake := filepath.Join(shortTempDir(t), "qemu-system-x86_64")
	script := "#!/bin/sh\necho 'qemu-system-x86_64: error: failed to set MSR 0x48b to 0x1582e00000000' >&2\n" +
		"echo 'qemu-system-x86_64: ../target/i386/kvm/kvm.c:2893: kvm_buf_set_msrs: Assertion failed.' >&2\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e := newEnv(t, xenops.Config{Backend: "qemu", QEMU: qemu.Config{Binary: fake, Accel: "auto"}}, envOptions{})
	t.Logf("start-up with the probe: %v", time.Since(start))
	oc := e.field("host", e.host, "other_config").(map[string]any)
	if oc["accelerator"] != "tcg" {
		t.Fatalf("host other_config accelerator %v, want tcg", oc["accelerator"])
	}
	reason, _ := oc["accelerator_reason"].(string)
	kvm := false
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		kvm = true
	}
	if kvm && !strings.Contains(reason, "failed to set MSR") || !kvm && !strings.Contains(reason, "KVM unusable") {
		t.Fatalf("accelerator_reason %q (/dev/kvm usable: %v)", reason, kvm)
	}
	t.Logf("accelerator tcg: %s", reason)
}

// poisonImageMeta replaces a real suspend image's metadata with hostile
// values (host files as kernel and disks, another uuid), keeping its
// stream and its hot-plugged VCPUs.
func poisonImageMeta(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const sig = "TOOLSTACKD-SUSPEND-1\n"
	n := binary.BigEndian.Uint64(b[len(sig)+8:])
	start := len(sig) + 16
	var meta map[string]any
	if err := json.Unmarshal(b[start:start+int(n)], &meta); err != nil {
		t.Fatal(err)
	}
	meta["Spec"] = hostileMeta("qemu", "", "")["Spec"]
	// The slots stay (a resume keeps the record's devices in those
	// slots); everything else about them is poisoned.
	disks, _ := meta["Disks"].([]any)
	for _, d := range disks {
		d := d.(map[string]any)
		d["Path"], d["VDI"], d["Format"] = "/etc/shadow", "OpaqueRef:not-this", "raw"
	}
	meta["Disks"] = append(disks, map[string]any{"Device": "9", "Path": "/etc/shadow", "Format": "raw"})
	nics, _ := meta["NICs"].([]any)
	for _, n := range nics {
		n := n.(map[string]any)
		n["Tap"], n["Bridge"], n["Mode"] = "eth0", "br-host", "tap"
	}
	mb, _ := json.Marshal(meta)
	var out bytes.Buffer
	out.WriteString(sig)
	var h [16]byte
	binary.BigEndian.PutUint64(h[:8], 1)
	binary.BigEndian.PutUint64(h[8:], uint64(len(mb)))
	out.Write(h[:])
	out.Write(mb)
	out.Write(b[start+int(n):])
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

// qemuArgv is the command line the QEMU backend journalled for a VM.
func (e *env) qemuArgv(uuid string) []string {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.dir, "xenops", "qemu", uuid, "domain.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var j struct{ Argv []string }
	json.Unmarshal(b, &j)
	return j.Argv
}
