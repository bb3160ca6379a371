package ovs

import (
	"fmt"
	"slices"
	"strings"

	"toolstackd/internal/network"
	"toolstackd/internal/network/locking"
)

// What toolstackd writes in the databases, as pure functions of a
// VIFPort (tested without a server).

// OwnerKey is the external_ids key marking the Bridge and Port rows (and
// the OVN rows) toolstackd made; rows without it are never changed or
// removed. Its value says what the row is for.
const OwnerKey = "toolstackd"

// Values of OwnerKey.
const (
	ownBridge = "bridge"
	ownPort   = "port" // a NIC, bond, VLAN link or tap put on a bridge
	ownVIF    = "vif"
	ownSwitch = "network"
)

// The external_ids of a VIF's Interface. xenopsd's vif scripts write
// xs-vif-uuid, xs-vm-uuid, xs-network-uuid and attached-mac
// (ocaml/xenopsd/scripts/common.py); iface-id, vm-id and iface-status
// are Open vSwitch's integration convention (Documentation/topics/
// integration.rst), which XenServer's ovs-xapi-sync derives from the
// former and which ovn-controller binds a logical port by (iface-id).
const (
	KeyIfaceID     = "iface-id"
	KeyVMID        = "vm-id"
	KeyAttachedMAC = "attached-mac"
	KeyIfaceStatus = "iface-status"
	KeyXSVIF       = "xs-vif-uuid"
	KeyXSVM        = "xs-vm-uuid"
	KeyXSNetwork   = "xs-network-uuid"
)

// InterfaceExternalIDs are the external_ids of a VIF's Interface row.
func InterfaceExternalIDs(p network.VIFPort) map[string]string {
	ids := map[string]string{
		KeyIfaceID: p.VIF, KeyIfaceStatus: "active", KeyXSVIF: p.VIF, OwnerKey: ownVIF,
	}
	if p.VM != "" {
		ids[KeyVMID], ids[KeyXSVM] = p.VM, p.VM
	}
	if p.Network != "" {
		ids[KeyXSNetwork] = p.Network
	}
	if p.MAC != nil {
		ids[KeyAttachedMAC] = p.MAC.String()
	}
	return ids
}

// TapName names the tap of a VIF after its uuid: "tsv" and the first 12
// hex digits (15 characters, the kernel's limit). It refuses what is not
// a uuid, so that nothing hostile reaches a device name.
func TapName(vifUUID string) (string, error) {
	hex := strings.ReplaceAll(vifUUID, "-", "")
	if len(hex) != 32 || strings.Trim(strings.ToLower(hex), "0123456789abcdef") != "" {
		return "", fmt.Errorf("ovs: VIF uuid %q is not a uuid", vifUUID)
	}
	return "tsv" + strings.ToLower(hex[:12]), nil
}

// addressList is "MAC IPv4... IPv6...", OVN's form of one port address.
func addressList(p network.VIFPort) string {
	parts := []string{p.MAC.String()}
	for _, ip := range p.IPv4 {
		parts = append(parts, ip.String())
	}
	for _, ip := range p.IPv6 {
		parts = append(parts, ip.String())
	}
	return strings.Join(parts, " ")
}

// LSPAddresses is the addresses column of a VIF's logical switch port:
// its MAC with the addresses it says it has (ipv4_allowed and
// ipv6_allowed), or "unknown" for a VIF without a MAC.
func LSPAddresses(p network.VIFPort) []string {
	if p.MAC == nil {
		return []string{"unknown"}
	}
	return []string{addressList(p)}
}

// LSPPortSecurity is the port_security column, from the VIF's locking
// mode: locked allows only the VIF's MAC with its allowed addresses
// (with none allowed, OVN enforces the MAC alone), unlocked allows
// anything (empty), and a disabled VIF is not enabled at all
// (LSPEnabled), with port security on its MAC should it be enabled by
// hand.
func LSPPortSecurity(p network.VIFPort) []string {
	switch p.Mode {
	case locking.ModeLocked:
		if p.MAC == nil {
			return nil
		}
		return []string{addressList(p)}
	case locking.ModeDisabled:
		if p.MAC == nil {
			return nil
		}
		return []string{p.MAC.String()}
	}
	return nil
}

// LSPEnabled is the enabled column: false for a disabled VIF.
func LSPEnabled(p network.VIFPort) bool { return p.Mode != locking.ModeDisabled }

// ChooseDatapath picks the datapath type for new bridges from what
// ovs-vswitchd says it supports (Open_vSwitch.datapath_types) and
// whether the openvswitch kernel module is loaded (ovs-vswitchd lists
// "system" even without it, then fails to make the bridge): the
// kernel's datapath ("system") with the module, else the userspace one
// ("netdev"), which needs no module. want forces one ("" or "auto" to
// choose).
func ChooseDatapath(supported []string, kernelModule bool, want string) (string, error) {
	if want != "" && want != "auto" {
		if !slices.Contains(supported, want) {
			return "", fmt.Errorf("ovs: ovs-vswitchd does not support datapath type %q (it supports %v)", want, supported)
		}
		if want == "system" && !kernelModule {
			return "", fmt.Errorf("ovs: datapath type system needs the openvswitch kernel module, which is not loaded (%s)", KernelModulePath)
		}
		return want, nil
	}
	if kernelModule && slices.Contains(supported, "system") {
		return "system", nil
	}
	if slices.Contains(supported, "netdev") {
		return "netdev", nil
	}
	return "", fmt.Errorf("ovs: ovs-vswitchd offers no usable datapath type (datapath_types %v, kernel module loaded: %v): is ovs-vswitchd running?", supported, kernelModule)
}

// KeyUserspaceTSO is the Open_vSwitch other_config key turning on the
// userspace datapath's TSO and checksum offload (read when ovs-vswitchd
// starts). Without it, ovs-vswitchd reads a tap port with a plain packet
// socket and forwards what a QEMU guest with virtio offloads sends (TCP
// segments whose checksum is left to the host, and segments larger than
// the MTU) as it is: the other guest drops them, and TCP between QEMU
// guests on a userspace-datapath bridge does not get through (ARP and
// ICMP, checksummed by the guest, do). The switch warns at Open.
const KeyUserspaceTSO = "userspace-tso-enable"

// KernelModulePath exists when the openvswitch kernel module is loaded
// (xenopsd's vif scripts test the same path).
const KernelModulePath = "/sys/module/openvswitch"

// sameStrings compares two columns as sets.
func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
