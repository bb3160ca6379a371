package xenops_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/testkit/testdaemon"
)

// Suspend images live in VDIs of the suspend SR, as xapi's do: the real
// daemon (storage and xenops together), on the simulator and on QEMU with
// the tiny guest.

const nullRef = "OpaqueRef:NULL"

// suspendSR is the pool's suspend image SR (first boot's local SR).
func (e *env) suspendSR() string {
	e.t.Helper()
	var pools []string
	json.Unmarshal(e.call("pool.get_all"), &pools)
	if len(pools) != 1 {
		e.t.Fatalf("pools: %v", pools)
	}
	sr, _ := e.field("pool", pools[0], "suspend_image_SR").(string)
	if sr == "" || sr == nullRef {
		e.t.Fatal("the pool has no suspend image SR")
	}
	return sr
}

func (e *env) num(class, ref, f string) int64 {
	e.t.Helper()
	n, ok := e.field(class, ref, f).(float64)
	if !ok {
		e.t.Fatalf("%s.%s of %s is not a number: %v", class, f, ref, e.field(class, ref, f))
	}
	return int64(n)
}

// checkSuspendVDI checks a Suspended VM's image: a VDI of type suspend
// made out to the VM, listed in the suspend SR, counted in its
// virtual_allocation (alloc0 was the SR's before the suspend) and
// holding data; no image or staging file left in the data directory.
func (e *env) checkSuspendVDI(vm, sr string, alloc0 int64, dir string) string {
	e.t.Helper()
	if p := e.power(vm); p != "Suspended" {
		e.t.Fatalf("power %s, want Suspended", p)
	}
	vdi, _ := e.field("VM", vm, "suspend_VDI").(string)
	if vdi == "" || vdi == nullRef {
		e.t.Fatal("a Suspended VM without a suspend_VDI")
	}
	rec := e.record("VDI", vdi)
	smc, _ := rec["sm_config"].(map[string]any)
	if rec["type"] != "suspend" || rec["name_label"] != "Suspend image" || rec["SR"] != sr || smc["vmhint"] != e.uuidOf(vm) {
		e.t.Fatalf("suspend VDI: type %v name %v SR %v (want %s) sm_config %v", rec["type"], rec["name_label"], rec["SR"], sr, smc)
	}
	if !contains(strSet(e.field("SR", sr, "VDIs")), vdi) {
		e.t.Fatal("the suspend VDI is not listed in its SR")
	}
	size, phys := e.num("VDI", vdi, "virtual_size"), e.num("VDI", vdi, "physical_utilisation")
	if phys <= 0 || phys > size {
		e.t.Fatalf("suspend VDI: physical_utilisation %d of virtual_size %d", phys, size)
	}
	if got := e.num("SR", sr, "virtual_allocation"); got != alloc0+size {
		e.t.Fatalf("SR virtual_allocation %d, want %d + %d", got, alloc0, size)
	}
	if used := e.num("SR", sr, "physical_utilisation"); used < phys {
		e.t.Fatalf("SR physical_utilisation %d is less than its suspend VDI's %d", used, phys)
	}
	noImageFiles(e.t, dir)
	return vdi
}

// noImageFiles: images live in VDIs, not as files of xenops'.
func noImageFiles(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(dir, "xenops", "suspend"))
	for _, ent := range ents {
		t.Errorf("file left in the suspend directory: %s", ent.Name())
	}
}

// checkExport reads a suspend VDI through /export_raw_vdi: all of it,
// an image at its start.
func (e *env) checkExport(vdi string) {
	e.t.Helper()
	q := url.Values{"session_id": {e.sess}, "vdi": {vdi}, "format": {"raw"}}
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Get(e.url + "/export_raw_vdi?" + q.Encode())
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		e.t.Fatalf("export: %s %s", resp.Status, b)
	}
	br := bufio.NewReader(resp.Body)
	head, err := br.Peek(21)
	if err != nil || string(head) != "TOOLSTACKD-SUSPEND-1\n" {
		e.t.Fatalf("export does not start with an image: %q %v", head, err)
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil || n != e.num("VDI", vdi, "virtual_size") {
		e.t.Fatalf("export: %d bytes (%v), want the VDI's %d", n, err, e.num("VDI", vdi, "virtual_size"))
	}
}

