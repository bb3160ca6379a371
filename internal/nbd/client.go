package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Protocol constants (doc/proto.md).
const (
	magic         = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic      = 0x49484156454f5054 // "IHAVEOPT"
	optReplyMagic = 0x0003e889045565a9
	requestMagic  = 0x25609513
	replyMagic    = 0x67446698

	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1

	optGo = 7

	repAck  = 1
	repInfo = 3
	repErr  = 1 << 31

	infoExport = 0

	tflagReadOnly    = 1 << 1
	tflagSendFlush   = 1 << 2
	tflagWriteZeroes = 1 << 6

	cmdRead        = 0
	cmdWrite       = 1
	cmdDisc        = 2
	cmdFlush       = 3
	cmdWriteZeroes = 6

	// MaxRequest is the largest read or write the client sends in one
	// request; longer ones are split.
	MaxRequest = 4 << 20
)

// Client is one connection to an export. Its methods are safe to call
// from several goroutines at once.
type Client struct {
	conn   net.Conn
	size   int64
	tflags uint16

	wmu sync.Mutex // serialises requests on the wire
	bw  *bufio.Writer

	mu      sync.Mutex
	pending map[uint64]*request
	handle  uint64
	err     error // set once the connection failed
	done    chan struct{}
}

type request struct {
	buf  []byte // read destination
	done chan error
}

// ServerError is the error number an NBD server returned for one
// request (the protocol's errno values: 1 EPERM, 5 EIO, 12 ENOMEM,
// 22 EINVAL, 28 ENOSPC, ...).
type ServerError uint32

func (e ServerError) Error() string { return fmt.Sprintf("NBD server error %d", uint32(e)) }

// errENOSPC is the NBD protocol's "no space left" error.
const errENOSPC = 28

// Is lets errors.Is(err, syscall.ENOSPC) see the server's "no space".
func (e ServerError) Is(target error) bool { return e == errENOSPC && target == syscall.ENOSPC }

// Dial connects to the export u names and negotiates it. The handshake
// must finish by ctx's deadline, or within 30 seconds when it has none;
// after that the connection has no deadline (Close ends it).
func Dial(ctx context.Context, u URI) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, u.Network, u.Address())
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	size, tflags, err := handshake(conn, u.Export)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	c := &Client{conn: conn, size: size, tflags: tflags, bw: bufio.NewWriterSize(conn, 64<<10),
		pending: map[uint64]*request{}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

// handshake negotiates an export over rw and returns its size and
// transmission flags. Everything the server sends is checked.
func handshake(rw io.ReadWriter, export string) (int64, uint16, error) {
	be := binary.BigEndian
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return 0, 0, fmt.Errorf("NBD handshake: %w", err)
	}
	if be.Uint64(hello[0:]) != magic {
		return 0, 0, errors.New("NBD handshake: not an NBD server")
	}
	if be.Uint64(hello[8:]) != optMagic {
		return 0, 0, errors.New("NBD handshake: oldstyle servers are not supported")
	}
	sflags := be.Uint16(hello[16:])
	if sflags&flagFixedNewstyle == 0 {
		return 0, 0, errors.New("NBD handshake: server lacks fixed newstyle negotiation")
	}
	cflags := uint32(flagFixedNewstyle)
	noZeroes := sflags&flagNoZeroes != 0
	if noZeroes {
		cflags |= flagNoZeroes
	}
	if len(export) > MaxExportName {
		return 0, 0, errors.New("NBD handshake: export name too long")
	}
	// NBD_OPT_GO with no information requests.
	opt := be.AppendUint32(nil, cflags)
	opt = be.AppendUint64(opt, optMagic)
	opt = be.AppendUint32(opt, optGo)
	opt = be.AppendUint32(opt, uint32(4+len(export)+2))
	opt = be.AppendUint32(opt, uint32(len(export)))
	opt = append(opt, export...)
	opt = be.AppendUint16(opt, 0)
	if _, err := rw.Write(opt); err != nil {
		return 0, 0, fmt.Errorf("NBD handshake: %w", err)
	}
	var size int64 = -1
	var tflags uint16
	for range 64 {
		var rh [20]byte
		if _, err := io.ReadFull(rw, rh[:]); err != nil {
			return 0, 0, fmt.Errorf("NBD handshake: %w", err)
		}
		if be.Uint64(rh[0:]) != optReplyMagic || be.Uint32(rh[8:]) != optGo {
			return 0, 0, errors.New("NBD handshake: bad option reply")
		}
		typ, n := be.Uint32(rh[12:]), be.Uint32(rh[16:])
		if n > 64<<10 {
			return 0, 0, errors.New("NBD handshake: option reply too long")
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(rw, data); err != nil {
			return 0, 0, fmt.Errorf("NBD handshake: %w", err)
		}
		switch {
		case typ == repAck:
			if size < 0 {
				return 0, 0, errors.New("NBD handshake: server sent no export information")
			}
			return size, tflags, nil
		case typ == repInfo:
			if len(data) >= 2 && be.Uint16(data) == infoExport {
				if len(data) != 12 {
					return 0, 0, errors.New("NBD handshake: bad export information")
				}
				s := be.Uint64(data[2:])
				if s > uint64(1)<<62 {
					return 0, 0, errors.New("NBD handshake: export too large")
				}
				size, tflags = int64(s), be.Uint16(data[10:])
			}
		case typ&repErr != 0:
			msg := strings.ToValidUTF8(string(data), "?")
			return 0, 0, fmt.Errorf("NBD handshake: export %q refused (%#x) %s", export, typ, msg)
		default:
			return 0, 0, fmt.Errorf("NBD handshake: unexpected reply %d", typ)
		}
	}
	return 0, 0, errors.New("NBD handshake: too many option replies")
}

// Size is the export's size in bytes.
func (c *Client) Size() int64 { return c.size }

// ReadOnly reports whether the server refuses writes to the export.
func (c *Client) ReadOnly() bool { return c.tflags&tflagReadOnly != 0 }

func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	pend := c.pending
	c.pending = map[uint64]*request{}
	c.mu.Unlock()
	for _, r := range pend {
		r.done <- err
	}
}

