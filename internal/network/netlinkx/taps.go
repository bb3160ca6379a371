package netlinkx

import (
	"errors"
	"fmt"

	"toolstackd/internal/network"
)

// The methods below serve a VM lifecycle that has no network module
// (the daemon's --network-backend none): a VIF's tap goes on a bridge
// its network names when that bridge exists, whoever made it. The tap
// is ours (marked and removed by us); the bridge is only read and has
// the tap enslaved to it, which is what attaching a VM's NIC to a
// bridge the operator made means. With the network module the Manager
// makes taps through network.Links instead, on bridges it made.

// HasBridge says whether a bridge of that name is in the namespace.
func (n *NS) HasBridge(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.lookup(name)
	return err == nil && l.Type() == "bridge"
}

// PlugTap makes the persistent tap name (a leftover tap of that name is
// removed first), with mtu (1500 when 0), on bridge, and sets it up; if
// a step fails the tap is removed again.
func (n *NS) PlugTap(name, bridge string, mtu int) error {
	if mtu <= 0 {
		mtu = 1500
	}
	if err := n.RemoveTap(name); err != nil {
		return err
	}
	if err := n.AddTap(name, mtu); err != nil {
		return err
	}
	if err := n.MoveTap(name, bridge); err != nil {
		_ = n.RemoveTap(name)
		return err
	}
	if err := n.SetUp(name); err != nil {
		_ = n.RemoveTap(name)
		return err
	}
	return nil
}

// MoveTap puts the tap name, which must be ours, on bridge (any
// bridge: see above).
func (n *NS) MoveTap(name, bridge string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.ours(name)
	if err != nil {
		return err
	}
	b, err := n.lookup(bridge)
	if err != nil {
		return err
	}
	if b.Type() != "bridge" {
		return fmt.Errorf("netlinkx: %s is a %s, not a bridge", bridge, b.Type())
	}
	if l.Attrs().MasterIndex == b.Attrs().Index {
		return nil
	}
	return n.translate(n.h.LinkSetMaster(l, b), "set master "+bridge, name)
}

// RemoveTap deletes the tap name if it is there. The caller vouches
// that the name is one of its taps: an unmarked tap is removed too (one
// made by an older toolstackd with ip(8)), but a link of another kind is
// refused.
func (n *NS) RemoveTap(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.lookup(name)
	if errors.Is(err, network.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if l.Type() != "tuntap" {
		return fmt.Errorf("netlinkx: %s is a %s, not a tap: %w", name, l.Type(), network.ErrNotOurs)
	}
	err = n.translate(n.h.LinkDel(l), "delete", name)
	if errors.Is(err, network.ErrNotFound) {
		return nil
	}
	return err
}