// importRaw writes data at the start of a VDI through /import_raw_vdi.
func (e *env) importRaw(vdi string, data []byte) {
	e.t.Helper()
	q := url.Values{"session_id": {e.sess}, "vdi": {vdi}, "format": {"raw"}}
	req, err := http.NewRequest(http.MethodPut, e.url+"/import_raw_vdi?"+q.Encode(), bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		e.t.Fatalf("import: %s %s", resp.Status, b)
	}
}

// checkGone: the VM has let go of its image and the VDI is destroyed.
func (e *env) checkGone(vm, vdi, sr string, alloc0 int64, dir string) {
	e.t.Helper()
	if v := e.field("VM", vm, "suspend_VDI"); v != nullRef {
		e.t.Fatalf("suspend_VDI %v after the image's use", v)
	}
	if x := e.try("VDI.get_record", vdi); x == nil || x.Code != "HANDLE_INVALID" {
		e.t.Fatalf("the suspend VDI is still there: %v", x)
	}
	if contains(strSet(e.field("SR", sr, "VDIs")), vdi) {
		e.t.Fatal("the SR still lists the suspend VDI")
	}
	if got := e.num("SR", sr, "virtual_allocation"); got != alloc0 {
		e.t.Fatalf("SR virtual_allocation %d, want %d again", got, alloc0)
	}
	noImageFiles(e.t, dir)
}

// TestSuspendVDISimulator: suspend writes the image into a suspend VDI
// that survives a daemon restart; resume, hard_shutdown and destroy drop
// it; a checkpoint and a clone of it get VDIs of their own; a forged record
// naming a suspend VDI gets nothing, and a VDI whose content is not an
// image is refused.
func TestSuspendVDISimulator(t *testing.T) {
	dir := shortTempDir(t)
	d := startDaemon(t, dir, testdaemon.FreeAddr(t, ""), "simulator")
	defer func() { d.Kill() }()
	e := remote(t, d)
	sr := e.suspendSR()
	alloc0 := e.num("SR", sr, "virtual_allocation")
	vm := e.newVM("sleeper", nil)
	e.call("VM.start", vm, false, false)
	e.call("VM.suspend", vm)
	vdi := e.checkSuspendVDI(vm, sr, alloc0, dir)
	e.checkExport(vdi)

	// A restart while Suspended: the image is still there to resume.
	d.Kill()
	d = d.Restart()
	e = remote(t, d)
	if e.field("VM", vm, "suspend_VDI") != vdi {
		t.Fatal("suspend_VDI lost across a restart")
	}
	e.call("VM.resume", vm, false, false)
	if p := e.power(vm); p != "Running" {
		t.Fatalf("after resume: %s", p)
	}
	e.checkGone(vm, vdi, sr, alloc0, dir)

	// hard_shutdown of a Suspended VM destroys its image.
	e.call("VM.suspend", vm)
	vdi = e.checkSuspendVDI(vm, sr, alloc0, dir)
	e.call("VM.hard_shutdown", vm)
	if p := e.power(vm); p != "Halted" {
		t.Fatalf("after hard_shutdown: %s", p)
	}
	e.checkGone(vm, vdi, sr, alloc0, dir)

	// VM.destroy of a Suspended VM destroys its image.
	e.call("VM.start", vm, false, false)
	e.call("VM.suspend", vm)
	vdi = e.checkSuspendVDI(vm, sr, alloc0, dir)
	e.call("VM.destroy", vm)
	if x := e.try("VDI.get_record", vdi); x == nil || x.Code != "HANDLE_INVALID" {
		t.Fatalf("VM.destroy of a Suspended VM left its suspend VDI: %v", x)
	}

	// A checkpoint's snapshot holds the memory in a VDI of its own, and
	// a VM cloned from the snapshot gets a copy of its own, which it
	// resumes from.
	vm2 := e.newVM("checkpointed", nil)
	e.call("VM.start", vm2, false, false)
	snap := e.str(e.call("VM.checkpoint", vm2, "cp"))
	if p := e.power(vm2); p != "Running" {
		t.Fatalf("after checkpoint: %s", p)
	}
	svdi := e.checkSuspendVDI(snap, sr, alloc0, dir)
	size := e.num("VDI", svdi, "virtual_size")
	twin := e.str(e.call("VM.clone", snap, "twin"))
	tvdi := e.checkSuspendVDI(twin, sr, alloc0+size, dir)
	if tvdi == svdi {
		t.Fatal("the clone shares the snapshot's suspend VDI")
	}
	e.call("VM.set_is_a_template", twin, false) // a snapshot's clone is a template
	e.call("VM.resume", twin, false, false)
	e.checkGone(twin, tvdi, sr, alloc0+size, dir)
	e.call("VM.hard_shutdown", twin)
	e.call("VM.destroy", twin)
	e.call("VM.destroy", snap)
	if x := e.try("VDI.get_record", svdi); x == nil || x.Code != "HANDLE_INVALID" {
		t.Fatalf("destroying the snapshot left its suspend VDI: %v", x)
	}

	// Hostile: a record naming another VM's suspend VDI gets neither the
	// image nor the power to destroy it.
	e.call("VM.suspend", vm2)
	v2 := e.checkSuspendVDI(vm2, sr, alloc0, dir)
	rec := testdaemon.VMRecord("forged")
	rec["power_state"], rec["suspend_VDI"] = "Suspended", v2
	forged := e.str(e.call("VM.create", rec))
	if p, v := e.power(forged), e.field("VM", forged, "suspend_VDI"); p != "Halted" || v != nullRef {
		t.Fatalf("forged record: %s suspend_VDI %v", p, v)
	}
	if x := e.try("VM.resume", forged, false, false); x == nil {
		t.Fatal("a forged VM resumed")
	}
	e.call("VM.destroy", forged)
	e.call("VM.resume", vm2, false, false)
	e.checkGone(vm2, v2, sr, alloc0, dir)

	// Hostile: whoever can write a suspend VDI can write an image. One
	// that is not an image is refused, naming the VDI, and the VM stays
	// Suspended with it.
	e.call("VM.suspend", vm2)
	v2 = e.checkSuspendVDI(vm2, sr, alloc0, dir)
	e.importRaw(v2, bytes.Repeat([]byte("root:$6$x:19000:0:99999:7:::\n"), 200))
	if p := e.fails("SUSPEND_IMAGE_NOT_ACCESSIBLE", "VM.resume", vm2, false, false); len(p) != 1 || p[0] != v2 {
		t.Fatalf("refused resume names %v, want the VDI %s", p, v2)
	}
	if e.checkSuspendVDI(vm2, sr, alloc0, dir) != v2 {
		t.Fatal("a refused resume changed the suspend VDI")
	}
	e.call("VM.hard_shutdown", vm2)
	e.checkGone(vm2, v2, sr, alloc0, dir)
	stop(t, d)
}

