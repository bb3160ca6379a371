package redolog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Layout of a redo log (see the package documentation).
const (
	// Magic opens every redo log.
	Magic = "redo-log--------"
	// MarkerSize is the length of a record marker: a UUID as ASCII.
	MarkerSize = 36
	// LengthSize and GenerationSize are the widths of the zero-padded
	// decimal numbers in records.
	LengthSize     = 16
	GenerationSize = 16
	// TerminatorSize NUL bytes follow every record (fewer when the half
	// ends sooner).
	TerminatorSize = 16
	// ValidityOffset is the offset of the validity byte; HeaderSize the
	// offset of the first half.
	ValidityOffset = 17
	HeaderSize     = 18
	// DefaultHalfSize is xapi's redo_log_length_of_half.
	DefaultHalfSize = 60 << 20
	// MinHalfSize is the smallest half this package accepts.
	MinHalfSize = 256
	// MaxGeneration is the largest generation 16 decimal digits hold.
	MaxGeneration = 9999999999999999

	dbOverhead    = MarkerSize + LengthSize + GenerationSize + MarkerSize // 104
	deltaOverhead = LengthSize + GenerationSize + MarkerSize              // 68
	dbChunkSize   = 8 << 20
	scanBufSize   = 1 << 20
)

// Device errors.
var (
	// ErrNoSpace means the record does not fit in what is left of the half.
	// For a delta the caller should write the whole database instead.
	ErrNoSpace = errors.New("redolog: not enough space")
	// ErrNoDatabase means there is no database record to append a delta
	// to: the log is empty, its valid half is unreadable, or an earlier
	// write failed. A WriteDB clears it.
	ErrNoDatabase = errors.New("redolog: no database record to append deltas to")
	// ErrMarkerMismatch means a delta's marker is not its database's.
	ErrMarkerMismatch = errors.New("redolog: delta marker differs from the database record's")
	// ErrGeneration means a delta's generation is not above the last one.
	ErrGeneration = errors.New("redolog: generation not above the previous record's")
	// ErrNotRedoLog means a read-only open found no magic.
	ErrNotRedoLog = errors.New("redolog: not a redo log (magic not found)")
	// ErrCorrupt means the validity byte names a half but neither half
	// holds a readable database record.
	ErrCorrupt = errors.New("redolog: validity byte set but no readable database record")
	// ErrReadOnly is returned by writes on a device opened read-only.
	ErrReadOnly = errors.New("redolog: device opened read-only")
	// ErrEmptyDB is returned when a database dump is empty (a length of
	// zero marks the absence of a record on disk).
	ErrEmptyDB = errors.New("redolog: empty database")
)

// RecordKind tells database records from delta records.
type RecordKind uint8

// Record kinds.
const (
	RecordDB RecordKind = iota + 1
	RecordDelta
)

var recordKindNames = [...]string{RecordDB: "db", RecordDelta: "delta"}

func (k RecordKind) String() string {
	if k >= RecordDB && k <= RecordDelta {
		return recordKindNames[k]
	}
	return fmt.Sprintf("RecordKind(%d)", uint8(k))
}

// Record is one record read back from a log.
type Record struct {
	Kind   RecordKind
	Half   int // 1 or 2
	Gen    uint64
	Marker string
	Data   []byte // the database dump, or the encoded deltas
}

// Device is the I/O layer: one redo log on a file or block device. Its
// methods are not safe for concurrent use and may block for as long as the
// device does; Log runs them on a goroutine it can abandon.
type Device interface {
	// WriteDB writes a database record with everything r yields into the
	// half not holding the current state, then makes it the valid half.
	// On error the previous state is untouched.
	WriteDB(gen uint64, marker string, r io.Reader) error
	// WriteDelta appends a delta record to the valid half. The marker must
	// be the database record's and gen above every earlier record's.
	WriteDelta(gen uint64, marker string, data []byte) error
	// Read calls fn with the latest consistent state: the database record,
	// then its deltas in order, stopping before the first incomplete one.
	// A log with no valid half yields nothing and no error.
	Read(fn func(rec Record) error) error
	// Empty marks both halves invalid.
	Empty() error
	// Close releases the device.
	Close() error
}

// storage is what a FileDevice does its I/O on: an *os.File, or memory in
// tests.
type storage interface {
	io.ReaderAt
	io.WriterAt
	Size() (int64, error)
	Close() error
}

type fileStorage struct {
	f         *os.File
	fixedSize int64 // a block device's size; -1 for a regular file
}

