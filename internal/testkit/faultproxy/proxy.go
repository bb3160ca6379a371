// Package faultproxy injects network faults between processes on one
// machine, for the pool fault tests: several toolstackd hosts run as
// separate processes on 127.0.0.2, 127.0.0.3, ... and every link between
// them goes through a proxy that can hold, delay or break the traffic while
// the test runs. It is the user-space stand-in for tc netem and iptables
// (neither is available on the test machines), modelled on the proxy etcd's
// robustness tests put on each peer link.
//
// # One proxy
//
// A Proxy listens on one address and forwards every connection it accepts
// to one target address, copying bytes both ways in chunks of at most
// Config.ChunkSize. What happens to each chunk is decided when it passes,
// by the Fault in force for the connection's source IP address (the
// address the connecting process bound its socket to), so rules changed at
// run time apply at once to connections already open:
//
//	p, err := faultproxy.New(faultproxy.Config{Listen: "127.0.0.2:4431", Target: "127.0.0.2:443"})
//	defer p.Close()
//	p.SetFault(netip.MustParseAddr("127.0.0.3"), faultproxy.Blackhole()) // cut 3 → 2
//	p.SetFault(netip.MustParseAddr("127.0.0.4"), faultproxy.Delay(75*time.Millisecond, 50*time.Millisecond))
//	p.ResetConns()                                                          // break everything open now
//	p.Heal()                                                                // all rules lifted
//
// A source with no rule of its own gets the default fault (SetDefault),
// which starts as Pass; SetAll replaces every rule with one fault for all
// sources.
//
// Identifying peers by source address only works when each host binds its
// outgoing pool connections to its own loopback address (127.0.0.N); a
// connection from an unbound socket comes from 127.0.0.1.
//
// # Faults
//
// Pass forwards. Blackhole holds: the proxy stops reading from and writing
// to the source's connections in both directions and lets new ones wait
// after accept without dialling the target, so the endpoints see what a
// partition looks like (connections open, nothing arriving, writes filling
// the socket buffers), and after the rule is lifted the held bytes are
// delivered in order. Delay adds Delay ± Jitter to every chunk, keeping
// their order. Drop resets the connection (both sides see RST) on a chunk
// with the given probability, which is how packet loss looks to a TCP
// endpoint that cannot retransmit through it. ResetConns and ResetFrom
// reset connections at once.
//
// # Links
//
// A Link builds one proxy in front of each host of a set and speaks in
// host names: Partition(a, b) cuts both directions between two groups,
// Isolate(h) cuts one host from every other, SetLink sets any fault on one
// direction, HealAll lifts everything. See Link.
//
// # Bounds
//
// A proxy holds at most Config.MaxConns connections (more are closed on
// accept and counted in Stats.Refused) and at most QueueChunks+1 chunks of
// ChunkSize bytes per direction of each; a full queue stops the proxy
// reading from that side, so a slow or held receiver slows the sender down
// as TCP would. Every goroutine the proxy starts ends in Close.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes one proxy. Listen and Target are required; the other
// fields have defaults.
type Config struct {
	// Listen is the address the proxy accepts connections on
	// ("127.0.0.2:4431"; port 0 picks a free one, see Proxy.Addr).
	Listen string
	// Target is the address every accepted connection is forwarded to.
	Target string
	// MaxConns bounds the connections held at once (default 128).
	MaxConns int
	// ChunkSize is the largest read forwarded as one chunk (default
	// 16 KiB); faults are decided per chunk.
	ChunkSize int
	// QueueChunks bounds the chunks waiting to be written per direction
	// of a connection, e.g. while delayed (default 8).
	QueueChunks int
	// DialTimeout bounds the connection to the target (default 5 s).
	DialTimeout time.Duration
	// Seed seeds the random jitter and drops, for reproducible runs;
	// 0 picks a random seed.
	Seed uint64
	// KeepSource makes the proxy connect to the target from the client's
	// own source address (any port), so that the target sees which peer
	// it talks to, as without the proxy. Without it the proxy connects
	// from whatever address the system picks.
	KeepSource bool
}

