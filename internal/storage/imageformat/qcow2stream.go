package imageformat

import (
	"context"
	"encoding/binary"
	"io"
	"slices"
	"sort"
)

// Qcow2Plan lays out a qcow2 image holding given clusters of a disk, so
// that it can be streamed front to back: header, refcount table and
// blocks, L1, L2 tables, then the data clusters in guest order. Clusters
// not listed are unallocated (they read as zero, or on import leave the
// target as it is); zero clusters are recorded as such.
type Qcow2Plan struct {
	size       int64
	data       []crun // runs of guest clusters with data, ascending
	zero       []crun // runs of guest clusters that read as zero, ascending
	nData      int64  // clusters in data
	l1Entries  int64
	l2Tables   []int64 // L1 indexes that have an L2 table, ascending
	rtClusters int64
	rbClusters int64
	l1Clusters int64
	nClusters  int64
}

// crun is a run of n clusters from first.
type crun struct{ first, n int64 }

// addRun appends a run, merging it with the last one when they touch or
// overlap (extents that share a cluster).
func addRun(runs []crun, first, n int64) []crun {
	if k := len(runs); k > 0 {
		last := &runs[k-1]
		if end := last.first + last.n; first <= end {
			if first+n > end {
				last.n = first + n - last.first
			}
			return runs
		}
	}
	return append(runs, crun{first, n})
}

const qcowL2Entries = ClusterSize / 8

// PlanQcow2 plans an image of a disk of size bytes from its extents:
// non-zero extents become data clusters, zero extents that cover whole
// clusters become zero clusters (when keepZero; otherwise they are left
// unallocated, which reads the same in an image without a backing file).
// Memory is proportional to the number of extents, not to the disk.
func PlanQcow2(size int64, exts []Extent, keepZero bool) *Qcow2Plan {
	const cs = ClusterSize
	exts = slices.Clone(exts)
	sort.Slice(exts, func(i, j int) bool { return exts[i].Offset < exts[j].Offset })
	p := &Qcow2Plan{size: size}
	clusters := (size + cs - 1) / cs
	for _, e := range exts {
		if e.Zero || e.Length <= 0 || e.Offset >= size {
			continue
		}
		first, last := e.Offset/cs, min((e.Offset+e.Length-1)/cs, clusters-1)
		p.data = addRun(p.data, first, last-first+1)
	}
	if keepZero {
		di := 0
		for _, e := range exts {
			if !e.Zero || e.Length <= 0 || e.Offset >= size {
				continue
			}
			end := e.Offset + e.Length
			if end >= size {
				end = clusters * cs // the tail cluster past the end counts as covered
			}
			first, stop := (e.Offset+cs-1)/cs, end/cs
			// Leave out clusters that also hold data.
			for first < stop {
				for di < len(p.data) && p.data[di].first+p.data[di].n <= first {
					di++
				}
				next := stop
				if di < len(p.data) && p.data[di].first < stop {
					next = max(p.data[di].first, first)
				}
				if next > first {
					p.zero = addRun(p.zero, first, next-first)
				}
				if di < len(p.data) && p.data[di].first < stop {
					first = p.data[di].first + p.data[di].n
				} else {
					first = stop
				}
			}
		}
	}
	for _, r := range p.data {
		p.nData += r.n
	}
	p.l1Entries = (size + cs*qcowL2Entries - 1) / (cs * qcowL2Entries)
	p.l1Clusters = (p.l1Entries*8 + cs - 1) / cs
	var tables []int64
	for _, list := range [][]crun{p.data, p.zero} {
		for _, r := range list {
			for t := r.first / qcowL2Entries; t <= (r.first+r.n-1)/qcowL2Entries; t++ {
				tables = append(tables, t)
			}
		}
	}
	sort.Slice(tables, func(i, j int) bool { return tables[i] < tables[j] })
	p.l2Tables = slices.Compact(tables)
	fixed := 1 + p.l1Clusters + int64(len(p.l2Tables)) + p.nData
	p.rbClusters, p.rtClusters = 1, 1
	for {
		n := fixed + p.rbClusters + p.rtClusters
		rb := (n + cs/2 - 1) / (cs / 2) // 16-bit refcounts
		rt := (rb*8 + cs - 1) / cs
		if rb == p.rbClusters && rt == p.rtClusters {
			p.nClusters = n
			break
		}
		p.rbClusters, p.rtClusters = rb, rt
	}
	return p
}

// Length is the size of the image file.
func (p *Qcow2Plan) Length() int64 { return p.nClusters * ClusterSize }

// DataBytes is how many bytes of guest data the image carries.
func (p *Qcow2Plan) DataBytes() int64 { return p.nData * ClusterSize }

func (p *Qcow2Plan) offsets() (rt, rb, l1, l2, data int64) {
	rt = 1
	rb = rt + p.rtClusters
	l1 = rb + p.rbClusters
	l2 = l1 + p.l1Clusters
	data = l2 + int64(len(p.l2Tables))
	return
}

