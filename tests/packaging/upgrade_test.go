package packaging

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"toolstackd/internal/datamodel"
	"toolstackd/internal/testkit/netnstest"
)

// upgradeBudget bounds TestUpgradeKeepsThePool: the previous release's
// build (this checkout's is shared with TestDebianPackage), both
// daemons, the installs and the purge. That took 3m22s with both builds
// on a machine at load average 9, and a build takes twice as long on a
// loaded machine: the budget is generous, to fail cleanly on a hang.
const upgradeBudget = 20 * time.Minute

// TestUpgradeKeepsThePool installs the previous release's package, makes
// a pool with VMs (one running on the simulator), installs this
// checkout's package over it and restarts the daemon as the postinst has
// systemd do (SIGTERM to the main process only, then ExecStart): the pool,
// the host, the VMs, their settings, the running domain and a local edit
// of the configuration file are all still there. Then it purges the
// package: nothing of it is left but the VM disks the postrm says it
// keeps. It runs only as root, on a machine without the package, after or
// before TestDebianPackage (neither is parallel: they install the same
// package).
//
// The previous release is the newest tag before HEAD, else the revision
// in packaging/UPGRADE_FROM. TOOLSTACKD_UPGRADE_FROM_DEB and
// TOOLSTACKD_DEB name packages built already (the old and the new one).
func TestUpgradeKeepsThePool(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("installing a package needs root")
	}
	tools := []string{"dpkg", "dpkg-deb", "make"}
	if os.Getenv("TOOLSTACKD_UPGRADE_FROM_DEB") == "" {
		tools = append(tools, "git", "tar")
		if _, err := os.Stat(filepath.Join(repo, ".git")); err != nil {
			t.Skip("not a git checkout (a source tarball): there is no previous release to build")
		}
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
	machineIsClean(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), upgradeBudget)
	defer cancel()

	oldDeb, newDeb := buildBoth(ctx, t)

	// Whatever happens from here, the package, its configuration and its
	// data directory go.
	const conf = "/etc/toolstackd/toolstackd.conf"
	dataDir := "/var/lib/toolstackd"
	t.Cleanup(func() {
		if b, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status}", "toolstackd").Output(); err == nil && len(b) > 0 && string(b) != "not-installed" {
			if out, err := exec.Command("dpkg", "--purge", "toolstackd").CombinedOutput(); err != nil {
				t.Errorf("cleanup: dpkg --purge: %v\n%s", err, out)
			}
		}
		for _, p := range []string{dataDir, "/var/lib/toolstackd", "/etc/toolstackd"} {
			if err := os.RemoveAll(p); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		_ = os.Remove("/run/toolstackd") // only when empty
	})

	// The previous release, running, with a pool and VMs.
	dpkgInstall(ctx, t, oldDeb)
	dataDir = confValue(t, conf, "data-dir", dataDir)
	oldVersion := binVersion(ctx, t)
	old := startService(ctx, t, "previous release, empty database")

	xe := func(args ...string) string {
		t.Helper()
		xctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		b, err := exec.CommandContext(xctx, "/usr/bin/xe", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("xe %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return strings.TrimSpace(string(b))
	}
	pool := xe("pool-list", "--minimal")
	host := xe("host-list", "--minimal")
	running := xe("vm-install", "template=Other install media", "new-name-label=upgrade-running")
	// The Debian template gives the VM a disk in the local SR: the purge
	// keeps it.
	halted := xe("vm-install", "template=Debian Bookworm 12", "new-name-label=upgrade-halted")
	xe("vm-start", "uuid="+running)
	mark := fmt.Sprintf("kept-%d", time.Now().UnixNano())
	xe("vm-param-set", "uuid="+halted, "other-config:upgrade-test="+mark)
	vms := sortedList(xe("vm-list", "--minimal"))
	type vmState struct{ power, domid, residentOn string }
	state := func(uuid string) vmState {
		return vmState{
			xe("vm-param-get", "uuid="+uuid, "param-name=power-state"),
			xe("vm-param-get", "uuid="+uuid, "param-name=domid"),
			xe("vm-param-get", "uuid="+uuid, "param-name=resident-on"),
		}
	}
	runningBefore, haltedBefore := state(running), state(halted)
	if runningBefore.power != "running" || haltedBefore.power != "halted" {
		t.Fatalf("before the upgrade: %s is %+v, %s is %+v", running, runningBefore, halted, haltedBefore)
	}
	t.Logf("previous release %s: pool %s, host %s, %d VMs, %s running as domain %s", oldVersion, pool, host, len(vms), running, runningBefore.domid)

	// An administrator's edit of the configuration file.
	const confEdit = "# an administrator's edit (TestUpgradeKeepsThePool)\n"
	appendFile(t, conf, confEdit)

	// The upgrade as the maintainer scripts do it: the prerm leaves the
	// service running, dpkg replaces the files under it, and the postinst
	// restarts it: systemd's stop is SIGTERM to the daemon only
	// (KillMode=process), which leaves VMs running. A non-interactive
	// dpkg asks nothing about the edited conffile: it keeps it, as apt's
	// usual options do.
	dpkgInstall(ctx, t, newDeb, "--force-confdef", "--force-confold")
	if err := old.stop(); err != nil {
		t.Fatalf("the previous release's daemon after SIGTERM: %v\n%s", err, old.logText())
	}
	if b, err := os.ReadFile(conf); err != nil || !bytes.Contains(b, []byte(confEdit)) {
		t.Errorf("the edit of %s is gone after the upgrade (%v)", conf, err)
	}
	dbFile := filepath.Join(dataDir, "toolstackd.db")
	if _, err := os.Stat(dbFile); err != nil {
		t.Fatalf("the database is gone after the upgrade: %v", err)
	}
	schemaBefore := dbSchema(t, dbFile)
	newVersion := binVersion(ctx, t)
	if newVersion == oldVersion {
		t.Errorf("toolstackd --version is %q before and after the upgrade", newVersion)
	}
	nu := startService(ctx, t, fmt.Sprintf("new release, the previous release's database of %d VMs", len(vms)))

	if got := xe("pool-list", "--minimal"); got != pool {
		t.Errorf("pool after the upgrade: %s, was %s", got, pool)
	}
	if got := xe("host-list", "--minimal"); got != host {
		t.Errorf("host after the upgrade: %s, was %s", got, host)
	}
	if got := sortedList(xe("vm-list", "--minimal")); !slices.Equal(got, vms) {
		t.Errorf("VMs after the upgrade: %v, were %v", got, vms)
	}
	if got := state(running); got != runningBefore {
		t.Errorf("the running VM after the upgrade: %+v, was %+v", got, runningBefore)
	}
	if got := state(halted); got != haltedBefore {
		t.Errorf("the halted VM after the upgrade: %+v, was %+v", got, haltedBefore)
	}
	if got := xe("vm-param-get", "uuid="+halted, "param-name=other-config", "param-key=upgrade-test"); got != mark {
		t.Errorf("other-config:upgrade-test after the upgrade: %q, was %q", got, mark)
	}
	if out := xe("vm-list"); !strings.Contains(out, "upgrade-running") || !strings.Contains(out, "upgrade-halted") {
		t.Errorf("xe vm-list after the upgrade:\n%s", out)
	}
	if got := xe("host-param-get", "uuid="+host, "param-name=software-version", "param-key=build_number"); got != newVersion {
		t.Errorf("host.software_version:build_number after the upgrade: %q, toolstackd --version says %q", got, newVersion)
	}
	// The new daemon drives the domain the old one started.
	xe("vm-shutdown", "uuid="+running, "--force")
	if got := xe("vm-param-get", "uuid="+running, "param-name=power-state"); got != "halted" {
		t.Errorf("the carried-over VM after vm-shutdown: %s", got)
	}

	if err := nu.stop(); err != nil {
		t.Errorf("the new daemon after SIGTERM: %v", err)
	}
	schemaAfter := dbSchema(t, dbFile)
	upgradeSteps := nu.logLines("upgrading database")
	t.Logf("database schema %s before, %s after the upgrade; upgrade steps logged: %d %v", schemaBefore, schemaAfter, len(upgradeSteps), upgradeSteps)
	if schemaAfter.older(schemaBefore) {
		t.Errorf("the database's schema went back from %s to %s", schemaBefore, schemaAfter)
	}
	if os.Getenv("TOOLSTACKD_DEB") == "" {
		if want := (schemaVersion{datamodel.SchemaMajor, datamodel.SchemaMinor}); schemaAfter != want {
			t.Errorf("the database's schema after the upgrade is %s, the new release's is %s", schemaAfter, want)
		}
	}

	purgeLeavesOnlyDisks(ctx, t, dataDir)
	t.Logf("figure: the upgrade test took %v", time.Since(began).Round(time.Second))
}

// machineIsClean skips unless the package, its configuration and its
// data are absent and its dependencies installed.
func machineIsClean(t *testing.T) {
	if exec.Command("dpkg", "-s", "toolstackd").Run() == nil {
		t.Skip("toolstackd is installed on this machine: not touching it")
	}
	for _, p := range []string{"/var/lib/toolstackd", "/etc/toolstackd"} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s exists on this machine: not touching it", p)
		}
	}
	if b, err := exec.Command("dpkg", "-s", "qemu-system-x86", "qemu-utils", "iproute2").CombinedOutput(); err != nil {
		t.Skipf("the package's dependencies are not installed: %s", b)
	}
}

