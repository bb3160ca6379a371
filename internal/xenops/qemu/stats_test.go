package qemu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu/qmp"
)

// A thread's stat line as Linux 6.1 writes it for a QEMU VCPU thread
// (52 fields; utime 250 and stime 75 ticks).
const vcpuStat = "12345 (CPU 0/KVM) S 12340 12340 12340 0 -1 4194368 1234 0 0 0 250 75 0 0 20 0 3 0 98765 1234567890 4321 " +
	"18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 -1 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n"

func TestTaskCPUTime(t *testing.T) {
	ok := []struct {
		name, line string
		want       time.Duration
	}{
		{"vcpu thread", vcpuStat, 3250 * time.Millisecond},
		{"no newline", strings.TrimSuffix(vcpuStat, "\n"), 3250 * time.Millisecond},
		{"name with parentheses and spaces", "7 (a) (b c)) R 1 1 1 0 -1 0 0 0 0 0 1 2 0 0\n", 30 * time.Millisecond},
		{"exactly fifteen fields", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 100 0", time.Second},
		{"zero", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 0 0 0 0", 0},
		{"a day", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 8640000 0 0 0", 24 * time.Hour},
	}
	for _, c := range ok {
		got, err := taskCPUTime([]byte(c.line))
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	bad := []struct{ name, line string }{
		{"empty", ""},
		{"no command name", "12345 CPU S 1 1 1 0 -1 0 0 0 0 0 250 75"},
		{"short", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 250"},
		{"utime not a number", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 2x0 75 0"},
		{"negative stime", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 250 -75 0"},
		{"utime overflows", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 0 0"},
		{"sum out of range", "7 (x) R 1 1 1 0 -1 0 0 0 0 0 922337203685 922337203685 0"},
		{"fields inside the name only", "7 (x R 1 1 1 0 -1 0 0 0 0 0 250 75)"},
	}
	for _, c := range bad {
		if got, err := taskCPUTime([]byte(c.line)); err == nil {
			t.Errorf("%s: accepted as %v", c.name, got)
		}
	}
}

// The parser reads what this kernel writes: this test's own thread.
func TestTaskCPUTimeOfThisThread(t *testing.T) {
	pid, tid := os.Getpid(), syscall.Gettid()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		t.Skip("no /proc: ", err)
	}
	if _, err := taskCPUTime(b); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	// Two VCPUs on one thread (TCG without MTTCG) both report it, in
	// cpu-index order; a thread that has gone reads as zero.
	got, err := vcpuTimes(pid, []qmp.CPUInfoFast{{CPUIndex: 2, ThreadID: 1 << 30}, {CPUIndex: 1, ThreadID: tid}, {CPUIndex: 0, ThreadID: tid}})
	if err != nil || len(got) != 3 || got[0] != got[1] || got[2] != 0 {
		t.Fatalf("vcpuTimes = %v, %v", got, err)
	}
	if _, err := vcpuTimes(1<<30, []qmp.CPUInfoFast{{CPUIndex: 0, ThreadID: 1}}); err == nil {
		t.Error("vcpuTimes of a process that does not exist succeeded")
	}
}

// FuzzTaskStat: any bytes are parsed or refused, never a panic, and an
// accepted line gives a non-negative time.
func FuzzTaskStat(f *testing.F) {
	for _, s := range []string{vcpuStat, "", ")", "1 (a) R", "1 ()) R 1 1 1 0 -1 0 0 0 0 0 1 1 0", "1 (x) R  1 1 1 0 -1 0 0 0 0 0 99999999999999999999 1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := taskCPUTime(b)
		if err == nil && d < 0 {
			t.Fatalf("%q: negative time %v", b, d)
		}
	})
}

// blockstats72 is a query-blockstats reply in the shape QEMU 7.2 gives
// it for a domain as this backend builds it (-blockdev nodes named
// vbdN-fmt, devices with id vbdN), trimmed of the counters not read, with
// made-up values: a virtio disk (the block backend is the virtio device
// inside the PCI one, so qdev is its QOM path), an IDE disk with a live
// snapshot's overlay on top, an empty CD drive (no node), UEFI's flash
// (not a VBD), a disk the journal does not have (being unplugged) and a
// backend known only by its node.
const blockstats72 = `[
 {"device": "", "node-name": "vbd0-fmt", "qdev": "/machine/peripheral/vbd0/virtio-backend",
  "stats": {"rd_bytes": 52428800, "wr_bytes": 1048576, "rd_operations": 800, "wr_operations": 16,
   "rd_total_time_ns": 1500000000, "wr_total_time_ns": 20000000, "flush_operations": 3, "account_invalid": true, "timed_stats": []},
  "parent": {"node-name": "#block123", "stats": {"rd_bytes": 1, "wr_bytes": 1, "rd_operations": 1, "wr_operations": 1},
   "driver-specific": {"driver": "file", "discard-nb-ok": 0}}},
 {"device": "", "node-name": "vbd1-overlay1", "qdev": "vbd1",
  "stats": {"rd_bytes": 4096, "wr_bytes": 8192, "rd_operations": 1, "wr_operations": 2, "rd_total_time_ns": 1000, "wr_total_time_ns": 2000}},
 {"device": "", "qdev": "vbd3",
  "stats": {"rd_bytes": 0, "wr_bytes": 0, "rd_operations": 0, "wr_operations": 0, "rd_total_time_ns": 0, "wr_total_time_ns": 0}},
 {"device": "pflash0", "node-name": "#block011", "qdev": "/machine/system.flash0",
  "stats": {"rd_bytes": 9, "wr_bytes": 9, "rd_operations": 9, "wr_operations": 9, "rd_total_time_ns": 9, "wr_total_time_ns": 9}},
 {"device": "", "node-name": "vbd2-fmt", "qdev": "/machine/peripheral/vbd2/virtio-backend",
  "stats": {"rd_bytes": 7, "wr_bytes": 7, "rd_operations": 7, "wr_operations": 7, "rd_total_time_ns": 7, "wr_total_time_ns": 7}},
 {"device": "", "node-name": "vbd4-fmt", "qdev": "",
  "stats": {"rd_bytes": 512, "wr_bytes": 0, "rd_operations": 1, "wr_operations": 0, "rd_total_time_ns": -5, "wr_total_time_ns": 0}}
]`

func TestBlockStatsMapping(t *testing.T) {
	disks := []backend.Disk{
		{Device: "1", Path: "/x/1.qcow2"},
		{Device: "0", Path: "/x/0.qcow2"},
		{Device: "3", CD: true},
		{Device: "4", Path: "/x/4.raw"},
		{Device: "5", Path: "/x/5.raw"}, // QEMU does not list it: left out
	}
	got, err := blockStats([]byte(blockstats72), disks)
	if err != nil {
		t.Fatal(err)
	}
	want := []stats.Disk{
		{Device: "1", ReadBytes: 4096, WriteBytes: 8192, ReadOps: 1, WriteOps: 2, ReadTime: time.Microsecond, WriteTime: 2 * time.Microsecond},
		{Device: "0", ReadBytes: 50 << 20, WriteBytes: 1 << 20, ReadOps: 800, WriteOps: 16, ReadTime: 1500 * time.Millisecond, WriteTime: 20 * time.Millisecond},
		{Device: "3"},
		{Device: "4", ReadBytes: 512, ReadOps: 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("blockStats:\n got %+v\nwant %+v", got, want)
	}
	if _, err := blockStats([]byte(`{"not": "a list"}`), disks); err == nil {
		t.Error("a reply that is not a list was accepted")
	}
	if got, err := blockStats([]byte(`[]`), disks); err != nil || len(got) != 0 {
		t.Errorf("no entries: %v %v", got, err)
	}
}

func TestBlockDevice(t *testing.T) {
	for _, c := range []struct{ qdev, node, want string }{
		{"/machine/peripheral/vbd12/virtio-backend", "", "12"},
		{"vbd0", "#block1", "0"},
		{"", "vbd2-fmt", "2"},
		{"", "vbd2-overlay3", "2"},
		{"", "vbd2-other", ""},
		{"/machine/peripheral/vif0/virtio-backend", "", ""},
		{"/machine/peripheral-anon/device[3]/virtio-backend", "", ""},
		{"vbd", "vbd-fmt", ""},
		{"vbdx", "", ""},
		{"vbd1234", "", ""},
		{"ide0-hd0", "", ""},
	} {
		if got := blockDevice(c.qdev, c.node); got != c.want {
			t.Errorf("blockDevice(%q, %q) = %q, want %q", c.qdev, c.node, got, c.want)
		}
	}
}

// The guest receives what its tap sends: the tap's tx counters are the
// NIC's rx. A NIC without a tap, or whose tap has gone, counts zero.
func TestTapStats(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "tsvif7.0", "statistics")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"tx_bytes": "1000\n", "rx_bytes": "200\n", "tx_errors": "3\n", "rx_errors": "4\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := tapStats(root, backend.NIC{Device: "0", Tap: "tsvif7.0", Mode: "tap"})
	if want := (stats.NIC{Device: "0", RxBytes: 1000, TxBytes: 200, RxErrors: 3, TxErrors: 4}); got != want {
		t.Errorf("tap: %+v, want %+v", got, want)
	}
	for _, n := range []backend.NIC{
		{Device: "1", Tap: "tsvif7.1", Mode: "tap"},  // gone
		{Device: "2", Mode: "user"},                  // no tap
		{Device: "3", Tap: "../../etc", Mode: "tap"}, // not a tap of ours
	} {
		if got := tapStats(root, n); got != (stats.NIC{Device: n.Device}) {
			t.Errorf("%+v: %+v, want zeros", n, got)
		}
	}
}

// A domain that is not there, or has no emulator yet, is an error at
// once.
func TestStatsRefusesDomainWithoutEmulator(t *testing.T) {
	q := &QEMU{doms: map[string]*qemuDomain{"b": {state: backend.DomainBuilding, exited: make(chan struct{})}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, uuid := range []string{"a", "b"} {
		t0 := time.Now()
		if _, err := q.Stats(ctx, uuid); err == nil || time.Since(t0) > 100*time.Millisecond {
			t.Errorf("Stats(%s): %v after %v", uuid, err, time.Since(t0))
		}
	}
}
