package raftnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"toolstackd/internal/pool/peerauth"
)

// Wire constants of the upgrade handshake.
const (
	// Path is where the daemon mounts the StreamLayer's handler.
	Path = "/pool/raft"
	// Protocol is the Upgrade token of raft connections.
	Protocol = "toolstackd-raft/1"
)

// Defaults of Config's bounds.
const (
	DefaultQueueSize        = 16
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultMaxHeaderBytes   = 8 << 10
)

// Errors of the handshake, for errors.Is on what Dial returns.
var (
	// ErrBadSecret: the peer refused our signature (403).
	ErrBadSecret = errors.New("raftnet: peer refused the pool secret")
	// ErrNoProof: the peer answered 101 without proving it holds the
	// pool secret; nothing was sent on the connection.
	ErrNoProof = errors.New("raftnet: peer did not prove it holds the pool secret")
	// ErrBusy: the peer's accept queue was full or its layer closed (503).
	ErrBusy = errors.New("raftnet: peer not accepting raft connections")
	// ErrHandshake: the peer's answer was not a valid upgrade.
	ErrHandshake = errors.New("raftnet: bad upgrade answer")
	// ErrNoSecret: Dial has no secret to present.
	ErrNoSecret = errors.New("raftnet: no pool secret to present")
)

// HandshakeError is what Dial returns when the peer answers with
// something other than 101: the status it gave and the matching sentinel
// (ErrBadSecret, ErrBusy or ErrHandshake) for errors.Is.
type HandshakeError struct {
	Address    string
	StatusCode int
	Err        error
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("%v: %s answered %d", e.Err, e.Address, e.StatusCode)
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// Config sets up a StreamLayer.
type Config struct {
	// Advertise is the address peers dial to reach this host
	// ("127.0.0.2:8080"): the daemon's listen address. raft learns its
	// own address from it (Addr).
	Advertise string
	// Secrets returns the pool secrets currently accepted from peers;
	// during a rotation both the old and the new one. Dial signs with the
	// first (package peerauth: the secret itself is never sent). Called
	// on every handshake.
	Secrets func() []string
	// Verifier checks peers' signatures and remembers their nonces
	// (default: one of the layer's own). Share one among every handler of
	// a host, so that a request is accepted once by any of them.
	Verifier *peerauth.Verifier
	// IsSelf, when set, reports whether an address (a request's Host)
	// names this host besides Advertise and the address a connection
	// arrived at (the host was readdressed).
	IsSelf func(host string) bool
	// Verified, when set, is told of each upgrade request whose
	// signature was accepted (the pool learns its peers' source
	// addresses from them).
	Verified func(r *http.Request)
	// TLS, when set, makes Dial speak TLS (the peer's HTTPS listener).
	TLS *tls.Config
	// LocalAddr, when set, is the local address Dial binds to; hosts
	// sharing a machine on 127.0.0.N dial from their own N.
	LocalAddr *net.TCPAddr
	// DialTCP, when set, makes Dial's TCP connections instead of a
	// net.Dialer (and LocalAddr is then its business): the daemon's, which
	// reaches a peer's management address in the network namespace the
	// host's PIFs live in.
	DialTCP func(ctx context.Context, address string) (net.Conn, error)
	// QueueSize bounds the upgraded connections waiting for Accept
	// (default DefaultQueueSize); beyond it peers get 503.
	QueueSize int
	// HandshakeTimeout bounds Dial's wait for the 101 when raft gives no
	// shorter timeout, and the server's write of the 101 (default
	// DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxHeaderBytes bounds the answer Dial reads (default
	// DefaultMaxHeaderBytes).
	MaxHeaderBytes int
}

// StreamLayer is a raft.StreamLayer over HTTP upgrades. It is also the
// http.Handler of Path. Close stops Accept and makes the handler answer
// 503; it does not close connections already handed to raft.
type StreamLayer struct {
	cfg   Config
	conns chan net.Conn
	slots chan struct{} // one per connection upgraded and not yet accepted
	done  chan struct{}
	mu    sync.Mutex
	shut  bool
}

var _ raft.StreamLayer = (*StreamLayer)(nil)

// NewStreamLayer checks cfg and returns a layer ready to serve.
func NewStreamLayer(cfg Config) (*StreamLayer, error) {
	if cfg.Advertise == "" {
		return nil, errors.New("raftnet: Config.Advertise is empty")
	}
	if _, _, err := net.SplitHostPort(cfg.Advertise); err != nil {
		return nil, fmt.Errorf("raftnet: Config.Advertise: %w", err)
	}
	if cfg.Secrets == nil {
		return nil, errors.New("raftnet: Config.Secrets is nil")
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.Verifier == nil {
		cfg.Verifier = peerauth.NewVerifier()
	}
	if cfg.TLS != nil {
		c := cfg.TLS.Clone()
		// Upgrades are HTTP/1.1 only.
		c.NextProtos = []string{"http/1.1"}
		cfg.TLS = c
	}
	return &StreamLayer{
		cfg:   cfg,
		conns: make(chan net.Conn, cfg.QueueSize),
		slots: make(chan struct{}, cfg.QueueSize),
		done:  make(chan struct{}),
	}, nil
}

type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }

// Addr is the advertised address.
func (l *StreamLayer) Addr() net.Addr { return tcpAddr(l.cfg.Advertise) }

// Accept returns the next upgraded connection; after Close it returns an
// error wrapping net.ErrClosed.
func (l *StreamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		<-l.slots
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("raftnet: accept: %w", net.ErrClosed)
	}
}

