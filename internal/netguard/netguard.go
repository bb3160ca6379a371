// Package netguard bounds what network clients can hold: how long a
// request may take to arrive, how long a connection may sit idle, how long
// a reply or a taken-over (hijacked) transfer may go without progress, and
// how many connections one client, and all clients together, may keep
// open.
//
// The daemon wraps each listener with Guard.Listener and serves it with an
// http.Server from Guard.Server. Deadlines are set per operation, never for
// a whole request: a long poll such as event.from may wait for as long as
// it was asked to, silent in both directions, and only the writing of its
// reply is timed.
//
// Limits, with the names of the daemon's flags:
//
//   - header-timeout: the request line and headers must arrive within it
//     (also bounds a connection that connects and sends nothing, and the TLS
//     handshake).
//   - idle-timeout: a keep-alive connection waiting for its next request is
//     closed after it.
//   - stall-timeout: a request body (and the stream of a hijacked transfer)
//     that moves no byte for it is dropped.
//   - body-grace and min-body-rate: a request body must also average
//     min-body-rate bytes a second over the time spent waiting for it,
//     after an allowance of body-grace (at most stall-timeout). The bound
//     is a read deadline on the connection from the moment the handler
//     starts, so it holds whoever reads the body: the handler, or net/http
//     reading what the handler left.
//   - write-timeout: every write to a client must make progress within it; a
//     client that stops reading its reply is dropped.
//   - max-conns-per-client: connections open at once from one IP address
//     (the local Unix socket is exempt); more are closed at accept.
//   - max-conns: connections open at once in total, by default the file
//     limit less a reserve for the daemon's own files. Near the cap, idle
//     keep-alive connections are closed, longest idle first, to make room.
//
// A connection taken over for a transfer is wrapped with Transfer (or
// Interactive, for a console) to keep the stall bound. Upgrade instead
// hands a connection over to a protocol of the daemon's own (HTTP/1.1
// Upgrade, as the migration streams use) that sets its own deadlines.
package netguard

import (
	"bufio"
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config holds the limits. Zero fields take the defaults of Defaults.
type Config struct {
	HeaderTimeout     time.Duration
	IdleTimeout       time.Duration
	WriteTimeout      time.Duration
	StallTimeout      time.Duration
	BodyGrace         time.Duration // before the floor rate applies (at most StallTimeout)
	ConsoleIdle       time.Duration // a console proxy with no traffic either way
	MinBodyRate       int64         // bytes a second
	MaxConnsPerClient int
	MaxConns          int // 0: from RLIMIT_NOFILE (see MaxConnsForLimit)
	// MaxPeerConns bounds the connections from the pool's other hosts
	// (SetPeers), which are counted apart from clients': a client flood
	// never leaves a peer waiting (raft, leases, forwarded calls).
	MaxPeerConns int
	Log          *slog.Logger
}

// Defaults are the limits a daemon runs with unless told otherwise.
//
// IdleTimeout: 2 min. xapi keeps an idle keep-alive connection without a
// timeout on its HTTP server after the first request (and for 12 hours
// through its stunnel unless STUNNEL_IDLE_TIMEOUT says otherwise), so the
// clients written for it reuse connections after long pauses, and not
// every one of them retries a call that meets a connection the server has
// just closed (Go's own transport does not retry a POST). 2 min bounds
// what an idle flood holds while keeping those clients working; the
// daemon's own clients of other hosts let theirs go after 20 s.
//
// BodyGrace: a client has its request body in hand when it sends the
// headers, so the body follows at once; 10 s covers a lost segment sent
// three times (TCP's first retransmission timeout is 1 s, doubling at each
// try) and is xapi's own bound on each read of a new connection's request
// header (header_read_timeout_tcp). After it the floor rate applies: a 1 KiB call
// may take 11 s, a 4 MiB one (the RPC body cap) about 70 minutes at the
// floor, which is what a rate means; the stall timeout still drops a body
// that stops.
func Defaults() Config {
	return Config{
		HeaderTimeout:     30 * time.Second,
		IdleTimeout:       120 * time.Second,
		WriteTimeout:      60 * time.Second,
		StallTimeout:      60 * time.Second,
		BodyGrace:         10 * time.Second,
		ConsoleIdle:       30 * time.Minute,
		MinBodyRate:       1024,
		MaxConnsPerClient: 512,
		MaxPeerConns:      256,
	}
}

func (c Config) withDefaults() Config {
	d := Defaults()
	set := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&c.HeaderTimeout, d.HeaderTimeout)
	set(&c.IdleTimeout, d.IdleTimeout)
	set(&c.WriteTimeout, d.WriteTimeout)
	set(&c.StallTimeout, d.StallTimeout)
	set(&c.BodyGrace, d.BodyGrace)
	set(&c.ConsoleIdle, d.ConsoleIdle)
	if c.MinBodyRate <= 0 {
		c.MinBodyRate = d.MinBodyRate
	}
	if c.MaxPeerConns <= 0 {
		c.MaxPeerConns = d.MaxPeerConns
	}
	if c.MaxConnsPerClient <= 0 {
		c.MaxConnsPerClient = d.MaxConnsPerClient
	}
	if c.MaxConns <= 0 {
		c.MaxConns = MaxConnsForLimit(FileLimit())
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// localReserve is how many connections the local socket may open beyond
// the global cap, so that the local superuser can still get in.
const localReserve = 64

// reclaimAt is the share of the global cap from which each new connection
// first closes the connection that has been idle longest.
const reclaimAt = 0.9

// FileLimit is the soft RLIMIT_NOFILE (0 if unknown).
func FileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}

// RaiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit, as most
// servers do at start-up, and returns the new soft limit.
func RaiseFileLimit() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return FileLimit(), err
		}
	}
	return r.Cur, nil
}

