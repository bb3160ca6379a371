package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"slices"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// Config is what the Manager needs.
type Config struct {
	// Links is the kernel (netlinkx in the daemon, a Recorder in tests).
	Links Links
	// Server is the XenAPI server the messages are registered on; its
	// database is the one planned from.
	Server *api.Server
	// HostRef is this host.
	HostRef string
	Log     *slog.Logger
	// DHCP, when set, runs a DHCP client on a device for a PIF in DHCP
	// mode. When nil (and DHCPClient is nil), PIF.reconfigure_ip to DHCP
	// is refused with PIF_CONFIGURATION_ERROR saying so.
	DHCP func(ctx context.Context, dev string) error
	// DHCPClient, when set, is the DHCP client the module keeps running
	// for every plugged DHCP PIF and whose leases it applies
	// (dhcpclients.go); DHCP is then the module's own.
	DHCPClient DHCPRunner
	// DHCPMissing says why there is no DHCP client, for the refusal.
	DHCPMissing string
	// DHCP6Client, when set, is the DHCPv6 client the module keeps
	// running for every plugged PIF in ipv6_configuration_mode DHCP
	// (dhcp6clients.go); without it reconfigure_ipv6 to DHCP is refused
	// with DHCP6Missing's reason.
	DHCP6Client  DHCP6Runner
	DHCP6Missing string
	// Locker, when set, enforces VIF locking on taps (lock.go); without
	// it a VIF that must be locked or disabled is refused.
	Locker Locker
	// VIFPorts, when set, takes each VIF EnsureVIF serves as a port of
	// its own (the Open vSwitch backend, vifport.go).
	VIFPorts VIFPorts
}

// Manager makes this host's share of the pool's networks real and keeps
// it so: Apply reconciles the kernel with the database, the XenAPI
// handlers change both together, EnsureVIF and Release serve the VM
// lifecycle.
type Manager struct {
	cfg Config
	db  *db.DB
	log *slog.Logger

	mu    sync.Mutex // one change at a time
	extra map[string]map[string]bool
	// applied is the last plan a reconcile made real in full (under mu),
	// whichever path applied it: Watch compares with it, so that a plan
	// another path applied from an older snapshot (a VIF released while
	// its VM still showed running) is made again once the database moves.
	applied *Plan

	// locked are the VIFs whose taps have locking rules (lock.go).
	lockMu sync.Mutex
	locked map[string]lockedVIF
	// ports are the VIFs Config.VIFPorts has ports for (vifport.go).
	ports map[string]pluggedVIF
	// dhcp are the DHCP clients of this host's PIFs (dhcpclients.go).
	dhcp *dhcpClients
	// dhcp6 are their DHCPv6 clients (dhcp6clients.go).
	dhcp6 *dhcp6Clients
}

