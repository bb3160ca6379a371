// Package network_test runs the real daemon with its network module on
// the Linux backend, each daemon acting inside a network namespace the
// test made (--network-namespace), never in the machine's own: PIFs on
// veth "NICs", bridges, addresses, a VLAN the kernel cannot make, a
// private network that follows a VM, a restart that changes nothing,
// and a VXLAN tunnel between two hosts of a pool carrying traffic.
//
// The tests run as root and skip, saying why, when namespaces cannot be
// made (netnstest).
package network_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// rpc makes XenAPI calls with one session, failing the test on errors.
type rpc struct {
	t *testing.T
	c *testdaemon.Client
	s string
}

func (r *rpc) try(method string, args ...any) (json.RawMessage, error) {
	return r.c.Call(method, append([]any{r.s}, args...)...)
}

func (r *rpc) call(method string, args ...any) json.RawMessage {
	r.t.Helper()
	raw, err := r.try(method, args...)
	if err != nil {
		r.t.Fatalf("%s%v: %v", method, args, err)
	}
	return raw
}

func (r *rpc) str(method string, args ...any) string {
	r.t.Helper()
	raw := r.call(method, args...)
	s, err := testdaemon.String(raw)
	if err != nil {
		r.t.Fatalf("%s: %v", method, err)
	}
	return s
}

func (r *rpc) refs(method string, args ...any) []string {
	r.t.Helper()
	var out []string
	raw := r.call(method, args...)
	if err := json.Unmarshal(raw, &out); err != nil {
		r.t.Fatalf("%s: %.200s", method, raw)
	}
	return out
}

// records is <class>.get_all_records.
func (r *rpc) records(class string) map[string]map[string]any {
	r.t.Helper()
	var out map[string]map[string]any
	raw := r.call(class + ".get_all_records")
	if err := json.Unmarshal(raw, &out); err != nil {
		r.t.Fatalf("%s.get_all_records: %.200s", class, raw)
	}
	return out
}

// pifOf is the ref and record of host's PIF on device with VLAN -1.
func (r *rpc) pifOf(host, device string) (string, map[string]any) {
	r.t.Helper()
	for ref, p := range r.records("PIF") {
		if p["host"] == host && p["device"] == device && fmt.Sprint(p["VLAN"]) == "-1" {
			return ref, p
		}
	}
	r.t.Fatalf("no PIF of %s on host %s", device, host)
	return "", nil
}

// vifRecord is a VIF.create record for device 0 of vm on network.
func vifRecord(vm, network string) map[string]any {
	return map[string]any{
		"device": "0", "network": network, "VM": vm, "MAC": "", "MTU": 1500, "other_config": map[string]string{},
		"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}, "locking_mode": "network_default",
		"ipv4_allowed": []string{}, "ipv6_allowed": []string{},
	}
}

// ipLink is what `ip -j -d link` says of one link.
type ipLink struct {
	Index    int      `json:"ifindex"`
	Name     string   `json:"ifname"`
	Flags    []string `json:"flags"`
	MTU      int      `json:"mtu"`
	Master   string   `json:"master"`
	Address  string   `json:"address"`
	Alias    string   `json:"ifalias"`
	LinkInfo struct {
		Kind string `json:"info_kind"`
		Data struct {
			ID     int    `json:"id"`
			Local  string `json:"local"`
			Remote string `json:"remote"`
		} `json:"info_data"`
	} `json:"linkinfo"`
}

func (l ipLink) up() bool { return slices.Contains(l.Flags, "UP") }

// links is every link of ns by name.
func links(t *testing.T, ns *netnstest.Namespace) map[string]ipLink {
	t.Helper()
	var ls []ipLink
	out := netnstest.Exec(t, ns, "ip", "-j", "-d", "link", "show")
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("ip -j -d link in %s: %v: %.300s", ns.Name(), err, out)
	}
	m := map[string]ipLink{}
	for _, l := range ls {
		m[l.Name] = l
	}
	return m
}

// dump is `ip -d link` and `ip addr` of ns, for failure messages.
func dump(ns *netnstest.Namespace) string {
	a, _ := ns.Run("ip", "-d", "link", "show")
	b, _ := ns.Run("ip", "-4", "-o", "addr", "show")
	return a + b
}