// TestSuspendVDIUpgrade: a daemon from before suspend VDIs left a VM
// Suspended with its image as a file under DATA_DIR/xenops/suspend and a
// null suspend_VDI; the daemon of today resumes it from that file, and
// its next suspend goes to a VDI.
func TestSuspendVDIUpgrade(t *testing.T) {
	dir := shortTempDir(t)
	d := startDaemon(t, dir, testdaemon.FreeAddr(t, ""), "simulator")
	defer func() { d.Kill() }()
	e := remote(t, d)
	sr := e.suspendSR()
	alloc0 := e.num("SR", sr, "virtual_allocation")
	vm := e.newVM("old-timer", nil)
	uuid := e.uuidOf(vm)
	e.call("VM.start", vm, false, false)
	e.call("VM.suspend", vm)
	vdi := e.checkSuspendVDI(vm, sr, alloc0, dir)
	// The image as the old daemon kept it: the VDI's content up to the
	// end record (whose last 8 bytes, its length, are zeroes).
	q := url.Values{"session_id": {e.sess}, "vdi": {vdi}, "format": {"raw"}}
	resp, err := http.Get(e.url + "/export_raw_vdi?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	img := append(bytes.TrimRight(b, "\x00"), make([]byte, 8)...)
	e.call("VDI.destroy", vdi)
	stop(t, d)

	st, err := persist.Open(filepath.Join(dir, "toolstackd.db"), dm.Model, persist.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := db.New(dm.Model, db.Options{Persister: st})
	if err := st.Load(old); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.SuspendVDI, vm, nullRef) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	legacy := filepath.Join(dir, "xenops", "suspend", uuid+".img")
	if err := os.WriteFile(legacy, img, 0o600); err != nil {
		t.Fatal(err)
	}

	d = d.Restart()
	e = remote(t, d)
	if p, v := e.power(vm), e.field("VM", vm, "suspend_VDI"); p != "Suspended" || v != nullRef {
		t.Fatalf("the old state: %s suspend_VDI %v", p, v)
	}
	e.call("VM.resume", vm, false, false)
	if p := e.power(vm); p != "Running" {
		t.Fatalf("after resuming from the old file: %s", p)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Fatalf("the old image file is left: %v", err)
	}
	e.call("VM.suspend", vm)
	vdi = e.checkSuspendVDI(vm, sr, alloc0, dir)
	e.call("VM.resume", vm, false, false)
	e.checkGone(vm, vdi, sr, alloc0, dir)
	e.call("VM.hard_shutdown", vm)
	stop(t, d)
}

// TestSuspendVDIQEMU: the tiny guest on QEMU is suspended into a VDI,
// the daemon restarts, and the resumed guest carries on with the state
// it had (a shell variable set before the suspend); a second suspend
// ends with hard_shutdown, which destroys the image.
func TestSuspendVDIQEMU(t *testing.T) {
	g := testGuest(t)
	dir := shortTempDir(t)
	env := []string{"TOOLSTACKD_QEMU_ACCEL=" + g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.dir}
	d := startDaemon(t, dir, testdaemon.FreeAddr(t, ""), "qemu", env...)
	defer func() { d.Kill() }()
	e := remote(t, d)
	vm := e.guestVM(g, "qemu-sleeper", nil)
	uuid := e.uuidOf(vm)
	t.Cleanup(func() {
		for _, pid := range qemuProcesses(uuid) {
			t.Errorf("QEMU %d left running; killing it", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	sr := e.suspendSR()
	alloc0 := e.num("SR", sr, "virtual_allocation")
	e.call("VM.start", vm, false, false)
	serial := e.console(vm, "vt100")
	serial.waitFor(t, "GUEST-READY", 3*time.Minute)
	a, b := time.Now().Nanosecond()%10000, 7919
	want := fmt.Sprintf("kept-%d-end", a+b)
	// The shell says when it has the value, before the suspend: a TCG
	// guest on a busy machine may take a while to read the line.
	fmt.Fprintf(serial, "KEPT=$((%d+%d)); echo set-$KEPT-end\n", a, b)
	serial.waitFor(t, fmt.Sprintf("set-%d-end", a+b), time.Minute)
	serial.Close()

	t0 := time.Now()
	e.call("VM.suspend", vm)
	t.Logf("VM.suspend took %v", time.Since(t0))
	if p := qemuProcesses(uuid); len(p) != 0 {
		t.Fatalf("QEMU still running after suspend: %v", p)
	}
	vdi := e.checkSuspendVDI(vm, sr, alloc0, dir)
	t.Logf("suspend VDI: virtual_size %d, physical_utilisation %d", e.num("VDI", vdi, "virtual_size"), e.num("VDI", vdi, "physical_utilisation"))
	e.checkExport(vdi)

	d.Kill()
	d = d.Restart()
	e = remote(t, d)
	t0 = time.Now()
	e.call("VM.resume", vm, false, false)
	t.Logf("VM.resume took %v", time.Since(t0))
	if p := e.power(vm); p != "Running" || len(qemuProcesses(uuid)) != 1 {
		t.Fatalf("after resume: %s, QEMU %v", p, qemuProcesses(uuid))
	}
	e.checkGone(vm, vdi, sr, alloc0, dir)
	serial = e.console(vm, "vt100")
	fmt.Fprintf(serial, "echo kept-$KEPT-end\n")
	line := serial.waitForLine(t, func(l string) bool { return strings.Contains(l, "kept-") && !strings.Contains(l, "$KEPT") }, time.Minute)
	serial.Close()
	if !strings.Contains(line, want) {
		t.Fatalf("the resumed guest lost its state: %q, want %q", strings.TrimSpace(line), want)
	}

	e.call("VM.suspend", vm)
	vdi = e.checkSuspendVDI(vm, sr, alloc0, dir)
	e.call("VM.hard_shutdown", vm)
	if p := e.power(vm); p != "Halted" {
		t.Fatalf("after hard_shutdown: %s", p)
	}
	e.checkGone(vm, vdi, sr, alloc0, dir)
	stop(t, d)
}
