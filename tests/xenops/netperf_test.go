package xenops_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// Guests talking to each other over a network toolstackd made real
// (--network-backend linux): the network's bridge, the VIFs' taps on it
// with the network's MTU, locking rules and rate limits, all by the
// network module through netlink. The daemon's network module acts in
// the machine's own namespace here (QEMU opens taps there); the network
// is private (no PIF), so the only links it makes are its bridge and the
// two taps, and they go with the VMs.
//
// TestGuestsOnToolstackdNetwork is short and runs in CI: one guest sends
// a MiB to the other with busybox nc. TestGuestThroughput
// (TOOLSTACKD_NET_PERF=1) measures the throughput between the two guests
// against two plain QEMUs, started by hand with the same kernel, memory
// and NIC model, on plain taps on a bridge made by hand.

// netGuests is two toolstackd guests on one private network.
type netGuests struct {
	e      *env
	d      *testdaemon.Daemon
	bridge string
	vms    [2]string
	vifs   [2]string
	cons   [2]*consoleConn
}

// startNetGuests starts a daemon with the Linux network backend and two
// guests on a private network, booted, with 10.77.0.1 and .2 on eth0.
func startNetGuests(t *testing.T, g *guest, qos map[string]string) *netGuests {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bridges and taps need root")
	}
	dir := shortTempDir(t)
	d := startDaemonArgs(t, dir, testdaemon.FreeAddr(t, ""), "qemu", []string{"--network-backend", "linux"},
		"TOOLSTACKD_QEMU_ACCEL="+g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS="+g.dir)
	t.Cleanup(func() { d.Kill() })
	e := remote(t, d)
	n := &netGuests{e: e, d: d, bridge: fmt.Sprintf("tsnp%d", os.Getpid()%100000)}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "dev", n.bridge).Run() }) // only if the test failed half-way
	network := e.str(e.call("network.create", map[string]any{"name_label": "netperf", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}, "bridge": n.bridge, "tags": []string{}}))
	qt, qp := "", map[string]string{}
	if qos != nil {
		qt, qp = "ratelimit", qos
	}
	for i := range n.vms {
		vm := e.guestVM(g, fmt.Sprintf("netperf-%d", i), nil)
		n.vms[i] = vm
		uuid := e.uuidOf(vm)
		t.Cleanup(func() {
			for _, pid := range qemuProcesses(uuid) {
				t.Errorf("QEMU %d left running; killing it", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		n.vifs[i] = e.str(e.call("VIF.create", map[string]any{"device": "0", "network": network, "VM": vm, "MAC": fmt.Sprintf("02:00:00:77:00:%02x", i+1),
			"MTU": 1500, "other_config": map[string]string{}, "qos_algorithm_type": qt, "qos_algorithm_params": qp,
			"locking_mode": "network_default", "ipv4_allowed": []string{}, "ipv6_allowed": []string{}}))
	}
	t0 := time.Now()
	for _, vm := range n.vms {
		e.call("VM.start", vm, false, false)
	}
	for i, vm := range n.vms {
		n.cons[i] = e.console(vm, "vt100")
		t.Cleanup(func() { n.cons[i].Close() })
		n.checkTap(t, i)
	}
	for i, c := range n.cons {
		c.waitFor(t, "GUEST-READY", 3*time.Minute)
		guestIP(t, c, i+1)
	}
	t.Logf("guests up with addresses in %v", time.Since(t0).Round(time.Millisecond))
	return n
}

// tap is the name of guest i's tap.
func (n *netGuests) tap(i int) string {
	return fmt.Sprintf("tsvif%d.0", int64(n.e.field("VM", n.vms[i], "domid").(float64)))
}

// checkTap checks that guest i's tap is on the network's bridge.
func (n *netGuests) checkTap(t *testing.T, i int) {
	t.Helper()
	if m := m14Master(n.tap(i)); m != n.bridge {
		t.Fatalf("tap %s of guest %d is on %q, want the network's bridge %s", n.tap(i), i, m, n.bridge)
	}
}

// stop shuts the guests down and checks that their taps and the bridge
// went with them.
func (n *netGuests) stop(t *testing.T) {
	t.Helper()
	for _, vm := range n.vms {
		n.e.call("VM.hard_shutdown", vm)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := os.Stat("/sys/class/net/" + n.bridge)
		if os.IsNotExist(err) && len(tapsOn()) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the guests stopped: bridge %s (%v), taps %v", n.bridge, err, tapsOn())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// guestIP gives a guest 10.77.0.<host>/24 on eth0.
func guestIP(t *testing.T, c *consoleConn, host int) {
	t.Helper()
	fmt.Fprintf(c, "ip link set eth0 up && ip addr add 10.77.0.%d/24 dev eth0 && echo IP-$((40+2))-OK\n", host)
	c.waitFor(t, "IP-42-OK", time.Minute)
}

var (
	rxBytes = regexp.MustCompile(`RXBYTES=(\d+)`)
	txTime  = regexp.MustCompile(`real\s+(\d+)m\s*([\d.]+)s`)
)

// transfer sends size bytes from the guest on src to the one on dst
// (10.77.0.<dstHost>) with busybox nc over TCP and returns the seconds
// the sender took (busybox time) once the receiver counted every byte.
func transfer(t *testing.T, src, dst *consoleConn, dstHost int, size int64) float64 {
	t.Helper()
	const bs = 65536
	count := size / bs
	fmt.Fprintf(dst, "nc -l -p 5000 | wc -c | sed 's/^ */RX''BYTES=/'\n")
	// The listener may not be up yet: the sender retries its connect.
	fmt.Fprintf(src, "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do time sh -c 'dd if=/dev/zero bs=%d count=%d 2>/dev/null | nc 10.77.0.%d 5000' && break; sleep 0.5; done; echo TX-$((40+2))-DONE\n",
		bs, count, dstHost)
	var secs float64
	src.waitForLine(t, func(l string) bool {
		if m := txTime.FindStringSubmatch(l); m != nil {
			mins, _ := strconv.ParseFloat(m[1], 64)
			s, _ := strconv.ParseFloat(m[2], 64)
			secs = mins*60 + s
		}
		return strings.Contains(l, "TX-42-DONE")
	}, 10*time.Minute)
	line := dst.waitForLine(t, func(l string) bool { return rxBytes.MatchString(l) }, 2*time.Minute)
	got, _ := strconv.ParseInt(rxBytes.FindStringSubmatch(line)[1], 10, 64)
	if got != count*bs {
		t.Fatalf("the receiver counted %d bytes, %d were sent", got, count*bs)
	}
	if secs <= 0 {
		t.Fatal("the sender's time was not seen")
	}
	return secs
}

// TestGuestsOnToolstackdNetwork: two guests on a private network that
// toolstackd made real exchange data through their taps on its bridge,
// both ways; the bridge and taps go when the guests stop.
func TestGuestsOnToolstackdNetwork(t *testing.T) {
	g := testGuest(t)
	if len(tapsOn()) != 0 {
		t.Skipf("taps of another toolstackd exist: %v", tapsOn())
	}
	n := startNetGuests(t, g, nil)
	s1 := transfer(t, n.cons[0], n.cons[1], 2, 1<<20)
	s2 := transfer(t, n.cons[1], n.cons[0], 1, 1<<20)
	t.Logf("1 MiB from guest 1 to 2 in %.2f s, back in %.2f s", s1, s2)

	// Hot-unplug the second guest's NIC: its tap goes; plug it again:
	// a new tap on the bridge, and the guests talk again.
	tap := n.tap(1)
	n.e.call("VIF.unplug", n.vifs[1])
	if _, err := os.Stat("/sys/class/net/" + tap); !os.IsNotExist(err) {
		t.Fatalf("tap %s still there after VIF.unplug (%v)", tap, err)
	}
	n.e.call("VIF.plug", n.vifs[1])
	n.checkTap(t, 1)
	deadline := time.Now().Add(time.Minute)
	for {
		fmt.Fprintf(n.cons[1], "ls /sys/class/net | grep -q eth && echo NIC-$((40+2))-BACK\n")
		if l := n.cons[1].waitForLine(t, func(l string) bool { return strings.Contains(l, "NIC-42-BACK") || strings.Contains(l, "GUEST-READY") }, 30*time.Second); strings.Contains(l, "NIC-42-BACK") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest did not see its NIC come back")
		}
	}
	guestIP(t, n.cons[1], 2)
	s3 := transfer(t, n.cons[0], n.cons[1], 2, 1<<20)
	t.Logf("after VIF.unplug and VIF.plug: 1 MiB in %.2f s", s3)
	n.stop(t)
}

// plainGuest is a QEMU started by hand, its serial port on a socket.
type plainGuest struct {
	cmd *exec.Cmd
	con *consoleConn
}

// startPlainGuest runs the test guest in a QEMU of its own on tap, with
// the machine toolstackd gives its guests (machine type, CPU model,
// memory, VCPUs and the fixed devices: under TCG an emulated USB tablet
// or VGA costs CPU time the network would otherwise get) and a
// virtio-net-pci NIC on a tap without vhost, as toolstackd's. Only the
// control sockets (QMP, VNC) are left out.
func startPlainGuest(t *testing.T, g *guest, tap, mac string) *plainGuest {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "serial")
	cpu := "max"
	if g.accel == "kvm" {
		cpu = "host"
	}
	return runPlain(t, sock, "-machine", "pc,accel="+g.accel, "-cpu", cpu, "-m", "128", "-smp", "1",
		"-nodefaults", "-no-user-config", "-no-shutdown", "-no-reboot", "-display", "none",
		"-device", "virtio-balloon-pci,id=balloon0,addr=0x3", "-device", "pvpanic", "-rtc", "base=utc",
		"-device", "VGA,id=video0,addr=0x2", "-usb", "-device", "usb-tablet,id=tablet0",
		"-chardev", "socket,id=serial0,path="+sock+",server=on,wait=off", "-serial", "chardev:serial0",
		"-kernel", g.kernel, "-initrd", g.initrd, "-append", g.args,
		"-netdev", "tap,id=net0,ifname="+tap+",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=net0,addr=0x4,mac="+mac)
}

// runPlain runs QEMU with args, its serial port on the socket sock.
func runPlain(t *testing.T, sock string, args ...string) *plainGuest {
	t.Helper()
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stderr = os.Stderr
	// In a session of its own, as toolstackd runs each QEMU: with the
	// kernel's autogroup scheduling a session is a scheduling group, and
	// two guests in one group (the test's) hand packets to each other
	// faster on a busy machine than two in groups of their own
	// (TOOLSTACKD_NET_PERF_SHARED_SESSION=1 keeps them in the test's).
	if os.Getenv("TOOLSTACKD_NET_PERF_SHARED_SESSION") == "" {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &plainGuest{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	var conn net.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serial socket of a plain QEMU: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.con = &consoleConn{conn, bufio.NewReader(conn)}
	t.Cleanup(func() { conn.Close() })
	return p
}

// sameArgv is the command line of toolstackd's guest i (from its
// process) for a plain QEMU on tap with mac: its sockets, pid file and
// uuid moved to dir and a uuid of its own, -S dropped. With
// TOOLSTACKD_NET_PERF_SAME_ARGV=1 the plain guests run so, which
// separates what the command line costs from what the daemon does.
func sameArgv(t *testing.T, ts *netGuests, i int, tap, mac, dir string) []string {
	t.Helper()
	uuid := ts.e.uuidOf(ts.vms[i])
	pids := qemuProcesses(uuid)
	if len(pids) != 1 {
		t.Fatalf("QEMU of guest %d: %v", i, pids)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")[1:]
	stateDir := ""
	for k, a := range argv {
		if a == "-qmp" && k+1 < len(argv) {
			stateDir = filepath.Dir(strings.TrimPrefix(strings.SplitN(argv[k+1], ",", 2)[0], "unix:"))
		}
	}
	if stateDir == "" {
		t.Fatalf("no -qmp in %q", argv)
	}
	newUUID := fmt.Sprintf("00000000-0000-4000-8000-0000000000%02d", i+1)
	var out []string
	for _, a := range argv {
		if a == "-S" {
			continue
		}
		a = strings.ReplaceAll(a, stateDir, dir)
		a = strings.ReplaceAll(a, uuid, newUUID)
		a = strings.ReplaceAll(a, `"`+ts.tap(i)+`"`, `"`+tap+`"`)
		a = strings.ReplaceAll(a, fmt.Sprintf("02:00:00:77:00:%02x", i+1), mac)
		out = append(out, a)
	}
	return out
}

// handBridge makes a bridge and two plain taps on it with ip(8), as an
// operator would, and removes them when the test ends.
func handBridge(t *testing.T) (string, [2]string) {
	t.Helper()
	id := os.Getpid() % 100000
	br := fmt.Sprintf("tsnph%d", id)
	taps := [2]string{fmt.Sprintf("tsnpt%d.1", id), fmt.Sprintf("tsnpt%d.2", id)}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	run("link", "add", "name", br, "type", "bridge")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "dev", br).Run() })
	run("link", "set", "dev", br, "up")
	for _, tap := range taps {
		run("tuntap", "add", "dev", tap, "mode", "tap")
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "dev", tap).Run() })
		run("link", "set", "dev", tap, "master", br)
		run("link", "set", "dev", tap, "up")
	}
	return br, taps
}

