package network

// DHCP client for PIFs in ip_configuration_mode DHCP.
//
// The client is BusyBox's udhcpc, run in the foreground (-f) as a child
// of the daemon, one per plugged DHCP PIF, inside the module's network
// namespace (nsenter --net=PATH when --network-namespace is set). udhcpc
// does the protocol (discover, request, renew, rebind) and runs a script
// at every event; our script configures nothing: it prints the event and
// the lease's variables, NUL-separated after a marker, on its standard
// output. The daemon reads them (bounded: each field at most
// maxLeaseField bytes, a record at most maxLeaseFields fields), checks
// them (ParseLease: an address that is not a unicast IPv4 address, a
// mask that is not contiguous, more routers or DNS servers than a lease
// may carry, a lease time that does not parse: the whole lease is
// refused with a log line and nothing is applied), and applies the lease
// itself through Links (dhcpclients.go). Values are never interpreted by
// a shell: the script passes them to printf as arguments, never as its
// format.

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
	"syscall"
	"time"
)

// Bounds of what a client may report.
const (
	leaseMarker    = "toolstackd-lease-v1"
	maxLeaseField  = 1024 // bytes in one field
	maxLeaseFields = 8    // fields after the marker
	maxLeaseList   = 8    // routers or DNS servers kept
)

// Lease is one event of a DHCP client with the lease it carries.
type Lease struct {
	// Event is udhcpc's: "bound", "renew" (IP set), "deconfig" (drop the
	// address), "leasefail" or "nak" (nothing to do).
	Event   string
	IP      net.IP
	Mask    net.IPMask
	Routers []net.IP
	DNS     []net.IP
	// Seconds is the lease time.
	Seconds uint32
}

// HasAddress says the event carries an address to apply.
func (l Lease) HasAddress() bool { return l.Event == "bound" || l.Event == "renew" }

func unicast4(s string) (net.IP, bool) {
	if strings.ContainsAny(s, ":") {
		return nil, false
	}
	ip := net.ParseIP(s).To4()
	if ip == nil || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.Equal(net.IPv4bcast) {
		return nil, false
	}
	return ip, true
}

