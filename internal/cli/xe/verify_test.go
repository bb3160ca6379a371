package xe

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tlsServer serves TLS on 127.0.0.1 with a certificate for 127.0.0.1
// signed by a new CA, and returns its port and the CA in a PEM file.
func tlsServer(t *testing.T) (port int, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "xe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
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
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return l.Addr().(*net.TCPAddr).Port, caFile
}

// A remote server's certificate is checked: refused when nothing vouches
// for it (with a message naming --cafile and --no-verify), accepted with
// its CA from --cafile, cafile= or XE_CA_FILE, or unchecked with
// --no-verify.
func TestRemoteCertificateVerification(t *testing.T) {
	port, caFile := tlsServer(t)
	dial := func(env map[string]string, args ...string) error {
		t.Helper()
		cl := &Client{Getenv: func(k string) string { return env[k] }, Cwd: "/"}
		opts, _, err := cl.parseCommandLine(append(args, "-p", strconv.Itoa(port), "host-list"))
		if err != nil {
			t.Fatal(err)
		}
		cl.opts = opts
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := cl.dialHost(ctx, "127.0.0.1", true)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	err := dial(nil)
	var fe *fatalError
	if !errors.As(err, &fe) || !strings.Contains(fe.msg, "--cafile") || !strings.Contains(fe.msg, "--no-verify") {
		t.Fatalf("an unknown CA: %v", err)
	}
	for what, c := range map[string]struct {
		env  map[string]string
		args []string
	}{
		"--cafile":    {nil, []string{"--cafile", caFile}},
		"cafile=":     {nil, []string{"cafile=" + caFile}},
		"XE_CA_FILE":  {map[string]string{"XE_CA_FILE": caFile}, nil},
		"--no-verify": {nil, []string{"--no-verify"}},
		"noverify=":   {nil, []string{"noverify=true"}},
	} {
		if err := dial(c.env, c.args...); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if err := dial(nil, "--cafile", filepath.Join(t.TempDir(), "missing.pem")); err == nil {
		t.Error("a missing --cafile is not an error")
	}
}
