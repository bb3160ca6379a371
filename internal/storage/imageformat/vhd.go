package imageformat

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
	"unicode/utf16"

	"github.com/google/uuid"
)

// VHD (Microsoft's Virtual Hard Disk format, as xapi's vhd-tool and Xen
// Orchestra's backups use it): dynamic disks for full transfers,
// differencing disks for deltas. Both are laid out so they stream:
//
//	footer copy | dynamic header | BAT | [parent locator] | blocks... | footer
//
// with 2 MiB blocks, each a sector bitmap then the data.

const (
	vhdSector     = 512
	vhdBlockSize  = 2 << 20
	vhdBitmapSize = 512 // 4096 sectors per block, one bit each, padded to a sector
	vhdUnused     = 0xffffffff
	vhdDynamic    = 3
	vhdDiff       = 4
	vhdFixed      = 2
)

var vhdEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// vhdChecksum is the one's complement of the byte sum, the checksum field
// counted as zero.
func vhdChecksum(b []byte, field int) uint32 {
	var sum uint32
	for i, c := range b {
		if i >= field && i < field+4 {
			continue
		}
		sum += uint32(c)
	}
	return ^sum
}

// vhdGeometry is the CHS geometry the VHD specification derives from a
// size.
func vhdGeometry(size int64) uint32 {
	sectors := size / vhdSector
	if sectors > 65535*16*255 {
		sectors = 65535 * 16 * 255
	}
	var spt, heads, cth int64
	if sectors >= 65535*16*63 {
		spt, heads = 255, 16
		cth = sectors / spt
	} else {
		spt = 17
		cth = sectors / spt
		heads = (cth + 1023) / 1024
		if heads < 4 {
			heads = 4
		}
		if cth >= heads*1024 || heads > 16 {
			spt, heads = 31, 16
			cth = sectors / spt
		}
		if cth >= heads*1024 {
			spt, heads = 63, 16
			cth = sectors / spt
		}
	}
	cyl := cth / heads
	return uint32(cyl)<<16 | uint32(heads)<<8 | uint32(spt)
}

func vhdFooter(size int64, diskType uint32, id uuid.UUID, now time.Time) []byte {
	b := make([]byte, vhdSector)
	be := binary.BigEndian
	copy(b[0:], "conectix")
	be.PutUint32(b[8:], 2)
	be.PutUint32(b[12:], 0x00010000)
	be.PutUint64(b[16:], vhdSector) // the dynamic header follows the footer copy
	be.PutUint32(b[24:], uint32(now.Sub(vhdEpoch)/time.Second))
	// "tap": blktap's creator, which QEMU and XenServer's tools take to
	// mean that current_size, not the CHS geometry, is the size.
	copy(b[28:], "tap\x00")
	be.PutUint32(b[32:], 0x00010003)
	copy(b[36:], "Wi2k")
	be.PutUint64(b[40:], uint64(size))
	be.PutUint64(b[48:], uint64(size))
	be.PutUint32(b[56:], vhdGeometry(size))
	be.PutUint32(b[60:], diskType)
	copy(b[68:], id[:])
	be.PutUint32(b[64:], vhdChecksum(b, 64))
	return b
}

// VHDPlan lays out a streamed VHD.
type VHDPlan struct {
	size      int64
	blocks    []int64          // allocated block numbers, ascending
	bitmaps   map[int64][]byte // differencing: which sectors each block carries
	diff      bool
	id        uuid.UUID
	parent    uuid.UUID
	parentTS  time.Time
	entries   int64
	batBytes  int64
	locator   []byte
	blocksOff int64
}

// PlanVHD plans a dynamic VHD of the non-zero extents, or (diff) a
// differencing VHD of the given changed extents, zero ones included.
func PlanVHD(size int64, exts []Extent, diff bool, id, parent uuid.UUID) *VHDPlan {
	p := &VHDPlan{size: size, diff: diff, id: id, parent: parent, parentTS: time.Now().UTC()}
	p.entries = (size + vhdBlockSize - 1) / vhdBlockSize
	p.batBytes = RoundUp(p.entries*4, vhdSector)
	if diff {
		p.bitmaps = map[int64][]byte{}
	}
	exts = append([]Extent(nil), exts...)
	sort.Slice(exts, func(i, j int) bool { return exts[i].Offset < exts[j].Offset })
	for _, e := range exts {
		if e.Length <= 0 || e.Offset >= size || (!diff && e.Zero) {
			continue
		}
		end := min(e.Offset+e.Length, size)
		for blk := e.Offset / vhdBlockSize; blk*vhdBlockSize < end; blk++ {
			if n := len(p.blocks); n == 0 || p.blocks[n-1] != blk {
				p.blocks = append(p.blocks, blk)
			}
			if diff {
				bm := p.bitmaps[blk]
				if bm == nil {
					bm = make([]byte, vhdBitmapSize)
					p.bitmaps[blk] = bm
				}
				lo := max(e.Offset, blk*vhdBlockSize) - blk*vhdBlockSize
				hi := min(end, (blk+1)*vhdBlockSize) - blk*vhdBlockSize
				for s := lo / vhdSector; s < (hi+vhdSector-1)/vhdSector; s++ {
					bm[s/8] |= 0x80 >> (s % 8)
				}
			}
		}
	}
	off := int64(vhdSector + 1024 + p.batBytes)
	if diff {
		// One relative Windows path locator (W2ru) naming the parent.
		name := utf16.Encode([]rune("./" + parent.String() + ".vhd"))
		loc := make([]byte, vhdSector)
		for i, r := range name {
			binary.LittleEndian.PutUint16(loc[2*i:], r)
		}
		p.locator = loc[:2*len(name)]
		off += vhdSector
	}
	p.blocksOff = off
	return p
}

