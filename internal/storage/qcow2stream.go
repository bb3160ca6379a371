package storage

import (
	"context"
	"encoding/binary"
	"io"
	"slices"
	"sort"
)

// qcowPlan lays out a qcow2 image holding given clusters of a disk, so
// that it can be streamed front to back: header, refcount table and
// blocks, L1, L2 tables, then the data clusters in guest order. Clusters
// not listed are unallocated (they read as zero, or on import leave the
// target as it is); zero clusters are recorded as such.
type qcowPlan struct {
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

const qcowL2Entries = qcowClusterSize / 8

// planQcow2 plans an image of a disk of size bytes from its extents:
// non-zero extents become data clusters, zero extents that cover whole
// clusters become zero clusters (when keepZero; otherwise they are left
// unallocated, which reads the same in an image without a backing file).
// Memory is proportional to the number of extents, not to the disk.
func planQcow2(size int64, exts []Extent, keepZero bool) *qcowPlan {
	const cs = qcowClusterSize
	exts = slices.Clone(exts)
	sort.Slice(exts, func(i, j int) bool { return exts[i].Offset < exts[j].Offset })
	p := &qcowPlan{size: size}
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
func (p *qcowPlan) Length() int64 { return p.nClusters * qcowClusterSize }

// DataBytes is how many bytes of guest data the image carries.
func (p *qcowPlan) DataBytes() int64 { return p.nData * qcowClusterSize }

func (p *qcowPlan) offsets() (rt, rb, l1, l2, data int64) {
	rt = 1
	rb = rt + p.rtClusters
	l1 = rb + p.rbClusters
	l2 = l1 + p.l1Clusters
	data = l2 + int64(len(p.l2Tables))
	return
}

// WriteTo streams the image, reading data clusters from r (a reader of
// the disk's guest content).
func (p *qcowPlan) WriteTo(ctx context.Context, w io.Writer, r io.ReaderAt, progress func(int64)) error {
	const cs = qcowClusterSize
	be := binary.BigEndian
	rtC, rbC, l1C, l2C, dataC := p.offsets()
	var written int64
	put := func(b []byte) error {
		_, err := w.Write(b)
		written += int64(len(b))
		if progress != nil {
			progress(written)
		}
		return err
	}
	cluster := make([]byte, cs)
	// Header.
	hdr := qcow2Image(p.size, "", "").chunks[0].data
	copy(cluster, hdr)
	be.PutUint32(cluster[36:], uint32(p.l1Entries))
	be.PutUint64(cluster[40:], uint64(l1C*cs))
	be.PutUint64(cluster[48:], uint64(rtC*cs))
	be.PutUint32(cluster[56:], uint32(p.rtClusters))
	if err := put(cluster); err != nil {
		return err
	}
	// Refcount table.
	for i := int64(0); i < p.rtClusters; i++ {
		clear(cluster)
		for j := int64(0); j < cs/8; j++ {
			if b := i*(cs/8) + j; b < p.rbClusters {
				be.PutUint64(cluster[8*j:], uint64((rbC+b)*cs))
			}
		}
		if err := put(cluster); err != nil {
			return err
		}
	}
	// Refcount blocks: every cluster of the file is used once.
	for i := int64(0); i < p.rbClusters; i++ {
		clear(cluster)
		for j := int64(0); j < cs/2; j++ {
			if c := i*(cs/2) + j; c < p.nClusters {
				be.PutUint16(cluster[2*j:], 1)
			}
		}
		if err := put(cluster); err != nil {
			return err
		}
	}
	// L1.
	ti := 0
	for i := int64(0); i < p.l1Clusters; i++ {
		clear(cluster)
		for j := int64(0); j < cs/8; j++ {
			e := i*(cs/8) + j
			for ti < len(p.l2Tables) && p.l2Tables[ti] < e {
				ti++
			}
			if ti < len(p.l2Tables) && p.l2Tables[ti] == e {
				be.PutUint64(cluster[8*j:], uint64((l2C+int64(ti))*cs)|qcowOflagCopied)
			}
		}
		if err := put(cluster); err != nil {
			return err
		}
	}
	// L2 tables.
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
		if err := put(cluster); err != nil {
			return err
		}
	}
	// Data, the runs read in order.
	ranges := make([]Extent, len(p.data))
	for i, r := range p.data {
		ranges[i] = Extent{Offset: r.first * cs, Length: r.n * cs}
	}
	return readOrdered(ctx, tailReader{r, p.size}, ranges, func(off int64, b []byte) error { return put(b) })
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
