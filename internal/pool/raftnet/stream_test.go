package raftnet_test

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/pool/peerauth"
	"toolstackd/internal/pool/raftnet"
)

// secrets is a rotatable set of valid secrets.
type secrets struct {
	mu sync.Mutex
	s  []string
}

func newSecrets(s ...string) *secrets { return &secrets{s: s} }

func (s *secrets) set(v ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.s = v
}

func (s *secrets) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.s...)
}

// host is one daemon's HTTP listener with a StreamLayer mounted at Path.
type host struct {
	layer *raftnet.StreamLayer
	srv   *http.Server
	addr  string
}

// startHost listens on ip:0 (plain, or TLS with cert) and serves a
// StreamLayer whose Dial binds to ip.
func startHost(t testing.TB, ip string, sec *secrets, cert *tls.Certificate, clientTLS *tls.Config, queue int) *host {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	layer, err := raftnet.NewStreamLayer(raftnet.Config{
		Advertise: ln.Addr().String(),
		Secrets:   sec.get,
		TLS:       clientTLS,
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)},
		QueueSize: queue,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(raftnet.Path, layer)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 8 << 10,
		ErrorLog: log.New(io.Discard, "", 0)}
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12})
	}
	go srv.Serve(ln)
	h := &host{layer: layer, srv: srv, addr: layer.Addr().String()}
	t.Cleanup(func() { srv.Close(); layer.Close() })
	return h
}

func acceptWithin(t *testing.T, l *raftnet.StreamLayer, d time.Duration) net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			ch <- c
		}
	}()
	select {
	case c := <-ch:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(d):
		t.Fatal("Accept got nothing")
		return nil
	}
}

// exchange checks that bytes flow both ways between a dialled and an
// accepted connection.
func exchange(t *testing.T, a, b net.Conn) {
	t.Helper()
	a.SetDeadline(time.Now().Add(5 * time.Second))
	b.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(b).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("server read %q, %v", line, err)
	}
	if _, err := b.Write([]byte("pong\n")); err != nil {
		t.Fatal(err)
	}
	line, err = bufio.NewReader(a).ReadString('\n')
	if err != nil || line != "pong\n" {
		t.Fatalf("client read %q, %v", line, err)
	}
}

func TestHandshake(t *testing.T) {
	sec := newSecrets("s3cret")
	srv := startHost(t, "127.0.0.1", sec, nil, nil, 0)
	cli := startHost(t, "127.0.0.2", sec, nil, nil, 0)
	if got := srv.layer.Addr().Network(); got != "tcp" {
		t.Fatalf("Addr().Network() = %q", got)
	}
	c, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	s := acceptWithin(t, srv.layer, 5*time.Second)
	// The dialler bound to its own loopback address, as the fault proxy
	// needs to tell hosts apart.
	if ip := s.RemoteAddr().(*net.TCPAddr).IP.String(); ip != "127.0.0.2" {
		t.Fatalf("server sees the peer from %s, want 127.0.0.2", ip)
	}
	exchange(t, c, s)
}

func TestRefusesWrongOrMissingSecret(t *testing.T) {
	srv := startHost(t, "127.0.0.1", newSecrets("right"), nil, nil, 0)

	bad := startHost(t, "127.0.0.1", newSecrets("wrong"), nil, nil, 0)
	_, err := bad.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
	var herr *raftnet.HandshakeError
	if !errors.Is(err, raftnet.ErrBadSecret) || !errors.As(err, &herr) || herr.StatusCode != http.StatusForbidden {
		t.Fatalf("Dial with a wrong secret: %v, want ErrBadSecret/403", err)
	}

	none := startHost(t, "127.0.0.1", newSecrets(), nil, nil, 0)
	if _, err := none.layer.Dial(raftnetAddr(srv.addr), 2*time.Second); !errors.Is(err, raftnet.ErrNoSecret) {
		t.Fatalf("Dial without a secret: %v, want ErrNoSecret", err)
	}

	// Plain HTTP clients: no signature, an empty one, one of another
	// secret, a wrong method, no Upgrade header.
	sign := func(secret string) string {
		h := http.Header{}
		peerauth.Sign(h, secret, peerauth.Request{Method: "POST", Host: srv.addr, URI: raftnet.Path}, time.Now())
		return h.Get(peerauth.Header)
	}
	cases := []struct {
		method string
		hdr    map[string]string
		want   int
	}{
		{"POST", map[string]string{"Connection": "Upgrade", "Upgrade": raftnet.Protocol}, http.StatusForbidden},
		{"POST", map[string]string{"Connection": "Upgrade", "Upgrade": raftnet.Protocol, peerauth.Header: ""}, http.StatusForbidden},
		{"POST", map[string]string{"Connection": "Upgrade", "Upgrade": raftnet.Protocol, peerauth.Header: sign("righ")}, http.StatusForbidden},
		// The secret itself, as hosts sent it before peerauth.
		{"POST", map[string]string{"Connection": "Upgrade", "Upgrade": raftnet.Protocol, "X-Toolstackd-Pool-Secret": "right"}, http.StatusForbidden},
		{"GET", map[string]string{peerauth.Header: sign("right")}, http.StatusMethodNotAllowed},
		{"POST", map[string]string{peerauth.Header: sign("right")}, http.StatusUpgradeRequired},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(tc.method, "http://"+srv.addr+raftnet.Path, nil)
		for k, v := range tc.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Fatalf("%s with %v: %d, want %d", tc.method, tc.hdr, resp.StatusCode, tc.want)
		}
	}
}

