package network

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"toolstackd/internal/xerr"
)

func TestParseLease(t *testing.T) {
	good := []string{"bound", "10.0.0.5", "255.255.255.0", "10.0.0.1", "10.0.0.53 10.0.0.54", "3600"}
	l, err := ParseLease(good)
	if err != nil || !l.HasAddress() || l.IP.String() != "10.0.0.5" || len(l.DNS) != 2 || l.Seconds != 3600 || l.Routers[0].String() != "10.0.0.1" {
		t.Fatalf("good lease: %+v, %v", l, err)
	}
	if l, err := ParseLease([]string{"deconfig", "", "", "", "", ""}); err != nil || l.HasAddress() {
		t.Fatalf("deconfig: %+v %v", l, err)
	}
	bad := map[string][]string{
		"short":         {"bound", "10.0.0.5"},
		"event":         {"rm -rf /", "10.0.0.5", "255.255.255.0", "", "", ""},
		"ip":            {"bound", "10.0.0.256", "255.255.255.0", "", "", ""},
		"ip6":           {"bound", "::ffff:10.0.0.5", "255.255.255.0", "", "", ""},
		"bcast":         {"bound", "255.255.255.255", "255.255.255.0", "", "", ""},
		"zero":          {"bound", "0.0.0.0", "255.255.255.0", "", "", ""},
		"multicast":     {"bound", "224.0.0.1", "255.255.255.0", "", "", ""},
		"network":       {"bound", "10.0.0.0", "255.255.255.0", "", "", ""},
		"mask":          {"bound", "10.0.0.5", "255.0.255.0", "", "", ""},
		"mask0":         {"bound", "10.0.0.5", "0.0.0.0", "", "", ""},
		"router":        {"bound", "10.0.0.5", "255.255.255.0", "10.0.0.1;reboot", "", ""},
		"dns":           {"bound", "10.0.0.5", "255.255.255.0", "", "$(id)", ""},
		"many dns":      {"bound", "10.0.0.5", "255.255.255.0", "", strings.Repeat("10.0.0.9 ", 100), ""},
		"lease":         {"bound", "10.0.0.5", "255.255.255.0", "", "", "99999999999999"},
		"negative":      {"bound", "10.0.0.5", "255.255.255.0", "", "", "-1"},
		"huge field ip": {"bound", strings.Repeat("1", 5000), "255.255.255.0", "", "", ""},
	}
	for name, f := range bad {
		if l, err := ParseLease(f); err == nil {
			t.Errorf("%s: accepted %+v", name, l)
		}
	}
}

func TestReadReports(t *testing.T) {
	var in bytes.Buffer
	in.WriteString("udhcpc: started, v1.35.0\n")
	in.WriteString(strings.Repeat("udhcpc: noise without end ", 500))
	in.WriteString("\n" + leaseMarker + "\x00deconfig\x00\x00\x00\x00\x00\x00")
	in.WriteString("udhcpc: lease obtained\n" + leaseMarker + "\x00bound\x0010.0.0.5\x00255.255.255.0\x0010.0.0.1\x0010.0.0.53\x003600\x00")
	in.WriteString(leaseMarker + "\x00bound\x00" + strings.Repeat("9", 100000) + "\x00255.255.255.0\x00\x00\x00\x00")
	in.WriteString(leaseMarker + "\x00renew\x0010.0.0.5\x00255.255.255.0\x00bad\x00\x00\x00")
	var got []string
	_ = ReadReports(&in, func(l Lease, err error) {
		if err != nil {
			got = append(got, "error")
			return
		}
		got = append(got, l.Event+" "+l.IP.String())
	})
	want := "deconfig <nil>|bound 10.0.0.5|error|error"
	if s := strings.Join(got, "|"); s != want {
		t.Fatalf("reports: %s, want %s", s, want)
	}
}

