package qemu

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"toolstackd/internal/xenops/qemu/qmp"

	"golang.org/x/sys/unix"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xenops/backend"
)

// A jailed QEMU: when the daemon runs as root, each domain's emulator
// runs as a user of its own (uid and gid UserBase+slot, no supplementary
// group but the KVM device's when it uses KVM), under QEMU's seccomp
// sandbox (-sandbox on, with obsolete system calls, privilege changes,
// process creation and resource control denied). That user owns the
// domain's directory (and its socket directory) and nothing else: it
// cannot read the daemon's data directory, another domain's directory
// or image, or any root-only file of the host.
//
// What the emulator needs from outside its directory the daemon opens
// and hands over as file descriptors, so that no grant is left on any
// file once the process is gone:
//
//   - Disk images, firmware and every backing file of a qcow2 chain go in
//     fd sets (-add-fd at start, QMP add-fd later) and are opened by QEMU
//     as /dev/fdset/N. The chain is spelled out node by node (read from
//     the images' headers, imageformat.Chain), so QEMU never opens a
//     backing file by the name in a header.
//   - A tap is opened by the daemon (TUNSETIFF) and given as fd=.
//   - An NBD server on a Unix socket is connected to by the daemon, and
//     the connected socket given as a server of type fd.
//   - Its own directories are inherited as O_PATH descriptors and named
//     /proc/self/fd/N/...: the emulator reaches its sockets without
//     search permission on the directories above, and the short name
//     fits a socket address whatever the state directory's length.
//   - The kernel and initrd of a direct boot are copied into its
//     directory, because QEMU's loader opens them by name.
//
// Nothing else is inherited: Go's exec closes every other descriptor.

// The range of user ids reserved for emulators: by default the one Xen's
// libxl recommends for its device models (xen-qemuuser-range-base,
// 131072, and 32768 ids above it).
const (
	DefaultUserBase = 131072
	DefaultUsers    = 32768
)

// sandboxArgs are QEMU's seccomp options for a jailed domain.
var sandboxArgs = []string{"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}

// jail is a jailed domain's part of the journal.
type jail struct {
	// UID is the user (and group) id the emulator runs as.
	UID int
	// Dir and SockDir are the names QEMU knows the domain's directory
	// and socket directory by (/proc/self/fd/N), set at its start.
	Dir, SockDir string `json:",omitempty"`
}

// decideJail settles Config.Deprivilege: "on" and "auto" jail QEMU when
// the daemon runs as root; "on" without root refuses to start domains.
func (q *QEMU) decideJail() error {
	c := &q.cfg
	if c.UserBase == 0 {
		c.UserBase = DefaultUserBase
	}
	if c.Users == 0 {
		c.Users = DefaultUsers
	}
	if c.UserBase < 1000 || c.Users < 1 || c.UserBase+c.Users > 1<<31-2 {
		return fmt.Errorf("qemu backend: user ids %d+%d are not a range for emulators", c.UserBase, c.Users)
	}
	root := os.Geteuid() == 0
	mapped := idsMapped("/proc/self/uid_map", c.UserBase, c.Users) && idsMapped("/proc/self/gid_map", c.UserBase, c.Users)
	switch c.Deprivilege {
	case "", "auto":
		q.jailOn = root && mapped
	case "on":
		if !root {
			return errors.New("qemu backend: --qemu-deprivilege=on needs the daemon to run as root")
		}
		if !mapped {
			return fmt.Errorf("qemu backend: user ids %d+%d do not exist in this user namespace (/proc/self/uid_map)", c.UserBase, c.Users)
		}
		q.jailOn = true
	case "off":
	default:
		return fmt.Errorf("qemu backend: deprivilege %q is not auto, on or off", c.Deprivilege)
	}
	if !q.jailOn {
		q.log.Warn("qemu: emulators run as the daemon's own user", "deprivilege", c.Deprivilege, "root", root, "ids_mapped", mapped)
	}
	return nil
}

// idsMapped says whether ids base to base+n-1 all exist in this process's
// user namespace, by its map file (inside outside count lines); in a
// container that maps fewer ids they cannot be switched to. An unreadable
// map is taken as the initial namespace's, which has them all.
func idsMapped(mapFile string, base, n int) bool {
	b, err := os.ReadFile(mapFile) //nolint:gosec // a fixed /proc path
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		in, err1 := strconv.ParseInt(f[0], 10, 64)
		count, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 == nil && err2 == nil && in <= int64(base) && int64(base)+int64(n) <= in+count {
			return true
		}
	}
	return false
}

