package xva

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha1" //nolint:gosec // xapi's legacy block checksum, checked, not trusted for security
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"toolstackd/internal/ioerr"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// Compression is how a whole archive is compressed: "", "gzip" or "zstd".
type Compression string

// The compressions xapi writes and reads.
const (
	None Compression = ""
	Gzip Compression = "gzip"
	Zstd Compression = "zstd"
)

// ParseCompression reads xapi's use_compression parameter: true and gzip
// mean gzip, zstd means zstd, anything else none (as xapi does).
func ParseCompression(s string) Compression {
	switch strings.ToLower(s) {
	case "true", "gzip":
		return Gzip
	case "zstd":
		return Zstd
	}
	return None
}

const (
	checksumXXH = ".xxhash"
	checksumSHA = ".checksum"
	// maxChecksumSize bounds a checksum member (16 or 40 hex digits and
	// perhaps a newline).
	maxChecksumSize = 128
	// maxKeepalives bounds the empty blocks one disk may bring.
	maxKeepalives = 100000
	// maxZstdWindow bounds the memory a zstd stream may ask of us.
	maxZstdWindow = 64 << 20
)

// Import errors, as xapi names them.
func errPrematureEOF() error { return xerr.New(xerr.ImportErrorPrematureEOF) }
func errChecksums() error    { return xerr.New(xerr.ImportErrorSomeChecksumsFailed) }
func errUnexpected(expected, found string) error {
	return xerr.New(xerr.ImportErrorUnexpectedFile, expected, clip(found))
}
func errInvalid(format string, args ...any) error {
	return xerr.New(xerr.ImportError, "invalid XVA: "+fmt.Sprintf(format, args...))
}

// readErr turns a failure to read the archive into an import error: an
// archive cut short is IMPORT_ERROR_PREMATURE_EOF, a malformed tar is
// IMPORT_ERROR; errors of the connection itself pass through.
func readErr(err error) error {
	var xe *xerr.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &xe):
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errPrematureEOF()
	case errors.Is(err, tar.ErrHeader), errors.Is(err, tar.ErrFieldTooLong), errors.Is(err, gzip.ErrHeader),
		errors.Is(err, gzip.ErrChecksum), strings.Contains(err.Error(), "zstd"), strings.Contains(err.Error(), "archive/tar"),
		strings.Contains(err.Error(), "flate"):
		return errInvalid("%v", err)
	}
	return err
}

// Reader reads an archive: NewReader reads ova.xml, then NextDisk and
// Disk stream the disks one by one.
type Reader struct {
	Header      *Header
	Compression Compression
	// Force accepts blocks whose checksum does not match (xapi's force).
	Force bool

	tr      *tar.Reader
	closer  func()
	pending *tar.Header // read by tar.Next, not yet consumed
	block   []byte
}

// NewReader detects the compression of r, reads ova.xml and returns the
// reader positioned at the first disk.
func NewReader(r io.Reader) (*Reader, error) {
	in := &ioerr.Reader{R: r}
	br := bufio.NewReaderSize(in, 64<<10)
	magic, _ := br.Peek(4) // short: not compressed, and the tar reader says what is wrong
	x := &Reader{closer: func() {}}
	var src io.Reader = br
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, readErr(err)
		}
		x.Compression, src = Gzip, &decompReader{r: zr, src: in, what: "gzip"}
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow),
			zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, errInvalid("zstd: %v", err)
		}
		x.Compression, src, x.closer = Zstd, &decompReader{r: zr, src: in, what: "zstd"}, zr.Close
	}
	x.tr = tar.NewReader(src)
	h, err := x.next()
	if err != nil {
		x.Close()
		if errors.Is(err, io.EOF) {
			return nil, errInvalid("the archive is empty")
		}
		return nil, err
	}
	if h.Name != OVAName {
		x.Close()
		return nil, errUnexpected(OVAName, h.Name)
	}
	if h.Size > MaxOVASize || h.Size < 0 {
		x.Close()
		return nil, errInvalid("%s is %d bytes, more than %d", OVAName, h.Size, MaxOVASize)
	}
	x.pending = nil
	buf := make([]byte, h.Size)
	if _, err := io.ReadFull(x.tr, buf); err != nil {
		x.Close()
		return nil, readErr(err)
	}
	if x.Header, err = DecodeHeader(buf); err != nil {
		x.Close()
		return nil, errInvalid("%v", err)
	}
	return x, nil
}

