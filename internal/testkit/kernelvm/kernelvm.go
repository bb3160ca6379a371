// Package kernelvm runs a program under the distribution's own kernel,
// in a throwaway QEMU virtual machine, for the tests of what the kernel
// a test machine boots may lack.
//
// The machines toolstackd's tests run on may boot a kernel built for
// containers, without the 802.1Q, bonding, Geneve or Open vSwitch
// modules that a host toolstackd manages has. The distribution's kernel
// (Debian's linux-image-amd64, which CI installs for the QEMU guest
// tests) has them all as modules. Run boots that kernel with an
// initramfs made on the spot from:
//
//   - a static BusyBox (busybox-static) for the shell and insmod;
//   - the modules asked for, with everything modules.dep says they need,
//     loaded in order before the program starts;
//   - the files asked for (a Go test binary built with CGO_ENABLED=0,
//     iproute2's ip, ...), each with the shared libraries ldd lists for
//     it, at the same paths;
//
// runs the program as root with PATH=/usr/sbin:/usr/bin:/sbin:/bin, the
// environment variable InGuest set to "1", /proc, /sys, /dev, /run and
// /tmp mounted, and loopback up, and returns what it wrote and its exit
// status. The machine has no network device and no disk; it powers off
// when the program ends, and is killed when the context ends.
//
// Available says why it cannot run here (no QEMU, no kernel with the
// modules, no static BusyBox); callers skip with that reason. QEMU uses
// TCG unless TOOLSTACKD_TEST_ACCEL says otherwise: slow, but it works
// where KVM does not.
//
// It is ordinary code, not a _test file, so that the tests of any
// package can use it.
package kernelvm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// InGuest is the environment variable set to "1" for the program in the
// machine, so that a test binary can tell where it runs.
const InGuest = "TOOLSTACKD_IN_KERNELVM"

// Spec is what to run.
type Spec struct {
	// Modules are kernel module names ("8021q", "bonding"), loaded with
	// their dependencies; one the kernel has built in is fine.
	Modules []string
	// Files are copied into the machine: guest path -> host path. A
	// dynamically linked program brings its libraries.
	Files map[string]string
	// Argv is the program and its arguments.
	Argv []string
	// MemoryMiB is the machine's memory (default 1024).
	MemoryMiB int
	// CPUs is the number of virtual CPUs (default 2).
	CPUs int
}

// Result is how the program ended.
type Result struct {
	// Output is what the program wrote to its standard output and
	// error (with the kernel's own messages on the console mixed in).
	Output string
	// ExitCode is the program's exit status.
	ExitCode int
	// Kernel is the kernel release that ran it.
	Kernel string
	// Boot is the guest's uptime when the program started.
	Boot time.Duration
}

// Markers on the console, around the program's output.
const (
	startMark = "KERNELVM-START"
	exitMark  = "KERNELVM-EXIT "
)

// kernel is a bootable kernel and its modules.
type kernel struct {
	image, release, modDir string
	deps                   map[string][]string // module path -> its dependencies (paths under modDir)
	byName                 map[string]string   // module name -> path under modDir
	builtin                map[string]bool
	// pre are modules.softdep's "pre:" modules (or aliases) of a module:
	// what it asks for by name at load time (libcrc32c wants a crc32c),
	// which no modprobe in the machine would load for it.
	pre   map[string][]string
	alias map[string]string // alias -> module name (the last listed)
}

// Available says why Run cannot work here with these modules ("" when
// it can).
func Available(modules ...string) string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 not installed"
	}
	if _, err := staticBusybox(); err != nil {
		return err.Error()
	}
	if _, err := findKernel(modules); err != nil {
		return err.Error()
	}
	return ""
}

func staticBusybox() (string, error) {
	for _, p := range []string{"/usr/bin/busybox", "/bin/busybox"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		out, _ := exec.Command("ldd", p).CombinedOutput() // #nosec G204 -- fixed program
		if bytes.Contains(out, []byte("not a dynamic")) {
			return p, nil
		}
	}
	return "", errors.New("no static busybox (install busybox-static)")
}

