package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procStatus reads a field of /proc/PID/status in kB (VmRSS, VmHWM) or as a
// count (Threads).
func procStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			fs := strings.Fields(v)
			if len(fs) == 0 {
				break
			}
			return strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

func rssKB(pid int) int64 {
	v, err := procStatus(pid, "VmRSS")
	if err != nil {
		return -1
	}
	return v
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	fs := strings.Fields(s[i+1:])
	if len(fs) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(fs[11], 10, 64)
	st, _ := strconv.ParseInt(fs[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck
}

// openFDs counts the process's open file descriptors.
func openFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// nofileLimit returns the soft RLIMIT_NOFILE of a process from
// /proc/PID/limits.
func nofileLimit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "Max open files") {
			fs := strings.Fields(line)
			if len(fs) >= 5 {
				return fs[3]
			}
		}
	}
	return "?"
}

// raiseNofile raises this process's RLIMIT_NOFILE to at least want (both
// limits when running as root).
func raiseNofile(want uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur >= want {
		return rl.Cur, nil
	}
	nl := rl
	nl.Cur = want
	if nl.Max < want {
		nl.Max = want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
		// Not root: go as far as the hard limit allows.
		nl = rl
		nl.Cur = rl.Max
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err2 != nil {
			return rl.Cur, err
		}
		return nl.Cur, err
	}
	return nl.Cur, nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// busyCPU is the machine's non-idle CPU time so far (all processes), from
// the first line of /proc/stat.
func busyCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fs := strings.Fields(line)
	if len(fs) < 8 || fs[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, f := range fs[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest time is already in user
			break
		}
		v, _ := strconv.ParseInt(f, 10, 64)
		busy += v
	}
	const clkTck = 100
	return time.Duration(busy) * time.Second / clkTck
}
