package network

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

func TestParseLease6(t *testing.T) {
	good := []string{"BOUND6", "2001:db8::103", "128", "2001:db8::53 2001:db8::54", "3600", "1800", "", ""}
	l, err := ParseLease6(good)
	if err != nil || !l.HasAddress() || l.CIDR() != "2001:db8::103/128" || len(l.DNS) != 2 || l.ValidLife != 3600 || l.PreferredLife != 1800 {
		t.Fatalf("good lease: %+v, %v", l, err)
	}
	if n := l.Net(); n.String() != "2001:db8::103/128" {
		t.Fatalf("net %v", n)
	}
	if l, err := ParseLease6([]string{"RENEW6", "fd77::100", "64", "", "", "", "fd77::99", "64"}); err != nil || l.CIDR() != "fd77::100/64" {
		t.Fatalf("renew with a ULA: %+v %v", l, err)
	}
	for _, ev := range []string{"PREINIT6", "DEPREF6"} {
		if l, err := ParseLease6([]string{ev, "", "", "", "", "", "", ""}); err != nil || l.HasAddress() || l.Lost() {
			t.Fatalf("%s: %+v %v", ev, l, err)
		}
	}
	if l, err := ParseLease6([]string{"RELEASE6", "", "", "", "", "", "2001:db8::103", "128"}); err != nil || !l.Lost() || !l.Old.Equal(good6(t)) {
		t.Fatalf("release: %+v %v", l, err)
	}
	bad := map[string][]string{
		"short":          {"BOUND6", "2001:db8::103"},
		"event":          {"rm -rf /", "2001:db8::103", "128", "", "", "", "", ""},
		"v4 event":       {"bound", "2001:db8::103", "128", "", "", "", "", ""},
		"ipv4":           {"BOUND6", "10.0.0.5", "128", "", "", "", "", ""},
		"mapped":         {"BOUND6", "::ffff:10.0.0.5", "128", "", "", "", "", ""},
		"link-local":     {"BOUND6", "fe80::1", "64", "", "", "", "", ""},
		"zone":           {"BOUND6", "2001:db8::1%eth0", "64", "", "", "", "", ""},
		"multicast":      {"BOUND6", "ff02::1", "128", "", "", "", "", ""},
		"loopback":       {"BOUND6", "::1", "128", "", "", "", "", ""},
		"unspecified":    {"BOUND6", "::", "128", "", "", "", "", ""},
		"cidr":           {"BOUND6", "2001:db8::103/64", "64", "", "", "", "", ""},
		"no prefix":      {"BOUND6", "2001:db8::103", "", "", "", "", "", ""},
		"prefix 0":       {"BOUND6", "2001:db8::103", "0", "", "", "", "", ""},
		"prefix 8":       {"BOUND6", "2001:db8::103", "8", "", "", "", "", ""},
		"prefix 129":     {"BOUND6", "2001:db8::103", "129", "", "", "", "", ""},
		"prefix sign":    {"BOUND6", "2001:db8::103", "+64", "", "", "", "", ""},
		"anycast":        {"BOUND6", "2001:db8::", "64", "", "", "", "", ""},
		"dns shell":      {"BOUND6", "2001:db8::103", "128", "$(id)", "", "", "", ""},
		"dns v4":         {"BOUND6", "2001:db8::103", "128", "10.0.0.53", "", "", "", ""},
		"dns multicast":  {"BOUND6", "2001:db8::103", "128", "ff02::1", "", "", "", ""},
		"dns link-local": {"BOUND6", "2001:db8::103", "128", "fe80::53", "", "", "", ""},
		"many dns":       {"BOUND6", "2001:db8::103", "128", strings.Repeat("2001:db8::53 ", 100), "", "", "", ""},
		"life":           {"BOUND6", "2001:db8::103", "128", "", "99999999999999", "", "", ""},
		"negative life":  {"BOUND6", "2001:db8::103", "128", "", "-1", "", "", ""},
		"preferred>max":  {"BOUND6", "2001:db8::103", "128", "", "60", "3600", "", ""},
		"old bad":        {"EXPIRE6", "", "", "", "", "", "fe80::1", "64"},
		"huge field":     {"BOUND6", strings.Repeat("1", 5000), "128", "", "", "", "", ""},
	}
	for name, f := range bad {
		if l, err := ParseLease6(f); err == nil {
			t.Errorf("%s: accepted %+v", name, l)
		}
	}
}

func good6(t *testing.T) net.IP {
	l, err := ParseLease6([]string{"BOUND6", "2001:db8::103", "128", "", "", "", "", ""})
	if err != nil {
		t.Fatal(err)
	}
	return l.Addr
}

