package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
	"toolstackd/internal/network/netlinkx"
)

// Network backends (--network-backend).
const (
	// networkNone keeps networks in the database only: no bridge is made
	// (make run, tests, hosts where toolstackd must not touch networking).
	networkNone = "none"
	// networkLinux makes them real with Linux bridges through netlink
	// (the installed service).
	networkLinux = "linux"
)

// openNetwork brings up the network module (internal/network) when the
// backend is linux: bridges, PIFs, VLANs, bonds and tunnels in the
// namespace --network-namespace names (the daemon's own by default),
// reapplied from the database now and kept in step with it. With
// backend none it does nothing and the network messages are not served.
func (h *host) openNetwork(o options, hostRef string) error {
	switch o.networkBackend {
	case networkNone:
		return nil
	case networkLinux, networkOVS:
	default:
		return fmt.Errorf("--network-backend %q: none, linux or openvswitch", o.networkBackend)
	}
	links, err := netlinkx.Open(o.networkNamespace)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	h.closers = append(h.closers, links.Close)
	log := h.log.With("component", "network")
	cfg := network.Config{Links: links, Server: h.srv, HostRef: hostRef, Log: log}
	if o.networkBackend == networkOVS {
		// Bridges and VIF ports in Open vSwitch (network_ovs.go).
		if err := h.openOVS(o, links, &cfg); err != nil {
			return err
		}
	}
	// VIF locking with nf_tables (Open vSwitch locks its own ports);
	// without it, VIFs that must be locked or disabled are refused (never
	// left open).
	if cfg.Locker == nil {
		if locker, err := locking.Open(o.networkNamespace); err != nil {
			log.Warn("VIF locking is not available: locked and disabled VIFs will be refused", "err", err)
		} else {
			cfg.Locker = locker
			h.closers = append(h.closers, locker.Close)
		}
	}
	// DHCP for PIFs through BusyBox's udhcpc (internal/network/dhcp.go);
	// without it reconfigure_ip to DHCP is refused, naming what is missing.
	if u, err := network.FindUdhcpc("/usr/bin/busybox", o.networkNamespace); err != nil {
		log.Info("PIFs cannot use DHCP", "err", err)
		cfg.DHCPMissing = err.Error()
	} else {
		cfg.DHCPClient = u
		h.closers = append(h.closers, u.Close)
	}
	// DHCPv6 through ISC's dhclient -6 (internal/network/dhcp6.go): its
	// leases in the data directory, its pid files and script in the run
	// directory; without it reconfigure_ipv6 to DHCP is refused, naming
	// the package to install.
	if dc, err := network.FindDhclient(o.networkNamespace, filepath.Join(o.dataDir, "dhcp6"), filepath.Join(o.runDir, "dhcp6")); err != nil {
		log.Info("PIFs cannot use DHCPv6", "err", err)
		cfg.DHCP6Missing = err.Error()
	} else {
		cfg.DHCP6Client = dc
		h.closers = append(h.closers, dc.Close)
	}
	m, err := network.Register(cfg)
	if err != nil {
		return err
	}
	h.net = m
	if o.mgmt != nil {
		network.RegisterManagement(m, o.mgmt)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// At start-up what the database says is made again; a failure is
	// logged, not fatal (the API must come up to fix it).
	if err := m.Apply(ctx); err != nil {
		log.Warn("reapplying the host's networking", "err", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Watch(ctx, 2*time.Second)
	}()
	h.closers = append(h.closers, func() error { cancel(); <-done; return nil })
	return nil
}