const (
	defaultMaxConns    = 128
	defaultChunkSize   = 16 << 10
	defaultQueueChunks = 8
	defaultDialTimeout = 5 * time.Second

	// Hard limits on the configuration, so that a mistyped number cannot
	// ask for gigabytes.
	maxMaxConns    = 1 << 16
	maxChunkSize   = 1 << 20
	maxQueueChunks = 1 << 10
)

func (c *Config) fill() error {
	if c.Listen == "" || c.Target == "" {
		return errors.New("faultproxy: Listen and Target are required")
	}
	if c.MaxConns < 0 || c.ChunkSize < 0 || c.QueueChunks < 0 || c.DialTimeout < 0 {
		return errors.New("faultproxy: negative limit in Config")
	}
	if c.MaxConns > maxMaxConns || c.ChunkSize > maxChunkSize || c.QueueChunks > maxQueueChunks {
		return fmt.Errorf("faultproxy: limits over the maximum (MaxConns %d, ChunkSize %d, QueueChunks %d)",
			maxMaxConns, maxChunkSize, maxQueueChunks)
	}
	if c.MaxConns == 0 {
		c.MaxConns = defaultMaxConns
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = defaultChunkSize
	}
	if c.QueueChunks == 0 {
		c.QueueChunks = defaultQueueChunks
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = defaultDialTimeout
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64() //nolint:gosec // jitter and drops for tests, not secrets
	}
	return nil
}

// Stats counts what a proxy has done since it started.
type Stats struct {
	Accepted  int64 // connections accepted and forwarded (or held)
	Refused   int64 // connections closed on accept because MaxConns were open
	DialFails int64 // connections closed because the target could not be reached
	Resets    int64 // connections reset: by Drop, ResetConns, ResetFrom, or one side breaking
	Active    int   // connections open now
	Bytes     int64 // bytes written on, both directions
}

// A Proxy forwards connections from one listen address to one target,
// applying the faults in force. Its methods are safe for concurrent use.
type Proxy struct {
	cfg Config
	ln  net.Listener

	mu      sync.Mutex
	rules   map[netip.Addr]Fault
	def     Fault
	changed chan struct{} // closed and replaced whenever a rule changes
	conns   map[*conn]struct{}
	closed  bool

	rngMu sync.Mutex
	rng   *rand.Rand

	done chan struct{} // closed by Close
	wg   sync.WaitGroup

	accepted, refused, dialFails, resets, bytes atomic.Int64
}

