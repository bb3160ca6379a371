package xenops_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/network/ovs"
	"toolstackd/internal/testkit/ovstest"
)

// TestGuestsOnOpenvSwitch: two real QEMU guests (TCG) on a private
// network that toolstackd made an Open vSwitch bridge (userspace
// datapath: this kernel has no openvswitch module) exchange data both
// ways through their taps, which are ports of the bridge. The first
// guest's VIF is locked to 10.77.0.1 (OpenFlow rules, no OVN): from that
// address it talks, from another it is cut off. The bridge, the ports
// and the rules go when the guests stop.
//
// QEMU opens its taps by name in the daemon's network namespace, so
// ovs-vswitchd and the daemon's network module act in the machine's own
// namespace here, as in TestGuestsOnToolstackdNetwork.
//
// The test's Open vSwitch runs with other_config:userspace-tso-enable
// (ovs.KeyUserspaceTSO). Without it (TOOLSTACKD_OVS_TSO=0) the guests
// still exchange ARP and ICMP, but their TCP does not get through: a
// virtio guest leaves its TCP checksums (and segmentation) to the host
// through the tap's virtio header, ovs-vswitchd reads the tap with a
// plain packet socket and forwards the segments unfinished, and the
// other guest drops them (its InCsumErrors count them); the test then
// skips, saying so.
func TestGuestsOnOpenvSwitch(t *testing.T) {
	g := testGuest(t)
	if why := ovstest.Available(); why != "" {
		t.Skip("Open vSwitch tests not run: " + why)
	}
	if len(tapsOn()) != 0 {
		t.Skipf("taps of another toolstackd exist: %v", tapsOn())
	}
	// Open vSwitch's userspace datapath leaves its taps (ovs-netdev and
	// the bridge's) in the machine's namespace when it stops: removed
	// after it (cleanups run last first).
	t.Cleanup(func() {
		for _, l := range append([]string{"ovs-netdev", fmt.Sprintf("tsovs%d", os.Getpid()%100000)}, tapsOn()...) {
			if _, err := os.Stat("/sys/class/net/" + l); err == nil {
				_ = exec.Command("ip", "link", "del", l).Run() // #nosec G204 -- fixed names
			}
		}
	})
	var otherConfig []string
	if os.Getenv("TOOLSTACKD_OVS_TSO") != "0" {
		otherConfig = append(otherConfig, "userspace-tso-enable=true")
	}
	o := ovstest.Start(t, "", otherConfig...)
	dir := shortTempDir(t)
	d := startDaemonArgs(t, dir, "", "qemu", []string{"--network-backend", "openvswitch", "--ovs-db", o.DB},
		"TOOLSTACKD_QEMU_ACCEL="+g.accel, "TOOLSTACKD_GUEST_KERNEL_DIRS="+g.dir)
	t.Cleanup(func() { d.Kill() })
	e := remote(t, d)
	bridge := fmt.Sprintf("tsovs%d", os.Getpid()%100000)
	network := e.str(e.call("network.create", map[string]any{"name_label": "ovs-guests", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}, "bridge": bridge, "tags": []string{}}))
	var vms, vifs [2]string
	for i := range vms {
		vms[i] = e.guestVM(g, fmt.Sprintf("ovs-guest-%d", i), nil)
		uuid := e.uuidOf(vms[i])
		t.Cleanup(func() {
			for _, pid := range qemuProcesses(uuid) {
				t.Errorf("QEMU %d left running; killing it", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		mode, allowed := "unlocked", []string{}
		if i == 0 {
			mode, allowed = "locked", []string{"10.77.0.1"}
		}
		vifs[i] = e.str(e.call("VIF.create", map[string]any{"device": "0", "network": network, "VM": vms[i], "MAC": fmt.Sprintf("02:00:00:77:01:%02x", i+1),
			"MTU": 1500, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
			"locking_mode": mode, "ipv4_allowed": allowed, "ipv6_allowed": []string{}}))
	}
	t0 := time.Now()
	var cons [2]*consoleConn
	for i, vm := range vms {
		e.call("VM.start", vm, false, false)
		cons[i] = e.console(vm, "vt100")
		t.Cleanup(func() { cons[i].Close() })
	}
	for i, vm := range vms {
		tap := fmt.Sprintf("tsvif%d.0", int64(e.field("VM", vm, "domid").(float64)))
		if got := o.Vsctl(t, "port-to-br", tap); got != bridge {
			t.Fatalf("tap %s of guest %d is a port of %q, want %s", tap, i, got, bridge)
		}
		if got := o.Vsctl(t, "get", "Bridge", bridge, "datapath_type"); got != "netdev" && got != "system" {
			t.Errorf("datapath_type %q", got)
		}
	}
	vif0 := e.field("VIF", vifs[0], "uuid").(string)
	c, _ := ovs.VIFCookie(vif0)
	cookie := fmt.Sprintf("%#x", c)
	if n := len(o.Flows(t, bridge, cookie, "-1")); n == 0 {
		t.Fatalf("no locking rules for the locked guest's VIF:\n%s", o.Ofctl(t, "dump-flows", bridge))
	}
	for i, con := range cons {
		con.waitFor(t, "GUEST-READY", 3*time.Minute)
		guestIP(t, con, i+1)
	}
	t.Logf("guests up with addresses in %v", time.Since(t0).Round(time.Millisecond))

	// stopAll stops the guests and checks that the bridge, its ports and
	// the taps go with them.
	stopAll := func() {
		for _, vm := range vms {
			e.call("VM.hard_shutdown", vm)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := o.TryVsctl("br-exists", bridge)
			if err != nil && len(tapsOn()) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("left after the guests stopped: bridge %s (exists: %v), taps %v", bridge, err == nil, tapsOn())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// The locked guest reaches the other from its allowed address, and
	// back.
	ping := func(con *consoleConn, addr string) bool {
		fmt.Fprintf(con, "ping -c 3 -W 2 %s >/dev/null 2>&1 && echo PING-$((40+2))-YES || echo PING-$((40+2))-NO\n", addr)
		l := con.waitForLine(t, func(l string) bool { return strings.Contains(l, "PING-42-") }, 2*time.Minute)
		return strings.Contains(l, "PING-42-YES")
	}
	if !ping(cons[0], "10.77.0.2") || !ping(cons[1], "10.77.0.1") {
		t.Fatalf("the guests cannot ping each other over Open vSwitch:\n%s\n%s", o.Ofctl(t, "dump-flows", bridge), o.Ofctl(t, "dump-ports", bridge))
	}

	// TCP, 1 MiB each way (busybox nc).
	if why := tcpBlocked(t, o, cons, bridge); why != "" {
		stopAll()
		t.Skip(why)
	}
	s1 := transfer(t, cons[0], cons[1], 2, 1<<20)
	s2 := transfer(t, cons[1], cons[0], 1, 1<<20)
	t.Logf("Open vSwitch (userspace datapath): 1 MiB from the locked guest to the other in %.2f s, back in %.2f s", s1, s2)

	// The locked guest takes an address it is not allowed: cut off.
	fmt.Fprintf(cons[0], "ip addr flush dev eth0 && ip addr add 10.77.0.9/24 dev eth0 && echo SPOOF-$((40+2))-OK\n")
	cons[0].waitFor(t, "SPOOF-42-OK", time.Minute)
	if ping(cons[0], "10.77.0.2") {
		t.Error("the locked guest pings from an address it is not allowed")
	}

	stopAll()
}

// tryLine reads a console until a line satisfies ok, or the time is up
// (an error, not a failure).
func tryLine(c *consoleConn, ok func(string) bool, timeout time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for {
		line, err := c.r.ReadString('\n')
		if ok(line) {
			return line, nil
		}
		if err != nil {
			return "", err
		}
	}
}

// tcpBlocked sends 256 KiB from guest 0 to guest 1 over TCP with a
// deadline and says why it did not arrive ("" when it did), from guest
// 1's TCP counters (checksum errors: see TestGuestsOnOpenvSwitch).
func tcpBlocked(t *testing.T, o *ovstest.OVS, cons [2]*consoleConn, bridge string) string {
	t.Helper()
	fmt.Fprintf(cons[1], "(nc -l -p 5001 | wc -c | sed 's/^ */TCP''BYTES=/') &\n")
	time.Sleep(time.Second)
	fmt.Fprintf(cons[0], "(dd if=/dev/zero bs=65536 count=4 2>/dev/null | nc 10.77.0.2 5001) &\n")
	line, err := tryLine(cons[1], func(l string) bool { return strings.Contains(l, "TCPBYTES=") }, 60*time.Second)
	if err == nil && strings.Contains(line, "TCPBYTES=262144") {
		return ""
	}
	fmt.Fprintf(cons[1], "grep Tcp: /proc/net/snmp | tail -1 | sed \"s/^/SNMP-$((40+2)) /\"\n")
	snmp, _ := tryLine(cons[1], func(l string) bool { return strings.Contains(l, "SNMP-42 ") }, 30*time.Second)
	ports := o.Ofctl(t, "dump-ports", bridge)
	// Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens
	// AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs
	// InErrs OutRsts InCsumErrors
	f := strings.Fields(snmp)
	if len(f) >= 17 && f[len(f)-1] != "0" {
		return "QEMU guests on an Open vSwitch userspace-datapath bridge exchange ARP and ICMP, but TCP does not get through: " +
			"the receiving guest counts TCP checksum errors (InCsumErrors " + f[len(f)-1] + ", " + strings.TrimSpace(snmp) +
			"): the sending guest leaves its checksums to the host (virtio offload over the tap's virtio header), and ovs-vswitchd, " +
			"reading the tap with a plain packet socket, forwards the segments unfinished unless its userspace TSO " +
			"(other_config:userspace-tso-enable, read at its start) is on; ports:\n" + ports
	}
	log, _ := os.ReadFile(o.Dir + "/vswitchd.log")
	t.Fatalf("TCP between the guests did not arrive (%q, %v), and not for the known reason (snmp %q); ports:\n%s\nvswitchd log:\n%s",
		line, err, snmp, ports, tailOf(string(log), 3000))
	return ""
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
