package ovs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/safepath"
	"toolstackd/internal/xerr"
)

// VIF locking without OVN: the rules of flows.go written with ovs-ofctl,
// as xenopsd's vif scripts do, to the bridge's management socket
// (<RunDir>/<bridge>.mgmt). Each change of a VIF's rules is one
// `ovs-ofctl --bundle add-flows`: the VIF's old rules deleted by cookie
// and its new ones added in one OpenFlow bundle, which ovs-vswitchd
// applies whole or not at all, so a VIF whose locking changes is never
// open in between.
//
// The switch keeps, per VIF, the port it last plugged and the rules it
// wrote (Switch.vifs), and writes nothing when they would not change. A
// VIF's port records its locking in its Port row's external_ids
// (PortExternalIDs), from which Open writes every bridge's rules again,
// in one bundle per bridge replacing all of toolstackd's there: the
// rules follow the ports across a restart of the daemon, and rules left
// by a port that is gone are removed.

// DefaultRunDir is where Debian's ovs-vswitchd keeps the bridges'
// management sockets.
const DefaultRunDir = "/var/run/openvswitch"

// maxOfctlOutput bounds what is kept of ovs-ofctl's output (for errors).
const maxOfctlOutput = 4096

// ofctl runs ovs-ofctl against the bridges of one ovs-vswitchd.
type ofctl struct {
	path    string // "" when not installed
	rundir  string
	timeout time.Duration
}

// OfctlMissing is the reason given when ovs-ofctl is not installed and a
// VIF must be locked or disabled without OVN.
const OfctlMissing = "ovs-ofctl is not installed (Debian package openvswitch-switch)"

// errNoOfctl refuses a VIF that must be locked or disabled when ovs-ofctl
// is missing (rather than leave it open): a XenAPI INTERNAL_ERROR naming
// what is missing.
func errNoOfctl(vif, mode string) error {
	return xerr.New(xerr.InternalError, fmt.Sprintf(
		"%s must be %s, and Open vSwitch cannot enforce VIF locking on this host: %s; install it or use OVN mode (--ovn-nb)",
		vif, mode, OfctlMissing))
}

// runDir is where ovs-vswitchd keeps its sockets: Config.RunDir, else the
// directory of the database's unix socket (ovs-vswitchd and ovsdb-server
// share one), else DefaultRunDir.
func runDir(cfg Config) string {
	if cfg.RunDir != "" {
		return cfg.RunDir
	}
	if path, ok := strings.CutPrefix(cfg.DB, "unix:"); ok {
		return filepath.Dir(path)
	}
	return DefaultRunDir
}

// findOfctl is the ovs-ofctl to run: Config.Ofctl ("none": none), else
// the one on PATH; "" when there is none.
func findOfctl(cfg Config) string {
	switch cfg.Ofctl {
	case "none":
		return ""
	case "":
		p, err := exec.LookPath("ovs-ofctl")
		if err != nil {
			return ""
		}
		return p
	}
	if _, err := exec.LookPath(cfg.Ofctl); err != nil {
		return ""
	}
	return cfg.Ofctl
}