// buildBoth builds (or takes) the previous release's package and this
// checkout's.
func buildBoth(ctx context.Context, t *testing.T) (oldDeb, newDeb string) {
	oldDeb = os.Getenv("TOOLSTACKD_UPGRADE_FROM_DEB")
	if oldDeb == "" {
		rev, from := previousRelease(ctx, t)
		start := time.Now()
		oldDeb = buildOld(ctx, t, rev)
		t.Logf("figure: the previous release's package (%s, %s) took %v to build", rev, from, time.Since(start).Round(time.Second))
	}
	start := time.Now()
	newDeb = checkoutDeb(t) // TestDebianPackage's, when it ran first
	t.Logf("figure: this checkout's package took %v to build (or was built already)", time.Since(start).Round(time.Second))
	t.Logf("upgrading %s to %s", filepath.Base(oldDeb), filepath.Base(newDeb))
	return oldDeb, newDeb
}

func git(ctx context.Context, args ...string) (string, error) {
	b, err := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...).Output()
	return strings.TrimSpace(string(b)), err
}

// previousRelease is the revision to upgrade from: the newest tag
// reachable from HEAD that is not HEAD itself, else the one in
// packaging/UPGRADE_FROM.
func previousRelease(ctx context.Context, t *testing.T) (rev, from string) {
	head, err := git(ctx, "rev-parse", "HEAD")
	if err != nil {
		t.Skipf("git rev-parse HEAD: %v", err)
	}
	for _, at := range []string{"HEAD", "HEAD^"} {
		tag, err := git(ctx, "describe", "--tags", "--abbrev=0", at)
		if err != nil {
			break // no tag reachable
		}
		if c, err := git(ctx, "rev-parse", tag+"^{commit}"); err == nil && c != head {
			rev, from = tag, "the newest tag before HEAD"
			break
		}
	}
	if rev == "" {
		b, err := os.ReadFile(filepath.Join(repo, "packaging", "UPGRADE_FROM"))
		if err != nil {
			t.Fatalf("no tag before HEAD, and %v", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
				rev, from = f[0], "packaging/UPGRADE_FROM"
				break
			}
		}
		if rev == "" {
			t.Fatal("packaging/UPGRADE_FROM names no revision")
		}
	}
	c, err := git(ctx, "rev-parse", "--verify", "--quiet", rev+"^{commit}")
	if err != nil {
		t.Skipf("%s (from %s) is not in this clone (a shallow one? git fetch --unshallow --tags)", rev, from)
	}
	if c == head {
		t.Skipf("the previous release %s (from %s) is HEAD: nothing to upgrade from", rev, from)
	}
	return rev, from
}