// decompReader tells a corrupt compressed stream (IMPORT_ERROR) from a
// source that failed or ended early.
type decompReader struct {
	r    io.Reader
	src  *ioerr.Reader // how the archive's source last failed
	what string
}

func (d *decompReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	switch {
	case err == nil, err == io.EOF, d.src.Err != nil, errors.Is(err, io.ErrUnexpectedEOF):
		return n, err
	}
	return n, errInvalid("%s: %v", d.what, err)
}

// Close releases the decompressor.
func (x *Reader) Close() { x.closer() }

// next returns the next member's header without consuming it; io.EOF at
// the end of the archive.
func (x *Reader) next() (*tar.Header, error) {
	if x.pending != nil {
		return x.pending, nil
	}
	h, err := x.tr.Next()
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, readErr(err)
	}
	switch h.Typeflag {
	case tar.TypeReg, 0: // and the old form of a regular file
	default:
		return nil, errInvalid("member %q is not a regular file", clip(h.Name))
	}
	x.pending = h
	return h, nil
}

// NextDisk returns the id of the disk whose blocks come next, or io.EOF
// when the archive ends.
func (x *Reader) NextDisk() (string, error) {
	h, err := x.next()
	if err != nil {
		return "", err
	}
	id, _, ok := strings.Cut(h.Name, "/")
	if !ok || id == "" {
		return "", errUnexpected("<disk>/<block>", h.Name)
	}
	return id, nil
}

// Disk returns the contents of disk id, of size bytes, as a raw stream:
// blocks checked against their checksums, and zeroes for the blocks the
// archive left out. It reads nothing past the disk's last block. A disk
// of size 0 has no members.
func (x *Reader) Disk(id string, size int64) *DiskReader {
	if x.block == nil {
		x.block = make([]byte, BlockSize)
	}
	return &DiskReader{x: x, prefix: id + "/", size: size, last: -1}
}

// DiskReader is one disk's contents; see Reader.Disk.
type DiskReader struct {
	x      *Reader
	prefix string
	size   int64
	pos    int64  // bytes handed out
	gap    int64  // zeroes to hand out before data
	data   []byte // checked data not yet handed out
	last   int64  // the last block number read

	keepalives int
}

// Read hands out the disk's bytes in order; io.EOF after the last.
func (d *DiskReader) Read(p []byte) (int, error) {
	for {
		switch {
		case len(p) == 0:
			return 0, nil
		case d.gap > 0:
			n := int(min(int64(len(p)), d.gap))
			clear(p[:n])
			d.gap -= int64(n)
			d.pos += int64(n)
			return n, nil
		case len(d.data) > 0:
			n := copy(p, d.data)
			d.data = d.data[n:]
			d.pos += int64(n)
			return n, nil
		case d.pos >= d.size:
			return 0, io.EOF
		}
		if err := d.nextBlock(); err != nil {
			return 0, err
		}
	}
}

// Next returns the next block of data and its offset, skipping what the
// archive left out (zeroes), or io.EOF after the disk's last block; the
// data is valid until the following call. A DiskReader is read either
// with Read or with Next, not both.
func (d *DiskReader) Next() (int64, []byte, error) {
	for d.pos < d.size {
		if err := d.nextBlock(); err != nil {
			return 0, nil, err
		}
		off := d.pos + d.gap
		data := d.data
		d.pos, d.gap, d.data = off+int64(len(data)), 0, nil
		if len(data) > 0 {
			return off, data, nil
		}
	}
	return 0, nil, io.EOF
}

// Done reports whether the whole disk has been read.
func (d *DiskReader) Done() bool { return d.pos >= d.size && d.gap == 0 && len(d.data) == 0 }

