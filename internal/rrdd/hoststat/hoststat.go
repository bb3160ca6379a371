package hoststat

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/safepath"
)

// Reader reads the host's counters from a root directory ("/" in the
// daemon; a fixture tree in tests). Its zero value reads the host it
// runs on. A Reader holds no state between reads and may be used from
// several goroutines at once.
type Reader struct {
	// Root is the directory that holds proc/ and sys/; "" means "/".
	Root string
}

// Read reads every source once and returns what it found; see the
// package comment for the sources, what is skipped and the errors.
func (r Reader) Read() (stats.Host, error) {
	root := r.Root
	if root == "" {
		root = "/"
	}
	rd := reading{root: root, buf: make([]byte, 0, 8<<10)}
	var h stats.Host
	var err error

	b, path, err := rd.file("proc/stat")
	if err != nil {
		return stats.Host{}, err
	}
	if h.CPUBusy, h.CPUTotal, err = parseStat(b); err != nil {
		return stats.Host{}, fmt.Errorf("hoststat: %s: %w", path, err)
	}

	b, path, err = rd.file("proc/meminfo")
	if err != nil {
		return stats.Host{}, err
	}
	if h.MemoryTotal, h.MemoryFree, err = parseMeminfo(b); err != nil {
		return stats.Host{}, fmt.Errorf("hoststat: %s: %w", path, err)
	}

	b, path, err = rd.file("proc/loadavg")
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return stats.Host{}, err
	default:
		if h.LoadAverage, err = parseLoadavg(b); err != nil {
			return stats.Host{}, fmt.Errorf("hoststat: %s: %w", path, err)
		}
	}

	if h.NICs, err = rd.nics(); err != nil {
		return stats.Host{}, err
	}

	if h.Disks, err = rd.disks(); err != nil {
		return stats.Host{}, err
	}
	return h, nil
}

// reading is one Read in progress: the root and a buffer the files are
// read into in turn.
type reading struct {
	root string
	buf  []byte
}

// file reads the file at rel below the root into the shared buffer, which
// it returns until the next call, with the file's full path. Its errors
// name the path (and wrap fs.ErrNotExist for a missing file).
func (rd *reading) file(rel string) (b []byte, path string, err error) {
	path = filepath.Join(rd.root, rel)
	b, err = rd.read(path)
	return b, path, err
}

// read reads the file at path, of at most maxFileSize bytes, into the
// shared buffer.
func (rd *reading) read(path string) ([]byte, error) {
	f, err := os.Open(path) //nolint:gosec // G304: fixed names below the configured root, and interface names checked by safepath
	if err != nil {
		return nil, fmt.Errorf("hoststat: %w", err)
	}
	defer func() { _ = f.Close() }()
	b := rd.buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if len(b) > maxFileSize {
			return nil, fmt.Errorf("hoststat: %s: %w: larger than %d bytes", path, errFormat, maxFileSize)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("hoststat: %w", err)
		}
	}
	rd.buf = b
	return b, nil
}

// nicCounters are the files read for each interface, in the order of the
// NIC fields they fill.
var nicCounters = [...]string{"rx_bytes", "tx_bytes", "rx_errors", "tx_errors"}

// nics reads the counters of every interface but lo, sorted by name.
func (rd *reading) nics() ([]stats.NIC, error) {
	dir := filepath.Join(rd.root, "sys/class/net")
	entries, err := os.ReadDir(dir) // sorted by name
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("hoststat: %w", err)
	}
	var nics []stats.NIC
	for _, e := range entries {
		// Interfaces are links (directories in a copied tree);
		// bonding_masters is a plain file.
		if e.Name() == "lo" || e.Type().IsRegular() {
			continue
		}
		devDir, err := safepath.JoinName(dir, e.Name())
		if err != nil {
			continue // cannot come from a directory listing
		}
		nic := stats.NIC{Device: e.Name()}
		v := [len(nicCounters)]*uint64{&nic.RxBytes, &nic.TxBytes, &nic.RxErrors, &nic.TxErrors}
		gone := false
		for i, name := range nicCounters {
			path := filepath.Join(devDir, "statistics", name)
			b, err := rd.read(path)
			if err != nil {
				if vanished(err, devDir) {
					gone = true
					break
				}
				return nil, err
			}
			x, ok := parseDec(trimSpace(b))
			if !ok {
				return nil, fmt.Errorf("hoststat: %s: line 1: %w: %q is not a decimal number", path, errFormat, clip(b))
			}
			*v[i] = x
		}
		if !gone {
			nics = append(nics, nic)
		}
	}
	return nics, nil
}

// vanished reports whether err, met reading a counter of the interface at
// devDir, means that the interface went away since the directory was
// listed. Its directory (or link) is then gone, or is going: while the
// kernel tears an interface down, its counters answer ENODEV or EINVAL.
func vanished(err error, devDir string) bool {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) ||
		errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EINVAL) {
		return true
	}
	_, statErr := os.Lstat(devDir)
	return errors.Is(statErr, fs.ErrNotExist)
}

// trimSpace cuts the blanks and newlines around a sysfs value.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && (isSpace(b[0]) || b[0] == '\n') {
		b = b[1:]
	}
	for len(b) > 0 && (isSpace(b[len(b)-1]) || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}

// disks reads /proc/diskstats, telling whole disks by /sys/block when the
// root has one.
func (rd *reading) disks() ([]stats.Disk, error) {
	var keep diskFilter
	blockDir := filepath.Join(rd.root, "sys/block")
	names, err := readDirNames(blockDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("hoststat: %w", err)
	default:
		keep.whole = make(map[string]bool, len(names))
		for _, n := range names {
			keep.whole[n] = true
		}
	}
	b, path, err := rd.file("proc/diskstats")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	disks, err := parseDiskstats(b, keep)
	if err != nil {
		return nil, fmt.Errorf("hoststat: %s: %w", path, err)
	}
	return disks, nil
}

// readDirNames lists a directory without looking at its entries.
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir) //nolint:gosec // G304: a fixed name below the configured root
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return f.Readdirnames(-1)
}