// New makes a Manager without registering its messages (Register does
// both).
func New(cfg Config) (*Manager, error) {
	if cfg.Links == nil || cfg.Server == nil || cfg.HostRef == "" {
		return nil, errors.New("network: Links, Server and HostRef are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &Manager{cfg: cfg, db: cfg.Server.DB, log: cfg.Log, extra: map[string]map[string]bool{},
		locked: map[string]lockedVIF{}}
	if cfg.DHCPClient != nil {
		m.dhcp = newDHCPClients(m, cfg.DHCPClient)
		m.cfg.DHCP = m.startDHCP
	}
	if cfg.DHCP6Client != nil {
		m.dhcp6 = newDHCP6Clients(m, cfg.DHCP6Client)
	}
	return m, nil
}

func (m *Manager) extras() map[string]bool {
	out := map[string]bool{}
	for n, why := range m.extra {
		if len(why) > 0 {
			out[n] = true
		}
	}
	return out
}

// applyChanged applies the database's plan when it differs from the last
// one applied in full.
func (m *Manager) applyChanged(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := Compute(m.db.Snapshot(), m.cfg.HostRef, m.extras())
	if m.applied != nil && reflect.DeepEqual(p, m.applied) {
		return nil
	}
	return m.applyPlanLocked(ctx, p)
}

// plan is the kernel state the database asks of this host now (the
// tests read it; Watch compares with m.applied under the lock).
func (m *Manager) plan() *Plan {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Compute(m.db.Snapshot(), m.cfg.HostRef, m.extras())
}

// Apply reconciles the kernel with the database: what is missing is
// made, MTUs, masters and addresses are fixed, links of ours no longer
// wanted are removed, and nothing else is touched; what already matches
// is left as it is, so that Apply at start-up disturbs nothing. A part
// that fails (one bridge with its ports, one bond, one VLAN) is undone
// and the rest goes on; the first error is returned as a XenAPI error.
func (m *Manager) Apply(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.applyLocked(ctx)
}

func (m *Manager) applyLocked(ctx context.Context) error {
	return m.applyPlanLocked(ctx, Compute(m.db.Snapshot(), m.cfg.HostRef, m.extras()))
}

// applyPlanLocked reconciles the kernel with p, part by part, and warns
// of the PIFs p leaves out.
func (m *Manager) applyPlanLocked(ctx context.Context, p *Plan) error {
	_, err := m.reconcile(ctx, p, nil, true)
	for _, e := range p.Errors {
		m.log.Warn("network: PIF left out", "pif", e.PIF, "err", e.Err)
	}
	return err
}

// errDryRun ends the transaction that only plans a change.
var errDryRun = errors.New("network: dry run")

// change makes a database change and its kernel counterpart together:
// the plan is computed from the database as it would be after mutate,
// the kernel is changed, and only then is mutate committed. When the
// kernel fails, what was made is undone, the kernel is put back as the
// database says, and the database is not changed. recreate names links
// of ours to remove first so that they are made again (a bond's mode).
func (m *Manager) change(ctx context.Context, mutate func(tx *db.Tx) error, recreate ...string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	before := map[string]bool{}
	for _, e := range Compute(m.db.Snapshot(), m.cfg.HostRef, m.extras()).Errors {
		before[e.Err.Error()] = true
	}
	var p *Plan
	_, err := m.db.Update(func(tx *db.Tx) error {
		if err := mutate(tx); err != nil {
			return err
		}
		p = Compute(tx, m.cfg.HostRef, m.extras())
		return errDryRun
	})
	if !errors.Is(err, errDryRun) {
		return err
	}
	for _, e := range p.Errors {
		if !before[e.Err.Error()] {
			return e.Err // the change itself cannot be made
		}
	}
	if j, err := m.reconcile(ctx, p, recreate, false); err != nil {
		m.undo(j)
		if rerr := m.applyLocked(ctx); rerr != nil {
			m.log.Warn("network: restoring the kernel after a failed change", "err", rerr)
		}
		return err
	}
	if _, err := m.db.Update(mutate); err != nil {
		if rerr := m.applyLocked(ctx); rerr != nil {
			m.log.Warn("network: restoring the kernel after a failed commit", "err", rerr)
		}
		return err
	}
	return nil
}

// journal is the inverse of what one reconcile made, newest last.
type journal []func() error

func (m *Manager) undo(j journal) {
	for i := len(j) - 1; i >= 0; i-- {
		if err := j[i](); err != nil {
			m.log.Warn("network: rollback step failed", "err", err)
		}
	}
}

// kernelErr turns a Links failure into the XenAPI error a client sees:
// a missing kernel feature is named as such.
func kernelErr(what string, err error) error {
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return xe
	}
	if errors.Is(err, ErrUnsupported) {
		return xerr.New(xerr.InternalError, fmt.Sprintf("%s: the kernel of this host cannot do it (%v)", what, err))
	}
	return xerr.New(xerr.InternalError, fmt.Sprintf("%s: %v", what, err))
}

// reconciler is one reconcile run.
type reconciler struct {
	m     *Manager
	l     Links
	links map[string]Link
	j     journal
}

