package storage

import (
	"errors"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"toolstackd/internal/safepath"
	"toolstackd/internal/xerr"
)

// This file holds the storage layer's defences against hostile input and
// full disks:
//
//   - where a file SR may live (never in the daemon's own state, never in
//     a system directory);
//   - the space kept free on the file system the database lives on while
//     data is imported (the disk reserve), checked before and during
//     every transfer;
//   - what a plugin may answer (volume keys and URIs that could name a
//     path, file datapaths);
//   - the removal, at start-up, of the spool and temporary files that
//     transfers and writes killed mid-way left behind.

// systemDirs are directories no file SR may be in, or contain, because
// the SR would then scan, hand to VMs, or write next to the host's own
// files: configuration (/etc), programs and libraries (/usr, /bin, /sbin,
// /lib*), the boot loader, kernels and initrd images (/boot, whose *.img
// files a scan would offer as disks), the kernel's views (/proc, /sys),
// device nodes (/dev) and runtime state, sockets and pid files (/run).
// "/" is refused because it contains all of them. Other top-level
// directories (/srv, /home, /mnt, /var, /tmp...) are places an
// administrator may legitimately put disk images.
var systemDirs = []string{"/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc", "/sys", "/dev", "/run"}

// locationPolicy decides where a file SR may live on this host.
type locationPolicy struct {
	// protected are the daemon's state directories (the data directory
	// with the database, the xenops state, the storage metadata and the
	// spool; the plugin and run directories): an SR may not be inside
	// one, or contain one, links followed.
	protected []string
	// homes are directories inside a protected one that are meant to hold
	// an SR (the first-boot "Local storage" SR); only the exact directory
	// is allowed.
	homes []string
}

// check says why a location may not hold a file SR (nil if it may): it
// overlaps a protected or system directory, links followed.
func (p *locationPolicy) check(loc string) error {
	refuse := func(why string) error { return errors.New(why) }
	real, err := safepath.Resolve(loc)
	if err != nil {
		return refuse("it cannot be resolved: " + err.Error())
	}
	if real == "/" {
		return refuse("it is the root directory")
	}
	for _, d := range systemDirs {
		if safepath.Overlaps(d, real) {
			return refuse("it overlaps the system directory " + d)
		}
	}
	if p == nil {
		return nil
	}
	for _, h := range p.homes {
		if h == "" {
			continue
		}
		if hr, err := safepath.Resolve(h); err == nil && hr == real {
			return nil
		}
	}
	for _, d := range p.protected {
		if d != "" && safepath.Overlaps(d, real) {
			return refuse("it overlaps the daemon's state directory " + d)
		}
	}
	return nil
}

// Disk reserve defaults: an import stops with SR_FULL before the file
// system holding the data directory (the database) has less than
// max(DefaultReserveBytes, DefaultReservePercent% of its size) free.
const (
	DefaultReserveBytes   = 1 << 30
	DefaultReservePercent = 5.0
)

// xferInflight bounds the bytes of a transfer that have been read from
// the client but may not be on disk yet (the write pipeline and the
// appender's queue); the space check keeps room for them.
const xferInflight = (xferDepth + 2) * xferChunk

// spaceCheckEvery is how often, in bytes read, a transfer checks the
// free space again.
const spaceCheckEvery = xferChunk

// reserve is the disk reserve policy of a service.
type reserve struct {
	dataDir string
	bytes   int64
	percent float64
	// statfs reads a file system's figures (nil: syscall.Statfs; tests
	// give one that other processes' writes do not move).
	statfs func(path string, st *syscall.Statfs_t) error
}

func newReserve(cfg Config) *reserve {
	r := &reserve{dataDir: cfg.DataDir, bytes: cfg.ReserveBytes, percent: cfg.ReservePercent}
	if r.bytes == 0 {
		r.bytes = DefaultReserveBytes
	}
	if r.percent == 0 {
		r.percent = DefaultReservePercent
	}
	r.bytes, r.percent = max(r.bytes, 0), max(r.percent, 0)
	return r
}

func devOf(p string) (uint64, bool) {
	var st syscall.Stat_t
	if syscall.Stat(p, &st) != nil {
		return 0, false
	}
	return uint64(st.Dev), true
}

// room is how many bytes may still be written to the file system of dir:
// its free space less the reserve when it is the data directory's file
// system (nothing is held back on other file systems).
func (r *reserve) room(dir string) (int64, error) {
	statfs := syscall.Statfs
	if r != nil && r.statfs != nil {
		statfs = r.statfs
	}
	var st syscall.Statfs_t
	if err := statfs(dir, &st); err != nil {
		return 0, err
	}
	free := int64(st.Bavail) * st.Bsize
	if r == nil || r.dataDir == "" {
		return free, nil
	}
	d1, ok1 := devOf(dir)
	d2, ok2 := devOf(r.dataDir)
	if !ok1 || !ok2 || d1 != d2 {
		return free, nil
	}
	total := int64(st.Blocks) * st.Bsize
	keep := max(r.bytes, int64(float64(total)*r.percent/100))
	return free - keep, nil
}

// spaceGuard checks, for one transfer, the file systems it writes to.
type spaceGuard struct {
	r    *reserve
	dirs []string
}

