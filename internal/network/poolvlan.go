package network

import (
	"context"
	"fmt"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
)

// The pool-wide VLAN calls run on the coordinator and make a VLAN on
// each host through the pipeline (so each runs on its host, as the
// route table says): pool.create_VLAN_from_PIF on every live host's PIF
// of the given PIF's network, and the deprecated pool.create_VLAN on
// every host's PIF of a device. One failure undoes the VLANs already
// made, best effort, and is returned.

// poolCreateVLANFromPIF is pool.create_VLAN_from_PIF.
func (m *Manager) poolCreateVLANFromPIF(c *api.Call, a dm.PoolCreateVLANFromPIFArgs) ([]dm.PIFRef, error) {
	row, err := c.Lookup(dm.PIF.Class, string(a.PIF))
	if err != nil {
		return nil, err
	}
	on := row.String(dm.PIF.Network)
	snap := c.Snapshot()
	var tagged []string
	snap.Ascend(dm.PIF.Class, func(r *db.Row) bool {
		if r.String(dm.PIF.Network) != on {
			return true
		}
		if h, ok := snap.Get(dm.Host.Class, r.String(dm.PIF.Host)); ok {
			if live, _ := forwarding.MetricsLive(snap, h); live {
				tagged = append(tagged, r.Ref)
			}
		}
		return true
	})
	var vlans []string
	for _, t := range tagged {
		v, _, err := m.cfg.Server.Invoke(c.Ctx, c.Session.Ref, "VLAN.create", t, a.VLAN, string(a.Network))
		if err != nil {
			m.undoVLANs(c, "VLAN.destroy", vlans)
			return nil, err
		}
		vlans = append(vlans, fmt.Sprint(v))
	}
	now := m.db.Snapshot()
	out := make([]dm.PIFRef, 0, len(vlans))
	for _, v := range vlans {
		if r, ok := now.Get(dm.VLAN.Class, v); ok {
			out = append(out, dm.PIFRef(r.String(dm.VLAN.UntaggedPIF)))
		}
	}
	return out, nil
}

// poolCreateVLAN is the deprecated pool.create_VLAN: PIF.create_VLAN on
// every host.
func (m *Manager) poolCreateVLAN(c *api.Call, a dm.PoolCreateVLANArgs) ([]dm.PIFRef, error) {
	if _, err := c.Lookup(dm.Network.Class, string(a.Network)); err != nil {
		return nil, err
	}
	var pifs []dm.PIFRef
	var made []string
	for _, h := range c.Snapshot().All(dm.Host.Class) {
		p, _, err := m.cfg.Server.Invoke(c.Ctx, c.Session.Ref, "PIF.create_VLAN", a.Device, string(a.Network), h.Ref, a.VLAN)
		if err != nil {
			m.undoVLANs(c, "PIF.destroy", made)
			return nil, err
		}
		made = append(made, fmt.Sprint(p))
		pifs = append(pifs, dm.PIFRef(fmt.Sprint(p)))
	}
	return pifs, nil
}

// undoVLANs destroys what a failed pool-wide call made, best effort.
func (m *Manager) undoVLANs(c *api.Call, destroy string, refs []string) {
	ctx := context.WithoutCancel(c.Ctx)
	for _, r := range refs {
		if _, _, err := m.cfg.Server.Invoke(ctx, c.Session.Ref, destroy, r); err != nil {
			m.log.Warn("network: undoing a pool-wide VLAN", "call", destroy, "ref", r, "err", err)
		}
	}
}