func (r *reconciler) do(undo func() error, what string, f func() error) error {
	if err := f(); err != nil {
		return kernelErr(what, err)
	}
	if undo != nil {
		r.j = append(r.j, undo)
	}
	return nil
}

func (r *reconciler) refresh() error {
	ls, err := r.l.List()
	if err != nil {
		return kernelErr("listing links", err)
	}
	r.links = make(map[string]Link, len(ls))
	for _, l := range ls {
		r.links[l.Name] = l
	}
	return nil
}

// reconcile makes the kernel as p says. With partial, a part that fails
// is undone and the others go on (start-up); without, the first failure
// stops it and the journal of everything made is returned for the
// caller to undo.
func (m *Manager) reconcile(_ context.Context, p *Plan, recreate []string, partial bool) (journal, error) {
	r := &reconciler{m: m, l: m.cfg.Links}
	if err := r.refresh(); err != nil {
		return nil, err
	}
	if err := r.remove(p, recreate); err != nil {
		return nil, err
	}
	var first error
	var all journal
	step := func(f func() error) bool {
		r.j = nil
		err := f()
		if err == nil {
			all = append(all, r.j...)
			return true
		}
		if first == nil {
			first = err
		}
		if partial {
			m.undo(r.j)
			_ = r.refresh()
			return true
		}
		all = append(all, r.j...)
		return false
	}
	// The links, each kind before the kinds made on top of it.
	if !stepEach(step, p.Up, r.up) || !stepEach(step, p.Bonds, r.bond) || !stepEach(step, p.VLANs, r.vlan) ||
		!stepEach(step, p.VXLANs, r.vxlan) || !stepEach(step, p.Bridges, r.bridge) {
		return all, first
	}
	for _, fam := range []struct {
		n     int
		addrs map[string][]net.IPNet
		gw    *Gateway
	}{{4, p.Addrs, p.Gateway}, {6, p.Addrs6, p.Gateway6}} {
		for _, c := range slices.Sorted(maps.Keys(fam.addrs)) {
			if !step(func() error { return r.addrs(c, fam.n, fam.addrs[c]) }) {
				return all, first
			}
		}
		if fam.gw != nil {
			step(func() error { return r.gateway(fam.n, fam.gw) })
		}
	}
	for _, d := range slices.Sorted(maps.Keys(p.GRO)) {
		if !step(func() error { return r.gro(d, p.GRO[d]) }) {
			return all, first
		}
	}
	if first == nil {
		m.applied = p
	} else {
		m.applied = nil
	}
	return all, first
}

// stepEach runs do on each item in turn through step (reconcile's), and
// reports false as soon as step does.
func stepEach[T any](step func(func() error) bool, items []T, do func(T) error) bool {
	for _, it := range items {
		if !step(func() error { return do(it) }) {
			return false
		}
	}
	return true
}

// remove deletes the links of ours the plan no longer has and frees
// adopted NICs from masters that no longer want them.
func (r *reconciler) remove(p *Plan, recreate []string) error {
	wanted := map[string]bool{}
	master := map[string]string{} // port or member -> wanted master
	for _, b := range p.Bridges {
		wanted[b.Name] = true
		for _, d := range b.Ports {
			master[d] = b.Name
		}
	}
	for _, b := range p.Bonds {
		wanted[b.Name] = true
		for _, d := range b.Members {
			master[d] = b.Name
		}
	}
	for _, v := range p.VLANs {
		wanted[v.Name] = true
	}
	for _, v := range p.VXLANs {
		wanted[v.Name] = true
	}
	for _, n := range recreate {
		if l, ok := r.links[n]; ok && l.Ours {
			if err := r.l.Delete(n); err != nil {
				return kernelErr("removing "+n, err)
			}
		}
	}
	if len(recreate) > 0 {
		if err := r.refresh(); err != nil {
			return err
		}
	}
	gone := map[string]bool{}
	for _, kind := range []string{"vxlan", "vlan", "bond", "bridge"} {
		for _, l := range sortedLinks(r.links) {
			if l.Kind != kind || !l.Ours || wanted[l.Name] || gone[l.Name] {
				continue
			}
			if err := r.l.Delete(l.Name); err != nil {
				return kernelErr("removing "+l.Name, err)
			}
			gone[l.Name] = true
		}
	}
	for _, l := range sortedLinks(r.links) {
		if !l.Ours || !l.Physical || l.Master == "" || gone[l.Master] || master[l.Name] != "" {
			continue
		}
		if m, ok := r.links[l.Master]; !ok || !m.Ours {
			continue
		}
		if err := r.l.SetMaster(l.Name, ""); err != nil {
			return kernelErr("freeing "+l.Name, err)
		}
	}
	return r.refresh()
}

