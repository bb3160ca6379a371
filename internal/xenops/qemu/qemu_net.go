package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"toolstackd/internal/network/netlinkx"
	"toolstackd/internal/xenops/backend"
)

// A VIF gets a tap device on its network's Linux bridge when that is
// possible: toolstackd runs as root and the bridge exists. Otherwise it
// gets QEMU's user-mode networking (or nothing, with Config.NoUserNet).
// The decision is logged per NIC, and every tap is journalled before it
// is made, so none is left behind.
//
// Taps come from Config.Taps: the network module (network.Manager) when
// the daemon runs one, which makes the tap with the network's MTU on the
// bridge it made, up, with the VIF's locking rules and rate limit.
// Without one (--network-backend none) they are made through netlink in
// the daemon's own namespace (hostTaps), on a bridge the operator made.

// Taps is where NICs' taps come from.
type Taps interface {
	// HasBridge says whether the bridge exists where taps are made.
	HasBridge(bridge string) bool
	// PlugTap makes the VIF's tap with mtu on bridge, up, replacing a
	// leftover tap of that name; on failure nothing is left.
	PlugTap(ctx context.Context, vif, tap, bridge string, mtu int) error
	// UnplugTap removes the tap (and what came with it); a tap that is
	// not there is not an error.
	UnplugTap(ctx context.Context, vif, tap string) error
	// MoveTap puts a tap on another bridge.
	MoveTap(ctx context.Context, tap, bridge string) error
}

// hostTaps makes taps through netlink in the daemon's own namespace, on
// any bridge there (the operator's). Its netlink handle is opened at
// first use and closed with the backend.
type hostTaps struct {
	mu  sync.Mutex
	ns  *netlinkx.NS
	err error
}

func (h *hostTaps) open() (*netlinkx.NS, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns == nil && h.err == nil {
		h.ns, h.err = netlinkx.Open("")
	}
	return h.ns, h.err
}

func (h *hostTaps) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns != nil {
		_ = h.ns.Close()
		h.ns = nil
	}
	h.err = errors.New("qemu: backend closed")
}

func (h *hostTaps) HasBridge(bridge string) bool {
	ns, err := h.open()
	return err == nil && ns.HasBridge(bridge)
}

func (h *hostTaps) PlugTap(_ context.Context, _, tap, bridge string, mtu int) error {
	ns, err := h.open()
	if err != nil {
		return err
	}
	return ns.PlugTap(tap, bridge, mtu)
}

func (h *hostTaps) UnplugTap(_ context.Context, _, tap string) error {
	ns, err := h.open()
	if err != nil {
		return err
	}
	return ns.RemoveTap(tap)
}

func (h *hostTaps) MoveTap(_ context.Context, tap, bridge string) error {
	ns, err := h.open()
	if err != nil {
		return err
	}
	return ns.MoveTap(tap, bridge)
}

// taps is Config.Taps, or the daemon's own namespace.
func (q *QEMU) taps() Taps {
	if q.cfg.Taps != nil {
		return q.cfg.Taps
	}
	return q.hostTaps
}

// validBridgeName keeps names that cannot be a link's out of netlink.
func validBridgeName(name string) bool {
	return name != "" && len(name) <= 15 && !strings.ContainsAny(name, "/ \x00") && name != "." && name != ".."
}

// deleteTap removes a NIC's tap if it is there.
func (q *QEMU) deleteTap(vif, name string) error {
	if !tapNamePattern.MatchString(name) {
		return fmt.Errorf("not a tap of ours: %q", name)
	}
	return q.taps().UnplugTap(context.Background(), vif, name)
}

// tapNamePattern matches the names tapName makes: only those are ever
// deleted.
var tapNamePattern = regexp.MustCompile(`^tsvif[0-9]{1,10}\.[0-9]{1,2}$`)

// tapName names a NIC's tap after the domain and device, as Xen's
// vifDOMID.DEVICE (at most 15 characters).
func tapName(domid int64, device string) string {
	return "tsvif" + strconv.FormatInt(domid, 10) + "." + device
}

// setupNIC decides how a NIC reaches the network, makes its tap if it
// gets one, and journals it.
func (q *QEMU) setupNIC(ctx context.Context, d *qemuDomain, n *backend.NIC) error {
	d.mu.Lock()
	domid, uuid := d.j.Domid, d.j.UUID
	d.mu.Unlock()
	why := ""
	switch {
	case n.Bridge == "":
		why = "the network has no bridge"
	case os.Geteuid() != 0:
		why = "toolstackd is not running as root"
	case !validBridgeName(n.Bridge) || !q.taps().HasBridge(n.Bridge):
		why = "bridge " + n.Bridge + " does not exist on this host"
	}
	if why == "" {
		n.Mode, n.Tap = "tap", tapName(domid, n.Device)
		d.mu.Lock()
		d.j.NICs = append(d.j.NICs, *n)
		d.mu.Unlock()
		if err := q.save(d); err != nil {
			return err
		}
		mtu := n.MTU
		if mtu <= 0 {
			mtu = 1500
		}
		// A leftover of an earlier life of this domid is replaced.
		if err := q.taps().PlugTap(ctx, n.VIF, n.Tap, n.Bridge, int(mtu)); err != nil {
			q.forgetNIC(d, n.Device)
			return fmt.Errorf("making tap %s on %s: %w", n.Tap, n.Bridge, err)
		}
		q.log.Info("qemu: VIF on a tap", "vm", uuid, "device", n.Device, "tap", n.Tap, "bridge", n.Bridge)
		return nil
	}
	n.Mode = "user"
	if q.cfg.NoUserNet {
		n.Mode = "none"
	}
	q.log.Info("qemu: VIF without a tap", "vm", uuid, "device", n.Device, "bridge", n.Bridge, "reason", why, "network", n.Mode)
	d.mu.Lock()
	d.j.NICs = append(d.j.NICs, *n)
	d.mu.Unlock()
	return q.save(d)
}