// nextBlock reads the next block member and its checksum, and sets the
// gap of left-out blocks before it.
func (d *DiskReader) nextBlock() error {
	x := d.x
	h, err := x.next()
	if err == io.EOF {
		return errPrematureEOF()
	}
	if err != nil {
		return err
	}
	suffix, ok := strings.CutPrefix(h.Name, d.prefix)
	if !ok {
		// Another disk's blocks, or anything else, before this one ended.
		return errUnexpected(d.prefix+fmt.Sprintf("%08d", d.pos/BlockSize), h.Name)
	}
	n, ok := blockNumber(suffix)
	if !ok {
		return errUnexpected(d.prefix+"<8 digits>", h.Name)
	}
	x.pending = nil
	off := n * BlockSize
	switch {
	case h.Size == 0 && n > d.last:
		// A keep-alive: nothing to write, and its checksum. A sender
		// that sends nothing else is stopped.
		if d.keepalives++; d.keepalives > maxKeepalives {
			return errInvalid("more than %d empty blocks in disk %s", maxKeepalives, clip(d.prefix))
		}
		return d.checksum(h.Name, nil)
	case n <= d.last:
		return errInvalid("block %q comes after block %d", clip(h.Name), d.last)
	case h.Size < 0 || h.Size > BlockSize:
		return errInvalid("block %q is %d bytes, more than %d", clip(h.Name), h.Size, BlockSize)
	case off >= d.size || h.Size > d.size-off:
		return errInvalid("block %q ends past the disk's size %d", clip(h.Name), d.size)
	case h.Size < BlockSize && off+h.Size != d.size:
		return errInvalid("block %q is short (%d bytes) but not the disk's last", clip(h.Name), h.Size)
	}
	buf := x.block[:h.Size]
	if _, err := io.ReadFull(x.tr, buf); err != nil {
		return readErr(err)
	}
	if err := d.checksum(h.Name, buf); err != nil {
		return err
	}
	d.last = n
	d.gap = off - d.pos
	d.data = buf
	return nil
}

// checksum reads and checks the checksum member that follows a block.
func (d *DiskReader) checksum(name string, buf []byte) error {
	x := d.x
	h, err := x.next()
	if err != nil {
		if err == io.EOF && x.Header.Version.ExportVsn == 0 {
			return nil
		}
		return readErr(err)
	}
	var kind string
	switch h.Name {
	case name + checksumXXH:
		kind = checksumXXH
	case name + checksumSHA:
		kind = checksumSHA
	default:
		if x.Header.Version.ExportVsn == 0 {
			return nil // archives from before checksums
		}
		return errUnexpected(name+checksumXXH, h.Name)
	}
	x.pending = nil
	if h.Size < 0 || h.Size > maxChecksumSize {
		return errInvalid("checksum %q is %d bytes", clip(h.Name), h.Size)
	}
	var sum [maxChecksumSize]byte
	if _, err := io.ReadFull(x.tr, sum[:h.Size]); err != nil {
		return readErr(err)
	}
	got := strings.TrimSpace(string(sum[:h.Size]))
	var want string
	if kind == checksumXXH {
		want = XXHash(buf)
	} else {
		s := sha1.Sum(buf) //nolint:gosec // see the import
		want = hex.EncodeToString(s[:])
	}
	if !strings.EqualFold(got, want) && !x.Force {
		return errChecksums()
	}
	return nil
}

