// Package netlinkx implements network.Links over netlink
// (github.com/vishvananda/netlink) in one network namespace: the host's
// in the daemon, a namespace made for the purpose in tests.
//
// Every operation goes through a netlink.Handle whose sockets were
// opened in the namespace, so the calling goroutine's thread never
// changes namespace. The two things netlink sockets cannot do are done
// by a helper thread that enters the namespace once, at Open, and is
// thrown away at Close: opening /dev/net/tun (a tap is made in the
// namespace of whoever opens the device) and opening the socket the
// ethtool ioctl (link speed and duplex) is issued on.
//
// Marks kept in the kernel, in the link's alias (IFLA_IFALIAS), so that
// they survive a restart of the daemon:
//
//   - "toolstackd": the link is ours (made by us, or adopted);
//   - "toolstackd-nic": a veth standing in for a physical NIC in tests
//     (netnstest.Veth sets it); such a link is reported Physical. An
//     adopted one carries both words: "toolstackd toolstackd-nic".
//
// A link is Physical when the kernel names a parent device for it
// (IFLA_PARENT_DEV_NAME, what /sys/class/net/<name>/device points to,
// read through netlink so that it works in any namespace), or when it
// is such a test veth. Its Speed and Duplex come from the ethtool ioctl
// in its namespace, its Vendor and Device ids from
// /sys/bus/<bus>/devices/<parent>/{vendor,device} (buses are not
// namespaced).
package netlinkx

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"toolstackd/internal/network"
)

// Alias words marking links (see the package comment).
const (
	AliasOurs = "toolstackd"
	AliasNIC  = "toolstackd-nic"
)

// Missing kernel features, as named in ErrUnsupported errors.
const (
	FeatureVLAN   = network.FeatureVLAN
	FeatureBond   = network.FeatureBond
	FeatureVXLAN  = network.FeatureVXLAN
	FeatureBridge = network.FeatureBridge
	FeatureTap    = network.FeatureTap
)

// NS is network.Links in one network namespace. Its methods may be
// called from several goroutines; they are serialised.
type NS struct {
	mu     sync.Mutex
	path   string
	nsh    netns.NsHandle
	h      *netlink.Handle
	worker *nsThread
	// here: the namespace is the process's own, where /sys/class/net
	// describes it.
	here bool
}

var _ network.Links = (*NS)(nil)

// Open binds to the network namespace at nsPath (/var/run/netns/<name>,
// /proc/<pid>/ns/net), or the process's own when nsPath is "".
func Open(nsPath string) (*NS, error) {
	self, err := ownNamespace()
	if err != nil {
		return nil, fmt.Errorf("netlinkx: own network namespace: %w", err)
	}
	nsh := self
	if nsPath != "" {
		nsh, err = netns.GetFromPath(nsPath)
		if err != nil {
			_ = self.Close()
			return nil, fmt.Errorf("netlinkx: network namespace %s: %w", nsPath, err)
		}
	}
	here := nsh.Equal(self)
	if nsh != self {
		_ = self.Close()
	}
	// Links, addresses, routes and qdiscs are all rtnetlink: a handle on
	// that family alone does not need the kernel to have (or load) the
	// XFRM and netfilter netlink families too.
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		_ = nsh.Close()
		return nil, fmt.Errorf("netlinkx: netlink in %s: %w", describe(nsPath), err)
	}
	w, err := startThread(nsh)
	if err != nil {
		h.Close()
		_ = nsh.Close()
		return nil, fmt.Errorf("netlinkx: helper thread in %s: %w", describe(nsPath), err)
	}
	return &NS{path: nsPath, nsh: nsh, h: h, worker: w, here: here}, nil
}

// ownNamespace is the namespace of the process's threads: that of the
// calling thread, which runs goroutines of every kind and so is in it
// (/proc/self/ns/net would be the main thread's, which a goroutine that
// locked it may have taken elsewhere).
func ownNamespace() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return netns.Get()
}

func describe(p string) string {
	if p == "" {
		return "own namespace"
	}
	return p
}

// Close releases the netlink sockets, the helper thread and the
// namespace handle. Links made stay.
func (n *NS) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return nil
	}
	n.worker.stop()
	n.h.Close()
	n.h = nil
	return n.nsh.Close()
}

