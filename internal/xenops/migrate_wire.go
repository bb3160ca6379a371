package xenops

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"toolstackd/internal/xerr"
)

// The migration stream between two hosts (see migrate.go for the
// protocol): small JSON messages, each a 4-byte big-endian length and
// its bytes, and between them the backend's memory stream and the VM's
// RRD, each cut into chunks (a 4-byte length, then the bytes) and ended
// by an empty chunk, so that the receiver knows where each ends whatever
// reads it.

const (
	// maxMigrateMessage bounds a JSON message.
	maxMigrateMessage = 64 << 10
	// maxChunk bounds one chunk of a stream.
	maxChunk = 1 << 20
	// maxRRDBytes bounds a VM's RRD sent after the memory.
	maxRRDBytes = 32 << 20
)

// migrateVersion is the protocol version the header carries.
const migrateVersion = 2

// migrateHeader opens a migration: the sender's first message.
type migrateHeader struct {
	Version int               `json:"version"`
	VM      string            `json:"vm"`     // VM ref
	UUID    string            `json:"uuid"`   // its uuid
	Source  string            `json:"source"` // the sending host's ref
	Dest    string            `json:"dest"`   // the receiving host's ref
	Power   string            `json:"power"`  // Running or Paused
	Task    string            `json:"task,omitempty"`
	Options map[string]string `json:"options,omitempty"`
	// Disks are the disks a storage migration moves (storagemigrate.go).
	Disks []diskMove `json:"disks,omitempty"`
	// Tunnel, on a stream of its own, names the destination's disk
	// export this connection is carried to (a mirror's NBD session).
	Tunnel string `json:"tunnel,omitempty"`
}

// migrateMsg is every later message: a step, or a failure as a XenAPI
// error.
type migrateMsg struct {
	Step   string   `json:"step"` // ready, received, go, abort, done, failed
	Domid  int64    `json:"domid,omitempty"`
	Code   string   `json:"code,omitempty"`
	Params []string `json:"params,omitempty"`
	// Disks, in ready, clone and mirrors, are the header's with the
	// destination's VDIs and export tokens.
	Disks []diskMove `json:"disks,omitempty"`
	// Disk, in clone, is 1 + the number of the disk among the header's.
	Disk int `json:"disk,omitempty"`
}

// Steps.
const (
	stepReady    = "ready"    // receiver: the incoming domain, or a storage migration's copies, wait
	stepReceived = "received" // receiver: the state is in, the domain paused
	stepGo       = "go"       // sender: the move is recorded; run it
	stepAbort    = "abort"    // sender: the move is not recorded; drop it
	stepDone     = "done"     // receiver: adopted (after the RRD)
	stepCopied   = "copied"   // sender: a storage migration's copies are done
	stepClone    = "clone"    // sender: make a copy's VDI from its base; receiver: made
	stepMirrors  = "mirrors"  // receiver: the incoming domain waits for the mirrors
	stepFailed   = "failed"   // either: Code and Params say why
)

// failedMsg carries err to the other side.
func failedMsg(err error) migrateMsg {
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return migrateMsg{Step: stepFailed, Code: xe.Code, Params: xe.Params}
	}
	return migrateMsg{Step: stepFailed, Code: xerr.InternalError, Params: []string{err.Error()}}
}

// asError is a failure message as the error it carries.
func (m migrateMsg) asError() error {
	if m.Code == "" {
		return xerr.New(xerr.InternalError, "migration: the other host failed without saying why")
	}
	return xerr.New(m.Code, m.Params...)
}

// migConn is one end of a migration stream.
type migConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func newMigConn(c net.Conn) *migConn {
	return &migConn{c: c, r: bufio.NewReaderSize(c, 256<<10), w: bufio.NewWriterSize(c, 256<<10)}
}

// send writes one JSON message and flushes, within timeout.
func (mc *migConn) send(v any, timeout time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMigrateMessage {
		return fmt.Errorf("migration message of %d bytes", len(b))
	}
	_ = mc.c.SetWriteDeadline(time.Now().Add(timeout))
	defer func() { _ = mc.c.SetWriteDeadline(time.Time{}) }()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b))) //nolint:gosec // bounded above
	if _, err := mc.w.Write(n[:]); err != nil {
		return err
	}
	if _, err := mc.w.Write(b); err != nil {
		return err
	}
	return mc.w.Flush()
}

