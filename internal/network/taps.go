package network

import (
	"context"
	"fmt"
)

// Taps of VMs' NICs. The VM lifecycle's QEMU backend asks the module for
// a VIF's tap (PlugTap) once EnsureVIF has made the VIF's network real
// here, and gives it back (UnplugTap) when the NIC is unplugged or the
// domain goes. The tap is made through Links like every other link of
// the module (so it is ours, in the module's namespace: QEMU opens it
// by name, so that must be the namespace QEMU runs in), with the
// network's MTU, on the network's bridge, up, and with the VIF's
// locking rules and rate limit (LockVIF) before it is handed over, so
// that the guest's first frame already meets them.

// HasBridge says whether the bridge is in the module's namespace.
func (m *Manager) HasBridge(bridge string) bool {
	l, err := m.cfg.Links.Get(bridge)
	return err == nil && l.Kind == "bridge"
}

// PlugTap makes the tap of the VIF vifRef: a leftover tap of that name
// (an earlier domain's) is removed first; on failure nothing is left.
func (m *Manager) PlugTap(ctx context.Context, vifRef, tap, bridge string, mtu int) error {
	if mtu <= 0 {
		mtu = 1500
	}
	l := m.cfg.Links
	m.unlockVIF(vifRef)
	if err := l.Delete(tap); err != nil {
		return kernelErr("removing the leftover tap "+tap, err)
	}
	if err := l.AddTap(tap, mtu); err != nil {
		return kernelErr("making tap "+tap, err)
	}
	err := l.SetMaster(tap, bridge)
	if err == nil {
		err = l.SetUp(tap)
	}
	if err != nil {
		_ = l.Delete(tap)
		return kernelErr(fmt.Sprintf("putting tap %s on %s", tap, bridge), err)
	}
	if err := m.LockVIF(ctx, vifRef, tap); err != nil {
		m.unlockVIF(vifRef)
		_ = l.Delete(tap)
		return err
	}
	return nil
}

// UnplugTap removes the VIF's tap with its locking rules and rate limit;
// a tap that is not there is not an error.
func (m *Manager) UnplugTap(_ context.Context, vifRef, tap string) error {
	m.unlockVIF(vifRef)
	if s := m.shaper(); s != nil {
		if err := s.SetRate(tap, 0, 0); err != nil {
			m.log.Warn("network: removing a tap's rate limit", "tap", tap, "err", err)
		}
	}
	if err := m.cfg.Links.Delete(tap); err != nil {
		return kernelErr("removing tap "+tap, err)
	}
	return nil
}

// MoveTap puts a plugged VIF's tap on another bridge (VIF.move, after
// MoveVIF made that bridge).
func (m *Manager) MoveTap(_ context.Context, tap, bridge string) error {
	if err := m.cfg.Links.SetMaster(tap, bridge); err != nil {
		return kernelErr(fmt.Sprintf("moving tap %s to %s", tap, bridge), err)
	}
	return nil
}