// MaxConnsForLimit is the connection cap for a file limit: the limit less
// a tenth of it (at least 512) kept for the database, logs, disk images and
// QEMU's sockets.
func MaxConnsForLimit(limit uint64) int {
	if limit == 0 || limit > 1<<24 {
		limit = 1 << 20
	}
	reserve := max(limit/10, 512)
	if limit <= reserve+64 {
		return 64
	}
	return int(limit - reserve)
}

// Guard counts the connections of every listener it wraps.
type Guard struct {
	cfg Config

	mu        sync.Mutex
	total     int
	perClient map[string]int
	idle      *list.List // of *Conn, longest idle first
	peerConns int        // connections from peers, outside total

	// peers reports whether an address is another host of the pool.
	peers       atomic.Pointer[func(netip.Addr) bool]
	refusedPeer atomic.Int64

	refusedClient atomic.Int64
	refusedTotal  atomic.Int64
	reclaimed     atomic.Int64
	lastLog       atomic.Int64
}

// New makes a Guard.
func New(cfg Config) *Guard {
	cfg = cfg.withDefaults()
	return &Guard{cfg: cfg, perClient: map[string]int{}, idle: list.New()}
}

// SetPeers tells the Guard which source addresses are the pool's other
// hosts. Their connections get a budget of their own (MaxPeerConns),
// outside the per-client and global caps and never reclaimed as idle:
// however many connections clients hold, a peer's next one is accepted.
// The address alone lets a connection in; what it may do is still up to
// the request's signature (the pool's business).
func (g *Guard) SetPeers(f func(netip.Addr) bool) { g.peers.Store(&f) }

func (g *Guard) isPeer(c net.Conn) bool {
	f := g.peers.Load()
	if f == nil {
		return false
	}
	a, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	return ok && (*f)(ip.Unmap())
}

// Config is the Guard's effective configuration.
func (g *Guard) Config() Config { return g.cfg }

// Stats is a snapshot of the Guard's counters.
type Stats struct {
	Open, Idle, MaxConns       int
	RefusedClient, RefusedFull int64 // over the per-client cap; over the global cap
	Reclaimed                  int64 // idle connections closed to make room
	Peers                      int   // open connections from the pool's other hosts
	RefusedPeer                int64 // peers' connections over their own budget
}

