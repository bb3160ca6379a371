package sysstatus

import (
	"bytes"
	"compress/bzip2"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const testTop = "bug-report-20260102030405/"

// hermetic points a service at a fake /proc and a fixed clock, and hides
// every program but bzip2 and those given (name to path).
func hermetic(t testing.TB, s *Service, programs ...string) {
	t.Helper()
	proc := t.TempDir()
	mustWrite(t, filepath.Join(proc, "cpuinfo"), "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t\t: fpu vmx sse\n\n"+
		"processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nflags\t\t: fpu vmx sse\n")
	mustWrite(t, filepath.Join(proc, "meminfo"), "MemTotal:       16318480 kB\nMemFree:         1234567 kB\n")
	s.procDir = proc
	s.now = func() time.Time { return testNow }
	known := map[string]string{}
	for i := 0; i+1 < len(programs); i += 2 {
		known[programs[i]] = programs[i+1]
	}
	s.lookPath = func(name string) (string, error) {
		if p, ok := known[name]; ok {
			return p, nil
		}
		if name == "bzip2" {
			return lookPath(name)
		}
		return "", exec.ErrNotFound
	}
}

func mustWrite(t testing.TB, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o755); err != nil { //nolint:gosec // test scripts must run
		t.Fatal(err)
	}
}

// newTestService is a service over a first-booted database, with a
// configuration file holding a password.
func newTestService(t *testing.T) *Service {
	t.Helper()
	srv, host := newServer(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "toolstackd.conf")
	mustWrite(t, conf, "listen = 127.0.0.1:8080\nldap-password = conf-secret-1\n")
	s := New(srv, Config{DataDir: dir, ConfigFile: conf, HostRef: host,
		Settings: map[string]string{"listen": "127.0.0.1:8080", "ldap-password": "conf-secret-1"}})
	hermetic(t, s)
	return s
}

// read unpacks an archive of any format.
func read(t *testing.T, b []byte, format string) map[string][]byte {
	t.Helper()
	switch format {
	case FormatZip:
		return unzip(t, b)
	case FormatTarGz:
		return untar(t, b, true)
	case FormatTarBz2:
		return readTar(t, bzip2.NewReader(bytes.NewReader(b)))
	}
	return untar(t, b, false)
}

func sortedKeys(m map[string][]byte) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkBounds checks that no capability's directory holds more than its
// max-size.
func checkBounds(t *testing.T, s *Service, files map[string][]byte) {
	t.Helper()
	used := map[string]int64{}
	for n, b := range files {
		rest, ok := strings.CutPrefix(n, testTop)
		if !ok {
			t.Errorf("%s: outside %s", n, testTop)
			continue
		}
		if key, _, ok := strings.Cut(rest, "/"); ok {
			used[key] += int64(len(b))
		}
	}
	for k, n := range used {
		c := s.find(k)
		if c == nil {
			t.Errorf("directory %s is no capability's", k)
			continue
		}
		if n > c.MaxSize {
			t.Errorf("%s: %d bytes, max-size %d", k, n, c.MaxSize)
		}
	}
}

