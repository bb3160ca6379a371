package network

import (
	"context"
	"fmt"
	"net"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// # The management interface
//
// host.management_reconfigure(pif), host.management_disable and
// host.local_management_reconfigure(interface) move the host's XenAPI
// between addresses, as xapi's Xapi_host and Xapi_mgmt_iface do. The
// kernel side is this module's (the PIF is plugged, its address on its
// bridge); the sockets and the pool are the daemon's, reached through the
// Management interface.
//
// management_reconfigure runs on the PIF's host (the route table sends
// it there). With HA on it is refused (HA_IS_ENABLED). A managed PIF must
// be usable for management: not a bond member (CANNOT_PLUG_BOND_SLAVE)
// and configured for its primary address family (None is
// PIF_HAS_NO_NETWORK_CONFIGURATION, or PIF_HAS_NO_V6_NETWORK_CONFIGURATION
// for an IPv6 primary). xapi's check that the new PIF's primary address
// type matches the old management PIF's is inside a handler that
// swallows its own error, so it never refuses; neither does this one. A
// PIF that already is the management PIF is left as it is. Otherwise,
// in order:
//
//  1. the PIF is plugged (its NIC in its network's bridge, its Static
//     address on the bridge, as PIF.plug does);
//  2. the address is read: the Static one from the record, else the
//     first the kernel has on the bridge (the device for an unmanaged
//     PIF); none is PIF_CONFIGURATION_ERROR;
//  3. the daemon serves the API there too and makes ip:port the host's
//     intra-pool address (Management.MoveTo); a failure leaves the
//     sockets and the pool as they were;
//  4. the database: PIF.management true on this PIF, false on the host's
//     others (a former management PIF whose NIC toolstackd never adopted
//     gets AdoptedKey "false", so its NIC stays as the distribution set
//     it up), host.address the new address; the default route follows
//     the management PIF's gateway;
//  5. the old listener closes, once the reply has gone out.
//
// management_disable (HA_IS_ENABLED with HA on; SLAVE_REQUIRES_MANAGEMENT_INTERFACE
// on a pool member, whose pool traffic needs it) clears PIF.management on
// the host's PIFs and stops the API on the network: the host answers on
// its local socket only, until management_reconfigure.
//
// pool.management_reconfigure(network) runs on the coordinator: with HA
// on, HA_IS_ENABLED; every host must have a PIF on the network
// (PIF_NOT_PRESENT [host, network]), all of one primary address type
// (PIF_INCOMPATIBLE_PRIMARY_ADDRESS_TYPE) and each usable for management
// (as above); then host.management_reconfigure runs on each member and
// last on the coordinator, each through the pipeline as the caller. The
// pool's hosts follow each move through raft's configuration, so
// xapi's closing pool.recover_slaves has nothing left to do.
//
// local_management_reconfigure(interface) is for a member cut off from
// its coordinator (xapi's slave emergency mode; NOT_IN_EMERGENCY_MODE
// otherwise), called on its local socket: interface names a bridge (or a
// device) of this host's PIFs; the API moves to that interface's
// address without plugging anything, the coordinator is told if it can
// be, and the records are written when the database takes writes again.

// Management is the daemon's side of a management move: its listeners
// and its place in the pool.
type Management interface {
	// MoveTo makes the API answer at ip: the daemon serves there as well
	// as where it serves now (a wildcard listener needs nothing), and,
	// unless alone, makes ip and its pool port the host's intra-pool
	// address (raft's configuration on the coordinator). done closes
	// what served at the old address, after the reply; undo puts back
	// what MoveTo changed. On error nothing changed.
	MoveTo(ctx context.Context, ip string, alone bool) (done, undo func(), err error)
	// Disable stops serving the API on the network (the local socket
	// stays), once the reply has gone out.
	Disable(ctx context.Context) error
	// Member reports whether the host is in a pool and not its
	// coordinator.
	Member() bool
	// CutOff reports whether the host is a member that knows no
	// coordinator (xapi's slave emergency mode).
	CutOff() bool
}

// RegisterManagement binds host.management_reconfigure,
// host.management_disable and host.local_management_reconfigure on m's
// server, moving the daemon's API through mg.
func RegisterManagement(m *Manager, mg Management) {
	h := &mgmtHandlers{m: m, mg: mg}
	s := m.cfg.Server
	api.Register(s, func(c *api.Call, a dm.HostManagementReconfigureArgs) (dm.Void, error) {
		return dm.Void{}, h.reconfigure(c, string(a.PIF))
	})
	api.Register(s, func(c *api.Call, _ dm.HostManagementDisableArgs) (dm.Void, error) {
		return dm.Void{}, h.disable(c)
	})
	api.Register(s, func(c *api.Call, a dm.HostLocalManagementReconfigureArgs) (dm.Void, error) {
		return dm.Void{}, h.localReconfigure(c, a.Interface)
	})
	api.Register(s, func(c *api.Call, a dm.PoolManagementReconfigureArgs) (dm.Void, error) {
		return dm.Void{}, h.poolReconfigure(c, string(a.Network))
	})
}

func (h *mgmtHandlers) poolReconfigure(c *api.Call, network string) error {
	if _, err := c.Lookup(dm.Network.Class, network); err != nil {
		return err
	}
	snap := c.Snapshot()
	if haEnabled(snap) {
		return xerr.New(xerr.HAIsEnabled)
	}
	pifOf := map[string]string{} // host -> its PIF on the network
	var pifs []string
	snap.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Network) == network {
			pifOf[r.String(dm.PIF.Host)] = r.Ref
			pifs = append(pifs, r.Ref)
		}
		return true
	})
	var hosts []string
	snap.Ascend(dm.Host.Class, func(r *db.Row) bool { hosts = append(hosts, r.Ref); return true })
	for _, host := range hosts {
		if pifOf[host] == "" {
			return xerr.New(xerr.PIFNotPresent, host, network)
		}
	}
	var first dm.PrimaryAddressType
	for i, ref := range pifs {
		p, _ := pifRecord(snap, ref)
		if i == 0 {
			first = p.PrimaryAddressType
		} else if p.PrimaryAddressType != first {
			return xerr.New(xerr.PIFIncompatiblePrimaryAddressType, ref)
		}
		if err := assertUsableForManagement(ref, &p); err != nil {
			return err
		}
	}
	// Members first, this host (the coordinator) last.
	self := h.m.cfg.HostRef
	for _, host := range append(slicesWithout(hosts, self), self) {
		if _, err := (&dm.HostManagementReconfigureArgs{PIF: dm.PIFRef(pifOf[host])}).Call(c.Ctx, c.Caller()); err != nil {
			return err
		}
	}
	return nil
}