// Stats reports the counters.
func (g *Guard) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Open: g.total, Idle: g.idle.Len(), MaxConns: g.cfg.MaxConns,
		RefusedClient: g.refusedClient.Load(), RefusedFull: g.refusedTotal.Load(), Reclaimed: g.reclaimed.Load(),
		Peers: g.peerConns, RefusedPeer: g.refusedPeer.Load()}
}

// Listener wraps l. Connections of a local listener (the Unix socket) are
// exempt from the per-client cap and may exceed the global one slightly.
func (g *Guard) Listener(l net.Listener, local bool) net.Listener {
	return &listener{Listener: l, g: g, local: local}
}

// Server makes an http.Server for h with the Guard's timeouts, its idle
// bookkeeping and the request-body deadlines.
func (g *Guard) Server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           g.Handler(h),
		ReadHeaderTimeout: g.cfg.HeaderTimeout,
		IdleTimeout:       g.cfg.IdleTimeout,
		ConnState:         g.connState,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if gc := guardConn(c); gc != nil {
				ctx = context.WithValue(ctx, connKey{}, gc)
			}
			return ctx
		},
	}
}

type connKey struct{}

type listener struct {
	net.Listener
	g     *Guard
	local bool
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c, l.local); gc != nil {
			return gc, nil
		}
		_ = c.Close()
	}
}

// clientKey is who a connection counts against: its IPv4 address, or the
// /64 of its IPv6 address (one site's, as the login limits count it).
func clientKey(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().Is6() {
			p, _ := ip.Prefix(64)
			return p.String()
		}
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// admit counts a new connection in, or returns nil if it must be refused.
func (g *Guard) admit(c net.Conn, local bool) *Conn {
	if !local && g.isPeer(c) {
		return g.admitPeer(c)
	}
	key := ""
	if !local {
		key = clientKey(c)
	}
	var victims []*Conn
	g.mu.Lock()
	if !local && g.perClient[key] >= g.cfg.MaxConnsPerClient {
		g.mu.Unlock()
		g.refusedClient.Add(1)
		g.note("refusing a connection: too many from this client", "client", key, "cap", g.cfg.MaxConnsPerClient)
		return nil
	}
	limit := g.cfg.MaxConns
	if local {
		limit += localReserve
	}
	// Near the cap, make room by closing the longest-idle connections.
	for g.total >= int(float64(g.cfg.MaxConns)*reclaimAt) && g.idle.Len() > 0 && len(victims) < 2 {
		v := g.idle.Remove(g.idle.Front()).(*Conn)
		v.idleElem = nil
		g.forgetLocked(v)
		victims = append(victims, v)
	}
	if g.total >= limit {
		g.mu.Unlock()
		g.closeVictims(victims)
		g.refusedTotal.Add(1)
		g.note("refusing a connection: the connection cap is reached", "cap", limit)
		return nil
	}
	g.total++
	if !local {
		g.perClient[key]++
	}
	g.mu.Unlock()
	g.closeVictims(victims)
	gc := &Conn{Conn: c, g: g, key: key, local: local, writeTimeout: g.cfg.WriteTimeout, stall: g.cfg.StallTimeout, console: g.cfg.ConsoleIdle}
	gc.counted = true
	return gc
}

// admitPeer counts in a connection from another host of the pool, within
// the peers' own budget.
func (g *Guard) admitPeer(c net.Conn) *Conn {
	g.mu.Lock()
	if g.peerConns >= g.cfg.MaxPeerConns {
		g.mu.Unlock()
		g.refusedPeer.Add(1)
		g.note("refusing a connection: the pool's hosts hold all their connections", "cap", g.cfg.MaxPeerConns)
		return nil
	}
	g.peerConns++
	g.mu.Unlock()
	return &Conn{Conn: c, g: g, peer: true, counted: true, writeTimeout: g.cfg.WriteTimeout, stall: g.cfg.StallTimeout, console: g.cfg.ConsoleIdle}
}

// Peer moves the connection that the request with context ctx came in on
// from the clients' budget to the peers' (SetPeers), and reports whether
// the connection now counts as a peer's. The pool calls it for a request
// that proved the pool secret: a peer's connection accepted before its
// source address was known as a peer's (the first one after a join, or
// from an address other than the one the pool reaches the peer at) stops
// counting against the clients' caps and is no longer closed as idle to
// make room for them. It does nothing for the local socket, a connection
// the Guard does not count, or when the peers' budget is full.
func Peer(ctx context.Context) bool {
	c, _ := ctx.Value(connKey{}).(*Conn)
	if c == nil {
		return false
	}
	return c.g.promote(c)
}

func (g *Guard) promote(c *Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case c.peer:
		return true
	case !c.counted || c.local || g.peerConns >= g.cfg.MaxPeerConns:
		return false
	}
	if c.idleElem != nil {
		g.idle.Remove(c.idleElem)
		c.idleElem = nil
	}
	g.forgetLocked(c) // out of the clients' counts
	c.peer, c.counted = true, true
	g.peerConns++
	return true
}