// findKernel is the newest kernel in /boot whose modules include all of
// modules.
func findKernel(modules []string) (*kernel, error) {
	images, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(images)
	var why []string
	for i := len(images) - 1; i >= 0; i-- {
		release := strings.TrimPrefix(filepath.Base(images[i]), "vmlinuz-")
		k, err := loadKernel(images[i], release)
		if err == nil {
			for _, m := range modules {
				if _, ok := k.byName[m]; !ok && !k.builtin[m] {
					err = fmt.Errorf("%s has no module %s", release, m)
					break
				}
			}
		}
		if err == nil {
			return k, nil
		}
		why = append(why, err.Error())
	}
	if len(why) == 0 {
		return nil, errors.New("no kernel in /boot (install linux-image-amd64)")
	}
	return nil, fmt.Errorf("no kernel in /boot with the modules asked for: %s", strings.Join(why, "; "))
}

func loadKernel(image, release string) (*kernel, error) {
	k := &kernel{image: image, release: release, modDir: filepath.Join("/lib/modules", release),
		deps: map[string][]string{}, byName: map[string]string{}, builtin: map[string]bool{},
		pre: map[string][]string{}, alias: map[string]string{}}
	f, err := os.Open(filepath.Join(k.modDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("%s: no modules.dep: %w", release, err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mod, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k.deps[mod] = strings.Fields(deps)
		k.byName[moduleName(mod)] = mod
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(k.modDir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			k.builtin[moduleName(l)] = true
		}
	}
	if b, err := os.ReadFile(filepath.Join(k.modDir, "modules.softdep")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "softdep" {
				continue
			}
			pre := false
			for _, w := range f[2:] {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						k.pre[moduleName(f[1])] = append(k.pre[moduleName(f[1])], w)
					}
				}
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(k.modDir, "modules.alias")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "alias" && !strings.ContainsAny(f[1], "*?[") {
				// Prefer the generic implementation: it runs on any CPU.
				if _, seen := k.alias[f[1]]; !seen || strings.HasSuffix(f[2], "_generic") {
					k.alias[f[1]] = f[2]
				}
			}
		}
	}
	return k, nil
}

// moduleName is a module's name from its path: kernel/net/8021q/8021q.ko
// is 8021q; dashes and underscores are the same to the kernel.
func moduleName(p string) string {
	n := path.Base(p)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		n = strings.TrimSuffix(n, ext)
	}
	return strings.ReplaceAll(strings.TrimSuffix(n, ".ko"), "-", "_")
}

// loadOrder is the modules to insmod, dependencies first, each once.
func (k *kernel) loadOrder(names []string) ([]string, error) {
	var order []string
	seen := map[string]bool{}
	var visit func(mod string)
	visit = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		for _, p := range k.pre[moduleName(mod)] {
			name := strings.ReplaceAll(p, "-", "_")
			if a, ok := k.alias[p]; ok {
				name = strings.ReplaceAll(a, "-", "_")
			}
			if m, ok := k.byName[name]; ok {
				visit(m)
			}
		}
		// modules.dep lists every dependency, direct or not; loading
		// each one's own first keeps the order right.
		for _, d := range k.deps[mod] {
			visit(d)
		}
		order = append(order, mod)
	}
	for _, n := range names {
		n = strings.ReplaceAll(n, "-", "_")
		mod, ok := k.byName[n]
		if !ok {
			if k.builtin[n] {
				continue
			}
			return nil, fmt.Errorf("kernel %s has no module %s", k.release, n)
		}
		visit(mod)
	}
	return order, nil
}

