package main

import (
	"toolstackd/internal/xenops/qemu"
)

// withTaps gives the QEMU backend its VIFs' taps from the network module
// (tap, MTU, bridge, locking rules and rate limit, all through netlink)
// when the daemon runs one in its own namespace. QEMU opens a tap by
// name in the namespace it runs in, the daemon's: with the module acting
// in another namespace (--network-namespace) its taps would be out of
// QEMU's reach, so the backend then makes them itself in the daemon's
// namespace, as it does with --network-backend none.
func (h *host) withTaps(o options, c qemu.Config) qemu.Config {
	if h.net == nil {
		return c
	}
	if o.networkNamespace != "" {
		h.log.Info("network: VIF taps are made in the daemon's namespace, not the network module's", "namespace", o.networkNamespace)
		return c
	}
	c.Taps = h.net
	return c
}