// recv reads one JSON message into v, within timeout (0: no deadline of
// its own).
func (mc *migConn) recv(v any, timeout time.Duration) error {
	if timeout > 0 {
		_ = mc.c.SetReadDeadline(time.Now().Add(timeout))
		defer func() { _ = mc.c.SetReadDeadline(time.Time{}) }()
	}
	var n [4]byte
	if _, err := io.ReadFull(mc.r, n[:]); err != nil {
		return err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxMigrateMessage {
		return fmt.Errorf("migration message of %d bytes (at most %d)", size, maxMigrateMessage)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(mc.r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// recvMsg reads a migrateMsg and checks its step: a failure is returned
// as its error, another step than want as an internal error.
func (mc *migConn) recvMsg(want string, timeout time.Duration) (migrateMsg, error) {
	var m migrateMsg
	if err := mc.recv(&m, timeout); err != nil {
		return m, err
	}
	switch m.Step {
	case want:
		return m, nil
	case stepFailed:
		return m, m.asError()
	}
	return m, xerr.New(xerr.InternalError, fmt.Sprintf("migration: expected %q, got %q", want, m.Step))
}

// chunkWriter cuts what is written into chunks; Close writes the end.
type chunkWriter struct {
	w   *bufio.Writer
	err error
}

func (cw *chunkWriter) Write(p []byte) (int, error) {
	if cw.err != nil {
		return 0, cw.err
	}
	done := 0
	for len(p) > 0 {
		n := min(len(p), maxChunk)
		var h [4]byte
		binary.BigEndian.PutUint32(h[:], uint32(n)) //nolint:gosec // at most maxChunk
		if _, cw.err = cw.w.Write(h[:]); cw.err != nil {
			return done, cw.err
		}
		if _, cw.err = cw.w.Write(p[:n]); cw.err != nil {
			return done, cw.err
		}
		done += n
		p = p[n:]
	}
	// Each write goes out at once: a broken stream is seen while the
	// backend still sends, not only at the end.
	cw.err = cw.w.Flush()
	return done, cw.err
}

// Close ends the stream and flushes it.
func (cw *chunkWriter) Close() error {
	if cw.err != nil {
		return cw.err
	}
	var h [4]byte
	if _, cw.err = cw.w.Write(h[:]); cw.err != nil {
		return cw.err
	}
	cw.err = cw.w.Flush()
	if cw.err == nil {
		cw.err = errors.New("chunk stream closed")
		return nil
	}
	return cw.err
}

// chunkReader reads a chunked stream up to its end, then io.EOF. A
// read deadline set on it is the connection's (backend.InterruptIO).
type chunkReader struct {
	c    net.Conn
	r    *bufio.Reader
	left uint32
	end  bool
	err  error
}

func (cr *chunkReader) Read(p []byte) (int, error) {
	if cr.err != nil {
		return 0, cr.err
	}
	if cr.end {
		return 0, io.EOF
	}
	for cr.left == 0 {
		var h [4]byte
		if _, err := io.ReadFull(cr.r, h[:]); err != nil {
			cr.err = unexpected(err)
			return 0, cr.err
		}
		n := binary.BigEndian.Uint32(h[:])
		if n == 0 {
			cr.end = true
			return 0, io.EOF
		}
		if n > maxChunk {
			cr.err = fmt.Errorf("migration stream: chunk of %d bytes (at most %d)", n, maxChunk)
			return 0, cr.err
		}
		cr.left = n
	}
	if uint32(len(p)) > cr.left { //nolint:gosec // len is non-negative
		p = p[:cr.left]
	}
	n, err := cr.r.Read(p)
	cr.left -= uint32(n) //nolint:gosec // n <= len(p)
	if err != nil {
		cr.err = unexpected(err)
		return n, cr.err
	}
	return n, nil
}

// SetReadDeadline sets the connection's read deadline.
func (cr *chunkReader) SetReadDeadline(t time.Time) error { return cr.c.SetReadDeadline(t) }

// drain reads what is left of the stream, up to limit bytes.
func (cr *chunkReader) drain(limit int64) error {
	n, err := io.Copy(io.Discard, io.LimitReader(cr, limit+1))
	if err != nil {
		return err
	}
	if n > limit || !cr.end {
		return fmt.Errorf("migration stream: more than %d bytes after the end", limit)
	}
	return nil
}

// unexpected turns an EOF inside a stream into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// rateWriter caps the bytes per second written through it (the VM's
// migration_bandwidth), waiting between pieces; ctx ends a wait.
type rateWriter struct {
	ctx   context.Context
	w     io.Writer
	rate  int64 // bytes per second, > 0
	start time.Time
	sent  int64
}

// SetWriteDeadline passes an interruption on to the stream under the
// limit (backend.InterruptIO).
func (rw *rateWriter) SetWriteDeadline(t time.Time) error {
	if d, ok := rw.w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

func (rw *rateWriter) Write(p []byte) (int, error) {
	done := 0
	piece := int(max(rw.rate/10, 1))
	for len(p) > 0 {
		due := rw.start.Add(time.Duration(float64(rw.sent) / float64(rw.rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-rw.ctx.Done():
				t.Stop()
				return done, rw.ctx.Err()
			case <-t.C:
			}
		}
		n, err := rw.w.Write(p[:min(len(p), piece)])
		done += n
		rw.sent += int64(n)
		if err != nil {
			return done, err
		}
		p = p[n:]
	}
	return done, nil
}
