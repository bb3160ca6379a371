package hoststat

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
)

// writeTree writes files (path below dir: contents) and returns dir.
func writeTree(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	for rel, contents := range files {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(contents), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// mkdirs makes directories below dir.
func mkdirs(t *testing.T, dir string, rels ...string) {
	t.Helper()
	for _, rel := range rels {
		if err := os.MkdirAll(filepath.Join(dir, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// nicFiles gives the four statistics files of one interface.
func nicFiles(dev, rxBytes, txBytes, rxErrors, txErrors string) map[string]string {
	d := "sys/class/net/" + dev + "/statistics/"
	return map[string]string{
		d + "rx_bytes": rxBytes, d + "tx_bytes": txBytes,
		d + "rx_errors": rxErrors, d + "tx_errors": txErrors,
		d + "rx_packets": "not read\n",
	}
}

// fixtureTree writes a host's proc/ and sys/ below a new directory: four
// CPUs, two interfaces besides lo, two whole disks with /sys/block
// entries (sdb has none, so is skipped), and an interface that went
// away after it was listed.
func fixtureTree(t *testing.T) string {
	dir := writeTree(t, t.TempDir(), map[string]string{
		"proc/stat":                     statFixture,
		"proc/meminfo":                  meminfoFixture,
		"proc/loadavg":                  "1.25 0.80 0.41 2/731 40213\n",
		"proc/diskstats":                diskstatsFixture,
		"sys/class/net/bonding_masters": "bond0\n",
	})
	writeTree(t, dir, nicFiles("eth0", "123456789\n", "98765\n", "3\n", "0\n"))
	writeTree(t, dir, nicFiles("br0", "18446744073709551615\n", "0\n", "0\n", "7\n"))
	writeTree(t, dir, nicFiles("lo", "1\n", "1\n", "0\n", "0\n"))
	mkdirs(t, dir, "sys/block/sda", "sys/block/nvme0n1", "sys/block/loop0", "sys/block/dm-0")
	if err := os.Symlink("../../devices/virtual/net/vif1.0", filepath.Join(dir, "sys/class/net/vif1.0")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fixtureHost is what Read gives for fixtureTree.
func fixtureHost() stats.Host {
	return stats.Host{
		CPUBusy:     statFixtureBusy,
		CPUTotal:    statFixtureTotal,
		MemoryTotal: 16318756 * 1024,
		MemoryFree:  9876543 * 1024,
		LoadAverage: 1.25,
		NICs: []stats.NIC{
			{Device: "br0", RxBytes: 18446744073709551615, TxErrors: 7},
			{Device: "eth0", RxBytes: 123456789, TxBytes: 98765, RxErrors: 3},
		},
		Disks: []stats.Disk{diskNvme, diskSda},
	}
}

func TestReadFixtureTree(t *testing.T) {
	got, err := Reader{Root: fixtureTree(t)}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := fixtureHost(); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestReadWithoutSysBlock(t *testing.T) {
	dir := fixtureTree(t)
	if err := os.RemoveAll(filepath.Join(dir, "sys/block")); err != nil {
		t.Fatal(err)
	}
	got, err := Reader{Root: dir}.Read()
	if err != nil {
		t.Fatal(err)
	}
	// Partitions are now told by name, and sdb is kept.
	want := fixtureHost()
	want.Disks = []stats.Disk{diskNvme, diskSda, diskSdb}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestReadOptionalSourcesMissing(t *testing.T) {
	dir := writeTree(t, t.TempDir(), map[string]string{
		"proc/stat":    "cpu0 100 2 30 400\n",
		"proc/meminfo": meminfoOldFixture,
	})
	got, err := Reader{Root: dir}.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := stats.Host{
		CPUBusy:     []time.Duration{ticks(132)},
		CPUTotal:    []time.Duration{ticks(532)},
		MemoryTotal: 4046872 * 1024,
		MemoryFree:  (512000 + 100000 + 1400000) * 1024,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestReadRequiredSourceMissing(t *testing.T) {
	for _, missing := range []string{"proc/stat", "proc/meminfo"} {
		t.Run(missing, func(t *testing.T) {
			dir := fixtureTree(t)
			path := filepath.Join(dir, missing)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			got, err := Reader{Root: dir}.Read()
			if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
				t.Errorf("got error %v, want one that names %s and wraps fs.ErrNotExist", err, path)
			}
			if !reflect.DeepEqual(got, stats.Host{}) {
				t.Errorf("got %+v with the error", got)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, file, contents string
		// want is what the error must say after the file's path.
		want string
	}{
		{"stat", "proc/stat", "cpu0 1 2 3 4\ncpu1 1 2 x 4\n", `: line 2: malformed: system "x" is not a decimal number`},
		{"meminfo", "proc/meminfo", "MemTotal: 1 kB\n", ": malformed: neither MemAvailable nor MemFree"},
		{"loadavg", "proc/loadavg", "high\n", `: line 1: malformed: load average "high"`},
		{"diskstats", "proc/diskstats", "8 0 sda 1 2 3\n", ": line 1: malformed: sda has 6 fields"},
		{"NIC counter", "sys/class/net/eth0/statistics/tx_errors", "-1\n", `: line 1: malformed: "-1\n" is not a decimal number`},
		{"NIC counter empty", "sys/class/net/eth0/statistics/rx_bytes", "", `: line 1: malformed: "" is not a decimal number`},
		{"file too big", "proc/loadavg", strings.Repeat("1", maxFileSize+1), ": malformed: larger than 1048576 bytes"},
		{"file too big, of blank lines", "proc/diskstats", strings.Repeat("\n", maxFileSize+1), ": malformed: larger than 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := fixtureTree(t)
			writeTree(t, dir, map[string]string{tt.file: tt.contents})
			got, err := Reader{Root: dir}.Read()
			want := "hoststat: " + filepath.Join(dir, tt.file) + tt.want
			if err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("got error %v\nwant one starting %q", err, want)
			}
			if !errors.Is(err, errFormat) {
				t.Errorf("error %v does not wrap errFormat", err)
			}
			if !reflect.DeepEqual(got, stats.Host{}) {
				t.Errorf("got %+v with the error", got)
			}
		})
	}
}

func TestReadFileAtTheBound(t *testing.T) {
	dir := fixtureTree(t)
	// Exactly maxFileSize bytes: the fixture padded with blank lines.
	writeTree(t, dir, map[string]string{
		"proc/diskstats": diskstatsFixture + strings.Repeat("\n", maxFileSize-len(diskstatsFixture)),
	})
	got, err := Reader{Root: dir}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := fixtureHost(); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestReadNICVanishing(t *testing.T) {
	dir := fixtureTree(t)
	// eth0's directory is there but its counters are gone (the listing
	// saw it, the reads do not).
	for _, name := range []string{"tx_errors", "rx_packets"} {
		if err := os.Remove(filepath.Join(dir, "sys/class/net/eth0/statistics", name)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Reader{Root: dir}.Read()
	if err != nil {
		t.Fatal(err)
	}
	want := fixtureHost()
	want.NICs = want.NICs[:1]
	if !reflect.DeepEqual(got.NICs, want.NICs) {
		t.Errorf("got NICs %+v, want %+v", got.NICs, want.NICs)
	}
}

func TestReadRealHost(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SKIPPED: reads Linux's /proc and /sys")
	}
	h, err := Reader{}.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(h.CPUBusy) < 1 || len(h.CPUBusy) != len(h.CPUTotal) {
		t.Fatalf("%d busy and %d total CPU times", len(h.CPUBusy), len(h.CPUTotal))
	}
	// CPUs are indexed by number, so there are at least as many as this
	// process may run on (fewer online CPUs than that cannot be).
	if len(h.CPUBusy) < runtime.NumCPU() {
		t.Errorf("%d CPUs in /proc/stat, runtime.NumCPU() = %d", len(h.CPUBusy), runtime.NumCPU())
	}
	var sum time.Duration
	for i := range h.CPUBusy {
		if h.CPUBusy[i] < 0 || h.CPUBusy[i] > h.CPUTotal[i] {
			t.Errorf("cpu%d busy %v of %v", i, h.CPUBusy[i], h.CPUTotal[i])
		}
		sum += h.CPUTotal[i]
	}
	if sum <= 0 {
		t.Errorf("no CPU time at all: %v", h.CPUTotal)
	}
	if h.MemoryTotal <= 0 || h.MemoryFree <= 0 || h.MemoryFree > h.MemoryTotal {
		t.Errorf("memory: %d free of %d", h.MemoryFree, h.MemoryTotal)
	}
	if h.LoadAverage < 0 {
		t.Errorf("load average %v", h.LoadAverage)
	}
	for _, n := range h.NICs {
		if n.Device == "lo" || n.Device == "" {
			t.Errorf("NIC %+v", n)
		}
	}
	for _, d := range h.Disks {
		if !(diskFilter{whole: map[string]bool{d.Device: true}}).keep([]byte(d.Device)) {
			t.Errorf("disk %+v should have been skipped by name", d)
		}
		if _, err := os.Lstat(filepath.Join("/sys/block", d.Device)); err != nil {
			t.Errorf("disk %+v is not a whole disk: %v", d, err)
		}
	}
	t.Logf("%d CPUs, memory %d/%d, load %v, NICs %+v, disks %+v",
		len(h.CPUBusy), h.MemoryFree, h.MemoryTotal, h.LoadAverage, h.NICs, h.Disks)
}

func BenchmarkRead(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("SKIPPED: reads Linux's /proc and /sys")
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := (Reader{}).Read(); err != nil {
			b.Fatal(err)
		}
	}
}