// New starts a proxy: it listens on cfg.Listen at once and serves until
// Close.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{
		cfg:     cfg,
		ln:      ln,
		rules:   make(map[netip.Addr]Fault),
		changed: make(chan struct{}),
		conns:   make(map[*conn]struct{}),
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), //nolint:gosec // jitter and drops for tests, not secrets
		done:    make(chan struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the proxy listens on (with the port chosen when
// Config.Listen had port 0).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.cfg.Target }

// SetFault sets the fault for connections from src, replacing any earlier
// rule for it. It applies at once to connections already open.
func (p *Proxy) SetFault(src netip.Addr, f Fault) error {
	if !src.IsValid() {
		return errors.New("faultproxy: invalid source address")
	}
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	p.rules[src.Unmap()] = f
	p.notifyLocked()
	p.mu.Unlock()
	return nil
}

// ClearFault removes the rule for src: its connections get the default
// fault again.
func (p *Proxy) ClearFault(src netip.Addr) {
	p.mu.Lock()
	delete(p.rules, src.Unmap())
	p.notifyLocked()
	p.mu.Unlock()
}

// SetDefault sets the fault for every source without a rule of its own.
func (p *Proxy) SetDefault(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	p.def = f
	p.notifyLocked()
	p.mu.Unlock()
	return nil
}

// SetAll removes every per-source rule and sets f for all sources: the
// global switch.
func (p *Proxy) SetAll(f Fault) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	clear(p.rules)
	p.def = f
	p.notifyLocked()
	p.mu.Unlock()
	return nil
}

// Heal lifts every rule: all sources pass again, and held traffic flows.
func (p *Proxy) Heal() { _ = p.SetAll(Pass) }

// FaultFor returns the fault in force for connections from src.
func (p *Proxy) FaultFor(src netip.Addr) Fault {
	f, _ := p.faultFor(src.Unmap())
	return f
}

// ResetConns resets every connection open now (both sides see RST); new
// connections are accepted as before.
func (p *Proxy) ResetConns() int { return p.resetWhere(func(netip.Addr) bool { return true }) }

// ResetFrom resets the open connections from src and returns how many.
func (p *Proxy) ResetFrom(src netip.Addr) int {
	src = src.Unmap()
	return p.resetWhere(func(a netip.Addr) bool { return a == src })
}

func (p *Proxy) resetWhere(match func(netip.Addr) bool) int {
	p.mu.Lock()
	var victims []*conn
	for c := range p.conns {
		if match(c.src) {
			victims = append(victims, c)
		}
	}
	p.mu.Unlock()
	n := 0
	for _, c := range victims {
		if c.reset() {
			n++
		}
	}
	return n
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	active := len(p.conns)
	p.mu.Unlock()
	return Stats{
		Accepted:  p.accepted.Load(),
		Refused:   p.refused.Load(),
		DialFails: p.dialFails.Load(),
		Resets:    p.resets.Load(),
		Active:    active,
		Bytes:     p.bytes.Load(),
	}
}

// Close stops listening, closes every connection and waits until all the
// proxy's goroutines have ended. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.abort()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// faultFor returns the fault for src and a channel closed at the next rule
// change, read together so a change between the two cannot be missed.
func (p *Proxy) faultFor(src netip.Addr) (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, ok := p.rules[src]
	if !ok {
		f = p.def
	}
	return f, p.changed
}

// roll reports whether a chunk is dropped with probability prob.
func (p *Proxy) roll(prob float64) bool {
	if prob <= 0 {
		return false
	}
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return p.rng.Float64() < prob
}

// delayOf draws one chunk's delay from f.
func (p *Proxy) delayOf(f Fault) time.Duration {
	if f.Delay <= 0 {
		return 0
	}
	if f.Jitter <= 0 {
		return f.Delay
	}
	p.rngMu.Lock()
	defer p.rngMu.Unlock()
	return f.Delay - f.Jitter + time.Duration(p.rng.Int64N(int64(2*f.Jitter)+1))
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary trouble (out of file descriptors): wait a little
			// rather than spin, unless closing.
			select {
			case <-p.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		p.admit(nc)
	}
}

func (p *Proxy) admit(nc net.Conn) {
	var src netip.Addr
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		src = ta.AddrPort().Addr().Unmap()
	}
	p.mu.Lock()
	if p.closed || len(p.conns) >= p.cfg.MaxConns {
		p.mu.Unlock()
		p.refused.Add(1)
		_ = nc.Close()
		return
	}
	c := &conn{p: p, src: src, client: nc, done: make(chan struct{})}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	p.accepted.Add(1)
	go c.run()
}

func (p *Proxy) forget(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// conn is one forwarded connection.
type conn struct {
	p      *Proxy
	src    netip.Addr
	client net.Conn

	mu     sync.Mutex
	server net.Conn // nil until dialled

	once sync.Once
	done chan struct{} // closed when the connection is torn down
}

// chunk is one read on its way to the other side.
type chunk struct {
	buf []byte
	n   int
	due time.Time
}

func (c *conn) run() {
	defer c.p.wg.Done()
	defer c.p.forget(c)
	defer c.abort()

	// A new connection from a blackholed source waits, accepted and
	// silent, without reaching the target.
	if _, ok := c.hold(); !ok {
		return
	}
	// The dial gives up at DialTimeout or as soon as the connection is
	// torn down (Close, ResetConns).
	ctx, cancel := context.WithTimeout(context.Background(), c.p.cfg.DialTimeout)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	if c.p.cfg.KeepSource && c.src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: c.src.AsSlice()}
	}
	server, err := d.DialContext(ctx, "tcp", c.p.cfg.Target)
	cancel()
	<-watched
	if err != nil {
		c.p.dialFails.Add(1)
		return
	}
	c.mu.Lock()
	select {
	case <-c.done:
		c.mu.Unlock()
		_ = server.Close()
		return
	default:
	}
	c.server = server
	c.mu.Unlock()

	var dirs sync.WaitGroup
	dirs.Add(2)
	go c.direction(c.client, server, &dirs)
	go c.direction(server, c.client, &dirs)
	dirs.Wait()
}