// limited keeps the first max bytes written to it.
type limited struct {
	b   bytes.Buffer
	max int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.max - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// run runs ovs-ofctl on bridge's management socket: args before the
// target, rest after it, stdin as its input.
func (o ofctl) run(ctx context.Context, bridge, stdin string, args []string, rest ...string) error {
	if o.path == "" {
		return errors.New("ovs: " + OfctlMissing)
	}
	if err := safepath.Name(bridge); err != nil || strings.HasPrefix(bridge, "-") {
		return fmt.Errorf("ovs: bridge name %q", bridge)
	}
	sock, err := safepath.JoinName(o.rundir, bridge+".mgmt")
	if err != nil {
		return fmt.Errorf("ovs: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	secs := int(math.Ceil(o.timeout.Seconds()))
	argv := append([]string{"--timeout=" + strconv.Itoa(secs)}, args...)
	argv = append(argv, "unix:"+sock)
	argv = append(argv, rest...)
	cmd := exec.CommandContext(ctx, o.path, argv...) // #nosec G204 -- ovs-ofctl with a checked socket path and flows built from typed values
	cmd.Stdin = strings.NewReader(stdin)
	out := &limited{max: maxOfctlOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (no answer from ovs-vswitchd within %v)", err, o.timeout)
		}
		return fmt.Errorf("ovs: ovs-ofctl %s on bridge %s: %w: %s", strings.Join(args, " "), bridge, err, strings.TrimSpace(out.b.String()))
	}
	return nil
}

// writeFlows replaces on bridge the rules of the VIFs given (by cookie)
// with theirs, or, with all, every rule of toolstackd's there.
func (o ofctl) writeFlows(ctx context.Context, bridge string, all bool, vifs map[uint64][]string) error {
	return o.run(ctx, bridge, bundle(all, vifs), []string{"--bundle", "add-flows"}, "-")
}

// vifLock is what the switch wrote for one VIF without OVN.
type vifLock struct {
	port   network.VIFPort // as last plugged; Tap is the tap carrying it
	bridge string          // where its rules are; "" when it has none
	flows  []string
	down   bool // its tap was set down (disabled)
}

// ofportOf waits (up to Config.Timeout) until ovs-vswitchd has given the
// port tap its OpenFlow number, and returns it.
func (s *Switch) ofportOf(ctx context.Context, tap string) (int, error) {
	deadline := time.Now().Add(s.cfg.Timeout)
	for {
		st, err := s.state()
		if err != nil {
			return 0, err
		}
		if p, ok := st.ports[tap]; ok && len(p.Interfaces) == 1 {
			i := st.ifaces[p.Interfaces[0]]
			if i.OFPort != nil && *i.OFPort > 0 {
				return *i.OFPort, nil
			}
			if i.OFPort != nil && *i.OFPort < 0 {
				why := "no reason given"
				if i.Error != nil {
					why = *i.Error
				}
				return 0, fmt.Errorf("ovs: ovs-vswitchd could not add port %s: %s", tap, why)
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("ovs: port %s has no OpenFlow number after %v", tap, s.cfg.Timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// lockLocked makes the rules of the VIF p, carried by tap (a port of
// p.Bridge by now), what its locking says: nothing in OVN mode (OVN
// enforces port_security), else the rules written when they change,
// the tap set down for a disabled VIF and up again after. Called with
// s.mu held.
func (s *Switch) lockLocked(ctx context.Context, p network.VIFPort, tap string) error {
	if s.nb != nil {
		return nil
	}
	cur := s.vifs[p.VIF]
	if cur == nil {
		cur = &vifLock{}
	}
	var flows []string
	if p.Mode == locking.ModeLocked || p.Mode == locking.ModeDisabled {
		if s.of.path == "" {
			return errNoOfctl("VIF "+p.VIF, p.Mode)
		}
		ofport, err := s.ofportOf(ctx, tap)
		if err != nil {
			return err
		}
		if flows, err = LockingFlows(p, ofport); err != nil {
			return err
		}
	}
	cookie, err := VIFCookie(p.VIF)
	if err != nil {
		return err
	}
	disabled := p.Mode == locking.ModeDisabled
	// Closing comes first: the tap goes down before its rules change,
	// and comes up only after they are written.
	if disabled {
		if err := s.Links.SetDown(tap); err != nil {
			return fmt.Errorf("ovs: setting the tap %s of disabled VIF %s down: %w", tap, p.VIF, err)
		}
		cur.down = true
	}
	if cur.bridge != "" && cur.bridge != p.Bridge {
		if err := s.of.writeFlows(ctx, cur.bridge, false, map[uint64][]string{cookie: nil}); err != nil {
			return err
		}
		cur.bridge, cur.flows = "", nil
	}
	if (cur.bridge != "" || len(flows) > 0) && (cur.bridge != p.Bridge || !slices.Equal(cur.flows, flows)) {
		if err := s.of.writeFlows(ctx, p.Bridge, false, map[uint64][]string{cookie: flows}); err != nil {
			return err
		}
	}
	cur.bridge, cur.flows = p.Bridge, flows
	if len(flows) == 0 {
		cur.bridge = ""
	}
	if !disabled && cur.down {
		if err := s.Links.SetUp(tap); err != nil {
			return fmt.Errorf("ovs: setting the tap %s of VIF %s up: %w", tap, p.VIF, err)
		}
		cur.down = false
	}
	cur.port = p
	cur.port.Tap = tap
	s.vifs[p.VIF] = cur
	return nil
}

// dropFlowsLocked removes the rules of the VIF whose port tap is, if the
// switch wrote any (the port is leaving its bridge). Called with s.mu
// held.
func (s *Switch) dropFlowsLocked(ctx context.Context, tap string) error {
	for vif, l := range s.vifs {
		if l.port.Tap != tap || l.bridge == "" {
			continue
		}
		cookie, err := VIFCookie(vif)
		if err != nil {
			return err
		}
		if err := s.of.writeFlows(ctx, l.bridge, false, map[uint64][]string{cookie: nil}); err != nil {
			return err
		}
		l.bridge, l.flows = "", nil
	}
	return nil
}

// reapplyLocking writes every bridge's rules again from the locking its
// VIFs' ports record (Open, at start-up): one bundle per bridge of ours,
// replacing all of toolstackd's rules there; disabled VIFs' taps are set
// down. Without ovs-ofctl, ports recorded as locked or disabled are
// logged as not enforced.
func (s *Switch) reapplyLocking(ctx context.Context) error {
	if s.nb != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.state()
	if err != nil {
		return err
	}
	perBridge := map[string]map[uint64][]string{}
	var errs []error
	for name, b := range st.bridges {
		if ours(b.ExternalIDs, ownBridge) {
			perBridge[name] = map[uint64][]string{}
		}
	}
	for name, port := range st.ports {
		br := st.portBridge[name]
		if perBridge[br] == nil || !ours(port.ExternalIDs, ownVIF) || len(port.Interfaces) != 1 {
			continue
		}
		p, ok := recordedPort(port.ExternalIDs, st.ifaces[port.Interfaces[0]].ExternalIDs)
		if !ok || p.Mode == locking.ModeUnlocked {
			continue
		}
		p.Bridge, p.Tap = br, name
		if s.of.path == "" {
			s.log.Error("ovs: a VIF's port is recorded as locked or disabled, and ovs-ofctl is missing: its locking is not enforced",
				"vif", p.VIF, "port", name, "mode", p.Mode, "missing", OfctlMissing)
			continue
		}
		i := st.ifaces[port.Interfaces[0]]
		if i.OFPort == nil || *i.OFPort <= 0 {
			errs = append(errs, fmt.Errorf("ovs: VIF %s: port %s has no OpenFlow number", p.VIF, name))
			continue
		}
		flows, err := LockingFlows(p, *i.OFPort)
		cookie, cerr := VIFCookie(p.VIF)
		if err != nil || cerr != nil {
			errs = append(errs, errors.Join(err, cerr))
			continue
		}
		l := &vifLock{port: p, bridge: br, flows: flows}
		if p.Mode == locking.ModeDisabled {
			if err := s.Links.SetDown(name); err != nil {
				errs = append(errs, fmt.Errorf("ovs: setting the tap %s of disabled VIF %s down: %w", name, p.VIF, err))
			}
			l.down = true
		}
		perBridge[br][cookie] = flows
		s.vifs[p.VIF] = l
	}
	if s.of.path == "" {
		return errors.Join(errs...)
	}
	for br, vifs := range perBridge {
		if err := s.of.writeFlows(ctx, br, true, vifs); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Apply is the network module's Locker call once a VM backend's tap is
// the VIF's port (network.Config.Locker is the switch with this
// backend): the rules were written with the port (PlugVIF), so the port
// is plugged again as last known, with the locking r says; that is a
// no-op unless the tap was made again since (a domain's reboot) and lost
// its port's identity or rules. In OVN mode it does nothing.
func (s *Switch) Apply(r locking.Rules) error {
	if s.nb != nil {
		return nil
	}
	if r.Mode != locking.ModeUnlocked && s.of.path == "" {
		return errNoOfctl("the VIF of tap "+r.Port, r.Mode)
	}
	s.mu.Lock()
	var p network.VIFPort
	found := false
	for _, l := range s.vifs {
		if l.port.Tap == r.Port {
			p, found = l.port, true
			break
		}
	}
	s.mu.Unlock()
	if !found {
		return nil
	}
	p.Mode = r.Mode
	if r.MAC != nil {
		p.MAC = r.MAC
	}
	if r.Mode == locking.ModeLocked {
		p.IPv4, p.IPv6 = r.IPv4, r.IPv6
	}
	return s.PlugVIF(context.Background(), p)
}

// Remove is the network module's Locker call when a VIF's tap goes: its
// rules go (its port is left to the module's Delete of the tap).
func (s *Switch) Remove(port string) error {
	if s.nb != nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropFlowsLocked(context.Background(), port)
}

var _ network.Locker = (*Switch)(nil)
