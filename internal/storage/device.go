package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"syscall"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage/imageformat"
)

// A device is an attached VDI opened for a transfer: a file (raw), a
// qcow2 chain read directly through its map, or an NBD export (for
// writing qcow2, through a private qemu-nbd).
type device struct {
	size    int64
	r       io.ReaderAt
	w       io.WriterAt
	zero    func(off, n int64) error
	flush   func() error
	exts    []Extent     // allocation of the whole device, when known
	chain   *chainReader // set when reads can go straight to files
	closers []func() error
}

func (d *device) Close() error {
	var errs []error
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	d.closers = nil
	return errors.Join(errs...)
}

// vhdTarget is the device as a VHD import writes to it.
func (d *device) vhdTarget() imageformat.Disk {
	return imageformat.Disk{Size: d.size, Zero: d.zero, Write: func(b []byte, off int64) error { return writeChunk(d, b, off) }}
}

// extents returns the device's allocation, or one data extent when it is
// not known.
func (d *device) extents() []Extent {
	if d.exts != nil {
		return d.exts
	}
	if d.size == 0 {
		return nil
	}
	return []Extent{{Offset: 0, Length: d.size}}
}

// dataExtents are the extents of the device that hold data, in order, and
// the number of bytes they hold.
func (d *device) dataExtents() (data []Extent, size int64) {
	for _, e := range d.extents() {
		if !e.Zero {
			data = append(data, e)
			size += e.Length
		}
	}
	return data, size
}

// openDevice opens an attached datapath for reading or for writing.
func openDevice(ctx context.Context, dp Datapath, write bool, run string) (*device, error) {
	switch dp.Kind {
	case "nbd":
		u, err := nbd.ParseURI(dp.URI)
		if err != nil {
			return nil, err
		}
		c, err := nbd.Dial(ctx, u)
		if err != nil {
			return nil, err
		}
		d := &device{size: c.Size(), r: c, zero: c.WriteZeroes, flush: c.Flush, closers: []func() error{c.Close}}
		if write {
			if c.ReadOnly() {
				_ = c.Close()
				return nil, errors.New("NBD export is read-only")
			}
			d.w = c
		}
		return d, nil
	case "file":
	default:
		return nil, fmt.Errorf("unknown datapath kind %q", dp.Kind)
	}
	switch dp.Format {
	case "raw":
		return openRawFile(dp.Path, write)
	case "qcow2":
		if write {
			return openQcow2Write(ctx, dp.Path, run)
		}
		return openQcow2Read(ctx, dp.Path, run)
	}
	return nil, fmt.Errorf("unknown image format %q", dp.Format)
}

func openRawFile(path string, write bool) (*device, error) {
	flag := os.O_RDONLY
	if write {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0) //nolint:gosec // volume paths come from the SR driver, inside its directory
	if err != nil {
		return nil, err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	d := &device{size: size, r: f, flush: f.Sync, closers: []func() error{f.Close}}
	d.exts = fileExtents(f, size)
	d.chain = &chainReader{files: []*os.File{f}, size: size}
	for _, e := range d.exts {
		x := extent{Start: e.Offset, Length: e.Length, Present: true, Zero: e.Zero, Data: !e.Zero}
		if !e.Zero {
			off := e.Offset
			x.Offset = &off
		}
		d.chain.exts = append(d.chain.exts, x)
	}
	if write {
		d.w = f
		d.zero = func(off, n int64) error {
			// Punch a hole; where the filesystem cannot, write zeroes.
			if err := syscall.Fallocate(int(f.Fd()), 0x02|0x01, off, n); err == nil {
				return nil
			}
			return nbd.ZeroFill(f, off, n)
		}
	}
	return d, nil
}

// fileExtents maps a file's data and holes with SEEK_DATA/SEEK_HOLE; a
// file system without them reports one data extent.
func fileExtents(f *os.File, size int64) []Extent {
	const seekData, seekHole = 3, 4
	var out []Extent
	var off int64
	for off < size {
		data, err := f.Seek(off, seekData)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) {
				out = append(out, Extent{Offset: off, Length: size - off, Zero: true})
				break
			}
			return []Extent{{Offset: 0, Length: size}}
		}
		if data > off {
			out = append(out, Extent{Offset: off, Length: data - off, Zero: true})
		}
		hole, err := f.Seek(data, seekHole)
		if err != nil {
			return []Extent{{Offset: 0, Length: size}}
		}
		hole = min(hole, size)
		out = append(out, Extent{Offset: data, Length: hole - data})
		off = hole
	}
	_, _ = f.Seek(0, io.SeekStart) // reads use ReadAt: the offset is only tidied
	return out
}