func (s *Service) guardFor(dirs ...string) *spaceGuard {
	g := &spaceGuard{r: s.reserve}
	for _, d := range dirs {
		if d != "" {
			g.dirs = append(g.dirs, d)
		}
	}
	return g
}

// check fails with SR_FULL [requested, maximum] when need bytes (plus
// what may be in flight) do not fit on one of the guarded file systems.
func (g *spaceGuard) check(need int64) error {
	if g == nil {
		return nil
	}
	for _, d := range g.dirs {
		room, err := g.r.room(d)
		if err != nil {
			continue // gone or unreadable: the write itself will tell
		}
		if need > room {
			return xerr.New(xerr.SRFull, strconv.FormatInt(need, 10), strconv.FormatInt(max(room, 0), 10))
		}
	}
	return nil
}

// reader wraps an upload so that the free space is checked again every
// spaceCheckEvery bytes: a Content-Length may be absent or lie.
func (g *spaceGuard) reader(r io.Reader) io.Reader {
	if g == nil || len(g.dirs) == 0 {
		return r
	}
	return &guardedReader{r: r, g: g, next: 0}
}

type guardedReader struct {
	r    io.Reader
	g    *spaceGuard
	n    int64 // bytes read
	next int64 // when to check again
	err  error
}

func (gr *guardedReader) Read(p []byte) (int, error) {
	if gr.err != nil {
		return 0, gr.err
	}
	if gr.n >= gr.next {
		if err := gr.g.check(min(gr.n, xferInflight) + int64(len(p))); err != nil {
			gr.err = err
			return 0, err
		}
		gr.next = gr.n + spaceCheckEvery
	}
	k, err := gr.r.Read(p)
	gr.n += int64(k)
	return k, err
}

// isSpaceErr reports a failure for want of space: SR_FULL from a guard or
// ENOSPC/EDQUOT from the file system.
func isSpaceErr(err error) bool {
	return xerr.HasCode(err, xerr.SRFull) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// spoolPattern is how spool files are named (os.CreateTemp patterns).
const spoolPattern = "import-*.qcow2"

// cleanLeftovers removes what transfers and metadata writes killed
// mid-way left behind: spool files (named as the spool names them) in
// the spool directory, and temporary files (.tmp-*, see writeFileAtomic)
// in the storage state directory. Nothing else is touched, and nothing
// outside those two directories, which the storage layer owns. (Each
// file SR cleans its own temporary files when it is attached.)
func (s *Service) cleanLeftovers() {
	if s.cfg.DataDir == "" {
		return // a shared temporary spool may be in use by another process
	}
	for _, c := range []struct{ dir, pattern string }{
		{s.spoolDir(), spoolPattern},
		{filepath.Join(s.cfg.DataDir, "storage"), tmpPrefix + "*"},
	} {
		ents, err := os.ReadDir(c.dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.Type().IsRegular() {
				continue
			}
			if ok, _ := filepath.Match(c.pattern, e.Name()); !ok {
				continue
			}
			p, err := safepath.JoinName(c.dir, e.Name())
			if err != nil {
				continue
			}
			if err := os.Remove(p); err == nil {
				s.log.Info("removed a file left by an interrupted transfer or write", "file", p)
			}
		}
	}
}

// checkVolumeKey refuses a volume key that could name a path outside its
// SR when a driver uses it as one: empty, absolute, with a ".." step or
// a NUL byte.
func checkVolumeKey(key string) error {
	if key == "" || strings.ContainsRune(key, 0) || strings.HasPrefix(key, "/") || !filepath.IsLocal(key) {
		return &safepath.Error{Elem: key, Err: safepath.ErrEscape}
	}
	return nil
}

// checkPluginURI refuses a volume URI whose path climbs with "..".
func checkPluginURI(uri string) error {
	u, err := url.Parse(uri)
	if err != nil {
		return err
	}
	if strings.ContainsRune(uri, 0) {
		return errors.New("URI contains a NUL byte")
	}
	if strings.Contains(u.Host, "..") {
		return errors.New("URI host contains \"..\"")
	}
	for _, p := range []string{u.Path, u.Opaque} {
		for _, el := range strings.Split(p, "/") {
			if el == ".." {
				return errors.New("URI path contains \"..\"")
			}
		}
	}
	return nil
}

// checkDatapathFile refuses a file datapath a plugin gave that is not a
// clean absolute path, or that lies in the daemon's state or in a system
// directory other than /dev (where block devices are).
func (p *locationPolicy) checkDatapathFile(file string) error {
	if !filepath.IsAbs(file) || path.Clean(file) != file || strings.ContainsRune(file, 0) {
		return errors.New("the path is not a clean absolute path")
	}
	real, err := safepath.Resolve(file)
	if err != nil {
		return err
	}
	for _, d := range systemDirs {
		if d != "/dev" && safepath.Contains(d, real) {
			return errors.New("the path is in the system directory " + d)
		}
	}
	if p != nil {
		for _, d := range p.protected {
			if d != "" && safepath.Contains(d, real) {
				return errors.New("the path is in the daemon's state directory " + d)
			}
		}
	}
	return nil
}

// errSpace is the SR_FULL of a transfer that ran out of room without a
// guard noticing (the file system said ENOSPC).
func errSpace(err error) error {
	var xe *xerr.Error
	if errors.As(err, &xe) && xe.Code == xerr.SRFull {
		return xe
	}
	return xerr.New(xerr.SRFull, "0", "0")
}