func (s *fileStorage) ReadAt(b []byte, off int64) (int, error)  { return s.f.ReadAt(b, off) }
func (s *fileStorage) WriteAt(b []byte, off int64) (int, error) { return s.f.WriteAt(b, off) }
func (s *fileStorage) Close() error                             { return s.f.Close() }
func (s *fileStorage) Size() (int64, error) {
	if s.fixedSize >= 0 {
		return s.fixedSize, nil
	}
	fi, err := s.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// DeviceOptions tune OpenDevice.
type DeviceOptions struct {
	// HalfSize is the length of each half; 0 means DefaultHalfSize. Every
	// reader and writer of one log must agree on it.
	HalfSize int64
	// ReadOnly opens the device for reading only: a missing magic is then
	// ErrNotRedoLog instead of a reason to initialise the log.
	ReadOnly bool
}

// FileDevice is a Device on a regular file or a block device.
type FileDevice struct {
	st       storage
	half     int64
	readOnly bool

	mu sync.Mutex
	// Writer state, learned lazily (known) and kept up to date by writes.
	known   bool
	active  int    // half deltas go to; 0: none
	marker  string // its database record's marker
	lastGen uint64 // generation of its last record
	next    int64  // absolute offset of the next delta record
	needDB  bool   // an earlier write failed: deltas refused until WriteDB
	chunk   int    // database bytes per write
	buf     []byte
}

// OpenDevice opens the redo log at path, a regular file (created if
// missing) or a block device at least HeaderSize+2*HalfSize bytes long.
// Unless read-only, it is opened O_RDWR|O_DSYNC and initialised (magic,
// NUL, validity '0') if it does not start with the magic.
func OpenDevice(path string, opts DeviceOptions) (*FileDevice, error) {
	half := opts.HalfSize
	if half == 0 {
		half = DefaultHalfSize
	}
	if half < MinHalfSize {
		return nil, fmt.Errorf("redolog: half size %d below the minimum %d", half, MinHalfSize)
	}
	st, err := openFileStorage(path, half, opts.ReadOnly)
	if err != nil {
		return nil, err
	}
	d, err := newDevice(st, half, opts.ReadOnly)
	if err != nil {
		_ = st.Close()
		return nil, fmt.Errorf("redolog: %s: %w", path, err)
	}
	return d, nil
}

func openFileStorage(path string, half int64, readOnly bool) (*fileStorage, error) {
	flag := os.O_RDONLY
	if !readOnly {
		flag = os.O_RDWR | os.O_CREATE | syscall.O_DSYNC
	}
	f, err := os.OpenFile(path, flag, 0o600) //nolint:gosec // the redo log the operator configured
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	st := &fileStorage{f: f, fixedSize: -1}
	switch m := fi.Mode(); {
	case m.IsRegular():
	case m&os.ModeDevice != 0 && m&os.ModeCharDevice == 0:
		size, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		if size < HeaderSize+2*half {
			_ = f.Close()
			return nil, fmt.Errorf("redolog: block device %s has %d bytes, needs %d", path, size, HeaderSize+2*half)
		}
		st.fixedSize = size
	default:
		_ = f.Close()
		return nil, fmt.Errorf("redolog: %s is neither a regular file nor a block device", path)
	}
	return st, nil
}

func newDevice(st storage, half int64, readOnly bool) (*FileDevice, error) {
	d := &FileDevice{st: st, half: half, readOnly: readOnly, chunk: int(min(dbChunkSize, half))}
	var magic [len(Magic)]byte
	ok, err := d.readAt(magic[:], 0)
	if err != nil {
		return nil, err
	}
	if !ok || string(magic[:]) != Magic {
		if readOnly {
			return nil, ErrNotRedoLog
		}
		if _, err := st.WriteAt([]byte(Magic+"\x000"), 0); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// HalfSize returns the device's half size.
func (d *FileDevice) HalfSize() int64 { return d.half }

// Validity returns the half the validity byte names: 1, 2, or 0 for none
// (including a malformed header).
func (d *FileDevice) Validity() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.validity()
}

// Close closes the device.
func (d *FileDevice) Close() error { return d.st.Close() }

func (d *FileDevice) halfStart(h int) int64 { return HeaderSize + int64(h-1)*d.half }

// readAt reads len(b) bytes at off. A short read (end of file) is ok=false
// with no error: it is how a torn log ends. Other errors are I/O errors.
func (d *FileDevice) readAt(b []byte, off int64) (ok bool, err error) {
	n, err := d.st.ReadAt(b, off)
	if n == len(b) {
		return true, nil
	}
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return false, nil
	}
	return false, err
}

func (d *FileDevice) validity() (int, error) {
	var b [2]byte
	ok, err := d.readAt(b[:], ValidityOffset-1)
	if err != nil || !ok || b[0] != 0 {
		return 0, err
	}
	switch b[1] {
	case '1':
		return 1, nil
	case '2':
		return 2, nil
	}
	return 0, nil
}

// limit returns the end of half h clipped to the end of the storage, so
// that nothing larger than the file is ever allocated.
func (d *FileDevice) limit(h int) (int64, error) {
	end := d.halfStart(h) + d.half
	size, err := d.st.Size()
	if err != nil {
		return 0, err
	}
	return min(end, size), nil
}

type dbInfo struct {
	marker  string
	gen     uint64
	dataOff int64 // absolute
	dataLen int64
	end     int64 // absolute offset just past the closing marker
}

// probeDB checks the database record at the start of half h without
// reading its data: well-formed length, equal and well-formed markers,
// well-formed generation, all inside the half.
func (d *FileDevice) probeDB(h int) (dbInfo, bool, error) {
	start := d.halfStart(h)
	limit, err := d.limit(h)
	if err != nil {
		return dbInfo{}, false, err
	}
	if limit-start < dbOverhead+1 {
		return dbInfo{}, false, nil
	}
	var hdr [MarkerSize + LengthSize]byte
	if ok, err := d.readAt(hdr[:], start); !ok {
		return dbInfo{}, false, err
	}
	marker := hdr[:MarkerSize]
	n, ok := parseDec(hdr[MarkerSize:])
	if !ok || n == 0 || !validMarker(marker) || n > uint64(limit-start-dbOverhead) {
		return dbInfo{}, false, nil
	}
	dataOff := start + MarkerSize + LengthSize
	var tr [GenerationSize + MarkerSize]byte
	if ok, err := d.readAt(tr[:], dataOff+int64(n)); !ok {
		return dbInfo{}, false, err
	}
	gen, ok := parseDec(tr[:GenerationSize])
	if !ok || string(tr[GenerationSize:]) != string(marker) {
		return dbInfo{}, false, nil
	}
	return dbInfo{
		marker:  string(marker),
		gen:     gen,
		dataOff: dataOff,
		dataLen: int64(n),
		end:     dataOff + int64(n) + GenerationSize + MarkerSize,
	}, true, nil
}

// scanDeltas walks the delta records after db in half h, calling fn (if
// not nil) for each, and returns the offset after the last good one and
// its generation. It stops, without error, at the terminator, the end of
// the half or the file, or the first record that is malformed, has another
// marker or does not raise the generation. withData asks for the data.
func (d *FileDevice) scanDeltas(h int, db dbInfo, withData bool, fn func(gen uint64, data []byte) error) (next int64, lastGen uint64, err error) {
	limit, err := d.limit(h)
	if err != nil {
		return 0, 0, err
	}
	off, lastGen := db.end, db.gen
	if limit-off < deltaOverhead+1 {
		return off, lastGen, nil
	}
	br := bufio.NewReaderSize(io.NewSectionReader(d.st, off, limit-off), int(min(scanBufSize, limit-off)))
	var hdr [LengthSize]byte
	var tr [GenerationSize + MarkerSize]byte
	// limit <= halfEnd: the loop stops at the end of the half or the file.
	for limit-off >= deltaOverhead+1 {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return off, lastGen, eofIsEnd(err)
		}
		n, ok := parseDec(hdr[:])
		if !ok || n == 0 || n > uint64(limit-off-deltaOverhead) {
			return off, lastGen, nil
		}
		var data []byte
		if withData {
			data = make([]byte, n)
			if _, err := io.ReadFull(br, data); err != nil {
				return off, lastGen, eofIsEnd(err)
			}
		} else if _, err := br.Discard(int(n)); err != nil {
			return off, lastGen, eofIsEnd(err)
		}
		if _, err := io.ReadFull(br, tr[:]); err != nil {
			return off, lastGen, eofIsEnd(err)
		}
		gen, ok := parseDec(tr[:GenerationSize])
		if !ok || gen <= lastGen || string(tr[GenerationSize:]) != db.marker {
			return off, lastGen, nil
		}
		if fn != nil {
			if err := fn(gen, data); err != nil {
				return off, lastGen, err
			}
		}
		off += deltaOverhead + int64(n)
		lastGen = gen
	}
	return off, lastGen, nil
}