// WriteTo streams the image, reading data clusters from r (a reader of
// the disk's guest content): the header, the refcount table and blocks,
// L1, the L2 tables, then the data clusters in order.
func (p *Qcow2Plan) WriteTo(ctx context.Context, w io.Writer, r io.ReaderAt, readRanges RangeReader, progress func(int64)) error {
	const cs = ClusterSize
	be := binary.BigEndian
	rtC, rbC, l1C, l2C, _ := p.offsets()
	pw := &progressWriter{w: w, progress: progress}
	cluster := make([]byte, cs)
	hdr := qcow2Image(p.size, "", "").chunks[0].data
	copy(cluster, hdr)
	be.PutUint32(cluster[36:], uint32(p.l1Entries))
	be.PutUint64(cluster[40:], uint64(l1C*cs))
	be.PutUint64(cluster[48:], uint64(rtC*cs))
	be.PutUint32(cluster[56:], uint32(p.rtClusters))
	if err := pw.put(cluster); err != nil {
		return err
	}
	// The refcount table points at the blocks; in the blocks every
	// cluster of the file is used once.
	if err := pw.putTable(cluster, p.rtClusters, 8, func(k int64) (uint64, bool) {
		return uint64((rbC + k) * cs), k < p.rbClusters
	}); err != nil {
		return err
	}
	if err := pw.putTable(cluster, p.rbClusters, 2, func(k int64) (uint64, bool) { return 1, k < p.nClusters }); err != nil {
		return err
	}
	// L1 points at the L2 tables there are (entries come in order).
	ti := 0
	if err := pw.putTable(cluster, p.l1Clusters, 8, func(e int64) (uint64, bool) {
		for ti < len(p.l2Tables) && p.l2Tables[ti] < e {
			ti++
		}
		return uint64((l2C+int64(ti))*cs) | qcowOflagCopied, ti < len(p.l2Tables) && p.l2Tables[ti] == e
	}); err != nil {
		return err
	}
	if err := p.writeL2(ctx, pw, cluster); err != nil {
		return err
	}
	// Data, the runs read in order.
	ranges := make([]Extent, len(p.data))
	for i, r := range p.data {
		ranges[i] = Extent{Offset: r.first * cs, Length: r.n * cs}
	}
	return readRanges(ctx, tailReader{r, p.size}, ranges, func(off int64, b []byte) error { return pw.put(b) })
}

// writeL2 writes the L2 tables: each data cluster's place in the data
// area (clusters in run order), and the zero flag for zero runs.
func (p *Qcow2Plan) writeL2(ctx context.Context, pw *progressWriter, cluster []byte) error {
	const cs = ClusterSize
	be := binary.BigEndian
	_, _, _, _, dataC := p.offsets()
	di, zi := 0, 0
	var ordinal int64 // data clusters before run di
	for _, t := range p.l2Tables {
		if err := ctx.Err(); err != nil {
			return err
		}
		clear(cluster)
		lo, hi := t*qcowL2Entries, (t+1)*qcowL2Entries
		for di < len(p.data) && p.data[di].first < hi {
			r := p.data[di]
			for c := max(r.first, lo); c < min(r.first+r.n, hi); c++ {
				be.PutUint64(cluster[8*(c-lo):], uint64((dataC+ordinal+c-r.first)*cs)|qcowOflagCopied)
			}
			if r.first+r.n > hi {
				break
			}
			ordinal += r.n
			di++
		}
		for zi < len(p.zero) && p.zero[zi].first < hi {
			r := p.zero[zi]
			for c := max(r.first, lo); c < min(r.first+r.n, hi); c++ {
				be.PutUint64(cluster[8*(c-lo):], qcowOflagZero)
			}
			if r.first+r.n > hi {
				break
			}
			zi++
		}
		if err := pw.put(cluster); err != nil {
			return err
		}
	}
	return nil
}

// progressWriter writes an image stream and reports the bytes written
// so far after each write.
type progressWriter struct {
	w        io.Writer
	written  int64
	progress func(int64) // may be nil
}

func (pw *progressWriter) put(b []byte) error {
	_, err := pw.w.Write(b)
	pw.written += int64(len(b))
	if pw.progress != nil {
		pw.progress(pw.written)
	}
	return err
}

// putTable writes n clusters of big-endian entries width bytes wide (8
// or 2), using cluster as the buffer: entry k over all n clusters is
// entry(k), or zero when entry reports false. entry is called with k in
// increasing order.
func (pw *progressWriter) putTable(cluster []byte, n, width int64, entry func(k int64) (uint64, bool)) error {
	per := int64(len(cluster)) / width
	for i := range n {
		clear(cluster)
		for j := range per {
			v, ok := entry(i*per + j)
			if !ok {
				continue
			}
			if width == 2 {
				binary.BigEndian.PutUint16(cluster[2*j:], uint16(v))
			} else {
				binary.BigEndian.PutUint64(cluster[8*j:], v)
			}
		}
		if err := pw.put(cluster); err != nil {
			return err
		}
	}
	return nil
}

// tailReader reads past the end of a disk as zeroes (the last cluster of
// an image may extend beyond the virtual size).
type tailReader struct {
	r    io.ReaderAt
	size int64
}

func (t tailReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= t.size {
		clear(p)
		return len(p), nil
	}
	if end := off + int64(len(p)); end > t.size {
		n := t.size - off
		if _, err := t.r.ReadAt(p[:n], off); err != nil {
			return 0, err
		}
		clear(p[n:])
		return len(p), nil
	}
	return t.r.ReadAt(p, off)
}
