// Package pooltest runs a pool of real toolstackd processes on loopback for
// the pool's tier-2 tests: several hosts on one machine, a fault proxy in
// front of each (so that the links between hosts can be cut, delayed or
// broken), clients that keep reading and writing while hosts are killed,
// paused and partitioned, and the judge (internal/testkit/lincheck) that says
// whether what the clients saw is linearizable and whether any
// acknowledged write was lost. Like internal/testkit/testdaemon it is ordinary
// (non-test) code so that test packages anywhere can import it; nothing in
// the daemon imports it.
//
// # Addresses
//
// Host i (0, 1, 2, ...) listens on 127.0.0.(i+2); all hosts use one port,
// free on every address involved (testdaemon.FreePort), so a pool of three
// on port P is 127.0.0.2:P, 127.0.0.3:P and 127.0.0.4:P. With
// Options.Proxy, a faultproxy.Link puts a proxy in front of each host on
// 127.0.1.(i+2):P, forwarding to 127.0.0.(i+2):P, and the host is started
// with --advertise 127.0.1.(i+2):P, the address the other hosts reach it
// at. A host binds its outgoing pool connections to its own 127.0.0.(i+2),
// so the proxies tell the peers apart by source address; the members of
// the Link are named by Name(i) ("h0", "h1", ...), so that
//
//	p.Link.Isolate(pooltest.Name(p.Coordinator(t, 30*time.Second)))
//
// cuts the coordinator off. The test's own clients talk to the hosts'
// listen addresses directly (from 127.0.0.1, which no fault touches), as
// the clients of etcd's robustness tests do: faults are between hosts.
//
// # Starting and joining
//
// Start runs Options.Hosts standalone hosts and returns when each answers.
// Join makes every host but the first join the first (pool.join with the
// first host's advertised address) and waits until the coordinator lists
// every host as live. TryJoin is the same without failing the test, for
// tests that must skip while the daemon has no pool support.
//
// # Faults on hosts
//
// Kill (SIGKILL), Restart (a new process, same data dir and address),
// Stop (SIGSTOP) and Cont (SIGCONT) act on a host by index; Coordinator
// finds the host that accepts a root login now, following HOST_IS_SLAVE.
// Everything the pool started (processes, proxies) ends when the test
// ends.
//
// # Clients
//
// Client makes JSON-RPC and XML-RPC calls with a context, a timeout on
// every call and a bound on every reply, optionally from a chosen source
// address (NewClient(HostIP(1)) looks, to the proxies, like host 1).
// XenAPI failures are *testdaemon.Error, as with testdaemon's client;
// NotSent tells a call that never left (the connection was refused) from
// one whose fate is unknown.
//
// # Workload
//
// Workload runs concurrent clients doing reads and writes on keys mapped
// to XenAPI calls (see Workload) and records every operation in a
// lincheck.Recorder; Check then runs porcupine and the lost-write check on
// the final state.
package pooltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/faultproxy"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
)

// MaxHosts bounds Options.Hosts: the addresses 127.0.0.2 to 127.0.0.(MaxHosts+1)
// must exist on the loopback device, and every host is a real process.
const MaxHosts = 64

// Default bounds.
const (
	// DefaultJoinTimeout bounds one pool.join call.
	DefaultJoinTimeout = 60 * time.Second
	// LiveTimeout is how long a joined host may take to be listed live
	// by the coordinator (the contract says 30 s).
	LiveTimeout = 30 * time.Second
)

// Options say how to run a pool.
type Options struct {
	// Hosts is how many toolstackd processes; 0 means 3.
	Hosts int
	// Proxy puts a fault proxy in front of every host and starts each
	// with --advertise set to its proxy's address.
	Proxy bool
	// NoAdvertise, with Proxy, leaves --advertise out: the proxies run
	// but the hosts do not know them. It is for checking the proxies
	// against a daemon that has no pool support.
	NoAdvertise bool
	// HostArgs are flags for one host only (by index), after the others.
	HostArgs map[int][]string
	// Daemon is how every host runs (Backend, ExtraArgs, Password,
	// timeouts...); Start sets each host's Listen and Binary, and
	// defaults Backend to "simulator", Password to
	// testdaemon.DefaultPassword and StartTimeout to 30 s.
	Daemon testdaemon.Options
}

