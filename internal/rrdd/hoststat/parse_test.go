package hoststat

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
)

// ticks converts USER_HZ clock ticks to a duration, the way the tests
// state expected CPU times.
func ticks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }

// statFixture is a /proc/stat of a four-CPU host on a 5.x kernel; cpu1
// ran guests (its guest columns are inside its user and nice ones).
const statFixture = `cpu  7593822 25 2725005 9760361 151095 12 140458 125084 1200 40
cpu0 1939101 17 670029 2469774 34217 0 19422 32458 0 0
cpu1 1965176 3 696992 2358597 45875 12 58616 31225 1200 40
cpu2 1802233 0 655870 2530114 29980 0 15021 30871 0 0
cpu3 1887312 5 702114 2401876 41023 0 47399 30530 0 0
intr 310237425 9 0 0 0 0 0 0 0 1 0 0 0 0 0 0 0 38 0 0 0 0 0 0 0 0 1620 0 1412873
ctxt 612874412
btime 1763890265
processes 1204412
procs_running 3
procs_blocked 0
softirq 135718240 4 40286130 14 1839372 1052553 0 321044 52710531 0 39508592
`

// statFixtureBusy and statFixtureTotal are statFixture's per-CPU sums.
var (
	statFixtureBusy  = []time.Duration{ticks(2661027), ticks(2752024), ticks(2503995), ticks(2667360)}
	statFixtureTotal = []time.Duration{ticks(5165018), ticks(5156496), ticks(5064089), ticks(5110259)}
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		busy, total []time.Duration
	}{
		{"four CPUs, ten columns", statFixture, statFixtureBusy, statFixtureTotal},
		{
			// Linux 2.4: user nice system idle.
			"four columns",
			"cpu  200 4 60 800\ncpu0 100 2 30 400\ncpu1 100 2 30 400\n",
			[]time.Duration{ticks(132), ticks(132)}, []time.Duration{ticks(532), ticks(532)},
		},
		{
			// Linux 2.6.0: and iowait irq softirq.
			"seven columns",
			"cpu0 100 2 30 400 5 6 7\n",
			[]time.Duration{ticks(145)}, []time.Duration{ticks(550)},
		},
		{
			// Linux 2.6.11: and steal.
			"eight columns",
			"cpu0 100 2 30 400 5 6 7 8\n",
			[]time.Duration{ticks(153)}, []time.Duration{ticks(558)},
		},
		{
			"columns after the tenth ignored",
			"cpu0 100 2 30 400 5 6 7 8 9 10 11 x\n",
			[]time.Duration{ticks(153)}, []time.Duration{ticks(558)},
		},
		{
			"offline CPU leaves zeros at its number",
			"cpu  1 1 1 1\ncpu0 1 0 0 1\ncpu2 2 0 0 2\n",
			[]time.Duration{ticks(1), 0, ticks(2)}, []time.Duration{ticks(2), 0, ticks(4)},
		},
		{
			"tabs, CRLF and no final newline",
			"cpu0\t100 2 30 400\r\ncpu1 1 0 0 1",
			[]time.Duration{ticks(132), ticks(1)}, []time.Duration{ticks(532), ticks(2)},
		},
		{
			"long lines that are not parsed",
			"cpu0 1 0 0 1\nintr " + strings.Repeat("0 ", 50000) + "\n",
			[]time.Duration{ticks(1)}, []time.Duration{ticks(2)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy, total, err := parseStat([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(busy, tt.busy) || !reflect.DeepEqual(total, tt.total) {
				t.Errorf("got busy %v total %v\nwant busy %v total %v", busy, total, tt.busy, tt.total)
			}
		})
	}
}

// wantFormatError checks that err is a format error and mentions want.
func wantFormatError(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", want)
	}
	if !errors.Is(err, errFormat) {
		t.Errorf("error %q does not wrap errFormat", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not mention %q", err, want)
	}
	if len(err.Error()) > 200 {
		t.Errorf("error of %d bytes", len(err.Error()))
	}
}

func TestParseStatErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty", "", "no per-CPU lines"},
		{"aggregate only", "cpu  1 2 3 4\nintr 5\n", "no per-CPU lines"},
		{"three columns", "cpu0 1 2 3 4\ncpu1 1 2 3\n", "line 2: malformed: cpu1 has 3 columns"},
		{"letter in a column", "cpu0 1 2 3x 4\n", `line 1: malformed: system "3x" is not a decimal number`},
		{"negative column", "cpu0 1 -2 3 4\n", `nice "-2"`},
		{"CPU number not a number", "cpuX 1 2 3 4\n", `CPU number "X"`},
		{"CPU number too big", "cpu16384 1 2 3 4\n", "CPU number 16384 out of range"},
		{"CPU number overflowing", "cpu99999999999999999999999 1 2 3 4\n", "CPU number"},
		{"CPU number with a leading zero", "cpu0 1 2 3 4\ncpu01 1 2 3 4\n", `line 2: malformed: CPU number "01" has a leading zero`},
		{"repeated CPU", "cpu0 1 2 3 4\ncpu0 1 2 3 4\n", "line 2: malformed: cpu0 after cpu0"},
		{"CPUs out of order", "cpu1 1 2 3 4\ncpu0 1 2 3 4\n", "cpu0 after cpu1"},
		{"column overflowing uint64", "cpu0 1 2 3 18446744073709551616\n", `idle "18446744073709551616"`},
		{"column overflowing a Duration", "cpu0 922337203686 0 0 0\n", "user 922337203686 out of range"},
		{"total overflowing a Duration", "cpu0 922337203685 0 0 922337203685\n", "cpu0 total time out of range"},
		{"line too long", "cpu0 1 2 3 4" + strings.Repeat(" 5", 3000) + "\n", "line 1: malformed: longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy, total, err := parseStat([]byte(tt.in))
			wantFormatError(t, err, tt.want)
			if busy != nil || total != nil {
				t.Errorf("got %v %v with the error", busy, total)
			}
		})
	}
}

