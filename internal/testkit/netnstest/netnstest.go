// Package netnstest gives tests, run as root, network namespaces of
// their own to change links in, so that the host's network is never
// touched: New makes a named namespace removed when the test ends,
// Veth joins two with a pair standing in for NICs, Exec runs a command
// in one and Ping checks that an address answers from one.
//
// Namespaces are made and removed with iproute2 (`ip netns`), which
// every host toolstackd runs on has; tests skip, saying why, when it is
// missing, when they do not run as root or when the kernel refuses
// namespaces. Everything made in a namespace (links, addresses, routes)
// goes with it: removing the namespace is the whole cleanup, and it is
// registered with t.Cleanup before anything is made in it, so a test
// that fails midway leaves nothing behind.
//
// It is ordinary code, not a _test file, so that the tests of other
// packages can use it.
package netnstest

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"toolstackd/internal/network/nsrun"
)

// Prefix begins the name of every namespace New makes.
const Prefix = "tstest-"

// NICAlias is the alias Veth gives both ends of a pair so that the
// netlink implementation counts them as physical NICs.
const NICAlias = "toolstackd-nic"

// Namespace is a named network namespace made by New.
type Namespace struct {
	name string
}

// Name is the namespace's name for `ip netns` and `ip -n`.
func (ns *Namespace) Name() string { return ns.name }

// Path is the namespace's file, for netlinkx.Open.
func (ns *Namespace) Path() string { return nsDir() + "/" + ns.name }

func nsDir() string {
	if _, err := os.Stat("/run/netns"); err == nil {
		return "/run/netns"
	}
	return "/var/run/netns"
}

// Available says why namespaces cannot be made here ("" when they can).
func Available() string {
	if os.Geteuid() != 0 {
		return "not root: network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "iproute2 (ip) not installed"
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return "kernel without network namespaces: " + err.Error()
	}
	return ""
}

// New makes a fresh network namespace named Prefix plus random hex and
// removes it when the test ends; its loopback is up. It skips the test
// when namespaces cannot be made.
func New(t testing.TB) *Namespace {
	t.Helper()
	if why := Available(); why != "" {
		t.Skip("netnstest: " + why)
	}
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	ns := &Namespace{name: Prefix + hex.EncodeToString(b[:])}
	if out, err := exec.Command("ip", "netns", "add", ns.name).CombinedOutput(); err != nil { // #nosec G204 -- fixed program, generated name
		t.Skipf("netnstest: cannot make a network namespace: %v: %s", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { ns.remove(t) })
	if _, err := ns.Run("ip", "link", "set", "lo", "up"); err != nil {
		t.Fatalf("netnstest: loopback up in %s: %v", ns.name, err)
	}
	return ns
}

func (ns *Namespace) remove(t testing.TB) {
	out, err := exec.Command("ip", "netns", "delete", ns.name).CombinedOutput() // #nosec G204
	if err != nil {
		t.Errorf("netnstest: removing namespace %s: %v: %s", ns.name, err, strings.TrimSpace(string(out)))
		return
	}
	if _, err := os.Stat(ns.Path()); err == nil {
		t.Errorf("netnstest: namespace %s still there after removal", ns.name)
	}
}

// Run runs argv in the namespace (`ip netns exec`) and returns its
// combined output.
func (ns *Namespace) Run(argv ...string) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("netnstest: no command")
	}
	args := append([]string{"netns", "exec", ns.name}, argv...)
	out, err := exec.Command("ip", args...).CombinedOutput() // #nosec G204 -- test helper
	if err != nil {
		return string(out), fmt.Errorf("%s in %s: %w: %s", strings.Join(argv, " "), ns.name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Exec runs argv in ns and returns its output, failing the test if the
// command fails.
func Exec(t testing.TB, ns *Namespace, argv ...string) string {
	t.Helper()
	out, err := ns.Run(argv...)
	if err != nil {
		t.Fatalf("netnstest: %v", err)
	}
	return out
}

// Veth joins namespace a and b with a veth pair, nameA in a and nameB in
// b, both up and with the alias NICAlias, so that they stand for the
// two hosts' NICs on one wire. The pair is made directly in a and b.
func Veth(t testing.TB, a *Namespace, nameA string, b *Namespace, nameB string) {
	t.Helper()
	Exec(t, a, "ip", "link", "add", nameA, "type", "veth", "peer", "name", nameB, "netns", b.name)
	Exec(t, a, "ip", "link", "set", nameA, "alias", NICAlias, "up")
	Exec(t, b, "ip", "link", "set", nameB, "alias", NICAlias, "up")
}

// Ping checks, from inside ns, that the IPv4 address addr answers an
// ICMP echo within three seconds, failing the test if not.
func Ping(t testing.TB, ns *Namespace, addr string) {
	t.Helper()
	if rtt, err := PingErr(ns, addr, 3*time.Second); err != nil {
		t.Fatalf("netnstest: ping %s from %s: %v", addr, ns.name, err)
	} else {
		t.Logf("netnstest: ping %s from %s: %v", addr, ns.name, rtt)
	}
}

// PingErr sends ICMP echo requests to the IPv4 address addr from inside
// ns, one every 100ms, until one is answered (the round trip) or the
// time is up. It needs no ping(8): the raw socket is made by a thread
// that enters the namespace for that and leaves it; the socket stays in
// the namespace.
func PingErr(ns *Namespace, addr string, timeout time.Duration) (time.Duration, error) {
	dst := net.ParseIP(addr).To4()
	if dst == nil {
		return 0, fmt.Errorf("netnstest: %q is not an IPv4 address", addr)
	}
	fd, err := socketIn(ns.Path(), unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err != nil {
		return 0, err
	}
	defer func() { _ = unix.Close(fd) }()
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, err
	}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	to := &unix.SockaddrInet4{}
	copy(to.Addr[:], dst)
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for seq := uint16(1); time.Now().Before(deadline); seq++ {
		sent := time.Now()
		if err := unix.Sendto(fd, echo(id, seq), 0, to); err != nil {
			// No route yet, or neighbour resolution failed: try again.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for time.Since(sent) < 100*time.Millisecond {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			f, ok := from.(*unix.SockaddrInet4)
			if !ok || !net.IP(f.Addr[:]).Equal(dst) || n < 20 {
				continue
			}
			ihl := int(buf[0]&0x0f) * 4
			if n < ihl+8 {
				continue
			}
			icmp := buf[ihl:n]
			if icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id {
				return time.Since(sent), nil
			}
		}
	}
	return 0, fmt.Errorf("no answer from %s within %v", addr, timeout)
}

// echo is an ICMP echo request.
func echo(id, seq uint16) []byte {
	b := make([]byte, 8+16)
	b[0] = 8
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "toolstackd-ping!")
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(b[2:], ^uint16(sum))
	return b
}

// Socket makes a socket (unix.Socket's arguments; close-on-exec is
// added) in the namespace, for a test that needs one there.
func (ns *Namespace) Socket(domain, typ, proto int) (int, error) {
	return socketIn(ns.Path(), domain, typ, proto)
}

// socketIn makes a socket in the network namespace at path: a new
// goroutine locks its thread, enters the namespace, makes the socket and
// puts the thread back in its own namespace before unlocking it.
func socketIn(path string, domain, typ, proto int) (int, error) {
	fd := -1
	err := nsrun.Run(path, func() (err error) {
		fd, err = unix.Socket(domain, typ|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("netnstest: socket in %s: %w", path, err)
	}
	return fd, nil
}