// Pool is a set of toolstackd processes started by Start.
type Pool struct {
	// Hosts are the processes, by index. Restart replaces an entry: read
	// it from the test's goroutine, or use the addresses, which never
	// change.
	Hosts []*testdaemon.Daemon
	// Link is the fault proxies in front of the hosts; nil without
	// Options.Proxy.
	Link *faultproxy.Link
	// Port is the port every host and proxy listens on.
	Port int

	opts   Options
	listen []string // host i's listen address
	advert []string // host i's advertised address (the proxy's, or listen)

	mu       sync.Mutex
	lastCoor int // the index Coordinator found last
}

// HostIP is the address host i listens on, 127.0.0.(i+2).
func HostIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 2)}) }

// ProxyIP is the address of the proxy in front of host i, 127.0.1.(i+2).
func ProxyIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 2)}) }

// Name is host i's name in the Link: "h0", "h1", ...
func Name(i int) string { return "h" + strconv.Itoa(i) }

// Start runs o.Hosts standalone toolstackd processes, with their proxies
// when o.Proxy, and returns once each accepts connections. It fails the
// test if any does not start. Everything stops when the test ends.
func Start(t testing.TB, o Options) *Pool {
	t.Helper()
	if o.Hosts == 0 {
		o.Hosts = 3
	}
	if o.Hosts < 1 || o.Hosts > MaxHosts {
		t.Fatalf("pooltest: %d hosts (1 to %d)", o.Hosts, MaxHosts)
	}
	if o.Daemon.Backend == "" {
		o.Daemon.Backend = "simulator"
	}
	if o.Daemon.Password == "" {
		o.Daemon.Password = testdaemon.DefaultPassword
	}
	if o.Daemon.StartTimeout <= 0 {
		o.Daemon.StartTimeout = 30 * time.Second
	}
	if o.Daemon.StopTimeout <= 0 {
		o.Daemon.StopTimeout = 15 * time.Second
	}
	ips := make([]string, 0, 2*o.Hosts)
	for i := range o.Hosts {
		ips = append(ips, HostIP(i).String())
		if o.Proxy {
			ips = append(ips, ProxyIP(i).String())
		}
	}
	p := &Pool{Port: testdaemon.FreePort(t, ips...), opts: o}
	for i := range o.Hosts {
		p.listen = append(p.listen, testdaemon.Addr(HostIP(i).String(), p.Port))
		if o.Proxy {
			p.advert = append(p.advert, testdaemon.Addr(ProxyIP(i).String(), p.Port))
		} else {
			p.advert = append(p.advert, p.listen[i])
		}
	}
	if o.Proxy {
		members := make([]faultproxy.Member, o.Hosts)
		for i := range members {
			members[i] = faultproxy.Member{Name: Name(i), Source: HostIP(i), Listen: p.advert[i], Target: p.listen[i]}
		}
		link, err := faultproxy.NewLink(members, faultproxy.Config{KeepSource: true, MaxConns: 512})
		if err != nil {
			t.Fatalf("pooltest: fault proxies: %v", err)
		}
		t.Cleanup(func() { _ = link.Close() }) // after the daemons (cleanups run last first)
		p.Link = link
	}
	bin := testdaemon.Build(t)
	for i := range o.Hosts {
		do := o.Daemon
		do.Listen, do.Binary, do.ExtraArgs = p.listen[i], bin, nil
		if o.Proxy && !o.NoAdvertise {
			do.ExtraArgs = append(do.ExtraArgs, "--advertise", p.advert[i])
		}
		do.ExtraArgs = append(do.ExtraArgs, o.Daemon.ExtraArgs...)
		do.ExtraArgs = append(do.ExtraArgs, o.HostArgs[i]...)
		d := testdaemon.Start(t, do)
		p.Hosts = append(p.Hosts, d)
	}
	return p
}

// DaemonHasFlag reports whether the toolstackd binary under test knows
// the command-line flag (e.g. "--advertise"), from its --help. Pool tests
// use it to skip, rather than fail, on a daemon without pool support.
func DaemonHasFlag(t testing.TB, flag string) bool {
	t.Helper()
	bin := testdaemon.Build(t) // may take minutes on a loaded machine: not under the timeout
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--help").CombinedOutput() //nolint:gosec // the test's own daemon
	if err != nil {
		t.Fatalf("toolstackd --help: %v\n%s", err, out)
	}
	for _, f := range strings.Fields(string(out)) {
		if strings.TrimSuffix(f, ",") == flag {
			return true
		}
	}
	return false
}

// Len is the number of hosts.
func (p *Pool) Len() int { return len(p.listen) }

