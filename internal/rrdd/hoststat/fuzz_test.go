package hoststat

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The fuzz targets check that the parsers never panic, that what they
// allocate stays bounded (the fuzzer's memory limit would catch a
// runaway allocation), that their errors stay short and wrap errFormat,
// and that what they return on success is sane.

// checkError checks an error of a parser.
func checkError(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errFormat) {
		t.Fatalf("error %v does not wrap errFormat", err)
	}
	if len(err.Error()) > 200 {
		t.Fatalf("error of %d bytes: %.300s", len(err.Error()), err)
	}
}

func FuzzParseStat(f *testing.F) {
	for _, s := range []string{
		statFixture,
		"cpu0 100 2 30 400\ncpu1 100 2 30 400\n",
		"cpu0 100 2 30 400 5 6 7 8\n",
		"cpu0 1 0 0 1\ncpu2 2 0 0 2\n",
		"cpu0 922337203685 0 0 922337203685\n",
		"cpu16383 1 1 1 1\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		busy, total, err := parseStat(b)
		if err != nil {
			checkError(t, err)
			return
		}
		if len(busy) == 0 || len(busy) != len(total) || len(busy) > maxCPUs {
			t.Fatalf("%d busy, %d total", len(busy), len(total))
		}
		// The last CPU's line is in the input.
		if last := "cpu" + strconv.Itoa(len(busy)-1); !bytes.Contains(b, []byte(last)) {
			t.Fatalf("%d CPUs, no %s line", len(busy), last)
		}
		for i := range busy {
			if busy[i] < 0 || busy[i] > total[i] {
				t.Fatalf("cpu%d busy %v of %v", i, busy[i], total[i])
			}
			if busy[i]%tick != 0 || total[i]%tick != 0 {
				t.Fatalf("cpu%d not in whole ticks: %v %v", i, busy[i], total[i])
			}
		}
	})
}

func FuzzParseMeminfo(f *testing.F) {
	for _, s := range []string{
		meminfoFixture,
		meminfoOldFixture,
		"MemTotal: 100 kB\nMemFree: 60 kB\nBuffers: 10 kB\nCached: 40 kB\n",
		"MemTotal: 9007199254740991 kB\nMemFree: 9007199254740991 kB\nBuffers: 9007199254740991 kB\nCached: 9007199254740991 kB\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		total, free, err := parseMeminfo(b)
		if err != nil {
			checkError(t, err)
			return
		}
		if total < 0 || free < 0 || free > total || total%1024 != 0 || free%1024 != 0 {
			t.Fatalf("total %d free %d", total, free)
		}
	})
}

func FuzzParseLoadavg(f *testing.F) {
	for _, s := range []string{"0.52 0.58 0.59 1/1234 5678\n", "12.00 8.00 4.00 17/2048 99\n", "7", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := parseLoadavg(b)
		if err != nil {
			checkError(t, err)
			return
		}
		if !(x >= 0) || math.IsInf(x, 0) {
			t.Fatalf("load average %v", x)
		}
	})
}

func FuzzParseDiskstats(f *testing.F) {
	for _, s := range []string{
		diskstatsFixture,
		"8 0 sda 2843 x 201844 1552 1208 x 40488 2824 x x x\n7 0 loop0 x\n8 1 sda1\n",
		"8 0 sda 1 2 36028797018963967 4 5 6 36028797018963967 9223372036854 9 10 11\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, bySysBlock bool) {
		var keep diskFilter
		if bySysBlock {
			keep.whole = map[string]bool{"sda": true, "nvme0n1": true, "dm-0": true}
		}
		disks, err := parseDiskstats(b, keep)
		if err != nil {
			checkError(t, err)
			return
		}
		if len(disks) > bytes.Count(b, []byte("\n"))+1 {
			t.Fatalf("%d disks from %d lines", len(disks), bytes.Count(b, []byte("\n"))+1)
		}
		for i, d := range disks {
			if !validDiskName([]byte(d.Device)) || !keep.keep([]byte(d.Device)) || !strings.Contains(string(b), d.Device) {
				t.Fatalf("disk %q", d.Device)
			}
			if i > 0 && disks[i-1].Device > d.Device {
				t.Fatalf("disks out of order: %q before %q", disks[i-1].Device, d.Device)
			}
			if d.ReadTime < 0 || d.WriteTime < 0 || d.ReadBytes%512 != 0 || d.WriteBytes%512 != 0 {
				t.Fatalf("disk %+v", d)
			}
		}
	})
}