// aliasWords parses the marks in a link's alias.
func aliasWords(alias string) (ours, nic bool) {
	for _, w := range strings.Fields(alias) {
		switch w {
		case AliasOurs:
			ours = true
		case AliasNIC:
			nic = true
		}
	}
	return ours, nic
}

// translate maps the kernel's answers onto the errors of network.Links.
func (n *NS) translate(err error, op, name string) error {
	if err == nil {
		return nil
	}
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("%w: %s (%s: %v)", network.ErrNotFound, name, op, err)
	}
	return fmt.Errorf("netlinkx: %s %s: %w", op, name, err)
}

// unsupported says whether creating a link failed because the kernel
// lacks its driver.
func unsupported(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "operation not supported") || strings.Contains(s, "Unknown device type")
}

// lookup is a link by name, or an error wrapping ErrNotFound.
func (n *NS) lookup(name string) (netlink.Link, error) {
	if n.h == nil {
		return nil, errClosed
	}
	l, err := n.h.LinkByName(name)
	if err != nil {
		return nil, n.translate(err, "get", name)
	}
	return l, nil
}

// ours is a link by name that carries our mark, or ErrNotOurs.
func (n *NS) ours(name string) (netlink.Link, error) {
	l, err := n.lookup(name)
	if err != nil {
		return nil, err
	}
	if o, _ := aliasWords(l.Attrs().Alias); !o {
		return nil, fmt.Errorf("%w: %s", network.ErrNotOurs, name)
	}
	return l, nil
}