// Addr is host i's listen address (where the test's clients call it).
func (p *Pool) Addr(i int) string { return p.listen[i] }

// Advertised is the address the other hosts reach host i at: its proxy's
// with Options.Proxy, its listen address otherwise.
func (p *Pool) Advertised(i int) string { return p.advert[i] }

// Password is root's password on every host.
func (p *Pool) Password() string { return p.opts.Daemon.Password }

// IndexOf is the index of the host an address names: its listen or
// advertised address, with or without the port (a missing port is the
// pool's), as HOST_IS_SLAVE gives it. -1 when no host has it.
func (p *Pool) IndexOf(addr string) int {
	addr = strings.TrimSpace(addr)
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = strings.Trim(addr, "[]"), strconv.Itoa(p.Port)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || port != strconv.Itoa(p.Port) {
		return -1
	}
	ip = ip.Unmap()
	for i := range p.listen {
		if ip == HostIP(i) || (p.opts.Proxy && ip == ProxyIP(i)) {
			return i
		}
	}
	return -1
}

// Kill sends SIGKILL to host i and waits until it is gone.
func (p *Pool) Kill(i int) { p.Hosts[i].Kill() }

// Restart starts host i again (same data dir, address and password),
// stopping it first if it still runs, and waits until it accepts
// connections. Call it from the test's goroutine: it fails the test if the
// host does not start.
func (p *Pool) Restart(i int) { p.Hosts[i] = p.Hosts[i].Restart() }

// Stop freezes host i (SIGSTOP); Cont thaws it.
func (p *Pool) Stop(i int) error { return p.Hosts[i].Signal(syscall.SIGSTOP) }

// Cont thaws host i (SIGCONT).
func (p *Pool) Cont(i int) error { return p.Hosts[i].Signal(syscall.SIGCONT) }

// errNoCoordinator is FindCoordinator's error when no host accepted a
// login in the time given.
var errNoCoordinator = errors.New("pooltest: no host accepted a root login")

// FindCoordinator returns the index of a host that accepts a root login
// now, and the session it gave. It starts with the host found last, goes
// where HOST_IS_SLAVE points, and tries the other hosts on any other
// answer; it retries until ctx ends.
func (p *Pool) FindCoordinator(ctx context.Context, c *Client) (int, string, error) {
	p.mu.Lock()
	start := p.lastCoor
	p.mu.Unlock()
	var last error
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		next := start
		for range 2 * p.Len() { // a bounded walk: each redirect or failure is one step
			s, err := c.CallString(ctx, p.listen[next], "session.login_with_password", "root", p.opts.Daemon.Password, "1.0", c.originator())
			if err == nil {
				p.mu.Lock()
				p.lastCoor = next
				p.mu.Unlock()
				return next, s, nil
			}
			last = err
			if e, ok := testdaemon.AsError(err); ok && e.Code == xerr.HostIsSlave && len(e.Params) > 0 {
				if j := p.IndexOf(e.Params[0]); j >= 0 && j != next {
					next = j
					continue
				}
			}
			next = (next + 1) % p.Len()
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
	return -1, "", fmt.Errorf("%w (last: %v)", errNoCoordinator, last)
}

// Coordinator returns the index of the host that accepts a root login,
// waiting up to timeout; it fails the test when none does.
func (p *Pool) Coordinator(t testing.TB, timeout time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	i, _, err := p.FindCoordinator(ctx, NewClient(netip.Addr{}))
	if err != nil {
		t.Fatalf("coordinator within %v: %v", timeout, err)
	}
	return i
}

// Login logs root in on host i itself (no redirect followed).
func (p *Pool) Login(ctx context.Context, c *Client, i int) (string, error) {
	return c.CallString(ctx, p.listen[i], "session.login_with_password", "root", p.opts.Daemon.Password, "1.0", c.originator())
}

// LocalLogin opens a session on host i's own replica
// (session.slave_local_login_with_password).
func (p *Pool) LocalLogin(ctx context.Context, c *Client, i int) (string, error) {
	return c.CallString(ctx, p.listen[i], "session.slave_local_login_with_password", "root", p.opts.Daemon.Password)
}

// JoinOne makes host i join host 0: a root login on host i and
// pool.join(session, host 0's advertised address, "root", password). It
// returns the daemon's answer as is (NOT_IMPLEMENTED on a daemon without
// pools) and does not wait for liveness.
func (p *Pool) JoinOne(ctx context.Context, i int) error {
	c := NewClient(netip.Addr{})
	defer c.CloseIdle()
	c.Timeout = DefaultJoinTimeout
	s, err := p.Login(ctx, c, i)
	if err != nil {
		return fmt.Errorf("login on host %d: %w", i, err)
	}
	if _, err := c.Call(ctx, p.listen[i], "pool.join", s, p.advert[0], "root", p.opts.Daemon.Password); err != nil {
		return fmt.Errorf("host %d joining %s: %w", i, p.advert[0], err)
	}
	return nil
}

// TryJoin makes every host but the first join the first, one after the
// other, then waits until the coordinator lists all of them live (see
// WaitLive). It stops at the first error.
func (p *Pool) TryJoin(ctx context.Context) error {
	for i := 1; i < p.Len(); i++ {
		if err := p.JoinOne(ctx, i); err != nil {
			return err
		}
	}
	lctx, cancel := context.WithTimeout(ctx, LiveTimeout)
	defer cancel()
	return p.WaitLive(lctx, p.Len())
}

// Join is TryJoin failing the test on an error.
func (p *Pool) Join(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(p.Len())*DefaultJoinTimeout+LiveTimeout)
	defer cancel()
	if err := p.TryJoin(ctx); err != nil {
		t.Fatalf("pooltest: join: %v", err)
	}
}

