package qemu

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// kvmUsable reports whether a KVM device can be opened for writing and
// speaks the stable KVM API (version 12): the test QEMU and libvirt make.
func kvmUsable(dev string) (bool, string) {
	f, err := os.OpenFile(dev, os.O_RDWR, 0) //nolint:gosec // the KVM device node, configured
	if err != nil {
		return false, err.Error()
	}
	defer func(c func() error) { _ = c() }(f.Close)
	const kvmGetAPIVersion = 0xAE00
	v, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), kvmGetAPIVersion, 0)
	if errno != 0 {
		return false, "KVM_GET_API_VERSION: " + errno.Error()
	}
	if v != 12 {
		return false, "unexpected KVM API version " + strconv.Itoa(int(v))
	}
	return true, ""
}

var kvmProbes sync.Map // device -> [2]any{bool, string}

// kvmAvailable is kvmUsable, asked once per device.
func kvmAvailable(dev string) (bool, string) {
	if v, ok := kvmProbes.Load(dev); ok {
		r := v.([2]any)
		return r[0].(bool), r[1].(string)
	}
	ok, why := kvmUsable(dev)
	kvmProbes.Store(dev, [2]any{ok, why})
	return ok, why
}

// procStartTime is a process's start time in clock ticks since boot
// (field 22 of /proc/PID/stat): with the pid, it names one process for
// good, whatever pids are reused later.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return 0, errors.New("short stat")
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, errors.New("process is a zombie")
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// sameProcess reports whether pid is still the process that started at
// start and whose command line mentions marker.
func sameProcess(pid int, start uint64, marker string) bool {
	if pid <= 0 {
		return false
	}
	st, err := procStartTime(pid)
	if err != nil || st != start {
		return false
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	return bytes.Contains(cmd, []byte(marker))
}

// killProcess sends SIGKILL to pid if it is still the expected process,
// and waits (up to timeout) for it to go.
func killProcess(pid int, start uint64, marker string, timeout time.Duration) bool {
	if !sameProcess(pid, start, marker) {
		return true
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !sameProcess(pid, start, marker) {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// tailFile returns the last n bytes of a file, trimmed.
// truncate cuts s to n bytes, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path) //nolint:gosec // the backend's own log file
	if err != nil {
		return ""
	}
	defer func(c func() error) { _ = c() }(f.Close)
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := st.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, st.Size()-off)
	got, _ := f.ReadAt(buf, off) // a short read gives what there is
	buf = buf[:got]
	return strings.TrimSpace(string(buf))
}
