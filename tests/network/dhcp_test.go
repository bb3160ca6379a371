package network_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/testdaemon"
)

// udhcpcIn are the pids of udhcpc processes in the network namespace at
// path.
func udhcpcIn(t *testing.T, path string) []string {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "udhcpc") {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestPIFDHCP: a DHCP server (busybox udhcpd) on the far side of eth1,
// PIF.reconfigure_ip DHCP puts a pool address on the PIF's bridge and
// the lease into the PIF record; traffic crosses; mode None takes the
// address away and stops the client; a restart of the daemon gets the
// lease again.
func TestPIFDHCP(t *testing.T) {
	if _, err := exec.Command("/usr/bin/busybox", "udhcpd", "--help").CombinedOutput(); err != nil && !strings.Contains(fmt.Sprint(err), "exit status") {
		t.Skipf("busybox udhcpd is not available: %v", err)
	}
	host, sw := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, host, "eth1", sw, "sw1")
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.77.0.1/24", "dev", "sw1")
	dir := t.TempDir()
	conf := filepath.Join(dir, "udhcpd.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`start 10.77.0.100
end 10.77.0.110
interface sw1
lease_file %s/leases
pidfile %s/pid
option subnet 255.255.255.0
option router 10.77.0.1
option dns 10.77.0.53 10.77.0.54
option lease 60
`, dir, dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command("ip", "netns", "exec", sw.Name(), "/usr/bin/busybox", "udhcpd", "-f", conf)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })

	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "linux", "--network-namespace", host.Path()}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	h := r.refs("host.get_all")[0]
	r.call("PIF.scan", h)
	pif, _ := r.pifOf(h, "eth1")
	br := r.str("network.get_bridge", r.str("PIF.get_network", pif))
	r.call("PIF.add_to_other_config", pif, "defaultroute", "true")
	r.call("PIF.add_to_other_config", pif, "peerdns", "true")
	r.call("PIF.plug", pif)

	leased := func(what string) string {
		var ip string
		waitFor(t, what, 30*time.Second, func() (bool, string) {
			as := addrs4(t, host, br)
			if len(as) != 1 || !strings.HasPrefix(as[0], "10.77.0.1") || len(as[0]) != len("10.77.0.100/24") {
				return false, fmt.Sprintf("addresses of %s: %v", br, as)
			}
			ip = strings.TrimSuffix(as[0], "/24")
			return true, ""
		})
		return ip
	}
	r.call("PIF.reconfigure_ip", pif, "DHCP", "", "", "", "")
	ip := leased("address from the pool on " + br)
	rec := r.records("PIF")[pif]
	if rec["IP"] != ip || rec["netmask"] != "255.255.255.0" || rec["gateway"] != "10.77.0.1" ||
		rec["DNS"] != "10.77.0.53,10.77.0.54" || rec["ip_configuration_mode"] != "DHCP" {
		t.Errorf("PIF record after DHCP: IP %v netmask %v gateway %v DNS %v mode %v; kernel has %s",
			rec["IP"], rec["netmask"], rec["gateway"], rec["DNS"], rec["ip_configuration_mode"], ip)
	}
	if out := netnstest.Exec(t, host, "ip", "-4", "route", "show", "default"); !strings.Contains(out, "via 10.77.0.1 dev "+br) {
		t.Errorf("default route: %q, want via 10.77.0.1 dev %s", out, br)
	}
	netnstest.Ping(t, sw, ip)
	if n := len(udhcpcIn(t, host.Path())); n != 1 {
		t.Errorf("%d udhcpc processes in the host's namespace, want 1", n)
	}

	// None: the address and the client go.
	r.call("PIF.reconfigure_ip", pif, "None", "", "", "", "")
	waitFor(t, "no address and no client after mode None", 30*time.Second, func() (bool, string) {
		as, ps := addrs4(t, host, br), udhcpcIn(t, host.Path())
		return len(as) == 0 && len(ps) == 0, fmt.Sprintf("addresses %v, udhcpc pids %v", as, ps)
	})

	// DHCP again, then a restart of the daemon: the client comes back
	// and holds the lease.
	r.call("PIF.reconfigure_ip", pif, "DHCP", "", "", "", "")
	ip = leased("address after DHCP again")
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no client after the daemon stopped", 30*time.Second, func() (bool, string) {
		ps := udhcpcIn(t, host.Path())
		return len(ps) == 0, fmt.Sprintf("udhcpc pids %v", ps)
	})
	netnstest.Exec(t, host, "ip", "addr", "flush", "dev", br)
	d = d.Restart()
	r = &rpc{t: t, c: d.Client(), s: d.Login(t)}
	ip2 := leased("address re-acquired after a restart")
	if n := len(udhcpcIn(t, host.Path())); n != 1 {
		t.Errorf("%d udhcpc processes after the restart, want 1", n)
	}
	netnstest.Ping(t, sw, ip2)
	t.Logf("leased %s, then %s after the restart", ip, ip2)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no client after the daemon stopped", 30*time.Second, func() (bool, string) {
		ps := udhcpcIn(t, host.Path())
		return len(ps) == 0, fmt.Sprintf("udhcpc pids %v", ps)
	})
}
