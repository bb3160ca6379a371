package network

// The DHCP clients of this host's PIFs (Config.DHCPClient, dhcp.go).
//
// One client runs for every plugged, managed PIF of this host in
// ip_configuration_mode DHCP, on the PIF's bridge, for as long as it
// stays so (a NIC not adopted, such as the management NIC as the
// distribution configured it, is left to the distribution): syncDHCP,
// run from Watch whenever the database changes (and so at start-up),
// starts the missing ones and stops those whose PIF went None or
// Static, was unplugged or forgotten; Watch's end stops them all (the
// addresses stay, so that a restart disturbs nothing, and the client
// started again asks for the same address). A client that exits is
// started again after a pause (1 s doubling to 30 s). At most
// maxDHCPClients run.
//
// A lease is applied as xapi's networkd and its PIF bookkeeping do: the
// address on the device, and PIF.IP and PIF.netmask; the default route
// through the first router and PIF.gateway only on the PIF xapi picks for
// the gateway (other_config:defaultroute=true, else the management PIF,
// else the first PIF with an address); PIF.DNS only on the PIF it picks
// for DNS (other_config:peerdns=true, else the same fallbacks). When the
// lease is lost (udhcpc's deconfig) the address goes; the record keeps
// the last values, as xapi's does.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// DHCPRunner runs a DHCP client on dev until ctx ends, giving each event
// to report (Udhcpc is the daemon's). request is the address to ask for
// again, or nil.
type DHCPRunner interface {
	Run(ctx context.Context, dev string, request net.IP, report func(Lease, error)) error
}

const (
	maxDHCPClients = 64
	// dhcpFirstLease is how long reconfigure_ip waits for the first
	// lease; without one by then it returns and the client goes on.
	dhcpFirstLease = 20 * time.Second
)

type dhcpClients struct {
	m   *Manager
	run DHCPRunner
	clientSet[dhcpClient]
}

// clientSet is what the DHCP and DHCPv6 clients keep alike: the running
// clients by PIF ref, and the context and wait group that stop them all.
type clientSet[C any] struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	by     map[string]*C // by PIF ref
}

func newClientSet[C any]() clientSet[C] {
	ctx, cancel := context.WithCancel(context.Background())
	return clientSet[C]{ctx: ctx, cancel: cancel, by: map[string]*C{}}
}

// missing is the PIFs of want that have no client yet, in ref order, as
// many as maxDHCPClients leaves room for; the rest are logged and left
// without one. Under mu.
func (s *clientSet[C]) missing(want map[string]string, log *slog.Logger, kind string) []string {
	var out []string
	for _, ref := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.by[ref]; ok {
			continue
		}
		if len(s.by)+len(out) >= maxDHCPClients {
			log.Warn("network: too many "+kind+" clients: PIF left without one", "pif", ref, "max", maxDHCPClients)
			continue
		}
		out = append(out, ref)
	}
	return out
}

// stopAll stops every client and takes no more, and waits for them.
func (s *clientSet[C]) stopAll() {
	s.mu.Lock()
	s.closed = true
	s.by = map[string]*C{}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

type dhcpClient struct {
	dev    string
	cancel context.CancelFunc
	done   chan struct{}
	bound  chan struct{}
	once   sync.Once
	router net.IP // the default route it set, under dhcpClients.mu
}

func newDHCPClients(m *Manager, run DHCPRunner) *dhcpClients {
	return &dhcpClients{m: m, run: run, clientSet: newClientSet[dhcpClient]()}
}

// pifDevice is where a PIF's addresses live: its bridge, or its own
// device when the distribution configures it (as reconfigure_ip says).
func pifDevice(r db.Reader, p *dm.PIFRecord) string {
	if adopted(p) {
		if row, ok := r.Get(dm.Network.Class, string(p.Network)); ok {
			return row.String(dm.Network.Bridge)
		}
	}
	return p.Device
}

// wantedDHCP is PIF ref -> device of every PIF that must have a client.
func (m *Manager) wantedDHCP() map[string]string {
	return m.wantedClients(func(p *dm.PIFRecord) bool { return p.IPConfigurationMode == dm.IPConfigurationModeDHCP })
}

// wantedClients is PIF ref -> device of every plugged PIF of this host
// whose configuration wants a client (wants). A NIC not adopted (the
// management NIC as the distribution configured it) keeps the
// distribution's clients, if any.
func (m *Manager) wantedClients(wants func(*dm.PIFRecord) bool) map[string]string {
	snap := m.db.Snapshot()
	want := map[string]string{}
	snap.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) != m.cfg.HostRef {
			return true
		}
		var p dm.PIFRecord
		p.FromRow(snap.Values(row))
		if wants(&p) && p.CurrentlyAttached && p.Managed && adopted(&p) {
			if dev := pifDevice(snap, &p); dev != "" {
				want[row.Ref] = dev
			}
		}
		return true
	})
	return want
}

