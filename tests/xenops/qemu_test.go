package xenops_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xenops"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu"
)

func qemuEnv(t *testing.T, g *guest, r *resolver, tweak ...func(*xenops.Config)) *env {
	cfg := xenops.Config{Backend: "qemu", KernelDirs: []string{g.dir}, QEMU: qemu.Config{Accel: g.accel}}
	if r != nil {
		cfg.Disks = r
	}
	cfg.ShutdownTimeout = 2 * time.Minute
	for _, f := range tweak {
		f(&cfg)
	}
	e := newEnv(t, cfg, envOptions{})
	t.Cleanup(func() { killLeftovers(t, e) })
	return e
}

// guestVM makes a VM that boots the test guest.
func (e *env) guestVM(g *guest, name string, tweak map[string]any) string {
	rec := map[string]any{"PV_kernel": g.kernel, "PV_ramdisk": g.initrd, "PV_args": g.args}
	for k, v := range tweak {
		rec[k] = v
	}
	return e.newVM(name, rec)
}

// qcow2 makes a disk image with qemu-img.
func qcow2(t *testing.T, path string, size string) {
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", path, size).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
}

func (e *env) pid(vm string) int {
	info, ok := e.m.Backend().Info(e.field("VM", vm, "uuid").(string))
	if !ok {
		return 0
	}
	return info.Pid
}

