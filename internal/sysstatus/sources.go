package sysstatus

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"toolstackd/internal/db/xmldb"
	"toolstackd/internal/version"
)

// maxConfigBytes bounds the configuration file read (the daemon reads no
// larger one).
const maxConfigBytes = 1 * mib

// journalLines is how many of the journal's last lines the log holds.
const journalLines = 50000

// gatherLogs: the unit's journal when journalctl exists, else the end of
// the configured log file.
func (s *Service) gatherLogs(ctx context.Context, e *entry) {
	if jc, err := s.lookPath("journalctl"); err == nil {
		s.run(ctx, e, "journal.log", jc, "-u", s.cfg.Unit, "--no-pager", "-n", strconv.Itoa(journalLines), "-o", "short-iso")
		return
	}
	if s.cfg.LogFile != "" {
		tailFile(e, "toolstackd.log", s.cfg.LogFile)
		return
	}
	e.note("this host has no journalctl and no log file is configured: the log is left out")
}

// tailFile adds the end of a file: as much as the capability's max-size
// leaves room for.
func tailFile(e *entry, name, path string) {
	f, err := os.Open(path) //nolint:gosec // a path from the daemon's configuration, never from a request
	if err != nil {
		e.note("%s: %v", path, err)
		return
	}
	defer func() { _ = f.Close() }() // read only
	st, err := f.Stat()
	if err != nil {
		e.note("%s: %v", path, err)
		return
	}
	room := max(e.left-int64(len(truncMark)), 0)
	from := max(st.Size()-room, 0)
	if from > 0 {
		if _, err := f.Seek(from, io.SeekStart); err != nil {
			e.note("%s: %v", path, err)
			return
		}
		e.note("%s: its first %d bytes are left out (the capability's max-size)", path, from)
	}
	b := e.buffer()
	if _, err := io.Copy(b, io.LimitReader(f, room)); err != nil {
		e.note("%s: %v", path, err)
	}
	e.add(name, b.b.Bytes(), b.over)
}

// readBounded reads at most limit bytes of a file; over says there was
// more.
func readBounded(path string, limit int64) (data []byte, over bool, err error) {
	f, err := os.Open(path) //nolint:gosec // fixed paths and the daemon's configuration, never a request's
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = f.Close() }() // read only
	b := &boundedBuffer{limit: limit}
	if _, err := io.Copy(b, f); err != nil && !errors.Is(err, errFull) {
		return b.b.Bytes(), b.over, err
	}
	return b.b.Bytes(), b.over, nil
}

// readFile adds a file (a /proc file), cut at the max-size.
func readFile(e *entry, name, path string) {
	data, over, err := readBounded(path, e.left)
	if err != nil {
		e.note("%s: %v", path, err)
		if data == nil {
			return
		}
	}
	e.add(name, data, over)
}

// run adds what a program prints (standard output and error) as a file,
// cut at the max-size and stopped at the capability's max-time.
func (s *Service) run(ctx context.Context, e *entry, name, path string, args ...string) {
	cmd := exec.CommandContext(ctx, path, args...) //nolint:gosec // fixed programs and arguments, never a request's
	b := e.buffer()
	cmd.Stdout, cmd.Stderr = b, b
	cmd.WaitDelay = 2 * time.Second
	cmd.Env = append(os.Environ(), "LC_ALL=C", "SYSTEMD_PAGER=", "PAGER=cat")
	err := cmd.Run()
	switch {
	case b.over:
		// the program was stopped by the max-size; the mark says so
	case ctx.Err() != nil:
		_, _ = b.Write([]byte("\n** timeout **\n")) // bounded like the rest
	case err != nil:
		e.note("%s: %v", strings.Join(append([]string{filepath.Base(path)}, args...), " "), err)
	}
	e.add(name, b.b.Bytes(), b.over)
}

// gatherDB: the database, in xapi's state.db format, its secrets removed.
func (s *Service) gatherDB(ctx context.Context, e *entry) {
	if s.srv == nil {
		e.note("no database on this service")
		return
	}
	if ctx.Err() != nil {
		return
	}
	d := RedactDump(DumpOf(s.srv.Model, s.srv.DB.Snapshot()))
	b := e.buffer()
	if err := xmldb.EncodeDump(b, s.srv.Model, d); err != nil && !errors.Is(err, errFull) && !b.over {
		e.note("database dump: %v", err)
	}
	e.add("state.db.xml", b.b.Bytes(), b.over)
}

// gatherConfig: the configuration file and the effective settings, with
// secret-looking values removed.
func (s *Service) gatherConfig(_ context.Context, e *entry) {
	if s.cfg.ConfigFile == "" {
		e.note("the daemon was started without --config")
	} else {
		text, over, err := readBounded(s.cfg.ConfigFile, maxConfigBytes)
		if err != nil {
			e.note("%s: %v", s.cfg.ConfigFile, err)
		}
		if text != nil {
			e.add("toolstackd.conf", RedactConfig(text), over)
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# toolstackd %s: the settings in effect (secret-looking values removed)\n", version.Version)
	if s.cfg.ConfigFile != "" {
		fmt.Fprintf(&b, "# config = %s\n", s.cfg.ConfigFile)
	}
	names := make([]string, 0, len(s.cfg.Settings))
	for k := range s.cfg.Settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "%s = %s\n", k, strconv.Quote(RedactValue(k, s.cfg.Settings[k])))
	}
	e.add("effective-settings.txt", b.Bytes(), false)
}

