package network

// DHCPv6 client for PIFs in ipv6_configuration_mode DHCP.
//
// The client is ISC's dhclient in its DHCPv6 mode (`dhclient -6`, the
// Debian package isc-dhcp-client), as xapi's networkd runs it: one per
// plugged DHCPv6 PIF, on the PIF's bridge, inside the module's network
// namespace (nsenter --net=PATH when --network-namespace is set). Here it
// runs in the foreground (-d) as a child of the daemon. dhclient does the
// protocol (solicit, request, renew, rebind, confirm after a restart)
// and runs its script at every event; our script (-sf) configures
// nothing: at PREINIT6 it waits, five seconds at most, for the
// interface's link-local address to leave duplicate address detection
// (dhclient binds to it), and at every event it prints the reason and
// the lease's variables (new_ip6_address, new_ip6_prefixlen,
// new_dhcp6_name_servers, the lifetimes and the old address),
// NUL-separated after a marker, on its standard output, which is the
// daemon's pipe. Values are never interpreted by a shell: they are
// printf's arguments, never its format.
//
// The daemon reads the reports (bounded like udhcpc's: maxLeaseField
// bytes a field, a fixed number of fields a record), checks them
// (ParseLease6: an address that is not a global unicast IPv6 address,
// a prefix length outside minPrefix6..128, an address that is its
// subnet's anycast address, a DNS server that is not a global unicast
// IPv6 address or more of them than maxLeaseList, a lifetime that does
// not parse: the whole report is refused with a log line and nothing is
// applied) and applies the lease itself (dhcp6clients.go).
//
// Files: the lease file (which also holds the client's DUID, so that a
// restarted client asks for the same address) is
// <lease dir>/dhclient6-<device>.leases; the pid file, dhclient's
// configuration and the script are in the run directory. Paths built
// from the device name go through safepath and stay in their directory.
// Stopping the client for good (Release) first ends it with SIGTERM,
// which makes dhclient stop without releasing, then runs `dhclient -6
// -r` on the same lease file, which sends the server a Release.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"toolstackd/internal/safepath"
)

// Bounds and names of what the DHCPv6 client reports.
const (
	lease6Marker = "toolstackd-lease6-v1"
	lease6Fields = 8 // fields after the marker
	// minPrefix6 is the shortest prefix a lease may put on an
	// interface: shorter ones would claim a large share of the address
	// space as on-link. dhclient's own default is 128.
	minPrefix6 = 16
	// release6Timeout bounds `dhclient -6 -r` (the server may be gone).
	release6Timeout = 5 * time.Second
	// DHCP6Package names what to install for DHCPv6 on PIFs.
	DHCP6Package = "isc-dhcp-client"
)

// dhclient's events (its "reason").
const (
	ev6Preinit = "PREINIT6"
	ev6Bound   = "BOUND6"
	ev6Renew   = "RENEW6"
	ev6Rebind  = "REBIND6"
	ev6Depref  = "DEPREF6"
	ev6Expire  = "EXPIRE6"
	ev6Release = "RELEASE6"
	ev6Stop    = "STOP6"
)

// Lease6 is one event of the DHCPv6 client with the lease it carries.
type Lease6 struct {
	// Event is dhclient's reason: BOUND6, RENEW6, REBIND6 (an address to
	// apply), EXPIRE6, RELEASE6, STOP6 (the address is lost), PREINIT6
	// or DEPREF6 (nothing to do).
	Event string
	// Addr and PrefixLen are the leased address (new_ip6_address,
	// new_ip6_prefixlen).
	Addr      net.IP
	PrefixLen int
	DNS       []net.IP
	// ValidLife and PreferredLife are the address's lifetimes in
	// seconds (0 when not given).
	ValidLife, PreferredLife uint32
	// Old is the address the event replaces or loses, when given.
	Old       net.IP
	OldPrefix int
}

// HasAddress says the event carries an address to apply.
func (l Lease6) HasAddress() bool {
	return l.Event == ev6Bound || l.Event == ev6Renew || l.Event == ev6Rebind
}

// Lost says the event takes the address away.
func (l Lease6) Lost() bool {
	return l.Event == ev6Expire || l.Event == ev6Release || l.Event == ev6Stop
}

// CIDR is the address as xapi writes it in PIF.IPv6: "address/prefix".
func (l Lease6) CIDR() string { return l.Addr.String() + "/" + strconv.Itoa(l.PrefixLen) }