// ipList reads a space-separated list of at most maxLeaseList
// addresses of a lease, each accepted by parse (kind names what it wants
// in the error).
func ipList(what, s string, parse func(string) (net.IP, bool), kind string) ([]net.IP, error) {
	var out []net.IP
	for _, f := range strings.Fields(s) {
		if len(out) == maxLeaseList {
			return nil, fmt.Errorf("more than %d %s", maxLeaseList, what)
		}
		ip, ok := parse(f)
		if !ok {
			return nil, fmt.Errorf("%s %q is not %s", what, trunc(f), kind)
		}
		out = append(out, ip)
	}
	return out, nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// ParseLease checks one report of the client script: the event, then
// ip, subnet, router, dns and lease as udhcpc sets them. Anything that
// does not parse refuses the whole report.
func ParseLease(fields []string) (Lease, error) {
	if len(fields) != 6 {
		return Lease{}, fmt.Errorf("dhcp: %d fields in a report, want 6", len(fields))
	}
	l := Lease{Event: fields[0]}
	switch l.Event {
	case "deconfig", "leasefail", "nak":
		return l, nil
	case "bound", "renew":
	default:
		return Lease{}, fmt.Errorf("dhcp: unknown event %q", trunc(l.Event))
	}
	var ok bool
	if l.IP, ok = unicast4(fields[1]); !ok {
		return Lease{}, fmt.Errorf("dhcp: address %q is not a unicast IPv4 address", trunc(fields[1]))
	}
	m := net.ParseIP(fields[2]).To4()
	if m == nil || strings.Contains(fields[2], ":") {
		return Lease{}, fmt.Errorf("dhcp: subnet mask %q does not parse", trunc(fields[2]))
	}
	if ones, bits := net.IPMask(m).Size(); bits != 32 || ones < 1 {
		return Lease{}, fmt.Errorf("dhcp: subnet mask %q is not contiguous", fields[2])
	}
	l.Mask = net.IPMask(m)
	if n := (&net.IPNet{IP: l.IP.Mask(l.Mask), Mask: l.Mask}); l.IP.Equal(n.IP) && !isHostMask(l.Mask) {
		return Lease{}, fmt.Errorf("dhcp: address %s is its subnet's network address", l.IP)
	}
	var err error
	if l.Routers, err = ipList("router", fields[3], unicast4, "a unicast IPv4 address"); err != nil {
		return Lease{}, fmt.Errorf("dhcp: %w", err)
	}
	if l.DNS, err = ipList("DNS server", fields[4], unicast4, "a unicast IPv4 address"); err != nil {
		return Lease{}, fmt.Errorf("dhcp: %w", err)
	}
	if fields[5] != "" {
		n, err := strconv.ParseUint(fields[5], 10, 32)
		if err != nil {
			return Lease{}, fmt.Errorf("dhcp: lease time %q does not parse", trunc(fields[5]))
		}
		l.Seconds = uint32(n)
	}
	return l, nil
}

func isHostMask(m net.IPMask) bool { ones, _ := m.Size(); return ones >= 31 }

// ReadReports reads the client's output: everything but the records
// after the marker is ignored; a record with an overlong field is
// dropped. Each record is given to report with ParseLease's verdict.
func ReadReports(r io.Reader, report func(Lease, error)) error {
	br := bufio.NewReaderSize(r, 4096)
	var fields []string
	in, skipping := false, false
	var cur []byte
	for {
		chunk, err := br.ReadSlice(0)
		if len(chunk) > 0 {
			switch {
			case len(cur)+len(chunk) > maxLeaseField+1 && !in:
				// Text of udhcpc's own: keep the tail, where a marker
				// may begin.
				cur = append(cur, chunk...)
				cur = append(cur[:0:0], cur[len(cur)-len(leaseMarker)-2:]...)
			case len(cur)+len(chunk) > maxLeaseField+1:
				skipping, cur = true, cur[:0]
			case !skipping:
				cur = append(cur, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return err
		}
		// One token, ended by NUL.
		tok := string(bytes.TrimSuffix(cur, []byte{0}))
		over := skipping
		cur, skipping = cur[:0], false
		if !in {
			if !over && (tok == leaseMarker || strings.HasSuffix(tok, "\n"+leaseMarker)) {
				in, fields = true, fields[:0]
			}
			continue
		}
		if over {
			in = false
			report(Lease{}, fmt.Errorf("dhcp: a field longer than %d bytes: report dropped", maxLeaseField))
			continue
		}
		fields = append(fields, tok)
		if len(fields) == 6 {
			in = false
			report(ParseLease(fields))
		}
	}
}

// Udhcpc runs BusyBox's udhcpc.
type Udhcpc struct {
	Busybox string
	// Namespace is the network namespace's path ("" for the daemon's).
	Namespace string
	dir       string
}

// FindUdhcpc checks that busybox at path has udhcpc (and nsenter is
// there when a namespace is given) and writes the report script into a
// private directory; Close removes it.
func FindUdhcpc(busybox, namespace string) (*Udhcpc, error) {
	out, err := exec.Command(busybox, "udhcpc", "--help").CombinedOutput()
	if !bytes.Contains(out, []byte("udhcpc")) {
		return nil, fmt.Errorf("no DHCP client: %s udhcpc (BusyBox) is not available: %v", busybox, err)
	}
	if namespace != "" {
		if _, err := exec.LookPath("nsenter"); err != nil {
			return nil, fmt.Errorf("no DHCP client in namespace %s: nsenter (util-linux) is not available", namespace)
		}
	}
	dir, err := os.MkdirTemp("", "toolstackd-dhcp-")
	if err != nil {
		return nil, err
	}
	script := "#!" + busybox + " sh\nprintf '" + leaseMarker + `\0%s\0%s\0%s\0%s\0%s\0%s\0' "$1" "$ip" "$subnet" "$router" "$dns" "$lease"` + "\n"
	// #nosec G306 -- udhcpc executes it; its directory is private (0700).
	if err := os.WriteFile(filepath.Join(dir, "report"), []byte(script), 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Udhcpc{Busybox: busybox, Namespace: namespace, dir: dir}, nil
}

// Close removes the script.
func (u *Udhcpc) Close() error { return os.RemoveAll(u.dir) }

// Run runs udhcpc on dev until ctx ends (SIGTERM, then SIGKILL after 3
// s; the address is not released, so that a restart keeps it) or the
// client exits; every report goes to report. request asks for that
// address again (the one the device has), when not nil.
func (u *Udhcpc) Run(ctx context.Context, dev string, request net.IP, report func(Lease, error)) error {
	args := []string{u.Busybox, "udhcpc", "-f", "-i", dev, "-s", filepath.Join(u.dir, "report"), "-t", "5", "-T", "2", "-A", "5"}
	if request != nil {
		args = append(args, "-r", request.String())
	}
	if u.Namespace != "" {
		args = append([]string{"nsenter", "--net=" + u.Namespace, "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...) // #nosec G204 -- fixed program; dev and request are the PIF's own, never a shell's
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Second
	cmd.Stderr = io.Discard
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting udhcpc: %w", err)
	}
	_ = ReadReports(out, report)
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the script, if left
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("udhcpc on %s exited: %v", dev, err)
}
