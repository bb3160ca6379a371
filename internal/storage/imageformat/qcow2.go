package imageformat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// qcow2 on-disk constants (docs/interop/qcow2.txt in QEMU).
const (
	qcowMagic          = 0x514649fb // "QFI\xfb"
	qcowClusterBits    = 16         // 64 KiB clusters, QEMU's default
	ClusterSize        = 1 << qcowClusterBits
	qcowRefcountOrder  = 4 // 16-bit refcounts
	qcowV3HeaderLength = 104
	qcowExtEnd         = 0x00000000
	qcowExtBackingFmt  = 0xe2792aca
	qcowExtDataFile    = 0x44415441
	qcowExtFeatures    = 0x6803f857
	qcowOflagCopied    = uint64(1) << 63
	qcowOflagZero      = uint64(1)
	qcowOffsetMask     = uint64(0x00fffffffffffe00)

	// MaxVirtualSize bounds a VDI's virtual size (QEMU's own qcow2 limit is
	// far above this; 64 TiB keeps the L1 table of an empty image at 1 MiB).
	MaxVirtualSize = int64(64) << 40

	// MaxQcow2Size bounds the virtual size a header may declare: no image
	// QEMU opens is larger (its L1 table holds at most 4 Mi entries, each
	// mapping 2^39 bytes with the largest, 2 MiB, clusters). Below it,
	// the size converts to an int64 and rounds up to a cluster without
	// overflowing.
	MaxQcow2Size = uint64(1) << 61
)

// SizeError is a qcow2 header declaring a virtual size above
// MaxQcow2Size: an image no disk can hold.
type SizeError struct{ Size uint64 }

func (e SizeError) Error() string {
	return "the qcow2 virtual size " + strconv.FormatUint(e.Size, 10) + " is out of range"
}

// Qcow2Header is the part of a qcow2 header toolstackd needs.
type Qcow2Header struct {
	Version               uint32
	ClusterBits           uint32
	Size                  uint64
	CryptMethod           uint32
	L1Size                uint32
	L1TableOffset         uint64
	RefcountTableOffset   uint64
	RefcountTableClusters uint32
	NbSnapshots           uint32
	IncompatibleFeatures  uint64
	RefcountOrder         uint32
	HeaderLength          uint32
	BackingFile           string
	BackingFormat         string
	ExternalDataFile      bool
}

var errNotQcow2 = errors.New("not a qcow2 image")

