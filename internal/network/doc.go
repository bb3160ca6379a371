// Package network makes a host's share of the pool's networks real: Linux
// bridges for networks, PIFs on physical NICs, VLANs, bonds and VXLAN
// tunnels, and taps for VMs' VIFs, as xapi's networkd does for Xen.
//
// The kernel is reached through the Links interface (links.go): netlink
// in the daemon (package network/netlinkx), an in-memory Recorder in
// tests of what the kernels here cannot do. Links the module makes are
// marked as its own; a bridge or port made by someone else, and the NIC
// that carries the host's address when toolstackd first starts, are
// never changed unless the operator asks (PIF.plug,
// host.management_reconfigure).
package network