// openQcow2Read reads a qcow2 chain straight from its files using the map
// qemu-img gives, or through a read-only qemu-nbd when the map cannot
// locate all data (compressed clusters).
func openQcow2Read(ctx context.Context, path, run string) (*device, error) {
	paths, _, err := imageformat.Chain(path, "qcow2")
	if err != nil {
		return nil, err
	}
	size, err := imageSize(path, "qcow2")
	if err != nil {
		return nil, err
	}
	m, err := imageMap(ctx, path, "qcow2", size)
	if err != nil {
		return nil, err
	}
	exts := make([]Extent, 0, len(m))
	direct := true
	for _, e := range m {
		zero := !e.Present || (e.Zero && !e.Data)
		exts = append(exts, Extent{Offset: e.Start, Length: e.Length, Zero: zero})
		if !zero && (e.Offset == nil || e.Depth >= len(paths)) {
			direct = false
		}
	}
	exts = mergeSame(exts)
	if direct {
		cr := &chainReader{size: size, exts: m}
		for _, p := range paths {
			f, err := os.Open(p) //nolint:gosec // the backing chain qemu-img reports for a volume of the SR
			if err != nil {
				_ = cr.close()
				return nil, err
			}
			cr.files = append(cr.files, f)
		}
		return &device{size: size, r: cr, exts: exts, chain: cr, closers: []func() error{cr.close}}, nil
	}
	q, c, err := serveQcow2(ctx, run, path, true)
	if err != nil {
		return nil, err
	}
	return &device{size: size, r: c, exts: exts, closers: []func() error{q.stop, c.Close}}, nil
}

func openQcow2Write(ctx context.Context, path, run string) (*device, error) {
	q, c, err := serveQcow2(ctx, run, path, false)
	if err != nil {
		return nil, err
	}
	return &device{size: c.Size(), r: c, w: c, zero: c.WriteZeroes, flush: c.Flush, closers: []func() error{q.stop, c.Close}}, nil
}

// serveQcow2 serves a qcow2 image through a private qemu-nbd and connects
// to it; the caller stops the server after closing the client.
func serveQcow2(ctx context.Context, run, path string, readonly bool) (*qemuNBD, *nbd.Client, error) {
	q, err := startQemuNBD(ctx, run, path, "qcow2", readonly)
	if err != nil {
		return nil, nil, err
	}
	c, err := nbd.Dial(ctx, q.uri())
	if err != nil {
		_ = q.stop()
		return nil, nil, err
	}
	return q, c, nil
}

func mergeSame(in []Extent) []Extent {
	var out []Extent
	for _, e := range in {
		if n := len(out); n > 0 && out[n-1].Zero == e.Zero && out[n-1].Offset+out[n-1].Length == e.Offset {
			out[n-1].Length += e.Length
			continue
		}
		out = append(out, e)
	}
	return out
}

// chainReader reads guest data of a qcow2 chain (or a raw file) through
// the extent map: data extents straight from the file at their depth,
// everything else as zeroes.
type chainReader struct {
	files []*os.File
	exts  []extent
	size  int64
}

func (c *chainReader) close() error {
	for _, f := range c.files {
		_ = f.Close()
	}
	return nil
}

// piece is a run of guest data: where it comes from.
type piece struct {
	file *os.File // nil: zeroes
	off  int64    // offset in file
	n    int64
}

// pieces lists where the guest range [off, off+n) lives.
func (c *chainReader) pieces(off, n int64) []piece {
	var out []piece
	i := sort.Search(len(c.exts), func(i int) bool { return c.exts[i].Start+c.exts[i].Length > off })
	for n > 0 && i < len(c.exts) {
		e := c.exts[i]
		k := min(n, e.Start+e.Length-off)
		p := piece{n: k}
		if e.Present && e.Data && e.Offset != nil && e.Depth < len(c.files) {
			p.file, p.off = c.files[e.Depth], *e.Offset+(off-e.Start)
		}
		if m := len(out); m > 0 && out[m-1].file == p.file && (p.file == nil || out[m-1].off+out[m-1].n == p.off) {
			out[m-1].n += k
		} else {
			out = append(out, p)
		}
		off, n, i = off+k, n-k, i+1
	}
	if n > 0 {
		out = append(out, piece{n: n})
	}
	return out
}

func (c *chainReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > c.size {
		return 0, io.EOF
	}
	done := 0
	for _, pc := range c.pieces(off, int64(len(p))) {
		b := p[done : done+int(pc.n)]
		if pc.file == nil {
			clear(b)
		} else if _, err := pc.file.ReadAt(b, pc.off); err != nil {
			return done, err
		}
		done += int(pc.n)
	}
	return done, nil
}