// addrs4 are the IPv4 addresses (CIDR) of dev in ns.
func addrs4(t *testing.T, ns *netnstest.Namespace, dev string) []string {
	t.Helper()
	var out []struct {
		AddrInfo []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Prefix int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	raw := netnstest.Exec(t, ns, "ip", "-j", "-4", "addr", "show", "dev", dev)
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatalf("ip -j addr show dev %s: %v: %.300s", dev, err, raw)
	}
	var as []string
	for _, o := range out {
		for _, a := range o.AddrInfo {
			as = append(as, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
		}
	}
	return as
}

// waitFor polls cond every 100 ms until it holds or timeout passes, and
// returns how long it took; on timeout the test fails with what cond
// said last. The tests give it 30 s at the least: what they wait for
// takes up to 2 s on a quiet machine (the module's watch period).
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		last = why
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v: %s", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// errCode fails the test unless err is a XenAPI error, and returns it.
func errCode(t *testing.T, what string, err error) *testdaemon.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded", what)
	}
	e, ok := testdaemon.AsError(err)
	if !ok {
		t.Fatalf("%s: not a XenAPI error: %v", what, err)
	}
	return e
}

// monitor records the link and address events of ns (`ip monitor`)
// until the returned function is called, which returns them.
func monitor(t *testing.T, ns *netnstest.Namespace) func() string {
	t.Helper()
	cmd := exec.Command("ip", "-n", ns.Name(), "monitor", "link", "address") // #nosec G204 -- test's own namespace
	var out testdaemon.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("ip monitor: %v", err)
	}
	done := false
	stop := func() string {
		if !done {
			done = true
			_ = cmd.Process.Kill() // our own child
			_ = cmd.Wait()         // killed: the error says so
		}
		return out.String()
	}
	t.Cleanup(func() { stop() })
	time.Sleep(200 * time.Millisecond) // let it subscribe
	return stop
}

