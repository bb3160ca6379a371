package faultproxy

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"math"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	lo1 = netip.MustParseAddr("127.0.0.1")
	lo2 = netip.MustParseAddr("127.0.0.2")
	lo3 = netip.MustParseAddr("127.0.0.3")
	lo4 = netip.MustParseAddr("127.0.0.4")
)

// noLeak records the goroutine count and, at cleanup, waits for it to come
// back down (goroutines of closed connections take a moment to end).
func noLeak(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			now := runtime.NumGoroutine()
			if now <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Errorf("goroutines: %d before, %d after\n%s", before, now, buf[:n])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// echoServer is a real TCP echo server on loopback.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup
	mu sync.Mutex
	cs []net.Conn
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs = append(s.cs, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_, _ = io.Copy(c, c)
				if tc, ok := c.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) addr() string { return s.ln.Addr().String() }

func (s *echoServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.cs {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func newProxy(t *testing.T, target string, mod func(*Config)) *Proxy {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", Target: target, Seed: 1}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// dialFrom connects to addr from source address src, skipping the test if
// the kernel does not let it bind there.
func dialFrom(t *testing.T, src netip.Addr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		if src != lo1 && strings.Contains(err.Error(), "bind") {
			t.Skipf("cannot bind source %v: %v", src, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads it back within timeout.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

// nothingWithin asserts that a read on c yields nothing for d.
func nothingWithin(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	_ = c.SetReadDeadline(time.Time{})
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("expected silence, got %d bytes %q, err %v", n, buf[:n], err)
	}
}

func readExactly(t *testing.T, c net.Conn, want string, timeout time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	got := make([]byte, len(want))
	_, err := io.ReadFull(c, got)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

func TestEchoThroughProxy(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), func(c *Config) { c.ChunkSize = 4096 })
	c := dialFrom(t, lo1, p.Addr())
	if err := roundTrip(c, []byte("hello"), 2*time.Second); err != nil {
		t.Fatal(err)
	}

	// 1 MiB both ways with a half-close at the end: every byte arrives in
	// order and the EOF passes through.
	big := make([]byte, 1<<20)
	_, _ = rand.Read(big)
	c2 := dialFrom(t, lo1, p.Addr())
	go func() {
		_, _ = c2.Write(big)
		_ = c2.(*net.TCPConn).CloseWrite()
	}()
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c2)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("1 MiB echo: %d bytes, equal %v, err %v", len(got), bytes.Equal(got, big), err)
	}
	if st := p.Stats(); st.Accepted != 2 || st.Bytes < 2<<20 {
		t.Fatalf("stats %+v", st)
	}
	_ = c.Close()
	_ = c2.Close()
	echo.close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// controlled is a target whose server-side connections the test holds.
func controlled(t *testing.T) (net.Listener, func(time.Duration) net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(conns)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		for c := range conns {
			_ = c.Close()
		}
	})
	next := func(d time.Duration) net.Conn {
		select {
		case c := <-conns:
			t.Cleanup(func() { _ = c.Close() })
			return c
		case <-time.After(d):
			return nil
		}
	}
	return ln, next
}

func TestBlackholeHoldsBothWaysAndHeals(t *testing.T) {
	noLeak(t)
	ln, accept := controlled(t)
	p := newProxy(t, ln.Addr().String(), nil)

	client := dialFrom(t, lo1, p.Addr())
	server := accept(2 * time.Second)
	if server == nil {
		t.Fatal("proxy did not connect to the target")
	}
	_, _ = client.Write([]byte("ping"))
	readExactly(t, server, "ping", 2*time.Second)

	if err := p.SetFault(lo1, Blackhole()); err != nil {
		t.Fatal(err)
	}
	// Existing connection, both directions: nothing passes, nothing closes.
	_, _ = client.Write([]byte("c2s"))
	_, _ = server.Write([]byte("s2c"))
	nothingWithin(t, server, 300*time.Millisecond)
	nothingWithin(t, client, 300*time.Millisecond)
	// A new connection is accepted but never reaches the target.
	client2 := dialFrom(t, lo1, p.Addr())
	_, _ = client2.Write([]byte("new"))
	if c := accept(300 * time.Millisecond); c != nil {
		t.Fatal("a new connection reached the target through a blackhole")
	}
	if st := p.Stats(); st.Active != 2 || st.Resets != 0 {
		t.Fatalf("stats under blackhole %+v", st)
	}

	p.Heal()
	// The held bytes arrive, in order, on the existing connection...
	readExactly(t, server, "c2s", 2*time.Second)
	readExactly(t, client, "s2c", 2*time.Second)
	// ...and the waiting connection now reaches the target with its bytes.
	server2 := accept(2 * time.Second)
	if server2 == nil {
		t.Fatal("held connection did not reach the target after heal")
	}
	readExactly(t, server2, "new", 2*time.Second)
	_, _ = server2.Write([]byte("ok"))
	readExactly(t, client2, "ok", 2*time.Second)
}

func TestDelayWithinBounds(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), nil)
	const d, j = 40 * time.Millisecond, 20 * time.Millisecond
	if err := p.SetDefault(Delay(d, j)); err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, lo1, p.Addr())
	var lo, hi time.Duration = math.MaxInt64, 0
	for i := range 10 {
		start := time.Now()
		if err := roundTrip(c, []byte{byte(i)}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		rtt := time.Since(start)
		lo, hi = min(lo, rtt), max(hi, rtt)
	}
	// One delay each way per round trip.
	if lo < 2*(d-j) {
		t.Fatalf("round trip %v shorter than the minimum delay %v", lo, 2*(d-j))
	}
	// 120 ms at the most on a quiet machine; ten times that is far over.
	if hi > 10*2*(d+j) {
		t.Fatalf("round trip %v far over the maximum delay %v", hi, 2*(d+j))
	}
	t.Logf("round trips %v .. %v for %v±%v each way", lo, hi, d, j)

	// With jitter larger than the gap between writes the order still
	// holds: many small writes come back as the same stream.
	if err := p.SetDefault(Delay(20*time.Millisecond, 20*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for i := range 200 {
		want.WriteString(strings.Repeat(string(rune('a'+i%26)), 1+i%7))
	}
	go func() {
		for _, b := range want.Bytes() {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	readExactly(t, c, want.String(), 20*time.Second)

	// Lifting the delay takes effect on the open connection.
	p.Heal()
	start := time.Now()
	if err := roundTrip(c, []byte("fast"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt >= 2*(d-j) {
		t.Logf("round trip after heal %v (loaded machine?)", rtt)
	}
}

func TestDropResets(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), nil)
	if err := p.SetDefault(Drop(1)); err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, lo1, p.Addr())
	err := roundTrip(c, []byte("x"), 2*time.Second)
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("drop 1.0: want the connection broken, got %v", err)
	}
	if st := p.Stats(); st.Resets != 1 {
		t.Fatalf("stats %+v", st)
	}

	// Half the chunks: of many connections some break and some live.
	if err := p.SetDefault(Drop(0.5)); err != nil {
		t.Fatal(err)
	}
	ok, broken := 0, 0
	for range 40 {
		c := dialFrom(t, lo1, p.Addr())
		if err := roundTrip(c, []byte("y"), 2*time.Second); err != nil {
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("drop timed out instead of breaking: %v", err)
			}
			broken++
		} else {
			ok++
		}
		_ = c.Close()
	}
	if ok == 0 || broken == 0 {
		t.Fatalf("drop 0.5: %d ok, %d broken", ok, broken)
	}
	t.Logf("drop 0.5 over 40 round trips: %d ok, %d broken", ok, broken)
}

func TestPerSourceRules(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), nil)
	a := dialFrom(t, lo2, p.Addr())
	b := dialFrom(t, lo3, p.Addr())
	if err := p.SetFault(lo2, Blackhole()); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(b, []byte("b passes"), 2*time.Second); err != nil {
		t.Fatalf("source 127.0.0.3 should pass: %v", err)
	}
	_, _ = a.Write([]byte("a held"))
	nothingWithin(t, a, 300*time.Millisecond)
	if f := p.FaultFor(lo2); !f.Blackhole {
		t.Fatalf("FaultFor(127.0.0.2) = %v", f)
	}
	if f := p.FaultFor(lo3); f != Pass {
		t.Fatalf("FaultFor(127.0.0.3) = %v", f)
	}

	// The global switch overrides the per-source rules...
	if err := p.SetAll(Blackhole()); err != nil {
		t.Fatal(err)
	}
	_, _ = b.Write([]byte("b held"))
	nothingWithin(t, b, 300*time.Millisecond)
	// ...and ResetFrom touches one source only.
	if n := p.ResetFrom(lo3); n != 1 {
		t.Fatalf("ResetFrom reset %d connections", n)
	}
	p.Heal()
	readExactly(t, a, "a held", 2*time.Second)
	if err := roundTrip(dialFrom(t, lo3, p.Addr()), []byte("again"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestResetConnsAndLimits(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), func(c *Config) { c.MaxConns = 2 })
	c1 := dialFrom(t, lo1, p.Addr())
	c2 := dialFrom(t, lo1, p.Addr())
	for _, c := range []net.Conn{c1, c2} {
		if err := roundTrip(c, []byte("up"), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// A third connection is over the limit: closed at once.
	c3 := dialFrom(t, lo1, p.Addr())
	_ = c3.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c3.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("connection over MaxConns: read %d, %v", n, err)
	}
	if st := p.Stats(); st.Refused != 1 || st.Active != 2 {
		t.Fatalf("stats %+v", st)
	}

	if n := p.ResetConns(); n != 2 {
		t.Fatalf("ResetConns reset %d", n)
	}
	for _, c := range []net.Conn{c1, c2} {
		if err := roundTrip(c, []byte("gone"), 2*time.Second); err == nil {
			t.Fatal("connection survived ResetConns")
		}
	}
	// New connections are served again once the old ones are gone.
	deadline := time.Now().Add(2 * time.Second)
	for p.Stats().Active != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := roundTrip(dialFrom(t, lo1, p.Addr()), []byte("new"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestKeepSource(t *testing.T) {
	noLeak(t)
	ln, accept := controlled(t)
	for _, keep := range []bool{false, true} {
		p := newProxy(t, ln.Addr().String(), func(c *Config) { c.KeepSource = keep })
		client := dialFrom(t, lo2, p.Addr())
		server := accept(2 * time.Second)
		if server == nil {
			t.Fatal("no connection to the target")
		}
		from := server.RemoteAddr().(*net.TCPAddr).AddrPort().Addr()
		if (from == lo2) != keep {
			t.Errorf("KeepSource %v: target sees %v", keep, from)
		}
		_ = client.Close()
		_ = p.Close()
	}
}

func TestTargetDown(t *testing.T) {
	noLeak(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p := newProxy(t, addr, nil)
	c := dialFrom(t, lo1, p.Addr())
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read through a proxy to nothing: %d, %v", n, err)
	}
	if st := p.Stats(); st.DialFails != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCloseLeaksNothing closes a proxy with connections in every state:
// forwarding, held by a blackhole before and after dialling, with chunks
// waiting out a long delay, and a client still writing.
func TestCloseLeaksNothing(t *testing.T) {
	noLeak(t)
	echo := startEcho(t)
	p, err := New(Config{Listen: "127.0.0.1:0", Target: echo.addr(), ChunkSize: 1024, QueueChunks: 2})
	if err != nil {
		t.Fatal(err)
	}
	live := dialFrom(t, lo1, p.Addr())
	if err := roundTrip(live, []byte("live"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	delayed := dialFrom(t, lo2, p.Addr())
	_ = p.SetFault(lo2, Delay(30*time.Second, 0))
	_, _ = delayed.Write(bytes.Repeat([]byte("d"), 8192)) // fills the bounded queue
	held := dialFrom(t, lo3, p.Addr())
	_ = p.SetFault(lo3, Blackhole())
	_, _ = held.Write([]byte("held"))
	_ = p.SetFault(lo4, Blackhole())
	waiting := dialFrom(t, lo4, p.Addr()) // never dialled on
	writer := dialFrom(t, lo1, p.Addr())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 4096)
		for {
			if _, err := writer.Write(buf); err != nil {
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung")
	}
	_ = p.Close() // idempotent
	for _, c := range []net.Conn{live, delayed, held, waiting, writer} {
		_ = c.Close()
	}
	wg.Wait()
	echo.close()
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still listening after Close")
	}
}

func TestBadInput(t *testing.T) {
	for _, f := range []Fault{
		{Delay: -1},
		{Delay: time.Millisecond, Jitter: time.Second},
		{Delay: 2 * MaxDelay},
		{Drop: 1.5},
		{Drop: -0.1},
		{Drop: math.NaN()},
	} {
		if f.Validate() == nil {
			t.Errorf("fault %+v accepted", f)
		}
	}
	for _, cfg := range []Config{
		{},
		{Listen: "127.0.0.1:0"},
		{Listen: "127.0.0.1:0", Target: "x:1", MaxConns: -1},
		{Listen: "127.0.0.1:0", Target: "x:1", ChunkSize: 1 << 30},
		{Listen: "not an address", Target: "x:1"},
	} {
		if p, err := New(cfg); err == nil {
			_ = p.Close()
			t.Errorf("config %+v accepted", cfg)
		}
	}
	echo := startEcho(t)
	p := newProxy(t, echo.addr(), nil)
	if err := p.SetFault(netip.Addr{}, Pass); err == nil {
		t.Error("invalid source accepted")
	}
	if err := p.SetFault(lo2, Fault{Drop: 2}); err == nil {
		t.Error("invalid fault accepted")
	}
	if got := (Fault{Delay: 75 * time.Millisecond, Jitter: 50 * time.Millisecond, Drop: 0.5}).String(); got != "delay=75ms±50ms drop=0.5" {
		t.Errorf("String = %q", got)
	}
}

func TestParseFault(t *testing.T) {
	for _, f := range []Fault{
		Pass,
		Blackhole(),
		Delay(75*time.Millisecond, 50*time.Millisecond),
		Delay(time.Second, 0),
		Drop(0.5),
		{Delay: 10 * time.Millisecond, Jitter: time.Millisecond, Drop: 0.01},
	} {
		got, err := ParseFault(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFault(%q) = %+v, %v; want %+v", f.String(), got, err, f)
		}
	}
	if f, err := ParseFault("delay=75ms+-50ms"); err != nil || f != Delay(75*time.Millisecond, 50*time.Millisecond) {
		t.Errorf("ascii jitter: %+v, %v", f, err)
	}
	if f, err := ParseFault("delay=75ms jitter=5ms"); err != nil || f != Delay(75*time.Millisecond, 5*time.Millisecond) {
		t.Errorf("jitter=: %+v, %v", f, err)
	}
	for _, bad := range []string{"", "   ", "slow", "delay", "delay=fast", "drop=x", "drop=2",
		"delay=1ms±1s", "pass blackhole", "delay=2h", "jitter=-1s", strings.Repeat("x", 1000)} {
		if f, err := ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%q) accepted: %+v", bad, f)
		}
	}
}
