package hoststat

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/rrdd/stats"
)

const (
	// maxFileSize bounds every file read; a bigger one is an error.
	maxFileSize = 1 << 20
	// maxLineLen bounds every line that is parsed.
	maxLineLen = 4096
	// userHZ is USER_HZ, the unit of the CPU times in /proc/stat: 100
	// ticks per second on every architecture Go supports (it is part of
	// the kernel's ABI and does not follow CONFIG_HZ). C programs ask
	// sysconf(_SC_CLK_TCK); this package does not use cgo, so it is a
	// constant here.
	userHZ = 100
	// tick is the duration of one USER_HZ clock tick.
	tick = time.Second / userHZ
	// maxTicks is the largest tick count that fits a time.Duration.
	maxTicks = uint64(math.MaxInt64 / int64(tick))
	// maxCPUs bounds the CPU numbers of /proc/stat, and with them the
	// size of the slices allocated for them (Linux's NR_CPUS is at most
	// 8192 today).
	maxCPUs = 1 << 14
	// sectorSize is the unit of /proc/diskstats' sector counts, fixed by
	// the kernel whatever the device's sector size.
	sectorSize = 512
	// maxSectors and maxMillis are the largest sector and millisecond
	// counts that fit a uint64 of bytes and a time.Duration.
	maxSectors = math.MaxUint64 / sectorSize
	maxMillis  = uint64(math.MaxInt64 / int64(time.Millisecond))
	// kiB is /proc/meminfo's "kB"; maxKiB the largest count of it that
	// fits an int64 of bytes.
	kiB    = 1024
	maxKiB = uint64(math.MaxInt64 / kiB)
)

// errFormat is wrapped by every error about a file's contents.
var errFormat = errors.New("malformed")