// meminfoFixture is a /proc/meminfo of a 5.x kernel (abridged).
const meminfoFixture = `MemTotal:       16318756 kB
MemFree:         1234567 kB
MemAvailable:    9876543 kB
Buffers:          234567 kB
Cached:          5678901 kB
SwapCached:            0 kB
Active:          6543210 kB
Inactive:        4321098 kB
SwapTotal:       2097148 kB
SwapFree:        2097148 kB
Shmem:            123456 kB
HugePages_Total:       0
HugePages_Free:        0
Hugepagesize:       2048 kB
DirectMap1G:    10485760 kB
`

// meminfoOldFixture is a /proc/meminfo of a kernel before 3.14, without
// MemAvailable.
const meminfoOldFixture = `MemTotal:        4046872 kB
MemFree:          512000 kB
Buffers:          100000 kB
Cached:          1400000 kB
SwapCached:            0 kB
`

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name        string
		in          string
		total, free int64
	}{
		{"with MemAvailable", meminfoFixture, 16318756 * 1024, 9876543 * 1024},
		{"without MemAvailable", meminfoOldFixture, 4046872 * 1024, (512000 + 100000 + 1400000) * 1024},
		{"only MemTotal and MemFree", "MemFree: 10 kB\nMemTotal: 20 kB\n", 20 * 1024, 10 * 1024},
		{"free capped at total", "MemTotal: 100 kB\nMemFree: 60 kB\nBuffers: 10 kB\nCached: 40 kB\n", 100 * 1024, 100 * 1024},
		{"lines without a colon", "garbage\nMemTotal: 2 kB\nMemAvailable: 1 kB", 2048, 1024},
		{"largest total", "MemTotal: 9007199254740991 kB\nMemAvailable: 0 kB\n", 9007199254740991 * 1024, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			total, free, err := parseMeminfo([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if total != tt.total || free != tt.free {
				t.Errorf("got total %d free %d, want %d %d", total, free, tt.total, tt.free)
			}
		})
	}
}

func TestParseMeminfoErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty", "", "no MemTotal"},
		{"no MemTotal", "MemFree: 1 kB\n", "no MemTotal"},
		{"no free memory line", "MemTotal: 1 kB\nBuffers: 1 kB\n", "neither MemAvailable nor MemFree"},
		{"not a number", "MemTotal: 1 kB\nMemFree: lots kB\n", `line 2: malformed: MemFree "lots" is not a decimal number`},
		{"no value", "MemTotal:\n", "line 1: malformed: MemTotal missing"},
		{"no unit", "MemTotal: 1\n", `MemTotal in "", want kB`},
		{"other unit", "MemTotal: 1 MB\n", `MemTotal in "MB", want kB`},
		{"repeated", "MemTotal: 1 kB\nMemTotal: 1 kB\n", "line 2: malformed: MemTotal repeated"},
		{"too big for bytes", "MemTotal: 9007199254740992 kB\n", "MemTotal 9007199254740992 out of range"},
		{"line too long", "MemTotal: 1 kB\nX:" + strings.Repeat(" ", 5000) + "\n", "line 2: malformed: longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseMeminfo([]byte(tt.in))
			wantFormatError(t, err, tt.want)
		})
	}
}

func TestParseLoadavg(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"0.52 0.58 0.59 1/1234 5678\n", 0.52},
		{"12.00 8.00 4.00 17/2048 99\n", 12},
		{"1" + strings.Repeat("0", 308) + ".5", 1e308},
		{"  3.5", 3.5},
		{"7", 7},
	}
	for _, tt := range tests {
		got, err := parseLoadavg([]byte(tt.in))
		if err != nil || got != tt.want {
			t.Errorf("parseLoadavg(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"", "\n", "-1.00 0 0", "NaN", "Inf", "1e3", "0x1p2", ".5", "1.2.3", "1,5", strings.Repeat("9", 400)} {
		if got, err := parseLoadavg([]byte(in)); !errors.Is(err, errFormat) {
			t.Errorf("parseLoadavg(%q) = %v, %v; want a format error", in, got, err)
		}
	}
}

// diskstatsFixture has a line of each format: sda on a 4.x kernel (14
// fields), sdb on 4.18 (18, with discards) and the rest on 5.5 and later
// (20, with flushes).
const diskstatsFixture = `   7       0 loop0 62 0 2210 18 0 0 0 0 0 40 18 0 0 0 0 0 0
   8       0 sda 2843 1058 201844 1552 1208 1389 40488 2824 0 2256 4376
   8       1 sda1 2750 1058 197368 1500 1208 1389 40488 2824 0 2208 4324
   8      16 sdb 10 0 80 4 20 2 160 8 0 12 12 5 0 40 1
 259       0 nvme0n1 165497 47376 11862178 24917 220413 174218 10573186 134546 0 142360 173215 0 0 0 0 19023 13750
 259       1 nvme0n1p1 165300 47376 11850000 24900 220400 174218 10573000 134500 0 142300 159400 0 0 0 0 0 0
  11       0 sr0 5 0 12 3 0 0 0 0 0 8 3 0 0 0 0 0 0
 253       0 dm-0 210000 0 11800000 30000 390000 0 10500000 250000 0 150000 280000 0 0 0 0 0 0
`

var (
	diskSda = stats.Disk{
		Device: "sda", ReadOps: 2843, ReadBytes: 201844 * 512, ReadTime: 1552 * time.Millisecond,
		WriteOps: 1208, WriteBytes: 40488 * 512, WriteTime: 2824 * time.Millisecond,
	}
	diskSdb = stats.Disk{
		Device: "sdb", ReadOps: 10, ReadBytes: 80 * 512, ReadTime: 4 * time.Millisecond,
		WriteOps: 20, WriteBytes: 160 * 512, WriteTime: 8 * time.Millisecond,
	}
	diskNvme = stats.Disk{
		Device: "nvme0n1", ReadOps: 165497, ReadBytes: 11862178 * 512, ReadTime: 24917 * time.Millisecond,
		WriteOps: 220413, WriteBytes: 10573186 * 512, WriteTime: 134546 * time.Millisecond,
	}
)

func TestParseDiskstats(t *testing.T) {
	tests := []struct {
		name string
		in   string
		keep diskFilter
		want []stats.Disk
	}{
		{"by name", diskstatsFixture, diskFilter{}, []stats.Disk{diskNvme, diskSda, diskSdb}},
		{
			// sdb has no /sys/block entry here; loop0, sr0 and dm-0 do
			// but are skipped by name.
			"by /sys/block",
			diskstatsFixture,
			diskFilter{whole: map[string]bool{"sda": true, "nvme0n1": true, "loop0": true, "sr0": true, "dm-0": true}},
			[]stats.Disk{diskNvme, diskSda},
		},
		{"none kept", diskstatsFixture, diskFilter{whole: map[string]bool{}}, nil},
		{"empty", "", diskFilter{}, nil},
		{"blank lines", "\n  \n 8 0 sda 2843 1058 201844 1552 1208 1389 40488 2824 0 2256 4376\n\n", diskFilter{}, []stats.Disk{diskSda}},
		{
			// Only the counters used are parsed; skipped lines only up to
			// their name.
			"fields not used",
			"8 0 sda 2843 x 201844 1552 1208 x 40488 2824 x x x\n7 0 loop0 x\n8 1 sda1\n",
			diskFilter{},
			[]stats.Disk{diskSda},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDiskstats([]byte(tt.in), tt.keep)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseDiskstatsErrors(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"too few fields", "8 0 sda 1 2 3 4 5 6 7 8 9 10\n", "line 1: malformed: sda has 13 fields, want 14, 18 or 20"},
		{"no name", "8 0\n", `device name ""`},
		{"name with a slash", "8 0 ../sda 1 2 3 4 5 6 7 8 9 10 11\n", `device name "../sda"`},
		{"dot dot", "8 0 .. 1 2 3 4 5 6 7 8 9 10 11\n", `device name ".."`},
		{"bad major", "8x 0 sda 1 2 3 4 5 6 7 8 9 10 11\n", `major number "8x"`},
		{"bad minor", "8 -1 sda 1 2 3 4 5 6 7 8 9 10 11\n", `minor number "-1"`},
		{"bad counter", "8 0 sda 1 2 3 4 5 6 7e3 8 9 10 11\n", `line 1: malformed: sectors written "7e3" is not a decimal number`},
		{"sectors overflowing bytes", "8 0 sda 1 2 36028797018963968 4 5 6 7 8 9 10 11\n", "sectors read 36028797018963968 out of range"},
		{"milliseconds overflowing", "8 0 sda 1 2 3 4 5 6 7 9223372036855 9 10 11\n", "time writing 9223372036855 out of range"},
		{"line too long", "8 0 sda 1 2 3 4 5 6 7 8 9 10 11" + strings.Repeat(" 0", 3000) + "\n", "longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDiskstats([]byte(tt.in), diskFilter{})
			wantFormatError(t, err, tt.want)
			if got != nil {
				t.Errorf("got %v with the error", got)
			}
		})
	}
}

func TestDiskFilterByName(t *testing.T) {
	whole := []string{"sda", "sdaa", "vda", "xvda", "hdc", "nvme0n1", "nvme10n2", "mmcblk0", "md0", "md127", "cciss!c0d0"}
	skipped := []string{
		"sda1", "sdaa12", "vdb2", "xvda3", "hdc4", "nvme0n1p1", "nvme10n2p15", "mmcblk0p2", "md0p1",
		"loop0", "loop0p1", "ram0", "zram0", "sr0", "fd0", "nbd0", "nbd0p1", "dm-0",
	}
	for _, name := range whole {
		if !(diskFilter{}).keep([]byte(name)) {
			t.Errorf("%s skipped, want it kept", name)
		}
	}
	for _, name := range skipped {
		if (diskFilter{}).keep([]byte(name)) {
			t.Errorf("%s kept, want it skipped", name)
		}
	}
}
