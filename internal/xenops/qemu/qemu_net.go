package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"toolstackd/internal/xenops/backend"
)

// A VIF gets a tap device on its network's Linux bridge when that is
// possible: toolstackd runs as root, the bridge exists and iproute2 is
// installed. Otherwise it gets QEMU's user-mode networking (or nothing,
// with Config.NoUserNet). The decision is logged per NIC, and every
// tap is journalled before it is made, so none is left behind.

func bridgeExists(name string) bool {
	if name == "" || strings.ContainsAny(name, "/ ") || name == "." || name == ".." {
		return false
	}
	_, err := os.Stat("/sys/class/net/" + name + "/bridge")
	return err == nil
}

func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput() //nolint:gosec // a fixed program with an argv, no shell
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func tapExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

// deleteTap removes a tap if it is there.
func deleteTap(name string) error {
	if !tapNamePattern.MatchString(name) {
		return fmt.Errorf("not a tap of ours: %q", name)
	}
	if !tapExists(name) {
		return nil
	}
	return runIP("link", "del", "dev", name)
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
func (q *QEMU) setupNIC(d *qemuDomain, n *backend.NIC) error {
	d.mu.Lock()
	domid, uuid := d.j.Domid, d.j.UUID
	d.mu.Unlock()
	why := ""
	_, ipErr := exec.LookPath("ip")
	switch {
	case n.Bridge == "":
		why = "the network has no bridge"
	case os.Geteuid() != 0:
		why = "toolstackd is not running as root"
	case !bridgeExists(n.Bridge):
		why = "bridge " + n.Bridge + " does not exist on this host"
	case ipErr != nil:
		why = "iproute2 (ip) is not installed"
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
		_ = deleteTap(n.Tap) // a leftover of an earlier life of this domid
		err := runIP("tuntap", "add", "dev", n.Tap, "mode", "tap")
		if err == nil {
			err = runIP("link", "set", "dev", n.Tap, "master", n.Bridge)
		}
		if err == nil {
			err = runIP("link", "set", "dev", n.Tap, "mtu", strconv.FormatInt(mtu, 10), "up")
		}
		if err != nil {
			_ = deleteTap(n.Tap)
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