// Net is the address with its prefix, for the interface.
func (l Lease6) Net() net.IPNet {
	return net.IPNet{IP: l.Addr, Mask: net.CIDRMask(l.PrefixLen, 8*net.IPv6len)}
}

// unicast6 reads one global unicast IPv6 address written plainly: no
// zone, not an IPv4 or IPv4-mapped address, not link-local, multicast,
// loopback or unspecified.
func unicast6(s string) (net.IP, bool) {
	if !strings.Contains(s, ":") || strings.ContainsAny(s, "%/ ") || len(s) > 45 {
		return nil, false
	}
	ip := net.ParseIP(s)
	if ip == nil || ip.To4() != nil || !ip.IsGlobalUnicast() {
		return nil, false
	}
	return ip, true
}

// prefix6 reads a prefix length: decimal digits only, minPrefix6..128.
func prefix6(s string) (int, bool) {
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil || n < minPrefix6 || n > 128 {
		return 0, false
	}
	return int(n), true
}

func lifetime(what, s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("dhcp6: %s %q does not parse", what, trunc(s))
	}
	return uint32(n), nil
}

// anycastOf says addr is the Subnet-Router anycast address of its
// prefix (all host bits zero), which is never an interface's own.
func anycastOf(addr net.IP, prefix int) bool {
	return prefix < 127 && addr.Equal(addr.Mask(net.CIDRMask(prefix, 128)))
}

// ParseLease6 checks one report of the client script: the reason, then
// new_ip6_address, new_ip6_prefixlen, new_dhcp6_name_servers,
// new_max_life, new_preferred_life, old_ip6_address and
// old_ip6_prefixlen as dhclient sets them. Anything that does not parse
// refuses the whole report.
func ParseLease6(fields []string) (Lease6, error) {
	if len(fields) != lease6Fields {
		return Lease6{}, fmt.Errorf("dhcp6: %d fields in a report, want %d", len(fields), lease6Fields)
	}
	l := Lease6{Event: fields[0]}
	switch l.Event {
	case ev6Preinit, ev6Depref:
		return l, nil
	case ev6Expire, ev6Release, ev6Stop:
		if fields[6] != "" {
			var ok bool
			if l.Old, ok = unicast6(fields[6]); !ok {
				return Lease6{}, fmt.Errorf("dhcp6: old address %q is not a global unicast IPv6 address", trunc(fields[6]))
			}
			if l.OldPrefix, ok = prefix6(fields[7]); !ok {
				return Lease6{}, fmt.Errorf("dhcp6: old prefix length %q is not %d..128", trunc(fields[7]), minPrefix6)
			}
		}
		return l, nil
	case ev6Bound, ev6Renew, ev6Rebind:
	default:
		return Lease6{}, fmt.Errorf("dhcp6: unknown event %q", trunc(l.Event))
	}
	var ok bool
	if l.Addr, ok = unicast6(fields[1]); !ok {
		return Lease6{}, fmt.Errorf("dhcp6: address %q is not a global unicast IPv6 address", trunc(fields[1]))
	}
	if l.PrefixLen, ok = prefix6(fields[2]); !ok {
		return Lease6{}, fmt.Errorf("dhcp6: prefix length %q is not %d..128", trunc(fields[2]), minPrefix6)
	}
	if anycastOf(l.Addr, l.PrefixLen) {
		return Lease6{}, fmt.Errorf("dhcp6: address %s is the anycast address of its /%d", l.Addr, l.PrefixLen)
	}
	var err error
	if l.DNS, err = ipList("DNS server", fields[3], unicast6, "a global unicast IPv6 address"); err != nil {
		return Lease6{}, fmt.Errorf("dhcp6: %w", err)
	}
	if l.ValidLife, err = lifetime("valid lifetime", fields[4]); err != nil {
		return Lease6{}, err
	}
	if l.PreferredLife, err = lifetime("preferred lifetime", fields[5]); err != nil {
		return Lease6{}, err
	}
	if l.PreferredLife > l.ValidLife && l.ValidLife != 0 {
		return Lease6{}, fmt.Errorf("dhcp6: preferred lifetime %d beyond the valid lifetime %d", l.PreferredLife, l.ValidLife)
	}
	return l, nil
}

