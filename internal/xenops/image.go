package xenops

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// The suspend image format (the seed's "new structured format"): a
// signature, then records, each a header of two big-endian 64-bit
// integers (type, length) and the record's bytes, ending with an
// end-of-image record:
//
//	"TOOLSTACKD-SUSPEND-1\n"
//	[recMeta  len] JSON ImageMeta: the domain as it ran (VmExtra)
//	[recQEMU  len] QEMU's migration stream (recSim for the simulator)
//	[recEnd   0]
//
// The metadata comes first so that a resume rebuilds exactly the devices
// the guest had, whatever its VM record says now. A stream record's
// length is written as unknownLength while QEMU writes it and set
// afterwards; a reader on a pipe hands everything after the header to
// QEMU, which stops at its own end marker.
const (
	imageSignature = "TOOLSTACKD-SUSPEND-1\n"
	recMeta        = 1
	recQEMU        = 2
	recSim         = 3
	recEnd         = 0xFF
	unknownLength  = ^uint64(0)
	maxMetaLength  = 16 << 20
)

// ImageMeta is the domain a suspend image holds.
type ImageMeta struct {
	Spec    Spec
	Disks   []Disk
	NICs    []NIC
	HotCPUs []CPUDevice
	Backend string
}

// CPUDevice is a VCPU added while the domain ran (QEMU device_add
// arguments), recreated on resume.
type CPUDevice struct {
	ID   string
	Args map[string]any
}

// Image format errors.
var (
	ErrImageSignature = errors.New("suspend image: bad signature")
	ErrImageTruncated = errors.New("suspend image: truncated")
	ErrImageRecord    = errors.New("suspend image: unknown record type")
	ErrImageTooLarge  = errors.New("suspend image: record too large")
	ErrImageNoEnd     = errors.New("suspend image: no end-of-image record")
)

func writeRecordHeader(w io.Writer, typ, length uint64) error {
	var h [16]byte
	binary.BigEndian.PutUint64(h[:8], typ)
	binary.BigEndian.PutUint64(h[8:], length)
	_, err := w.Write(h[:])
	return err
}

// writeImageHeader writes the signature, the metadata and the header of
// the stream record that follows; it returns the offset of that
// header's length field, for patchStreamLength.
func writeImageHeader(f *os.File, meta *ImageMeta, stream uint64) (int64, error) {
	b, err := json.Marshal(meta)
	if err != nil {
		return 0, err
	}
	if _, err := f.Write([]byte(imageSignature)); err != nil {
		return 0, err
	}
	if err := writeRecordHeader(f, recMeta, uint64(len(b))); err != nil {
		return 0, err
	}
	if _, err := f.Write(b); err != nil {
		return 0, err
	}
	off := int64(len(imageSignature)+16+len(b)) + 8
	return off, writeRecordHeader(f, stream, unknownLength)
}

// finishImage sets the stream record's length and writes the end record.
func finishImage(f *os.File, lengthAt int64) error {
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	var l [8]byte
	binary.BigEndian.PutUint64(l[:], uint64(end-lengthAt-8))
	if _, err := f.WriteAt(l[:], lengthAt); err != nil {
		return err
	}
	if err := writeRecordHeader(f, recEnd, 0); err != nil {
		return err
	}
	return f.Sync()
}

// readImageHeader reads the signature and the metadata, and the header of
// the stream record: r is then positioned at the stream.
func readImageHeader(r io.Reader) (*ImageMeta, uint64, uint64, error) {
	sig := make([]byte, len(imageSignature))
	if _, err := io.ReadFull(r, sig); err != nil {
		return nil, 0, 0, ErrImageTruncated
	}
	if string(sig) != imageSignature {
		return nil, 0, 0, ErrImageSignature
	}
	var meta *ImageMeta
	for {
		var h [16]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return nil, 0, 0, ErrImageTruncated
		}
		typ, length := binary.BigEndian.Uint64(h[:8]), binary.BigEndian.Uint64(h[8:])
		switch typ {
		case recMeta:
			if length > maxMetaLength {
				return nil, 0, 0, ErrImageTooLarge
			}
			b := make([]byte, length)
			if _, err := io.ReadFull(r, b); err != nil {
				return nil, 0, 0, ErrImageTruncated
			}
			meta = &ImageMeta{}
			if err := json.Unmarshal(b, meta); err != nil {
				return nil, 0, 0, fmt.Errorf("suspend image: metadata: %w", err)
			}
		case recQEMU, recSim:
			if meta == nil {
				return nil, 0, 0, fmt.Errorf("suspend image: stream before metadata")
			}
			return meta, typ, length, nil
		case recEnd:
			return nil, 0, 0, ErrImageNoEnd
		default:
			return nil, 0, 0, ErrImageRecord
		}
	}
}

// ReadImageMeta reads a suspend image's metadata, and checks the image
// is complete (its stream has a length and the end record follows).
func ReadImageMeta(path string) (*ImageMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	meta, _, length, err := readImageHeader(f)
	if err != nil {
		return nil, err
	}
	if length == unknownLength {
		return nil, ErrImageNoEnd
	}
	at, _ := f.Seek(0, io.SeekCurrent)
	var h [16]byte
	if _, err := f.ReadAt(h[:], at+int64(length)); err != nil || binary.BigEndian.Uint64(h[:8]) != recEnd {
		return nil, ErrImageNoEnd
	}
	return meta, nil
}

// openImageStream opens an image positioned at its stream record.
func openImageStream(path string) (*os.File, *ImageMeta, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	meta, _, _, err := readImageHeader(f)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, meta, nil
}
