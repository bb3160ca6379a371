package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xerr"
)

// Exports and relays: the two ends of a disk mirror between hosts
// (storage migration). On the destination, Export serves a VDI as a
// writable NBD export on a private Unix socket (a qemu-nbd of its own
// for a file VDI, the plugin's export for an NBD one); the orchestrator
// hands every connection it receives from the source host over the
// intra-pool connection to Export.Serve, which splices it to the
// export. On the source, Relay listens on a private Unix socket that
// QEMU's mirror connects to and dials the destination for each
// connection. Neither end opens a network port; the bytes between the
// hosts travel the authenticated pool connection only.
//
//	dst: e, err := s.Export(ctx, vdiRef)       // VDI_IN_USE if it has a writer
//	     defer e.Close()
//	     ... for each tunnelled conn: go e.Serve(ctx, conn)
//	src: r, err := s.Relay(func(ctx) (net.Conn, error) { /* upgrade to dst */ })
//	     defer r.Close()
//	     mirror to r.URI().String()
//
// The NBD protocol passes through untouched, so the export name the
// source asks for is ExportName. ExportReadOnly serves a VDI for reading
// only, beside a guest that has it open (the source of a copy);
// ExportOf tunnels to an export some other process of this host serves
// (an incoming QEMU's own).

// ExportName is the name of the one export of an Export.
const ExportName = "vdi"

// MaxTunnels bounds the connections one Export or Relay carries at once
// (QEMU's mirror uses one).
const MaxTunnels = 8

// tunnelBuf is the copy buffer of each direction of a tunnel.
const tunnelBuf = 1 << 20

// exportDialTimeout bounds how long a tunnel waits to reach its end.
const exportDialTimeout = 30 * time.Second

// Export is a VDI of this host served as a writable NBD export.
type Export struct {
	s      *Service
	dp     string
	vdi    string
	uri    nbd.URI
	size   int64
	server *qemuNBD // nil for an export the SR's plugin serves
	detach func()
	// readOnly: ExportReadOnly's.
	readOnly bool
	t        tunnels

	stopOnce sync.Once
	stopErr  error
}

// Export attaches vdiRef read-write under a datapath of its own
// ("mirror/...") and serves it. The VDI must have no other writer
// (VDI_IN_USE). Close undoes everything.
func (s *Service) Export(ctx context.Context, vdiRef string) (*Export, error) {
	return s.export(ctx, vdiRef, true)
}

// ExportReadOnly is Export serving the VDI read-only, shared with the
// running guest that may have it open (the source of a storage
// migration's copy): attached read-only, its qemu-nbd sharing the image.
func (s *Service) ExportReadOnly(ctx context.Context, vdiRef string) (*Export, error) {
	return s.export(ctx, vdiRef, false)
}

func (s *Service) export(ctx context.Context, vdiRef string, write bool) (*Export, error) {
	dp := "mirror/" + randomName("")
	d, detach, err := s.transferAttach(ctx, dp, vdiRef, write)
	if err != nil {
		return nil, err
	}
	e := &Export{s: s, dp: dp, vdi: vdiRef, detach: detach, readOnly: !write}
	switch d.Kind {
	case "file":
		err = e.serveFile(ctx, s.run, d.Path, d.Format)
	case "nbd":
		e.uri, err = nbd.ParseURI(d.URI)
	default:
		err = fmt.Errorf("unknown datapath kind %q", d.Kind)
	}
	if err == nil {
		err = e.check(ctx)
	}
	if err != nil {
		_ = e.stop()
		return nil, BackendError(smVDIUnavailable, err.Error())
	}
	return e, nil
}