func (g *Guard) closeVictims(vs []*Conn) {
	for _, v := range vs {
		g.reclaimed.Add(1)
		_ = v.Conn.Close()
	}
}

// forgetLocked takes c out of the counts (once).
func (g *Guard) forgetLocked(c *Conn) {
	if !c.counted {
		return
	}
	c.counted = false
	if c.peer {
		g.peerConns--
		return
	}
	g.total--
	if !c.local {
		if n := g.perClient[c.key] - 1; n > 0 {
			g.perClient[c.key] = n
		} else {
			delete(g.perClient, c.key)
		}
	}
}

// note logs a refusal at most every few seconds, so that a flood does not
// flood the log too.
func (g *Guard) note(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := g.lastLog.Load()
	if now-last < int64(5*time.Second) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.cfg.Log.Warn(msg, args...)
}

func guardConn(c net.Conn) *Conn {
	for range 4 {
		switch v := c.(type) {
		case *Conn:
			return v
		case *tls.Conn:
			c = v.NetConn()
		case *hijacked:
			c = v.Conn
		default:
			return nil
		}
	}
	return nil
}

// connState keeps the list of idle keep-alive connections.
func (g *Guard) connState(c net.Conn, st http.ConnState) {
	gc := guardConn(c)
	if gc == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if st == http.StateIdle {
		if gc.idleElem == nil && gc.counted && !gc.peer {
			gc.idleElem = g.idle.PushBack(gc)
		}
		return
	}
	if gc.idleElem != nil {
		g.idle.Remove(gc.idleElem)
		gc.idleElem = nil
	}
}

// Conn is an accepted connection: it is counted until closed, and every
// write must make progress within the write timeout.
type Conn struct {
	net.Conn
	g            *Guard
	key          string
	local        bool
	peer         bool // from another host of the pool: counted apart (guarded by g.mu)
	writeTimeout time.Duration
	stall        time.Duration
	console      time.Duration

	// guarded by g.mu
	counted  bool
	idleElem *list.Element

	closeOnce sync.Once
	mu        sync.Mutex
	writeDL   time.Time // the caller's own write deadline, if any
}

// maxChunk is the most written in one go under one deadline, so that a
// large reply to a slow but steady reader is not cut off.
const maxChunk = 256 << 10

// Write gives each chunk of p its own write deadline (the connection's
// write timeout from now, or the caller's deadline if that is sooner).
func (c *Conn) Write(p []byte) (int, error) {
	return inChunks(p, func(chunk []byte) (int, error) {
		dl := time.Now().Add(c.writeTimeout)
		c.mu.Lock()
		if !c.writeDL.IsZero() && c.writeDL.Before(dl) {
			dl = c.writeDL
		}
		c.mu.Unlock()
		c.Conn.SetWriteDeadline(dl)
		return c.Conn.Write(chunk)
	})
}