// allocUID gives a new domain the lowest free user id of the range.
// The caller holds q.mu.
func (q *QEMU) allocUID() (int, error) {
	used := map[int]bool{}
	for _, d := range q.doms {
		if d.j.Jail != nil {
			used[d.j.Jail.UID] = true
		}
	}
	for uid := q.cfg.UserBase; uid < q.cfg.UserBase+q.cfg.Users; uid++ {
		if !used[uid] {
			return uid, nil
		}
	}
	return 0, fmt.Errorf("qemu: all %d emulator user ids are in use", q.cfg.Users)
}

// inRange says whether a journalled jail's uid is one of the range.
func (q *QEMU) inRange(uid int) bool {
	return uid >= q.cfg.UserBase && uid < q.cfg.UserBase+q.cfg.Users
}

// credential is who a jailed domain's emulator runs as.
func (q *QEMU) credential(j *qemuJournal) *syscall.Credential {
	c := &syscall.Credential{Uid: uint32(j.Jail.UID), Gid: uint32(j.Jail.UID), Groups: []uint32{}} //nolint:gosec // the range is checked in decideJail
	if j.Accel == "kvm" {
		var st unix.Stat_t
		if unix.Stat(q.cfg.KVMDevice, &st) == nil {
			c.Groups = append(c.Groups, st.Gid)
		}
	}
	return c
}

// ownDirs gives a jailed domain's directories to its user, 0700.
func ownDirs(uid int, dirs ...string) error {
	for _, d := range dirs {
		if err := os.Chown(d, uid, uid); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o700); err != nil { //nolint:gosec // a directory: its user must search it
			return err
		}
	}
	return nil
}

// copyOwned copies a file into a jailed domain's directory as name,
// owned by its user and readable by it alone.
func copyOwned(src, dir, name string, uid int) error {
	dst := filepath.Join(dir, name)
	if err := backend.CopyFile(src, dst); err != nil {
		return err
	}
	if err := os.Chown(dst, uid, uid); err != nil {
		return err
	}
	return os.Chmod(dst, 0o400)
}

// handoff gives QEMU open files: at its start as inherited descriptors
// (startHandoff), or over QMP to a running emulator (liveHandoff). Each
// method takes ownership of f and closes it once QEMU has its copy.
type handoff interface {
	// fdset puts fs (the same file, opened in different modes) in an fd
	// set and returns the name QEMU opens it by (/dev/fdset/N); opaque
	// labels the set (query-fdsets).
	fdset(fs []*os.File, opaque string) (string, error)
	// fd gives f to QEMU and returns the name an option's fd= takes.
	fd(f *os.File) (string, error)
}

// startHandoff collects the descriptors a starting QEMU inherits (fd
// 3 and up, in order) and the -add-fd options that make fd sets of them.
type startHandoff struct {
	files []*os.File
	args  []string
	sets  int
}

func (h *startHandoff) add(f *os.File) int {
	h.files = append(h.files, f)
	return 2 + len(h.files)
}