// ExportImage serves an image file (format "qcow2" or "raw") as Export
// serves a VDI, with its socket in dir ("" for a temporary directory of
// its own), outside any SR: for tools and tests that need the
// destination end of a mirror without a storage service.
func ExportImage(ctx context.Context, dir, path, format string) (*Export, error) {
	dir, err := runDir(dir)
	if err != nil {
		return nil, err
	}
	e := &Export{}
	if err := e.serveFile(ctx, dir, path, format); err != nil {
		return nil, err
	}
	if err := e.check(ctx); err != nil {
		_ = e.stop()
		return nil, err
	}
	return e, nil
}

// ExportOf is the tunnel end of an NBD export this host serves already
// (a storage migration's incoming domain serving its own disk,
// backend.DiskExporter): Serve carries connections to u, Close ends
// them and nothing else. Size is 0 (not asked).
func ExportOf(u nbd.URI) *Export { return &Export{uri: u} }

func (e *Export) serveFile(ctx context.Context, dir, path, format string) error {
	if format == "" {
		format = "raw"
	}
	if format != "raw" && format != "qcow2" {
		return fmt.Errorf("cannot export an image in format %q", format)
	}
	q, err := startQemuNBD(ctx, dir, path, format, e.readOnly)
	if err != nil {
		return err
	}
	e.server, e.uri = q, q.uri()
	return nil
}

// check shakes hands with the export once: it works and takes writes.
func (e *Export) check(ctx context.Context) error {
	hctx, cancel := context.WithTimeout(ctx, exportDialTimeout)
	defer cancel()
	c, err := nbd.Dial(hctx, e.uri)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if c.ReadOnly() && !e.readOnly {
		return errors.New("the export is read-only")
	}
	e.size = c.Size()
	return nil
}

// URI is the export on this host (a Unix socket for a file VDI): for the
// host's own processes, never to be handed to another host.
func (e *Export) URI() nbd.URI { return e.uri }

// Size is the export's size in bytes (the VDI's virtual size).
func (e *Export) Size() int64 { return e.size }

// Serve carries the NBD session on conn to the export until either side
// ends it, ctx ends or the export is closed, and closes conn. It refuses
// (closing conn) beyond MaxTunnels at once or after Close.
func (e *Export) Serve(ctx context.Context, conn net.Conn) error {
	return e.t.splice(ctx, conn, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, e.uri.Network, e.uri.Address())
	})
}

// Close ends the tunnels, stops the server (which flushes the image) and
// detaches the VDI. It is idempotent.
func (e *Export) Close() error {
	e.t.close()
	return e.stop()
}

func (e *Export) stop() error {
	e.stopOnce.Do(func() {
		var err error
		if e.server != nil {
			err = e.server.stop()
		}
		if e.detach != nil {
			e.detach()
		}
		if err != nil {
			e.stopErr = BackendError(smVDIUnavailable, err.Error())
		}
	})
	return e.stopErr
}

// Relay is a Unix socket on this host that QEMU connects to as to an NBD
// server; each connection is carried to wherever dial reaches (the
// destination host's Export.Serve, through the pool connection).
type Relay struct {
	ln   *net.UnixListener
	sock string
	dial func(context.Context) (net.Conn, error)
	t    tunnels
	done chan struct{}
}

// Relay starts a relay under the host's run directory.
func (s *Service) Relay(dial func(context.Context) (net.Conn, error)) (*Relay, error) {
	return NewRelay(s.run, dial)
}

// NewRelay starts a relay with its socket in dir ("" for a temporary
// directory of its own).
func NewRelay(dir string, dial func(context.Context) (net.Conn, error)) (*Relay, error) {
	return newRelay(dir, dial, 0)
}

// newRelay is NewRelay with the far end's greeting bound (0: default).
func newRelay(dir string, dial func(context.Context) (net.Conn, error), greet time.Duration) (*Relay, error) {
	if dial == nil {
		return nil, xerr.New(xerr.InternalError, "storage: relay without a dialer")
	}
	dir, err := runDir(dir)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, randomName("relay-")+".sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		_ = ln.Close()
		return nil, err
	}
	r := &Relay{ln: ln, sock: sock, dial: dial, done: make(chan struct{})}
	r.t.greet = greet
	go r.accept()
	return r, nil
}