// Close stops the layer: Accept fails, the handler answers 503, and
// connections still queued are closed.
func (l *StreamLayer) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shut {
		return nil
	}
	l.shut = true
	close(l.done)
	for {
		select {
		case c := <-l.conns:
			<-l.slots
			_ = c.Close()
		default:
			return nil
		}
	}
}

// verify checks the upgrade request's signature: the secret and nonce
// to prove the answer with.
func (l *StreamLayer) verify(r *http.Request) (secret, nonce string, err error) {
	self := func(host string) bool {
		return peerauth.SameAddr(host, l.cfg.Advertise) || peerauth.LocalHost(r, host) || (l.cfg.IsSelf != nil && l.cfg.IsSelf(host))
	}
	return l.cfg.Verifier.Verify(r.Header, l.cfg.Secrets(), peerauth.Of(r), self, time.Now())
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// ServeHTTP is the handler of POST Path.
func (l *StreamLayer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "raft connections use POST", http.StatusMethodNotAllowed)
		return
	}
	secret, nonce, err := l.verify(r)
	if err != nil {
		http.Error(w, "pool secret refused", http.StatusForbidden)
		return
	}
	if l.cfg.Verified != nil {
		l.cfg.Verified(r)
	}
	if !headerHasToken(r.Header, "Upgrade", Protocol) || !headerHasToken(r.Header, "Connection", "Upgrade") {
		w.Header().Set("Upgrade", Protocol)
		http.Error(w, "upgrade to "+Protocol+" required", http.StatusUpgradeRequired)
		return
	}
	// Take a queue slot before hijacking, so a full queue is answered
	// with a proper 503 and the queued send below cannot block.
	select {
	case <-l.done:
		http.Error(w, "raft is not running here", http.StatusServiceUnavailable)
		return
	default:
	}
	select {
	case l.slots <- struct{}{}:
	default:
		http.Error(w, "too many raft connections waiting", http.StatusServiceUnavailable)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		<-l.slots
		http.Error(w, "connection cannot be upgraded (HTTP/2?)", http.StatusHTTPVersionNotSupported)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		<-l.slots
		return
	}
	// The server's read and write deadlines were for the request; the
	// raft connection sets its own.
	conn.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	proof := http.Header{}
	peerauth.Prove(proof, secret, nonce, peerauth.Of(r))
	_, err = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+Protocol+"\r\nConnection: Upgrade\r\n"+
		peerauth.ProofHeader+": "+proof.Get(peerauth.ProofHeader)+"\r\n\r\n")
	if err != nil {
		<-l.slots
		_ = conn.Close()
		return
	}
	conn.SetDeadline(time.Time{})
	c := net.Conn(conn)
	if n := rw.Reader.Buffered(); n > 0 {
		// The peer sent raft bytes right behind the request.
		pre, _ := rw.Reader.Peek(n)
		c = &prefixConn{Conn: conn, pre: append([]byte(nil), pre...)}
	}
	l.mu.Lock()
	if l.shut {
		l.mu.Unlock()
		<-l.slots
		_ = c.Close()
		return
	}
	l.conns <- c // cannot block: we hold a slot
	l.mu.Unlock()
}

