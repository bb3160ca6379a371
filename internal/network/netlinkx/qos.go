package netlinkx

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"toolstackd/internal/network"
)

// Rate limits of VIFs (network.Shaper): what a guest sends through its
// tap enters the host's stack at the tap's ingress, where a Linux qdisc
// cannot queue. So the tap gets an ingress qdisc whose one u32 filter
// matches every frame and redirects it (tc action mirred) to an IFB
// device of its own, "tsq" plus the tap's name without "tsvif"; the
// IFB's root qdisc is a token bucket (tbf) at the rate, which queues
// what exceeds it and releases it at the rate, and the IFB hands the
// frames back to the tap's ingress path. Queueing, not dropping, is
// what Xen's netback credit scheduler does to a guest that sends too
// fast, and what TCP in the guest copes with best. It needs the
// kernel's ifb, sch_ingress, cls_u32, act_mirred and sch_tbf, all in
// Debian's kernels (act_police, the other way to limit an ingress, is
// not in every kernel).

// FeatureQoS is what a kernel lacking the pieces above is missing.
const FeatureQoS = "traffic shaping of VIFs (kernel modules ifb, act_mirred, cls_u32, sch_ingress, sch_tbf)"

var _ network.Shaper = (*NS)(nil)

// ifbName is the IFB device that shapes what enters through dev.
func ifbName(dev string) string {
	n := "tsq" + strings.TrimPrefix(dev, "tsvif")
	if len(n) > 15 {
		n = n[:15]
	}
	return n
}

// maxQueueNS bounds the time a frame may wait in a rate limit's queue
// beyond the burst (the tbf's latency).
const maxQueueNS = 50_000_000

// SetRate limits what enters the namespace through dev (ours) to rate
// bytes per second with bursts of burst bytes, or, when rate is 0,
// removes the limit. Setting it again changes it in place.
func (n *NS) SetRate(dev string, rate, burst uint64) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if rate == 0 {
		return n.clearRate(dev)
	}
	l, err := n.ours(dev)
	if err != nil {
		return err
	}
	ifb, err := n.ensureIFB(ifbName(dev), l.Attrs().MTU)
	if err != nil {
		return err
	}
	mtu := uint64(max(l.Attrs().MTU, 1500)) + 64
	burst = max(burst, mtu)
	limit := min(burst+rate*maxQueueNS/1e9, 1<<31)
	tbf := &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifb.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Limit:      uint32(limit),
		Buffer:     netlink.Xmittime(rate, uint32(min(burst, 1<<31))),
	}
	if err := n.h.QdiscReplace(tbf); err != nil {
		return n.qosErr(err, "tbf", ifb.Attrs().Name)
	}
	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	qs, err := n.h.QdiscList(l)
	if err != nil {
		return n.qosErr(err, "list qdiscs", dev)
	}
	hasIngress := false
	for _, q := range qs {
		if _, ok := q.(*netlink.Ingress); ok {
			hasIngress = true
		}
	}
	// An ingress qdisc cannot be replaced by another: one there is kept.
	if !hasIngress {
		if err := n.h.QdiscAdd(ingress); err != nil {
			return n.qosErr(err, "ingress qdisc", dev)
		}
	}
	fs, err := n.h.FilterList(l, netlink.MakeHandle(0xffff, 0))
	if err != nil {
		return n.qosErr(err, "list filters", dev)
	}
	if len(fs) == 1 {
		if u, ok := fs[0].(*netlink.U32); ok && u.RedirIndex == ifb.Attrs().Index {
			return nil
		}
	}
	for _, f := range fs {
		if err := n.h.FilterDel(f); err != nil && !gone(err) {
			return n.qosErr(err, "delete filter", dev)
		}
	}
	redirect := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.MakeHandle(0xffff, 0),
			Priority: 1, Protocol: unix.ETH_P_ALL},
		RedirIndex: ifb.Attrs().Index,
	}
	if err := n.h.FilterAdd(redirect); err != nil {
		_ = n.h.QdiscDel(ingress)
		return n.qosErr(err, "redirect filter", dev)
	}
	return nil
}

// ensureIFB makes (or finds) the IFB device name, ours and up.
func (n *NS) ensureIFB(name string, mtu int) (netlink.Link, error) {
	old, err := n.existing(name, "ifb")
	if err != nil {
		return nil, err
	}
	if old == nil {
		ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: 1000, MTU: max(mtu, 1500)}}
		if err := n.h.LinkAdd(ifb); err != nil {
			return nil, n.qosErr(err, "add ifb", name)
		}
		if err := n.mark(name, "add ifb"); err != nil {
			return nil, err
		}
	}
	l, err := n.h.LinkByName(name)
	if err != nil {
		return nil, n.translate(err, "get", name)
	}
	if l.Attrs().Flags&1 == 0 { // IFF_UP
		if err := n.h.LinkSetUp(l); err != nil {
			return nil, n.translate(err, "set up", name)
		}
	}
	return l, nil
}

// clearRate takes dev's ingress qdisc (and with it the redirect) away,
// if dev is still there, and removes its IFB device.
func (n *NS) clearRate(dev string) error {
	if l, err := n.h.LinkByName(dev); err == nil {
		if o, _ := aliasWords(l.Attrs().Alias); o {
			ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
				Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
			if err := n.h.QdiscDel(ingress); err != nil && !gone(err) {
				return n.qosErr(err, "delete ingress qdisc", dev)
			}
		}
	}
	ifb, err := n.h.LinkByName(ifbName(dev))
	if err != nil {
		return nil
	}
	if o, _ := aliasWords(ifb.Attrs().Alias); !o || ifb.Type() != "ifb" {
		return nil
	}
	if err := n.h.LinkDel(ifb); err != nil && !gone(err) {
		return n.translate(err, "delete", ifb.Attrs().Name)
	}
	return nil
}

// gone: what was to be removed is not there.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENODEV)
}

// qosErr names a missing kernel feature as such.
func (n *NS) qosErr(err error, op, name string) error {
	if unsupported(err) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("%w: %s: %s (%s: %v)", network.ErrUnsupported, name, FeatureQoS, op, err)
	}
	return n.translate(err, op, name)
}
