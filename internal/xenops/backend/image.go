package backend

import (
	"bytes"
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
//	[recMeta  len] JSON ImageMeta: the domain as it ran (informative)
//	[RecQEMU  len] QEMU's migration stream (RecSim for the simulator)
//	[recEnd   0]
//
// A stream record's length is written as unknownLength while QEMU writes
// it and set afterwards; a reader hands everything after the header to
// QEMU, which stops at its own end marker. Bytes after the end record
// are ignored: an image kept in a VDI is followed by the rest of the
// volume.
//
// An image is untrusted input: whoever can write a VDI can write one.
// So the reader checks the framing strictly (one metadata record of
// bounded size, strict JSON, the stream type of the backend named, a
// stream length inside the file, the end record where it must be) and
// nothing it reads decides a path or a command line: a resume builds
// its domain from the VM's record, as a start does (see restorePlan).
const (
	imageSignature = "TOOLSTACKD-SUSPEND-1\n"
	recMeta        = 1
	RecQEMU        = 2
	RecSim         = 3
	recEnd         = 0xFF
	unknownLength  = ^uint64(0)
	// maxMetaLength bounds the metadata record (a real one is a few KiB).
	maxMetaLength = 1 << 20
	// Bounds on the lists the metadata may hold.
	maxImageDisks = 64
	maxImageNICs  = 64
)

// ImageMeta is the domain a suspend image was taken from. It is written
// for diagnosis and to check a resume against; a resume never takes
// paths, identity or devices from it.
type ImageMeta struct {
	Spec    Spec
	Disks   []Disk
	NICs    []NIC
	HotCPUs []CPUDevice
	Backend string
}

// CPUDevice is a VCPU added while the domain ran (QEMU device_add
// arguments), recreated on resume after checkHotCPUs.
type CPUDevice struct {
	ID   string
	Args map[string]any
}

// Image format errors.
var (
	ErrImageSignature = errors.New("suspend image: bad signature")
	ErrImageTruncated = errors.New("suspend image: truncated")
	ErrImageRecord    = errors.New("suspend image: unknown or misplaced record")
	ErrImageTooLarge  = errors.New("suspend image: record too large")
	ErrImageNoEnd     = errors.New("suspend image: no end-of-image record")
	ErrImageMeta      = errors.New("suspend image: bad metadata")
	ErrImageBackend   = errors.New("suspend image: made by another backend")
)

func writeRecordHeader(w io.Writer, typ, length uint64) error {
	var h [16]byte
	binary.BigEndian.PutUint64(h[:8], typ)
	binary.BigEndian.PutUint64(h[8:], length)
	_, err := w.Write(h[:])
	return err
}

// WriteImageHeader writes the signature, the metadata and the header of
// the stream record that follows; it returns the offset of that
// header's length field, for patchStreamLength.
func WriteImageHeader(f *os.File, meta *ImageMeta, stream uint64) (int64, error) {
	b, err := json.Marshal(meta)
	if err != nil {
		return 0, err
	}
	if len(b) > maxMetaLength {
		return 0, ErrImageTooLarge
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

// FinishImage sets the stream record's length and writes the end record.
func FinishImage(f *os.File, lengthAt int64) error {
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

// imageLayout is what parseImage found in an image.
type imageLayout struct {
	meta   *ImageMeta
	stream uint64 // record type: RecQEMU or RecSim
	at     int64  // offset of the stream's first byte
	length int64  // the stream's length
}

// streamOf is the stream record type a backend writes.
func streamOf(backend string) (uint64, bool) {
	switch backend {
	case "qemu":
		return RecQEMU, true
	case "simulator":
		return RecSim, true
	}
	return 0, false
}

// parseImage checks the framing of a complete image of size bytes and
// decodes its metadata. It reads at most the signature, the headers and
// maxMetaLength bytes of metadata, whatever the image claims.
func parseImage(r io.ReaderAt, size int64) (*imageLayout, error) {
	if size < int64(len(imageSignature)) {
		return nil, ErrImageTruncated
	}
	sig := make([]byte, len(imageSignature))
	if _, err := r.ReadAt(sig, 0); err != nil {
		return nil, ErrImageTruncated
	}
	if string(sig) != imageSignature {
		return nil, ErrImageSignature
	}
	pos := int64(len(imageSignature))
	header := func() (uint64, uint64, error) {
		if size-pos < 16 {
			return 0, 0, ErrImageTruncated
		}
		var h [16]byte
		if _, err := r.ReadAt(h[:], pos); err != nil {
			return 0, 0, ErrImageTruncated
		}
		pos += 16
		return binary.BigEndian.Uint64(h[:8]), binary.BigEndian.Uint64(h[8:]), nil
	}
	// The metadata, first and once.
	typ, length, err := header()
	if err != nil {
		return nil, err
	}
	switch {
	case typ == recEnd:
		return nil, ErrImageNoEnd
	case typ != recMeta:
		return nil, ErrImageRecord
	case length > maxMetaLength:
		return nil, ErrImageTooLarge
	case int64(length) > size-pos:
		return nil, ErrImageTruncated
	}
	b := make([]byte, length)
	if _, err := r.ReadAt(b, pos); err != nil {
		return nil, ErrImageTruncated
	}
	pos += int64(length)
	meta, err := decodeImageMeta(b)
	if err != nil {
		return nil, err
	}
	want, _ := streamOf(meta.Backend)
	// The stream, of the type the metadata's backend writes.
	typ, length, err = header()
	if err != nil {
		return nil, err
	}
	switch {
	case typ == recEnd:
		return nil, ErrImageNoEnd
	case typ != RecQEMU && typ != RecSim:
		return nil, ErrImageRecord
	case typ != want:
		return nil, ErrImageBackend
	case length == unknownLength:
		return nil, ErrImageNoEnd // never finished: the save was cut short
	case length > uint64(size-pos):
		return nil, ErrImageTruncated
	}
	l := &imageLayout{meta: meta, stream: typ, at: pos, length: int64(length)}
	pos += int64(length)
	if typ, length, err = header(); err != nil || typ != recEnd || length != 0 {
		return nil, ErrImageNoEnd
	}
	return l, nil
}

// decodeImageMeta decodes the metadata record strictly: one JSON object
// of the known shape, nothing after it, lists of sane lengths.
func decodeImageMeta(b []byte) (*ImageMeta, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	meta := &ImageMeta{}
	if err := dec.Decode(meta); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrImageMeta, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the metadata", ErrImageMeta)
	}
	if _, ok := streamOf(meta.Backend); !ok {
		return nil, fmt.Errorf("%w: unknown backend %q", ErrImageMeta, meta.Backend)
	}
	if len(meta.HotCPUs) > MaxVCPUs || len(meta.Disks) > maxImageDisks || len(meta.NICs) > maxImageNICs {
		return nil, fmt.Errorf("%w: too many devices", ErrImageMeta)
	}
	return meta, nil
}

// fileSize is the size of an open file or block device.
func fileSize(f *os.File) (int64, error) {
	return f.Seek(0, io.SeekEnd)
}

// ReadImageMeta reads and checks a suspend image: its framing must be
// complete and its metadata well-formed.
func ReadImageMeta(path string) (*ImageMeta, error) {
	f, err := os.Open(path) //nolint:gosec // suspend images live in the suspend dir (EntryPath/safepath)
	if err != nil {
		return nil, err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	size, err := fileSize(f)
	if err != nil {
		return nil, err
	}
	l, err := parseImage(f, size)
	if err != nil {
		return nil, err
	}
	return l.meta, nil
}

// OpenImageStream opens a complete image of the given stream type,
// positioned at its stream.
func OpenImageStream(path string, stream uint64) (*os.File, *ImageMeta, error) {
	f, err := os.Open(path) //nolint:gosec // suspend images live in the suspend dir (EntryPath/safepath)
	if err != nil {
		return nil, nil, err
	}
	size, err := fileSize(f)
	if err == nil {
		var l *imageLayout
		if l, err = parseImage(f, size); err == nil {
			if l.stream != stream {
				err = ErrImageBackend
			} else if _, err = f.Seek(l.at, io.SeekStart); err == nil {
				return f, l.meta, nil
			}
		}
	}
	_ = f.Close()
	return nil, nil, err
}