// prefixConn yields bytes already read from the connection before the
// connection's own.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// Dial connects to a peer's Path and performs the upgrade, within
// timeout (HandshakeTimeout when timeout is 0 or larger).
func (l *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > l.cfg.HandshakeTimeout {
		timeout = l.cfg.HandshakeTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return l.DialContext(ctx, string(address))
}

// DialContext is Dial bounded by ctx.
func (l *StreamLayer) DialContext(ctx context.Context, address string) (net.Conn, error) {
	secrets := l.cfg.Secrets()
	if len(secrets) == 0 || secrets[0] == "" {
		return nil, ErrNoSecret
	}
	if strings.ContainsFunc(address, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, fmt.Errorf("raftnet: dial %q: address contains spaces or control characters", address)
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("raftnet: dial %q: %w", address, err)
	}
	var raw net.Conn
	if l.cfg.DialTCP != nil {
		raw, err = l.cfg.DialTCP(ctx, address)
	} else {
		d := net.Dialer{}
		if l.cfg.LocalAddr != nil {
			d.LocalAddr = l.cfg.LocalAddr
		}
		raw, err = d.DialContext(ctx, "tcp", address)
	}
	if err != nil {
		return nil, err
	}
	conn := raw
	if deadline, ok := ctx.Deadline(); ok {
		conn.SetDeadline(deadline)
	}
	// A context cancelled mid-handshake closes the connection.
	stop := context.AfterFunc(ctx, func() { _ = raw.Close() })
	defer stop()
	if l.cfg.TLS != nil {
		tc := l.cfg.TLS
		if tc.ServerName == "" {
			tc = tc.Clone()
			tc.ServerName = host
		}
		tconn := tls.Client(raw, tc)
		if err := tconn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("raftnet: TLS to %s: %w", address, err)
		}
		conn = tconn
	}
	// Signed, not the secret: a listener that is not of the pool learns
	// nothing it can use (package peerauth).
	q := peerauth.Request{Method: http.MethodPost, Host: address, URI: Path}
	auth := http.Header{}
	nonce := peerauth.Sign(auth, secrets[0], q, time.Now())
	req := "POST " + Path + " HTTP/1.1\r\nHost: " + address +
		"\r\nConnection: Upgrade\r\nUpgrade: " + Protocol +
		"\r\n" + peerauth.Header + ": " + auth.Get(peerauth.Header) + "\r\nContent-Length: 0\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("raftnet: upgrade request to %s: %w", address, err)
	}
	lr := &io.LimitedReader{R: conn, N: int64(l.cfg.MaxHeaderBytes)}
	br := bufio.NewReaderSize(lr, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		_ = conn.Close()
		if lr.N == 0 {
			return nil, fmt.Errorf("%w: answer from %s longer than %d bytes", ErrHandshake, address, l.cfg.MaxHeaderBytes)
		}
		return nil, fmt.Errorf("%w: from %s: %v", ErrHandshake, address, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !headerHasToken(resp.Header, "Upgrade", Protocol) {
		_ = conn.Close()
		herr := &HandshakeError{Address: address, StatusCode: resp.StatusCode, Err: ErrHandshake}
		switch resp.StatusCode {
		case http.StatusForbidden:
			herr.Err = ErrBadSecret
		case http.StatusServiceUnavailable:
			herr.Err = ErrBusy
		}
		return nil, herr
	}
	if !peerauth.CheckProof(resp.Header, secrets, nonce, q) {
		_ = conn.Close()
		return nil, &HandshakeError{Address: address, StatusCode: resp.StatusCode, Err: ErrNoProof}
	}
	if !stop() && ctx.Err() != nil {
		// The context fired and closed the connection under us.
		return nil, ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	out := net.Conn(conn)
	if n := br.Buffered(); n > 0 {
		pre, _ := br.Peek(n)
		out = &prefixConn{Conn: conn, pre: append([]byte(nil), pre...)}
	}
	return out, nil
}
