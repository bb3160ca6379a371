package network

// The DHCPv6 clients of this host's PIFs (Config.DHCP6Client, dhcp6.go).
//
// One client runs for every plugged, managed, adopted PIF of this host
// in ipv6_configuration_mode DHCP, on the PIF's bridge, for as long as
// it stays so. syncDHCP6 (run with syncDHCP, from Watch whenever the
// database changes, and so at start-up) starts the missing ones and
// stops those whose PIF left DHCP mode, was unplugged or forgotten:
// those are released (the server is told, dhclient -6 -r) and the
// address they applied is taken off the bridge, unless the PIF is now
// Static (the plan owns its addresses then). Watch's end stops them all
// without releasing: the addresses stay, so that a restart disturbs
// nothing, and the client started again confirms the same lease from
// its lease file. A client that exits is started again after a pause
// (1 s doubling to 30 s). At most maxDHCPClients run. A client for a
// bridge whose previous client is still releasing waits for it.
//
// As xapi's networkd does, a PIF entering DHCPv6 mode has the global
// IPv6 addresses of its bridge flushed when its client first starts (a
// client started with the lease already in PIF.IPv6, after a restart,
// flushes nothing); link-local addresses stay, and the kernel's own
// SLAAC addresses, when router advertisements ask for them, are left to
// it. A lease is applied as networkd and xapi's PIF bookkeeping do: the
// address on the bridge (replacing only the lease's previous one) and in
// PIF.IPv6 as "address/prefix"; its DNS servers in PIF.DNS (after the
// IPv4 ones) only on the PIF xapi picks for DNS (other_config:peerdns,
// else the management PIF, else the first PIF with an address).
// DHCPv6 has no routers: the default route comes from router
// advertisements, or PIF.ipv6_gateway on the management PIF. When the
// lease is lost (EXPIRE6, RELEASE6) the address goes and PIF.IPv6 is
// emptied, as xapi's record follows the bridge's addresses.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// DHCP6Runner runs a DHCPv6 client on dev until ctx ends, giving each
// event to report, and releases dev's lease once the client has ended
// (Dhclient is the daemon's).
type DHCP6Runner interface {
	Run(ctx context.Context, dev string, report func(Lease6, error)) error
	Release(ctx context.Context, dev string) error
}

type dhcp6Clients struct {
	m   *Manager
	run DHCP6Runner
	clientSet[dhcp6Client]
	latest map[string]*dhcp6Client // by device: the last client started there, under mu
}

type dhcp6Client struct {
	dev     string
	cancel  context.CancelFunc
	done    chan struct{}
	bound   chan struct{}
	once    sync.Once
	prev    <-chan struct{} // done of the previous client on dev
	release atomic.Bool     // stopped for good: release the lease

	// applied and last are the address it put on dev and the lease
	// it came from, under Manager.mu.
	applied []net.IPNet
	last    *Lease6
}

func newDHCP6Clients(m *Manager, run DHCP6Runner) *dhcp6Clients {
	return &dhcp6Clients{m: m, run: run, clientSet: newClientSet[dhcp6Client](), latest: map[string]*dhcp6Client{}}
}

// wantedDHCP6 is PIF ref -> device of every PIF that must have a
// DHCPv6 client.
func (m *Manager) wantedDHCP6() map[string]string {
	return m.wantedClients(func(p *dm.PIFRecord) bool { return p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeDHCP })
}

// syncDHCP6 starts and stops DHCPv6 clients as the database says; the
// ones stopped release their leases in the background.
func (m *Manager) syncDHCP6() {
	d := m.dhcp6
	if d == nil {
		return
	}
	want := m.wantedDHCP6()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	for ref, c := range d.by {
		if want[ref] != c.dev {
			c.release.Store(true)
			c.cancel()
			delete(d.by, ref)
		}
	}
	for dev, c := range d.latest {
		select {
		case <-c.done:
			delete(d.latest, dev)
		default:
		}
	}
	for _, ref := range d.missing(want, m.log, "DHCPv6") {
		ctx, cancel := context.WithCancel(d.ctx)
		c := &dhcp6Client{dev: want[ref], cancel: cancel, done: make(chan struct{}), bound: make(chan struct{})}
		if p := d.latest[c.dev]; p != nil {
			c.prev = p.done
		}
		d.by[ref], d.latest[c.dev] = c, c
		d.wg.Add(1)
		go func() { defer d.wg.Done(); d.loop(ctx, ref, c) }()
	}
}

