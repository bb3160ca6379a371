package main

import (
	"context"
	"fmt"

	"toolstackd/internal/network"
	"toolstackd/internal/network/ovs"
)

// networkOVS is --network-backend openvswitch: networks as Open vSwitch
// bridges through OVSDB, VIFs as their ports (package network/ovs), with
// OVN's logical switch ports when --ovn-nb is set.
const networkOVS = "openvswitch"

// openOVS connects to Open vSwitch (and OVN) and makes cfg use it: the
// Switch stands in front of the kernel's links for bridges and ports,
// and takes and locks the VIFs. Without Open vSwitch the daemon does not start,
// and the error says what is missing.
func (h *host) openOVS(o options, kernel network.Links, cfg *network.Config) error {
	sw, err := ovs.Open(context.Background(), ovs.Config{DB: o.ovsDB, Kernel: kernel, Datapath: o.ovsDatapath,
		OVN: o.ovnNB, Log: cfg.Log})
	if err != nil {
		return fmt.Errorf("--network-backend openvswitch: %w", err)
	}
	h.closers = append(h.closers, sw.Close)
	// The switch also locks the VIFs (OpenFlow rules, or OVN's port
	// security): nf_tables' bridge rules never see an Open vSwitch port.
	cfg.Links, cfg.VIFPorts, cfg.Locker = sw, sw, sw
	return nil
}