func (e *env) domState(vm string) backend.DomainState {
	info, _ := e.m.Backend().Info(e.field("VM", vm, "uuid").(string))
	return info.State
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// qemuProcesses lists the QEMU processes whose command line names uuid.
func qemuProcesses(uuid string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(cmd, []byte("qemu-system")) && bytes.Contains(cmd, []byte(uuid)) && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// holds reports whether process pid has path open.
func holds(pid int, path string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == path {
			return true
		}
	}
	return false
}

// killLeftovers kills the QEMU processes a test's VMs left behind (a
// failed test), by pid, and reports them.
func killLeftovers(t *testing.T, e *env) {
	for _, vm := range e.d.Snapshot().All(vmClass) {
		for _, pid := range qemuProcesses(vm.UUID()) {
			t.Errorf("QEMU process %d of VM %s left running; killing it", pid, vm.UUID())
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// noLeftovers checks nothing of the VM is left on the host.
func noLeftovers(t *testing.T, e *env, vm string) {
	t.Helper()
	uuid := e.field("VM", vm, "uuid").(string)
	if p := qemuProcesses(uuid); len(p) != 0 {
		t.Errorf("QEMU processes left: %v", p)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "xenops", "qemu", uuid)); !os.IsNotExist(err) {
		t.Errorf("domain directory left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "xenops", "suspend", uuid+".img")); !os.IsNotExist(err) {
		t.Errorf("suspend image left: %v", err)
	}
}

func TestQEMULifecycle(t *testing.T) {
	g := testGuest(t)
	t.Logf("guest accelerator: %s", g.accel)
	r := newResolver()
	e := qemuEnv(t, g, r)
	vm := e.guestVM(g, "qemu-life", map[string]any{"VCPUs_max": 2})
	uuid := e.field("VM", vm, "uuid").(string)
	disk := filepath.Join(e.dir, "disk.qcow2")
	qcow2(t, disk, "64M")
	vdi := e.addVDI("disk", disk, 64<<20)
	r.add(vdi, disk)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	cd := e.addVBD(vm, "OpaqueRef:NULL", "3", "CD", "RO")
	e.addVIF(vm, "0")

	// start
	t0 := time.Now()
	e.call("VM.start", vm, false, false)
	t.Logf("VM.start took %v", time.Since(t0))
	pid := e.pid(vm)
	if !alive(pid) || e.domState(vm) != backend.DomainRunning || e.power(vm) != "Running" {
		t.Fatalf("after start: pid %d alive %v, domain %s, power %s", pid, alive(pid), e.domState(vm), e.power(vm))
	}
	cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if !bytes.Contains(cmd, []byte(uuid)) || !holds(pid, disk) {
		t.Fatalf("QEMU does not hold the disk or its command line lacks the uuid: %q", cmd)
	}
	if e.field("VBD", vbd, "currently_attached") != true || e.field("VBD", vbd, "device") != "vda" {
		t.Fatalf("VBD: %v", e.record("VBD", vbd))
	}
	serial := e.console(vm, "vt100")
	line := serial.waitFor(t, "GUEST-READY", 3*time.Minute)
	if !strings.Contains(line, "vda") {
		t.Errorf("the guest does not see its disk: %q", line)
	}
	serial.Close()
	vnc := e.console(vm, "rfb")
	banner := make([]byte, 12)
	vnc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := vnc.Read(banner); err != nil || !strings.HasPrefix(string(banner), "RFB 003.") {
		t.Errorf("VNC banner %q %v", banner, err)
	}
	vnc.Close()
	// Hotplug: a disk the guest sees come and go, a CD, a NIC.
	disk2 := filepath.Join(e.dir, "disk2.qcow2")
	qcow2(t, disk2, "16M")
	vdi2 := e.addVDI("disk2", disk2, 16<<20)
	r.add(vdi2, disk2)
	vbd2 := e.addVBD(vm, vdi2, "1", "Disk", "RW")
	e.call("VBD.plug", vbd2)
	serial = e.console(vm, "vt100")
	serial.waitFor(t, "vda vdb", time.Minute)
	e.call("VBD.unplug", vbd2)
	serial.waitForLine(t, func(l string) bool { return strings.Contains(l, "GUEST-READY") && !strings.Contains(l, "vdb") }, time.Minute)
	serial.Close()
	iso := filepath.Join(e.dir, "cd.iso")
	os.WriteFile(iso, make([]byte, 1<<20), 0o600)
	isoVDI := e.addVDI("iso", iso, 1<<20)
	r.add(isoVDI, iso)
	e.call("VBD.insert", cd, isoVDI)
	e.call("VBD.eject", cd)
	vif2 := e.addVIF(vm, "1")
	e.call("VIF.plug", vif2)
	e.call("VIF.unplug", vif2)
	if r.inUse() != 1 {
		t.Fatalf("%d VDIs attached after hotplug round trips", r.inUse())
	}
	e.call("VM.set_VCPUs_number_live", vm, int64(2))
	if n := e.record("VM_metrics", e.field("VM", vm, "metrics").(string))["VCPUs_number"]; n != 2.0 {
		t.Errorf("VCPUs_number after hotplug: %v", n)
	}

	// pause, unpause: same process, stopped and running again.
	e.call("VM.pause", vm)
	if e.power(vm) != "Paused" || e.domState(vm) != backend.DomainPaused || e.pid(vm) != pid || !alive(pid) {
		t.Fatalf("after pause: %s %s pid %d", e.power(vm), e.domState(vm), e.pid(vm))
	}
	e.call("VM.unpause", vm)
	if e.power(vm) != "Running" || e.domState(vm) != backend.DomainRunning || e.pid(vm) != pid {
		t.Fatalf("after unpause: %s %s", e.power(vm), e.domState(vm))
	}

	// suspend: the process goes, an image stays.
	t0 = time.Now()
	e.call("VM.suspend", vm)
	t.Logf("VM.suspend took %v", time.Since(t0))
	if e.power(vm) != "Suspended" || alive(pid) {
		t.Fatalf("after suspend: %s, pid %d alive %v", e.power(vm), pid, alive(pid))
	}
	img := filepath.Join(e.dir, "xenops", "suspend", uuid+".img")
	if st, err := os.Stat(img); err != nil || st.Size() < 1<<20 {
		t.Fatalf("suspend image: %v", err)
	}
	if r.inUse() != 0 {
		t.Fatalf("%d VDIs attached while suspended", r.inUse())
	}
	// The image is untrusted: its metadata now names host files as
	// kernel and disk and another uuid; the resume must take the domain
	// from the VM record, hot-plugged VCPU included, and only the stream
	// from the image.
	poisonImageMeta(t, img)

	// resume: a new process carries on where the guest was.
	t0 = time.Now()
	e.call("VM.resume", vm, false, false)
	t.Logf("VM.resume took %v", time.Since(t0))
	pid2 := e.pid(vm)
	if e.power(vm) != "Running" || !alive(pid2) || pid2 == pid {
		t.Fatalf("after resume: %s pid %d", e.power(vm), pid2)
	}
	if argv := strings.Join(e.qemuArgv(uuid), " "); strings.Contains(argv, "/etc/shadow") || strings.Contains(argv, "not-this-vm") ||
		!strings.Contains(argv, g.kernel) && !strings.Contains(argv, "-kernel /proc/self/fd/") || !strings.Contains(argv, "cpu-hot-") {
		t.Fatalf("resumed with a command line from the image: %s", argv)
	}
	serial = e.console(vm, "vt100")
	serial.waitFor(t, "GUEST-READY", 30*time.Second) // the loop goes on: no reboot
	serial.Close()
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Error("suspend image left after resume")
	}

	// hard_reboot: a new process, a new domain.
	domid := e.field("VM", vm, "domid")
	e.call("VM.hard_reboot", vm)
	pid3 := e.pid(vm)
	if e.power(vm) != "Running" || !alive(pid3) || alive(pid2) || e.field("VM", vm, "domid") == domid {
		t.Fatalf("after hard_reboot: %s pid %d (old %d alive %v) domid %v", e.power(vm), pid3, pid2, alive(pid2), e.field("VM", vm, "domid"))
	}
	serial = e.console(vm, "vt100")
	serial.waitFor(t, "GUEST-READY", 3*time.Minute)
	serial.Close()

	// clean_reboot: ACPI power button, the guest powers off, a new domain.
	t0 = time.Now()
	e.call("VM.clean_reboot", vm)
	t.Logf("VM.clean_reboot took %v", time.Since(t0))
	pid4 := e.pid(vm)
	if e.power(vm) != "Running" || !alive(pid4) || alive(pid3) {
		t.Fatalf("after clean_reboot: %s pid %d", e.power(vm), pid4)
	}
	serial = e.console(vm, "vt100")
	serial.waitFor(t, "GUEST-READY", 3*time.Minute)
	serial.Close()

	// A live snapshot of the disk: an overlay becomes its active image.
	overlay := filepath.Join(e.dir, "overlay.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", "-b", disk, "-F", "qcow2", overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	if err := e.m.LiveSnapshot(context.Background(), uuid, vdi, overlay, "qcow2"); err != nil {
		t.Fatalf("live snapshot: %v", err)
	}
	if info, _ := e.m.Backend().Info(uuid); info.Disks[0].Path != overlay {
		t.Fatalf("disk after live snapshot: %+v", info.Disks)
	}

	// clean_shutdown: the guest powers itself off on the ACPI request.
	t0 = time.Now()
	e.call("VM.clean_shutdown", vm)
	t.Logf("VM.clean_shutdown took %v", time.Since(t0))
	if e.power(vm) != "Halted" || alive(pid4) {
		t.Fatalf("after clean_shutdown: %s, pid alive %v", e.power(vm), alive(pid4))
	}
	if r.inUse() != 0 {
		t.Fatalf("%d VDIs attached after shutdown", r.inUse())
	}

	// hard_shutdown.
	e.call("VM.start", vm, false, false)
	pid5 := e.pid(vm)
	e.call("VM.hard_shutdown", vm)
	if e.power(vm) != "Halted" || alive(pid5) {
		t.Fatalf("after hard_shutdown: %s, pid alive %v", e.power(vm), alive(pid5))
	}

	// The guest powers itself off: noticed, Halted.
	e.call("VM.start", vm, false, false)
	pid6 := e.pid(vm)
	serial = e.console(vm, "vt100")
	serial.waitFor(t, "GUEST-READY", 3*time.Minute)
	fmt.Fprintf(serial, "\npoweroff -f\n")
	eventually(t, 30*time.Second, "Halted after the guest powered off", func() bool { return e.power(vm) == "Halted" })
	serial.Close()
	if alive(pid6) {
		t.Fatal("QEMU still runs after the guest powered off")
	}

	// QEMU dies: noticed within a second, actions_after_crash applied.
	e.call("VM.start", vm, false, false)
	pid7 := e.pid(vm)
	syscall.Kill(pid7, syscall.SIGKILL)
	killed := time.Now()
	eventually(t, 2*time.Second, "Halted after QEMU died", func() bool { return e.power(vm) == "Halted" })
	if d := time.Since(killed); d > time.Second {
		t.Errorf("QEMU's death noticed after %v", d)
	} else {
		t.Logf("QEMU's death noticed and handled in %v", d)
	}
	checkHalted(t, e, vm, "after everything")
	noLeftovers(t, e, vm)
	if r.inUse() != 0 {
		t.Fatalf("%d VDIs attached at the end", r.inUse())
	}
}

// TestQEMUCancelEveryStep cancels VM.start on QEMU at each step and
// checks that no process, tap, file or attachment is left.
func TestQEMUCancelEveryStep(t *testing.T) {
	g := testGuest(t)
	r := newResolver()
	var e *env
	var mu sync.Mutex
	var steps []string
	cancelAt := -1
	taskCh := make(chan string, 1)
	e = qemuEnv(t, g, r, func(c *xenops.Config) {
		c.OnStep = func(vm, op, step string) {
			if op != "start" {
				return
			}
			mu.Lock()
			k := len(steps)
			steps = append(steps, step)
			at := cancelAt
			mu.Unlock()
			if k == at {
				e.post("task.cancel", e.sess, <-taskCh)
			}
		}
	})
	vm := e.guestVM(g, "qemu-cancel", nil)
	disk := filepath.Join(e.dir, "disk.qcow2")
	qcow2(t, disk, "16M")
	vdi := e.addVDI("disk", disk, 16<<20)
	r.add(vdi, disk)
	e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.addVIF(vm, "0")
	e.call("VM.start", vm, false, false)
	e.call("VM.hard_shutdown", vm)
	mu.Lock()
	all := append([]string(nil), steps...)
	mu.Unlock()
	for k := range all {
		mu.Lock()
		steps, cancelAt = nil, k
		mu.Unlock()
		task := e.async("VM.start", vm, false, false)
		taskCh <- task
		start := time.Now()
		st, info := e.wait(task, 30*time.Second)
		if st != "cancelled" || info[0] != "TASK_CANCELLED" {
			t.Fatalf("step %d (%s): %s %v", k, all[k], st, info)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("step %d: cancelling took %v", k, d)
		}
		checkHalted(t, e, vm, fmt.Sprintf("cancelled at step %d (%s)", k, all[k]))
		noLeftovers(t, e, vm)
		if r.inUse() != 0 {
			t.Fatalf("step %d (%s): %d VDIs attached", k, all[k], r.inUse())
		}
	}
	t.Logf("cancelled VM.start on QEMU at each of its %d steps: %v", len(all), all)
}

// TestQEMUBadBackend: an emulator that is missing, or dies at once, or
// KVM that is required but unusable, give the errors a xapi user gets
// and leave nothing behind.
func TestQEMUBadBackend(t *testing.T) {
	g := testGuest(t)
	for _, c := range []struct {
		name string
		qc   qemu.Config
		code string
	}{
		{"missing", qemu.Config{Binary: "/nonexistent/qemu-system-x86_64", Accel: "tcg"}, "FAILED_TO_START_EMULATOR"},
		{"dies", qemu.Config{Binary: "/bin/false", Accel: "tcg"}, "FAILED_TO_START_EMULATOR"},
		{"no-kvm", qemu.Config{Accel: "kvm", KVMDevice: "/nonexistent/kvm"}, "VM_HVM_REQUIRED"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := qemuEnv(t, g, nil, func(cfg *xenops.Config) { cfg.QEMU = c.qc })
			vm := e.guestVM(g, "bad-"+c.name, nil)
			e.addVIF(vm, "0")
			p := e.fails(c.code, "VM.start", vm, false, false)
			if p[0] != vm {
				t.Errorf("%s params %v", c.code, p)
			}
			checkHalted(t, e, vm, c.name)
			noLeftovers(t, e, vm)
		})
	}
}

// tapsOn lists the taps toolstackd made (tsvif*) that are up on this host.
func tapsOn() []string {
	ents, _ := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "tsvif") {
			out = append(out, e.Name())
		}
	}
	return out
}

// testBridge makes a Linux bridge for the test, or skips it when this
// host does not allow that (not root, no iproute2, no CAP_NET_ADMIN).
func testBridge(t *testing.T) string {
	if os.Geteuid() != 0 {
		t.Skip("taps need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no iproute2")
	}
	name := "xobr" + strconv.Itoa(os.Getpid()%100000)
	if out, err := exec.Command("ip", "link", "add", "name", name, "type", "bridge").CombinedOutput(); err != nil {
		t.Skipf("cannot make a bridge here: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "link", "del", "dev", name).Run() })
	exec.Command("ip", "link", "set", "dev", name, "up").Run()
	return name
}

// TestQEMUTaps: a VIF on a network whose bridge exists gets a tap on it,
// and no tap outlives its domain, however the domain ends.
func TestQEMUTaps(t *testing.T) {
	g := testGuest(t)
	if len(tapsOn()) != 0 {
		t.Skipf("taps of another toolstackd exist: %v", tapsOn())
	}
	bridge := testBridge(t)
	dir := shortTempDir(t)
	var e *env
	var mu sync.Mutex
	var steps []string
	cancelAt := -1
	taskCh := make(chan string, 1)
	onStep := func(vm, op, step string) {
		if op != "start" {
			return
		}
		mu.Lock()
		k := len(steps)
		steps = append(steps, step)
		at := cancelAt
		mu.Unlock()
		if k == at {
			e.post("task.cancel", e.sess, <-taskCh)
		}
	}
	cfg := xenops.Config{Backend: "qemu", KernelDirs: []string{g.dir}, QEMU: qemu.Config{Accel: g.accel}, OnStep: onStep}
	e = newEnv(t, cfg, envOptions{dir: dir, persist: true})
	t.Cleanup(func() { killLeftovers(t, e) })
	var net string
	e.d.Update(func(tx *db.Tx) (err error) {
		net, err = tx.Insert(dm.Network.Class, "", (&dm.NetworkRecord{NameLabel: "test bridge", Bridge: bridge, MTU: 1500,
			OtherConfig: map[string]string{}, Purpose: []dm.NetworkPurpose{}}).Row())
		return err
	})
	vm := e.guestVM(g, "taps", nil)
	e.call("VIF.create", map[string]any{"device": "0", "network": net, "VM": vm, "MAC": "", "MTU": 1500, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}, "locking_mode": "network_default",
		"ipv4_allowed": []string{}, "ipv6_allowed": []string{}})
	e.call("VM.start", vm, false, false)
	domid := int(e.field("VM", vm, "domid").(float64))
	tap := "tsvif" + strconv.Itoa(domid) + ".0"
	if master, err := os.Readlink("/sys/class/net/" + tap + "/master"); err != nil || filepath.Base(master) != bridge {
		t.Fatalf("tap %s on %q: %v (taps %v)", tap, master, err, tapsOn())
	}
	e.call("VM.hard_shutdown", vm)
	if taps := tapsOn(); len(taps) != 0 {
		t.Fatalf("taps left after hard_shutdown: %v", taps)
	}
	mu.Lock()
	all := append([]string(nil), steps...)
	mu.Unlock()
	for k := range all {
		mu.Lock()
		steps, cancelAt = nil, k
		mu.Unlock()
		task := e.async("VM.start", vm, false, false)
		taskCh <- task
		if st, _ := e.wait(task, 30*time.Second); st != "cancelled" {
			t.Fatalf("step %d: %s", k, st)
		}
		if taps := tapsOn(); len(taps) != 0 {
			t.Fatalf("taps left after cancelling at %s: %v", all[k], taps)
		}
	}
	mu.Lock()
	cancelAt = -1
	mu.Unlock()
	// A domain that dies while toolstackd is down: its tap goes at restart.
	e.call("VM.start", vm, false, false)
	uuid := e.uuidOf(vm)
	pids := qemuProcesses(uuid)
	e.close()
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	for _, p := range pids {
		eventually(t, 10*time.Second, "the killed QEMU to die", func() bool { return !alive(p) })
	}
	e = newEnv(t, cfg, envOptions{dir: dir, persist: true})
	if p := e.power(vm); p != "Halted" {
		t.Fatalf("after restart: %s", p)
	}
	if taps := tapsOn(); len(taps) != 0 {
		t.Fatalf("taps left by a domain that died while toolstackd was down: %v", taps)
	}
}

// TestQEMUFirmware starts a VM with UEFI (OVMF) firmware and an empty
// disk: QEMU runs with its own variable store.
func TestQEMUFirmware(t *testing.T) {
	g := testGuest(t)
	if _, err := os.Stat("/usr/share/OVMF/OVMF_CODE.fd"); err != nil {
		t.Skip("no OVMF (package ovmf)")
	}
	r := newResolver()
	e := qemuEnv(t, g, r)
	vm := e.newVM("uefi", map[string]any{"HVM_boot_params": map[string]string{"order": "c", "firmware": "uefi"}})
	disk := filepath.Join(e.dir, "blank.qcow2")
	qcow2(t, disk, "16M")
	vdi := e.addVDI("blank", disk, 16<<20)
	r.add(vdi, disk)
	e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.call("VM.start", vm, false, false)
	uuid := e.uuidOf(vm)
	pid := e.pid(vm)
	cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if !alive(pid) || !bytes.Contains(cmd, []byte("if=pflash")) {
		t.Fatalf("UEFI VM: pid %d alive %v, command line %q", pid, alive(pid), cmd)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "xenops", "qemu", uuid, "OVMF_VARS.fd")); err != nil {
		t.Fatalf("variable store: %v", err)
	}
	e.call("VM.hard_shutdown", vm)
	noLeftovers(t, e, vm)
}