// TestGuestThroughput measures TCP throughput between two guests on a
// network toolstackd made against two plain QEMUs on a bridge and taps
// made by hand, alternating the two setups, in the same session. Set
// TOOLSTACKD_NET_PERF=1 to run it (a few minutes under TCG);
// TOOLSTACKD_NET_PERF_MIB sets the size of one transfer (default 64),
// TOOLSTACKD_NET_PERF_ROUNDS the rounds (default 5);
// TOOLSTACKD_NET_PERF_SAME_ARGV=1 runs the plain QEMUs with toolstackd's
// guests' own command lines, TOOLSTACKD_NET_PERF_SHARED_SESSION=1 keeps
// them in the test's session (see runPlain).
func TestGuestThroughput(t *testing.T) {
	if os.Getenv("TOOLSTACKD_NET_PERF") == "" {
		t.Skip("set TOOLSTACKD_NET_PERF=1")
	}
	g := testGuest(t)
	if len(tapsOn()) != 0 {
		t.Skipf("taps of another toolstackd exist: %v", tapsOn())
	}
	mib, rounds := int64(64), 5
	if v, err := strconv.ParseInt(os.Getenv("TOOLSTACKD_NET_PERF_MIB"), 10, 64); err == nil && v > 0 {
		mib = v
	}
	if v, err := strconv.Atoi(os.Getenv("TOOLSTACKD_NET_PERF_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	size := mib << 20

	_, taps := handBridge(t)
	ts := startNetGuests(t, g, nil)
	same := os.Getenv("TOOLSTACKD_NET_PERF_SAME_ARGV") != ""
	var plain [2]*plainGuest
	for i := range plain {
		mac := fmt.Sprintf("02:00:00:78:00:%02x", i+1)
		if same {
			dir := shortTempDir(t)
			plain[i] = runPlain(t, filepath.Join(dir, "serial.sock"), sameArgv(t, ts, i, taps[i], mac, dir)...)
		} else {
			plain[i] = startPlainGuest(t, g, taps[i], mac)
		}
	}
	for i, p := range plain {
		p.con.waitFor(t, "GUEST-READY", 3*time.Minute)
		guestIP(t, p.con, i+1)
	}

	// A first small transfer each warms both up (ARP, TCP, page cache).
	transfer(t, plain[0].con, plain[1].con, 2, 4<<20)
	transfer(t, ts.cons[0], ts.cons[1], 2, 4<<20)
	var base, ours []float64
	for r := range rounds {
		// Alternate which goes first, so that a change of the machine's
		// load weighs on both alike.
		var b, o float64
		if r%2 == 0 {
			b = float64(size) / transfer(t, plain[0].con, plain[1].con, 2, size)
			o = float64(size) / transfer(t, ts.cons[0], ts.cons[1], 2, size)
		} else {
			o = float64(size) / transfer(t, ts.cons[0], ts.cons[1], 2, size)
			b = float64(size) / transfer(t, plain[0].con, plain[1].con, 2, size)
		}
		base, ours = append(base, b), append(ours, o)
		t.Logf("round %d: plain %.1f MB/s, toolstackd %.1f MB/s", r+1, b/1e6, o/1e6)
	}
	mb, mo := medianF(base), medianF(ours)
	var sb, so float64
	for r := range base {
		sb, so = sb+base[r], so+ours[r]
	}
	t.Logf("figure: guest-to-guest TCP (%d MiB per transfer, %d rounds, %s): plain QEMU on a hand-made bridge %.2f MB/s, toolstackd %.2f MB/s (medians), ratio %.3f; means %.2f and %.2f MB/s, ratio %.3f",
		mib, rounds, g.accel, mb/1e6, mo/1e6, mo/mb, sb/float64(rounds)/1e6, so/float64(rounds)/1e6, so/sb)
	ts.stop(t)
}

func medianF(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