func (n *NS) linkList() ([]netlink.Link, error) {
	var err error
	for range 5 {
		var ls []netlink.Link
		ls, err = n.h.LinkList()
		if err == nil {
			return ls, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("netlinkx: list links: %w", err)
}

// List is every link in the namespace, by name.
func (n *NS) List() ([]network.Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return nil, errClosed
	}
	ls, err := n.linkList()
	if err != nil {
		return nil, err
	}
	names := make(map[int]string, len(ls))
	for _, l := range ls {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	out := make([]network.Link, 0, len(ls))
	for _, l := range ls {
		out = append(out, n.convert(l, func(i int) string { return names[i] }))
	}
	slices.SortFunc(out, func(a, b network.Link) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get is one link by name.
func (n *NS) Get(name string) (network.Link, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.lookup(name)
	if err != nil {
		return network.Link{}, err
	}
	return n.convert(l, n.nameOf), nil
}

func (n *NS) nameOf(index int) string {
	if index == 0 {
		return ""
	}
	l, err := n.h.LinkByIndex(index)
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

func (n *NS) convert(l netlink.Link, name func(int) string) network.Link {
	a := l.Attrs()
	ours, nic := aliasWords(a.Alias)
	out := network.Link{
		Name:    a.Name,
		Kind:    l.Type(),
		MAC:     slices.Clone(a.HardwareAddr),
		MTU:     a.MTU,
		Up:      a.Flags&net.FlagUp != 0,
		Carrier: a.RawFlags&unix.IFF_LOWER_UP != 0,
		Ours:    ours,
		Duplex:  "unknown",
	}
	if a.MasterIndex != 0 {
		out.Master = name(a.MasterIndex)
	}
	switch v := l.(type) {
	case *netlink.Vlan:
		out.Parent, out.Tag = name(a.ParentIndex), v.VlanId
	case *netlink.Vxlan:
		if v.VtepDevIndex != 0 {
			out.Parent = name(v.VtepDevIndex)
		}
		out.Tag = v.VxlanId
	}
	switch {
	case a.ParentDev != "":
		out.Physical = true
		out.Vendor = sysID(filepath.Join("/sys/bus", a.ParentDevBus, "devices", a.ParentDev, "vendor"))
		out.Device = sysID(filepath.Join("/sys/bus", a.ParentDevBus, "devices", a.ParentDev, "device"))
	case nic && out.Kind == "veth":
		out.Physical = true
	case n.here && out.Kind == "device":
		// Kernels before 5.16 do not report the parent device: read
		// sysfs, which describes the process's own namespace.
		dev := filepath.Join("/sys/class/net", a.Name, "device")
		if _, err := os.Stat(dev); err == nil {
			out.Physical = true
			out.Vendor = sysID(filepath.Join(dev, "vendor"))
			out.Device = sysID(filepath.Join(dev, "device"))
		}
	}
	if out.Physical {
		out.Speed, out.Duplex = n.worker.ethtool(a.Name)
	}
	return out
}

// sysID reads a sysfs id file ("0x8086\n" → "8086"); "" when absent.
func sysID(path string) string {
	b, err := os.ReadFile(path) // #nosec G304 -- fixed sysfs path
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
}

// existing checks a name about to be made: (true, nil) when a link of
// that kind and ours is there already (the caller then only updates
// it), an error when the name is taken by another kind or someone
// else's link.
func (n *NS) existing(name, kind string) (netlink.Link, error) {
	l, err := n.h.LinkByName(name)
	if err != nil {
		if errors.Is(n.translate(err, "get", name), network.ErrNotFound) {
			return nil, nil
		}
		return nil, n.translate(err, "get", name)
	}
	if o, _ := aliasWords(l.Attrs().Alias); !o {
		return nil, fmt.Errorf("netlinkx: %s exists already and is not ours (%s): %w", name, l.Type(), network.ErrNotOurs)
	}
	if l.Type() != kind {
		return nil, fmt.Errorf("netlinkx: %s exists already as a %s, not a %s", name, l.Type(), kind)
	}
	return l, nil
}

// create adds a link (its MTU in the same request) and marks it ours,
// or updates the MTU of ours of that name and kind.
func (n *NS) create(l netlink.Link, feature string) error {
	a := l.Attrs()
	old, err := n.existing(a.Name, l.Type())
	if err != nil {
		return err
	}
	if old != nil {
		if a.MTU > 0 && old.Attrs().MTU != a.MTU {
			return n.translate(n.h.LinkSetMTU(old, a.MTU), "set mtu", a.Name)
		}
		return nil
	}
	if err := n.h.LinkAdd(l); err != nil {
		if unsupported(err) {
			return fmt.Errorf("%w: %s: %s (%v)", network.ErrUnsupported, a.Name, feature, err)
		}
		return n.translate(err, "add "+l.Type(), a.Name)
	}
	// The kernel ignores IFLA_IFALIAS in a request that makes a link:
	// mark it now, and take it away again if that fails.
	return n.mark(a.Name, "add "+l.Type())
}

// mark sets our alias on a link just made, deleting the link if that
// fails so that nothing unmarked is left behind.
func (n *NS) mark(name, op string) error {
	l, err := n.h.LinkByName(name)
	if err == nil {
		err = n.h.LinkSetAlias(l, AliasOurs)
		if err != nil {
			_ = n.h.LinkDel(l)
		}
	}
	return n.translate(err, op, name)
}

// AddBridge makes a bridge, or sets the MTU of ours of that name. A
// bridge left at the default MTU (1500) follows its ports: the kernel
// gives it the smallest of theirs as they join.
func (n *NS) AddBridge(name string, mtu int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	// The MTU is set after the bridge is made, not in the request that
	// makes it: only an MTU set that way is kept by the kernel when a
	// port with a smaller one joins (otherwise the bridge takes the
	// smallest MTU of its ports).
	if err := n.create(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}, FeatureBridge); err != nil {
		return err
	}
	if mtu <= 0 {
		return nil
	}
	l, err := n.lookup(name)
	if err != nil {
		return err
	}
	if l.Attrs().MTU == mtu {
		return nil
	}
	return n.translate(n.h.LinkSetMTU(l, mtu), "set mtu", name)
}

// AddVLAN makes an 802.1Q link on parent (which need not be ours).
func (n *NS) AddVLAN(name, parent string, tag, mtu int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, err := n.lookup(parent)
	if err != nil {
		return err
	}
	if tag < 0 || tag > 4094 {
		return fmt.Errorf("netlinkx: vlan %s: tag %d out of range", name, tag)
	}
	return n.create(&netlink.Vlan{
		LinkAttrs:    netlink.LinkAttrs{Name: name, MTU: mtu, ParentIndex: p.Attrs().Index},
		VlanId:       tag,
		VlanProtocol: netlink.VLAN_PROTOCOL_8021Q,
	}, FeatureVLAN)
}

// AddBond makes a bond; props are the bonding driver's miimon, updelay,
// downdelay, lacp_rate and xmit_hash_policy.
func (n *NS) AddBond(name, mode string, props map[string]string, mtu int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	b := netlink.NewLinkBond(netlink.LinkAttrs{Name: name, MTU: mtu})
	b.Mode = netlink.StringToBondMode(mode)
	if b.Mode == netlink.BOND_MODE_UNKNOWN {
		return fmt.Errorf("netlinkx: bond %s: unknown mode %q", name, mode)
	}
	for k, v := range props {
		var err error
		switch k {
		case "miimon":
			b.Miimon, err = milliseconds(v)
		case "updelay":
			b.UpDelay, err = milliseconds(v)
		case "downdelay":
			b.DownDelay, err = milliseconds(v)
		case "lacp_rate":
			b.LacpRate = netlink.StringToBondLacpRate(v)
			if b.LacpRate == netlink.BOND_LACP_RATE_UNKNOWN {
				err = fmt.Errorf("unknown lacp_rate %q", v)
			}
		case "xmit_hash_policy":
			b.XmitHashPolicy = netlink.StringToBondXmitHashPolicy(v)
			if b.XmitHashPolicy == netlink.BOND_XMIT_HASH_POLICY_UNKNOWN {
				err = fmt.Errorf("unknown xmit_hash_policy %q", v)
			}
		default:
			err = fmt.Errorf("unknown property %q", k)
		}
		if err != nil {
			return fmt.Errorf("netlinkx: bond %s: %w", name, err)
		}
	}
	return n.create(b, FeatureBond)
}

func milliseconds(v string) (int, error) {
	var ms int
	if _, err := fmt.Sscanf(v, "%d", &ms); err != nil || ms < 0 || fmt.Sprint(ms) != v {
		return 0, fmt.Errorf("bad number of milliseconds %q", v)
	}
	return ms, nil
}

// AddVXLAN makes a VXLAN link (learning on) between local and remote (a
// unicast peer or a multicast group) on port, over dev.
func (n *NS) AddVXLAN(name string, vni int, local, remote net.IP, port int, dev string, mtu int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	if vni < 0 || vni >= 1<<24 {
		return fmt.Errorf("netlinkx: vxlan %s: vni %d out of range", name, vni)
	}
	if port == 0 {
		port = 4789
	}
	v := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu},
		VxlanId:   vni,
		SrcAddr:   local,
		Group:     remote,
		Port:      port,
		Learning:  true,
	}
	if dev != "" {
		d, err := n.lookup(dev)
		if err != nil {
			return err
		}
		v.VtepDevIndex = d.Attrs().Index
	}
	return n.create(v, FeatureVXLAN)
}

// AddTap makes a persistent tap owned by root, for QEMU to attach to.
func (n *NS) AddTap(name string, mtu int) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	old, err := n.existing(name, "tuntap")
	if err != nil {
		return err
	}
	if old != nil {
		if mtu > 0 && old.Attrs().MTU != mtu {
			return n.translate(n.h.LinkSetMTU(old, mtu), "set mtu", name)
		}
		return nil
	}
	t := &netlink.Tuntap{
		LinkAttrs:  netlink.LinkAttrs{Name: name},
		Mode:       netlink.TUNTAP_MODE_TAP,
		Flags:      netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_ONE_QUEUE,
		NonPersist: false,
		Owner:      0,
		Group:      0,
	}
	// /dev/net/tun makes the tap in the namespace of the thread opening
	// it: the helper thread's.
	err = n.worker.do(func() error { return n.h.LinkAdd(t) })
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("%w: %s: %s (%v)", network.ErrUnsupported, name, FeatureTap, err)
		}
		return n.translate(err, "add tap", name)
	}
	// The tap is made by ioctl: mark it and set its MTU afterwards, and
	// remove it if that fails.
	l, err := n.h.LinkByName(name)
	if err == nil {
		err = n.h.LinkSetAlias(l, AliasOurs)
	}
	if err == nil && mtu > 0 && l.Attrs().MTU != mtu {
		err = n.h.LinkSetMTU(l, mtu)
	}
	if err != nil {
		if l != nil {
			_ = n.h.LinkDel(l)
		}
		return n.translate(err, "add tap", name)
	}
	return nil
}