// direction forwards from → to until from reaches EOF (then half-closes
// to) or something fails (then the whole connection goes).
func (c *conn) direction(from, to net.Conn, dirs *sync.WaitGroup) {
	defer dirs.Done()
	queue := make(chan chunk, c.p.cfg.QueueChunks+1)
	free := make(chan []byte, c.p.cfg.QueueChunks+1)
	for range c.p.cfg.QueueChunks + 1 {
		free <- nil // a slot; the buffer is allocated on first use
	}
	var wrote sync.WaitGroup
	wrote.Add(1)
	var writeOK atomic.Bool
	go func() {
		defer wrote.Done()
		writeOK.Store(c.writer(to, queue, free))
	}()

	readEOF := c.reader(from, queue, free)
	close(queue)
	wrote.Wait()
	if readEOF && writeOK.Load() {
		// The end of the stream is held by a blackhole like its bytes.
		if _, ok := c.hold(); !ok {
			return
		}
		if hc, ok := to.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		return
	}
	// A broken side (or a teardown already under way, where this does
	// nothing) breaks the whole connection, as a reset would end-to-end.
	c.reset()
}

// reader reads chunks and queues them; it returns true at a clean EOF.
func (c *conn) reader(from net.Conn, queue chan<- chunk, free chan []byte) bool {
	var last time.Time
	for {
		var buf []byte
		select {
		case buf = <-free:
		case <-c.done:
			return false
		}
		if buf == nil {
			buf = make([]byte, c.p.cfg.ChunkSize)
		}
		n, err := from.Read(buf)
		if n > 0 {
			f, ok := c.hold()
			if !ok {
				return false
			}
			if c.p.roll(f.Drop) {
				c.reset()
				return false
			}
			due := time.Now().Add(c.p.delayOf(f))
			if due.Before(last) {
				due = last
			}
			last = due
			queue <- chunk{buf: buf, n: n, due: due} // never blocks: one slot per free buffer
		} else {
			free <- buf
		}
		if err != nil {
			return errors.Is(err, io.EOF)
		}
	}
}

// writer writes queued chunks when they are due; it returns false if it
// stopped on an error or teardown.
func (c *conn) writer(to net.Conn, queue <-chan chunk, free chan<- []byte) bool {
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for ch := range queue {
		if wait := time.Until(ch.due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-c.done:
				return false
			}
		}
		// A blackhole set while the chunk waited holds it here too.
		if _, ok := c.hold(); !ok {
			return false
		}
		if _, err := to.Write(ch.buf[:ch.n]); err != nil {
			c.reset()
			return false
		}
		c.p.bytes.Add(int64(ch.n))
		free <- ch.buf
	}
	return true
}

// hold waits while the connection's source is blackholed and returns the
// fault in force then; false means the connection was torn down.
func (c *conn) hold() (Fault, bool) {
	for {
		f, changed := c.p.faultFor(c.src)
		if !f.Blackhole {
			select {
			case <-c.done:
				return f, false
			default:
				return f, true
			}
		}
		select {
		case <-changed:
		case <-c.done:
			return f, false
		}
	}
}

// abort tears the connection down with an orderly close of both sides.
func (c *conn) abort() { _ = c.teardown(false) }

// reset tears the connection down with RST on both sides.
// reset tears the connection down with RST and reports whether this call
// did it (a connection reset or closed before, still on its way out of the
// table, does not count again).
func (c *conn) reset() bool { return c.teardown(true) }

func (c *conn) teardown(rst bool) bool {
	did := false
	c.once.Do(func() {
		did = true
		if rst {
			c.p.resets.Add(1)
		}
		c.mu.Lock()
		close(c.done)
		server := c.server
		c.mu.Unlock()
		for _, nc := range []net.Conn{c.client, server} {
			if nc == nil {
				continue
			}
			if tc, ok := nc.(*net.TCPConn); ok && rst {
				_ = tc.SetLinger(0)
			}
			_ = nc.Close()
		}
	})
	return did
}