// readRecords reads NUL-ended tokens from r and gives each record of n
// fields found after marker to record; a record with a field longer
// than maxLeaseField is dropped (record gets an error). Tokens outside a
// record (the client's own output) are skipped whatever their length,
// keeping only the tail where a marker may begin.
func readRecords(r io.Reader, marker string, n int, record func([]string, error)) error {
	br := bufio.NewReaderSize(r, 4096)
	var fields []string
	in := false
	for {
		tok, over, err := readToken(br, maxLeaseField, len(marker)+1)
		if err != nil {
			return err
		}
		if !in {
			// An overlong token keeps its tail, so a marker after the
			// client's own text is still found.
			if tok == marker || strings.HasSuffix(tok, "\n"+marker) {
				in, fields = true, fields[:0]
			}
			continue
		}
		if over {
			in = false
			record(nil, fmt.Errorf("dhcp6: a field longer than %d bytes: report dropped", maxLeaseField))
			continue
		}
		fields = append(fields, tok)
		if len(fields) == n {
			in = false
			record(fields, nil)
		}
	}
}

// readToken reads up to the next NUL (or the end). A token longer than
// limit is consumed whole and reported over, with its last keep bytes.
func readToken(br *bufio.Reader, limit, keep int) (string, bool, error) {
	var cur []byte
	over := false
	for {
		chunk, err := br.ReadSlice(0)
		cur = append(cur, chunk...)
		if len(cur) > limit+1 {
			over = true
			cur = append(cur[:0:0], cur[len(cur)-keep-1:]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return "", false, err // at the end, an unfinished token is dropped
		}
		return string(bytes.TrimSuffix(cur, []byte{0})), over, nil
	}
}

// ReadReports6 reads the DHCPv6 client's output and gives each report,
// with ParseLease6's verdict, to report. It returns at the end of r.
func ReadReports6(r io.Reader, report func(Lease6, error)) error {
	err := readRecords(r, lease6Marker, lease6Fields, func(f []string, err error) {
		if err != nil {
			report(Lease6{}, err)
			return
		}
		report(ParseLease6(f))
	})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// report6Script is the -sf script: it waits for the link-local address
// at PREINIT6, then reports; it changes nothing.
const report6Script = `#!/bin/sh
# toolstackd's DHCPv6 report script (internal/network/dhcp6.go): it
# configures nothing; the daemon checks and applies what it prints.
if [ "$reason" = PREINIT6 ]; then
	i=0
	until [ "$i" -ge 50 ] || grep -Eq "^fe80[0-9a-f]{28} [0-9a-f]+ [0-9a-f]+ 20 [0-389ab][0-9a-f] +$interface\$" /proc/net/if_inet6; do
		sleep 0.1
		i=$((i + 1))
	done
fi
printf '` + lease6Marker + `\0%s\0%s\0%s\0%s\0%s\0%s\0%s\0%s\0' "$reason" "$new_ip6_address" "$new_ip6_prefixlen" \
	"$new_dhcp6_name_servers" "$new_max_life" "$new_preferred_life" "$old_ip6_address" "$old_ip6_prefixlen"
`

// dhclient6Conf is dhclient's configuration: the distribution's
// /etc/dhcp/dhclient.conf is not read.
const dhclient6Conf = `# toolstackd: dhclient -6 for PIFs in DHCP mode (internal/network/dhcp6.go).
request dhcp6.name-servers, dhcp6.domain-search;
`

// Dhclient runs ISC dhclient for DHCPv6.
type Dhclient struct {
	// Path is dhclient's.
	Path string
	// Namespace is the network namespace's path ("" for the daemon's).
	Namespace string
	leaseDir  string
	runDir    string
}

// dhclientPaths are where Debian installs dhclient, for a daemon whose
// PATH has no sbin.
var dhclientPaths = []string{"/usr/sbin/dhclient", "/sbin/dhclient"}

// FindDhclient finds dhclient (and nsenter when a namespace is given)
// and prepares its files: leases in leaseDir, the pid files, the
// configuration and the report script in runDir (both made 0700 if
// missing). Without dhclient the error names the package to install.
func FindDhclient(namespace, leaseDir, runDir string) (*Dhclient, error) {
	path, err := exec.LookPath("dhclient")
	if err != nil {
		for _, p := range dhclientPaths {
			if st, e := os.Stat(p); e == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				path, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("no DHCPv6 client: dhclient is not installed (Debian package %s)", DHCP6Package)
	}
	if namespace != "" {
		if _, err := exec.LookPath("nsenter"); err != nil {
			return nil, fmt.Errorf("no DHCPv6 client in namespace %s: nsenter (util-linux) is not available", namespace)
		}
	}
	for _, d := range []string{leaseDir, runDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("dhcp6: %w", err)
		}
	}
	// #nosec G306 -- dhclient executes it; only root may write its directory.
	if err := os.WriteFile(filepath.Join(runDir, "dhclient6-report"), []byte(report6Script), 0o700); err != nil {
		return nil, fmt.Errorf("dhcp6: %w", err)
	}
	if err := os.WriteFile(filepath.Join(runDir, "dhclient6.conf"), []byte(dhclient6Conf), 0o600); err != nil {
		return nil, fmt.Errorf("dhcp6: %w", err)
	}
	return &Dhclient{Path: path, Namespace: namespace, leaseDir: leaseDir, runDir: runDir}, nil
}

// Close removes the script and the configuration; the lease files stay
// for the next start.
func (c *Dhclient) Close() error {
	return errors.Join(os.Remove(filepath.Join(c.runDir, "dhclient6-report")), os.Remove(filepath.Join(c.runDir, "dhclient6.conf")))
}

// files are dev's lease file and pid file (that of the client, or of
// the releasing run).
func (c *Dhclient) files(dev string, release bool) (lease, pid string, err error) {
	if lease, err = safepath.JoinName(c.leaseDir, "dhclient6-"+dev+".leases"); err != nil {
		return "", "", err
	}
	name := "dhclient6-" + dev + ".pid"
	if release {
		name = "dhclient6-" + dev + ".release.pid"
	}
	pid, err = safepath.JoinName(c.runDir, name)
	return lease, pid, err
}

// command is dhclient -6 in the foreground on dev with our files, extra
// (-r) first.
func (c *Dhclient) command(ctx context.Context, dev string, release bool) (*exec.Cmd, string, error) {
	if dev == "" || strings.HasPrefix(dev, "-") {
		return nil, "", fmt.Errorf("dhcp6: %q is not a device dhclient can be given", dev)
	}
	lease, pid, err := c.files(dev, release)
	if err != nil {
		return nil, "", err
	}
	// A pid file left by a client that died with the daemon names a pid
	// that may since be another process's: dhclient -r would signal it.
	_ = os.Remove(pid)
	args := []string{c.Path, "-6", "-d", "-sf", filepath.Join(c.runDir, "dhclient6-report"), "-cf", filepath.Join(c.runDir, "dhclient6.conf"),
		"-pf", pid, "-lf", lease}
	if release {
		args = append(args, "-r")
	}
	args = append(args, dev)
	if c.Namespace != "" {
		args = append([]string{"nsenter", "--net=" + c.Namespace, "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...) // #nosec G204 -- fixed program; dev is the PIF's bridge, never a shell's
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Second
	return cmd, pid, nil
}

// tail keeps the last bytes written to it (dhclient's messages, for the
// error when it exits).
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 512 {
		t.buf = append(t.buf[:0:0], t.buf[len(t.buf)-512:]...)
	}
	return len(p), nil
}

func (t *tail) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// Run runs dhclient -6 on dev until ctx ends (SIGTERM, which stops it
// without releasing, so that a restart keeps the address; SIGKILL after
// 3 s) or the client exits; every report goes to report.
func (c *Dhclient) Run(ctx context.Context, dev string, report func(Lease6, error)) error {
	cmd, pid, err := c.command(ctx, dev, false)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(pid) }()
	var errs tail
	cmd.Stderr = &errs
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting dhclient: %w", err)
	}
	_ = ReadReports6(out, report)
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the script, if left
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("dhclient -6 on %s exited: %v: %s", dev, err, errs.last())
}

// Release sends the server a Release for dev's lease (dhclient -6 -r on
// its lease file), waiting release6Timeout at most. The client on dev
// must have ended.
func (c *Dhclient) Release(ctx context.Context, dev string) error {
	ctx, cancel := context.WithTimeout(ctx, release6Timeout)
	defer cancel()
	cmd, pid, err := c.command(ctx, dev, true)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(pid) }()
	var errs tail
	cmd.Stderr, cmd.Stdout = &errs, io.Discard
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("dhclient -6 -r on %s: %v: %s", dev, err, errs.last())
	}
	return nil
}
