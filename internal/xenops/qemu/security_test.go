package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// A journal in the QEMU state directory decides what Destroy removes and
// which tap it deletes: one that names anything outside is not managed,
// so a crafted domain.json cannot make the daemon delete a directory.
func TestQEMUJournalCannotNameOutside(t *testing.T) {
	root := t.TempDir()
	state := filepath.Join(root, "state")
	victim := filepath.Join(root, "victim")
	os.MkdirAll(victim, 0o700)
	os.WriteFile(filepath.Join(victim, "precious"), []byte("x"), 0o600)
	journal := func(name string, j qemuJournal) {
		dir := filepath.Join(state, name)
		os.MkdirAll(dir, 0o700)
		b, _ := json.Marshal(j)
		os.WriteFile(filepath.Join(dir, "domain.json"), b, 0o600)
	}
	ok := func(uuid string) qemuJournal {
		dir := filepath.Join(state, uuid)
		return qemuJournal{UUID: uuid, Spec: backend.Spec{UUID: uuid}, Dir: dir, LogPath: filepath.Join(dir, "qemu.log"),
			QMPPath: filepath.Join(dir, "qmp.sock"), VNCPath: filepath.Join(dir, "vnc.sock"), SerialPath: filepath.Join(dir, "serial.sock")}
	}
	j := ok("a")
	j.Dir = victim
	journal("a", j)
	j = ok("b")
	j.QMPPath, j.VNCPath, j.SerialPath = filepath.Join(victim, "qmp.sock"), filepath.Join(victim, "vnc.sock"), filepath.Join(victim, "serial.sock")
	journal("b", j)
	j = ok("c")
	j.UUID, j.Spec.UUID = "../victim", "../victim"
	journal("c", j)
	j = ok("d")
	j.NICs = []backend.NIC{{Device: "0", Tap: "eth0"}}
	journal("d", j)
	journal("e", ok("e")) // a good one
	q, err := New(Config{StateDir: state, Accel: "tcg", Binary: "/bin/false"}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var seen []string
	for _, d := range q.List() {
		seen = append(seen, d.UUID)
	}
	if strings.Join(seen, ",") != "e" {
		t.Fatalf("managed domains %v, want only e", seen)
	}
	for _, u := range []string{"a", "b", "c", "d", "e", "../victim"} {
		q.Destroy(context.Background(), u)
	}
	if _, err := os.Stat(filepath.Join(victim, "precious")); err != nil {
		t.Fatalf("a crafted journal made Destroy delete a directory outside the state directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "e")); !os.IsNotExist(err) {
		t.Fatalf("the good domain's directory stayed: %v", err)
	}
}

// A uuid that is not a plain name never becomes a path.
func TestQEMUCreateRefusesBadUUID(t *testing.T) {
	root := t.TempDir()
	state := filepath.Join(root, "state")
	victim := filepath.Join(root, "victim")
	os.MkdirAll(victim, 0o700)
	q, err := New(Config{StateDir: state, Accel: "tcg", Binary: "/bin/false"}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for _, u := range []string{"../victim", "..", "", "a/b", "/etc"} {
		_, err := q.Create(context.Background(), &backend.Spec{UUID: u, VMRef: "OpaqueRef:x"})
		var x *xerr.Error
		if !errors.As(err, &x) || x.Code != xerr.InvalidValue {
			t.Errorf("Create(%q): %v, want INVALID_VALUE", u, err)
		}
		// Destroy of an unknown domain with a bad uuid is refused too:
		// no path is built from it.
		if err := q.Destroy(context.Background(), u); err == nil {
			t.Errorf("Destroy(%q) accepted", u)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("victim removed: %v", err)
	}
}

func TestRemoveBelow(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "d")
	out := filepath.Join(root, "out")
	os.MkdirAll(filepath.Join(dir, "x"), 0o700)
	os.MkdirAll(out, 0o700)
	os.Symlink(out, filepath.Join(dir, "link"))
	for _, p := range []string{dir, root, out, filepath.Join(dir, ".."), filepath.Join(dir, "link"), "relative"} {
		if err := removeBelow(dir, p); !errors.Is(err, errOutside) {
			t.Errorf("removeBelow(%q) = %v", p, err)
		}
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	if err := removeBelow(dir, filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}
}

// fakeNestedKVM is a "qemu" that fails as QEMU does on a host with
// nested KVM when given -cpu host.
func fakeNestedKVM(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	script := "#!/bin/sh\necho 'qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69' >&2\n" +
		"echo \"qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion failed.\" >&2\nexit 1\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The "auto" decision: KVM only when the probe ran a VCPU under it. The
// KVM device check is the test's, so the decision is the same on every
// machine, with or without /dev/kvm.
func TestAutoAccelDecision(t *testing.T) {
	state := t.TempDir()
	usable := func(string) (bool, string) { return true, "" }
	missing := func(string) (bool, string) { return false, "no /dev/kvm" }

	q, err := New(Config{StateDir: state, Binary: fakeNestedKVM(t), KVMCheck: usable}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	if a, why := q.Accelerator(); a != "tcg" || !strings.Contains(why, "failed to set MSR") || !strings.Contains(why, "-cpu host") {
		t.Fatalf("nested KVM: %s (%s)", a, why)
	}
	if a, _ := q.accel(&backend.Spec{}); a != "tcg" {
		t.Fatalf("domains get %s", a)
	}

	q, _ = New(Config{StateDir: state, Binary: fakeNestedKVM(t), KVMCheck: missing}, quietLog())
	q.Close()
	if a, why := q.Accelerator(); a != "tcg" || !strings.Contains(why, "no /dev/kvm") {
		t.Fatalf("no KVM: %s (%s)", a, why)
	}

	// A configured accelerator is not probed: kvm is honoured where the
	// device is usable (even though this "qemu" would abort a probe) ...
	q, _ = New(Config{StateDir: state, Binary: fakeNestedKVM(t), Accel: "kvm", KVMCheck: usable}, quietLog())
	q.Close()
	if a, err := q.accel(&backend.Spec{}); a != "kvm" || err != nil {
		t.Fatalf("configured kvm: %q, %v", a, err)
	}
	// ... and refused with VM_HVM_REQUIRED where it is not, by the start
	// check too, never silently turned into TCG.
	q, _ = New(Config{StateDir: state, Binary: fakeNestedKVM(t), Accel: "kvm", KVMCheck: missing}, quietLog())
	q.Close()
	spec := &backend.Spec{VMRef: "OpaqueRef:vm"}
	if a, err := q.accel(spec); a != "" || !xerr.HasCode(err, xerr.VMHVMRequired) {
		t.Fatalf("configured kvm without KVM: %q, %v", a, err)
	}
	if err := q.Check(spec); !xerr.HasCode(err, xerr.VMHVMRequired) {
		t.Fatalf("Check with configured kvm without KVM: %v", err)
	}
	// tcg configured is tcg, whatever the device says.
	q, _ = New(Config{StateDir: state, Binary: fakeNestedKVM(t), Accel: "tcg", KVMCheck: usable}, quietLog())
	q.Close()
	if a, err := q.accel(spec); a != "tcg" || err != nil {
		t.Fatalf("configured tcg: %q, %v", a, err)
	}
}

// The probe against the real emulator: TCG must work wherever QEMU is
// installed; what KVM gives depends on the machine, and "auto" must
// agree with a real start of the CPU model under KVM.
func TestAutoAccelRealQEMU(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := probeAccel(ctx, bin, "tcg", "max", "pc"); err != nil {
		t.Fatalf("TCG probe failed: %v", err)
	}
	t.Logf("TCG probe: %v", time.Since(t0))
	t0 = time.Now()
	q, err := New(Config{StateDir: t.TempDir(), Binary: bin}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	a, why := q.Accelerator()
	t.Logf("auto chose %s in %v: %s", a, time.Since(t0), why)
	if ok, _ := kvmAvailable("/dev/kvm"); !ok {
		if a != "tcg" {
			t.Fatalf("no usable /dev/kvm, yet auto chose %s", a)
		}
		return
	}
	// Independently of the probe: does -cpu host run under KVM here?
	host := runsUnderKVM(ctx, bin, "host")
	if host != (a == "kvm") {
		t.Fatalf("-cpu host runs under KVM: %v, yet auto chose %s (%s)", host, a, why)
	}
	// A CPU model that works is taken when configured: on nested KVM,
	// where -cpu host aborts, kvm64 usually runs.
	t0 = time.Now()
	q, _ = New(Config{StateDir: t.TempDir(), Binary: bin, CPUModel: "kvm64"}, quietLog())
	q.Close()
	a, why = q.Accelerator()
	t.Logf("start-up with the probe: %v", time.Since(t0))
	if runsUnderKVM(ctx, bin, "kvm64") != (a == "kvm") {
		t.Fatalf("-cpu kvm64: auto chose %s (%s), a direct start disagrees", a, why)
	}
	t.Logf("with -cpu kvm64 auto chose %s: %s", a, why)
}

// runsUnderKVM starts QEMU with the CPU model under KVM, lets it run and
// asks its status, without the probe's code.
func runsUnderKVM(ctx context.Context, bin, cpu string) bool {
	cmd := exec.CommandContext(ctx, "sh", "-c", `(printf '{"execute":"qmp_capabilities"}\n{"execute":"cont"}\n'; sleep 0.5; `+
		`printf '{"execute":"query-status"}\n{"execute":"quit"}\n') | "$0" -machine pc,accel=kvm -cpu "$1" -m 32 -nodefaults -display none -S -qmp stdio`,
		bin, cpu)
	out, _ := cmd.CombinedOutput()
	return strings.Contains(string(out), `"status": "running"`)
}