// blockNumber reads a block member's number: decimal digits, 8 as xapi
// writes them (more for disks past 95 TiB).
func blockNumber(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 12 {
		return 0, false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// XXHash is a block's checksum as xapi writes it.
func XXHash(b []byte) string { return fmt.Sprintf("%016X", xxhash.Sum64(b)) }

// Writer writes an archive: WriteHeader, then each disk through Disk,
// then Close.
type Writer struct {
	bw   *bufio.Writer
	comp io.WriteCloser
	tw   *tar.Writer
	mod  time.Time
}

// NewWriter starts an archive on w, compressed as c.
func NewWriter(w io.Writer, c Compression) (*Writer, error) {
	x := &Writer{bw: bufio.NewWriterSize(w, 256<<10), mod: time.Now().Truncate(time.Second)}
	var dst io.Writer = x.bw
	switch c {
	case Gzip:
		// The fastest level: a disk export is bound by the compressor.
		zw, err := gzip.NewWriterLevel(x.bw, gzip.BestSpeed)
		if err != nil {
			return nil, err
		}
		x.comp, dst = zw, zw
	case Zstd:
		zw, err := zstd.NewWriter(x.bw, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return nil, err
		}
		x.comp, dst = zw, zw
	}
	x.tw = tar.NewWriter(dst)
	return x, nil
}

func (x *Writer) member(name string, size int64) error {
	return x.tw.WriteHeader(&tar.Header{Name: name, Size: size, Mode: 0o644, ModTime: x.mod,
		Typeflag: tar.TypeReg, Format: tar.FormatUSTAR})
}

// WriteHeader writes ova.xml.
func (x *Writer) WriteHeader(h *Header) error {
	b := h.Encode()
	if err := x.member(OVAName, int64(len(b))); err != nil {
		return err
	}
	_, err := x.tw.Write(b)
	return err
}

// Close ends the archive and flushes it.
func (x *Writer) Close() error {
	if err := x.tw.Close(); err != nil {
		return err
	}
	if x.comp != nil {
		if err := x.comp.Close(); err != nil {
			return err
		}
	}
	return x.bw.Flush()
}

// Disk starts disk id of size bytes; write its raw contents to the
// DiskWriter in order and Close it.
func (x *Writer) Disk(id string, size int64) *DiskWriter {
	return &DiskWriter{x: x, id: id, size: size, buf: make([]byte, BlockSize)}
}

// DiskWriter cuts a disk into blocks; see Writer.Disk.
type DiskWriter struct {
	x       *Writer
	id      string
	size    int64
	buf     []byte
	n       int   // bytes in buf
	block   int64 // number of the block in buf
	written int64
}

// Write takes the next bytes of the disk.
func (d *DiskWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > d.size-d.written {
		return 0, fmt.Errorf("disk %s: more than its %d bytes", d.id, d.size)
	}
	done := 0
	for len(p) > 0 {
		k := copy(d.buf[d.n:], p)
		d.n += k
		d.written += int64(k)
		p = p[k:]
		done += k
		if d.n == BlockSize || d.written == d.size {
			if err := d.flush(); err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// ReadFrom reads the disk's bytes straight into the block buffer.
func (d *DiskWriter) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for d.written < d.size {
		want := min(int64(BlockSize-d.n), d.size-d.written)
		k, err := io.ReadFull(r, d.buf[d.n:d.n+int(want)])
		d.n += k
		d.written += int64(k)
		total += int64(k)
		if d.n == BlockSize || d.written == d.size {
			if ferr := d.flush(); ferr != nil {
				return total, ferr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// flush writes the block in buf unless it is all zeroes and neither the
// first nor the last.
func (d *DiskWriter) flush() error {
	b := d.buf[:d.n]
	last := d.written == d.size
	if d.block == 0 || last || !imageformat.IsZero(b) {
		name := fmt.Sprintf("%s/%08d", d.id, d.block)
		if err := d.x.member(name, int64(len(b))); err != nil {
			return err
		}
		if _, err := d.x.tw.Write(b); err != nil {
			return err
		}
		sum := XXHash(b)
		if err := d.x.member(name+checksumXXH, int64(len(sum))); err != nil {
			return err
		}
		if _, err := io.WriteString(d.x.tw, sum); err != nil {
			return err
		}
	}
	d.block++
	d.n = 0
	return nil
}

// Close checks that the whole disk was written.
func (d *DiskWriter) Close() error {
	if d.n > 0 {
		if err := d.flush(); err != nil {
			return err
		}
	}
	if d.written != d.size {
		return fmt.Errorf("disk %s: %d of its %d bytes", d.id, d.written, d.size)
	}
	return nil
}
