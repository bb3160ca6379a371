package network_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"toolstackd/internal/testkit/netnstest"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// The management interface moving (host.management_reconfigure,
// management_disable, local_management_reconfigure): the daemon listens
// on 127.0.0.N in the test's own namespace and its network module acts in
// a namespace of its own; the new management address is on a veth "NIC"
// there, so the tests reach it from the namespace at the wire's other end
// (dialIn), as a client on the host's network would.

// dialIn is an HTTP transport whose connections are made from inside ns.
func dialIn(ns *netnstest.Namespace) *http.Transport {
	return &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			type result struct {
				c   net.Conn
				err error
			}
			ch := make(chan result, 1)
			go func() {
				runtime.LockOSThread()
				orig, err := netns.Get()
				if err != nil {
					runtime.UnlockOSThread()
					ch <- result{nil, err}
					return
				}
				defer func() { _ = orig.Close() }()
				h, err := netns.GetFromPath(ns.Path())
				if err != nil {
					runtime.UnlockOSThread()
					ch <- result{nil, err}
					return
				}
				defer func() { _ = h.Close() }()
				if err := netns.Set(h); err != nil {
					runtime.UnlockOSThread()
					ch <- result{nil, err}
					return
				}
				d := net.Dialer{Timeout: 5 * time.Second}
				c, err := d.DialContext(ctx, network, addr)
				if netns.Set(orig) == nil {
					runtime.UnlockOSThread()
				}
				ch <- result{c, err}
			}()
			r := <-ch
			return r.c, r.err
		},
	}
}

// localSocket is an HTTP transport to the daemon's local superuser socket.
func localSocket(d *testdaemon.Daemon) *http.Transport {
	path := filepath.Join(d.DataDir, "xapi.sock")
	return &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}
}

// refused waits until nothing accepts TCP connections at addr (from the
// test's own namespace).
func refused(t *testing.T, addr string) {
	t.Helper()
	waitFor(t, "the old address "+addr+" to stop answering", 30*time.Second, func() (bool, string) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true, ""
		}
		_ = c.Close()
		return false, "still accepts connections"
	})
}

// wantCode fails the test unless err is the XenAPI error code (with
// params, when given).
func wantCode(t *testing.T, what string, err error, code string, params ...string) {
	t.Helper()
	e := errCode(t, what, err)
	if e.Code != code || params != nil && strings.Join(e.Params, " ") != strings.Join(params, " ") {
		t.Errorf("%s: %v, want %s %v", what, e, code, params)
	}
}

