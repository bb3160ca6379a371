package network

import (
	"strconv"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
)

func itoa(n int) string { return strconv.Itoa(n) }

// Register makes a Manager and binds the networking messages to it on
// cfg.Server: PIF.scan, introduce, forget, plug, unplug, reconfigure_ip,
// set_primary_address_type, db_introduce, db_forget, create_VLAN and
// destroy; VLAN.create and destroy; Bond.create, destroy, set_mode and
// set_property; tunnel.create and destroy; PIF.set_property;
// pool.create_VLAN and create_VLAN_from_PIF. The forwarding table runs
// each on the host whose kernel it changes.
func Register(cfg Config) (*Manager, error) {
	m, err := New(cfg)
	if err != nil {
		return nil, err
	}
	s := cfg.Server
	api.Register(s, func(c *api.Call, a dm.PIFScanArgs) (dm.Void, error) { return dm.Void{}, m.scan(c, string(a.Host)) })
	api.Register(s, m.introduce)
	api.Register(s, func(c *api.Call, a dm.PIFForgetArgs) (dm.Void, error) { return dm.Void{}, m.forget(c, string(a.Self)) })
	api.Register(s, func(c *api.Call, a dm.PIFPlugArgs) (dm.Void, error) { return dm.Void{}, m.plug(c, string(a.Self)) })
	api.Register(s, func(c *api.Call, a dm.PIFUnplugArgs) (dm.Void, error) { return dm.Void{}, m.unplug(c, string(a.Self)) })
	api.Register(s, func(c *api.Call, a dm.PIFReconfigureIPArgs) (dm.Void, error) { return dm.Void{}, m.reconfigureIP(c, a) })
	api.Register(s, func(c *api.Call, a dm.PIFReconfigureIPV6Args) (dm.Void, error) {
		return dm.Void{}, m.reconfigureIPv6(c, a)
	})
	api.Register(s, func(c *api.Call, a dm.PIFSetPrimaryAddressTypeArgs) (dm.Void, error) {
		return dm.Void{}, m.setPrimaryAddressType(c, a)
	})
	api.Register(s, dbIntroduce)
	api.Register(s, func(c *api.Call, a dm.PIFDbForgetArgs) (dm.Void, error) {
		return dm.Void{}, dbForget(c, string(a.Self))
	})
	api.Register(s, m.createVLANOnDevice)
	api.Register(s, m.setProperty)
	api.Register(s, m.poolCreateVLANFromPIF)
	api.Register(s, m.poolCreateVLAN)
	api.Register(s, func(c *api.Call, a dm.PIFDestroyArgs) (dm.Void, error) {
		return dm.Void{}, m.destroyVLANPIF(c, string(a.Self))
	})
	api.Register(s, func(c *api.Call, a dm.VLANCreateArgs) (dm.VLANRef, error) {
		v, err := m.createVLAN(c, string(a.TaggedPIF), a.Tag, string(a.Network))
		return dm.VLANRef(v), err
	})
	api.Register(s, func(c *api.Call, a dm.VLANDestroyArgs) (dm.Void, error) {
		return dm.Void{}, m.destroyVLAN(c, string(a.Self))
	})
	api.Register(s, m.createBond)
	api.Register(s, func(c *api.Call, a dm.BondDestroyArgs) (dm.Void, error) {
		return dm.Void{}, m.destroyBond(c, string(a.Self))
	})
	api.Register(s, func(c *api.Call, a dm.BondSetModeArgs) (dm.Void, error) {
		return dm.Void{}, m.setBondMode(c, string(a.Self), a.Value)
	})
	api.Register(s, func(c *api.Call, a dm.BondSetPropertyArgs) (dm.Void, error) {
		return dm.Void{}, m.setBondProperty(c, string(a.Self), a.Name, a.Value)
	})
	api.Register(s, m.createTunnel)
	api.Register(s, func(c *api.Call, a dm.TunnelDestroyArgs) (dm.Void, error) {
		return dm.Void{}, m.destroyTunnel(c, string(a.Self))
	})
	return m, nil
}
