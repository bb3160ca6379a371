// Package ovs is the Open vSwitch backend of the network module
// (toolstackd --network-backend openvswitch), with an optional OVN mode
// (--ovn-nb).
//
// # What it does
//
// A Switch stands where the Linux backend's netlinkx stands: it is the
// network.Links the module's reconciler works through, so planning,
// rollback and start-up reapplication are the module's own and unchanged.
// Bridges and bridge ports are Open vSwitch's, everything else (NICs,
// bonds, VLANs, VXLAN links, addresses, routes, taps) stays the kernel's,
// reached through the netlinkx Links given as Config.Kernel:
//
//   - a network realised on this host is one Open vSwitch bridge, named
//     as the network's record says (its bridge field), with its internal
//     interface at the network's MTU (mtu_request);
//   - a plugged PIF's device (a NIC, bond or VLAN link) is a port of the
//     bridge;
//   - every VIF EnsureVIF serves is a port of the bridge, its Interface
//     carrying the external_ids xenopsd and Open vSwitch's integration
//     guide use (iface-id and xs-vif-uuid: the VIF's uuid, vm-id and
//     xs-vm-uuid: the VM's, xs-network-uuid, attached-mac,
//     iface-status=active). The port's device is at first a persistent
//     tap the switch makes, named by TapName (tsv and 12 hex digits of
//     the VIF's uuid), which is all a backend that makes no taps (the
//     simulator) gets; when the VM's backend makes the VIF's tap itself
//     (QEMU, through the module's PlugTap, which puts it on the bridge
//     as a port and hands it to LockVIF), that tap takes the VIF's
//     identity and the switch's own tap goes. Release removes the
//     VIF's port (and the switch's tap); a backend's tap leaves its
//     bridge when the backend deletes it.
//
// Bridges and Port rows toolstackd makes carry external_ids:toolstackd
// (OwnerKey); a bridge or port without it is never changed or removed
// (the error wraps network.ErrNotOurs), as the Linux backend leaves
// links it did not make alone.
//
// Every change is one OVSDB transaction that also increments
// Open_vSwitch.next_cfg; it returns once ovs-vswitchd has applied it
// (cur_cfg caught up), as ovs-vsctl does, so that the bridge's device
// exists when the reconciler brings it up. ovs-vswitchd not answering
// within Config.Timeout is an error naming it.
//
// # Datapath
//
// New bridges get the kernel datapath ("system") when ovs-vswitchd
// offers it, which it does when the openvswitch kernel module is loaded,
// and otherwise the userspace datapath ("netdev"), which needs no kernel
// module: ovs-vswitchd forwards the packets itself and the bridge's
// device is a tap it made. The choice is probed from
// Open_vSwitch.datapath_types at Open (ChooseDatapath) and logged;
// Config.Datapath forces one. The machines this project is developed on
// have no openvswitch module, so the tests run the userspace datapath.
//
// The userspace datapath needs Open vSwitch's userspace TSO
// (Open_vSwitch other_config:userspace-tso-enable=true, read when
// ovs-vswitchd starts; KeyUserspaceTSO) for QEMU guests: without it
// ovs-vswitchd reads a tap with a plain packet socket and forwards the
// TCP segments a virtio guest leaves to the host to checksum (and
// segment) unfinished, and the receiving guest drops them; ARP and ICMP
// still pass. Open warns when it is off; the switch does not change
// ovs-vswitchd's global configuration itself.
//
// # OVN mode
//
// With Config.OVN naming OVN's northbound database, plugging a VIF also
// makes its logical switch port (Northbound.EnsurePort): on a logical
// switch named by the network's uuid, made if missing; the port named by
// the VIF's uuid, which is the iface-id its Interface carries, so that
// ovn-controller on the host binds it; addresses "MAC [allowed IPs]";
// port_security from the VIF's locking mode (locked: the MAC and its
// allowed addresses; unlocked: none; disabled: the port is not enabled).
// Unplugging removes the port; logical switches are left (other hosts'
// VIFs may be on them).
//
// # VIF locking without OVN
//
// Without OVN mode a VIF's locking is OpenFlow rules on its port, as
// xenopsd's vif scripts write them on an Open vSwitch bridge (flows.go
// has the rule set): locked lets through only DHCP requests, ARP and
// IPv4 from the VIF's MAC and allowed addresses, and neighbour discovery,
// ICMPv6, TCP and UDP from its allowed IPv6 addresses, with router
// advertisements and the like dropped; disabled drops everything from
// the port and sets its tap down, so nothing reaches it either; unlocked
// has no rules. The rules are written with ovs-ofctl on the bridge's
// management socket (Config.RunDir), each change one OpenFlow bundle
// (applied whole or not at all), every rule carrying a cookie made from
// the VIF's uuid, so that they are replaced and removed exactly: written
// when the port is made or the VIF's locking changes (the module's
// Watch plugs the port again), removed when the port leaves its bridge
// (unplug, the tap deleted, a move), and written again for every port
// at Open from the locking each VIF's Port row records (external_ids
// toolstackd-locking-mode, toolstackd-ipv4-allowed,
// toolstackd-ipv6-allowed), rules of ours without a port removed. The
// switch is also the module's network.Locker for this backend
// (nf_tables' bridge rules never see an Open vSwitch port). Without
// ovs-ofctl (Debian's openvswitch-switch ships it), a VIF that must be
// locked or disabled is refused with INTERNAL_ERROR naming it, never
// left open.
//
// # When Open vSwitch is missing
//
// Open fails with an error saying what is missing: the database socket
// (Config.DB, DefaultDB by default) and, when ovsdb-server or
// ovs-vswitchd are not installed, the Debian package (openvswitch-switch;
// ovn-central for the northbound database). The daemon then does not
// start with --network-backend openvswitch; the Linux backend is
// unaffected.
//
// # The library
//
// OVSDB is spoken with github.com/ovn-kubernetes/libovsdb (the
// maintained home of the former ovn-org/libovsdb), chosen for the
// project: a native RFC 7047 client with schema validation and a
// monitored cache, so that no ovs-vsctl or ovn-nbctl process is run per
// change and every change is a single transaction. Only the columns in
// model.go are used; libovsdb checks them against the server's schema
// when it connects.
//
// # What is not here
//
// QEMU opens its taps in the daemon's namespace, so its VIFs reach an
// Open vSwitch bridge only when the module acts there too (no
// --network-namespace); the namespaced tests use the simulator, and
// tests/xenops TestGuestsOnOpenvSwitch runs two QEMU guests on a bridge
// in the machine's own namespace. After a
// restart of the daemon, the ports of running VMs stay in the database
// and are removed when their VMs stop, but their external_ids and OVN
// ports follow changes of the VIF only for the taps QEMU hands back.
// VLANs on an Open vSwitch bridge are the kernel's 802.1Q links as
// ports, not Open vSwitch fake bridges. OpenFlow rules live in
// ovs-vswitchd only: a restart of ovs-vswitchd alone (not of the
// daemon) loses them unless its service saves and restores flows (as
// Debian's ovs-ctl restart does), until the daemon's next start or the
// VIF's next change; xapi has the same dependency.
package ovs
