package backend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// The live-migration stream (Migrator): what SendLive writes and
// ReceiveLive reads. It wraps the backend's own state stream (QEMU's
// migration stream, the simulator's JSON) in frames, so that the
// receiving side knows for certain where the stream ends, whether the
// sender finished or gave up, and that nothing was lost on the way:
//
//	"TOOLSTACKD-MIGRATE-1\n"
//	[len 1] backend name ("qemu", "simulator")
//	frames, each [type 1][big-endian length 4][payload]:
//	  'D' data, 1 to MaxMigrateFrame bytes of the backend's stream
//	  'E' end: 8 bytes, the total of the data payloads; the sender
//	      writes it only once its backend has sent everything
//	  'A' abort: the sender's reason (at most 4 KiB of text)
//
// A reader never reads past the end frame, so the carrier (the
// intra-pool connection) can go on with other traffic after it. The
// stream is untrusted input: any other frame type, an oversized frame,
// a wrong total or an early EOF is an error (ErrMigrateStream).
const (
	migrateSignature = "TOOLSTACKD-MIGRATE-1\n"
	// MaxMigrateFrame bounds one data frame.
	MaxMigrateFrame = 1 << 20
	maxAbortReason  = 4096

	frameData  = 'D'
	frameEnd   = 'E'
	frameAbort = 'A'
)

// ErrMigrateStream is wrapped by every error about a malformed,
// truncated or foreign migration stream.
var ErrMigrateStream = errors.New("bad migration stream")

// MigrateAborted is what a reader returns when the sender gave up (an
// abort frame): the migration failed on the sending side.
type MigrateAborted struct{ Reason string }

func (e *MigrateAborted) Error() string { return "the sending host aborted the migration: " + e.Reason }

// MigrateWriter frames a backend's stream for SendLive. Write sends data
// frames; End or Abort finishes the stream. It is not safe for
// concurrent use.
type MigrateWriter struct {
	w     io.Writer
	total uint64
	done  bool
	buf   []byte
}

// NewMigrateWriter writes the stream's header for backend name and
// returns the writer for its frames.
func NewMigrateWriter(w io.Writer, name string) (*MigrateWriter, error) {
	if len(name) == 0 || len(name) > 64 {
		return nil, fmt.Errorf("migration stream: backend name %q", name)
	}
	hdr := append([]byte(migrateSignature), byte(len(name)))
	hdr = append(hdr, name...)
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	return &MigrateWriter{w: w}, nil
}

func (m *MigrateWriter) frame(typ byte, payload []byte) error {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload))) //nolint:gosec // callers bound payloads to MaxMigrateFrame
	// One write per frame keeps a frame whole on a message-based
	// carrier; the buffer is reused (at most one frame).
	m.buf = append(append(m.buf[:0], h[:]...), payload...)
	_, err := m.w.Write(m.buf)
	return err
}

// Write sends p as data frames.
func (m *MigrateWriter) Write(p []byte) (int, error) {
	if m.done {
		return 0, errors.New("migration stream: write after its end")
	}
	n := 0
	for len(p) > 0 {
		c := min(len(p), MaxMigrateFrame)
		if err := m.frame(frameData, p[:c]); err != nil {
			return n, err
		}
		m.total += uint64(c) //nolint:gosec // c > 0
		n += c
		p = p[c:]
	}
	return n, nil
}

// Total is how many data bytes have been written.
func (m *MigrateWriter) Total() uint64 { return m.total }

// End writes the end frame: everything has been sent.
func (m *MigrateWriter) End() error {
	if m.done {
		return errors.New("migration stream: already ended")
	}
	m.done = true
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], m.total)
	return m.frame(frameEnd, b[:])
}

// Abort writes the abort frame with reason (cut to 4 KiB).
func (m *MigrateWriter) Abort(reason string) error {
	if m.done {
		return nil
	}
	m.done = true
	if len(reason) > maxAbortReason {
		reason = reason[:maxAbortReason]
	}
	return m.frame(frameAbort, []byte(reason))
}

// MigrateReader reads a framed stream: Read returns the data frames'
// bytes and io.EOF once the end frame has been read and checked. It
// reads exactly the stream's bytes from its source, nothing past the
// end frame.
type MigrateReader struct {
	r      io.Reader
	left   uint32 // unread bytes of the current data frame
	total  uint64
	err    error
	header bool
	name   string
}