// stopDHCP6 stops every DHCPv6 client without releasing (the daemon
// stops).
func (m *Manager) stopDHCP6() {
	if m.dhcp6 != nil {
		m.dhcp6.stopAll()
	}
}

// startDHCP6 runs after reconfigure_ipv6 to DHCP: the PIF's client is
// started and its first lease waited for (dhcpFirstLease at most; the
// client goes on without one). A client already running records its
// lease again, as the mode change emptied PIF.IPv6.
func (m *Manager) startDHCP6(ctx context.Context, ref string) error {
	m.syncDHCP6()
	d := m.dhcp6
	d.mu.Lock()
	c := d.by[ref]
	d.mu.Unlock()
	if c == nil {
		if dev, ok := m.wantedDHCP6()[ref]; ok {
			return fmt.Errorf("no DHCPv6 client could be started on %s (at most %d run)", dev, maxDHCPClients)
		}
		return nil // not adopted or not plugged: nothing runs yet
	}
	m.mu.Lock()
	last := c.last
	m.mu.Unlock()
	if last != nil {
		return m.applyLease6(ref, c, *last)
	}
	t := time.NewTimer(dhcpFirstLease)
	defer t.Stop()
	select {
	case <-c.bound:
	case <-c.done:
	case <-ctx.Done():
	case <-t.C:
		m.log.Warn("network: no DHCPv6 lease yet: the client goes on trying", "dev", c.dev)
	}
	return nil
}

func (d *dhcp6Clients) loop(ctx context.Context, ref string, c *dhcp6Client) {
	defer close(c.done)
	log := d.m.log.With("pif", ref, "dev", c.dev)
	if c.prev != nil {
		select {
		case <-c.prev:
		case <-ctx.Done():
		}
	}
	defer d.finish(ref, c, log)
	if ctx.Err() != nil {
		return
	}
	if err := d.m.flushForDHCP6(ref, c.dev); err != nil {
		log.Warn("network: flushing IPv6 addresses before DHCPv6", "err", err)
	}
	pause := time.Second
	for ctx.Err() == nil {
		began := time.Now()
		err := d.run.Run(ctx, c.dev, func(l Lease6, err error) {
			if err != nil {
				log.Warn("network: DHCPv6 lease refused: nothing applied", "err", err)
				return
			}
			switch {
			case l.HasAddress():
				if err := d.m.applyLease6(ref, c, l); err != nil {
					log.Warn("network: applying a DHCPv6 lease", "err", err)
					return
				}
				c.once.Do(func() { close(c.bound) })
			case l.Lost():
				log.Info("network: DHCPv6 lease lost: address removed", "event", l.Event)
				d.m.dropLease6(ref, c)
			}
		})
		if err != nil {
			log.Warn("network: DHCPv6 client", "err", err)
		}
		if !clientRestart(ctx, began, &pause) {
			return
		}
	}
}

// finish releases the lease of a client stopped for good and takes its
// address away.
func (d *dhcp6Clients) finish(ref string, c *dhcp6Client, log *slog.Logger) {
	if !c.release.Load() || d.ctx.Err() != nil {
		return
	}
	if err := d.run.Release(d.ctx, c.dev); err != nil {
		log.Warn("network: releasing the DHCPv6 lease", "err", err)
	}
	d.m.dropLease6(ref, c)
}

// recorded are the addresses of PIF.IPv6.
func recorded6(p *dm.PIFRecord) []net.IPNet {
	var out []net.IPNet
	for _, s := range p.IPV6 {
		if n, ok := parseIPv6CIDR(s); ok {
			out = append(out, n)
		}
	}
	return out
}

func hasNet(list []net.IPNet, n net.IPNet) bool {
	return slices.ContainsFunc(list, func(x net.IPNet) bool { return x.IP.Equal(n.IP) && slices.Equal(x.Mask, n.Mask) })
}