func (h *startHandoff) fdset(fs []*os.File, opaque string) (string, error) {
	h.sets++
	for _, f := range fs {
		h.args = append(h.args, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", h.add(f), h.sets, optEscape(opaque)))
	}
	return "/dev/fdset/" + strconv.Itoa(h.sets), nil
}

func (h *startHandoff) fd(f *os.File) (string, error) { return strconv.Itoa(h.add(f)), nil }

// dir hands over a directory as an O_PATH descriptor and returns the
// name QEMU reaches it by.
func (h *startHandoff) dir(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	return "/proc/self/fd/" + strconv.Itoa(h.add(os.NewFile(uintptr(fd), path))), nil //nolint:gosec // a fresh fd
}

// close closes the parent's copies, once QEMU has started (or failed to).
func (h *startHandoff) close() {
	for _, f := range h.files {
		_ = f.Close()
	}
	h.files = nil
}

// liveHandoff passes descriptors to a running QEMU over its monitor.
type liveHandoff struct {
	ctx  context.Context
	mon  *qmp.Conn
	name string // prefix of getfd names
	n    int
}

func (h *liveHandoff) fdset(fs []*os.File, opaque string) (string, error) {
	defer closeAll(fs)
	var set *int
	for _, f := range fs {
		r, err := qmp.RunFD(h.ctx, h.mon, qmp.AddFD{FdsetID: set, Opaque: opaque}, int(f.Fd()))
		if err != nil {
			return "", fmt.Errorf("qemu: add-fd: %w", err)
		}
		set = &r.FdsetID
	}
	if set == nil {
		return "", errors.New("qemu: add-fd named no fd set")
	}
	return "/dev/fdset/" + strconv.Itoa(*set), nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

func (h *liveHandoff) fd(f *os.File) (string, error) {
	defer closeAll([]*os.File{f})
	h.n++
	name := h.name + "-" + strconv.Itoa(h.n)
	if _, err := qmp.RunFD(h.ctx, h.mon, qmp.GetFD{FDName: name}, int(f.Fd())); err != nil {
		return "", fmt.Errorf("qemu: getfd: %w", err)
	}
	return name, nil
}

// live is the handoff to a running domain's QEMU, or nil when the domain
// is not jailed (QEMU opens what it is named).
func live(ctx context.Context, d *qemuDomain, mon *qmp.Conn, what string) handoff {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.j.Jail == nil {
		return nil
	}
	return &liveHandoff{ctx: ctx, mon: mon, name: what}
}

// dropFdsets removes the fd sets labelled opaque from a running QEMU,
// but the one named keep (a /dev/fdset/N name, or ""), so that it keeps
// no descriptor of a file it no longer uses. What QEMU has opened from a
// set stays open; QEMU closes a removed descriptor once the guest runs.
func dropFdsets(ctx context.Context, mon *qmp.Conn, opaque, keep string) {
	sets, err := qmp.Run(ctx, mon, qmp.QueryFdsets{})
	if err != nil {
		return
	}
	for _, s := range sets {
		if "/dev/fdset/"+strconv.Itoa(s.FdsetID) == keep {
			continue
		}
		for _, f := range s.FDs {
			if f.Opaque == opaque {
				_ = qmp.Do(ctx, mon, qmp.RemoveFD{FdsetID: s.FdsetID, FD: &f.FD})
			}
		}
	}
}

// diskOpaque labels the fd sets of a disk's images.
func diskOpaque(device string) string { return "vbd" + device }

// openImage opens an image for QEMU, files and block devices alike: read-
// only, or read-write and read-only (QEMU picks the descriptor whose
// mode it needs when it opens /dev/fdset/N, and reopens an image
// read-only when it becomes a backing file).
func openImage(path string, ro bool) ([]*os.File, error) {
	modes := []int{os.O_RDWR, os.O_RDONLY}
	if ro {
		modes = modes[1:]
	}
	var fs []*os.File
	for _, m := range modes {
		f, err := os.OpenFile(path, m, 0) //nolint:gosec // paths come from storage's attach, checked there
		if err != nil {
			closeAll(fs)
			return nil, err
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// handedNode is protocolNode for a jailed QEMU: a file or device is
// opened here and handed over; a Unix-socket NBD server is connected to
// here; a TCP one QEMU reaches itself.
func handedNode(h handoff, path string, ro bool, opaque string) (map[string]any, error) {
	if nbd.IsURI(path) {
		u, err := nbd.ParseURI(path)
		if err != nil || u.Network != "unix" {
			return protocolNode(path, ro), nil
		}
		c, err := net.Dial("unix", u.Socket)
		if err != nil {
			return nil, fmt.Errorf("qemu: NBD server %s: %w", u.Socket, err)
		}
		f, err := c.(*net.UnixConn).File()
		_ = c.Close()
		if err != nil {
			return nil, err
		}
		name, err := h.fd(f)
		if err != nil {
			return nil, err
		}
		return map[string]any{"driver": "nbd", "export": u.Export, "read-only": ro,
			"server": map[string]any{"type": "fd", "str": name}}, nil
	}
	node := protocolNode(path, ro)
	fs, err := openImage(path, ro)
	if err != nil {
		return nil, err
	}
	if node["filename"], err = h.fdset(fs, opaque); err != nil {
		return nil, err
	}
	return node, nil
}

// handedBlockdev is blockdevArg for a jailed QEMU: every image of the
// disk's chain is handed over, and the chain is given node by node, the
// backing images read-only.
func handedBlockdev(h handoff, d backend.Disk) (map[string]any, error) {
	top := blockdevArg(d)
	format, _ := top["driver"].(string)
	if nbd.IsURI(d.Path) || format != "qcow2" {
		file, err := handedNode(h, d.Path, d.ReadOnly, diskOpaque(d.Device))
		if err != nil {
			return nil, err
		}
		top["file"] = file
		return top, nil
	}
	paths, formats, err := imageformat.Chain(d.Path, "qcow2")
	if err != nil {
		return nil, fmt.Errorf("qemu: the backing chain of %s: %w", filepath.Base(d.Path), err)
	}
	var node map[string]any
	for i := len(paths) - 1; i >= 0; i-- {
		ro := d.ReadOnly || i > 0
		file, err := handedNode(h, paths[i], ro, diskOpaque(d.Device))
		if err != nil {
			return nil, err
		}
		n := map[string]any{"driver": formats[i], "read-only": ro, "file": file}
		if formats[i] == "qcow2" {
			if node != nil {
				n["backing"] = node
			} else {
				n["backing"] = nil
			}
		}
		node = n
	}
	node["node-name"] = top["node-name"]
	return node, nil
}

// blockdevFor is the blockdev object of a disk: QEMU opens it by name,
// or with h, it is handed over.
func blockdevFor(h handoff, d backend.Disk) (map[string]any, error) {
	if h == nil {
		return blockdevArg(d), nil
	}
	return handedBlockdev(h, d)
}

// openTap opens a tap device's queue, as QEMU would for -netdev
// tap,ifname=: no packet information, with virtio-net headers.
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("qemu: opening tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap-"+name), nil //nolint:gosec // a fresh fd
}

// netdevFor is netdevArg with a jailed domain's tap handed over.
func netdevFor(h handoff, n backend.NIC) (map[string]any, error) {
	nd := netdevArg(n)
	if h == nil || nd == nil || n.Mode != "tap" {
		return nd, nil
	}
	f, err := openTap(n.Tap)
	if err != nil {
		return nil, err
	}
	name, err := h.fd(f)
	if err != nil {
		return nil, err
	}
	delete(nd, "ifname")
	delete(nd, "script")
	delete(nd, "downscript")
	nd["fd"] = name
	return nd, nil
}

// jailPath is how a jailed QEMU names path, a file in its domain
// directory or socket directory.
func jailPath(j *qemuJournal, path string) string {
	if j.Jail == nil {
		return path
	}
	switch dir := filepath.Dir(path); {
	case dir == j.Dir && j.Jail.Dir != "":
		return j.Jail.Dir + "/" + filepath.Base(path)
	case dir == filepath.Dir(j.QMPPath) && j.Jail.SockDir != "":
		return j.Jail.SockDir + "/" + filepath.Base(path)
	}
	return path
}

// isProcFd says whether a name is one jailPath makes.
func isProcFd(s string) bool {
	rest, ok := strings.CutPrefix(s, "/proc/self/fd/")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(rest)
	return err == nil && n >= 3 && n < 1<<16
}
