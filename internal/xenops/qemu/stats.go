package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu/qmp"
)

// A running domain's counters, for the metrics module: each VCPU's CPU
// time from its thread's /proc stat (QMP query-cpus-fast names the
// threads), the memory from the balloon (query-balloon), each disk's I/O
// from query-blockstats and each NIC's traffic from its tap's counters in
// sysfs. Everything asked of QEMU is bounded by the caller's context.

var _ backend.StatsReporter = (*QEMU)(nil)

// clockTick is the unit of utime and stime in /proc/PID/task/TID/stat:
// USER_HZ, which is 100 on every architecture Linux runs QEMU on.
const clockTick = 10 * time.Millisecond

// defaultStatsTimeout bounds Stats when its context has no deadline.
const defaultStatsTimeout = 5 * time.Second

// sysClassNet is where the kernel shows network devices' counters.
const sysClassNet = "/sys/class/net"

// Stats implements backend.StatsReporter. The domain must be running or
// paused, its emulator up and its monitor connected: a domain still
// building, stopped or gone is an error, at once. Without a deadline in
// ctx, the read is bounded by defaultStatsTimeout.
func (q *QEMU) Stats(ctx context.Context, uuid string) (stats.VM, error) {
	d, mon, err := q.live(uuid)
	if err != nil {
		return stats.VM{}, err
	}
	d.mu.Lock()
	state, pid := d.state, d.j.Pid
	startMem, target := d.j.Spec.Memory>>20<<20, d.memory // -m is in whole MiB
	disks := append([]backend.Disk(nil), d.j.Disks...)
	nics := append([]backend.NIC(nil), d.j.NICs...)
	d.mu.Unlock()
	if state != backend.DomainRunning && state != backend.DomainPaused {
		return stats.VM{}, fmt.Errorf("qemu: domain %s is %s", uuid, state)
	}
	if pid <= 0 {
		return stats.VM{}, fmt.Errorf("qemu: domain %s has no emulator process", uuid)
	}
	if target <= 0 {
		target = startMem
	}
	if _, ok := ctx.Deadline(); !ok {
		// The caller should bound the read; a monitor that does not
		// answer must not hold it for ever all the same.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStatsTimeout)
		defer cancel()
	}
	out := stats.VM{UUID: strings.ToLower(uuid), MemoryTarget: target, MemoryInternalFree: stats.Unknown}

	cpus, err := qmp.Run(ctx, mon, qmp.QueryCPUsFast{})
	if err != nil {
		return stats.VM{}, fmt.Errorf("qemu: query-cpus-fast: %w", err)
	}
	if out.VCPUTime, err = vcpuTimes(pid, cpus); err != nil {
		return stats.VM{}, err
	}

	switch balloon, err := qmp.Run(ctx, mon, qmp.QueryBalloon{}); {
	case err == nil && balloon.Actual > 0:
		out.Memory = balloon.Actual
	case err == nil || isQMPError(err):
		// No balloon device (or none active): the domain has what it
		// was started with.
		out.Memory = startMem
	default:
		return stats.VM{}, fmt.Errorf("qemu: query-balloon: %w", err)
	}

	raw, err := qmp.Run(ctx, mon, qmp.QueryBlockstats{})
	if err != nil {
		return stats.VM{}, fmt.Errorf("qemu: query-blockstats: %w", err)
	}
	if out.Disks, err = blockStats(raw, disks); err != nil {
		return stats.VM{}, err
	}

	out.NICs = make([]stats.NIC, 0, len(nics))
	for _, n := range nics {
		out.NICs = append(out.NICs, tapStats(sysClassNet, n))
	}
	return out, nil
}

func isQMPError(err error) bool {
	var qe *qmp.Error
	return errors.As(err, &qe)
}

// vcpuTimes reads each VCPU thread's CPU time, in cpu-index order. With
// TCG and one thread for every VCPU, each VCPU reports that thread's
// time. A thread that has gone (a VCPU unplugged meanwhile) reads as
// zero; the emulator itself gone is an error.
func vcpuTimes(pid int, cpus []qmp.CPUInfoFast) ([]time.Duration, error) {
	sort.SliceStable(cpus, func(i, j int) bool { return cpus[i].CPUIndex < cpus[j].CPUIndex })
	proc := "/proc/" + strconv.Itoa(pid)
	if _, err := os.Stat(proc); err != nil {
		return nil, fmt.Errorf("qemu: emulator process %d: %w", pid, err)
	}
	out := make([]time.Duration, len(cpus))
	read := map[int]time.Duration{}
	for i, c := range cpus {
		if c.ThreadID <= 0 {
			continue
		}
		if t, ok := read[c.ThreadID]; ok {
			out[i] = t
			continue
		}
		b, err := os.ReadFile(proc + "/task/" + strconv.Itoa(c.ThreadID) + "/stat") //nolint:gosec // a thread of our emulator, by number
		if err != nil {
			read[c.ThreadID] = 0
			continue
		}
		t, err := taskCPUTime(b)
		if err != nil {
			return nil, fmt.Errorf("qemu: VCPU %d thread %d: %w", c.CPUIndex, c.ThreadID, err)
		}
		out[i], read[c.ThreadID] = t, t
	}
	return out, nil
}