// buildOld builds rev's package from its own tree (git archive, so the
// repository's state is not touched), with the version git gives rev.
func buildOld(ctx context.Context, t *testing.T, rev string) string {
	tmp := t.TempDir()
	version, err := git(ctx, "describe", "--tags", "--always", rev)
	if err != nil {
		t.Fatalf("git describe %s: %v", rev, err)
	}
	epoch, err := git(ctx, "log", "-1", "--format=%ct", rev)
	if err != nil {
		t.Fatalf("git log %s: %v", rev, err)
	}
	tarball, src := filepath.Join(tmp, "old.tar"), filepath.Join(tmp, "old")
	if b, err := exec.CommandContext(ctx, "git", "-C", repo, "archive", "-o", tarball, rev).CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", rev, err, b)
	}
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, b)
	}
	// Outside a checkout the tree's Makefile and build-deb.sh cannot ask
	// git: give them what they would have found.
	return makeDeb(ctx, t, src, filepath.Join(tmp, "out"), []string{"VERSION=" + version}, "SOURCE_DATE_EPOCH="+epoch)
}

// makeDeb runs make deb in dir and returns the package it made.
func makeDeb(ctx context.Context, t *testing.T, dir, out string, makeArgs []string, env ...string) string {
	cmd := exec.CommandContext(ctx, "make", append([]string{"-s", "deb", "DEB_DIR=" + out}, makeArgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make deb in %s: %v\n%s", dir, err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(out, "toolstackd_*_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make deb in %s made %v", dir, debs)
	}
	return debs[0]
}

// dpkgInstall installs deb and checks that the unit stops only the
// daemon (KillMode=process), on which keeping VMs over an upgrade rests.
func dpkgInstall(ctx context.Context, t *testing.T, deb string, opts ...string) {
	args := append(append([]string{}, opts...), "-i", deb)
	b, err := exec.CommandContext(ctx, "dpkg", args...).CombinedOutput()
	t.Logf("dpkg %s:\n%s", strings.Join(args, " "), b)
	if err != nil {
		t.Fatalf("dpkg -i %s: %v", filepath.Base(deb), err)
	}
	unit, err := os.ReadFile("/lib/systemd/system/toolstackd.service")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^KillMode=process$`).Match(unit) {
		t.Errorf("%s: toolstackd.service has no KillMode=process: a stop for the upgrade would end the VMs", filepath.Base(deb))
	}
}

// binVersion is the installed daemon's version (toolstackd --version's
// last word).
func binVersion(ctx context.Context, t *testing.T) string {
	b, err := exec.CommandContext(ctx, "/usr/sbin/toolstackd", "--version").Output()
	f := strings.Fields(string(b))
	if err != nil || len(f) == 0 {
		t.Fatalf("toolstackd --version: %v %q", err, b)
	}
	return f[len(f)-1]
}

// confValue is name's value in the configuration file, else def.
func confValue(t *testing.T, path, name, def string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		if ok && !strings.HasPrefix(strings.TrimSpace(line), "#") && strings.TrimSpace(k) == name {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return def
}

func appendFile(t *testing.T, path, text string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func sortedList(csv string) []string {
	l := strings.Split(csv, ",")
	slices.Sort(l)
	return l
}

// service is the installed unit's ExecStart, run as systemd would, on the
// simulator backend (the shipped configuration says qemu; a flag wins).
type service struct {
	cmd    *exec.Cmd
	exited chan error // nil once the exit is seen
	mu     sync.Mutex
	log    strings.Builder
}

func startService(ctx context.Context, t *testing.T, what string) *service {
	dir, err := os.MkdirTemp("", "tsd-upgrade") // short: a socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	notify := listenNotify(t, filepath.Join(dir, "notify"))
	argv := append(execStart(t), "--backend", "simulator", "--listen", "127.0.0.1:0")
	if strings.HasPrefix(what, "new release") {
		// A network backend acts in a namespace of the test's own (the
		// previous release has no such setting, nor a network module).
		argv = append(argv, "--network-namespace", netnstest.New(t).Path())
	}
	s := &service{cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan error, 1)} //nolint:gosec // the installed unit's command line
	s.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "notify"))
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Before the purge (cleanups run last first).
	t.Cleanup(s.kill)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
		s.exited <- s.cmd.Wait()
	}()
	select {
	case <-notify.ready:
		t.Logf("figure: ExecStart to READY=1 (%s): %v", what, time.Since(start).Round(time.Millisecond))
	case err := <-s.exited:
		s.exited = nil
		t.Fatalf("the daemon (%s) exited before READY=1: %v\n%s", what, err, s.logText())
	case <-time.After(90 * time.Second):
		t.Fatalf("no READY=1 in 90s (%s)\n%s", what, s.logText())
	case <-ctx.Done():
		t.Fatalf("out of time (%v for the whole test) waiting for READY=1 (%s)\n%s", upgradeBudget, what, s.logText())
	}
	return s
}

func (s *service) logText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// logLines are the daemon's log lines that hold substr.
func (s *service) logLines(substr string) []string {
	var l []string
	for _, line := range strings.Split(s.logText(), "\n") {
		if strings.Contains(line, substr) {
			l = append(l, line)
		}
	}
	return l
}

// stop is systemd's stop: SIGTERM, and a wait of TimeoutStopSec.
func (s *service) stop() error {
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case err := <-s.exited:
		s.exited = nil
		return err
	case <-time.After(30 * time.Second):
		return errors.New("no exit 30s after SIGTERM")
	}
}

// kill ends the daemon if it still runs.
func (s *service) kill() {
	if s.exited == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
	}
	s.exited = nil
}

type schemaVersion struct{ major, minor int }

func (v schemaVersion) String() string { return fmt.Sprintf("%d.%d", v.major, v.minor) }

func (v schemaVersion) older(w schemaVersion) bool {
	return v.major < w.major || v.major == w.major && v.minor < w.minor
}

// dbSchema is the schema version a stopped daemon's database file is at
// (internal/db/persist keeps it in the meta bucket).
func dbSchema(t *testing.T, path string) schemaVersion {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer func() { _ = db.Close() }()
	var v schemaVersion
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		if meta == nil {
			return errors.New("no meta bucket")
		}
		var err1, err2 error
		v.major, err1 = strconv.Atoi(string(meta.Get([]byte("schema_major"))))
		v.minor, err2 = strconv.Atoi(string(meta.Get([]byte("schema_minor"))))
		return errors.Join(err1, err2)
	})
	if err != nil {
		t.Fatalf("%s: the schema version: %v", path, err)
	}
	return v
}

// purgeLeavesOnlyDisks purges the package: its configuration goes, and of
// its files and data directory only the VM disks the postrm says it keeps
// are left. It then removes those too.
func purgeLeavesOnlyDisks(ctx context.Context, t *testing.T, dataDir string) {
	list, err := exec.CommandContext(ctx, "dpkg", "-L", "toolstackd").Output()
	if err != nil {
		t.Fatalf("dpkg -L: %v", err)
	}
	// Disks: files in a local SR's directory but the SR's own dot-files.
	var disks []string
	_ = filepath.WalkDir(filepath.Join(dataDir, "storage"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasPrefix(d.Name(), ".") &&
			strings.HasPrefix(p, filepath.Join(dataDir, "storage", "local")) {
			disks = append(disks, p)
		}
		return nil
	})
	if len(disks) == 0 {
		t.Errorf("no VM disk in %s/storage before the purge: the test's VM was to have one", dataDir)
	}

	out, err := exec.CommandContext(ctx, "dpkg", "--purge", "toolstackd").CombinedOutput()
	t.Logf("dpkg --purge:\n%s", out)
	if err != nil {
		t.Fatalf("dpkg --purge: %v", err)
	}
	var kept []string
	for _, m := range regexp.MustCompile(`kept in (/\S+)`).FindAllSubmatch(out, -1) {
		kept = append(kept, string(m[1]))
	}
	under := func(p string) bool { // in or above a kept directory
		for _, k := range kept {
			if p == k || strings.HasPrefix(p, k+"/") || strings.HasPrefix(k, p+"/") {
				return true
			}
		}
		return false
	}
	for _, d := range disks {
		if !under(d) {
			t.Errorf("the purge did not say it keeps %s (it said it keeps %v)", d, kept)
		}
		if _, err := os.Stat(d); err != nil {
			t.Errorf("the purge removed a VM disk: %v", err)
		}
	}
	if _, err := os.Stat("/etc/toolstackd"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/toolstackd after the purge: %v", err)
	}
	// The package's files, but directories other packages share and what
	// the postrm said it keeps.
	ours := regexp.MustCompile(`^(/etc/toolstackd|/var/lib/toolstackd|/usr/libexec/toolstackd|/usr/share/doc/toolstackd)(/|$)`)
	for _, p := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		fi, err := os.Stat(p)
		if err != nil || under(p) {
			continue
		}
		if !fi.IsDir() || ours.MatchString(p) {
			t.Errorf("left after purge: %s", p)
		}
	}
	// And nothing else of the daemon's state.
	_ = filepath.WalkDir(dataDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !under(p) {
			t.Errorf("left after purge in the data directory: %s", p)
		}
		return nil
	})
	if links, _ := filepath.Glob("/etc/systemd/system/*/toolstackd*"); len(links) > 0 {
		t.Errorf("unit links left after purge: %v", links)
	}
	if err := os.RemoveAll(dataDir); err != nil {
		t.Error(err)
	}
}