func sortedLinks(m map[string]Link) []Link {
	out := make([]Link, 0, len(m))
	for _, l := range m {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Link) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// own makes sure a NIC exists and is ours (adopting it).
func (r *reconciler) own(name string) (Link, error) {
	l, ok := r.links[name]
	if !ok {
		return l, xerr.New(xerr.PIFConfigurationError, name, "no network device "+name+" on this host")
	}
	if !l.Ours {
		if err := r.do(func() error { return r.l.Disown(name) }, "adopting "+name, func() error { return r.l.Adopt(name) }); err != nil {
			return l, err
		}
		l.Ours = true
		r.links[name] = l
	}
	return l, nil
}

func (r *reconciler) setUp(name string) error {
	if l, ok := r.links[name]; ok && l.Up {
		return nil
	}
	if err := r.do(func() error { return r.l.SetDown(name) }, "bringing up "+name, func() error { return r.l.SetUp(name) }); err != nil {
		return err
	}
	l := r.links[name]
	l.Up = true
	r.links[name] = l
	return nil
}

func (r *reconciler) setMTU(name string, mtu int) error {
	l := r.links[name]
	if l.MTU == mtu || mtu <= 0 {
		return nil
	}
	old := l.MTU
	if err := r.do(func() error { return r.l.SetMTU(name, old) }, fmt.Sprintf("setting the MTU of %s to %d", name, mtu),
		func() error { return r.l.SetMTU(name, mtu) }); err != nil {
		return err
	}
	l.MTU = mtu
	r.links[name] = l
	return nil
}

func (r *reconciler) setMaster(dev, master string) error {
	l := r.links[dev]
	if l.Master == master {
		return nil
	}
	old := l.Master
	if err := r.do(func() error { return r.l.SetMaster(dev, old) }, "putting "+dev+" in "+master,
		func() error { return r.l.SetMaster(dev, master) }); err != nil {
		return err
	}
	l.Master = master
	r.links[dev] = l
	return nil
}

// up brings up a NIC a VLAN sits on; one that is up is not touched.
func (r *reconciler) up(name string) error {
	l, ok := r.links[name]
	if !ok {
		return xerr.New(xerr.PIFConfigurationError, name, "no network device "+name+" on this host")
	}
	if l.Up {
		return nil
	}
	if _, err := r.own(name); err != nil {
		return err
	}
	return r.setUp(name)
}

func (r *reconciler) made(name string, l Link) {
	l.Name, l.Ours = name, true
	r.links[name] = l
}

func (r *reconciler) bond(b Bond) error {
	if l, ok := r.links[b.Name]; !ok {
		if err := r.do(func() error { return r.l.Delete(b.Name) }, "making bond "+b.Name,
			func() error { return r.l.AddBond(b.Name, b.Mode, b.Props, b.MTU) }); err != nil {
			return err
		}
		r.made(b.Name, Link{Kind: "bond", MTU: b.MTU})
	} else if !l.Ours || l.Kind != "bond" {
		return xerr.New(xerr.PIFConfigurationError, b.Name, "a link "+b.Name+" not made by toolstackd exists")
	} else if err := r.setMTU(b.Name, b.MTU); err != nil {
		return err
	}
	if l := r.links[b.Name]; b.MAC != nil && l.MAC.String() != b.MAC.String() {
		old := l.MAC
		undo := func() error { return nil }
		if old != nil {
			undo = func() error { return r.l.SetMAC(b.Name, old) }
		}
		if err := r.do(undo, "setting the MAC of "+b.Name, func() error { return r.l.SetMAC(b.Name, b.MAC) }); err != nil {
			return err
		}
		l.MAC = b.MAC
		r.links[b.Name] = l
	}
	for _, d := range b.Members {
		if _, err := r.own(d); err != nil {
			return err
		}
		if err := r.setMaster(d, b.Name); err != nil {
			return err
		}
	}
	return r.setUp(b.Name)
}

func (r *reconciler) vlan(v VLAN) error {
	if l, ok := r.links[v.Name]; !ok {
		if err := r.do(func() error { return r.l.Delete(v.Name) }, "making VLAN "+v.Name,
			func() error { return r.l.AddVLAN(v.Name, v.Parent, v.Tag, v.MTU) }); err != nil {
			return err
		}
		r.made(v.Name, Link{Kind: "vlan", Parent: v.Parent, Tag: v.Tag, MTU: v.MTU})
	} else if !l.Ours || l.Kind != "vlan" {
		return xerr.New(xerr.VLANInUse, v.Parent, fmt.Sprint(v.Tag))
	} else if err := r.setMTU(v.Name, v.MTU); err != nil {
		return err
	}
	return r.setUp(v.Name)
}

func (r *reconciler) vxlan(v VXLAN) error {
	if l, ok := r.links[v.Name]; !ok {
		if err := r.do(func() error { return r.l.Delete(v.Name) }, "making VXLAN link "+v.Name,
			func() error { return r.l.AddVXLAN(v.Name, v.VNI, v.Local, v.Remote, 0, "", v.MTU) }); err != nil {
			return err
		}
		r.made(v.Name, Link{Kind: "vxlan", Tag: v.VNI, MTU: v.MTU})
	} else if !l.Ours || l.Kind != "vxlan" {
		return xerr.New(xerr.PIFConfigurationError, v.Name, "a link "+v.Name+" not made by toolstackd exists")
	} else if err := r.setMTU(v.Name, v.MTU); err != nil {
		return err
	}
	return r.setUp(v.Name)
}

func (r *reconciler) bridge(b Bridge) error {
	l, ok := r.links[b.Name]
	switch {
	case !ok:
		if err := r.do(func() error { return r.l.Delete(b.Name) }, "making bridge "+b.Name,
			func() error { return r.l.AddBridge(b.Name, b.MTU) }); err != nil {
			return err
		}
		r.made(b.Name, Link{Kind: "bridge", MTU: b.MTU})
	case l.Kind != "bridge":
		return xerr.New(xerr.BridgeNotAvailable, b.Name)
	case l.Ours:
		if err := r.setMTU(b.Name, b.MTU); err != nil {
			return err
		}
	}
	if r.links[b.Name].Ours {
		if err := r.setUp(b.Name); err != nil {
			return err
		}
	}
	for _, d := range b.Ports {
		pl, err := r.own(d)
		if err != nil {
			return err
		}
		if pl.Physical {
			if err := r.setMTU(d, b.MTU); err != nil {
				return err
			}
		}
		if err := r.setMaster(d, b.Name); err != nil {
			return err
		}
		if pl.Physical {
			if err := r.moveAddrs(d, b.Name); err != nil {
				return err
			}
		}
		if err := r.setUp(d); err != nil {
			return err
		}
	}
	return nil
}

// moveAddrs hands the addresses and default routes of a NIC just put in
// a bridge to the bridge, where Linux wants them (the management NIC
// the operator plugged).
func (r *reconciler) moveAddrs(nic, br string) error {
	for _, fam := range []int{4, 6} {
		have, err := r.l.Addrs(nic, fam)
		if err != nil {
			return kernelErr("reading the addresses of "+nic, err)
		}
		var move []net.IPNet
		for _, a := range have {
			if fam == 6 && a.IP.IsLinkLocalUnicast() {
				continue
			}
			move = append(move, a)
		}
		if len(move) == 0 {
			continue
		}
		on, err := r.l.Addrs(br, fam)
		if err != nil {
			return kernelErr("reading the addresses of "+br, err)
		}
		fam := fam
		if err := r.do(func() error { return r.l.ReplaceAddrs(br, fam, on) }, "moving the addresses of "+nic+" to "+br,
			func() error { return r.l.ReplaceAddrs(br, fam, append(slices.Clone(on), move...)) }); err != nil {
			return err
		}
		if err := r.do(func() error { return r.l.ReplaceAddrs(nic, fam, have) }, "removing the addresses of "+nic,
			func() error { return r.l.ReplaceAddrs(nic, fam, nil) }); err != nil {
			return err
		}
		gw, dev, err := r.l.DefaultGateway(fam)
		if err == nil && gw != nil && dev == nic {
			if err := r.do(func() error { return r.l.SetDefaultGateway(fam, gw, nic) }, "moving the default route to "+br,
				func() error { return r.l.SetDefaultGateway(fam, gw, br) }); err != nil {
				return err
			}
		}
	}
	return nil
}

func sameAddrs(a, b []net.IPNet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].IP.Equal(b[i].IP) || a[i].Mask.String() != b[i].Mask.String() {
			return false
		}
	}
	return true
}