// flushForDHCP6 takes the global IPv6 addresses off dev when the PIF
// enters DHCPv6 mode (PIF.IPv6 holds no lease yet).
func (m *Manager) flushForDHCP6(ref, dev string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := pifRecord(m.db.Snapshot(), ref)
	if !ok || p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeDHCP || !p.CurrentlyAttached || len(recorded6(&p)) > 0 {
		return nil
	}
	have, err := m.cfg.Links.Addrs(dev, 6)
	if err != nil || len(have) == 0 {
		return err
	}
	return m.cfg.Links.ReplaceAddrs(dev, 6, nil)
}

// applyLease6 puts a checked lease on the client's device and into the
// PIF's record.
func (m *Manager) applyLease6(ref string, c *dhcp6Client, l Lease6) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.db.Snapshot()
	p, ok := pifRecord(snap, ref)
	if !ok || p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeDHCP || !p.CurrentlyAttached {
		return nil // changed meanwhile: the client is being stopped
	}
	want := l.Net()
	have, err := m.cfg.Links.Addrs(c.dev, 6)
	if err != nil {
		return err
	}
	// The lease's previous address goes; other addresses (the kernel's)
	// stay.
	old := append(recorded6(&p), c.applied...)
	next := make([]net.IPNet, 0, len(have)+1)
	for _, h := range have {
		if !hasNet(old, h) || (h.IP.Equal(want.IP) && slices.Equal(h.Mask, want.Mask)) {
			next = append(next, h)
		}
	}
	if !hasNet(next, want) {
		next = append(next, want)
	}
	if len(next) != len(have) || !hasNet(have, want) {
		if err := m.cfg.Links.ReplaceAddrs(c.dev, 6, next); err != nil {
			return err
		}
	}
	c.applied, c.last = []net.IPNet{want}, &l
	fields := map[string]any{}
	if len(p.IPV6) != 1 || p.IPV6[0] != l.CIDR() {
		fields["IPv6"] = []string{l.CIDR()}
	}
	if chosenPIF(snap, m.cfg.HostRef, "peerdns") == ref && len(l.DNS) > 0 {
		dns, _, _ := dnsByFamily(p.DNS)
		for _, d := range l.DNS {
			dns = append(dns, d.String())
		}
		if s := strings.Join(dns, ","); s != p.DNS {
			fields["DNS"] = s
		}
	}
	if len(fields) == 0 {
		return nil
	}
	_, err = m.db.Update(func(tx *db.Tx) error { return setFields(tx, dm.PIF.Class, ref, fields) })
	if err == nil {
		m.log.Info("network: DHCPv6 lease applied", "pif", ref, "dev", c.dev, "ip", l.CIDR(), "valid_s", l.ValidLife)
	}
	return err
}

// dropLease6 takes the client's address off its device (unless the PIF
// is Static now: the plan owns its addresses) and out of PIF.IPv6 while
// the PIF is still in DHCP mode.
func (m *Manager) dropLease6(ref string, c *dhcp6Client) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := pifRecord(m.db.Snapshot(), ref)
	gone := c.applied
	c.applied, c.last = nil, nil
	if ok && p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeStatic {
		return
	}
	if ok && p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeDHCP {
		gone = append(gone, recorded6(&p)...)
	}
	if have, err := m.cfg.Links.Addrs(c.dev, 6); err == nil && len(gone) > 0 {
		next := slices.DeleteFunc(slices.Clone(have), func(h net.IPNet) bool { return hasNet(gone, h) })
		if len(next) != len(have) {
			if err := m.cfg.Links.ReplaceAddrs(c.dev, 6, next); err != nil {
				m.log.Warn("network: removing a DHCPv6 address", "dev", c.dev, "err", err)
			}
		}
	}
	if ok && p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeDHCP && len(p.IPV6) > 0 {
		if _, err := m.db.Update(func(tx *db.Tx) error { return tx.Set(dm.PIF.IPV6, ref, []string{}) }); err != nil {
			m.log.Warn("network: emptying PIF.IPv6 after a lost DHCPv6 lease", "pif", ref, "err", err)
		}
	}
}