func record6(f ...string) string {
	return lease6Marker + "\x00" + strings.Join(f, "\x00") + "\x00"
}

func TestReadReports6(t *testing.T) {
	var in bytes.Buffer
	in.WriteString("dhclient noise\n")
	in.WriteString(strings.Repeat("noise without end ", 500))
	in.WriteString("\n" + record6("PREINIT6", "", "", "", "", "", "", ""))
	in.WriteString(record6("BOUND6", "2001:db8::103", "128", "2001:db8::53", "3600", "3600", "", ""))
	in.WriteString(record6("BOUND6", strings.Repeat("9", 100000), "128", "", "", "", "", ""))
	in.WriteString(record6("RENEW6", "2001:db8::103", "128", "bad", "", "", "", ""))
	in.WriteString(lease6Marker + "\x00BOUND6\x002001:db8::104\x00128") // cut short: dropped
	var got []string
	if err := ReadReports6(&in, func(l Lease6, err error) {
		if err != nil {
			got = append(got, "error")
			return
		}
		got = append(got, l.Event+" "+l.Addr.String())
	}); err != nil {
		t.Fatal(err)
	}
	want := "PREINIT6 <nil>|BOUND6 2001:db8::103|error|error"
	if s := strings.Join(got, "|"); s != want {
		t.Fatalf("reports: %s, want %s", s, want)
	}
}

// FuzzParseLease6: no input crashes the reader or the parser, and what
// they accept is a usable lease.
func FuzzParseLease6(f *testing.F) {
	f.Add([]byte(record6("BOUND6", "2001:db8::103", "128", "2001:db8::53", "3600", "3600", "", "")))
	f.Add([]byte("noise\n" + record6("RELEASE6", "", "", "", "", "", "2001:db8::103", "128")))
	f.Add([]byte(record6("RENEW6", "fd00::1", "64", "fd00::53 fd00::54", "", "", "fd00::2", "64")))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = ReadReports6(bytes.NewReader(data), func(l Lease6, err error) {
			if err != nil || !l.HasAddress() {
				return
			}
			if l.Addr.To4() != nil || !l.Addr.IsGlobalUnicast() || l.PrefixLen < minPrefix6 || l.PrefixLen > 128 ||
				len(l.DNS) > maxLeaseList || anycastOf(l.Addr, l.PrefixLen) {
				t.Fatalf("accepted an unusable lease %+v", l)
			}
			for _, d := range l.DNS {
				if d.To4() != nil || !d.IsGlobalUnicast() {
					t.Fatalf("accepted DNS server %v", d)
				}
			}
			if n, ok := parseIPv6CIDR(l.CIDR()); !ok || !n.IP.Equal(l.Addr) {
				t.Fatalf("%s does not read back", l.CIDR())
			}
		})
	})
}

// scriptedDHCP6 reports a hostile lease and then lease, and runs until
// stopped; it counts runs and releases.
type scriptedDHCP6 struct {
	mu       sync.Mutex
	lease    []string
	running  int
	devs     []string
	released []string
}

func (f *scriptedDHCP6) Run(ctx context.Context, dev string, report func(Lease6, error)) error {
	f.mu.Lock()
	f.running++
	f.devs = append(f.devs, dev)
	lease := f.lease
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.running--; f.mu.Unlock() }()
	report(ParseLease6([]string{"BOUND6", "ff02::999", "128", "", "", "", "", ""}))
	report(ParseLease6(lease))
	<-ctx.Done()
	return nil
}

func (f *scriptedDHCP6) Release(_ context.Context, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released = append(f.released, dev)
	return nil
}

