package api

import (
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// host.disable and host.enable: a disabled host takes no new VMs (starts,
// resumes and placement skip it) while the VMs it runs go on running.
// Both are routed to the host itself, as xapi routes them. With HA on,
// disabling a host is checked against the failover plan by HA's guard.
//
// xapi remembers auto_enable=false in the host's local database so that
// the host stays disabled across a restart of the toolstack; toolstackd
// keeps the enabled flag in the replicated database and never re-enables
// a host by itself, so a disabled host stays disabled either way until
// host.enable.
func (s *Server) registerHostOps() {
	Register(s, func(c *Call, a dm.HostDisableArgs) (dm.Void, error) {
		return dm.Void{}, setHostEnabled(c, string(a.Host), false)
	})
	Register(s, func(c *Call, a dm.HostEnableArgs) (dm.Void, error) {
		return dm.Void{}, setHostEnabled(c, string(a.Host), true)
	})
}

// setHostEnabled sets host.enabled when it differs.
func setHostEnabled(c *Call, host string, on bool) error {
	if _, err := c.Lookup(dm.Host.Class, host); err != nil {
		return err
	}
	return c.Update(func(tx *db.Tx) error {
		h, ok := tx.Get(dm.Host.Class, host)
		if !ok || h.Get(dm.Host.Enabled) == on {
			return nil
		}
		return tx.Set(dm.Host.Enabled, host, on)
	})
}