// Run boots the machine, runs spec.Argv in it and returns how it ended.
// An error means the machine did not run the program to its end (it
// did not boot, the context ended first); Result.Output then holds the
// console as far as it got.
func Run(ctx context.Context, spec Spec) (Result, error) {
	if len(spec.Argv) == 0 {
		return Result{}, errors.New("kernelvm: no program")
	}
	bb, err := staticBusybox()
	if err != nil {
		return Result{}, err
	}
	k, err := findKernel(spec.Modules)
	if err != nil {
		return Result{}, err
	}
	order, err := k.loadOrder(spec.Modules)
	if err != nil {
		return Result{}, err
	}
	dir, err := os.MkdirTemp("", "kernelvm-")
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	initrd := filepath.Join(dir, "initrd")
	if err := writeInitrd(initrd, bb, k, order, spec); err != nil {
		return Result{}, err
	}
	mem, cpus := spec.MemoryMiB, spec.CPUs
	if mem <= 0 {
		mem = 1024
	}
	if cpus <= 0 {
		cpus = 2
	}
	accel := os.Getenv("TOOLSTACKD_TEST_ACCEL")
	if accel == "" {
		accel = "tcg"
	}
	args := []string{"-machine", "q35,accel=" + accel, "-m", strconv.Itoa(mem), "-smp", strconv.Itoa(cpus),
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", k.image, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 quiet"}
	if accel == "kvm" {
		args = append(args, "-cpu", "host")
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...) // #nosec G204 G702 -- fixed program, arguments built here
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	begin := time.Now()
	runErr := cmd.Run()
	res := Result{Kernel: k.release}
	console := strings.ReplaceAll(out.String(), "\r\n", "\n")
	i := strings.Index(console, startMark+"\n")
	if i < 0 {
		res.Output = console
		return res, fmt.Errorf("kernelvm: the program did not start (%v)", runErr)
	}
	res.Boot = bootTime(console[:i], time.Since(begin))
	rest := console[i+len(startMark)+1:]
	j := strings.LastIndex(rest, exitMark)
	if j < 0 {
		res.Output = rest
		return res, fmt.Errorf("kernelvm: the program did not end (%v)", runErr)
	}
	res.Output = rest[:j]
	code := strings.TrimSpace(strings.SplitN(rest[j+len(exitMark):], "\n", 2)[0])
	if res.ExitCode, err = strconv.Atoi(code); err != nil {
		return res, fmt.Errorf("kernelvm: exit status %q", code)
	}
	return res, nil
}

var uptimeRe = regexp.MustCompile(`KERNELVM-UPTIME ([0-9.]+)`)

// bootTime is the guest's uptime when the program started, as its init
// printed it (the whole run when it did not).
func bootTime(before string, whole time.Duration) time.Duration {
	m := uptimeRe.FindStringSubmatch(before)
	if m == nil {
		return whole
	}
	s, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return whole
	}
	return time.Duration(s * float64(time.Second))
}

// initScript is the machine's /init.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mkdir -p /proc /sys /dev /run /tmp /root /var /etc
ln -s /run /var/run
echo 'root:x:0:0:root:/root:/bin/sh' > /etc/passwd
echo 'root:x:0:' > /etc/group
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
while read -r m; do
  insmod "/lib/modules/$m" || echo "kernelvm: insmod $m failed"
