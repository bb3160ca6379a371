package netguard

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve runs h behind a Guard on a loopback listener.
func serve(t *testing.T, cfg Config, h http.Handler) (*Guard, string) {
	t.Helper()
	g := New(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := g.Server(h)
	go hs.Serve(g.Listener(l, false))
	t.Cleanup(func() { hs.Close() })
	return g, l.Addr().String()
}

func fast() Config {
	return Config{HeaderTimeout: 500 * time.Millisecond, IdleTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		StallTimeout: 500 * time.Millisecond, ConsoleIdle: 500 * time.Millisecond, MinBodyRate: 100, MaxConnsPerClient: 4, MaxConns: 100}
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	io.WriteString(w, "hello")
})

// get sends one request on c and reads the reply; it reports whether one came.
func get(c net.Conn) bool { return getPath(c, "/") }

// getPath is get for path: whether a 200 came.
func getPath(c net.Conn, path string) bool {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == 200
}

// closedWithin waits for the server to close c and returns how long it took.
func closedWithin(t *testing.T, c net.Conn, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(bound + 2*time.Second))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open after %v (bound %v)", took, bound)
	}
	if took > bound {
		t.Fatalf("closed after %v, bound %v", took, bound)
	}
	return took
}

// closedAmong counts the connections the server closes within bound,
// reading them all at once.
func closedAmong(conns []net.Conn, bound time.Duration) int {
	deadline := time.Now().Add(bound)
	closed := make(chan bool, len(conns))
	for _, c := range conns {
		go func() {
			_ = c.SetReadDeadline(deadline)
			_, err := io.Copy(io.Discard, c)
			ne, ok := err.(net.Error)
			closed <- !(ok && ne.Timeout())
		}()
	}
	n := 0
	for range conns {
		if <-closed {
			n++
		}
	}
	return n
}

func TestPerClientCap(t *testing.T) {
	g, addr := serve(t, fast(), hello)
	var ok, refused int
	var conns []net.Conn
	for range 7 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if get(c) {
			ok++
		} else {
			refused++
		}
	}
	if ok != 4 || refused != 3 {
		t.Fatalf("served %d, refused %d; want 4 and 3", ok, refused)
	}
	if s := g.Stats(); s.RefusedClient != 3 || s.Open != 4 {
		t.Fatalf("stats %+v", s)
	}
	// Closing one makes room for one more.
	conns[0].Close()
	waitFor(t, func() bool { return g.Stats().Open == 3 })
	c, _ := net.Dial("tcp", addr)
	defer c.Close()
	if !get(c) {
		t.Fatal("no room after a connection closed")
	}
	for _, c := range conns {
		c.Close()
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not reached")
}

// Near the global cap, new connections close the longest-idle ones; at the
// cap with nothing idle, new connections are refused.
func TestGlobalCapReclaimsIdle(t *testing.T) {
	cfg := fast()
	cfg.MaxConns, cfg.MaxConnsPerClient, cfg.IdleTimeout = 10, 100, time.Minute
	g, addr := serve(t, cfg, hello)
	var conns []net.Conn
	// Up to 90% of the cap nothing is reclaimed.
	for range 9 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if !get(c) {
			t.Fatal("refused below the cap")
		}
		conns = append(conns, c)
	}
	waitFor(t, func() bool { return g.Stats().Idle == 9 })
	if s := g.Stats(); s.Reclaimed != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Five more: each closes an idle one (the oldest first).
	for range 5 {
		c, _ := net.Dial("tcp", addr)
		if !get(c) {
			t.Fatal("a new client was refused although idle connections could be closed")
		}
		conns = append(conns, c)
	}
	if s := g.Stats(); s.Open != 9 || s.Reclaimed != 5 {
		t.Fatalf("stats %+v", s)
	}
	// Five of the nine idle ones are closed. (Which five is the oldest
	// idle first; under load the server may mark one idle a little after
	// the next, so the test does not insist on exactly the first five.)
	if n := closedAmong(conns[:9], time.Second); n != 5 {
		t.Fatalf("%d of the 9 idle connections closed within 1s, want 5", n)
	}
	// Now hold every slot busy (mid-header): nothing to reclaim, refusal.
	for _, c := range conns {
		c.Close()
	}
	waitFor(t, func() bool { return g.Stats().Open == 0 })
	var busy []net.Conn
	for range 10 {
		c, _ := net.Dial("tcp", addr)
		io.WriteString(c, "GET / HTTP/1.1\r\n")
		busy = append(busy, c)
	}
	waitFor(t, func() bool { return g.Stats().Open == 10 })
	c, _ := net.Dial("tcp", addr)
	if get(c) {
		t.Fatal("served over the cap")
	}
	if s := g.Stats(); s.RefusedFull < 1 || s.Open != 10 {
		t.Fatalf("stats %+v", s)
	}
	for _, c := range busy {
		c.Close()
	}
}

func TestLocalListenerExemptFromClientCap(t *testing.T) {
	cfg := fast()
	cfg.MaxConnsPerClient = 1
	g := New(cfg)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	hs := g.Server(hello)
	go hs.Serve(g.Listener(l, true))
	defer hs.Close()
	for range 3 {
		c, _ := net.Dial("tcp", l.Addr().String())
		defer c.Close()
		if !get(c) {
			t.Fatal("local connection refused")
		}
	}
}

