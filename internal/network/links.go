package network

import (
	"errors"
	"net"
)

// Links is what the module asks of the kernel's network stack in one
// network namespace: the few link and address operations networking
// needs, so that the reconciler can be tested against a recording
// (Recorder) and run against netlink (package network/netlinkx) in a
// namespace of its own in tests and in the host's namespace in the
// daemon.
//
// Every link the module makes is marked as its own (Link.Ours, the
// link's alias "toolstackd" in the netlink implementation); Delete,
// SetMaster and the other changes refuse a link that is not ours unless
// the caller adopted it explicitly (the management NIC with PIF.plug),
// so that a bridge or port made by someone else is never touched.
//
// An operation the kernel cannot do (no 802.1Q, bonding or VXLAN
// support) fails with an error wrapping ErrUnsupported that names the
// missing feature, and leaves nothing behind.
type Links interface {
	// List is every link in the namespace.
	List() ([]Link, error)
	// Get is one link by name; the error wraps ErrNotFound when there is
	// none.
	Get(name string) (Link, error)

	// AddBridge makes a bridge (ours) or, if one of that name exists,
	// sets its MTU; it is left down until Up.
	AddBridge(name string, mtu int) error
	// AddVLAN makes an 802.1Q link name on parent with tag.
	AddVLAN(name, parent string, tag, mtu int) error
	// AddBond makes a bond in mode ("balance-rr", "active-backup",
	// "802.3ad", "balance-xor", "balance-tlb", "balance-alb") with the
	// bonding driver's properties (miimon, updelay, downdelay,
	// lacp_rate, xmit_hash_policy).
	AddBond(name, mode string, props map[string]string, mtu int) error
	// AddVXLAN makes a VXLAN link with vni between local and remote on
	// port (4789 when 0), over the device named by dev ("" for any).
	AddVXLAN(name string, vni int, local, remote net.IP, port int, dev string, mtu int) error
	// AddTap makes a persistent tap for a VM's NIC.
	AddTap(name string, mtu int) error
	// Delete removes a link of ours; a link that is not there is not an
	// error.
	Delete(name string) error
	// Adopt marks an existing link as managed by the module (a NIC the
	// operator plugged as a PIF), so that the changes below accept it.
	Adopt(name string) error
	// Disown undoes Adopt: the link is no longer the module's (a change
	// that adopted a NIC and then failed gives it back as it was). It
	// does nothing to a link that is not marked.
	Disown(name string) error

	// SetMaster enslaves dev to master (a bridge or a bond); "" frees it.
	SetMaster(dev, master string) error
	// SetUp and SetDown change the administrative state.
	SetUp(name string) error
	SetDown(name string) error
	// SetMTU and SetMAC change a link's MTU and hardware address.
	SetMTU(name string, mtu int) error
	SetMAC(name string, mac net.HardwareAddr) error

	// Addrs lists the addresses of a link; ReplaceAddrs makes them
	// exactly addrs (IPv4 and IPv6 separately: family 4 or 6).
	Addrs(name string, family int) ([]net.IPNet, error)
	ReplaceAddrs(name string, family int, addrs []net.IPNet) error
	// DefaultGateway and SetDefaultGateway read and set the default
	// route of a family through dev (nil gw: remove it).
	DefaultGateway(family int) (gw net.IP, dev string, err error)
	SetDefaultGateway(family int, gw net.IP, dev string) error
}

// Link is what the module knows of one network link.
type Link struct {
	Name string
	// Kind is the netlink kind: "device" for a physical NIC (or a veth
	// standing in for one in tests: Physical says which are), "bridge",
	// "vlan", "bond", "vxlan", "tuntap", "veth", ...
	Kind string
	// Physical is true for a link backed by hardware, or a veth in a
	// namespace standing in for one; PIF.scan introduces these.
	Physical bool
	MAC      net.HardwareAddr
	MTU      int
	// Up is the administrative state, Carrier the link's.
	Up, Carrier bool
	// Speed in Mbit/s and Duplex ("full", "half", "unknown"), when the
	// driver says.
	Speed  int
	Duplex string
	// Master is the bridge or bond the link is enslaved to.
	Master string
	// VLAN: the parent and tag of an 802.1Q link.
	Parent string
	Tag    int
	// Ours says the module made this link.
	Ours bool
	// Vendor and Device are the PCI ids of a physical NIC, when known
	// (PIF_metrics).
	Vendor, Device string
}

// The kernel features an ErrUnsupported error names.
const (
	FeatureVLAN   = "802.1Q VLAN support (kernel module 8021q)"
	FeatureBond   = "bonding support (kernel module bonding)"
	FeatureVXLAN  = "VXLAN support (kernel module vxlan)"
	FeatureBridge = "bridge support (kernel module bridge)"
	FeatureTap    = "TUN/TAP support (kernel module tun, /dev/net/tun)"
)

// Errors of the Links implementations.
var (
	// ErrNotFound: no link of that name.
	ErrNotFound = errors.New("network: no such link")
	// ErrUnsupported: the kernel lacks what the operation needs.
	ErrUnsupported = errors.New("network: not supported by this kernel")
	// ErrNotOurs: the link was not made by toolstackd and was not
	// adopted; the module leaves it alone.
	ErrNotOurs = errors.New("network: link not made by toolstackd")
)