// gatherSystemInfo: the kernel, CPUs, memory, addresses, the data dir's
// file system and toolstackd's version.
func (s *Service) gatherSystemInfo(ctx context.Context, e *entry) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "toolstackd %s\ngo %s %s/%s\npid %d\n", version.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH, os.Getpid())
	if h, err := os.Hostname(); err == nil {
		fmt.Fprintf(&b, "hostname %s\n", h)
	}
	fmt.Fprintf(&b, "report made %s\n", s.now().UTC().Format(time.RFC3339))
	e.add("version.txt", b.Bytes(), false)

	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		line := strings.Join([]string{unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Nodename[:]),
			unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:])}, " ")
		e.add("uname.txt", []byte(line+"\n"), false)
	} else {
		e.note("uname: %v", err)
	}
	if text, _, err := readBounded(filepath.Join(s.procDir, "cpuinfo"), 4*mib); err == nil {
		e.add("cpuinfo.txt", CPUSummary(text), false)
	} else {
		e.note("cpuinfo: %v", err)
	}
	readFile(e, "meminfo.txt", filepath.Join(s.procDir, "meminfo"))
	if ip, err := s.lookPath("ip"); err == nil {
		s.run(ctx, e, "ip-addr.txt", ip, "-o", "addr")
	} else {
		e.note("this host has no ip program: the addresses are left out")
	}
	if s.cfg.DataDir != "" {
		e.add("df-data-dir.txt", []byte(dfReport(s.cfg.DataDir)), false)
	}
}

// CPUSummary sums up /proc/cpuinfo: the processor count, the first
// processor's vendor, model and speed, and hardware virtualisation.
func CPUSummary(cpuinfo []byte) []byte {
	count := 0
	first := map[string]string{}
	virt := "none"
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			count++
		case "flags":
			for _, f := range strings.Fields(v) {
				switch f {
				case "vmx":
					virt = "vmx (Intel VT-x)"
				case "svm":
					virt = "svm (AMD-V)"
				}
			}
		}
		if _, seen := first[k]; !seen {
			first[k] = v
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "processors: %d\n", count)
	for _, k := range []string{"vendor_id", "model name", "cpu family", "model", "stepping", "cpu MHz", "cache size", "cpu cores", "siblings"} {
		if v, ok := first[k]; ok {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	fmt.Fprintf(&b, "hardware virtualisation: %s\n", virt)
	return b.Bytes()
}

// dfReport is df's line for the file system holding dir.
func dfReport(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Sprintf("%s: %v\n", dir, err)
	}
	bs := uint64(st.Bsize) //nolint:gosec // a block size is positive
	total, free, avail := st.Blocks*bs, st.Bfree*bs, st.Bavail*bs
	used := total - free
	pct := 0.0
	if used+avail > 0 {
		pct = 100 * float64(used) / float64(used+avail)
	}
	return fmt.Sprintf("%-40s %15s %15s %15s %5s %12s %12s\n%-40s %15d %15d %15d %4.0f%% %12d %12d\n",
		"Directory", "1K-blocks", "Used", "Available", "Use%", "Inodes", "IFree",
		dir, total/1024, used/1024, avail/1024, pct, st.Files, st.Ffree)
}

// gatherQEMU: QEMU's version and the command lines of the QEMU
// processes that are this daemon's children or name its data dir.
func (s *Service) gatherQEMU(ctx context.Context, e *entry) {
	if q, err := s.lookPath("qemu-system-x86_64"); err == nil {
		s.run(ctx, e, "qemu-version.txt", q, "--version")
	} else {
		e.note("this host has no qemu-system-x86_64")
	}
	procs := s.qemuProcesses(ctx)
	var b bytes.Buffer
	fmt.Fprintf(&b, "# QEMU processes that are children of toolstackd (pid %d) or name its data dir (%s)\n", os.Getpid(), s.cfg.DataDir)
	if len(procs) == 0 {
		b.WriteString("# none\n")
	}
	for _, p := range procs {
		quoted := make([]string, len(p.args))
		for i, a := range RedactArgs(p.args) {
			quoted[i] = shellQuote(a)
		}
		fmt.Fprintf(&b, "pid %d ppid %d: %s\n", p.pid, p.ppid, strings.Join(quoted, " "))
	}
	e.add("processes.txt", b.Bytes(), false)
}

type process struct {
	pid, ppid int
	args      []string
}

// maxCmdline bounds the command line read of one process.
const maxCmdline = 256 * kib

// qemuProcesses scans the process directory for QEMU processes of this
// daemon's: its children, or any naming the data dir.
func (s *Service) qemuProcesses(ctx context.Context) []process {
	ents, err := os.ReadDir(s.procDir)
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []process
	for _, ent := range ents {
		if ctx.Err() != nil {
			break
		}
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(s.procDir, ent.Name())
		args := readCmdline(filepath.Join(dir, "cmdline"))
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "qemu") {
			continue
		}
		ppid := readPPID(filepath.Join(dir, "stat"))
		mentions := false
		if s.cfg.DataDir != "" {
			for _, a := range args {
				if strings.Contains(a, s.cfg.DataDir) {
					mentions = true
					break
				}
			}
		}
		if ppid == self || mentions {
			out = append(out, process{pid: pid, ppid: ppid, args: args})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

func readCmdline(path string) []string {
	f, err := os.Open(path) //nolint:gosec // a /proc file
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }() // read only
	b, err := io.ReadAll(io.LimitReader(f, maxCmdline))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// readPPID reads the parent's pid from /proc/<pid>/stat, whose second
// field (the command's name, in parentheses) may itself hold spaces and
// parentheses: the fields after it follow the last ')'.
func readPPID(path string) int {
	b, err := os.ReadFile(path) //nolint:gosec // a /proc file
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// shellQuote quotes an argument that would not read back as one word.
func shellQuote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\n'\"\\$`*?;&|<>()[]{}!#~") {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