func TestTimeouts(t *testing.T) {
	longPoll := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if r.URL.Path == "/wait" {
			// Silent for four stall/write/idle timeouts, then the reply.
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "got %d", len(b))
	})
	_, addr := serve(t, fast(), longPoll)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Each is closed after its 500 ms timeout on a quiet machine; the
	// defaults (30 s and more) would keep it open far longer.
	bound := 10 * 500 * time.Millisecond
	t.Run("silent", func(t *testing.T) {
		closedWithin(t, dial(), bound)
	})
	t.Run("slow header", func(t *testing.T) {
		c := dial()
		go func() {
			for _, b := range []byte("GET / HTTP/1.1\r\nHost: x\r\n") {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		closedWithin(t, c, bound)
	})
	t.Run("idle", func(t *testing.T) {
		c := dial()
		if !get(c) {
			t.Fatal("no reply")
		}
		closedWithin(t, c, bound)
	})
	t.Run("stalled body", func(t *testing.T) {
		c := dial()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
		closedWithin(t, c, bound)
	})
	t.Run("trickled body", func(t *testing.T) {
		// 20 bytes a second keeps every read under the stall timeout but
		// is below the floor rate: dropped after the allowance.
		c := dial()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
			}
		}()
		closedWithin(t, c, bound)
	})
	t.Run("moving body", func(t *testing.T) {
		// 400 bytes a second for 1.5 s: above the floor, served. The
		// stall bound is ten times the writes' gap plus slack, so that a
		// busy machine's late wake-up is not a stall.
		cfg := fast()
		cfg.StallTimeout = 5 * time.Second
		_, addr := serve(t, cfg, longPoll)
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 600\r\n\r\n")
		for range 30 {
			c.Write([]byte(strings.Repeat("y", 20)))
			time.Sleep(50 * time.Millisecond)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "got 600" {
			t.Fatalf("reply %q", b)
		}
	})
	t.Run("long poll", func(t *testing.T) {
		// A request that waits longer than every timeout still gets its
		// reply, and the connection stays usable.
		c := dial()
		io.WriteString(c, "POST /wait HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "got 3" {
			t.Fatalf("reply %q", b)
		}
	})
}

// A client that stops reading a large reply is dropped after the write
// timeout; the handler's write fails.
func TestWriteStall(t *testing.T) {
	res := make(chan error, 1)
	big := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1<<20)
		for range 256 {
			if _, err := w.Write(buf); err != nil {
				res <- err
				return
			}
		}
		res <- nil
	})
	_, addr := serve(t, fast(), big)
	c, _ := net.Dial("tcp", addr)
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	start := time.Now()
	select {
	case err := <-res:
		if err == nil {
			t.Fatal("256 MiB written to a client that reads nothing")
		}
		// 500 ms on a quiet machine; the default is a minute.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("write failed after %v", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("write still blocked")
	}
}