func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.conn, 256<<10)
	be := binary.BigEndian
	var h [16]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			c.fail(fmt.Errorf("NBD connection: %w", err))
			return
		}
		if be.Uint32(h[0:]) != replyMagic {
			c.fail(errors.New("NBD connection: bad reply magic"))
			return
		}
		errno, handle := be.Uint32(h[4:]), be.Uint64(h[8:])
		c.mu.Lock()
		r := c.pending[handle]
		delete(c.pending, handle)
		c.mu.Unlock()
		if r == nil {
			c.fail(errors.New("NBD connection: reply to no request"))
			return
		}
		if errno != 0 {
			r.done <- ServerError(errno)
			continue
		}
		if r.buf != nil {
			if _, err := io.ReadFull(br, r.buf); err != nil {
				r.done <- err
				c.fail(fmt.Errorf("NBD connection: %w", err))
				return
			}
		}
		r.done <- nil
	}
}

// do sends one request and waits for its reply.
func (c *Client) do(typ uint16, flags uint16, off int64, length uint32, payload, readBuf []byte) error {
	r := &request{buf: readBuf, done: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.handle++
	h := c.handle
	c.pending[h] = r
	c.mu.Unlock()

	var hdr [28]byte
	be := binary.BigEndian
	be.PutUint32(hdr[0:], requestMagic)
	be.PutUint16(hdr[4:], flags)
	be.PutUint16(hdr[6:], typ)
	be.PutUint64(hdr[8:], h)
	be.PutUint64(hdr[16:], uint64(off))
	be.PutUint32(hdr[24:], length)
	c.wmu.Lock()
	_, err := c.bw.Write(hdr[:])
	if err == nil && payload != nil {
		_, err = c.bw.Write(payload)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("NBD connection: %w", err))
	}
	return <-r.done
}

func (c *Client) check(off int64, n int) error {
	if off < 0 || off+int64(n) > c.size {
		return fmt.Errorf("NBD: range %d+%d beyond the end of the export (%d)", off, n, c.size)
	}
	return nil
}

// ReadAt reads len(p) bytes at off, in requests of at most MaxRequest
// bytes; a range beyond the end of the export is an error.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	return c.inRequests(p, off, func(at int64, part []byte) error {
		return c.do(cmdRead, 0, at, uint32(len(part)), nil, part)
	})
}

// WriteAt writes p at off, in requests of at most MaxRequest bytes.
func (c *Client) WriteAt(p []byte, off int64) (int, error) {
	return c.inRequests(p, off, func(at int64, part []byte) error {
		return c.do(cmdWrite, 0, at, uint32(len(part)), part, nil)
	})
}

// inRequests covers len(p) bytes at off with requests of at most
// MaxRequest bytes, in order; send makes the request for one part of p
// (the data it writes, or where the data it reads goes). It returns how
// many bytes the requests that succeeded covered.
func (c *Client) inRequests(p []byte, off int64, send func(at int64, part []byte) error) (int, error) {
	if err := c.check(off, len(p)); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, MaxRequest)
		if err := send(off+int64(done), p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// WriteZeroes makes a range read as zeroes, letting the server punch holes.
func (c *Client) WriteZeroes(off, n int64) error {
	if err := c.check(off, 0); err != nil || off+n > c.size {
		return fmt.Errorf("NBD: zero range beyond the end of the export")
	}
	if c.tflags&tflagWriteZeroes == 0 {
		return ZeroFill(c, off, n)
	}
	for n > 0 {
		k := min(n, 1<<30)
		if err := c.do(cmdWriteZeroes, 0, off, uint32(k), nil, nil); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// ZeroFill writes n zero bytes at off through w, a megabyte at a time: the
// way to zero a range on a target that cannot punch holes or zero a range
// itself (an NBD server without WRITE_ZEROES, a file system without
// hole punching).
func ZeroFill(w io.WriterAt, off, n int64) error {
	buf := make([]byte, min(n, zeroFillBuf))
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.WriteAt(buf[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// zeroFillBuf is the most ZeroFill writes in one call.
const zeroFillBuf = 1 << 20

// Flush asks the server to make every completed write durable (a no-op
// when the server does not take flushes).
func (c *Client) Flush() error {
	if c.tflags&tflagSendFlush == 0 {
		return nil
	}
	return c.do(cmdFlush, 0, 0, 0, nil, nil)
}

// Close disconnects politely and closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	failed := c.err != nil
	c.mu.Unlock()
	if !failed {
		var hdr [28]byte
		be := binary.BigEndian
		be.PutUint32(hdr[0:], requestMagic)
		be.PutUint16(hdr[6:], cmdDisc)
		c.wmu.Lock()
		_, _ = c.bw.Write(hdr[:]) // a courtesy before closing: the close is what counts
		_ = c.bw.Flush()
		c.wmu.Unlock()
	}
	err := c.conn.Close()
	c.fail(errors.New("NBD connection closed"))
	return err
}