func (f *scriptedDHCP6) state() (running int, released []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running, append([]string(nil), f.released...)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDHCP6ClientsApplyAndRelease(t *testing.T) {
	e := newEnv(t)
	fake := &scriptedDHCP6{lease: []string{"BOUND6", "2001:db8::103", "128", "2001:db8::53", "3600", "3600", "", ""}}
	e.m.dhcp6 = newDHCP6Clients(e.m, fake)
	t.Cleanup(e.m.stopDHCP6)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	e.ok("PIF.plug", eth1)
	e.ok("PIF.reconfigure_ip", eth1, "Static", "10.0.0.1", "255.255.255.0", "", "10.0.0.53")
	e.ok("PIF.reconfigure_ipv6", eth1, "Static", "2001:db8::1/64", "", "")
	e.rec.Reset()
	e.ok("PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	// The static address is flushed; the lease, not the hostile report,
	// reaches the kernel.
	as, _ := e.rec.Addrs("xenbr1", 6)
	if len(as) != 1 || as[0].String() != "2001:db8::103/128" {
		t.Fatalf("addresses of xenbr1: %v (calls %v)", as, e.rec.Calls())
	}
	for _, c := range e.rec.Calls() {
		if strings.Contains(c, "999") {
			t.Fatalf("the hostile lease reached the kernel: %s", c)
		}
	}
	p := e.pif(eth1)
	// eth1 is not the DNS PIF (the management PIF is): the address only.
	if p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeDHCP || len(p.IPV6) != 1 || p.IPV6[0] != "2001:db8::103/128" || p.DNS != "10.0.0.53" {
		t.Fatalf("PIF %+v", p)
	}
	// DHCP again: the running client records its lease again.
	e.ok("PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	if p := e.pif(eth1); len(p.IPV6) != 1 || p.IPV6[0] != "2001:db8::103/128" {
		t.Fatalf("PIF.IPv6 after DHCP again: %v", p.IPV6)
	}
	// Autoconf: the client stops, the lease is released and its address
	// goes.
	e.ok("PIF.reconfigure_ipv6", eth1, "Autoconf", "", "", "")
	waitUntil(t, "release after Autoconf", func() bool { n, r := fake.state(); return n == 0 && len(r) == 1 })
	waitUntil(t, "address gone", func() bool { as, _ := e.rec.Addrs("xenbr1", 6); return len(as) == 0 })

	// As the DNS PIF its servers join the IPv4 ones in PIF.DNS; a
	// restart (stop without release) keeps the address.
	e.ok("PIF.add_to_other_config", eth1, "peerdns", "true")
	e.ok("PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	if p := e.pif(eth1); p.DNS != "10.0.0.53,2001:db8::53" {
		t.Fatalf("DNS PIF: %+v", p)
	}
	e.m.stopDHCP6()
	if n, r := fake.state(); n != 0 || len(r) != 1 {
		t.Fatalf("after stop: %d running, released %v", n, r)
	}
	if as, _ := e.rec.Addrs("xenbr1", 6); len(as) != 1 {
		t.Fatalf("the address went with the daemon: %v", as)
	}

	// Unplug and forget release too.
	e.m.dhcp6 = newDHCP6Clients(e.m, fake)
	e.m.syncDHCP6()
	waitUntil(t, "client again", func() bool { n, _ := fake.state(); return n == 1 })
	e.ok("PIF.unplug", eth1)
	e.m.syncDHCP6()
	waitUntil(t, "release after unplug", func() bool { n, r := fake.state(); return n == 0 && len(r) == 2 })
	e.ok("PIF.plug", eth1)
	e.m.syncDHCP6()
	waitUntil(t, "client after plug", func() bool { n, _ := fake.state(); return n == 1 })
	waitUntil(t, "lease after plug", func() bool { as, _ := e.rec.Addrs("xenbr1", 6); return len(as) == 1 })
	e.ok("PIF.forget", eth1)
	e.m.syncDHCP6()
	waitUntil(t, "release after forget", func() bool { n, r := fake.state(); return n == 0 && len(r) == 3 })
}

func TestReconfigureIPv6DHCPMissing(t *testing.T) {
	e := newEnv(t)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	e.m.cfg.DHCP6Missing = "no DHCPv6 client: dhclient is not installed (Debian package isc-dhcp-client)"
	err := e.fails(xerr.PIFConfigurationError, "PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	if !strings.Contains(err.Params[1], "isc-dhcp-client") || err.Params[0] != eth1 {
		t.Fatalf("unclear: %v", err)
	}
}

func TestFindDhclient(t *testing.T) {
	saved := dhclientPaths
	t.Cleanup(func() { dhclientPaths = saved })
	dhclientPaths = nil
	t.Setenv("PATH", t.TempDir())
	if _, err := FindDhclient("", t.TempDir(), t.TempDir()); err == nil || !strings.Contains(err.Error(), DHCP6Package) {
		t.Fatalf("missing dhclient: %v", err)
	}
	// A stand-in dhclient: the files are made, and a device name cannot
	// leave their directories or pass for an option.
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "dhclient"), []byte("#!/bin/sh\nexit 0\n"), 0o700); err != nil { // #nosec G306 -- test
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	leases, run := t.TempDir(), filepath.Join(t.TempDir(), "run")
	c, err := FindDhclient("", leases, run)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"dhclient6-report", "dhclient6.conf"} {
		if _, err := os.Stat(filepath.Join(run, f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	for _, dev := range []string{"../x", "a/b", "-r", ""} {
		if err := c.Release(context.Background(), dev); err == nil {
			t.Errorf("device %q accepted", dev)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