// withoutInet6 is ip monitor's output without the IPv6 address events
// (the kernel's own link-local addresses, added when a link comes up).
func withoutInet6(out string) string {
	var keep []string
	skip := false
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			skip = strings.Contains(line, " inet6 ")
		}
		if !skip {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestHostNetworking runs one daemon whose network module acts in a
// namespace "host" with two veth NICs (eth1, eth2) whose peers are in a
// namespace "switch".
func TestHostNetworking(t *testing.T) {
	begin := time.Now()
	host, sw := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, host, "eth1", sw, "sw1")
	netnstest.Veth(t, host, "eth2", sw, "sw2")
	netnstest.Veth(t, host, "eth3", sw, "sw3")
	before := links(t, host)

	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator",
		ExtraArgs: []string{"--network-backend", "linux", "--network-namespace", host.Path()}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	hosts := r.refs("host.get_all")
	if len(hosts) != 1 {
		t.Fatalf("hosts: %v", hosts)
	}
	h := hosts[0]
	t.Logf("daemon up after %v", time.Since(begin).Round(time.Millisecond))

	// The management PIF as first boot made it.
	var mgmtRef string
	var mgmt map[string]any
	for ref, p := range r.records("PIF") {
		if p["management"] == true {
			mgmtRef, mgmt = ref, p
		}
	}
	if mgmtRef == "" {
		t.Fatal("no management PIF after first boot")
	}

	// PIF.scan: eth1 and eth2, nothing else.
	r.call("PIF.scan", h)
	pifs := r.records("PIF")
	var devices []string
	for ref, p := range pifs {
		if ref != mgmtRef {
			devices = append(devices, fmt.Sprint(p["device"]))
		}
	}
	slices.Sort(devices)
	if !slices.Equal(devices, []string{"eth1", "eth2", "eth3"}) {
		t.Fatalf("PIF.scan introduced %v, want [eth1 eth2 eth3]", devices)
	}
	if got := pifs[mgmtRef]; fmt.Sprint(got) != fmt.Sprint(mgmt) {
		t.Errorf("PIF.scan changed the management PIF:\nbefore %v\nafter  %v", mgmt, got)
	}
	pifRef := map[string]string{}
	for _, dev := range []string{"eth1", "eth2", "eth3"} {
		ref, p := r.pifOf(h, dev)
		pifRef[dev] = ref
		l := before[dev]
		if p["MAC"] != strings.ToLower(l.Address) || fmt.Sprint(p["MTU"]) != fmt.Sprint(l.MTU) ||
			p["physical"] != true || p["currently_attached"] != false || p["management"] != false {
			t.Errorf("PIF of %s: MAC %v MTU %v physical %v attached %v management %v; kernel: MAC %s MTU %d",
				dev, p["MAC"], p["MTU"], p["physical"], p["currently_attached"], p["management"], l.Address, l.MTU)
		}
		if c := string(r.call("PIF_metrics.get_carrier", p["metrics"])); c != "true" {
			t.Errorf("PIF_metrics of %s: carrier %s, want true (its peer is up)", dev, c)
		}
	}
	if now := links(t, host); len(now) != len(before) {
		t.Errorf("PIF.scan changed the links: before %d, after %d\n%s", len(before), len(now), dump(host))
	}

	// PIF.plug puts eth1 into its network's bridge; unplug undoes it.
	net1 := r.str("PIF.get_network", pifRef["eth1"])
	br1 := r.str("network.get_bridge", net1)
	if br1 == "" {
		t.Fatal("eth1's network has no bridge name")
	}
	r.call("PIF.plug", pifRef["eth1"])
	ls := links(t, host)
	if b, ok := ls[br1]; !ok || b.LinkInfo.Kind != "bridge" || !b.up() {
		t.Fatalf("after PIF.plug: bridge %s: %+v (present %v)\n%s", br1, b, ok, dump(host))
	}
	if e := ls["eth1"]; e.Master != br1 || !e.up() {
		t.Fatalf("after PIF.plug: eth1 master %q up %v, want %s and up", e.Master, e.up(), br1)
	}
	if ls["eth2"].Master != "" {
		t.Errorf("eth2 was put in %s", ls["eth2"].Master)
	}
	if string(r.call("PIF.get_currently_attached", pifRef["eth1"])) != "true" {
		t.Error("PIF.plug: currently_attached is not true")
	}
	r.call("PIF.unplug", pifRef["eth1"])
	ls = links(t, host)
	if _, ok := ls[br1]; ok {
		t.Errorf("after PIF.unplug the bridge %s is still there\n%s", br1, dump(host))
	}
	if ls["eth1"].Master != "" {
		t.Errorf("after PIF.unplug eth1 is still in %s", ls["eth1"].Master)
	}

	// A Static address goes on the bridge and answers on the wire.
	r.call("PIF.plug", pifRef["eth1"])
	r.call("PIF.reconfigure_ip", pifRef["eth1"], "Static", "10.66.1.1", "255.255.255.0", "", "")
	if got := addrs4(t, host, br1); !slices.Equal(got, []string{"10.66.1.1/24"}) {
		t.Fatalf("addresses on %s after reconfigure_ip: %v, want [10.66.1.1/24]", br1, got)
	}
	if got := addrs4(t, host, "eth1"); len(got) != 0 {
		t.Errorf("addresses on the port eth1: %v", got)
	}
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.66.1.2/24", "dev", "sw1")
	netnstest.Ping(t, sw, "10.66.1.1")

	// Without 802.1Q and bonding (this machine's kernel), VLAN.create
	// and Bond.create fail naming the module and leave nothing behind.
	// Where the kernel has them, internal/network's datapath tests make
	// both for real (and tests/kernel runs those under the
	// distribution's kernel everywhere).
	if kernelHas(t, "vlan") || kernelHas(t, "bond") {
		t.Log("this kernel has 802.1Q or bonding: the errors for their absence are not exercised here")
	} else {
		// No 802.1Q in this kernel: VLAN.create fails naming it, leaving
		// nothing behind.
		vnet := r.str("network.create", map[string]any{"name_label": "vlan42", "name_description": "", "MTU": 1500,
			"other_config": map[string]string{}})
		vbr := r.str("network.get_bridge", vnet)
		pifsBefore := len(r.records("PIF"))
		_, err := r.try("VLAN.create", pifRef["eth2"], 42, vnet)
		e := errCode(t, "VLAN.create on eth2", err)
		t.Logf("VLAN.create without 802.1Q: %v", e)
		if e.Code != "INTERNAL_ERROR" || !strings.Contains(strings.Join(e.Params, " "), "8021q") {
			t.Errorf("VLAN.create: %v, want INTERNAL_ERROR naming 8021q", e)
		}
		if v := r.refs("VLAN.get_all"); len(v) != 0 {
			t.Errorf("VLAN records left: %v", v)
		}
		if n := len(r.records("PIF")); n != pifsBefore {
			t.Errorf("PIFs: %d before VLAN.create, %d after", pifsBefore, n)
		}
		ls = links(t, host)
		for name, l := range ls {
			if l.LinkInfo.Kind == "vlan" || name == vbr || strings.HasPrefix(name, "eth2.") {
				t.Errorf("left behind by the failed VLAN.create: %s (%s)", name, l.LinkInfo.Kind)
			}
		}
		if ls["eth2"].Master != "" || ls["eth2"].Alias != netnstest.NICAlias {
			t.Errorf("eth2 changed: master %q alias %q", ls["eth2"].Master, ls["eth2"].Alias)
		}

		// No bonding either: Bond.create fails naming it.
		bnet := r.str("network.create", map[string]any{"name_label": "bond", "name_description": "", "MTU": 1500,
			"other_config": map[string]string{}})
		pifsBefore = len(r.records("PIF"))
		_, err = r.try("Bond.create", bnet, []string{pifRef["eth2"], pifRef["eth3"]}, "", "active-backup", map[string]string{})
		e = errCode(t, "Bond.create on eth2+eth3", err)
		t.Logf("Bond.create without bonding: %v", e)
		if e.Code != "INTERNAL_ERROR" || !strings.Contains(strings.Join(e.Params, " "), "bonding") {
			t.Errorf("Bond.create: %v, want INTERNAL_ERROR naming bonding", e)
		}
		if b := r.refs("Bond.get_all"); len(b) != 0 {
			t.Errorf("Bond records left: %v", b)
		}
		if n := len(r.records("PIF")); n != pifsBefore {
			t.Errorf("PIFs: %d before Bond.create, %d after", pifsBefore, n)
		}
		for name, l := range links(t, host) {
			if l.LinkInfo.Kind == "bond" || l.LinkInfo.Kind == "bridge" && name != br1 {
				t.Errorf("left behind by the failed Bond.create: %s (%s)", name, l.LinkInfo.Kind)
			}
			if (name == "eth2" || name == "eth3") && (l.Master != "" || l.Alias != netnstest.NICAlias) {
				t.Errorf("%s after the failed Bond.create: master %q alias %q", name, l.Master, l.Alias)
			}
		}

		// The same with eth2 down: the module brings it up for the VLAN and
		// must put it back as it was.
		netnstest.Exec(t, host, "ip", "link", "set", "eth2", "down")
		_, err = r.try("VLAN.create", pifRef["eth2"], 43, vnet)
		if e := errCode(t, "VLAN.create on eth2 (down)", err); e.Code != "INTERNAL_ERROR" {
			t.Errorf("VLAN.create on a NIC that is down: %v", e)
		}
		l := links(t, host)["eth2"]
		if l.up() {
			t.Errorf("eth2 left up by the failed VLAN.create (it was down)")
		}
		if l.Alias != netnstest.NICAlias {
			// The reconciler adopts the NIC to bring it up; the rollback
			// gives it back (Links.Disown).
			t.Errorf("eth2 left adopted by the failed VLAN.create: alias %q, was %q", l.Alias, netnstest.NICAlias)
		}
		netnstest.Exec(t, host, "ip", "link", "set", "eth2", "up")
	}

	// A private network's bridge follows a running VM with a VIF on it.
	priv := r.str("network.create", map[string]any{"name_label": "private", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}})
	pbr := r.str("network.get_bridge", priv)
	vm := r.str("VM.create", testdaemon.VMRecord("netvm"))
	r.str("VIF.create", vifRecord(vm, priv))
	if _, ok := links(t, host)[pbr]; ok {
		t.Fatalf("bridge %s of the private network exists before any VM runs", pbr)
	}
	r.call("VM.start", vm, false, false)
	b, ok := links(t, host)[pbr]
	if !ok || b.LinkInfo.Kind != "bridge" || !b.up() {
		t.Fatalf("after VM.start: bridge %s %+v (present %v)\n%s", pbr, b, ok, dump(host))
	}
	for name, l := range links(t, host) {
		if l.Master == pbr {
			t.Errorf("the private bridge %s has a port %s", pbr, name)
		}
	}
	r.call("VM.hard_shutdown", vm)
	took := waitFor(t, "private bridge gone after VM.hard_shutdown", 30*time.Second, func() (bool, string) {
		_, ok := links(t, host)[pbr]
		return !ok, pbr + " still there"
	})
	t.Logf("private bridge %s gone %v after VM.hard_shutdown returned", pbr, took.Round(time.Millisecond))

	// A restart reapplies the database without touching what matches.
	ls = links(t, host)
	idx := ls[br1].Index
	stop := monitor(t, host)
	rs := time.Now()
	d = d.Restart()
	r = &rpc{t: t, c: d.Client(), s: d.Login(t)}
	restarted := time.Since(rs)
	time.Sleep(3 * time.Second) // past one period of the module's watch (2 s)
	events := withoutInet6(stop())
	t.Logf("restart took %v", restarted.Round(time.Millisecond))
	ls = links(t, host)
	if ls[br1].Index != idx {
		t.Errorf("bridge %s re-created by the restart: ifindex %d, was %d", br1, ls[br1].Index, idx)
	}
	if ls["eth1"].Master != br1 || !ls[br1].up() {
		t.Errorf("after restart: eth1 master %q, bridge up %v", ls["eth1"].Master, ls[br1].up())
	}
	if got := addrs4(t, host, br1); !slices.Equal(got, []string{"10.66.1.1/24"}) {
		t.Errorf("addresses on %s after restart: %v", br1, got)
	}
	if _, ok := ls[pbr]; ok {
		t.Errorf("the private bridge %s came back with the restart (no VM runs)", pbr)
	}
	if events != "" {
		t.Errorf("the restart changed links or IPv4 addresses in the namespace:\n%s", events)
	}
	netnstest.Ping(t, sw, "10.66.1.1")
	if mg := r.records("PIF")[mgmtRef]; mg["currently_attached"] != mgmt["currently_attached"] ||
		fmt.Sprint(mg["other_config"]) != fmt.Sprint(mgmt["other_config"]) || mg["device"] != mgmt["device"] {
		t.Errorf("the management PIF changed: before %v after %v", mgmt, mg)
	}
	t.Logf("TestHostNetworking: %v", time.Since(begin).Round(time.Millisecond))
}