func (r *reconciler) addrs(carrier string, family int, want []net.IPNet) error {
	if _, ok := r.links[carrier]; !ok {
		return nil // its bridge failed; said already
	}
	have, err := r.l.Addrs(carrier, family)
	if err != nil {
		return kernelErr("reading the addresses of "+carrier, err)
	}
	if sameAddrs(have, want) {
		return nil
	}
	return r.do(func() error { return r.l.ReplaceAddrs(carrier, family, have) }, "setting the addresses of "+carrier,
		func() error { return r.l.ReplaceAddrs(carrier, family, want) })
}

func (r *reconciler) gateway(family int, g *Gateway) error {
	gw, dev, err := r.l.DefaultGateway(family)
	if err != nil {
		return kernelErr("reading the default route", err)
	}
	if gw.Equal(g.IP) && dev == g.Dev {
		return nil
	}
	return r.do(func() error { return r.l.SetDefaultGateway(family, gw, dev) }, "setting the default route",
		func() error { return r.l.SetDefaultGateway(family, g.IP, g.Dev) })
}

// EnsureVIF makes the bridge of a VIF's network on this host, plugging
// this host's PIF on the network as xapi's network attach does, and
// returns the bridge's name, for the VM lifecycle to call before the
// VIF's tap is made. The network stays wanted until Release.
func (m *Manager) EnsureVIF(ctx context.Context, vifRef string) (string, error) {
	row, ok := m.db.Snapshot().Get(dm.VIF.Class, vifRef)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "VIF", vifRef)
	}
	bridge, err := m.attach(ctx, row.String(dm.VIF.Network), "vif:"+vifRef)
	if err != nil {
		return "", err
	}
	if err := m.plugVIFPort(ctx, vifRef, row.String(dm.VIF.Network), bridge); err != nil {
		_ = m.Release(ctx, vifRef)
		return "", err
	}
	return bridge, nil
}