// TestManagementReconfigure: one daemon, its network module in a
// namespace with two veth NICs; eth2 gets a Static address and becomes
// the management interface: the API answers there (from the wire's other
// end), host.address and PIF.management follow, the old address closes.
// Then management_disable leaves only the local socket, from which
// management_reconfigure brings the API back. Bad input first.
func TestManagementReconfigure(t *testing.T) {
	begin := time.Now()
	host, sw := netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, host, "eth1", sw, "sw1")
	netnstest.Veth(t, host, "eth2", sw, "sw2")
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.79.0.2/24", "dev", "sw2")

	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator", Listen: testdaemon.FreeAddr(t, "127.0.0.1"),
		ExtraArgs: []string{"--network-backend", "linux", "--network-namespace", host.Path()}})
	r := &rpc{t: t, c: d.Client(), s: d.Login(t)}
	t.Logf("daemon up after %v", time.Since(begin).Round(time.Millisecond))
	h := r.refs("host.get_all")[0]
	_, port, _ := net.SplitHostPort(d.Addr)
	oldMgmt := ""
	for ref, p := range r.records("PIF") {
		if p["management"] == true {
			oldMgmt = ref
		}
	}
	if oldMgmt == "" {
		t.Fatal("no management PIF after first boot")
	}
	r.call("PIF.scan", h)
	eth1, _ := r.pifOf(h, "eth1")
	eth2, _ := r.pifOf(h, "eth2")

	// Bad input, each leaving everything as it was.
	_, err := r.try("host.management_reconfigure", "OpaqueRef:00000000-0000-0000-0000-00000000dead")
	wantCode(t, "management_reconfigure of no PIF", err, "HANDLE_INVALID")
	_, err = r.try("host.management_reconfigure", eth2)
	wantCode(t, "management_reconfigure of a PIF in mode None", err, "PIF_HAS_NO_NETWORK_CONFIGURATION", eth2)
	r.call("PIF.set_primary_address_type", eth1, "IPv6")
	_, err = r.try("host.management_reconfigure", eth1)
	wantCode(t, "management_reconfigure of an IPv6-primary PIF without IPv6", err, "PIF_HAS_NO_V6_NETWORK_CONFIGURATION", eth1)
	r.call("PIF.set_primary_address_type", eth1, "IPv4")
	_, err = r.try("host.local_management_reconfigure", "xenbr2")
	wantCode(t, "local_management_reconfigure on a host alone", err, "NOT_IN_EMERGENCY_MODE")
	r.call("host.management_reconfigure", oldMgmt) // already management: nothing to do
	if got := r.str("host.get_address", h); got != "127.0.0.1" {
		t.Fatalf("host.address after the refused calls: %s", got)
	}
	if string(r.call("PIF.get_management", oldMgmt)) != "true" || string(r.call("PIF.get_currently_attached", eth2)) != "false" {
		t.Fatal("the refused calls changed the PIFs")
	}

	// The move.
	r.call("PIF.reconfigure_ip", eth2, "Static", "10.79.0.1", "255.255.255.0", "", "")
	at := time.Now()
	r.call("host.management_reconfigure", eth2)
	t.Logf("management_reconfigure took %v", time.Since(at).Round(time.Millisecond))
	newAddr := net.JoinHostPort("10.79.0.1", port)
	nc := &testdaemon.Client{URL: "http://" + newAddr, Transport: dialIn(sw), Timeout: 20 * time.Second}
	s, err := nc.Login("root", testdaemon.DefaultPassword)
	if err != nil {
		t.Fatalf("login at the new management address %s: %v\n%s", newAddr, err, d.LogTail(30))
	}
	nr := &rpc{t: t, c: nc, s: s}
	if got := nr.str("host.get_address", h); got != "10.79.0.1" {
		t.Errorf("host.address: %s, want 10.79.0.1", got)
	}
	pifs := nr.records("PIF")
	for ref, p := range pifs {
		if want := ref == eth2; p["management"] != want {
			t.Errorf("PIF %s (%v): management %v, want %v", ref, p["device"], p["management"], want)
		}
	}
	if pifs[eth2]["currently_attached"] != true {
		t.Error("the new management PIF is not plugged")
	}
	br := nr.str("network.get_bridge", pifs[eth2]["network"])
	if got := addrs4(t, host, br); len(got) != 1 || got[0] != "10.79.0.1/24" {
		t.Errorf("addresses on %s: %v", br, got)
	}
	refused(t, d.Addr)
	if _, err := r.try("host.get_address", h); err == nil {
		t.Error("the old address still answers calls")
	}
	t.Logf("moved and the old address closed after %v", time.Since(at).Round(time.Millisecond))

	at = time.Now()
	// management_disable: only the local socket answers; from it,
	// management_reconfigure brings the API back.
	nr.call("host.management_disable")
	waitFor(t, "the management address to stop answering", 30*time.Second, func() (bool, string) {
		_, err := nc.Call("session.get_uuid", s, s)
		return err != nil && !isXenAPI(err), fmt.Sprint(err)
	})
	t.Logf("management_disable: the API stopped answering after %v", time.Since(at).Round(time.Millisecond))
	lc := &testdaemon.Client{URL: "http://local", Transport: localSocket(d)}
	ls, err := lc.Login("root", testdaemon.DefaultPassword)
	if err != nil {
		t.Fatalf("login on the local socket after management_disable: %v", err)
	}
	lr := &rpc{t: t, c: lc, s: ls}
	for ref, p := range lr.records("PIF") {
		if p["management"] == true {
			t.Errorf("PIF %s is still management after management_disable", ref)
		}
	}
	lr.call("host.management_reconfigure", eth2)
	s, err = nc.Login("root", testdaemon.DefaultPassword)
	if err != nil {
		t.Fatalf("login at %s after management_reconfigure from the local socket: %v", newAddr, err)
	}
	if got := string(lr.call("PIF.get_management", eth2)); got != "true" {
		t.Errorf("PIF.management of eth2 after re-enabling: %s", got)
	}

	// A restart serves on the configured listener and on the remembered
	// management address, which stays host.address.
	at = time.Now()
	d2 := d.Restart()
	waitFor(t, "the API at the remembered management address after a restart", 30*time.Second, func() (bool, string) {
		s, err = nc.Login("root", testdaemon.DefaultPassword)
		return err == nil, fmt.Sprint(err) + "\n" + d2.LogTail(10)
	})
	nr = &rpc{t: t, c: nc, s: s}
	waitFor(t, "host.address after a restart", 30*time.Second, func() (bool, string) {
		got := nr.str("host.get_address", h)
		return got == "10.79.0.1", got
	})
	t.Logf("restarted and serving at the management address after %v", time.Since(at).Round(time.Millisecond))

	// From both (the configured listener and the remembered one, on one
	// port) to eth1: one new listener, both old ones close.
	netnstest.Exec(t, sw, "ip", "addr", "add", "10.78.0.2/24", "dev", "sw1")
	nr.call("PIF.reconfigure_ip", eth1, "Static", "10.78.0.1", "255.255.255.0", "", "")
	nr.call("host.management_reconfigure", eth1)
	c1 := &testdaemon.Client{URL: "http://" + net.JoinHostPort("10.78.0.1", port), Transport: dialIn(sw), Timeout: 20 * time.Second}
	if s, err = c1.Login("root", testdaemon.DefaultPassword); err != nil {
		t.Fatalf("login at eth1's address: %v\n%s", err, d2.LogTail(20))
	}
	refused(t, d.Addr)
	waitFor(t, "eth2's address to stop answering", 30*time.Second, func() (bool, string) {
		_, err := nc.Login("root", testdaemon.DefaultPassword)
		return err != nil && !isXenAPI(err), fmt.Sprint(err)
	})
	if got := (&rpc{t: t, c: c1, s: s}).str("host.get_address", h); got != "10.78.0.1" {
		t.Errorf("host.address after moving to eth1: %s", got)
	}
	t.Logf("TestManagementReconfigure: %v", time.Since(begin).Round(time.Millisecond))
}