// FuzzParseLease: no input crashes the parser, and what it accepts is a
// usable lease.
func FuzzParseLease(f *testing.F) {
	f.Add([]byte(leaseMarker + "\x00bound\x0010.0.0.5\x00255.255.255.0\x0010.0.0.1\x0010.0.0.53\x003600\x00"))
	f.Add([]byte("noise\n" + leaseMarker + "\x00deconfig\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = ReadReports(bytes.NewReader(data), func(l Lease, err error) {
			if err != nil || !l.HasAddress() {
				return
			}
			if l.IP.To4() == nil || len(l.Mask) != 4 || len(l.Routers) > maxLeaseList || len(l.DNS) > maxLeaseList {
				t.Fatalf("accepted an unusable lease %+v", l)
			}
		})
	})
}

// fakeDHCP reports a hostile report and then a good lease, and runs
// until stopped.
type fakeDHCP struct {
	mu      sync.Mutex
	running int
	devs    []string
}

func (f *fakeDHCP) Run(ctx context.Context, dev string, _ net.IP, report func(Lease, error)) error {
	f.mu.Lock()
	f.running++
	f.devs = append(f.devs, dev)
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.running--; f.mu.Unlock() }()
	report(ParseLease([]string{"bound", "10.9.9.999", "255.255.255.0", "10.9.9.1", "", "60"}))
	report(ParseLease([]string{"bound", "10.9.9.7", "255.255.255.0", "10.9.9.1", "10.9.9.53", "60"}))
	<-ctx.Done()
	return nil
}

func (f *fakeDHCP) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.running }

func TestDHCPClientsApplyAndStop(t *testing.T) {
	e := newEnv(t)
	fake := &fakeDHCP{}
	e.m.dhcp = newDHCPClients(e.m, fake)
	e.m.cfg.DHCP = e.m.startDHCP
	t.Cleanup(e.m.stopDHCP)
	e.scan()
	eth1 := e.pifOn("eth1", -1)
	e.ok("PIF.plug", eth1)
	e.fails(xerr.PIFConfigurationError, "PIF.reconfigure_ipv6", eth1, "DHCP", "", "", "")
	e.rec.Reset()
	e.ok("PIF.reconfigure_ip", eth1, "DHCP", "", "", "", "")
	as, _ := e.rec.Addrs("xenbr1", 4)
	if len(as) != 1 || as[0].String() != "10.9.9.7/24" {
		t.Fatalf("addresses of xenbr1: %v (calls %v)", as, e.rec.Calls())
	}
	for _, c := range e.rec.Calls() {
		if strings.Contains(c, "999") {
			t.Fatalf("the hostile lease reached the kernel: %s", c)
		}
	}
	p := e.pif(eth1)
	// eth1 is not the gateway or DNS PIF (the management PIF is): the
	// address only, as xapi.
	if p.IP != "10.9.9.7" || p.Netmask != "255.255.255.0" || p.Gateway != "" || p.DNS != "" || fake.devs[0] != "xenbr1" {
		t.Fatalf("PIF %+v, client on %v", p, fake.devs)
	}
	e.ok("PIF.reconfigure_ip", eth1, "None", "", "", "", "")
	e.m.syncDHCP()
	if n := fake.count(); n != 0 {
		t.Fatalf("%d clients after mode None (%v, %+v)", n, fake.devs, e.pif(eth1))
	}
	// As the gateway and DNS PIF (other_config), the lease's router
	// becomes the default route and PIF.gateway, its servers PIF.DNS.
	e.ok("PIF.add_to_other_config", eth1, "defaultroute", "true")
	e.ok("PIF.add_to_other_config", eth1, "peerdns", "true")
	e.ok("PIF.reconfigure_ip", eth1, "DHCP", "", "", "", "")
	gw, dev, _ := e.rec.DefaultGateway(4)
	if p := e.pif(eth1); p.Gateway != "10.9.9.1" || p.DNS != "10.9.9.53" || gw.String() != "10.9.9.1" || dev != "xenbr1" {
		t.Fatalf("gateway PIF: %+v; default route %v dev %s", p, gw, dev)
	}
	e.m.stopDHCP()
	if n := fake.count(); n != 0 {
		t.Fatalf("%d clients after stop", n)
	}
}

func TestFindUdhcpcMissing(t *testing.T) {
	_, err := FindUdhcpc("/nonexistent/busybox", "")
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/busybox udhcpc") {
		t.Fatalf("missing busybox: %v", err)
	}
}
