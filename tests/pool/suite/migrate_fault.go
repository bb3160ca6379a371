package suite

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TickInit is the guest's whole userland: a counter on the serial port,
// five a second.
const TickInit = `#!/bin/busybox sh
/bin/busybox mkdir -p /dev
/bin/busybox mount -t devtmpfs dev /dev
n=0
while true; do
  n=$((n+1))
  echo "TICK $n" > /dev/ttyS0
  /bin/busybox sleep 0.2
done
`

// TickGuestFiles are the tick guest's kernel and initramfs, in Dir.
type TickGuestFiles struct{ Dir, kernel, initrd string }

// TickGuest builds the guest (the host's kernel and an initramfs with
// busybox), skipping the test when the machine cannot run it.
func TickGuest(t *testing.T) TickGuestFiles {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 (scripts/install-test-deps.sh installs it)")
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox (install busybox-static)")
	}
	if out, err := exec.Command("ldd", bb).CombinedOutput(); err == nil && !bytes.Contains(out, []byte("not a dynamic")) {
		t.Skip("busybox is not static (install busybox-static)")
	}
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(kernels)
	if len(kernels) == 0 {
		t.Skip("no kernel in /boot (install linux-image-amd64)")
	}
	dir := t.TempDir()
	g := TickGuestFiles{Dir: dir, kernel: filepath.Join(dir, "vmlinuz"), initrd: filepath.Join(dir, "initrd")}
	k, err := os.ReadFile(kernels[len(kernels)-1])
	if err != nil {
		t.Skipf("cannot read the kernel: %v", err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	var cpio bytes.Buffer
	ino := 1
	entry := func(name string, mode int, data []byte) {
		ino++
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		cpio.WriteString(hdr + name + "\x00")
		cpio.Write(make([]byte, (4-(len(hdr)+len(name)+1)%4)%4))
		cpio.Write(data)
		cpio.Write(make([]byte, (4-len(data)%4)%4))
	}
	for _, d := range []string{"bin", "dev"} {
		entry(d, 0o040755, nil)
	}
	entry("bin/busybox", 0o100755, b)
	entry("init", 0o100755, []byte(TickInit))
	entry("TRAILER!!!", 0, nil)
	if err := os.WriteFile(g.kernel, k, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.initrd, cpio.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return g
}

// SetOn makes vm boot the guest.
func (g TickGuestFiles) SetOn(r RPC, vm string) {
	r.Call("VM.set_PV_kernel", vm, g.kernel)
	r.Call("VM.set_PV_ramdisk", vm, g.initrd)
	r.Call("VM.set_PV_args", vm, "console=ttyS0 quiet")
}

// QEMUJournal is where a host's QEMU backend keeps a domain's journal.
func QEMUJournal(dataDir, uuid string) string {
	return filepath.Join(dataDir, "xenops", "qemu", uuid, "domain.json")
}

// ReadSockets are a domain's serial and monitor sockets, from its
// journal.
func ReadSockets(dataDir, uuid string) (serial, qmp string, err error) {
	b, err := os.ReadFile(QEMUJournal(dataDir, uuid))
	if err != nil {
		return "", "", err
	}
	var j struct{ SerialPath, QMPPath string }
	if err := json.Unmarshal(b, &j); err != nil {
		return "", "", err
	}
	return j.SerialPath, j.QMPPath, nil
}

// Tick is one "TICK n" line, from host (by index), when it arrived.
type Tick struct {
	host int
	n    int
	at   time.Time
}

// TickLog gathers the ticks the QEMUs of the hosts print.
type TickLog struct {
	mu    sync.Mutex
	ticks []Tick
	conns []net.Conn
}

// Close ends the reading.
func (l *TickLog) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}

// Follow reads the serial port of host's QEMU for uuid until it ends;
// the channel is closed then. It may run on any goroutine.
func (l *TickLog) Follow(dataDir, uuid string, host int) (<-chan struct{}, error) {
	var conn net.Conn
	var err error
	for range 200 { // the journal and the socket appear as QEMU starts
		var serial string
		if serial, _, err = ReadSockets(dataDir, uuid); err == nil && serial != "" {
			if conn, err = net.Dial("unix", serial); err == nil {
				break
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("serial port of host %d's QEMU: %w", host, err)
	}
	l.mu.Lock()
	l.conns = append(l.conns, conn)
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			line := sc.Text()
			i := strings.Index(line, "TICK ")
			if i < 0 {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(line[i+5:]))
			if err != nil {
				continue
			}
			l.mu.Lock()
			l.ticks = append(l.ticks, Tick{host, n, time.Now()})
			l.mu.Unlock()
		}
	}()
	return done, nil
}

// Count is how many ticks host printed.
func (l *TickLog) Count(host int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, k := range l.ticks {
		if k.host == host {
			n++
		}
	}
	return n
}

// Wait waits until host printed n ticks.
func (l *TickLog) Wait(t *testing.T, host, n int, bound time.Duration) {
	t.Helper()
	WaitUntil(t, bound, fmt.Sprintf("%d ticks from host %d", n, host), func() bool { return l.Count(host) >= n })
}

// Check asserts that the ticks, in the order they arrived, count up
// without a number printed twice: one guest, run by one QEMU at a time,
// its count carried from the source to the destination.
func (l *TickLog) Check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	last := map[int]int{}
	prev := Tick{}
	for i, k := range l.ticks {
		if i > 0 && k.n <= prev.n {
			t.Fatalf("tick %d from host %d after tick %d from host %d: two guests ran, or the guest restarted", k.n, k.host, prev.n, prev.host)
		}
		last[k.host] = k.n
		prev = k
	}
	t.Logf("ticks: host 0 up to %d, host 1 up to %d", last[0], last[1])
}

// KillQEMUs ends what QEMU processes of the VM are left (they outlive
// their daemons by design).
func KillQEMUs(uuid string) {
	for _, pid := range QEMUOf(uuid) {
		if n, err := strconv.Atoi(pid); err == nil {
			_ = syscall.Kill(n, syscall.SIGKILL)
		}
	}
}