func TestCollectFormats(t *testing.T) {
	s := newTestService(t)
	want := []string{
		testTop,
		testTop + "qemu/", testTop + "qemu/NOTE.txt", testTop + "qemu/processes.txt",
		testTop + "system-info/", testTop + "system-info/NOTE.txt", testTop + "system-info/cpuinfo.txt",
		testTop + "system-info/df-data-dir.txt", testTop + "system-info/meminfo.txt", testTop + "system-info/uname.txt",
		testTop + "system-info/version.txt",
		testTop + "toolstackd-config/", testTop + "toolstackd-config/effective-settings.txt",
		testTop + "toolstackd-config/toolstackd.conf",
		testTop + "toolstackd-db/", testTop + "toolstackd-db/state.db.xml",
		testTop + "toolstackd-logs/", testTop + "toolstackd-logs/NOTE.txt",
	}
	for _, format := range formats {
		t.Run(format, func(t *testing.T) {
			if _, err := s.CheckFormat(format); err != nil {
				t.Skip(err)
			}
			var b bytes.Buffer
			if err := s.Collect(context.Background(), nil, &b, format); err != nil {
				t.Fatal(err)
			}
			files := read(t, b.Bytes(), format)
			if got := sortedKeys(files); !slices.Equal(got, want) {
				t.Errorf("archive lists\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			checkBounds(t, s, files)
			all := ""
			for _, d := range files {
				all += string(d)
			}
			if strings.Contains(all, "conf-secret-1") {
				t.Error("the configuration's password is in the report")
			}
			if !strings.Contains(string(files[testTop+"toolstackd-config/toolstackd.conf"]), "listen = 127.0.0.1:8080") {
				t.Error("the configuration file is not in the report")
			}
			if !strings.Contains(string(files[testTop+"system-info/cpuinfo.txt"]), "processors: 2") {
				t.Errorf("cpuinfo: %s", files[testTop+"system-info/cpuinfo.txt"])
			}
		})
	}
}

func TestCollectSelected(t *testing.T) {
	s := newTestService(t)
	var b bytes.Buffer
	if err := s.Collect(context.Background(), []string{CapQEMU, " system-info ", CapQEMU}, &b, ""); err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, n := range sortedKeys(read(t, b.Bytes(), FormatTar)) {
		if strings.Count(n, "/") == 2 && strings.HasSuffix(n, "/") {
			dirs = append(dirs, n)
		}
	}
	if want := []string{testTop + "qemu/", testTop + "system-info/"}; !slices.Equal(dirs, want) {
		t.Errorf("dirs %v, want %v", dirs, want)
	}
}

func TestCollectRefusals(t *testing.T) {
	s := newTestService(t)
	for _, c := range []struct {
		entries []string
		format  string
		param   string
	}{
		{[]string{"system-info", "../etc", "nope"}, FormatTar, "../etc,nope"},
		{[]string{"system-info"}, "tar.xz", "tar.xz"},
		{[]string{strings.Repeat("x,", 3000)}, FormatTar, ""},
	} {
		var b bytes.Buffer
		err := s.Collect(context.Background(), c.entries, &b, c.format)
		var xe *xerr.Error
		if !errors.As(err, &xe) || xe.Code != xerr.ValueNotSupported || (c.param != "" && xe.Params[1] != c.param) {
			t.Errorf("%v %q: %v", c.entries, c.format, err)
		}
		if b.Len() != 0 {
			t.Errorf("%v %q: %d bytes written before the refusal", c.entries, c.format, b.Len())
		}
	}
	// tar.bz2 without a bzip2 program is refused with the reason.
	s.lookPath = func(string) (string, error) { return "", exec.ErrNotFound }
	_, err := s.CheckFormat(FormatTarBz2)
	var xe *xerr.Error
	if !errors.As(err, &xe) || xe.Code != xerr.ValueNotSupported || !strings.Contains(xe.Params[2], "bzip2") {
		t.Errorf("tar.bz2 without bzip2: %v", err)
	}
}

// setMax sets a capability's max-size and max-time.
func setMax(s *Service, key string, size int64, secs int) {
	c := s.find(key)
	c.MaxSize, c.MaxTime = size, secs
}

func TestCollectBounds(t *testing.T) {
	s := newTestService(t)
	dir := t.TempDir()
	// A journalctl that prints its arguments and far too much, and an ip
	// that never ends.
	journal := filepath.Join(dir, "journalctl")
	mustWrite(t, journal, "#!/bin/sh\necho \"$@\"\nexec yes journal-line\n")
	ip := filepath.Join(dir, "ip")
	mustWrite(t, ip, "#!/bin/sh\necho partial\nexec sleep 60\n")
	hermetic(t, s, "journalctl", journal, "ip", ip)
	setMax(s, CapLogs, 64*kib, 20)
	setMax(s, CapDB, 16*kib, 20)
	setMax(s, CapSystemInfo, 64*kib, 1)
	start := time.Now()
	var b bytes.Buffer
	if err := s.Collect(context.Background(), []string{CapLogs, CapDB, CapSystemInfo}, &b, FormatTarGz); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("took %s", d)
	}
	files := read(t, b.Bytes(), FormatTarGz)
	checkBounds(t, s, files)
	log := string(files[testTop+"toolstackd-logs/journal.log"])
	if !strings.HasPrefix(log, "-u toolstackd --no-pager -n "+strconv.Itoa(journalLines)+" -o short-iso\n") ||
		!strings.HasSuffix(log, truncMark) {
		t.Errorf("journal: %d bytes: %.100q ... %q", len(log), log, log[max(len(log)-80, 0):])
	}
	dump := string(files[testTop+"toolstackd-db/state.db.xml"])
	if !strings.HasPrefix(dump, "<?xml") || !strings.HasSuffix(dump, truncMark) {
		t.Errorf("dump: %d bytes", len(dump))
	}
	ipOut := string(files[testTop+"system-info/ip-addr.txt"])
	if !strings.Contains(ipOut, "partial") || !strings.Contains(ipOut, "** timeout **") {
		t.Errorf("ip: %q", ipOut)
	}
	if note := string(files[testTop+"system-info/NOTE.txt"]); !strings.Contains(note, "max-time") {
		t.Errorf("system-info note: %q", note)
	}
}

func TestCollectLogFile(t *testing.T) {
	s := newTestService(t)
	logFile := filepath.Join(t.TempDir(), "toolstackd.log")
	mustWrite(t, logFile, strings.Repeat("old line\n", 20000)+"the newest line\n")
	s.cfg.LogFile = logFile
	setMax(s, CapLogs, 32*kib, 5)
	var b bytes.Buffer
	if err := s.Collect(context.Background(), []string{CapLogs}, &b, FormatZip); err != nil {
		t.Fatal(err)
	}
	files := read(t, b.Bytes(), FormatZip)
	checkBounds(t, s, files)
	if log := string(files[testTop+"toolstackd-logs/toolstackd.log"]); !strings.HasSuffix(log, "the newest line\n") {
		t.Errorf("log does not end with the newest line: %q", log[max(len(log)-40, 0):])
	}
	if note := string(files[testTop+"toolstackd-logs/NOTE.txt"]); !strings.Contains(note, "left out") {
		t.Errorf("note: %q", note)
	}
}

func TestCollectCancelled(t *testing.T) {
	s := newTestService(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var b bytes.Buffer
	if err := s.Collect(ctx, nil, &b, FormatTar); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled collection: %v", err)
	}
}

func TestCollectWaitsItsTurn(t *testing.T) {
	s := newTestService(t)
	for range maxReports {
		s.busy <- struct{}{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var b bytes.Buffer
	if err := s.Collect(ctx, nil, &b, FormatTar); !errors.Is(err, context.DeadlineExceeded) || b.Len() != 0 {
		t.Errorf("a report past the limit: %v, %d bytes", err, b.Len())
	}
	<-s.busy
	if err := s.Collect(context.Background(), []string{CapConfig}, &b, FormatTar); err != nil || b.Len() == 0 {
		t.Errorf("a report with a turn free: %v, %d bytes", err, b.Len())
	}
}

func TestQEMUProcesses(t *testing.T) {
	s := newTestService(t)
	self := os.Getpid()
	proc := func(pid, ppid int, args ...string) {
		d := filepath.Join(s.procDir, strconv.Itoa(pid))
		mustWrite(t, filepath.Join(d, "cmdline"), strings.Join(args, "\x00")+"\x00")
		mustWrite(t, filepath.Join(d, "stat"), strconv.Itoa(pid)+" (qemu (odd) name) S "+strconv.Itoa(ppid)+" 1 1 0\n")
	}
	proc(101, self, "/usr/bin/qemu-system-x86_64", "-name", "child-vm", "-object", "secret,id=s0,data=qemu-secret-1")
	proc(102, 1, "qemu-system-x86_64", "-name", "detached-vm", "-drive", "file="+s.cfg.DataDir+"/disk one.img")
	proc(103, 1, "qemu-system-x86_64", "-name", "someone-elses-vm")
	proc(104, self, "/bin/sleep", "100")
	mustWrite(t, filepath.Join(s.procDir, "self", "cmdline"), "qemu\x00")
	var b bytes.Buffer
	if err := s.Collect(context.Background(), []string{CapQEMU}, &b, FormatTar); err != nil {
		t.Fatal(err)
	}
	out := string(read(t, b.Bytes(), FormatTar)[testTop+"qemu/processes.txt"])
	for _, want := range []string{"pid 101 ppid " + strconv.Itoa(self) + ": /usr/bin/qemu-system-x86_64 -name child-vm",
		"data=" + Removed, "pid 102 ppid 1:", "'file=" + s.cfg.DataDir + "/disk one.img'"} {
		if !strings.Contains(out, want) {
			t.Errorf("processes lack %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"qemu-secret-1", "someone-elses-vm", "sleep"} {
		if strings.Contains(out, bad) {
			t.Errorf("processes hold %q:\n%s", bad, out)
		}
	}
}

func TestCapabilitiesXMLForm(t *testing.T) {
	s := New(nil, Config{})
	doc := s.CapabilitiesXML()
	if !strings.HasPrefix(doc, `<?xml version="1.0" ?>`+"\n<system-status-capabilities>\n\t<capability content-type=") {
		t.Errorf("document:\n%s", doc)
	}
	want := `<capability content-type="application/xml" default-checked="yes" key="toolstackd-db" max-size="67108864" max-time="30" min-size="-1" min-time="-1" pii="yes"/>`
	if !strings.Contains(doc, want) {
		t.Errorf("document lacks %s:\n%s", want, doc)
	}
	// Without a database the capability says so rather than failing.
	hermetic(t, s)
	var b bytes.Buffer
	if err := s.Collect(context.Background(), []string{CapDB}, &b, FormatTar); err != nil {
		t.Fatal(err)
	}
	if note := string(read(t, b.Bytes(), FormatTar)[testTop+"toolstackd-db/NOTE.txt"]); !strings.Contains(note, "no database") {
		t.Errorf("note %q", note)
	}
}

func TestDownloadName(t *testing.T) {
	s := newTestService(t)
	if _, err := s.srv.DB.Update(func(tx *db.Tx) error {
		return tx.Set(dm.Host.Hostname, s.cfg.HostRef, "odd host/\"name\"")
	}); err != nil {
		t.Fatal(err)
	}
	if name := s.downloadName(FormatTarGz); name != "system_status-20260102T030405Z-oddhostname.tar.gz" {
		t.Errorf("download name %q", name)
	}
}