// WaitLive waits until the coordinator's host.get_all lists n hosts and
// host_metrics.live is true for each, or ctx ends.
func (p *Pool) WaitLive(ctx context.Context, n int) error {
	return p.waitLiveness(ctx, func(live map[int]bool) error {
		if up := count(live, true); up != n {
			return fmt.Errorf("%d of %d hosts live (not live: %v)", up, n, hostsWith(live, false))
		}
		return nil
	})
}

// WaitNotLive waits until the coordinator records host i as not live.
func (p *Pool) WaitNotLive(ctx context.Context, i int) error {
	return p.waitLiveness(ctx, func(live map[int]bool) error {
		if l, ok := live[i]; !ok || l {
			return fmt.Errorf("host %d is recorded live", i)
		}
		return nil
	})
}

// waitLiveness asks the coordinator, every 200 ms until ctx ends, which
// hosts it records as live (by index), until done accepts the answer.
func (p *Pool) waitLiveness(ctx context.Context, done func(map[int]bool) error) error {
	c := NewClient(netip.Addr{})
	defer c.CloseIdle()
	c.Timeout = 5 * time.Second
	var last error
	coor, sess := -1, ""
	for {
		if coor < 0 {
			var err error
			if coor, sess, err = p.FindCoordinator(ctx, c); err != nil {
				return fmt.Errorf("pooltest: hosts not live: %w", err)
			}
		}
		live, err := p.liveness(ctx, c, p.listen[coor], sess)
		if err == nil {
			if last = done(live); last == nil {
				return nil
			}
		} else {
			last, coor = err, -1 // find the coordinator again
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pooltest: hosts not live: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// count is how many entries of m are v.
func count(m map[int]bool, v bool) int {
	n := 0
	for _, x := range m {
		if x == v {
			n++
		}
	}
	return n
}

// hostsWith lists, in order, the indexes whose entry in m is v.
func hostsWith(m map[int]bool, v bool) []int {
	var out []int
	for i, x := range m {
		if x == v {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// liveness reads, from the coordinator at addr, whether it records each
// host as live, by the host's index (-1-k for the k-th host with an
// address of no host here).
func (p *Pool) liveness(ctx context.Context, c *Client, addr, s string) (map[int]bool, error) {
	raw, err := c.Call(ctx, addr, "host.get_all", s)
	if err != nil {
		return nil, err
	}
	var hosts []string
	if err := json.Unmarshal(raw, &hosts); err != nil {
		return nil, fmt.Errorf("host.get_all: %.200s", raw)
	}
	live := map[int]bool{}
	for k, h := range hosts {
		m, err := c.CallString(ctx, addr, "host.get_metrics", s, h)
		if err != nil {
			return nil, err
		}
		raw, err := c.Call(ctx, addr, "host_metrics.get_live", s, m)
		if err != nil {
			return nil, err
		}
		a, err := c.CallString(ctx, addr, "host.get_address", s, h)
		if err != nil {
			return nil, err
		}
		i := p.IndexOf(a)
		if i < 0 {
			i = -1 - k
		}
		live[i] = string(raw) == "true"
	}
	return live, nil
}
