package network

import (
	"context"
	"log/slog"
	"net"
	"reflect"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/xerr"
)

// VIF ports on a virtual switch (Config.VIFPorts): with the Linux bridge
// backend a VIF's tap is made and put on the bridge by the VM's backend
// (QEMU), and the module only locks it. A switch that keeps its ports in
// a database of its own (Open vSwitch, package network/ovs) instead
// takes every VIF whose network EnsureVIF makes real as a port of the
// network's bridge, with the VIF's identity written on it (the
// external_ids an OVN controller binds logical ports by), and removes it
// on Release. MoveVIF moves the port to the new network's bridge, and
// Watch hands a port again to the switch when the database changes what
// it should be (the VIF's locking, MAC or addresses).
//
// A VM backend that makes its own taps (QEMU, through PlugTap) hands the
// VIF's tap to LockVIF once it is on the bridge; the module then tells
// the switch that this tap carries the VIF (VIFPort.Tap), and the switch
// moves the VIF's identity onto it, dropping the tap of its own it made
// at EnsureVIF. The same happens for the taps of domains found running
// after a restart (the VM lifecycle hands them back through LockVIF).

// VIFPorts is what the module asks of a switch that takes VIFs as ports.
type VIFPorts interface {
	// PlugVIF makes the VIF's port on p.Bridge, or makes an existing one
	// as p says; it is idempotent.
	PlugVIF(ctx context.Context, p VIFPort) error
	// UnplugVIF removes the port of the VIF with that uuid, if any.
	UnplugVIF(ctx context.Context, vifUUID string) error
}

// VIFPort is one VIF as a switch port.
type VIFPort struct {
	// VIF, VM and Network are uuids (not refs): what the switch writes
	// on the port for others (an OVN controller) to read.
	VIF, VM, Network string
	// Bridge is the network's bridge on this host.
	Bridge string
	// Tap is the VM backend's tap carrying the VIF, already on Bridge;
	// "" when the backend made none and the switch makes its own.
	Tap string
	MAC net.HardwareAddr
	MTU int
	// Mode is the VIF's locking mode with network_default resolved
	// (locking.ModeLocked, ModeUnlocked or ModeDisabled).
	Mode string
	// IPv4 and IPv6 are the VIF's ipv4_allowed and ipv6_allowed, parsed
	// (the addresses the VIF says it has, locked or not).
	IPv4, IPv6 []net.IP
}

// vifPort reads what the switch needs of a VIF on network (its own, or
// the one VIF.move takes it to) from the database. An entry of its
// allowed addresses that locking.ParseAllowed refuses is left out (a
// locked VIF's is an error, from RulesFor), with a line in log when log
// is not nil.
func vifPort(snap db.Reader, vifRef, network, bridge string, log *slog.Logger) (VIFPort, error) {
	row, ok := snap.Get(dm.VIF.Class, vifRef)
	if !ok {
		return VIFPort{}, xerr.New(xerr.HandleInvalid, "VIF", vifRef)
	}
	var vif dm.VIFRecord
	vif.FromRow(snap.Values(row))
	// The rules' port is not used here; RulesFor wants a valid name.
	rules, err := locking.RulesFor(snap, vifRef, "vif")
	if err != nil {
		return VIFPort{}, err
	}
	p := VIFPort{VIF: vif.UUID, Bridge: bridge, MAC: rules.MAC, MTU: int(vif.MTU), Mode: rules.Mode}
	if r, ok := snap.Get(dm.VM.Class, string(vif.VM)); ok {
		p.VM = r.UUID()
	}
	if network == "" {
		network = string(vif.Network)
	}
	if r, ok := snap.Get(dm.Network.Class, network); ok {
		p.Network = r.UUID()
	}
	if p.MTU <= 0 {
		p.MTU = mtuOf(snap, network)
	}
	if p.MAC == nil {
		if mac, err := net.ParseMAC(vif.MAC); err == nil {
			p.MAC = mac
		}
	}
	p.IPv4 = allowedAddrs(vif.IPV4Allowed, true, func(s string, err error) {
		if log != nil {
			log.Warn("network: leaving out an entry of a VIF's ipv4_allowed", "vif", vif.UUID, "entry", clipEntry(s), "err", err)
		}
	})
	p.IPv6 = allowedAddrs(vif.IPV6Allowed, false, func(s string, err error) {
		if log != nil {
			log.Warn("network: leaving out an entry of a VIF's ipv6_allowed", "vif", vif.UUID, "entry", clipEntry(s), "err", err)
		}
	})
	if p.Mode == locking.ModeLocked {
		p.IPv4, p.IPv6 = rules.IPv4, rules.IPv6
	}
	return p, nil
}