// Delete removes a link of ours; one that is not there is not an error.
func (n *NS) Delete(name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.ours(name)
	if errors.Is(err, network.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	err = n.h.LinkDel(l)
	if errors.Is(n.translate(err, "delete", name), network.ErrNotFound) {
		return nil
	}
	return n.translate(err, "delete", name)
}

// Adopt marks an existing link as ours, keeping a test NIC's mark.
func (n *NS) Adopt(name string) error { return n.markOurs(name, true, "adopt") }

// Disown takes the mark of ours off a link, keeping the NIC mark of a
// veth standing in for a NIC.
func (n *NS) Disown(name string) error { return n.markOurs(name, false, "disown") }

// markOurs puts the mark of ours on a link (ours true) or takes it off,
// keeping the NIC mark; a link already as asked is left alone.
func (n *NS) markOurs(name string, ours bool, op string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.lookup(name)
	if err != nil {
		return err
	}
	was, nic := aliasWords(l.Attrs().Alias)
	if was == ours {
		return nil
	}
	var words []string
	if ours {
		words = append(words, AliasOurs)
	}
	if nic {
		words = append(words, AliasNIC)
	}
	return n.translate(n.h.LinkSetAlias(l, strings.Join(words, " ")), op, name)
}

// SetMaster enslaves dev to master, or frees it when master is "". Both
// must be ours: someone else's bridge or bond is not touched either.
func (n *NS) SetMaster(dev, master string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.ours(dev)
	if err != nil {
		return err
	}
	if master == "" {
		return n.translate(n.h.LinkSetNoMaster(l), "nomaster", dev)
	}
	m, err := n.ours(master)
	if err != nil {
		return err
	}
	if l.Attrs().MasterIndex == m.Attrs().Index {
		return nil
	}
	// The bonding driver refuses a port that is up.
	up := l.Attrs().Flags&net.FlagUp != 0
	if m.Type() == "bond" && up {
		if err := n.h.LinkSetDown(l); err != nil {
			return n.translate(err, "set down", dev)
		}
	}
	err = n.translate(n.h.LinkSetMaster(l, m), "set master "+master, dev)
	if m.Type() == "bond" && up {
		if e := n.h.LinkSetUp(l); err == nil {
			err = n.translate(e, "set up", dev)
		}
	}
	return err
}

func (n *NS) change(name, op string, f func(netlink.Link) error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.ours(name)
	if err != nil {
		return err
	}
	return n.translate(f(l), op, name)
}

// SetUp sets a link administratively up.
func (n *NS) SetUp(name string) error {
	return n.change(name, "set up", func(l netlink.Link) error { return n.h.LinkSetUp(l) })
}

// SetDown sets a link administratively down.
func (n *NS) SetDown(name string) error {
	return n.change(name, "set down", func(l netlink.Link) error { return n.h.LinkSetDown(l) })
}

// SetMTU changes a link's MTU.
func (n *NS) SetMTU(name string, mtu int) error {
	return n.change(name, "set mtu", func(l netlink.Link) error { return n.h.LinkSetMTU(l, mtu) })
}

// SetMAC changes a link's hardware address.
func (n *NS) SetMAC(name string, mac net.HardwareAddr) error {
	return n.change(name, "set mac", func(l netlink.Link) error { return n.h.LinkSetHardwareAddr(l, mac) })
}

func nlFamily(family int) (int, error) {
	switch family {
	case 4:
		return netlink.FAMILY_V4, nil
	case 6:
		return netlink.FAMILY_V6, nil
	}
	return 0, fmt.Errorf("netlinkx: address family %d (want 4 or 6)", family)
}

// managed says whether an address is one ReplaceAddrs manages: IPv6
// link-local addresses belong to the kernel.
func managed(ip net.IP) bool {
	return ip.To4() != nil || !ip.IsLinkLocalUnicast()
}

func (n *NS) addrs(l netlink.Link, fam int) ([]netlink.Addr, error) {
	var as []netlink.Addr
	var err error
	for range 5 {
		as, err = n.h.AddrList(l, fam)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, n.translate(err, "list addresses", l.Attrs().Name)
	}
	out := as[:0]
	for _, a := range as {
		if a.IPNet != nil && managed(a.IP) {
			out = append(out, a)
		}
	}
	return out, nil
}

// Addrs lists the addresses of a family on a link, without the IPv6
// link-local ones the kernel makes.
func (n *NS) Addrs(name string, family int) ([]net.IPNet, error) {
	fam, err := nlFamily(family)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.lookup(name)
	if err != nil {
		return nil, err
	}
	as, err := n.addrs(l, fam)
	if err != nil {
		return nil, err
	}
	out := make([]net.IPNet, 0, len(as))
	for _, a := range as {
		out = append(out, *a.IPNet)
	}
	return out, nil
}

func sameNet(a, b *net.IPNet) bool {
	return a.IP.Equal(b.IP) && slices.Equal(a.Mask, b.Mask)
}

func normalise(a net.IPNet) net.IPNet {
	if v4 := a.IP.To4(); v4 != nil {
		a.IP = v4
		if len(a.Mask) == net.IPv6len {
			a.Mask = a.Mask[12:]
		}
	}
	return a
}

// ReplaceAddrs makes the addresses of a family on a link exactly addrs
// (IPv6 link-local ones excepted).
func (n *NS) ReplaceAddrs(name string, family int, addrs []net.IPNet) error {
	fam, err := nlFamily(family)
	if err != nil {
		return err
	}
	want := make([]net.IPNet, 0, len(addrs))
	for _, a := range addrs {
		a = normalise(a)
		if (a.IP.To4() != nil) != (family == 4) || a.Mask == nil {
			return fmt.Errorf("netlinkx: %s: %v is not an IPv%d address with a prefix", name, a.String(), family)
		}
		want = append(want, a)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	l, err := n.ours(name)
	if err != nil {
		return err
	}
	have, err := n.addrs(l, fam)
	if err != nil {
		return err
	}
	for _, h := range have {
		if !slices.ContainsFunc(want, func(w net.IPNet) bool { return sameNet(h.IPNet, &w) }) {
			if err := n.h.AddrDel(l, &h); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return n.translate(err, "delete address "+h.IPNet.String(), name)
			}
		}
	}
	// Removing a primary IPv4 address takes its secondaries with it:
	// look again before adding what is missing.
	if have, err = n.addrs(l, fam); err != nil {
		return err
	}
	for _, w := range want {
		if slices.ContainsFunc(have, func(h netlink.Addr) bool { return sameNet(h.IPNet, &w) }) {
			continue
		}
		if err := n.h.AddrAdd(l, &netlink.Addr{IPNet: &w}); err != nil && !errors.Is(err, unix.EEXIST) {
			return n.translate(err, "add address "+w.String(), name)
		}
	}
	return nil
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

func (n *NS) defaults(fam int) ([]netlink.Route, error) {
	var rs []netlink.Route
	var err error
	for range 5 {
		rs, err = n.h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("netlinkx: list routes: %w", err)
	}
	out := rs[:0]
	for _, r := range rs {
		if isDefault(r) && r.Type == unix.RTN_UNICAST {
			out = append(out, r)
		}
	}
	return out, nil
}

// DefaultGateway is the default route of a family in the main table:
// nil and "" when there is none.
func (n *NS) DefaultGateway(family int) (net.IP, string, error) {
	fam, err := nlFamily(family)
	if err != nil {
		return nil, "", err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return nil, "", errClosed
	}
	rs, err := n.defaults(fam)
	if err != nil {
		return nil, "", err
	}
	for _, r := range rs {
		if r.Gw != nil {
			return r.Gw, n.nameOf(r.LinkIndex), nil
		}
	}
	return nil, "", nil
}

// SetDefaultGateway replaces the default route of a family by one via
// gw through dev (ours), or removes it when gw is nil. The kernel
// refuses a gateway that dev cannot reach.
func (n *NS) SetDefaultGateway(family int, gw net.IP, dev string) error {
	fam, err := nlFamily(family)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.h == nil {
		return errClosed
	}
	if gw == nil {
		rs, err := n.defaults(fam)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if err := n.h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("netlinkx: delete default route: %w", err)
			}
		}
		return nil
	}
	if (gw.To4() != nil) != (family == 4) {
		return fmt.Errorf("netlinkx: gateway %v is not IPv%d", gw, family)
	}
	l, err := n.ours(dev)
	if err != nil {
		return err
	}
	dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	if family == 6 {
		dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: gw, Table: unix.RT_TABLE_MAIN}
	if err := n.h.RouteReplace(r); err != nil {
		return n.translate(err, "set default gateway "+gw.String(), dev)
	}
	// A default route through another device or gateway (another metric) would stay
	// beside the new one: remove those.
	rs, err := n.defaults(fam)
	if err != nil {
		return err
	}
	for _, o := range rs {
		if o.LinkIndex != r.LinkIndex || !o.Gw.Equal(gw) {
			if err := n.h.RouteDel(&o); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("netlinkx: delete default route: %w", err)
			}
		}
	}
	return nil
}
