package storage

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A minimal NBD client (the protocol of github.com/NetworkBlockDevice/nbd,
// doc/proto.md): fixed newstyle negotiation with NBD_OPT_GO, then simple
// replies. Requests may be issued from several goroutines at once; they
// are pipelined on the one connection and matched to replies by handle.

const (
	nbdMagic         = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic      = 0x49484156454f5054 // "IHAVEOPT"
	nbdOptReplyMagic = 0x0003e889045565a9
	nbdRequestMagic  = 0x25609513
	nbdReplyMagic    = 0x67446698

	nbdFlagFixedNewstyle = 1 << 0
	nbdFlagNoZeroes      = 1 << 1

	nbdOptExportName = 1
	nbdOptAbort      = 2
	nbdOptGo         = 7

	nbdRepAck  = 1
	nbdRepInfo = 3
	nbdRepErr  = 1 << 31

	nbdInfoExport = 0

	nbdTFlagReadOnly    = 1 << 1
	nbdTFlagSendFlush   = 1 << 2
	nbdTFlagWriteZeroes = 1 << 6

	nbdCmdRead        = 0
	nbdCmdWrite       = 1
	nbdCmdDisc        = 2
	nbdCmdFlush       = 3
	nbdCmdWriteZeroes = 6

	// nbdMaxRequest is the largest read or write sent in one request.
	nbdMaxRequest = 4 << 20
)

// nbdAddr is where an NBD export is: a network and address for net.Dial,
// and the export name.
type nbdAddr struct {
	Network, Address, Export string
}

// parseNBDURI reads an NBD URI as QEMU writes them:
// nbd+unix:///export?socket=/path, nbd://host[:port]/export.
func parseNBDURI(s string) (nbdAddr, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nbdAddr{}, fmt.Errorf("NBD URI %q: %w", s, err)
	}
	export := strings.TrimPrefix(u.Path, "/")
	switch u.Scheme {
	case "nbd+unix":
		sock := u.Query().Get("socket")
		if sock == "" || u.Host != "" {
			return nbdAddr{}, fmt.Errorf("NBD URI %q: nbd+unix needs ?socket= and no host", s)
		}
		return nbdAddr{"unix", sock, export}, nil
	case "nbd":
		if u.Host == "" {
			return nbdAddr{}, fmt.Errorf("NBD URI %q has no host", s)
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "10809")
		}
		return nbdAddr{"tcp", host, export}, nil
	}
	return nbdAddr{}, fmt.Errorf("NBD URI %q: scheme must be nbd or nbd+unix", s)
}

// nbdClient is one connection to an export.
type nbdClient struct {
	conn   net.Conn
	size   int64
	tflags uint16

	wmu sync.Mutex // serialises requests on the wire
	bw  *bufio.Writer

	mu      sync.Mutex
	pending map[uint64]*nbdReq
	handle  uint64
	err     error // set once the connection failed
	done    chan struct{}
}

type nbdReq struct {
	buf  []byte // read destination
	done chan error
}

// nbdError is an error an NBD server returned for one request.
type nbdError uint32

func (e nbdError) Error() string { return fmt.Sprintf("NBD server error %d", uint32(e)) }

// nbdENOSPC is the NBD protocol's "no space left" error.
const nbdENOSPC = 28

// Is lets errors.Is(err, syscall.ENOSPC) see the server's "no space".
func (e nbdError) Is(target error) bool { return e == nbdENOSPC && target == syscall.ENOSPC }

func dialNBD(ctx context.Context, a nbdAddr) (*nbdClient, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, a.Network, a.Address)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	size, tflags, err := nbdHandshake(conn, a.Export)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	c := &nbdClient{conn: conn, size: size, tflags: tflags, bw: bufio.NewWriterSize(conn, 64<<10),
		pending: map[uint64]*nbdReq{}, done: make(chan struct{})}
	go c.readLoop()
	return c, nil
}