// Release forgets a VIF EnsureVIF was asked for, after its unplug; the
// network's bridge goes when nothing else here wants it.
func (m *Manager) Release(ctx context.Context, vifRef string) error {
	m.unlockVIF(vifRef)
	perr := m.unplugVIFPort(ctx, vifRef)
	m.mu.Lock()
	for n, why := range m.extra {
		delete(why, "vif:"+vifRef)
		if len(why) == 0 {
			delete(m.extra, n)
		}
	}
	err := m.applyLocked(ctx)
	m.mu.Unlock()
	if err == nil {
		err = perr
	}
	return err
}

// MoveVIF makes another network real for a plugged VIF that moves to it
// (VIF.move) and returns that network's bridge: the VIF's hold moves
// from its old network to the new one. On failure the old hold stays.
func (m *Manager) MoveVIF(ctx context.Context, vifRef, network string) (string, error) {
	m.mu.Lock()
	old := map[string]bool{}
	for n, why := range m.extra {
		if why["vif:"+vifRef] {
			old[n] = true
		}
	}
	m.mu.Unlock()
	bridge, err := m.attach(ctx, network, "vif:"+vifRef)
	if err != nil {
		return "", err
	}
	if err := m.plugVIFPort(ctx, vifRef, network, bridge); err != nil {
		return "", err
	}
	m.mu.Lock()
	for n := range old {
		if n == network {
			continue
		}
		delete(m.extra[n], "vif:"+vifRef)
		if len(m.extra[n]) == 0 {
			delete(m.extra, n)
		}
	}
	m.mu.Unlock()
	return bridge, nil
}