func slicesWithout(list []string, x string) []string {
	out := make([]string, 0, len(list))
	for _, v := range list {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

type mgmtHandlers struct {
	m  *Manager
	mg Management
}

// assertUsableForManagement is xapi's Xapi_pif.assert_usable_for_management.
func assertUsableForManagement(ref string, p *dm.PIFRecord) error {
	if !isNull(string(p.BondSlaveOf)) {
		return xerr.New(xerr.CannotPlugBondSlave, ref)
	}
	if p.PrimaryAddressType == dm.PrimaryAddressTypeIPV6 {
		if p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeNone || p.IPV6ConfigurationMode == "" {
			return xerr.New(xerr.PIFHasNoV6NetworkConfiguration, ref)
		}
		return nil
	}
	if p.IPConfigurationMode == dm.IPConfigurationModeNone || p.IPConfigurationMode == "" {
		return xerr.New(xerr.PIFHasNoNetworkConfiguration, ref)
	}
	return nil
}

func (h *mgmtHandlers) reconfigure(c *api.Call, ref string) error {
	m := h.m
	p, err := m.localPIF(c, ref)
	if err != nil {
		return err
	}
	if haEnabled(c.Snapshot()) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if p.Managed {
		if err := assertUsableForManagement(ref, &p); err != nil {
			return err
		}
	}
	if p.Management {
		return nil // xapi: already the management PIF, nothing to do
	}
	// 1. Plugged, as network.attach with management_interface does.
	if p.Managed {
		if err := m.change(c.Ctx, func(tx *db.Tx) error {
			if err := plugTx(tx, ref); err != nil {
				return err
			}
			return setMapKey(tx, dm.PIF.OtherConfig, ref, AdoptedKey, "true")
		}); err != nil {
			return err
		}
	}
	// 2. Its address.
	ip, err := m.managementIP(ref)
	if err != nil {
		return err
	}
	// 3. The daemon answers there.
	done, undo, err := h.mg.MoveTo(c.Ctx, ip, false)
	if err != nil {
		return err
	}
	// 4. The records (and the default route, through the new PIF).
	if err := m.change(c.Ctx, func(tx *db.Tx) error { return setManagementTx(tx, m.cfg.HostRef, ref, ip) }); err != nil {
		undo()
		return err
	}
	m.log.Info("the management interface moved", "pif", ref, "device", p.Device, "address", ip)
	// 5. The old address goes.
	done()
	return nil
}

func (h *mgmtHandlers) disable(c *api.Call) error {
	if haEnabled(c.Snapshot()) {
		return xerr.New(xerr.HAIsEnabled)
	}
	if h.mg.Member() {
		return xerr.New(xerr.SlaveRequiresManagementInterface)
	}
	if err := h.m.change(c.Ctx, func(tx *db.Tx) error { return setManagementTx(tx, h.m.cfg.HostRef, "", "") }); err != nil {
		return err
	}
	h.m.log.Warn("the management interface is disabled: the API answers on the local socket only")
	return h.mg.Disable(c.Ctx)
}

// localWriteTimeout bounds the wait for the records of an emergency move
// (the coordinator may be gone for long).
const localWriteTimeout = 2 * time.Minute

func (h *mgmtHandlers) localReconfigure(c *api.Call, iface string) error {
	m := h.m
	if !h.mg.CutOff() {
		return xerr.New(xerr.NotInEmergencyMode)
	}
	ref := ""
	snap := c.Snapshot()
	snap.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Host) != m.cfg.HostRef {
			return true
		}
		bridge := ""
		if n, ok := snap.Get(dm.Network.Class, r.String(dm.PIF.Network)); ok {
			bridge = n.String(dm.Network.Bridge)
		}
		if iface != "" && (bridge == iface || r.String(dm.PIF.Device) == iface) {
			ref = r.Ref
			return false
		}
		return true
	})
	if ref == "" {
		return xerr.New(xerr.InvalidValue, "interface", iface)
	}
	ip, err := m.managementIP(ref)
	if err != nil {
		return err
	}
	done, _, err := h.mg.MoveTo(c.Ctx, ip, true)
	if err != nil {
		return err
	}
	done()
	m.log.Warn("emergency: the management interface moved; the records follow when the pool takes writes", "interface", iface, "address", ip)
	// The member's database takes writes through its coordinator, which
	// it cannot reach now: the records are written in the background.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), localWriteTimeout)
		defer cancel()
		for ctx.Err() == nil {
			if _, err := m.db.Update(func(tx *db.Tx) error { return setManagementTx(tx, m.cfg.HostRef, ref, ip) }); err == nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
		}
		m.log.Warn("emergency management move: the records could not be written", "pif", ref, "address", ip)
	}()
	return nil
}