func isXenAPI(err error) bool {
	var e *testdaemon.Error
	return errors.As(err, &e)
}

// TestManagementMoveInPool: a two-host pool, each host's network module
// in its own namespace, their eth1 on one wire. The member moves its
// management interface to eth1 (the call made on the coordinator and
// forwarded to it); the old address closes and the pool goes on over the
// new one: the coordinator records the new address and sees the member
// live, a call forwarded to it runs there, a write made on the member
// reaches the coordinator, and one made on the coordinator reaches the
// member's replica.
func TestManagementMoveInPool(t *testing.T) {
	begin := time.Now()
	hostA, hostB, other := netnstest.New(t), netnstest.New(t), netnstest.New(t)
	netnstest.Veth(t, hostA, "eth1", hostB, "eth1")
	// The coordinator's end of the wire: an address toolstackd does not
	// manage, for its connections to the member's new address.
	netnstest.Exec(t, hostA, "ip", "addr", "add", "10.89.0.1/24", "dev", "eth1")

	p := pooltest.Start(t, pooltest.Options{Hosts: 2,
		Daemon: testdaemon.Options{ExtraArgs: []string{"--network-backend", "linux"}},
		HostArgs: map[int][]string{
			0: {"--network-namespace", hostA.Path()},
			1: {"--network-namespace", hostB.Path()},
		}})
	p.Join(t)
	t.Logf("pool of two after %v", time.Since(begin).Round(time.Millisecond))
	c := &testdaemon.Client{URL: "http://" + p.Addr(0)}
	s, err := c.Login("root", p.Password())
	if err != nil {
		t.Fatal(err)
	}
	r := &rpc{t: t, c: c, s: s}
	ref := map[int]string{}
	for _, h := range r.refs("host.get_all") {
		ref[p.IndexOf(r.str("host.get_address", h))] = h
	}
	a, b := ref[0], ref[1]
	if a == "" || b == "" {
		t.Fatalf("host refs by index: %v", ref)
	}
	live := func(h string) bool {
		return string(r.call("host_metrics.get_live", r.str("host.get_metrics", h))) == "true"
	}

	// Bad input on the member's side.
	r.call("PIF.scan", b) // forwarded to the member: its kernel's NICs
	eth1, rec := r.pifOf(b, "eth1")
	_, err = r.try("host.management_reconfigure", eth1)
	wantCode(t, "management_reconfigure of the member's PIF in mode None", err, "PIF_HAS_NO_NETWORK_CONFIGURATION", eth1)
	mc := &testdaemon.Client{URL: "http://" + p.Addr(1)}
	ms, err := mc.Call("session.slave_local_login_with_password", "root", p.Password())
	if err != nil {
		t.Fatal(err)
	}
	msess, _ := testdaemon.String(ms)
	_, err = mc.Call("host.management_disable", msess)
	wantCode(t, "management_disable on a member", err, "SLAVE_REQUIRES_MANAGEMENT_INTERFACE")
	_, err = mc.Call("host.local_management_reconfigure", msess, "xenbr1")
	wantCode(t, "local_management_reconfigure on a member that has its coordinator", err, "NOT_IN_EMERGENCY_MODE")

	// The move: called on the coordinator, run on the member.
	r.call("PIF.reconfigure_ip", eth1, "Static", "10.89.0.2", "255.255.255.0", "", "")
	at := time.Now()
	r.call("host.management_reconfigure", eth1)
	t.Logf("management_reconfigure of the member took %v", time.Since(at).Round(time.Millisecond))
	waitFor(t, "host.address of the member to be the new address", 30*time.Second, func() (bool, string) {
		got := r.str("host.get_address", b)
		return got == "10.89.0.2", got
	})
	if string(r.call("PIF.get_management", eth1)) != "true" {
		t.Error("the member's eth1 PIF is not management")
	}
	refused(t, p.Addr(1))
	t.Logf("the member's old address closed %v after the call", time.Since(at).Round(time.Millisecond))

	// Over the new address: a write on the coordinator reaches the
	// member's replica (raft), read there with a slave-local session
	// from the coordinator's end of the wire.
	newAddr := net.JoinHostPort("10.89.0.2", fmt.Sprint(p.Port))
	nc := &testdaemon.Client{URL: "http://" + newAddr, Transport: dialIn(hostA), Timeout: 20 * time.Second}
	raw, err := nc.Call("session.slave_local_login_with_password", "root", p.Password())
	if err != nil {
		t.Fatalf("slave-local login at the member's new address: %v\n%s", err, p.Hosts[1].LogTail(30))
	}
	ns, _ := testdaemon.String(raw)
	nr := &rpc{t: t, c: nc, s: ns}
	r.call("host.set_name_description", a, "written on the coordinator after the move")
	waitFor(t, "the coordinator's write on the member's replica", 30*time.Second, func() (bool, string) {
		got := nr.str("host.get_name_description", a)
		return got == "written on the coordinator after the move", got
	})
	// A write made on the member reaches the coordinator.
	nr.call("host.set_name_description", b, "written on the member after the move")
	waitFor(t, "the member's write on the coordinator", 30*time.Second, func() (bool, string) {
		got := r.str("host.get_name_description", b)
		return got == "written on the member after the move", got
	})
	// A call forwarded to the member runs there: a NIC added to its
	// namespace becomes a PIF of its host.
	netnstest.Veth(t, hostB, "eth2", other, "peer2")
	r.call("PIF.scan", b)
	r.pifOf(b, "eth2")
	// The member stays live: heartbeats go to the new address.
	if !live(b) {
		t.Fatal("the coordinator does not see the member live after the move")
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if !live(b) {
			t.Fatalf("the member went not live after the move\n%s", p.Hosts[0].LogTail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = rec

	// The member restarts: it serves at its remembered address again and
	// the pool goes on.
	at = time.Now()
	p.Restart(1)
	waitFor(t, "the restarted member live and replicating at its new address", 60*time.Second, func() (bool, string) {
		r.call("host.set_name_description", a, "after the member's restart")
		raw, err := nc.Call("session.slave_local_login_with_password", "root", p.Password())
		if err != nil {
			return false, err.Error()
		}
		ns, _ := testdaemon.String(raw)
		got, err := nc.Call("host.get_name_description", ns, a)
		if err != nil {
			return false, err.Error()
		}
		if s, _ := testdaemon.String(got); s != "after the member's restart" {
			return false, "member's replica: " + s
		}
		return live(b), "not live"
	})
	if got := r.str("host.get_address", b); got != "10.89.0.2" {
		t.Errorf("host.address of the member after its restart: %s", got)
	}
	t.Logf("member restarted and back in the pool after %v", time.Since(at).Round(time.Millisecond))

	// pool.management_reconfigure on the wire's network: the member is
	// there already, the coordinator moves too (its end of the wire
	// becomes its management PIF), and the pool follows it.
	network := r.str("PIF.get_network", eth1)
	_, err = r.try("pool.management_reconfigure", r.str("network.create", map[string]any{"name_label": "nowhere",
		"name_description": "", "MTU": 1500, "other_config": map[string]string{}}))
	wantCode(t, "pool.management_reconfigure of a network without PIFs", err, "PIF_NOT_PRESENT")
	r.call("PIF.scan", a)
	aeth1, _ := r.pifOf(a, "eth1")
	if got := r.str("PIF.get_network", aeth1); got != network {
		t.Fatalf("the two hosts' eth1 are on different networks: %s, %s", got, network)
	}
	_, err = r.try("pool.management_reconfigure", network)
	wantCode(t, "pool.management_reconfigure with the coordinator's PIF in mode None", err, "PIF_HAS_NO_NETWORK_CONFIGURATION", aeth1)
	r.call("PIF.reconfigure_ip", aeth1, "Static", "10.89.0.1", "255.255.255.0", "", "")
	at = time.Now()
	r.call("pool.management_reconfigure", network)
	t.Logf("pool.management_reconfigure took %v", time.Since(at).Round(time.Millisecond))
	refused(t, p.Addr(0))
	coordAddr := net.JoinHostPort("10.89.0.1", fmt.Sprint(p.Port))
	cc := &testdaemon.Client{URL: "http://" + coordAddr, Transport: dialIn(hostB), Timeout: 20 * time.Second}
	s, err = cc.Login("root", p.Password())
	if err != nil {
		t.Fatalf("login at the coordinator's new address: %v\n%s", err, p.Hosts[0].LogTail(30))
	}
	r = &rpc{t: t, c: cc, s: s}
	if got := r.str("host.get_address", a); got != "10.89.0.1" {
		t.Errorf("host.address of the coordinator: %s", got)
	}
	// The member names the coordinator at its new address, and its
	// writes reach it there.
	_, err = nc.Call("session.login_with_password", "root", p.Password())
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_SLAVE" || len(e.Params) != 1 || e.Params[0] != "10.89.0.1" {
		t.Errorf("login on the member: %v, want HOST_IS_SLAVE 10.89.0.1", err)
	}
	raw, err = nc.Call("session.slave_local_login_with_password", "root", p.Password())
	if err != nil {
		t.Fatal(err)
	}
	ns, _ = testdaemon.String(raw)
	nr = &rpc{t: t, c: nc, s: ns}
	nr.call("host.set_name_description", b, "written on the member after the coordinator moved")
	waitFor(t, "the member's write on the moved coordinator", 30*time.Second, func() (bool, string) {
		got := r.str("host.get_name_description", b)
		return got == "written on the member after the coordinator moved", got
	})
	r.call("host.set_name_description", a, "written on the moved coordinator")
	waitFor(t, "the moved coordinator's write on the member", 30*time.Second, func() (bool, string) {
		got := nr.str("host.get_name_description", a)
		return got == "written on the moved coordinator", got
	})
	if !live(b) {
		t.Error("the member is not live after the coordinator moved")
	}
	t.Logf("coordinator moved, the pool follows, after %v", time.Since(at).Round(time.Millisecond))
	t.Logf("TestManagementMoveInPool: %v", time.Since(begin).Round(time.Millisecond))
}
