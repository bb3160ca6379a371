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
//
// # What the kernel is asked for
//
// Compute (plan.go) derives, from the database alone, what this host's
// kernel should have. A network gets its bridge (network.bridge, with
// the network's MTU) here when a PIF of this host on it is plugged
// (currently_attached), when a VIF of a VM resident here and Running or
// Paused is plugged on it, or when EnsureVIF or Attach asked for it. A
// plugged PIF puts one or more ports in that bridge:
//
//   - a physical PIF, its NIC (made ours with Links.Adopt, its MTU set
//     to the network's);
//   - a VLAN PIF, the 802.1Q link "<device>.<tag>" on the device of its
//     tagged PIF (the NIC, brought up if it is down, or the bond);
//   - a bond PIF, the bond "bond<N>" with its members' NICs;
//   - a tunnel's access PIF, VXLAN links (below).
//
// A network without PIFs (a private network) gets a bridge with no port
// and stays inside the host. A Static PIF's address goes on its bridge,
// the default route through the management PIF's; a PIF in mode None
// has no address on its bridge; DHCP addresses are not touched.
//
// # The management NIC
//
// First boot records the NIC that carries the host's address as the
// management PIF, plugged. Putting that NIC in a bridge would cut the
// host off, so a management PIF is planned only once adopted: its
// other_config holds "toolstackd-adopted": "true" (AdoptedKey). Until
// then its NIC is never made ours, bridged or changed (reconfigure_ip
// records a configuration that takes effect when the PIF is adopted),
// and its network has no bridge here unless a VM uses it, in which case
// the bridge has no port. PIF.plug of the management PIF adopts it: the
// NIC goes into its network's bridge and its addresses and default
// route move to the bridge in the same change. To take a host's
// management NIC over from the start, plug its PIF once.
//
// # Tunnels
//
// Only VXLAN tunnels are made (tunnel.create with protocol gre is
// refused with VALUE_NOT_SUPPORTED). The hosts with a tunnel on a
// network are joined as a star: a Linux bridge forwards between its
// ports, so a full mesh of three or more hosts would loop broadcasts.
// The hub is the pool coordinator when it has a tunnel on the network,
// otherwise the host with the smallest uuid that has one; it has a link
// to every other such host and each of them one link to it. Each link
// is a VXLAN device "vx<VNI in hex>" from this host's transport PIF IP
// to the far end's, on UDP port 4789, with its own VNI, because the
// kernel allows one VXLAN device per VNI and port: the VNI is the first
// 24 bits of SHA-256 of "<network uuid>/<spoke host uuid>" (never 0),
// which both ends compute alike and which does not change while the
// network and the spoke exist. Two links of one host with the same VNI
// (a hash collision, one in millions) leave the second out with
// PIF_CONFIGURATION_ERROR. A remote whose transport address changes
// gets a new link only when the tunnel is plugged again.
//
// # Bonds
//
// Bond modes map to the Linux bonding driver's: balance-slb to
// balance-tlb (like Open vSwitch's SLB it needs nothing of the switch;
// balance-xor would need a static link aggregation there),
// active-backup to active-backup, lacp to 802.3ad with
// hashing_algorithm src_mac or tcpudp_ports as xmit_hash_policy layer2
// or layer3+4 and lacp-time as lacp_rate; links are watched with miimon
// 100. A bond needs two members (PIF_BOND_NEEDS_MORE_MEMBERS). Bonding
// the management PIF, or members that carry VLANs or tunnels, is
// refused (PIF_IS_MANAGEMENT_INTERFACE, PIF_VLAN_STILL_EXISTS,
// PIF_TUNNEL_STILL_EXISTS) where xapi would move them onto the bond.
// Bond.set_mode and set_property make the kernel's bond again.
//
// # VIFs
//
// The QEMU backend gets each VIF's tap from the module (taps.go):
// PlugTap makes it with the network's MTU on the bridge EnsureVIF made,
// sets it up and applies the VIF's locking rules (lock.go) and rate
// limit (qos.go: "ratelimit" with kbps in KiB/s limits what the guest
// sends, as netback does on Xen) before QEMU opens it; UnplugTap takes
// it away with its rules and limit. Both follow the database while the
// VIF runs (Watch).
//
// # The management interface
//
// RegisterManagement serves host.management_reconfigure (on the PIF's
// host), pool.management_reconfigure (on the coordinator, members
// first), host.management_disable and host.local_management_reconfigure
// with xapi's checks and errors (management.go): the module plugs the
// new management PIF and reads its address, the daemon (the Management
// interface) serves the API there and makes it the host's intra-pool
// address, and only then do PIF.management and host.address change and
// the old listener close. A former management PIF whose NIC toolstackd
// never adopted is marked AdoptedKey "false": its NIC stays as the
// distribution set it up until it is plugged.
//
// # Changes and failures
//
// Apply reconciles: what is missing is made, MTUs, masters, addresses
// and routes are fixed, links of ours the plan no longer has are
// removed, nothing else is touched, and when everything matches no call
// is made. Each XenAPI change plans the database as it would be after
// the change, changes the kernel, and only then commits: when the
// kernel fails, what was made is undone in reverse, the kernel is
// brought back to the database, the database is not changed, and the
// caller gets the XenAPI error. A kernel without 802.1Q, bonding or
// VXLAN answers INTERNAL_ERROR naming the operation and the missing
// feature. DHCP (IPv4) runs BusyBox's udhcpc per plugged DHCP PIF when
// Config.DHCPClient is given (dhcp.go, dhcpclients.go): the daemon
// applies each checked lease itself; without a client, reconfigure_ip
// to DHCP is refused with PIF_CONFIGURATION_ERROR naming what is
// missing. DHCPv6 (reconfigure_ipv6 mode DHCP) runs ISC's dhclient -6
// per plugged DHCPv6 PIF when Config.DHCP6Client is given (dhcp6.go,
// dhcp6clients.go), as xapi's networkd does; the daemon checks and
// applies each lease (PIF.IPv6 "address/prefix") and releases it when
// the PIF leaves DHCP mode, is unplugged or forgotten; without dhclient
// the refusal names the package to install (isc-dhcp-client).
// Watch re-plans on database changes, so that what other hosts and the
// VM lifecycle record reaches the kernel.
package network