// NewMigrateReader returns a reader for a stream that must come from
// backend name; the header is read and checked on the first Read (so
// that making the reader never blocks).
func NewMigrateReader(r io.Reader, name string) *MigrateReader {
	return &MigrateReader{r: r, name: name}
}

func streamErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMigrateStream, fmt.Sprintf(format, a...))
}

// short turns an EOF in the middle of the stream into a stream error.
func short(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return streamErr("truncated in %s", what)
	}
	return err
}

func (m *MigrateReader) readHeader() error {
	b := make([]byte, len(migrateSignature)+1)
	if _, err := io.ReadFull(m.r, b); err != nil {
		return short(err, "the header")
	}
	if string(b[:len(migrateSignature)]) != migrateSignature {
		return streamErr("not a toolstackd migration stream")
	}
	name := make([]byte, b[len(b)-1])
	if _, err := io.ReadFull(m.r, name); err != nil {
		return short(err, "the header")
	}
	if string(name) != m.name {
		return streamErr("a %q backend's stream, this host's backend is %q", name, m.name)
	}
	return nil
}

// Read implements io.Reader.
func (m *MigrateReader) Read(p []byte) (int, error) {
	if m.err != nil {
		return 0, m.err
	}
	if !m.header {
		if err := m.readHeader(); err != nil {
			m.err = err
			return 0, err
		}
		m.header = true
	}
	for m.left == 0 {
		if err := m.next(); err != nil {
			m.err = err
			return 0, err
		}
	}
	if len(p) > int(m.left) {
		p = p[:m.left]
	}
	n, err := m.r.Read(p)
	m.left -= uint32(n)  //nolint:gosec // n <= len(p) <= m.left
	m.total += uint64(n) //nolint:gosec // n >= 0
	if err != nil && (m.left > 0 || !errors.Is(err, io.EOF)) {
		m.err = short(err, "a data frame")
		return n, m.err
	}
	// An EOF right at a frame's end is left for the next Read, which
	// finds no end frame.
	return n, nil
}

// next reads a frame header (and a whole end or abort frame).
func (m *MigrateReader) next() error {
	var h [5]byte
	if _, err := io.ReadFull(m.r, h[:]); err != nil {
		return short(err, "a frame header")
	}
	n := binary.BigEndian.Uint32(h[1:])
	switch h[0] {
	case frameData:
		if n == 0 || n > MaxMigrateFrame {
			return streamErr("data frame of %d bytes", n)
		}
		m.left = n
		return nil
	case frameEnd:
		if n != 8 {
			return streamErr("end frame of %d bytes", n)
		}
		var b [8]byte
		if _, err := io.ReadFull(m.r, b[:]); err != nil {
			return short(err, "the end frame")
		}
		if t := binary.BigEndian.Uint64(b[:]); t != m.total {
			return streamErr("the sender sent %d bytes, %d arrived", t, m.total)
		}
		return io.EOF
	case frameAbort:
		if n > maxAbortReason {
			return streamErr("abort frame of %d bytes", n)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(m.r, b); err != nil {
			return short(err, "the abort frame")
		}
		return &MigrateAborted{Reason: string(b)}
	}
	return streamErr("unknown frame type %#x", h[0])
}

// Total is how many data bytes have been read.
func (m *MigrateReader) Total() uint64 { return m.total }

// InterruptIO unblocks a Read or Write in progress on x, a migration's
// carrier, when the migration is abandoned, by giving it a deadline in
// the past (net.Conn, *os.File on a pipe or socket, or any wrapper with
// SetDeadline, SetReadDeadline or SetWriteDeadline); the caller may
// clear it later. It never closes x: a wrapper's Close may write. It
// reports whether it could; on a carrier without deadlines the copy
// goroutine reading or writing it ends only when the carrier does.
func InterruptIO(x any) bool {
	past := time.Unix(1, 0)
	if c, ok := x.(interface{ SetDeadline(time.Time) error }); ok && c.SetDeadline(past) == nil {
		return true
	}
	done := false
	if c, ok := x.(interface{ SetReadDeadline(time.Time) error }); ok && c.SetReadDeadline(past) == nil {
		done = true
	}
	if c, ok := x.(interface{ SetWriteDeadline(time.Time) error }); ok && c.SetWriteDeadline(past) == nil {
		done = true
	}
	return done
}