// Attach is network.attach: the network's bridge on this host, with
// this host's PIF on it plugged. (The datamodel here has no
// network.attach message; the daemon may call this.)
func (m *Manager) Attach(ctx context.Context, network string) (string, error) {
	return m.attach(ctx, network, "attach")
}

// Detach undoes Attach.
func (m *Manager) Detach(ctx context.Context, network string) error {
	m.mu.Lock()
	if why := m.extra[network]; why != nil {
		delete(why, "attach")
		if len(why) == 0 {
			delete(m.extra, network)
		}
	}
	err := m.applyLocked(ctx)
	m.mu.Unlock()
	return err
}

func (m *Manager) attach(ctx context.Context, network, why string) (string, error) {
	snap := m.db.Snapshot()
	nrow, ok := snap.Get(dm.Network.Class, network)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "network", network)
	}
	bridge := nrow.String(dm.Network.Bridge)
	m.mu.Lock()
	had := m.extra[network][why]
	if m.extra[network] == nil {
		m.extra[network] = map[string]bool{}
	}
	m.extra[network][why] = true
	m.mu.Unlock()
	forget := func() {
		if had {
			return
		}
		m.mu.Lock()
		delete(m.extra[network], why)
		if len(m.extra[network]) == 0 {
			delete(m.extra, network)
		}
		m.mu.Unlock()
	}
	// Plug this host's PIF on the network, if it has one that can be.
	pif := ""
	snap.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Host) == m.cfg.HostRef && r.String(dm.PIF.Network) == network &&
			isNull(r.String(dm.PIF.BondSlaveOf)) && r.Get(dm.PIF.Managed) == true && r.Get(dm.PIF.CurrentlyAttached) != true {
			pif = r.Ref
			return false
		}
		return true
	})
	var err error
	if pif != "" {
		err = m.change(ctx, func(tx *db.Tx) error { return plugTx(tx, pif) })
	} else {
		err = m.change(ctx, func(*db.Tx) error { return nil })
	}
	if err != nil {
		forget()
		return "", err
	}
	return bridge, nil
}

// Watch re-plans whenever the database changes and applies the plan
// when it differs from the last one applied: what other hosts do (a
// tunnel made on a second host, a transport address changed) and what
// the database learns without a message of this module (a VM started or
// stopped) reaches the kernel within a period. It returns when ctx ends.
func (m *Manager) Watch(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	defer m.stopDHCP()
	var gen uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g := m.db.Generation()
		if g == gen {
			continue
		}
		gen = g
		m.relock()
		m.replugVIFPorts(ctx)
		m.syncDHCP()
		if err := m.applyChanged(ctx); err != nil {
			m.log.Warn("network: applying the database's networks", "err", err)
		}
	}
}
