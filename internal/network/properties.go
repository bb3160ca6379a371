package network

import (
	"fmt"
	"slices"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// PIF properties (PIF.set_property): xapi knows one, "gro" (generic
// receive offload), "on" or "off", on physical PIFs and bond masters; a
// bond's members carry their master's. The planner turns the property
// of every plugged PIF the module has adopted, and of a NIC under a
// VLAN, into Plan.GRO; the reconciler sets it on the device (and a
// bond's members) when the Links implementation can (Offloads), and
// leaves the device as it is otherwise. A NIC the module has not
// adopted (the management NIC as the distribution configured it) is
// never in the plan, so its offloads stay the distribution's.

// propertyValues are the PIF properties and the values each may take.
var propertyValues = map[string][]string{"gro": {"on", "off"}}

// Offloads is the optional part of Links that reads and sets a device's
// generic receive offload.
type Offloads interface {
	GRO(name string) (bool, error)
	SetGRO(name string, on bool) error
}

// setProperty is PIF.set_property.
func (m *Manager) setProperty(c *api.Call, a dm.PIFSetPropertyArgs) (dm.Void, error) {
	self := string(a.Self)
	if !slices.Contains(propertyValues[a.Name], a.Value) {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "properties", fmt.Sprintf("%s = %s", a.Name, a.Value))
	}
	p, err := m.localPIF(c, self)
	if err != nil {
		return dm.Void{}, err
	}
	if !(p.Physical || len(p.BondMasterOf) > 0) || !isNull(string(p.BondSlaveOf)) {
		return dm.Void{}, xerr.New(xerr.CannotChangePIFProperties, self)
	}
	props := map[string]string{}
	for k, v := range p.Properties {
		props[k] = v
	}
	props[a.Name] = a.Value
	return dm.Void{}, m.change(c.Ctx, func(tx *db.Tx) error {
		targets := []string{self}
		for _, b := range p.BondMasterOf {
			if row, ok := tx.Get(dm.Bond.Class, string(b)); ok {
				var br dm.BondRecord
				br.FromRow(tx.Values(row))
				for _, s := range br.Slaves {
					targets = append(targets, string(s))
				}
			}
		}
		for _, t := range targets {
			if err := tx.Set(dm.PIF.Properties, t, props); err != nil {
				return err
			}
		}
		return nil
	})
}

// gro plans p's "gro" property on its device and, for a bond, on the
// bond's members (planned before). The caller plans it only for a PIF
// whose NIC the module may change (adopted).
func (c *planner) gro(p *dm.PIFRecord) {
	v := p.Properties["gro"]
	if v != "on" && v != "off" || !(p.Physical || len(p.BondMasterOf) > 0) {
		return
	}
	devs := []string{p.Device}
	for _, b := range c.p.Bonds {
		if b.Name == p.Device {
			devs = append(devs, b.Members...)
		}
	}
	if c.p.GRO == nil {
		c.p.GRO = map[string]bool{}
	}
	for _, d := range devs {
		c.p.GRO[d] = v == "on"
	}
}

// gro sets a device's generic receive offload as planned, when the
// Links can.
func (r *reconciler) gro(name string, on bool) error {
	o, ok := r.l.(Offloads)
	if !ok {
		return nil
	}
	cur, err := o.GRO(name)
	if err != nil {
		return kernelErr("reading the offloads of "+name, err)
	}
	if cur == on {
		return nil
	}
	// A NIC under a VLAN is brought up without being made ours when
	// it is up already; its offloads are changed only once it is.
	if _, err := r.own(name); err != nil {
		return err
	}
	word := map[bool]string{true: "on", false: "off"}
	return r.do(func() error { return o.SetGRO(name, cur) }, "turning GRO "+word[on]+" on "+name,
		func() error { return o.SetGRO(name, on) })
}
