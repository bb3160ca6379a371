package xenops_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/kernelvm"
)

// A tiny guest for the QEMU tests: the host's Debian kernel with an
// initramfs made here from busybox. Its /init script loads the virtio and
// ACPI button drivers, runs busybox acpid so that the ACPI power button
// powers it off, starts printing "GUEST-READY disks: ..." on the serial
// port every second, and then becomes busybox init (still PID 1), whose
// inittab runs a shell on the serial port and starts it again when it
// ends. Init reaps every process orphaned under it, so commands the tests
// kill or leave behind in the background do not stay as zombies
// (guest_init_test.go).

const guestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mkdir -p /proc /sys /dev /etc/acpi/PWRF /tmp /var/log /var/run
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk failover net_failover virtio_net button evdev; do
  insmod /lib/modules/$m.ko 2>/dev/null
done
printf '#!/bin/sh\npoweroff -f\n' > /etc/acpi/PWRF/00000080
chmod +x /etc/acpi/PWRF/00000080
sleep 1
acpid -c /etc/acpi
( while true; do echo "GUEST-READY disks: $(ls /sys/block | tr '\n' ' ')"; sleep 1; done ) > /dev/ttyS0 2>&1 &
echo 'ttyS0::respawn:/bin/sh' > /etc/inittab
exec /bin/init
`

var guestModules = []string{
	"drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko", "drivers/virtio/virtio_pci_legacy_dev.ko",
	"drivers/virtio/virtio_pci_modern_dev.ko", "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko",
	"drivers/acpi/button.ko", "drivers/input/evdev.ko",
	"net/core/failover.ko", "drivers/net/net_failover.ko", "drivers/net/virtio_net.ko", // NICs (netperf_test.go)
}

type guest struct {
	dir    string // holds kernel and initrd: give it as KernelDirs
	kernel string
	initrd string
	accel  string // tcg or kvm
	args   string
}

var (
	guestOnce sync.Once
	theGuest  *guest
	guestErr  string
	guestRoot string
)

// testGuest returns the tiny guest, skipping the test when the machine
// cannot run it (no QEMU, kernel or busybox: scripts/install-test-deps.sh
// installs them).
func testGuest(t *testing.T) *guest {
	t.Helper()
	guestOnce.Do(func() { theGuest, guestErr = buildGuest() })
	if theGuest == nil {
		t.Skip("no test guest: " + guestErr)
	}
	return theGuest
}

func buildGuest() (*guest, string) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, "qemu-system-x86_64 not installed"
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return nil, "busybox not installed"
	}
	if out, err := exec.Command("ldd", bb).CombinedOutput(); err == nil && !bytes.Contains(out, []byte("not a dynamic")) {
		return nil, "busybox is not static (install busybox-static)"
	}
	// The newest kernel whose modules include the guest's drivers (a
	// cloud kernel may lack some).
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(kernels)
	kernel, modDir := "", ""
	for i := len(kernels) - 1; i >= 0 && kernel == ""; i-- {
		dir := filepath.Join("/lib/modules", strings.TrimPrefix(filepath.Base(kernels[i]), "vmlinuz-"), "kernel")
		ok := true
		for _, m := range guestModules {
			if _, err := os.Stat(filepath.Join(dir, m)); err != nil {
				ok = false
			}
		}
		if ok {
			kernel, modDir = kernels[i], dir
		}
	}
	if kernel == "" {
		return nil, "no kernel in /boot with the modules the test guest needs (install linux-image-amd64)"
	}
	dir, err := os.MkdirTemp("", "xo-guest")
	if err != nil {
		return nil, err.Error()
	}
	guestRoot = dir
	g := &guest{dir: dir, kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd"), args: "console=ttyS0 quiet"}
	if err := copyTo(kernel, g.kernel); err != nil {
		return nil, "kernel: " + err.Error()
	}
	var cpio bytes.Buffer
	bw := bufio.NewWriter(&cpio)
	w := kernelvm.NewCpio(bw)
	for _, d := range []string{"bin", "lib", "lib/modules", "proc", "sys", "dev", "etc", "tmp"} {
		w.Dir(d)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		return nil, err.Error()
	}
	w.File("bin/busybox", 0o755, b)
	w.File("init", 0o755, []byte(guestInit))
	for _, m := range guestModules {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return nil, "kernel module: " + err.Error()
		}
		w.File("lib/modules/"+filepath.Base(m), 0o644, b)
	}
	w.Close()
	if err := w.Err(); err != nil {
		return nil, err.Error()
	}
	if err := os.WriteFile(g.initrd, cpio.Bytes(), 0o644); err != nil {
		return nil, err.Error()
	}
	g.accel = pickAccel(g)
	return g, ""
}

func copyTo(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// pickAccel boots the guest once with KVM (as the backend would, -cpu
// host) and keeps KVM if it comes up; nested or broken KVM falls back to
// TCG. TOOLSTACKD_TEST_ACCEL overrides.
func pickAccel(g *guest) string {
	if a := os.Getenv("TOOLSTACKD_TEST_ACCEL"); a != "" {
		return a
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		return "tcg"
	} else {
		f.Close()
	}
	cmd := exec.Command("qemu-system-x86_64", "-machine", "pc,accel=kvm", "-cpu", "host", "-m", "128", "-nodefaults",
		"-display", "none", "-serial", "stdio", "-kernel", g.kernel, "-initrd", g.initrd, "-append", g.args)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "tcg"
	}
	if err := cmd.Start(); err != nil {
		return "tcg"
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "GUEST-READY") {
				found <- true
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		if ok {
			return "kvm"
		}
	case <-time.After(15 * time.Second):
	}
	return "tcg"
}

// consoleConn is a connection to a VM console through /console.
type consoleConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *consoleConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// console connects to a VM's console of a protocol (rfb or vt100) with
// HTTP CONNECT, as a XenAPI client does with the console's location.
func (e *env) console(vm, protocol string) *consoleConn {
	e.t.Helper()
	var loc string
	for _, c := range strSet(e.field("VM", vm, "consoles")) {
		rec := e.record("console", c)
		if rec["protocol"] == protocol {
			loc = rec["location"].(string)
		}
	}
	if loc == "" {
		e.t.Fatalf("VM has no %s console", protocol)
	}
	u, err := url.Parse(loc)
	if err != nil {
		e.t.Fatal(err)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		e.t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT %s?%s&session_id=%s HTTP/1.0\r\n\r\n", u.Path, u.RawQuery, e.sess)
	r := bufio.NewReader(conn)
	status, err := r.ReadString('\n')
	if err != nil || !strings.Contains(status, " 200 ") {
		e.t.Fatalf("CONNECT %s: %q %v", loc, status, err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			e.t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	return &consoleConn{conn, r}
}

// waitFor reads a console until a line containing s appears.
func (c *consoleConn) waitFor(t *testing.T, s string, timeout time.Duration) string {
	t.Helper()
	return c.waitForLine(t, func(l string) bool { return strings.Contains(l, s) }, timeout)
}

// waitForLine reads a console until a line satisfies ok.
func (c *consoleConn) waitForLine(t *testing.T, ok func(string) bool, timeout time.Duration) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	var seen []string
	for {
		line, err := c.r.ReadString('\n')
		if ok(line) {
			return line
		}
		if line != "" {
			seen = append(seen, strings.TrimSpace(line))
			if len(seen) > 20 {
				seen = seen[1:]
			}
		}
		if err != nil {
			t.Fatalf("waiting on the console: %v; last lines:\n%s", err, strings.Join(seen, "\n"))
		}
	}
}