// Length is the size of the VHD file.
func (p *VHDPlan) Length() int64 {
	return p.blocksOff + int64(len(p.blocks))*(vhdBitmapSize+vhdBlockSize) + vhdSector
}

func (p *VHDPlan) header() []byte {
	b := make([]byte, 1024)
	be := binary.BigEndian
	copy(b[0:], "cxsparse")
	be.PutUint64(b[8:], ^uint64(0))
	be.PutUint64(b[16:], vhdSector+1024)
	be.PutUint32(b[24:], 0x00010000)
	be.PutUint32(b[28:], uint32(p.entries))
	be.PutUint32(b[32:], vhdBlockSize)
	if p.diff {
		copy(b[40:], p.parent[:])
		be.PutUint32(b[56:], uint32(p.parentTS.Sub(vhdEpoch)/time.Second))
		for i, r := range utf16.Encode([]rune(p.parent.String() + ".vhd")) {
			be.PutUint16(b[64+2*i:], r)
		}
		copy(b[576:], "W2ru")
		be.PutUint32(b[580:], vhdSector)
		be.PutUint32(b[584:], uint32(len(p.locator)))
		be.PutUint64(b[592:], uint64(vhdSector+1024+p.batBytes))
	}
	be.PutUint32(b[36:], vhdChecksum(b, 36))
	return b
}

// WriteTo streams the VHD, reading block data from r.
func (p *VHDPlan) WriteTo(ctx context.Context, w io.Writer, r io.ReaderAt, readRanges RangeReader, progress func(int64)) error {
	put := (&progressWriter{w: w, progress: progress}).put
	typ := uint32(vhdDynamic)
	if p.diff {
		typ = vhdDiff
	}
	footer := vhdFooter(p.size, typ, p.id, time.Now().UTC())
	if err := put(footer); err != nil {
		return err
	}
	if err := put(p.header()); err != nil {
		return err
	}
	bat := make([]byte, p.batBytes)
	for i := range p.entries {
		binary.BigEndian.PutUint32(bat[4*i:], vhdUnused)
	}
	for i, blk := range p.blocks {
		sector := (p.blocksOff + int64(i)*(vhdBitmapSize+vhdBlockSize)) / vhdSector
		binary.BigEndian.PutUint32(bat[4*blk:], uint32(sector))
	}
	if err := put(bat); err != nil {
		return err
	}
	if p.diff {
		loc := make([]byte, vhdSector)
		copy(loc, p.locator)
		if err := put(loc); err != nil {
			return err
		}
	}
	full := bytes.Repeat([]byte{0xff}, vhdBitmapSize)
	ranges := make([]Extent, len(p.blocks))
	for i, blk := range p.blocks {
		ranges[i] = Extent{Offset: blk * vhdBlockSize, Length: vhdBlockSize}
	}
	// Each block is its sector bitmap, then its data (which may come in
	// several chunks).
	err := readRanges(ctx, tailReader{r, p.size}, ranges, func(off int64, b []byte) error {
		if off%vhdBlockSize == 0 {
			bm := full
			if p.diff {
				bm = p.bitmaps[off/vhdBlockSize]
			}
			if err := put(bm); err != nil {
				return err
			}
		}
		return put(b)
	})
	if err != nil {
		return err
	}
	return put(footer)
}

var errNotVHD = errors.New("not a dynamic or differencing VHD")

// parseVHDFooter checks a footer (512 bytes).
func parseVHDFooter(b []byte) (size int64, diskType uint32, dataOff int64, err error) {
	be := binary.BigEndian
	if len(b) < vhdSector || string(b[:8]) != "conectix" {
		return 0, 0, 0, errNotVHD
	}
	if be.Uint32(b[64:]) != vhdChecksum(b[:vhdSector], 64) {
		return 0, 0, 0, errors.New("VHD footer checksum mismatch")
	}
	// Compared before the conversion: a size past int64 would be negative.
	declared, diskType := be.Uint64(b[48:]), be.Uint32(b[60:])
	if declared > uint64(MaxVirtualSize) {
		return 0, 0, 0, fmt.Errorf("VHD size %d out of range", declared)
	}
	size = int64(declared)
	if diskType == vhdFixed {
		return 0, 0, 0, errors.New("fixed VHDs are not supported; send a dynamic or differencing VHD, or raw")
	}
	if diskType != vhdDynamic && diskType != vhdDiff {
		return 0, 0, 0, fmt.Errorf("VHD disk type %d is not supported", diskType)
	}
	dataOff = int64(be.Uint64(b[16:]))
	if dataOff < vhdSector || dataOff > 1<<30 {
		return 0, 0, 0, errors.New("VHD header offset out of range")
	}
	return size, diskType, dataOff, nil
}