// ParseQcow2Header decodes a qcow2 header from the first bytes of an image
// (at least the header, its extensions and the backing file name, which
// QEMU always keeps in the first cluster). It never trusts the input: every
// offset is checked against the buffer, and a virtual size above
// MaxQcow2Size is a SizeError, so that Size always fits an int64.
func ParseQcow2Header(b []byte) (*Qcow2Header, error) {
	if len(b) < 72 {
		return nil, errNotQcow2
	}
	be := binary.BigEndian
	if be.Uint32(b[0:]) != qcowMagic {
		return nil, errNotQcow2
	}
	h := &Qcow2Header{
		Version:               be.Uint32(b[4:]),
		ClusterBits:           be.Uint32(b[20:]),
		Size:                  be.Uint64(b[24:]),
		CryptMethod:           be.Uint32(b[32:]),
		L1Size:                be.Uint32(b[36:]),
		L1TableOffset:         be.Uint64(b[40:]),
		RefcountTableOffset:   be.Uint64(b[48:]),
		RefcountTableClusters: be.Uint32(b[56:]),
		NbSnapshots:           be.Uint32(b[60:]),
		HeaderLength:          72,
		RefcountOrder:         4,
	}
	backingOff, backingLen := be.Uint64(b[8:]), be.Uint32(b[16:])
	if h.Version != 2 && h.Version != 3 {
		return nil, fmt.Errorf("qcow2 version %d is not supported", h.Version)
	}
	if h.ClusterBits < 9 || h.ClusterBits > 21 {
		return nil, fmt.Errorf("qcow2 cluster bits %d out of range", h.ClusterBits)
	}
	if h.Size > MaxQcow2Size {
		return nil, SizeError{Size: h.Size}
	}
	if h.Version == 3 {
		if len(b) < qcowV3HeaderLength {
			return nil, errNotQcow2
		}
		h.IncompatibleFeatures = be.Uint64(b[72:])
		h.RefcountOrder = be.Uint32(b[96:])
		h.HeaderLength = be.Uint32(b[100:])
		if h.HeaderLength < qcowV3HeaderLength || h.HeaderLength%8 != 0 || int(h.HeaderLength) > len(b) {
			return nil, fmt.Errorf("qcow2 header length %d is invalid", h.HeaderLength)
		}
		if h.IncompatibleFeatures&4 != 0 {
			h.ExternalDataFile = true
		}
	}
	// Header extensions follow the header, up to the end of the first
	// cluster (or the backing file name).
	end := uint64(len(b))
	if cs := uint64(1) << h.ClusterBits; cs < end {
		end = cs
	}
	if backingOff != 0 && backingOff < end {
		end = backingOff
	}
	for off := uint64(h.HeaderLength); off+8 <= end; {
		typ, n := be.Uint32(b[off:]), uint64(be.Uint32(b[off+4:]))
		off += 8
		if typ == qcowExtEnd {
			break
		}
		if off+n > end {
			return nil, errors.New("qcow2 header extension overruns the header")
		}
		data := b[off : off+n]
		switch typ {
		case qcowExtBackingFmt:
			h.BackingFormat = string(data)
		case qcowExtDataFile:
			h.ExternalDataFile = true
		}
		off += (n + 7) &^ 7
	}
	if backingOff != 0 {
		if backingLen == 0 || backingLen > 1023 || backingOff+uint64(backingLen) > uint64(len(b)) {
			return nil, errors.New("qcow2 backing file name is out of range")
		}
		h.BackingFile = string(b[backingOff : backingOff+uint64(backingLen)])
	}
	return h, nil
}