// allowedAddrs parses a VIF's allowed addresses of one family (v4 or
// IPv6), handing each entry locking.ParseAllowed refuses to skip.
func allowedAddrs(in []string, v4 bool, skip func(s string, err error)) []net.IP {
	var out []net.IP
	for _, s := range in {
		ip, err := locking.ParseAllowed(s, v4)
		if err != nil {
			skip(s, err)
			continue
		}
		out = append(out, ip)
	}
	return out
}

// clipEntry bounds what a log line quotes of a database entry.
func clipEntry(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// pluggedVIF is a VIF Config.VIFPorts has a port for.
type pluggedVIF struct {
	network string // ref
	port    VIFPort
}

// plugVIFPort hands a VIF on network's bridge to Config.VIFPorts, when
// there is one, and remembers it for Release and Watch.
func (m *Manager) plugVIFPort(ctx context.Context, vifRef, network, bridge string) error {
	if m.cfg.VIFPorts == nil {
		return nil
	}
	p, err := vifPort(m.db.Snapshot(), vifRef, network, bridge, m.log)
	if err != nil {
		return err
	}
	m.lockMu.Lock()
	p.Tap = m.ports[vifRef].port.Tap
	m.lockMu.Unlock()
	if err := m.cfg.VIFPorts.PlugVIF(ctx, p); err != nil {
		return kernelErr("plugging VIF "+p.VIF+" on "+bridge, err)
	}
	m.rememberPort(vifRef, network, p)
	return nil
}

// rememberPort records the port the switch now has for a VIF on network.
func (m *Manager) rememberPort(vifRef, network string, p VIFPort) {
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	if m.ports == nil {
		m.ports = map[string]pluggedVIF{}
	}
	m.ports[vifRef] = pluggedVIF{network: network, port: p}
}

// unplugVIFPort removes the port of a VIF: the one plugVIFPort made, or
// one an earlier life of the daemon made (the switch keeps its ports
// across a restart, and a VM found running is not plugged again).
func (m *Manager) unplugVIFPort(ctx context.Context, vifRef string) error {
	if m.cfg.VIFPorts == nil {
		return nil
	}
	m.lockMu.Lock()
	p, ok := m.ports[vifRef]
	delete(m.ports, vifRef)
	m.lockMu.Unlock()
	uuid := p.port.VIF
	if !ok {
		row, found := m.db.Snapshot().Get(dm.VIF.Class, vifRef)
		if !found {
			return nil
		}
		uuid = row.UUID()
	}
	if err := m.cfg.VIFPorts.UnplugVIF(ctx, uuid); err != nil {
		return kernelErr("unplugging VIF "+uuid, err)
	}
	return nil
}

// replugVIFPorts hands again to the switch the ports whose VIF the
// database now describes differently (Watch).
func (m *Manager) replugVIFPorts(ctx context.Context) {
	if m.cfg.VIFPorts == nil {
		return
	}
	snap := m.db.Snapshot()
	m.lockMu.Lock()
	defer m.lockMu.Unlock()
	for ref, old := range m.ports {
		// Not logged here: this runs on every change to the database,
		// and the plug logged what it left out.
		p, err := vifPort(snap, ref, old.network, old.port.Bridge, nil)
		if err != nil {
			continue // a VIF that is gone is unplugged by its Release
		}
		p.Tap = old.port.Tap
		if reflect.DeepEqual(p, old.port) {
			continue
		}
		if err := m.cfg.VIFPorts.PlugVIF(ctx, p); err != nil {
			m.log.Warn("network: updating a VIF's port", "vif", p.VIF, "err", err)
			continue
		}
		m.ports[ref] = pluggedVIF{network: old.network, port: p}
	}
}

// tapVIFPort tells the switch that tap (the VM backend's, on the VIF's
// bridge) carries the VIF (LockVIF calls it). Without VIFPorts, or when
// the switch knows already, it does nothing.
func (m *Manager) tapVIFPort(ctx context.Context, vifRef, tap string) error {
	if m.cfg.VIFPorts == nil {
		return nil
	}
	m.lockMu.Lock()
	old, ok := m.ports[vifRef]
	m.lockMu.Unlock()
	if ok && old.port.Tap == tap {
		return nil
	}
	snap := m.db.Snapshot()
	network, bridge := old.network, old.port.Bridge
	if !ok {
		row, found := snap.Get(dm.VIF.Class, vifRef)
		if !found {
			return xerr.New(xerr.HandleInvalid, "VIF", vifRef)
		}
		network = row.String(dm.VIF.Network)
		if nrow, found := snap.Get(dm.Network.Class, network); found {
			bridge = nrow.String(dm.Network.Bridge)
		}
	}
	p, err := vifPort(snap, vifRef, network, bridge, m.log)
	if err != nil {
		return err
	}
	p.Tap = tap
	if err := m.cfg.VIFPorts.PlugVIF(ctx, p); err != nil {
		return kernelErr("plugging VIF "+p.VIF+" on "+bridge+" through tap "+tap, err)
	}
	m.rememberPort(vifRef, network, p)
	return nil
}