done < /kernelvm/modules
ip link set lo up 2>/dev/null || /bin/ip link set lo up
echo "KERNELVM-UPTIME $(cut -d' ' -f1 /proc/uptime)"
echo KERNELVM-START
cd /tmp
export TOOLSTACKD_IN_KERNELVM=1
sh /kernelvm/run
echo "KERNELVM-EXIT $?"
sync
poweroff -f
`

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func writeInitrd(to, busybox string, k *kernel, order []string, spec Spec) error {
	f, err := os.Create(to) // #nosec G304 -- a file in Run's own temporary directory
	if err != nil {
		return err
	}
	w := NewCpio(bufio.NewWriterSize(f, 1<<20))
	add := func(guest, host string, perm int) error {
		b, err := os.ReadFile(host) // #nosec G304 -- files the caller names
		if err != nil {
			return err
		}
		w.File(guest, perm, b)
		return nil
	}
	errs := []error{add("bin/busybox", busybox, 0o755)}
	w.File("init", 0o755, []byte(initScript))
	var mods []string
	for _, m := range order {
		guest := "lib/modules/" + strings.TrimPrefix(m, "kernel/")
		errs = append(errs, add(guest, filepath.Join(k.modDir, m), 0o644))
		mods = append(mods, strings.TrimPrefix(m, "kernel/"))
	}
	w.File("kernelvm/modules", 0o644, []byte(strings.Join(mods, "\n")+"\n"))
	quoted := make([]string, len(spec.Argv))
	for i, a := range spec.Argv {
		quoted[i] = shellQuote(a)
	}
	w.File("kernelvm/run", 0o644, []byte("exec "+strings.Join(quoted, " ")+" 2>&1\n"))
	guests := make([]string, 0, len(spec.Files))
	for g := range spec.Files {
		guests = append(guests, g)
	}
	sort.Strings(guests)
	libs := map[string]bool{}
	for _, g := range guests {
		host := spec.Files[g]
		errs = append(errs, add(strings.TrimPrefix(g, "/"), host, 0o755))
		ls, err := sharedLibraries(host)
		errs = append(errs, err)
		for _, l := range ls {
			libs[l] = true
		}
	}
	for _, l := range slices.Sorted(maps.Keys(libs)) {
		errs = append(errs, add(strings.TrimPrefix(l, "/"), l, 0o755))
	}
	w.Close()
	if err := errors.Join(append(errs, w.Err())...); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// sharedLibraries are the libraries ldd lists for a program (none for a
// static one), the dynamic loader among them.
func sharedLibraries(prog string) ([]string, error) {
	out, err := exec.Command("ldd", prog).CombinedOutput() // #nosec G204 -- a file the caller names
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic")) {
			return nil, nil
		}
		return nil, fmt.Errorf("kernelvm: ldd %s: %v: %s", prog, err, strings.TrimSpace(string(out)))
	}
	var libs []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// Cpio writes a newc archive, the format the kernel unpacks as an
// initramfs. Every file's parent directories are written before it.
type Cpio struct {
	w    *bufio.Writer
	ino  int
	dirs map[string]bool
	err  error
}

// NewCpio writes an archive to w; Close ends it (and flushes w).
func NewCpio(w *bufio.Writer) *Cpio {
	return &Cpio{w: w, ino: 1, dirs: map[string]bool{".": true, "": true}}
}

func (c *Cpio) entry(name string, mode int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	pad := func(n int) []byte { return make([]byte, (4-n%4)%4) }
	for _, b := range [][]byte{[]byte(hdr), []byte(name + "\x00"), pad(len(hdr) + len(name) + 1), data, pad(len(data))} {
		if _, err := c.w.Write(b); err != nil {
			c.err = err
			return
		}
	}
}

// Dir adds a directory (and its parents).
func (c *Cpio) Dir(name string) {
	name = path.Clean(strings.TrimPrefix(name, "/"))
	if c.dirs[name] {
		return
	}
	c.Dir(path.Dir(name))
	c.dirs[name] = true
	c.entry(name, 0o040755, nil)
}

// File adds a regular file with permissions perm (and its parent
// directories).
func (c *Cpio) File(name string, perm int, data []byte) {
	name = path.Clean(strings.TrimPrefix(name, "/"))
	c.Dir(path.Dir(name))
	c.entry(name, 0o100000|perm, data)
}

// Close writes the trailer and flushes.
func (c *Cpio) Close() {
	c.entry("TRAILER!!!", 0, nil)
	if c.err == nil {
		c.err = c.w.Flush()
	}
}

// Err is the first write error.
func (c *Cpio) Err() error { return c.err }
