package network_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/testdaemon"
)

// procsIn are the pids of processes whose command line has name and that
// run in the network namespace at path.
func procsIn(t *testing.T, path, name string) []string {
	t.Helper()
	var want syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	ents, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), name) {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/proc", e.Name(), "ns", "net"), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// addrs6 are the global IPv6 addresses (CIDR) of dev in ns.
func addrs6(t *testing.T, ns *netnstest.Namespace, dev string) []string {
	t.Helper()
	var out []struct {
		AddrInfo []struct {
			Local  string `json:"local"`
			Prefix int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	raw := netnstest.Exec(t, ns, "ip", "-j", "-6", "addr", "show", "dev", dev, "scope", "global")
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("ip -j -6 addr show dev %s: %v: %.300s", dev, err, raw)
	}
	var as []string
	for _, o := range out {
		for _, a := range o.AddrInfo {
			if a.Local != "" { // ip -j lists lifetimes apart
				as = append(as, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
			}
		}
	}
	return as
}

// inRange6 says cidr is one address of fd78::100..fd78::1ff with prefix
// 128 (dhclient's default).
func inRange6(cidr string) bool {
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil || n.Mask.String() != net.CIDRMask(128, 128).String() {
		return false
	}
	lo, hi := net.ParseIP("fd78::100"), net.ParseIP("fd78::1ff")
	return slices.Compare(ip.To16(), lo) >= 0 && slices.Compare(ip.To16(), hi) <= 0
}

// dnsmasq serves DHCPv4 and DHCPv6 on sw1 in sw with its own files in
// dir until the returned function (also a cleanup) stops it. dns6 is
// the IPv6 DNS server it hands out.
func dnsmasq(t *testing.T, sw *netnstest.Namespace, dir, dns6 string) func() {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", sw.Name(), "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--user=root", "--interface=sw1", "--bind-interfaces", "--log-dhcp",
		"--dhcp-range=10.78.0.100,10.78.0.150,255.255.255.0,1h", "--dhcp-range=fd78::100,fd78::1ff,64,1h",
		"--dhcp-option=option6:dns-server,["+dns6+"]",
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--pid-file="+filepath.Join(dir, "pid"))
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	stop := func() {
		if done {
			return
		}
		done = true
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
	}
	t.Cleanup(stop)
	return stop
}

// TestPIFDHCPv6: dnsmasq serves DHCPv6 on the far side of eth1;
// PIF.reconfigure_ipv6 DHCP runs dhclient -6, whose lease lands on the
// PIF's bridge and in PIF.IPv6 (and PIF.DNS, eth1 being the DNS PIF); a
// restart of the daemon keeps the lease; mode None releases it, takes the
// address away and stops the client; a lease with a hostile DNS server
// is refused whole. The time from the call to the address on the bridge
// is measured against the same for IPv4 DHCP (udhcpc, same server).
func TestPIFDHCPv6(t *testing.T) {
	for _, p := range []string{"dhclient", "dnsmasq"} {
		if _, err := exec.LookPath(p); err != nil {
			if _, err := os.Stat("/usr/sbin/" + p); err != nil {
				t.Skipf("%s is not installed (Debian packages isc-dhcp-client, dnsmasq-base)", p)
			}
		}
	}
	host, sw := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, host, "eth1", sw, "sw1")
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.78.0.1/24", "dev", "sw1")
	netnstest.Exec(t, sw, "ip", "-6", "addr", "add", "fd78::1/64", "dev", "sw1", "nodad")
	srvDir := t.TempDir()
	stopServer := dnsmasq(t, sw, srvDir, "fd78::53")

	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "linux", "--network-namespace", host.Path()}})
	t.Cleanup(func() {
		if d.Alive() {
			_ = d.Stop()
		}
	})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	h := r.refs("host.get_all")[0]
	r.call("PIF.scan", h)
	pif, _ := r.pifOf(h, "eth1")
	br := r.str("network.get_bridge", r.str("PIF.get_network", pif))
	r.call("PIF.add_to_other_config", pif, "peerdns", "true")
	r.call("PIF.plug", pif)
	noClients := func(what string) {
		t.Helper()
		waitFor(t, what, 30*time.Second, func() (bool, string) {
			ps := procsIn(t, host.Path(), "dhclient")
			return len(ps) == 0, fmt.Sprintf("dhclient pids %v", ps)
		})
	}
	leased6 := func(what string) string {
		t.Helper()
		var a string
		waitFor(t, what, 30*time.Second, func() (bool, string) {
			as := addrs6(t, host, br)
			if len(as) != 1 || !inRange6(as[0]) {
				return false, fmt.Sprintf("global IPv6 addresses of %s: %v", br, as)
			}
			a = as[0]
			return true, ""
		})
		return a
	}

	// The figure: call to address, IPv4 (udhcpc) then IPv6 (dhclient),
	// three rounds each, None in between.
	var t4, t6 []time.Duration
	for range 3 {
		began := time.Now()
		r.call("PIF.reconfigure_ip", pif, "DHCP", "", "", "", "")
		waitFor(t, "IPv4 lease on "+br, 30*time.Second, func() (bool, string) {
			as := addrs4(t, host, br)
			return len(as) == 1 && strings.HasPrefix(as[0], "10.78.0.1"), fmt.Sprintf("addresses %v", as)
		})
		t4 = append(t4, time.Since(began))
		r.call("PIF.reconfigure_ip", pif, "None", "", "", "", "")
		// None stops the client before it returns, so DHCP at once
		// after starts a new one that applies its lease again.
		if as, ps := addrs4(t, host, br), procsIn(t, host.Path(), "udhcpc"); len(as) != 0 || len(ps) != 0 {
			t.Fatalf("after None: addresses %v, udhcpc pids %v", as, ps)
		}
	}
	// IPv6 first, so that eth1 (peerdns) is xapi's DNS PIF in DHCPv6.
	r.call("PIF.set_primary_address_type", pif, "IPv6")
	var addr string
	for i := range 3 {
		began := time.Now()
		r.call("PIF.reconfigure_ipv6", pif, "DHCP", "", "", "")
		addr = leased6("DHCPv6 lease on " + br)
		t6 = append(t6, time.Since(began))
		rec := r.records("PIF")[pif]
		if got := fmt.Sprint(rec["IPv6"]); got != "["+addr+"]" || rec["ipv6_configuration_mode"] != "DHCP" || rec["DNS"] != "fd78::53" {
			t.Fatalf("PIF record after DHCPv6: IPv6 %v mode %v DNS %v; kernel has %s", got, rec["ipv6_configuration_mode"], rec["DNS"], addr)
		}
		if n := len(procsIn(t, host.Path(), "dhclient")); n != 1 {
			t.Errorf("%d dhclient processes in the host's namespace, want 1", n)
		}
		if i == 2 {
			break // the last lease is kept for the restart below
		}
		r.call("PIF.reconfigure_ipv6", pif, "None", "", "", "")
		waitFor(t, "no IPv6 address after None", 30*time.Second, func() (bool, string) {
			as := addrs6(t, host, br)
			return len(as) == 0, fmt.Sprint(as)
		})
		noClients("no dhclient after None")
	}
	median := func(ds []time.Duration) time.Duration { s := slices.Clone(ds); slices.Sort(s); return s[len(s)/2] }
	t.Logf("FIGURE call to address: IPv4 DHCP (udhcpc) %v median %v; DHCPv6 (dhclient -6) %v median %v; ratio %.1f",
		t4, median(t4), t6, median(t6), float64(median(t6))/float64(median(t4)))
	// The lease file lives in the daemon's data directory.
	if _, err := os.Stat(filepath.Join(d.DataDir, "dhcp6", "dhclient6-"+br+".leases")); err != nil {
		t.Errorf("lease file: %v", err)
	}

	// A restart of the daemon: the client stops without releasing, the
	// address stays, the client comes back and confirms the same lease.
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	noClients("no dhclient after the daemon stopped")
	if as := addrs6(t, host, br); len(as) != 1 || as[0] != addr {
		t.Fatalf("addresses after the daemon stopped: %v, want %s", as, addr)
	}
	d = d.Restart()
	r = &rpc{t: t, c: d.Client(), s: d.Login(t)}
	waitFor(t, "dhclient after the restart", 30*time.Second, func() (bool, string) {
		ps := procsIn(t, host.Path(), "dhclient")
		return len(ps) == 1, fmt.Sprintf("dhclient pids %v", ps)
	})
	if a := leased6("the lease after the restart"); a != addr {
		t.Errorf("address after the restart %s, want %s", a, addr)
	}

	// None: the lease is released (dnsmasq forgets it), the address and
	// the client go.
	r.call("PIF.reconfigure_ipv6", pif, "None", "", "", "")
	waitFor(t, "no address and no client after None", 30*time.Second, func() (bool, string) {
		as, ps := addrs6(t, host, br), procsIn(t, host.Path(), "dhclient")
		return len(as) == 0 && len(ps) == 0, fmt.Sprintf("addresses %v, dhclient pids %v", as, ps)
	})
	waitFor(t, "the release at the server", 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(srvDir, "leases"))
		return !strings.Contains(string(b), strings.TrimSuffix(addr, "/128")), string(b)
	})
	if rec := r.records("PIF")[pif]; fmt.Sprint(rec["IPv6"]) != "[]" {
		t.Errorf("PIF.IPv6 after None: %v", rec["IPv6"])
	}

	// A server handing out a multicast DNS server: the lease is refused
	// whole, nothing reaches the bridge or the record.
	stopServer()
	hostile := t.TempDir()
	dnsmasq(t, sw, hostile, "ff02::1")
	if _, err := r.try("Async.PIF.reconfigure_ipv6", pif, "DHCP", "", "", ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the hostile lease offered", 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(hostile, "log"))
		return strings.Contains(string(b), "DHCPREPLY"), "no DHCPREPLY in dnsmasq's log yet"
	})
	waitFor(t, "the hostile lease refused", 30*time.Second, func() (bool, string) {
		return strings.Contains(d.Log(), "DHCPv6 lease refused"), "not in the daemon's log yet"
	})
	if as := addrs6(t, host, br); len(as) != 0 {
		t.Errorf("a hostile lease reached %s: %v", br, as)
	}
	if rec := r.records("PIF")[pif]; fmt.Sprint(rec["IPv6"]) != "[]" || strings.Contains(fmt.Sprint(rec["DNS"]), "ff02") {
		t.Errorf("a hostile lease reached the record: IPv6 %v DNS %v", rec["IPv6"], rec["DNS"])
	}
	r.call("PIF.reconfigure_ipv6", pif, "None", "", "", "")
	noClients("no dhclient after None")
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	noClients("no dhclient after the daemon stopped")
}