// inChunks writes p through write in pieces of at most maxChunk bytes,
// stopping at the first error.
func inChunks(p []byte, write func(chunk []byte) (int, error)) (int, error) {
	var n int
	for len(p) > 0 {
		m, err := write(p[:min(len(p), maxChunk)])
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// ReadFrom keeps io.Copy onto the connection going through Write.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) { return copyThroughWrite(c, r) }

// copyThroughWrite copies r to w by w's Write alone, so that io.Copy onto a
// guarded connection cannot go around the deadlines Write sets (by the
// underlying connection's ReadFrom, for instance).
func copyThroughWrite(w io.Writer, r io.Reader) (int64, error) {
	return io.CopyBuffer(writerOnly{w}, r, make([]byte, 64<<10))
}

type writerOnly struct{ io.Writer }

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDL = t
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *Conn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.writeDL = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// shutRead ends reading from the connection (writing still works).
func (c *Conn) shutRead() {
	if cr, ok := c.Conn.(interface{ CloseRead() error }); ok && cr.CloseRead() == nil {
		return
	}
	c.Conn.SetReadDeadline(time.Unix(1, 0))
}

// Close closes the connection and counts it out.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.g.mu.Lock()
		if c.idleElem != nil {
			c.g.idle.Remove(c.idleElem)
			c.idleElem = nil
		}
		c.g.forgetLocked(c)
		c.g.mu.Unlock()
	})
	return c.Conn.Close()
}

// ---- request bodies ----

// ErrSlowBody is the error a request body read gets when the client sends
// it too slowly.
var ErrSlowBody = errors.New("netguard: request body too slow")

// Handler wraps h so that reading a request body has a progress deadline
// and a floor rate (see the package comment). A client that sends its body
// too slowly gets no more of it read: the handler sees ErrSlowBody or a
// timeout and may still answer, then the connection is closed.
//
// The connection gets its first body deadline before the handler runs, not
// at the handler's first read: net/http itself reads the body when a
// handler writes its reply without having read it (up to 256 KiB, to keep
// the connection), and that read must be bounded too.
func (g *Guard) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			gc, _ := r.Context().Value(connKey{}).(*Conn)
			b := &body{rc: r.Body, ctl: http.NewResponseController(w), gc: gc, stall: g.cfg.StallTimeout,
				grace: min(g.cfg.BodyGrace, g.cfg.StallTimeout), rate: g.cfg.MinBodyRate}
			b.ctl.SetReadDeadline(time.Now().Add(b.grace))
			r.Body = b
			defer b.after()
		}
		h.ServeHTTP(w, r)
	})
}

// after runs when the handler returns with the body perhaps not read to
// its end: net/http reads (a bounded amount of) the rest, and that read
// gets what is left of the body's budget, at most the stall timeout.
func (b *body) after() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done && b.err == nil {
		b.ctl.SetReadDeadline(time.Now().Add(max(minWait, min(b.stall, b.budget()))))
	}
}

type body struct {
	rc     io.ReadCloser
	ctl    *http.ResponseController
	gc     *Conn
	stall  time.Duration
	grace  time.Duration
	rate   int64
	mu     sync.Mutex
	got    int64
	waited time.Duration
	done   bool
	err    error
}

// minWait keeps a deadline from being in the past when it is set: the
// server's own read of the connection may start under it.
const minWait = 50 * time.Millisecond

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		return b.rc.Read(p)
	}
	wait := min(b.stall, b.budget())
	if wait < minWait {
		b.drop(ErrSlowBody)
		return 0, ErrSlowBody
	}
	start := time.Now()
	dlErr := b.ctl.SetReadDeadline(start.Add(wait))
	n, err := b.rc.Read(p)
	b.waited += time.Since(start)
	b.got += int64(n)
	if err == nil || dlErr != nil {
		return n, err
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		b.drop(err)
		return n, err
	}
	// At the end of the body the connection goes back to having no read
	// deadline: net/http reads it in the background to notice a client
	// that goes away, and that read must not time out during a long poll.
	b.done = true
	b.ctl.SetReadDeadline(time.Time{})
	return n, err
}

// budget is how much longer the body may be waited for: the time spent
// waiting for it may not exceed the grace plus what the bytes received so
// far buy at the floor rate.
func (b *body) budget() time.Duration {
	return b.grace + time.Duration(float64(b.got)/float64(b.rate)*float64(time.Second)) - b.waited
}