// URI is the relay as an NBD URI, naming the destination's export.
func (r *Relay) URI() nbd.URI { return nbd.URI{Network: "unix", Socket: r.sock, Export: ExportName} }

func (r *Relay) accept() {
	defer close(r.done)
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go func() { _ = r.t.splice(context.Background(), c, r.dial) }()
	}
}

// Close stops accepting, cuts every connection (what QEMU sends after
// that fails, which ends a mirror stuck on a silent destination) and
// removes the socket. It is idempotent.
func (r *Relay) Close() error {
	err := r.ln.Close()
	<-r.done
	r.t.close()
	_ = os.Remove(r.sock)
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// tunnels is a bounded set of spliced connection pairs.
type tunnels struct {
	greet  time.Duration // how long the far end may take to greet (0: exportDialTimeout)
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func (t *tunnels) add(cs ...net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || len(t.conns)+len(cs) > 2*MaxTunnels {
		return false
	}
	if t.conns == nil {
		t.conns = map[net.Conn]struct{}{}
	}
	for _, c := range cs {
		t.conns[c] = struct{}{}
	}
	return true
}

func (t *tunnels) remove(cs ...net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range cs {
		delete(t.conns, c)
	}
}

// splice dials the other end for conn and copies both ways until one
// side ends; both are closed when it returns.
func (t *tunnels) splice(ctx context.Context, conn net.Conn, dial func(context.Context) (net.Conn, error)) error {
	t.mu.Lock()
	ok := !t.closed
	if ok {
		t.wg.Add(1)
	}
	t.mu.Unlock()
	if !ok {
		_ = conn.Close()
		return errors.New("storage: tunnel closed")
	}
	defer t.wg.Done()
	if !t.add(conn) {
		_ = conn.Close()
		return errors.New("storage: too many tunnels")
	}
	dctx, cancel := context.WithTimeout(ctx, exportDialTimeout)
	other, err := dial(dctx)
	cancel()
	if err != nil {
		t.remove(conn)
		_ = conn.Close()
		return fmt.Errorf("storage: tunnel: %w", err)
	}
	if !t.add(other) {
		t.remove(conn)
		_ = conn.Close()
		_ = other.Close()
		return errors.New("storage: tunnel closed")
	}
	defer t.remove(conn, other)
	stop := context.AfterFunc(ctx, func() { _ = conn.Close(); _ = other.Close() })
	defer stop()
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		// Large pieces: a mirror's writes are up to a few MiB each, and
		// a wrapped connection gets no splice from io.Copy.
		_, err := io.CopyBuffer(dst, src, make([]byte, tunnelBuf))
		// One direction ended: end the other too (NBD has no half-close).
		_ = dst.Close()
		_ = src.Close()
		errc <- err
	}
	// An NBD server speaks first: a far end that does not greet within
	// the bound is cut off, so that a client waiting for the greeting
	// (QEMU opening a mirror target, in its main loop) is not held.
	greet := t.greet
	if greet <= 0 {
		greet = exportDialTimeout
	}
	_ = other.SetReadDeadline(time.Now().Add(greet))
	go cp(other, conn)
	go cp(conn, &greeted{Conn: other})
	err = errors.Join(ended(<-errc), ended(<-errc))
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// ended is a copy's error, nil for the ways a tunnel ends normally (a
// side closed).
func ended(err error) error {
	if err == nil || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// greeted lifts the read deadline of its connection once data came.
type greeted struct {
	net.Conn
	done bool
}

func (g *greeted) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if n > 0 && !g.done {
		g.done = true
		_ = g.Conn.SetReadDeadline(time.Time{})
	}
	return n, err
}

// close cuts every connection and waits for the splices to end.
func (t *tunnels) close() {
	t.mu.Lock()
	t.closed = true
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}