// nbdHandshake negotiates an export over rw and returns its size and
// transmission flags. Everything the server sends is checked.
func nbdHandshake(rw io.ReadWriter, export string) (int64, uint16, error) {
	be := binary.BigEndian
	var hello [18]byte
	if _, err := io.ReadFull(rw, hello[:]); err != nil {
		return 0, 0, fmt.Errorf("NBD handshake: %w", err)
	}
	if be.Uint64(hello[0:]) != nbdMagic {
		return 0, 0, errors.New("NBD handshake: not an NBD server")
	}
	if be.Uint64(hello[8:]) != nbdOptMagic {
		return 0, 0, errors.New("NBD handshake: oldstyle servers are not supported")
	}
	sflags := be.Uint16(hello[16:])
	if sflags&nbdFlagFixedNewstyle == 0 {
		return 0, 0, errors.New("NBD handshake: server lacks fixed newstyle negotiation")
	}
	cflags := uint32(nbdFlagFixedNewstyle)
	noZeroes := sflags&nbdFlagNoZeroes != 0
	if noZeroes {
		cflags |= nbdFlagNoZeroes
	}
	if len(export) > 4096 {
		return 0, 0, errors.New("NBD handshake: export name too long")
	}
	// NBD_OPT_GO with no information requests.
	opt := be.AppendUint32(nil, cflags)
	opt = be.AppendUint64(opt, nbdOptMagic)
	opt = be.AppendUint32(opt, nbdOptGo)
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
		if be.Uint64(rh[0:]) != nbdOptReplyMagic || be.Uint32(rh[8:]) != nbdOptGo {
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
		case typ == nbdRepAck:
			if size < 0 {
				return 0, 0, errors.New("NBD handshake: server sent no export information")
			}
			return size, tflags, nil
		case typ == nbdRepInfo:
			if len(data) >= 2 && be.Uint16(data) == nbdInfoExport {
				if len(data) != 12 {
					return 0, 0, errors.New("NBD handshake: bad export information")
				}
				s := be.Uint64(data[2:])
				if s > uint64(1)<<62 {
					return 0, 0, errors.New("NBD handshake: export too large")
				}
				size, tflags = int64(s), be.Uint16(data[10:])
			}
		case typ&nbdRepErr != 0:
			msg := strings.ToValidUTF8(string(data), "?")
			return 0, 0, fmt.Errorf("NBD handshake: export %q refused (%#x) %s", export, typ, msg)
		default:
			return 0, 0, fmt.Errorf("NBD handshake: unexpected reply %d", typ)
		}
	}
	return 0, 0, errors.New("NBD handshake: too many option replies")
}

func (c *nbdClient) Size() int64    { return c.size }
func (c *nbdClient) ReadOnly() bool { return c.tflags&nbdTFlagReadOnly != 0 }

func (c *nbdClient) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
	pend := c.pending
	c.pending = map[uint64]*nbdReq{}
	c.mu.Unlock()
	for _, r := range pend {
		r.done <- err
	}
}

func (c *nbdClient) readLoop() {
	br := bufio.NewReaderSize(c.conn, 256<<10)
	be := binary.BigEndian
	var h [16]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			c.fail(fmt.Errorf("NBD connection: %w", err))
			return
		}
		if be.Uint32(h[0:]) != nbdReplyMagic {
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
			r.done <- nbdError(errno)
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
func (c *nbdClient) do(typ uint16, flags uint16, off int64, length uint32, payload, readBuf []byte) error {
	r := &nbdReq{buf: readBuf, done: make(chan error, 1)}
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
	be.PutUint32(hdr[0:], nbdRequestMagic)
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

func (c *nbdClient) check(off int64, n int) error {
	if off < 0 || off+int64(n) > c.size {
		return fmt.Errorf("NBD: range %d+%d beyond the end of the export (%d)", off, n, c.size)
	}
	return nil
}

func (c *nbdClient) ReadAt(p []byte, off int64) (int, error) {
	if err := c.check(off, len(p)); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, nbdMaxRequest)
		if err := c.do(nbdCmdRead, 0, off+int64(done), uint32(n), nil, p[done:done+n]); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

func (c *nbdClient) WriteAt(p []byte, off int64) (int, error) {
	if err := c.check(off, len(p)); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		n := min(len(p)-done, nbdMaxRequest)
		if err := c.do(nbdCmdWrite, 0, off+int64(done), uint32(n), p[done:done+n], nil); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// WriteZeroes makes a range read as zeroes, letting the server punch holes.
func (c *nbdClient) WriteZeroes(off, n int64) error {
	if err := c.check(off, 0); err != nil || off+n > c.size {
		return fmt.Errorf("NBD: zero range beyond the end of the export")
	}
	if c.tflags&nbdTFlagWriteZeroes == 0 {
		buf := make([]byte, min(n, nbdMaxRequest))
		for n > 0 {
			k := min(n, int64(len(buf)))
			if _, err := c.WriteAt(buf[:k], off); err != nil {
				return err
			}
			off, n = off+k, n-k
		}
		return nil
	}
	for n > 0 {
		k := min(n, 1<<30)
		if err := c.do(nbdCmdWriteZeroes, 0, off, uint32(k), nil, nil); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

func (c *nbdClient) Flush() error {
	if c.tflags&nbdTFlagSendFlush == 0 {
		return nil
	}
	return c.do(nbdCmdFlush, 0, 0, 0, nil, nil)
}

// Close disconnects politely and closes the connection.
func (c *nbdClient) Close() error {
	c.mu.Lock()
	failed := c.err != nil
	c.mu.Unlock()
	if !failed {
		var hdr [28]byte
		be := binary.BigEndian
		be.PutUint32(hdr[0:], nbdRequestMagic)
		be.PutUint16(hdr[6:], nbdCmdDisc)
		c.wmu.Lock()
		_, _ = c.bw.Write(hdr[:]) // a courtesy before closing: the close is what counts
		_ = c.bw.Flush()
		c.wmu.Unlock()
	}
	err := c.conn.Close()
	c.fail(errors.New("NBD connection closed"))
	return err
}