// eachLine yields b's lines, without their newlines, and their numbers
// from 1.
func eachLine(b []byte) iter.Seq2[int, []byte] {
	return func(yield func(int, []byte) bool) {
		rest := b
		for n := 1; len(rest) > 0; n++ {
			line := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				line, rest = rest[:i], rest[i+1:]
			} else {
				rest = nil
			}
			if !yield(n, line) {
				return
			}
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// field returns the first blank-separated field of s and what follows it;
// f is empty when s holds no more fields.
func field(s []byte) (f, rest []byte) {
	i := 0
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	j := i
	for j < len(s) && !isSpace(s[j]) {
		j++
	}
	return s[i:j], s[j:]
}

// parseDec parses an unsigned decimal number of digits only (no sign, no
// underscores, no base prefix), reporting false on anything else or on
// overflow. Unlike strconv it does not allocate.
func parseDec(f []byte) (uint64, bool) {
	if len(f) == 0 {
		return 0, false
	}
	var v uint64
	for _, c := range f {
		if !isDigit(c) {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// clip shortens a field quoted in an error message.
func clip(f []byte) string {
	const max = 32
	if len(f) > max {
		return string(f[:max]) + "..."
	}
	return string(f)
}

// lineError reports a malformed line by number.
func lineError(n int, format string, args ...any) error {
	return fmt.Errorf("line %d: %w: %s", n, errFormat, fmt.Sprintf(format, args...))
}

// number parses field f of line n, which must be at most max.
func number(n int, what string, f []byte, max uint64) (uint64, error) {
	v, ok := parseDec(f)
	if !ok {
		if len(f) == 0 {
			return 0, lineError(n, "%s missing", what)
		}
		return 0, lineError(n, "%s %q is not a decimal number", what, clip(f))
	}
	if v > max {
		return 0, lineError(n, "%s %d out of range", what, v)
	}
	return v, nil
}

// checkLen refuses line n when it is longer than maxLineLen.
func checkLen(n int, line []byte) error {
	if len(line) > maxLineLen {
		return lineError(n, "longer than %d bytes", maxLineLen)
	}
	return nil
}

// statColumns names /proc/stat's per-CPU columns in order.
var statColumns = [...]string{"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice"}

// parseStat reads the per-CPU lines of /proc/stat: per CPU number, the
// time spent busy and in all. See the package comment for the sums. The
// kernel lists online CPUs in increasing order; a line out of that order
// (or a repeated one) is an error, as is a file with no per-CPU line.
func parseStat(b []byte) (busy, total []time.Duration, err error) {
	last := -1
	for n, line := range eachLine(b) {
		name, rest := field(line)
		// "cpu" alone is the aggregate; "intr", "ctxt" and the others
		// do not start with "cpu".
		if len(name) <= 3 || !bytes.HasPrefix(name, []byte("cpu")) {
			continue
		}
		if err := checkLen(n, line); err != nil {
			return nil, nil, err
		}
		cpu, err := number(n, "CPU number", name[3:], maxCPUs-1)
		if err != nil {
			return nil, nil, err
		}
		if name[3] == '0' && len(name) > 4 {
			// The kernel writes cpu%d; cpu01 would pass for cpu1.
			return nil, nil, lineError(n, "CPU number %q has a leading zero", clip(name[3:]))
		}
		if int(cpu) <= last {
			return nil, nil, lineError(n, "cpu%d after cpu%d", cpu, last)
		}
		var v [len(statColumns)]uint64
		cols := 0
		for cols < len(v) {
			var f []byte
			f, rest = field(rest)
			if len(f) == 0 {
				break
			}
			if v[cols], err = number(n, statColumns[cols], f, maxTicks); err != nil {
				return nil, nil, err
			}
			cols++
		}
		if cols < 4 {
			return nil, nil, lineError(n, "cpu%d has %d columns, want at least 4", cpu, cols)
		}
		// Each column is at most maxTicks (< 2^60), so neither sum
		// overflows a uint64.
		busyTicks := v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
		totalTicks := busyTicks + v[3] + v[4]
		if totalTicks > maxTicks {
			return nil, nil, lineError(n, "cpu%d total time out of range", cpu)
		}
		for len(busy) < int(cpu) {
			busy = append(busy, 0)
			total = append(total, 0)
		}
		busy = append(busy, time.Duration(busyTicks)*tick)
		total = append(total, time.Duration(totalTicks)*tick)
		last = int(cpu)
	}
	if last < 0 {
		return nil, nil, fmt.Errorf("%w: no per-CPU lines", errFormat)
	}
	return busy, total, nil
}

// The fields of /proc/meminfo that parseMeminfo reads.
const (
	memTotal = iota
	memFree
	memAvailable
	memBuffers
	memCached
	memFields
)

var memKeys = [memFields]string{"MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached"}

// memKey returns the index of key in memKeys, or -1.
func memKey(key []byte) int {
	for i, k := range memKeys {
		if string(key) == k {
			return i
		}
	}
	return -1
}

// parseMeminfo reads /proc/meminfo: the total memory and the memory
// available, in bytes, free at most total. MemTotal is required, and
// so is MemAvailable or else MemFree. Lines of other keys are not looked
// at past their key.
func parseMeminfo(b []byte) (total, free int64, err error) {
	var v [memFields]uint64
	var have [memFields]bool
	for n, line := range eachLine(b) {
		if err := checkLen(n, line); err != nil {
			return 0, 0, err
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			continue
		}
		k := memKey(line[:colon])
		if k < 0 {
			continue
		}
		if have[k] {
			return 0, 0, lineError(n, "%s repeated", memKeys[k])
		}
		f, rest := field(line[colon+1:])
		if v[k], err = number(n, memKeys[k], f, maxKiB); err != nil {
			return 0, 0, err
		}
		if unit, _ := field(rest); string(unit) != "kB" {
			return 0, 0, lineError(n, "%s in %q, want kB", memKeys[k], clip(unit))
		}
		have[k] = true
	}
	if !have[memTotal] {
		return 0, 0, fmt.Errorf("%w: no MemTotal", errFormat)
	}
	var avail uint64
	switch {
	case have[memAvailable]:
		avail = v[memAvailable]
	case have[memFree]:
		// Each is at most maxKiB (< 2^54): the sum fits.
		avail = v[memFree] + v[memBuffers] + v[memCached]
	default:
		return 0, 0, fmt.Errorf("%w: neither MemAvailable nor MemFree", errFormat)
	}
	avail = min(avail, v[memTotal])
	return int64(v[memTotal]) * kiB, int64(avail) * kiB, nil
}

// parseLoadavg reads /proc/loadavg's first field, the one-minute load
// average, which the kernel prints as digits, a point and two digits.
func parseLoadavg(b []byte) (float64, error) {
	line, _, _ := bytes.Cut(b, []byte{'\n'})
	if err := checkLen(1, line); err != nil {
		return 0, err
	}
	f, _ := field(line)
	if len(f) == 0 {
		return 0, fmt.Errorf("%w: empty", errFormat)
	}
	// Digits with at most one point: this keeps out what ParseFloat
	// would also take (signs, exponents, "Inf", "NaN", hexadecimal).
	point := false
	for i, c := range f {
		switch {
		case isDigit(c):
		case c == '.' && !point && i > 0:
			point = true
		default:
			return 0, lineError(1, "load average %q is not a decimal number", clip(f))
		}
	}
	x, err := strconv.ParseFloat(string(f), 64)
	if err != nil || math.IsInf(x, 0) {
		return 0, lineError(1, "load average %q out of range", clip(f))
	}
	return x, nil
}

// diskFilter tells whole physical disks from the other lines of
// /proc/diskstats.
type diskFilter struct {
	// whole names the entries of /sys/block; when nil, partitions are
	// told by their names.
	whole map[string]bool
}

// skippedPrefixes name the block devices that are not physical disks.
var skippedPrefixes = [...]string{"loop", "ram", "zram", "sr", "fd", "nbd", "dm-"}

// keep reports whether name is a whole physical disk.
func (d diskFilter) keep(name []byte) bool {
	for _, p := range skippedPrefixes {
		if bytes.HasPrefix(name, []byte(p)) {
			return false
		}
	}
	if d.whole != nil {
		return d.whole[string(name)]
	}
	return !isPartitionName(name)
}

// letterDisks are the disk families named by letters whose partitions add
// the number directly: sda1, hdc2, vdb3, xvda4.
var letterDisks = [...]string{"sd", "hd", "vd", "xvd"}

// isPartitionName guesses from its name alone whether a block device is a
// partition: a letter-named disk followed by a number (sda1), or a name
// ending in a digit followed by "p" and a number (nvme0n1p1, mmcblk0p2,
// md0p1). Whole disks named with digits (nvme0n1, mmcblk0, md0) are not
// partitions.
func isPartitionName(name []byte) bool {
	i := len(name)
	for i > 0 && isDigit(name[i-1]) {
		i--
	}
	if i == len(name) || i == 0 {
		return false
	}
	stem := name[:i]
	if len(stem) >= 2 && stem[len(stem)-1] == 'p' && isDigit(stem[len(stem)-2]) {
		return true
	}
	for _, p := range letterDisks {
		letters := bytes.TrimPrefix(stem, []byte(p))
		if len(letters) == len(stem) || len(letters) == 0 {
			continue
		}
		all := true
		for _, c := range letters {
			all = all && 'a' <= c && c <= 'z'
		}
		if all {
			return true
		}
	}
	return false
}

// validDiskName reports whether name can be a kernel block device name
// (which the kernel writes with "!" in place of "/").
func validDiskName(name []byte) bool {
	return len(name) > 0 && string(name) != "." && string(name) != ".." &&
		bytes.IndexByte(name, '/') < 0 && bytes.IndexByte(name, 0) < 0
}

// parseDiskstats reads /proc/diskstats: the counters of each device keep
// takes, sorted by name. Each line is "major minor name" and at least 11
// counters; lines of devices that are skipped are not read past their
// name.
func parseDiskstats(b []byte, keep diskFilter) ([]stats.Disk, error) {
	var disks []stats.Disk
	for n, line := range eachLine(b) {
		if err := checkLen(n, line); err != nil {
			return nil, err
		}
		major, rest := field(line)
		if len(major) == 0 {
			continue // a blank line
		}
		minor, rest := field(rest)
		name, rest := field(rest)
		if _, err := number(n, "major number", major, math.MaxUint32); err != nil {
			return nil, err
		}
		if _, err := number(n, "minor number", minor, math.MaxUint32); err != nil {
			return nil, err
		}
		if !validDiskName(name) {
			return nil, lineError(n, "device name %q", clip(name))
		}
		if !keep.keep(name) {
			continue
		}
		// The counters: reads completed, reads merged, sectors read, ms
		// reading, writes completed, writes merged, sectors written, ms
		// writing, I/Os in flight, ms doing I/O, weighted ms doing I/O;
		// then four for discards (4.18) and two for flushes (5.5).
		var c [11][]byte
		for i := range c {
			if c[i], rest = field(rest); len(c[i]) == 0 {
				return nil, lineError(n, "%s has %d fields, want 14, 18 or 20", clip(name), 3+i)
			}
		}
		d := stats.Disk{Device: string(name)}
		var err error
		// Reads are fields 1, 3 and 4 after the name; writes 5, 7 and 8.
		if d.ReadOps, d.ReadBytes, d.ReadTime, err = direction(n, [3]string{"reads completed", "sectors read", "time reading"}, c[0], c[2], c[3]); err != nil {
			return nil, err
		}
		if d.WriteOps, d.WriteBytes, d.WriteTime, err = direction(n, [3]string{"writes completed", "sectors written", "time writing"}, c[4], c[6], c[7]); err != nil {
			return nil, err
		}
		disks = append(disks, d)
	}
	slices.SortFunc(disks, func(a, b stats.Disk) int { return strings.Compare(a.Device, b.Device) })
	return disks, nil
}

// direction reads one direction's counters of a diskstats line: the
// requests completed, the sectors moved (as bytes) and the milliseconds
// spent; names are the three fields' names, for errors.
func direction(n int, names [3]string, ops, sectors, ms []byte) (uint64, uint64, time.Duration, error) {
	o, err := number(n, names[0], ops, math.MaxUint64)
	if err != nil {
		return 0, 0, 0, err
	}
	sec, err := number(n, names[1], sectors, maxSectors)
	if err != nil {
		return 0, 0, 0, err
	}
	t, err := number(n, names[2], ms, maxMillis)
	if err != nil {
		return 0, 0, 0, err
	}
	return o, sec * sectorSize, time.Duration(t) * time.Millisecond, nil
}