func eofIsEnd(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	return err
}

// Read implements Device. If the half the validity byte names has no
// readable database record, the other half is tried (it holds the state
// before the last WriteDB); if neither has one, Read returns ErrCorrupt.
func (d *FileDevice) Read(fn func(rec Record) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, err := d.validity()
	if err != nil || v == 0 {
		return err
	}
	for _, h := range [2]int{v, 3 - v} {
		db, ok, err := d.probeDB(h)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		data := make([]byte, db.dataLen)
		if ok, err := d.readAt(data, db.dataOff); err != nil {
			return err
		} else if !ok {
			continue
		}
		if err := fn(Record{Kind: RecordDB, Half: h, Gen: db.gen, Marker: db.marker, Data: data}); err != nil {
			return err
		}
		_, _, err = d.scanDeltas(h, db, true, func(gen uint64, data []byte) error {
			return fn(Record{Kind: RecordDelta, Half: h, Gen: gen, Marker: db.marker, Data: data})
		})
		return err
	}
	return ErrCorrupt
}

// ensureState learns where deltas go, once.
func (d *FileDevice) ensureState() error {
	if d.known {
		return nil
	}
	v, err := d.validity()
	if err != nil {
		return err
	}
	d.active = 0
	if v != 0 {
		db, ok, err := d.probeDB(v)
		if err != nil {
			return err
		}
		if ok {
			next, last, err := d.scanDeltas(v, db, false, nil)
			if err != nil {
				return err
			}
			d.active, d.marker, d.next, d.lastGen = v, db.marker, next, last
		}
	}
	d.known = true
	return nil
}