// A listener that is not of the pool, dialled as if it were a peer (a
// member told to follow it), learns neither the secret nor a request it
// can replay at a real host, and gets nothing past the handshake: it
// cannot prove it holds the secret.
func TestForeignListenerLearnsNothing(t *testing.T) {
	const secret = "the-real-pool-secret"
	srv := startHost(t, "127.0.0.1", newSecrets(secret), nil, nil, 0)
	cli := startHost(t, "127.0.0.1", newSecrets(secret), nil, nil, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		var head []byte
		for {
			line, err := br.ReadBytes('\n')
			head = append(head, line...)
			if err != nil || len(line) <= 2 {
				break
			}
		}
		// Play along: agree to the upgrade, and see whether raft's bytes
		// follow.
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+raftnet.Protocol+"\r\nConnection: Upgrade\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(time.Second))
		rest, _ := io.ReadAll(c)
		got <- append(head, rest...)
	}()
	_, err = cli.layer.Dial(raftnetAddr(ln.Addr().String()), 5*time.Second)
	if !errors.Is(err, raftnet.ErrNoProof) {
		t.Fatalf("Dial to a listener without the secret: %v, want ErrNoProof", err)
	}
	sent := <-got
	if bytes.Contains(sent, []byte(secret)) {
		t.Fatalf("the secret was sent to a foreign listener:\n%s", sent)
	}
	// What it was sent, replayed at the real host: refused.
	replay, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Close()
	replay.Write(sent)
	resp, err := http.ReadResponse(bufio.NewReader(replay), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the foreign listener's request replayed at a host: %s", resp.Status)
	}
	// And the same request with the real host's address: the signature
	// no longer matches.
	fixed := bytes.Replace(sent, []byte("Host: "+ln.Addr().String()), []byte("Host: "+srv.addr), 1)
	again, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	again.Write(fixed)
	if resp, err = http.ReadResponse(bufio.NewReader(again), nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the request readdressed to a host: %v %v", resp, err)
	}
}

func TestSecretRotation(t *testing.T) {
	srvSec := newSecrets("old")
	srv := startHost(t, "127.0.0.1", srvSec, nil, nil, 0)
	oldCli := startHost(t, "127.0.0.1", newSecrets("old"), nil, nil, 0)
	newCli := startHost(t, "127.0.0.1", newSecrets("new"), nil, nil, 0)

	dial := func(c *host) error {
		conn, err := c.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
		if err == nil {
			conn.Close()
			acceptWithin(t, srv.layer, 5*time.Second)
		}
		return err
	}
	if err := dial(oldCli); err != nil {
		t.Fatalf("before rotation, old secret: %v", err)
	}
	if err := dial(newCli); !errors.Is(err, raftnet.ErrBadSecret) {
		t.Fatalf("before rotation, new secret: %v", err)
	}
	srvSec.set("new", "old") // rotation under way: both valid
	if err := dial(oldCli); err != nil {
		t.Fatalf("during rotation, old secret: %v", err)
	}
	if err := dial(newCli); err != nil {
		t.Fatalf("during rotation, new secret: %v", err)
	}
	srvSec.set("new") // old retired
	if err := dial(oldCli); !errors.Is(err, raftnet.ErrBadSecret) {
		t.Fatalf("after rotation, old secret: %v", err)
	}
	if err := dial(newCli); err != nil {
		t.Fatalf("after rotation, new secret: %v", err)
	}
}