// TestTunnelAcrossHosts joins two daemons in a pool, each acting in its
// own namespace (hostA, hostB) whose transport NICs share a wire, makes a
// VXLAN tunnel network on both and checks that two guests plugged into
// the tunnel network's bridges reach each other, until the tunnels go.
func TestTunnelAcrossHosts(t *testing.T) {
	begin := time.Now()
	step := func(what string, since time.Time) time.Time {
		t.Logf("%-52s %v", what, time.Since(since).Round(time.Millisecond))
		return time.Now()
	}
	hostA, hostB := netnstest.New(t), netnstest.New(t)
	guestA, guestB := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, hostA, "eth1", hostB, "eth1")
	ns := []*netnstest.Namespace{hostA, hostB}

	p := pooltest.Start(t, pooltest.Options{Hosts: 2,
		Daemon: testdaemon.Options{ExtraArgs: []string{"--network-backend", "linux"}},
		HostArgs: map[int][]string{
			0: {"--network-namespace", hostA.Path()},
			1: {"--network-namespace", hostB.Path()},
		}})
	at := step("two daemons started", begin)
	p.Join(t)
	at = step("pool joined", at)

	c := &testdaemon.Client{URL: "http://" + p.Addr(0)}
	s, err := c.Login("root", p.Password())
	if err != nil {
		t.Fatal(err)
	}
	r := &rpc{t: t, c: c, s: s}
	hostRef := map[int]string{}
	for _, h := range r.refs("host.get_all") {
		hostRef[p.IndexOf(r.str("host.get_address", h))] = h
	}
	if hostRef[0] == "" || hostRef[1] == "" {
		t.Fatalf("host refs by index: %v", hostRef)
	}

	// Transport PIFs: eth1 on each host, Static, plugged.
	transport := map[int]string{}
	for i, ip := range []string{"10.77.0.1", "10.77.0.2"} {
		r.call("PIF.scan", hostRef[i])
		ref, _ := r.pifOf(hostRef[i], "eth1")
		transport[i] = ref
		r.call("PIF.reconfigure_ip", ref, "Static", ip, "255.255.255.0", "", "")
		r.call("PIF.plug", ref)
	}
	tbr := r.str("network.get_bridge", r.str("PIF.get_network", transport[0]))
	for i, n := range ns {
		want := []string{fmt.Sprintf("10.77.0.%d/24", i+1)}
		if got := addrs4(t, n, tbr); !slices.Equal(got, want) {
			t.Fatalf("host %d: addresses on %s: %v, want %v\n%s", i, tbr, got, want, dump(n))
		}
	}
	netnstest.Ping(t, hostA, "10.77.0.2")
	at = step("transport PIFs scanned, addressed, plugged", at)

	// The tunnel network, a tunnel on each host.
	tnet := r.str("network.create", map[string]any{"name_label": "tunnelled", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}})
	bridge := r.str("network.get_bridge", tnet)
	tunnels := map[int]string{}
	for i := range 2 {
		tunnels[i] = r.str("tunnel.create", transport[i], tnet, "vxlan")
	}
	at = step("tunnel.create on both hosts", at)
	vx := map[int]string{}
	for i, n := range ns {
		remote := fmt.Sprintf("10.77.0.%d", 2-i)
		took := waitFor(t, fmt.Sprintf("host %d: bridge %s with a VXLAN port to %s", i, bridge, remote), 30*time.Second,
			func() (bool, string) {
				ls := links(t, n)
				if b, ok := ls[bridge]; !ok || !b.up() {
					return false, "no bridge " + bridge + " up\n" + dump(n)
				}
				for name, l := range ls {
					if l.LinkInfo.Kind == "vxlan" && l.Master == bridge && l.LinkInfo.Data.Remote == remote && l.up() {
						vx[i] = name
						return true, ""
					}
				}
				return false, "no VXLAN port to " + remote + "\n" + dump(n)
			})
		t.Logf("host %d: %s in %s after %v", i, vx[i], bridge, took.Round(time.Millisecond))
	}
	if a, b := links(t, hostA)[vx[0]], links(t, hostB)[vx[1]]; a.LinkInfo.Data.ID != b.LinkInfo.Data.ID {
		t.Errorf("the two ends' VNIs differ: %d and %d", a.LinkInfo.Data.ID, b.LinkInfo.Data.ID)
	}
	for i := range 2 {
		if st := string(r.call("tunnel.get_status", tunnels[i])); !strings.Contains(st, `"active":"true"`) {
			t.Errorf("tunnel %d status %s", i, st)
		}
	}
	at = step("bridges and VXLAN links on both hosts", at)

	// Guests: a veth each, its host end put in the bridge by the test.
	for i, g := range []*netnstest.Namespace{guestA, guestB} {
		hn := ns[i]
		netnstest.Exec(t, g, "ip", "link", "add", "g0", "type", "veth", "peer", "name", "vguest", "netns", hn.Name())
		netnstest.Exec(t, g, "ip", "addr", "add", fmt.Sprintf("192.168.77.%d/24", i+1), "dev", "g0")
		netnstest.Exec(t, g, "ip", "link", "set", "g0", "up")
		netnstest.Exec(t, hn, "ip", "link", "set", "vguest", "master", bridge, "up")
	}
	netnstest.Ping(t, guestA, "192.168.77.2")
	step("guest A pings guest B across the tunnel", at)
	// The module leaves the port it did not make alone over a watch
	// period.
	time.Sleep(2500 * time.Millisecond)
	for i, n := range ns {
		if l := links(t, n)["vguest"]; l.Master != bridge || !l.up() || l.Alias != "" {
			t.Errorf("host %d: the test's port vguest was changed: master %q up %v alias %q", i, l.Master, l.up(), l.Alias)
		}
	}
	netnstest.Ping(t, guestB, "192.168.77.1")
	at = time.Now()

	// Restarting host B (not the coordinator) changes nothing in its
	// namespace: the bridge, its VXLAN link and the test's port stay.
	lb := links(t, hostB)
	stop := monitor(t, hostB)
	p.Restart(1)
	step("host B restarted", at)
	time.Sleep(3 * time.Second) // past one period of the module's watch (2 s)
	events := withoutInet6(stop())
	la := links(t, hostB)
	for _, name := range []string{bridge, vx[1], "vguest", tbr, "eth1"} {
		if la[name].Index != lb[name].Index || la[name].Master != lb[name].Master || la[name].up() != lb[name].up() {
			t.Errorf("host B: %s changed by the restart: %+v, was %+v", name, la[name], lb[name])
		}
	}
	if events != "" {
		t.Errorf("host B's restart changed links or IPv4 addresses in its namespace:\n%s", events)
	}
	netnstest.Ping(t, guestA, "192.168.77.2")
	at = time.Now()

	// tunnel.destroy of host B's tunnel: both VXLAN links go (host A's
	// through its watch of the database), and the traffic with them;
	// host A's bridge stays for its own tunnel, the test's port in it.
	r.call("tunnel.destroy", tunnels[1])
	at = step("tunnel.destroy of host B's tunnel", at)
	for i, n := range ns {
		took := waitFor(t, fmt.Sprintf("host %d: VXLAN link %s gone", i, vx[i]), 30*time.Second, func() (bool, string) {
			for name, l := range links(t, n) {
				if l.LinkInfo.Kind == "vxlan" {
					return false, name + " still there\n" + dump(n)
				}
			}
			return true, ""
		})
		t.Logf("host %d: VXLAN gone %v after tunnel.destroy", i, took.Round(time.Millisecond))
	}
	if rtt, err := netnstest.PingErr(guestA, "192.168.77.2", time.Second); err == nil {
		t.Errorf("guest B still answers guest A (%v) after tunnel.destroy\nA:\n%s\nB:\n%s", rtt, dump(hostA), dump(hostB))
	}
	if l := links(t, hostA)["vguest"]; l.Master != bridge {
		t.Errorf("host A: the test's port vguest is in %q, want %s (host A's tunnel remains)", l.Master, bridge)
	}
	r.call("tunnel.destroy", tunnels[0])
	step("tunnel.destroy of host A's tunnel", at)
	if ts := r.refs("tunnel.get_all"); len(ts) != 0 {
		t.Errorf("tunnels left: %v", ts)
	}
	for i, n := range ns {
		ls := links(t, n)
		if _, ok := ls[bridge]; ok {
			t.Errorf("host %d: the tunnel network's bridge %s is still there (no PIF, no VM on it)", i, bridge)
		}
		if _, ok := ls["vguest"]; !ok {
			t.Errorf("host %d: the test's own veth vguest is gone", i)
		}
		if ls["eth1"].Master != tbr {
			t.Errorf("host %d: transport NIC eth1 no longer in %s", i, tbr)
		}
	}
	netnstest.Ping(t, hostA, "10.77.0.2")
	step("TestTunnelAcrossHosts total", begin)
}

// kernelHas says whether the kernel can make a link of kind ("vlan",
// "bond"), trying in a scratch namespace.
func kernelHas(t *testing.T, kind string) bool {
	t.Helper()
	ns := netnstest.New(t)
	netnstest.Exec(t, ns, "ip", "link", "add", "k0", "type", "veth", "peer", "name", "k1")
	args := map[string][]string{"vlan": {"link", "k0", "name", "k0.5", "type", "vlan", "id", "5"}, "bond": {"name", "kb0", "type", "bond"}}[kind]
	_, err := ns.Run(append([]string{"ip", "link", "add"}, args...)...)
	return err == nil
}