// parseVHDHeader checks a dynamic header (1024 bytes).
func parseVHDHeader(b []byte, size int64) (blockSize, entries, tableOff int64, err error) {
	be := binary.BigEndian
	if len(b) < 1024 || string(b[:8]) != "cxsparse" {
		return 0, 0, 0, errors.New("no VHD dynamic header")
	}
	if be.Uint32(b[36:]) != vhdChecksum(b[:1024], 36) {
		return 0, 0, 0, errors.New("VHD header checksum mismatch")
	}
	blockSize = int64(be.Uint32(b[32:]))
	entries = int64(be.Uint32(b[28:]))
	tableOff = int64(be.Uint64(b[16:]))
	if blockSize < 4096 || blockSize > 32<<20 || blockSize&(blockSize-1) != 0 {
		return 0, 0, 0, fmt.Errorf("VHD block size %d is not supported", blockSize)
	}
	if entries*blockSize < size || entries > (size+blockSize-1)/blockSize+1 {
		return 0, 0, 0, errors.New("VHD block table does not match the disk size")
	}
	if tableOff < 0 || tableOff > 1<<40 {
		return 0, 0, 0, errors.New("VHD block table offset out of range")
	}
	return blockSize, entries, tableOff, nil
}

// streamPos reads a stream and knows where it is.
type streamPos struct {
	r   io.Reader
	pos int64
}

func (s *streamPos) read(b []byte) error {
	n, err := io.ReadFull(s.r, b)
	s.pos += int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func (s *streamPos) skipTo(off int64) error {
	if off < s.pos {
		return fmt.Errorf("VHD structures out of order (at %d, need %d): the stream cannot go back", s.pos, off)
	}
	n, err := io.CopyN(io.Discard, s.r, off-s.pos)
	s.pos += n
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// ApplyVHD reads a VHD from a stream and writes what its blocks carry
// into d (of at least the VHD's size). Blocks must come after the
// block table, in any order of guest offsets, without overlapping.
func ApplyVHD(ctx context.Context, r io.Reader, d Disk, progress func(int64)) (int64, error) {
	s := &streamPos{r: r}
	foot := make([]byte, vhdSector)
	if err := s.read(foot); err != nil {
		return 0, err
	}
	size, diskType, dataOff, err := parseVHDFooter(foot)
	if err != nil {
		return 0, err
	}
	if size > d.Size {
		return 0, TooBigError{Size: d.Size}
	}
	if err := s.skipTo(dataOff); err != nil {
		return 0, err
	}
	hdr := make([]byte, 1024)
	if err := s.read(hdr); err != nil {
		return 0, err
	}
	blockSize, entries, tableOff, err := parseVHDHeader(hdr, size)
	if err != nil {
		return 0, err
	}
	if err := s.skipTo(tableOff); err != nil {
		return 0, err
	}
	// The block table, a piece at a time: only allocated entries are kept.
	type blk struct{ n, off int64 }
	var blocks []blk
	piece := make([]byte, 64<<10)
	for i := int64(0); i < entries; {
		k := min(entries-i, int64(len(piece)/4))
		if err := s.read(piece[:4*k]); err != nil {
			return 0, err
		}
		for j := range k {
			if e := binary.BigEndian.Uint32(piece[4*j:]); e != vhdUnused {
				blocks = append(blocks, blk{i + j, int64(e) * vhdSector})
			}
		}
		i += k
	}
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].off < blocks[j].off })
	bitmapSize := RoundUp(blockSize/vhdSector/8, vhdSector)
	bm := make([]byte, bitmapSize)
	data := make([]byte, blockSize)
	var written int64
	for _, b := range blocks {
		if err := ctx.Err(); err != nil {
			return written, err
		}
		if err := s.skipTo(b.off); err != nil {
			return written, err
		}
		if err := s.read(bm); err != nil {
			return written, err
		}
		if err := s.read(data); err != nil {
			return written, err
		}
		base := b.n * blockSize
		if base >= size {
			continue
		}
		// Runs of sectors the bitmap marks; a dynamic disk's unmarked
		// sectors read as zero, a differencing disk's come from its parent.
		limit := min(blockSize, size-base) / vhdSector
		for sct := int64(0); sct < limit; {
			set := bm[sct/8]&(0x80>>(sct%8)) != 0
			end := sct + 1
			for end < limit && (bm[end/8]&(0x80>>(end%8)) != 0) == set {
				end++
			}
			lo, hi := sct*vhdSector, end*vhdSector
			switch {
			case set:
				if err := d.Write(data[lo:hi], base+lo); err != nil {
					return written, err
				}
			case diskType == vhdDynamic && d.Zero != nil:
				if err := d.Zero(base+lo, hi-lo); err != nil {
					return written, err
				}
			}
			sct = end
		}
		written += blockSize
		if progress != nil {
			progress(s.pos)
		}
	}
	return written, nil
}