// drop stops reading from a client that sends too slowly: reads of the
// connection end at once, the reply can still be written, and net/http
// then closes the connection.
func (b *body) drop(err error) {
	b.err = err
	if b.gc == nil {
		b.ctl.SetReadDeadline(time.Unix(1, 0))
		return
	}
	b.gc.shutRead()
}

func (b *body) Close() error { return b.rc.Close() }

// ---- hijacked connections ----

// hijacked is a connection taken over from net/http: reads come from the
// server's buffered reader, and each read or write that makes progress
// pushes the deadline of both directions out by the stall timeout, so a
// transfer that stops in both directions for that long is dropped.
type hijacked struct {
	net.Conn
	r      io.Reader
	stall  time.Duration
	last   atomic.Int64 // when the deadline was last pushed (unix nanos)
	manual atomic.Bool  // the caller set a deadline of its own
}

// Transfer wraps a connection taken over from net/http (with the buffered
// reader Hijack returned, if any) for a transfer such as an import or a CLI
// conversation: it is dropped once no byte has moved either way for the
// stall timeout of the listener it came from (Defaults' outside a Guard).
func Transfer(c net.Conn, buffered *bufio.Reader) net.Conn {
	d := Defaults().StallTimeout
	if gc := guardConn(c); gc != nil {
		d = gc.stall
	}
	return wrapHijacked(c, buffered, d)
}

// Interactive is Transfer for a console, where a person may look at a
// screen that does not change: the bound is the console idle timeout.
func Interactive(c net.Conn, buffered *bufio.Reader) net.Conn {
	d := Defaults().ConsoleIdle
	if gc := guardConn(c); gc != nil {
		d = gc.console
	}
	return wrapHijacked(c, buffered, d)
}

// StallTimeout is the stall timeout that applies to a connection.
func StallTimeout(c net.Conn) time.Duration {
	if gc := guardConn(c); gc != nil {
		return gc.stall
	}
	return Defaults().StallTimeout
}

func wrapHijacked(c net.Conn, buffered *bufio.Reader, d time.Duration) net.Conn {
	h := &hijacked{Conn: c, r: c, stall: d}
	if buffered != nil {
		h.r = buffered
	}
	h.push(true)
	return h
}

// push moves the deadline out, at most every 1/16 of the stall timeout
// (a deadline costs a timer update).
func (h *hijacked) push(force bool) {
	if h.manual.Load() {
		return
	}
	now := time.Now().UnixNano()
	last := h.last.Load()
	if !force && now-last < int64(h.stall/16) {
		return
	}
	if h.last.CompareAndSwap(last, now) || force {
		h.Conn.SetDeadline(time.Unix(0, now).Add(h.stall))
	}
}

func (h *hijacked) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if n > 0 {
		h.push(false)
	}
	return n, err
}

// Write pushes the stall deadline on after each chunk that moved.
func (h *hijacked) Write(p []byte) (int, error) {
	return inChunks(p, func(chunk []byte) (int, error) {
		m, err := h.Conn.Write(chunk)
		if m > 0 {
			h.push(false)
		}
		return m, err
	})
}

// ReadFrom keeps io.Copy onto the connection going through Write.
func (h *hijacked) ReadFrom(r io.Reader) (int64, error) { return copyThroughWrite(h, r) }

// WriteTo keeps io.Copy from the connection going through Read.
func (h *hijacked) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(w, readerOnly{h}, make([]byte, 64<<10))
}

type readerOnly struct{ io.Reader }

// A deadline the caller sets takes the place of the stall deadline until
// the caller clears it again (the zero time), for code that cuts a read
// short to stop a transfer.
func (h *hijacked) SetDeadline(t time.Time) error {
	return h.explicit(t, h.Conn.SetDeadline)
}

func (h *hijacked) SetReadDeadline(t time.Time) error {
	return h.explicit(t, h.Conn.SetReadDeadline)
}

func (h *hijacked) SetWriteDeadline(t time.Time) error {
	return h.explicit(t, h.Conn.SetWriteDeadline)
}

func (h *hijacked) explicit(t time.Time, set func(time.Time) error) error {
	if t.IsZero() {
		h.manual.Store(false)
		h.push(true)
		return nil
	}
	h.manual.Store(true)
	return set(t)
}