// taskCPUTime is the CPU time (user plus system) a /proc/PID/task/TID/stat
// line reports: fields 14 (utime) and 15 (stime), in clock ticks. The
// command name (field 2) is in parentheses and may hold anything, spaces
// and parentheses included, so fields are counted after its last ')'.
func taskCPUTime(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat: no command name")
	}
	// After ')' come field 3 (state) onwards; utime is the 12th of them.
	var utime, stime uint64
	field, n := 2, 0
	rest := b[i+1:]
	for len(rest) > 0 && n < 2 {
		j := 0
		for j < len(rest) && rest[j] == ' ' {
			j++
		}
		rest = rest[j:]
		k := bytes.IndexByte(rest, ' ')
		if k < 0 {
			k = len(rest)
		}
		tok := bytes.TrimRight(rest[:k], "\n")
		rest = rest[k:]
		if len(tok) == 0 {
			continue
		}
		field++
		if field != 14 && field != 15 {
			continue
		}
		v, err := strconv.ParseUint(string(tok), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed stat: field %d: %w", field, err)
		}
		if field == 14 {
			utime = v
		} else {
			stime = v
		}
		n++
	}
	if n < 2 {
		return 0, errors.New("malformed stat: too few fields")
	}
	const most = uint64(math.MaxInt64 / int64(clockTick))
	if utime > most || stime > most-utime {
		return 0, errors.New("malformed stat: CPU time out of range")
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// qmpBlockStats is one entry of query-blockstats.
type qmpBlockStats struct {
	QDev     string `json:"qdev"`
	NodeName string `json:"node-name"`
	Stats    struct {
		RdBytes   uint64 `json:"rd_bytes"`
		WrBytes   uint64 `json:"wr_bytes"`
		RdOps     uint64 `json:"rd_operations"`
		WrOps     uint64 `json:"wr_operations"`
		RdTotalNs int64  `json:"rd_total_time_ns"`
		WrTotalNs int64  `json:"wr_total_time_ns"`
	} `json:"stats"`
}

// blockStats picks the domain's disks out of a query-blockstats reply,
// each named by its userdevice, in the order the domain has them.
// Entries that are none of its disks (firmware flash, anything added by
// hand) are left out; a drive with no medium is there with zeros.
func blockStats(raw json.RawMessage, disks []backend.Disk) ([]stats.Disk, error) {
	var entries []qmpBlockStats
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("qemu: query-blockstats reply: %w", err)
	}
	byDev := make(map[string]*qmpBlockStats, len(entries))
	for i := range entries {
		e := &entries[i]
		dev := blockDevice(e.QDev, e.NodeName)
		if _, dup := byDev[dev]; dev != "" && !dup {
			byDev[dev] = e
		}
	}
	out := make([]stats.Disk, 0, len(disks))
	for _, d := range disks {
		e := byDev[d.Device]
		if e == nil {
			continue
		}
		s := &e.Stats
		out = append(out, stats.Disk{Device: d.Device, ReadBytes: s.RdBytes, WriteBytes: s.WrBytes, ReadOps: s.RdOps, WriteOps: s.WrOps,
			ReadTime: time.Duration(max(s.RdTotalNs, 0)), WriteTime: time.Duration(max(s.WrTotalNs, 0))})
	}
	return out, nil
}

// blockDevice is the userdevice a query-blockstats entry belongs to, from
// the names devID and nodeName (and LiveSnapshot's overlays) give: the
// device's qdev id "vbdN" (IDE), or "/machine/peripheral/vbdN/..." for a
// virtio disk, whose block backend belongs to the virtio device inside
// the PCI one; else the top node, "vbdN-fmt" or "vbdN-overlayK". "" when
// it is none of these.
func blockDevice(qdev, node string) string {
	if dev, ok := userdevice(qdev); ok {
		return dev
	}
	if rest, ok := strings.CutPrefix(qdev, "/machine/peripheral/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		if dev, ok := userdevice(id); ok {
			return dev
		}
	}
	if head, tail, ok := strings.Cut(node, "-"); ok && (tail == "fmt" || strings.HasPrefix(tail, "overlay")) {
		if dev, ok := userdevice(head); ok {
			return dev
		}
	}
	return ""
}

// userdevice reads "vbdN" (N a userdevice number) as N.
func userdevice(id string) (string, bool) {
	n, ok := strings.CutPrefix(id, "vbd")
	if !ok || n == "" || len(n) > 3 {
		return "", false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return n, true
}

// tapStats is a NIC's counters as the guest sees them, from its tap's:
// what the tap sent is what the guest received. A NIC without a tap, or
// whose tap has gone, has zeros.
func tapStats(root string, n backend.NIC) stats.NIC {
	s := stats.NIC{Device: n.Device}
	if n.Tap == "" || !tapNamePattern.MatchString(n.Tap) {
		return s
	}
	dir := filepath.Join(root, n.Tap, "statistics")
	s.RxBytes = readCounter(filepath.Join(dir, "tx_bytes"))
	s.TxBytes = readCounter(filepath.Join(dir, "rx_bytes"))
	s.RxErrors = readCounter(filepath.Join(dir, "tx_errors"))
	s.TxErrors = readCounter(filepath.Join(dir, "rx_errors"))
	return s
}

// readCounter reads a sysfs counter; missing or unreadable is zero.
func readCounter(path string) uint64 {
	b, err := os.ReadFile(path) //nolint:gosec // a tap's counter under /sys/class/net, the tap name checked
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}