// checkWrite is what WriteDB and WriteDelta check first: the device is
// open for writing, and the generation and marker fit the record format.
func (d *FileDevice) checkWrite(gen uint64, marker string) error {
	if d.readOnly {
		return ErrReadOnly
	}
	if gen > MaxGeneration {
		return fmt.Errorf("redolog: generation %d exceeds 16 digits", gen)
	}
	if len(marker) != MarkerSize || !validMarker([]byte(marker)) {
		return fmt.Errorf("redolog: marker %q is not 36 printable ASCII characters", marker)
	}
	return nil
}

func (d *FileDevice) buffer(n int) []byte {
	if cap(d.buf) < n {
		d.buf = make([]byte, n)
	}
	return d.buf[:n]
}

// WriteDB implements Device. The record goes to the half not holding the
// current readable state; the validity byte is rewritten only after the
// whole record (and its length, written last) is on the device.
func (d *FileDevice) WriteDB(gen uint64, marker string, r io.Reader) (err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkWrite(gen, marker); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			d.needDB = true
		}
	}()
	src, err := d.readableHalf()
	if err != nil {
		return err
	}
	target := 1
	if src == 1 {
		target = 2
	}
	start := d.halfStart(target)
	chunk := d.chunk
	buf := d.buffer(dbOverhead + chunk + TerminatorSize)
	copy(buf, marker)
	body := buf[MarkerSize+LengthSize:]

	n, rerr := io.ReadFull(r, body[:chunk])
	total := int64(n)
	if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
		// The whole database is in hand: one write.
		if err := d.writeWholeDB(buf, total, gen, marker, start); err != nil {
			return err
		}
	} else {
		if rerr != nil {
			return fmt.Errorf("redolog: reading database: %w", rerr)
		}
		if total, err = d.streamDB(r, buf, n, gen, marker, start); err != nil {
			return err
		}
	}
	// The NUL goes with the validity byte, so that the header is well
	// formed whatever was there (one small write: atomic on a device).
	if _, err := d.st.WriteAt([]byte{0, byte('0' + target)}, ValidityOffset-1); err != nil {
		return err
	}
	d.known, d.needDB = true, false
	d.active, d.marker, d.lastGen = target, marker, gen
	d.next = start + dbOverhead + total
	return nil
}

// readableHalf is the half holding the current readable state: the one
// the validity byte names if it holds a database record, else the other
// if it does; 0 when neither does.
func (d *FileDevice) readableHalf() (int, error) {
	v, err := d.validity()
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, nil
	}
	for _, h := range [2]int{v, 3 - v} {
		_, ok, err := d.probeDB(h)
		if err != nil {
			return 0, err
		}
		if ok {
			return h, nil
		}
	}
	return 0, nil
}

