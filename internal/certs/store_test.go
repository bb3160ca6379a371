package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"toolstackd/internal/xerr"
)

// served is the leaf a TLS server at addr presents for the server name
// sni ("" for none).
func served(t *testing.T, addr, sni string) *x509.Certificate {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // reading what is presented
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0]
}

// serve runs a TLS listener on the store's configuration that completes
// handshakes and closes.
func serve(t *testing.T, s *Store) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", s.ServerTLS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				_ = c.Close()
			}()
		}
	}()
	return l.Addr().String()
}

// firstPair writes an internal pair as the daemon's first start does.
func firstPair(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	c, k, leaf, err := NewPoolPair(Identity{Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, PoolCertFile), c, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, PoolKeyFile), k, 0o600); err != nil {
		t.Fatal(err)
	}
	return leaf
}

// The listener serves the internal certificate to everyone until a host
// certificate is installed; then clients get it from the next handshake
// on, while a pool peer (server name "pool") still gets the internal
// one. A replaced internal pair is served to peers at once too, and both
// outlive a reopening of the store.
func TestStoreHotSwap(t *testing.T) {
	keys(t)
	dir := t.TempDir()
	internal := firstPair(t, dir)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s)
	if got := served(t, addr, ""); !got.Equal(internal) {
		t.Fatal("before any install, clients do not get the internal certificate")
	}
	if s.HasHostCertificate() || !s.HostCertificate().Equal(internal) {
		t.Fatal("HostCertificate before any install")
	}

	_, leafPEM := makeCert(t, certSpec{key: rsa2048, name: "operator.example"})
	srv, err := ValidateServer(leafPEM, keyPEM(t, rsa2048), "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.InstallHost(srv); err != nil {
		t.Fatal(err)
	}
	if got := served(t, addr, ""); !got.Equal(srv.Leaf) {
		t.Fatalf("clients get %s, want the installed certificate", got.Subject)
	}
	if got := served(t, addr, "operator.example"); !got.Equal(srv.Leaf) {
		t.Fatalf("clients naming the host get %s", got.Subject)
	}
	if got := served(t, addr, PoolServerName); !got.Equal(internal) {
		t.Fatalf("a pool peer gets %s, want the internal certificate", got.Subject)
	}

	c, k, next, err := NewPoolPair(Identity{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPool(c, k); err != nil {
		t.Fatal(err)
	}
	if got := served(t, addr, PoolServerName); !got.Equal(next) {
		t.Fatal("the new internal certificate is not served to peers")
	}

	reset, err := s.ResetHost(Identity{Name: "reset"})
	if err != nil {
		t.Fatal(err)
	}
	if got := served(t, addr, ""); !got.Equal(reset) {
		t.Fatal("the reset certificate is not served")
	}

	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !again.HostCertificate().Equal(reset) || !again.PoolCertificate().Equal(next) {
		t.Fatal("the certificates do not outlive reopening the store")
	}
	for _, f := range []string{PoolCertFile + newSuffix, PoolKeyFile + newSuffix, hostFile + newSuffix} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s left behind", f)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, hostFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v %v", hostFile, fi, err)
	}
}

// A replacement of the internal pair stopped half way is finished (the
// key was renamed: rename the certificate) or undone (nothing renamed)
// when the store opens.
func TestStoreRecoversInterruptedPoolSwap(t *testing.T) {
	dir := t.TempDir()
	old := firstPair(t, dir)
	c, k, next, err := NewPoolPair(Identity{Name: "next"})
	if err != nil {
		t.Fatal(err)
	}
	crt, key := filepath.Join(dir, PoolCertFile), filepath.Join(dir, PoolKeyFile)

	// Both written, neither renamed: the old pair stays.
	if err := os.WriteFile(key+newSuffix, k, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crt+newSuffix, c, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.PoolCertificate().Equal(old) {
		t.Fatal("nothing was renamed, yet the old pair is gone")
	}

	// The key renamed, the certificate not: the new pair is completed.
	if err := os.WriteFile(key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(crt+newSuffix, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatalf("a half-renamed pair: %v", err)
	}
	if !s.PoolCertificate().Equal(next) {
		t.Fatal("the half-renamed pair was not completed")
	}
}

func TestStoreCA(t *testing.T) {
	keys(t)
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetCertificate(&tls.ClientHelloInfo{}); err == nil {
		t.Fatal("an empty store serves a certificate")
	}
	a, _ := makeCert(t, certSpec{key: rsa2048, ca: true, name: "CA A"})
	b, _ := makeCert(t, certSpec{key: rsa2048b, ca: true, name: "CA B"})
	if err := s.InstallCA("b.pem", b); err != nil {
		t.Fatal(err)
	}
	if err := s.InstallCA("a.pem", a); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "again", s.InstallCA("a.pem", a), xerr.CertificateAlreadyExists, "a.pem")
	wantErr(t, "bad name", s.InstallCA("../a.pem", a), xerr.CertificateNameInvalid, "../a.pem")
	if got := s.CANames(); !reflect.DeepEqual(got, []string{"a.pem", "b.pem"}) {
		t.Fatalf("names %v", got)
	}
	bundle, err := os.ReadFile(s.CABundle())
	if err != nil {
		t.Fatal(err)
	}
	if string(bundle) != EncodeCert(a)+EncodeCert(b) {
		t.Fatal("the bundle is not both certificates in name order")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("the bundle does not load")
	}

	wantErr(t, "missing", s.UninstallCA("c.pem", false), xerr.CertificateDoesNotExist, "c.pem")
	if err := s.UninstallCA("c.pem", true); err != nil {
		t.Fatalf("forced: %v", err)
	}
	for _, n := range []string{"a.pem", "b.pem"} {
		if err := s.UninstallCA(n, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(s.CABundle()); !os.IsNotExist(err) {
		t.Fatalf("the bundle outlives its last certificate: %v", err)
	}
	if got := s.CANames(); len(got) != 0 {
		t.Fatalf("names %v", got)
	}
}