// A hijacked transfer is dropped when nothing moves either way for the
// stall timeout; one that moves slowly is not; a deadline the handler sets
// itself still cuts a read short.
func TestHijackedStall(t *testing.T) {
	var moved atomic.Int64
	res := make(chan error, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			res <- err
			return
		}
		c := Transfer(raw, rw.Reader)
		defer c.Close()
		c.SetDeadline(time.Time{})
		io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
		if r.URL.Path == "/abort" {
			go func() { time.Sleep(100 * time.Millisecond); c.SetReadDeadline(time.Now()) }()
		}
		n, err := io.Copy(io.Discard, c)
		moved.Store(n)
		res <- err
	})
	_, addr := serve(t, fast(), h)
	// The abort is checked where the stall timeout is a minute, so that
	// only the handler's own deadline can cut it short.
	long := fast()
	long.StallTimeout = time.Minute
	_, longAddr := serve(t, long, h)
	run := func(addr, path string, feed func(net.Conn)) (time.Duration, error) {
		c, _ := net.Dial("tcp", addr)
		defer c.Close()
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		start := time.Now()
		go feed(c)
		select {
		case err := <-res:
			return time.Since(start), err
		case <-time.After(10 * time.Second):
			t.Fatal("transfer not dropped")
		}
		return 0, nil
	}
	// Dropped after the 500 ms stall timeout on a quiet machine.
	took, err := run(addr, "/", func(net.Conn) {})
	if !isTimeout(err) || took > 5*time.Second {
		t.Fatalf("stalled transfer: %v after %v", err, took)
	}
	// 24 writes 50 ms apart (slower than nothing, each well within the
	// stall timeout) then silence: runs 1.2 s, longer than one stall
	// timeout, then dropped.
	took, err = run(addr, "/", func(c net.Conn) {
		for range 24 {
			c.Write([]byte("data"))
			time.Sleep(50 * time.Millisecond)
		}
	})
	if !isTimeout(err) || took < 1200*time.Millisecond || moved.Load() != 96 {
		t.Fatalf("slow transfer: %v after %v, %d bytes", err, took, moved.Load())
	}
	// The handler's deadline cuts the read 100 ms in on a quiet machine.
	took, err = run(longAddr, "/abort", func(net.Conn) {})
	if !isTimeout(err) || took > 5*time.Second {
		t.Fatalf("abort: %v after %v", err, took)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestMaxConnsForLimit(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{{1024, 512}, {20000, 18000}, {1 << 20, 943719}, {100, 64}, {0, 943719}} {
		if got := MaxConnsForLimit(c.limit); got != c.want {
			t.Errorf("MaxConnsForLimit(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
}

// Issue 29, finding 3: a client flood held every connection a host would
// take, and its peers' lease renewals and raft with them. Connections
// from the pool's other hosts are counted apart, within a budget of their
// own: clients holding every slot leave a peer's next connection served,
// and peers cannot take clients' slots either.
func TestPeersHaveTheirOwnBudget(t *testing.T) {
	cfg := fast()
	cfg.MaxConns, cfg.MaxConnsPerClient, cfg.MaxPeerConns, cfg.HeaderTimeout = 6, 100, 2, time.Minute
	g := New(cfg)
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := g.Server(hello)
	go hs.Serve(g.Listener(l, false))
	t.Cleanup(func() { hs.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	peer := netip.MustParseAddr("127.0.0.7")
	g.SetPeers(func(a netip.Addr) bool { return a == peer })
	dialFrom := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A slow-header flood from clients fills the cap.
	for range 6 {
		c := dialFrom("127.0.0.5")
		io.WriteString(c, "GET / HTTP/1.1\r\n")
	}
	waitFor(t, func() bool { return g.Stats().Open == 6 })
	if get(dialFrom("127.0.0.6")) {
		t.Fatal("a client was served over the cap")
	}
	// The peer is served, twice at once, and a third peer connection is
	// over the peers' budget.
	p1, p2 := dialFrom("127.0.0.7"), dialFrom("127.0.0.7")
	if !get(p1) || !get(p2) {
		t.Fatal("a peer was refused while clients held every slot")
	}
	if get(dialFrom("127.0.0.7")) {
		t.Fatal("a peer was served over the peers' budget")
	}
	if s := g.Stats(); s.Peers != 2 || s.Open != 6 || s.RefusedPeer != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Idle peer connections are not reclaimed for clients.
	waitFor(t, func() bool { return g.Stats().Idle == 0 && g.Stats().Peers == 2 })
	p1.Close()
	waitFor(t, func() bool { return g.Stats().Peers == 1 })
}

// A connection accepted as a client's moves to the peers' budget once a
// request on it proves to be a peer's (Peer): it no longer counts
// against the clients' cap and is not closed as idle to make room.
func TestPeerMovesAConnection(t *testing.T) {
	cfg := fast()
	cfg.MaxConns, cfg.MaxConnsPerClient, cfg.MaxPeerConns, cfg.HeaderTimeout, cfg.IdleTimeout = 4, 100, 1, time.Minute, time.Minute
	g := New(cfg)
	moved := make(chan bool, 4)
	hs := g.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/peer" {
			moved <- Peer(r.Context())
		}
		hello(w, r)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(g.Listener(l, false))
	t.Cleanup(func() { hs.Close() })
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	p, q := dial(), dial()
	if !getPath(p, "/peer") || !<-moved {
		t.Fatal("the first connection was not moved to the peers' budget")
	}
	if !getPath(q, "/peer") || <-moved {
		t.Fatal("a connection was moved over the peers' budget")
	}
	waitFor(t, func() bool { s := g.Stats(); return s.Peers == 1 && s.Open == 1 && s.Idle == 1 })
	// Clients fill the cap with slow heads: the client connection left
	// idle is closed to make room, the moved one is not.
	for range 4 {
		io.WriteString(dial(), "GET / HTTP/1.1\r\n")
	}
	waitFor(t, func() bool { s := g.Stats(); return s.Open == 4 && s.Reclaimed == 1 })
	if !getPath(p, "/") {
		t.Fatal("the moved connection was closed for clients")
	}
	if getPath(q, "/") {
		t.Fatal("the idle client connection was kept at the cap")
	}
	if Peer(context.Background()) {
		t.Fatal("Peer without a connection")
	}
	p.Close()
	waitFor(t, func() bool { return g.Stats().Peers == 0 })
}

// The per-client cap counts an IPv6 /64 as one client.
func TestClientKeyIPv6Prefix(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"[2001:db8:1:2:aaaa::1]:80", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:80", "2001:db8:1:2::/64"},
		{"[::ffff:10.0.0.1]:80", "10.0.0.1"},
		{"10.0.0.1:80", "10.0.0.1"},
	} {
		a, err := net.ResolveTCPAddr("tcp", c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := clientKey(fakeConn{remote: a}); got != c.want {
			t.Errorf("clientKey(%s) = %s, want %s", c.addr, got, c.want)
		}
	}
}

type fakeConn struct {
	net.Conn
	remote net.Addr
}

func (f fakeConn) RemoteAddr() net.Addr { return f.remote }