// syncDHCP starts and stops clients as the database says (the DHCPv6
// ones too, syncDHCP6).
func (m *Manager) syncDHCP() {
	m.syncDHCP6()
	d := m.dhcp
	if d == nil {
		return
	}
	want := m.wantedDHCP()
	var stopped []*dhcpClient
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	for ref, c := range d.by {
		if want[ref] != c.dev {
			c.cancel()
			delete(d.by, ref)
			stopped = append(stopped, c)
		}
	}
	for _, ref := range d.missing(want, m.log, "DHCP") {
		ctx, cancel := context.WithCancel(d.ctx)
		c := &dhcpClient{dev: want[ref], cancel: cancel, done: make(chan struct{}), bound: make(chan struct{})}
		d.by[ref] = c
		d.wg.Add(1)
		go func() { defer d.wg.Done(); d.loop(ctx, ref, c) }()
	}
	d.mu.Unlock()
	for _, c := range stopped {
		<-c.done
		d.mu.Lock()
		gw := c.router
		d.mu.Unlock()
		if gw == nil {
			continue
		}
		// The default route the lease set goes with the client.
		if have, dev, err := m.cfg.Links.DefaultGateway(4); err == nil && have.Equal(gw) && dev == c.dev {
			if err := m.cfg.Links.SetDefaultGateway(4, nil, c.dev); err != nil {
				m.log.Warn("network: removing the DHCP default route", "dev", c.dev, "err", err)
			}
		}
	}
}

// stopDHCP stops every client, DHCPv6 ones too (the daemon stops).
func (m *Manager) stopDHCP() {
	m.stopDHCP6()
	if m.dhcp != nil {
		m.dhcp.stopAll()
	}
}

// startDHCP is Config.DHCP when the module has a client: the client for
// dev is started and its first lease waited for (dhcpFirstLease at
// most; the client goes on without one).
func (m *Manager) startDHCP(ctx context.Context, dev string) error {
	m.syncDHCP()
	d := m.dhcp
	d.mu.Lock()
	var c *dhcpClient
	for _, x := range d.by {
		if x.dev == dev {
			c = x
		}
	}
	d.mu.Unlock()
	if c == nil {
		for _, w := range m.wantedDHCP() {
			if w == dev {
				return fmt.Errorf("no DHCP client could be started on %s (at most %d run)", dev, maxDHCPClients)
			}
		}
		return nil // not adopted: the distribution's NIC and client
	}
	t := time.NewTimer(dhcpFirstLease)
	defer t.Stop()
	select {
	case <-c.bound:
	case <-c.done:
	case <-ctx.Done():
	case <-t.C:
		m.log.Warn("network: no DHCP lease yet: the client goes on trying", "dev", dev)
	}
	return nil
}

func (d *dhcpClients) loop(ctx context.Context, ref string, c *dhcpClient) {
	defer close(c.done)
	log := d.m.log.With("pif", ref, "dev", c.dev)
	pause := time.Second
	for ctx.Err() == nil {
		var request net.IP
		if as, err := d.m.cfg.Links.Addrs(c.dev, 4); err == nil && len(as) > 0 {
			request = as[0].IP
		}
		applied := false
		began := time.Now()
		err := d.run.Run(ctx, c.dev, request, func(l Lease, err error) {
			if err != nil {
				log.Warn("network: DHCP lease refused: nothing applied", "err", err)
				return
			}
			switch {
			case l.HasAddress():
				if err := d.m.applyLease(ref, c.dev, l); err != nil {
					log.Warn("network: applying a DHCP lease", "err", err)
					return
				}
				applied = true
				d.mu.Lock()
				c.router = nil
				if len(l.Routers) > 0 && d.m.isGatewayPIF(ref) {
					c.router = l.Routers[0]
				}
				d.mu.Unlock()
				c.once.Do(func() { close(c.bound) })
			case l.Event == "deconfig" && applied:
				applied = false
				log.Info("network: DHCP lease lost: address removed")
				if err := d.m.cfg.Links.ReplaceAddrs(c.dev, 4, nil); err != nil {
					log.Warn("network: removing a lost DHCP address", "err", err)
				}
			}
		})
		if err != nil {
			log.Warn("network: DHCP client", "err", err)
		}
		if !clientRestart(ctx, began, &pause) {
			return
		}
	}
}