// ReadQcow2Header reads and decodes the header of an image file.
func ReadQcow2Header(path string) (*Qcow2Header, error) {
	f, err := os.Open(path) //nolint:gosec // volume paths come from the SR driver, inside its directory
	if err != nil {
		return nil, err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	return ReadQcow2HeaderFrom(f)
}

// ReadQcow2HeaderFrom reads the header at the start of r.
func ReadQcow2HeaderFrom(r io.ReaderAt) (*Qcow2Header, error) {
	buf := make([]byte, 4096)
	n, err := r.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return ParseQcow2Header(buf[:n])
}

// Qcow2IsEmpty reports whether an image has no cluster of its own (its L1
// table is all zero), so that it reads exactly as its backing file does.
func Qcow2IsEmpty(path string) (bool, error) {
	f, err := os.Open(path) //nolint:gosec // volume paths come from the SR driver, inside its directory
	if err != nil {
		return false, err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	h, err := ReadQcow2HeaderFrom(f)
	if err != nil {
		return false, err
	}
	if h.NbSnapshots != 0 {
		return false, nil
	}
	l1 := make([]byte, 8*int64(h.L1Size))
	if len(l1) > 32<<20 {
		return false, errors.New("qcow2 L1 table too large")
	}
	if n, err := f.ReadAt(l1, int64(h.L1TableOffset)); err != nil && !(err == io.EOF && n >= 0) {
		return false, err
	}
	for _, c := range l1 {
		if c != 0 {
			return false, nil
		}
	}
	return true, nil
}

// CreateQcow2 writes a new, empty qcow2 v3 image of the given virtual size,
// optionally over a backing file (a name relative to the image's
// directory, as QEMU resolves it). It is what `qemu-img create -f qcow2
// [-b backing -F fmt]` makes, without starting a process: a header
// cluster, a refcount table, one refcount block and a zeroed L1 table. The
// file is synced before it is returned; it never replaces an existing file.
func CreateQcow2(path string, size int64, backing, backingFmt string) (err error) {
	if size < 0 || size > MaxVirtualSize {
		return fmt.Errorf("virtual size %d out of range", size)
	}
	if len(backing) > 1023 {
		return errors.New("backing file name too long")
	}
	size = RoundUp(size, 512)
	img := qcow2Image(size, backing, backingFmt)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600) //nolint:gosec // os.O_CREATE|os.O_EXCL, 0o600)|volume paths come from the SR driver, inside its directory
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	for _, c := range img.chunks {
		if _, err = f.WriteAt(c.data, c.off); err != nil {
			return err
		}
	}
	if err = f.Truncate(img.length); err != nil {
		return err
	}
	return f.Sync()
}

// RoundUp is n rounded up to a multiple of to.
func RoundUp(n, to int64) int64 { return (n + to - 1) / to * to }

type imgChunk struct {
	off  int64
	data []byte
}

type emptyQcow2 struct {
	chunks []imgChunk
	length int64
}

// qcow2Image lays out an empty image: cluster 0 the header, 1 the refcount
// table, 2 the refcount block, 3.. the L1 table.
func qcow2Image(size int64, backing, backingFmt string) emptyQcow2 {
	const cs = ClusterSize
	l2Entries := int64(cs / 8)
	l1Entries := (size + cs*l2Entries - 1) / (cs * l2Entries)
	l1Clusters := (l1Entries*8 + cs - 1) / cs
	nClusters := 3 + l1Clusters
	be := binary.BigEndian

	hdr := make([]byte, 0, 512)
	hdr = be.AppendUint32(hdr, qcowMagic)
	hdr = be.AppendUint32(hdr, 3)
	hdr = be.AppendUint64(hdr, 0) // backing file offset, patched below
	hdr = be.AppendUint32(hdr, uint32(len(backing)))
	hdr = be.AppendUint32(hdr, qcowClusterBits)
	hdr = be.AppendUint64(hdr, uint64(size))
	hdr = be.AppendUint32(hdr, 0)                 // no encryption
	hdr = be.AppendUint32(hdr, uint32(l1Entries)) // l1_size
	hdr = be.AppendUint64(hdr, uint64(3*cs))      // l1_table_offset
	hdr = be.AppendUint64(hdr, uint64(cs))        // refcount_table_offset
	hdr = be.AppendUint32(hdr, 1)                 // refcount_table_clusters
	hdr = be.AppendUint32(hdr, 0)                 // nb_snapshots
	hdr = be.AppendUint64(hdr, 0)                 // snapshots_offset
	hdr = be.AppendUint64(hdr, 0)                 // incompatible features
	hdr = be.AppendUint64(hdr, 0)                 // compatible features
	hdr = be.AppendUint64(hdr, 0)                 // autoclear features
	hdr = be.AppendUint32(hdr, qcowRefcountOrder) // refcount_order
	hdr = be.AppendUint32(hdr, qcowV3HeaderLength)
	if backing != "" && backingFmt != "" {
		hdr = be.AppendUint32(hdr, qcowExtBackingFmt)
		hdr = be.AppendUint32(hdr, uint32(len(backingFmt)))
		hdr = append(hdr, backingFmt...)
		for len(hdr)%8 != 0 {
			hdr = append(hdr, 0)
		}
	}
	hdr = be.AppendUint32(hdr, qcowExtEnd)
	hdr = be.AppendUint32(hdr, 0)
	if backing != "" {
		be.PutUint64(hdr[8:], uint64(len(hdr)))
		hdr = append(hdr, backing...)
	}

	rt := be.AppendUint64(nil, uint64(2*cs))
	rb := make([]byte, 2*nClusters)
	for i := range nClusters {
		be.PutUint16(rb[2*i:], 1)
	}
	return emptyQcow2{
		chunks: []imgChunk{{0, hdr}, {cs, rt}, {2 * cs, rb}},
		length: nClusters * cs,
	}
}
