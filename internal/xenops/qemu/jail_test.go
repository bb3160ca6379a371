package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/xenops/backend"
)

// jailHost is a data directory laid out as a host's: the QEMU state
// directory, a database file and two SRs, all root's alone.
type jailHost struct {
	data, state, db string
	q               *QEMU
}

func newJailHost(t testing.TB, deprivilege string) *jailHost {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the jail needs root, to run QEMU as another user (CI runs as root)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed")
	}
	if deprivilege != "off" && !idsMapped("/proc/self/uid_map", DefaultUserBase, DefaultUsers) {
		t.Skip("the emulators' user ids do not exist in this user namespace (/proc/self/uid_map)")
	}
	data, err := os.MkdirTemp("", "jail") // short: QEMU's sockets live below
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	h := &jailHost{data: data, state: filepath.Join(data, "qemu"), db: filepath.Join(data, "state.db")}
	if err := os.WriteFile(h.db, []byte("the pool secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.q, err = New(Config{StateDir: h.state, Accel: "tcg", Deprivilege: deprivilege}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.q.Close)
	t.Cleanup(func() { // before Close: the emulators go too
		for _, d := range h.q.List() {
			_ = h.q.Destroy(context.Background(), d.UUID)
		}
	})
	return h
}

// image makes a qcow2 image in SR dir sr, with a backing file when
// backing is not "" (named relative to the image, as storage writes it).
func (h *jailHost) image(t testing.TB, sr, name, backing string) string {
	t.Helper()
	dir := filepath.Join(h.data, sr)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	args := []string{"create", "-q", "-f", "qcow2"}
	if backing != "" {
		args = append(args, "-b", backing, "-F", "qcow2")
	}
	if out, err := exec.Command("qemu-img", append(args, p, "16M")...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs a paused domain with disk 0 at path and an empty CD drive 3.
func (h *jailHost) start(t testing.TB, uuid, path string) *qemuDomain {
	t.Helper()
	ctx := context.Background()
	spec := &backend.Spec{UUID: uuid, VMRef: "OpaqueRef:" + uuid, Name: uuid, VCPUs: 1, MaxCPU: 1, Memory: 64 << 20, Target: 64 << 20}
	if _, err := h.q.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := h.q.Build(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	for _, disk := range []backend.Disk{{Device: "0", Path: path, Format: "qcow2"}, {Device: "3", CD: true}} {
		if err := h.q.AddDisk(ctx, uuid, disk); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.q.StartDeviceModel(ctx, uuid); err != nil {
		t.Fatalf("start %s: %v", uuid, err)
	}
	d, err := h.q.dom(uuid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// status is a field of /proc/PID/status.
func status(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// openFiles are the paths process pid holds open (not sockets, pipes or
// anonymous files).
func openFiles(t *testing.T, pid int) []string {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "/") {
			out = append(out, l)
		}
	}
	return out
}

// Issue 29, finding 11: QEMU ran as root without a sandbox, so a guest
// that broke out of its device model owned the host. Each domain's QEMU
// now runs as a user of its own under seccomp; it opens nothing by name
// outside its own directory: not /etc/shadow, not the daemon's files,
// not another VM's image, not even its own disk (which it was handed).
func TestJailedEmulator(t *testing.T) {
	h := newJailHost(t, "auto")
	base := h.image(t, "sr-a", "base.qcow2", "")
	diskA := h.image(t, "sr-a", "top.qcow2", "base.qcow2")
	diskB := h.image(t, "sr-b", "b.qcow2", "")
	a := h.start(t, "a0000000-0000-4000-8000-000000000001", diskA)
	b := h.start(t, "b0000000-0000-4000-8000-000000000002", diskB)

	uidA, uidB := status(t, a.j.Pid, "Uid"), status(t, b.j.Pid, "Uid")
	for _, c := range []struct{ who, uid, gid, groups string }{
		{"A", uidA, status(t, a.j.Pid, "Gid"), status(t, a.j.Pid, "Groups")},
		{"B", uidB, status(t, b.j.Pid, "Gid"), status(t, b.j.Pid, "Groups")},
	} {
		ids := strings.Fields(c.uid)
		if len(ids) != 4 || ids[0] != ids[1] || ids[0] != ids[2] || ids[0] != ids[3] {
			t.Fatalf("QEMU %s: Uid %q, want one id four times", c.who, c.uid)
		}
		if n, _ := strconv.Atoi(ids[0]); n < DefaultUserBase || n >= DefaultUserBase+DefaultUsers {
			t.Errorf("QEMU %s runs as uid %d, outside the emulators' range", c.who, n)
		}
		if c.gid != c.uid || c.groups != "" {
			t.Errorf("QEMU %s: Gid %q Groups %q, want its own group alone", c.who, c.gid, c.groups)
		}
	}
	if uidA == uidB {
		t.Fatalf("two domains' QEMUs share uid %s", uidA)
	}
	for _, d := range []*qemuDomain{a, b} {
		if s := status(t, d.j.Pid, "Seccomp"); s != "2" {
			t.Errorf("QEMU %d: Seccomp %q, want 2 (a filter)", d.j.Pid, s)
		}
	}

	// What A holds: its own images and directory, devices; nothing of B's
	// and nothing else of the daemon's.
	for _, f := range openFiles(t, a.j.Pid) {
		switch {
		case f == diskA || f == base || f == a.j.LogPath || f == a.j.Dir || strings.HasPrefix(f, "/dev/"):
		default:
			t.Errorf("QEMU A holds %s", f)
		}
	}

	// What A opens by name: nothing outside its directory.
	_, mon, err := h.q.live(a.j.UUID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, p := range []string{"/etc/shadow", diskB, h.db, diskA, base} {
		err := mon.Execute(ctx, "blockdev-add", map[string]any{"driver": "file", "node-name": "probe" + strconv.Itoa(i), "filename": p, "read-only": true}, nil)
		if err == nil || !strings.Contains(err.Error(), "Permission denied") {
			t.Errorf("QEMU A opening %s by name: %v, want Permission denied", p, err)
		}
	}

	// What the daemon hands over at run time works: a hot-plugged disk
	// with a backing chain. (Its unplug needs a guest to let it go.)
	base2 := h.image(t, "sr-a", "base2.qcow2", "")
	disk2 := h.image(t, "sr-a", "top2.qcow2", "base2.qcow2")
	if err := h.q.PlugDisk(ctx, a.j.UUID, backend.Disk{Device: "1", Path: disk2, Format: "qcow2"}); err != nil {
		t.Fatalf("hot-plugging a disk into a jailed QEMU: %v", err)
	}
	held := strings.Join(openFiles(t, a.j.Pid), " ")
	if !strings.Contains(held, disk2) || !strings.Contains(held, base2) {
		t.Fatalf("after the hot-plug QEMU A holds %s, want %s and its backing file", held, disk2)
	}
	// A CD's media: each change leaves QEMU with the new one's
	// descriptors alone, and an eject with none.
	// (QEMU closes a removed descriptor only while the guest runs.)
	if err := h.q.Unpause(ctx, a.j.UUID); err != nil {
		t.Fatal(err)
	}
	var isos []string
	for _, n := range []string{"one.iso", "two.iso"} {
		p := filepath.Join(h.data, "sr-a", n)
		if err := os.WriteFile(p, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		isos = append(isos, p)
	}
	cdSets := func() int {
		var sets []struct {
			Fds []struct {
				Opaque string `json:"opaque"`
			} `json:"fds"`
		}
		if err := mon.Execute(ctx, "query-fdsets", nil, &sets); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range sets {
			for _, f := range s.Fds {
				if f.Opaque == diskOpaque("3") {
					n++
				}
			}
		}
		return n
	}
	for i, iso := range append(isos, "") {
		if err := h.q.ChangeMedium(ctx, a.j.UUID, backend.Disk{Device: "3", CD: true, Path: iso, ReadOnly: true}); err != nil {
			t.Fatalf("medium %q: %v", iso, err)
		}
		held := openFiles(t, a.j.Pid)
		for j, other := range isos {
			if has := slices.Contains(held, other); has != (i == j) {
				t.Errorf("with medium %q in the drive, QEMU A holds %s: %v", iso, other, has)
			}
		}
		if want := min(1, len(iso)); cdSets() != want {
			t.Errorf("with medium %q in the drive, %d fd sets of the drive, want %d", iso, cdSets(), want)
		}
	}
}

// A journal cannot make a domain run as any user: a jail's uid outside
// the emulators' range, or a directory name that is not a descriptor's,
// makes the journal refused.
func TestJournalJailChecked(t *testing.T) {
	q := &QEMU{cfg: Config{StateDir: t.TempDir(), UserBase: DefaultUserBase, Users: 10}}
	dir := filepath.Join(q.cfg.StateDir, "x")
	ok := func() qemuJournal {
		return qemuJournal{UUID: "x", Spec: backend.Spec{UUID: "x"}, Dir: dir, LogPath: filepath.Join(dir, "qemu.log"),
			QMPPath: filepath.Join(dir, "qmp.sock"), VNCPath: filepath.Join(dir, "vnc.sock"), SerialPath: filepath.Join(dir, "serial.sock"),
			Jail: &jail{UID: DefaultUserBase + 3, Dir: "/proc/self/fd/3", SockDir: "/proc/self/fd/3"}}
	}
	j := ok()
	if err := q.checkJournal(&j, "x"); err != nil {
		t.Fatalf("a good journal: %v", err)
	}
	for name, change := range map[string]func(*jail){
		"uid 0":         func(jl *jail) { jl.UID = 0 },
		"above":         func(jl *jail) { jl.UID = DefaultUserBase + 10 },
		"dir elsewhere": func(jl *jail) { jl.Dir = "/etc" },
		"sock dir":      func(jl *jail) { jl.SockDir = "/proc/self/fd/../../1/root" },
	} {
		j := ok()
		change(j.Jail)
		if err := q.checkJournal(&j, "x"); err == nil {
			t.Errorf("%s: journal accepted", name)
		}
	}
}

// The cost of the jail at a domain's start: the same paused domain with a
// two-image disk chain started, connected and destroyed, jailed or not.
// Figures: docs/performance.md ("Issue 29: the emulator's jail").
func BenchmarkEmulatorStart(b *testing.B) {
	for _, mode := range []string{"off", "on"} {
		b.Run("jail="+mode, func(b *testing.B) {
			h := newJailHost(b, mode)
			h.image(b, "sr", "base.qcow2", "")
			disk := h.image(b, "sr", "top.qcow2", "base.qcow2")
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				uuid := fmt.Sprintf("c0000000-0000-4000-8000-%012d", i)
				h.start(b, uuid, disk)
				if err := h.q.Destroy(context.Background(), uuid); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// In a user namespace that maps fewer ids, the emulators' range does not
// exist and the jail cannot be had.
func TestIDsMapped(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		uidMap string
		want   bool
	}{
		{"         0          0 4294967295\n", true},
		{"         0     100000      65536\n", false},
		{"         0     100000      65536\n    131072     300000      32768\n", true},
		{"    131072     300000      32767\n", false},
		{"", false},
	} {
		p := filepath.Join(dir, "uid_map")
		if err := os.WriteFile(p, []byte(c.uidMap), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := idsMapped(p, DefaultUserBase, DefaultUsers); got != c.want {
			t.Errorf("%q: %v, want %v", c.uidMap, got, c.want)
		}
	}
	if !idsMapped(filepath.Join(dir, "missing"), DefaultUserBase, DefaultUsers) {
		t.Error("an unreadable map refused the range")
	}
}