// managementIP is the address the API moves to on a PIF: its Static
// address, else the first the kernel has on its bridge (or device).
func (m *Manager) managementIP(ref string) (string, error) {
	snap := m.db.Snapshot()
	p, ok := pifRecord(snap, ref)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, "PIF", ref)
	}
	v6 := p.PrimaryAddressType == dm.PrimaryAddressTypeIPV6
	if !v6 && p.IPConfigurationMode == dm.IPConfigurationModeStatic && validIPv4(p.IP) {
		return p.IP, nil
	}
	if v6 && p.IPV6ConfigurationMode == dm.IPV6ConfigurationModeStatic {
		for _, a := range p.IPV6 {
			if ip, ok := parseIPv6CIDR(a); ok {
				return ip.IP.String(), nil
			}
		}
	}
	dev := p.Device
	if p.Managed && adopted(&p) {
		if n, ok := snap.Get(dm.Network.Class, string(p.Network)); ok && n.String(dm.Network.Bridge) != "" {
			dev = n.String(dm.Network.Bridge)
		}
	}
	fam := 4
	if v6 {
		fam = 6
	}
	addrs, err := m.cfg.Links.Addrs(dev, fam)
	if err != nil {
		return "", kernelErr("reading the addresses of "+dev, err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() || a.IP.IsLoopback() {
			continue
		}
		return a.IP.String(), nil
	}
	return "", xerr.New(xerr.PIFConfigurationError, ref, fmt.Sprintf("%s has no IPv%d address for the management interface", dev, fam))
}

// setManagementTx makes pif (none: "") the host's only management PIF and
// ip its address (none: host.address stays, as xapi's
// management_disable leaves it). A management PIF whose NIC toolstackd
// never adopted stays unadopted once it is not the management PIF.
func setManagementTx(tx *db.Tx, host, pif, ip string) error {
	var refs []string
	tx.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Host) == host {
			refs = append(refs, r.Ref)
		}
		return true
	})
	for _, ref := range refs {
		p, _ := pifRecord(tx, ref)
		want := ref == pif
		if p.Management == want {
			continue
		}
		if !want && p.OtherConfig[AdoptedKey] != "true" {
			if err := setMapKey(tx, dm.PIF.OtherConfig, ref, AdoptedKey, "false"); err != nil {
				return err
			}
		}
		if err := tx.Set(dm.PIF.Management, ref, want); err != nil {
			return err
		}
	}
	if ip == "" {
		return nil
	}
	if net.ParseIP(ip) == nil {
		return xerr.New(xerr.InvalidIPAddressSpecified, "IP")
	}
	row, ok := tx.Get(dm.Host.Class, host)
	if !ok {
		return xerr.New(xerr.HandleInvalid, "host", host)
	}
	if row.String(dm.Host.Address) == ip {
		return nil
	}
	return tx.Set(dm.Host.Address, host, ip)
}