func TestQueueBoundAndClose(t *testing.T) {
	sec := newSecrets("s")
	srv := startHost(t, "127.0.0.1", sec, nil, nil, 2)
	cli := startHost(t, "127.0.0.1", sec, nil, nil, 0)
	for i := range 2 {
		c, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		defer c.Close()
	}
	// Nobody accepts: the third waits in no queue, it is refused.
	_, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
	var herr *raftnet.HandshakeError
	if !errors.Is(err, raftnet.ErrBusy) || !errors.As(err, &herr) || herr.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial beyond the queue: %v, want ErrBusy/503", err)
	}
	acceptWithin(t, srv.layer, 5*time.Second) // frees a slot
	c, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
	if err != nil {
		t.Fatalf("dial after an Accept: %v", err)
	}
	c.Close()

	if err := srv.layer.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.layer.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second); !errors.Is(err, raftnet.ErrBusy) {
		t.Fatalf("dial to a closed layer: %v, want ErrBusy", err)
	}
}

// fakePeer accepts one connection and runs answer on it.
func fakePeer(t *testing.T, answer func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				answer(c)
			}()
		}
	}()
	return ln.Addr().String()
}

func TestDialBoundsHostilePeers(t *testing.T) {
	cli, err := raftnet.NewStreamLayer(raftnet.Config{
		Advertise: "127.0.0.1:1", Secrets: newSecrets("s").get,
		HandshakeTimeout: 500 * time.Millisecond, MaxHeaderBytes: 1024,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A peer that never answers: Dial gives up at its timeout.
	silent := fakePeer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	start := time.Now()
	if _, err := cli.Dial(raftnetAddr(silent), 300*time.Millisecond); err == nil {
		t.Fatal("Dial to a silent peer succeeded")
	}
	// 300 to 500 ms (the dial's timeout, the handshake's) on a quiet
	// machine.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Dial to a silent peer took %v", d)
	}
	// A peer that answers with endless headers: refused at the bound.
	endless := fakePeer(t, func(c net.Conn) {
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n")
		for range 10000 {
			if _, err := io.WriteString(c, "X-Junk: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"); err != nil {
				return
			}
		}
	})
	if _, err := cli.Dial(raftnetAddr(endless), 2*time.Second); !errors.Is(err, raftnet.ErrHandshake) {
		t.Fatalf("Dial to a peer with endless headers: %v, want ErrHandshake", err)
	}
	// A peer that answers 200 instead of upgrading, or garbage.
	for _, ans := range []string{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "SSH-2.0-OpenSSH\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"} {
		p := fakePeer(t, func(c net.Conn) {
			bufio.NewReader(c).ReadString('\n')
			io.WriteString(c, ans)
		})
		if _, err := cli.Dial(raftnetAddr(p), 2*time.Second); !errors.Is(err, raftnet.ErrHandshake) {
			t.Fatalf("Dial to a peer answering %q: %v, want ErrHandshake", ans, err)
		}
	}
	// Addresses that would smuggle header lines.
	if _, err := cli.Dial(raftnetAddr("127.0.0.1:1\r\nX: y"), time.Second); err == nil || !strings.Contains(err.Error(), "control") {
		t.Fatalf("Dial to an address with CRLF: %v", err)
	}
	if _, err := raftnet.NewStreamLayer(raftnet.Config{Advertise: "nohostport", Secrets: newSecrets().get}); err == nil {
		t.Fatal("NewStreamLayer accepted an address without a port")
	}
}

// selfSigned makes a certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "toolstackd test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	sec := newSecrets("tls-secret")
	clientTLS := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	srv := startHost(t, "127.0.0.1", sec, &cert, clientTLS, 0)
	cli := startHost(t, "127.0.0.1", sec, &cert, clientTLS, 0)
	c, err := cli.layer.Dial(raftnetAddr(srv.addr), 2*time.Second)
	if err != nil {
		t.Fatalf("TLS Dial: %v", err)
	}
	defer c.Close()
	if _, ok := c.(*tls.Conn); !ok {
		t.Fatalf("dialled connection is %T, not TLS", c)
	}
	exchange(t, c, acceptWithin(t, srv.layer, 5*time.Second))

	// A dialler that does not trust the certificate fails in TLS.
	untrusting := startHost(t, "127.0.0.1", sec, nil, &tls.Config{MinVersion: tls.VersionTLS12}, 0)
	if _, err := untrusting.layer.Dial(raftnetAddr(srv.addr), 2*time.Second); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("Dial without trusting the certificate: %v", err)
	}
	// A plain dialler to the TLS port gets no upgrade.
	plain := startHost(t, "127.0.0.1", sec, nil, nil, 0)
	if _, err := plain.layer.Dial(raftnetAddr(srv.addr), 2*time.Second); err == nil {
		t.Fatal("plain Dial to a TLS listener succeeded")
	}
}