// writeWholeDB writes a database record at start in one write: buf
// holds the marker and then the total bytes of the database, and has
// room for the length, the trailer (gen and marker) and the terminator.
func (d *FileDevice) writeWholeDB(buf []byte, total int64, gen uint64, marker string, start int64) error {
	if total == 0 {
		return ErrEmptyDB
	}
	if dbOverhead+total > d.half {
		return ErrNoSpace
	}
	body := buf[MarkerSize+LengthSize:]
	putDec(buf[MarkerSize:MarkerSize+LengthSize], uint64(total))
	tail := body[total:]
	putDec(tail[:GenerationSize], gen)
	copy(tail[GenerationSize:], marker)
	term := min(TerminatorSize, d.half-dbOverhead-total)
	clear(tail[GenerationSize+MarkerSize : GenerationSize+MarkerSize+term])
	_, err := d.st.WriteAt(buf[:dbOverhead+total+term], start)
	return err
}

// streamDB writes a database record at start as r gives it: the header
// with the length left blank and the first n bytes of data already in
// buf (after the marker), the rest of r chunk by chunk through buf, the
// trailer, and finally the length. It returns the database's size.
func (d *FileDevice) streamDB(r io.Reader, buf []byte, n int, gen uint64, marker string, start int64) (int64, error) {
	total := int64(n)
	clear(buf[MarkerSize : MarkerSize+LengthSize])
	if dbOverhead+total > d.half {
		return total, ErrNoSpace
	}
	if _, err := d.st.WriteAt(buf[:MarkerSize+LengthSize+n], start); err != nil {
		return total, err
	}
	for {
		n, rerr := io.ReadFull(r, buf[:d.chunk])
		if n > 0 {
			if dbOverhead+total+int64(n) > d.half {
				return total, ErrNoSpace
			}
			if _, err := d.st.WriteAt(buf[:n], start+MarkerSize+LengthSize+total); err != nil {
				return total, err
			}
			total += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return total, fmt.Errorf("redolog: reading database: %w", rerr)
		}
	}
	term := min(TerminatorSize, d.half-dbOverhead-total)
	tail := buf[:GenerationSize+MarkerSize+term]
	putDec(tail[:GenerationSize], gen)
	copy(tail[GenerationSize:], marker)
	clear(tail[GenerationSize+MarkerSize:])
	if _, err := d.st.WriteAt(tail, start+MarkerSize+LengthSize+total); err != nil {
		return total, err
	}
	var l [LengthSize]byte
	putDec(l[:], uint64(total))
	_, err := d.st.WriteAt(l[:], start+MarkerSize)
	return total, err
}

// WriteDelta implements Device. The record and its terminator go out in a
// single write. ErrNoSpace leaves the log as it was.
func (d *FileDevice) WriteDelta(gen uint64, marker string, data []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkWrite(gen, marker); err != nil {
		return err
	}
	if len(data) == 0 {
		return errors.New("redolog: empty delta")
	}
	if err := d.ensureState(); err != nil {
		return err
	}
	if d.needDB || d.active == 0 {
		return ErrNoDatabase
	}
	if marker != d.marker {
		return ErrMarkerMismatch
	}
	if gen <= d.lastGen {
		return fmt.Errorf("%w: %d after %d", ErrGeneration, gen, d.lastGen)
	}
	avail := d.halfStart(d.active) + d.half - d.next
	rec := int64(deltaOverhead + len(data))
	if rec > avail {
		return ErrNoSpace
	}
	term := min(TerminatorSize, avail-rec)
	buf := d.buffer(int(rec + term))
	putDec(buf[:LengthSize], uint64(len(data)))
	copy(buf[LengthSize:], data)
	tail := buf[LengthSize+len(data):]
	putDec(tail[:GenerationSize], gen)
	copy(tail[GenerationSize:], marker)
	clear(tail[GenerationSize+MarkerSize:])
	if _, err := d.st.WriteAt(buf, d.next); err != nil {
		d.needDB = true
		return err
	}
	d.next += rec
	d.lastGen = gen
	return nil
}

// Empty implements Device: validity byte '0'.
func (d *FileDevice) Empty() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.readOnly {
		return ErrReadOnly
	}
	if _, err := d.st.WriteAt([]byte{0, '0'}, ValidityOffset-1); err != nil {
		d.known = false
		return err
	}
	d.known, d.active, d.needDB = true, 0, false
	return nil
}

// validMarker: 36 printable, non-space ASCII bytes (a UUID is hex digits
// and dashes). Zeroed or blank space never passes.
func validMarker(b []byte) bool {
	if len(b) != MarkerSize {
		return false
	}
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// parseDec parses exactly len(b) ASCII decimal digits (at most 16).
func parseDec(b []byte) (uint64, bool) {
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// putDec writes v as len(b) zero-padded decimal digits.
func putDec(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
}
