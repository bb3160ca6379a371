package imageformat

import (
	"bytes"
	"context"
	"io"
	"sort"
	"strconv"
)

// Extent is a byte range of a disk.
type Extent struct {
	Offset, Length int64
	Zero           bool // the range reads as zeroes
}

// MergeExtents sorts extents and joins overlapping or touching ones.
func MergeExtents(in []Extent) []Extent {
	sort.Slice(in, func(i, j int) bool { return in[i].Offset < in[j].Offset })
	var out []Extent
	for _, e := range in {
		if e.Length <= 0 {
			continue
		}
		if n := len(out); n > 0 && e.Offset <= out[n-1].Offset+out[n-1].Length {
			if end := e.Offset + e.Length; end > out[n-1].Offset+out[n-1].Length {
				out[n-1].Length = end - out[n-1].Offset
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// TooBigError is data that does not fit the disk it is written to: Size
// is the disk's size in bytes.
type TooBigError struct{ Size int64 }

func (e TooBigError) Error() string {
	return "the data is larger than the VDI (" + strconv.FormatInt(e.Size, 10) + " bytes)"
}

// RangeReader reads ranges of r and hands each chunk to emit, in order
// of the ranges and of offsets within them (a range's first chunk starts
// at its offset; a range may come in several chunks), stopping at the
// first error (emit's or the read's). Image writers take one so that the caller
// decides how reads are done (storage keeps several in flight);
// SequentialReader is the simplest.
type RangeReader func(ctx context.Context, r io.ReaderAt, ranges []Extent, emit func(off int64, b []byte) error) error

// SequentialReader is a RangeReader that reads one chunk of up to 1 MiB
// at a time.
func SequentialReader(ctx context.Context, r io.ReaderAt, ranges []Extent, emit func(off int64, b []byte) error) error {
	buf := make([]byte, 1<<20)
	for _, rg := range ranges {
		for off, end := rg.Offset, rg.Offset+rg.Length; off < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			b := buf[:min(int64(len(buf)), end-off)]
			if _, err := r.ReadAt(b, off); err != nil {
				return err
			}
			if err := emit(off, b); err != nil {
				return err
			}
			off += int64(len(b))
		}
	}
	return nil
}

// Disk is where ApplyVHD writes: Size bytes, written with Write (which
// may turn runs of zeroes into holes) and made to read as zeroes with Zero
// (nil when the disk cannot; zero ranges are then skipped, which is
// right for a disk that starts out zeroed).
type Disk struct {
	Size  int64
	Write func(b []byte, off int64) error
	Zero  func(off, n int64) error
}

var zeroCluster = make([]byte, ClusterSize)

// IsZero reports whether b is all zero bytes.
func IsZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroCluster))
		if !bytes.Equal(b[:n], zeroCluster[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