// clientRestart waits before a DHCP client runs again: pause, doubled
// each time up to 30 s, back to 1 s after a client that ran for a
// minute. It reports false when ctx ended first.
func clientRestart(ctx context.Context, began time.Time, pause *time.Duration) bool {
	if time.Since(began) > time.Minute {
		*pause = time.Second
	}
	t := time.NewTimer(*pause)
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-t.C:
	}
	*pause = min(2**pause, 30*time.Second)
	return true
}

// ipPIFs are this host's PIFs with an address of their primary family,
// in the order xapi's determine_gateway_and_dns_ifs considers them.
func ipPIFs(r db.Reader, host string) (refs []string, recs []dm.PIFRecord) {
	r.Ascend(dm.PIF.Class, func(row *db.Row) bool {
		if row.String(dm.PIF.Host) != host {
			return true
		}
		var p dm.PIFRecord
		p.FromRow(r.Values(row))
		v4 := p.IPConfigurationMode != dm.IPConfigurationModeNone && p.PrimaryAddressType == dm.PrimaryAddressTypeIPV4
		v6 := p.IPV6ConfigurationMode != dm.IPV6ConfigurationModeNone && p.PrimaryAddressType == dm.PrimaryAddressTypeIPV6
		if v4 || v6 {
			refs, recs = append(refs, row.Ref), append(recs, p)
		}
		return true
	})
	return refs, recs
}

// chosenPIF is xapi's choice of the gateway (key defaultroute) or DNS
// (key peerdns) PIF: the one with other_config:key=true, else the
// management PIF, else the first.
func chosenPIF(r db.Reader, host, key string) string {
	refs, recs := ipPIFs(r, host)
	for i := range recs {
		if recs[i].OtherConfig[key] == "true" {
			return refs[i]
		}
	}
	for i := range recs {
		if recs[i].Management {
			return refs[i]
		}
	}
	if len(refs) > 0 {
		return refs[0]
	}
	return ""
}

func (m *Manager) isGatewayPIF(ref string) bool {
	return chosenPIF(m.db.Snapshot(), m.cfg.HostRef, "defaultroute") == ref
}

// applyLease puts a checked lease on dev and into the PIF's record.
func (m *Manager) applyLease(ref, dev string, l Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := m.db.Snapshot()
	p, ok := pifRecord(snap, ref)
	if !ok || p.IPConfigurationMode != dm.IPConfigurationModeDHCP || !p.CurrentlyAttached {
		return nil // changed meanwhile: the client is being stopped
	}
	want := net.IPNet{IP: l.IP, Mask: l.Mask}
	have, err := m.cfg.Links.Addrs(dev, 4)
	if err != nil {
		return err
	}
	if len(have) != 1 || !have[0].IP.Equal(want.IP) || have[0].Mask.String() != want.Mask.String() {
		if err := m.cfg.Links.ReplaceAddrs(dev, 4, []net.IPNet{want}); err != nil {
			return err
		}
	}
	fields := map[string]any{"IP": l.IP.String(), "netmask": net.IP(l.Mask).String()}
	if chosenPIF(snap, m.cfg.HostRef, "defaultroute") == ref && len(l.Routers) > 0 {
		gw := l.Routers[0]
		if cur, cdev, err := m.cfg.Links.DefaultGateway(4); err != nil || !cur.Equal(gw) || cdev != dev {
			if err := m.cfg.Links.SetDefaultGateway(4, gw, dev); err != nil {
				return fmt.Errorf("default route through %s: %w", gw, err)
			}
		}
		fields["gateway"] = gw.String()
	}
	if chosenPIF(snap, m.cfg.HostRef, "peerdns") == ref && len(l.DNS) > 0 {
		_, dns6, _ := dnsByFamily(p.DNS)
		var dns []string
		for _, d := range l.DNS {
			dns = append(dns, d.String())
		}
		fields["DNS"] = strings.Join(append(dns, dns6...), ",")
	}
	if p.IP == fields["IP"] && p.Netmask == fields["netmask"] &&
		(fields["gateway"] == nil || p.Gateway == fields["gateway"]) && (fields["DNS"] == nil || p.DNS == fields["DNS"]) {
		return nil
	}
	_, err = m.db.Update(func(tx *db.Tx) error { return setFields(tx, dm.PIF.Class, ref, fields) })
	if err == nil {
		m.log.Info("network: DHCP lease applied", "pif", ref, "dev", dev, "ip", want.String(), "lease_s", l.Seconds)
	}
	return err
}
