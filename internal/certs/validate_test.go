package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/xerr"
)

var (
	keysOnce sync.Once
	rsa2048  *rsa.PrivateKey
	rsa2048b *rsa.PrivateKey
	rsa1024  *rsa.PrivateKey
)

// keys makes the test's RSA keys once (2048-bit keys take a while).
func keys(t testing.TB) {
	t.Helper()
	keysOnce.Do(func() {
		var err error
		if rsa2048, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if rsa2048b, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if rsa1024, err = rsa.GenerateKey(rand.Reader, 1024); err != nil { //nolint:gosec // the size under test
			panic(err)
		}
	})
}

// certSpec is a certificate to make for a test.
type certSpec struct {
	key      crypto.Signer // the certified key
	signer   crypto.Signer // signs it (default: key, self-signed)
	parent   *x509.Certificate
	from, to time.Time
	sigAlg   x509.SignatureAlgorithm
	ca       bool
	name     string
}

func makeCert(t testing.TB, s certSpec) (*x509.Certificate, string) {
	t.Helper()
	if s.from.IsZero() {
		s.from = time.Now().Add(-time.Hour)
	}
	if s.to.IsZero() {
		s.to = time.Now().Add(24 * time.Hour)
	}
	if s.name == "" {
		s.name = "test.example"
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: s.name},
		NotBefore: s.from, NotAfter: s.to, DNSNames: []string{s.name}, SignatureAlgorithm: s.sigAlg,
		BasicConstraintsValid: true, IsCA: s.ca}
	if s.ca {
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	}
	parent, signer := tmpl, s.key
	if s.parent != nil {
		parent, signer = s.parent, s.signer
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, s.key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, EncodeCert(c)
}

func keyPEM(t testing.TB, k crypto.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

// wantErr checks that err is the XenAPI error code with params (nil:
// any parameters).
func wantErr(t *testing.T, what string, err error, code string, params ...string) {
	t.Helper()
	e, ok := err.(*xerr.Error)
	if !ok {
		t.Fatalf("%s: error %v, want %s", what, err, code)
	}
	if e.Code != code {
		t.Fatalf("%s: %s %v, want %s", what, e.Code, e.Params, code)
	}
	if params != nil && !reflect.DeepEqual(e.Params, params) {
		t.Fatalf("%s: %s %q, want %q", what, e.Code, e.Params, params)
	}
}

func TestValidateServer(t *testing.T) {
	keys(t)
	now := time.Now()
	_, good := makeCert(t, certSpec{key: rsa2048})
	k := keyPEM(t, rsa2048)

	s, err := ValidateServer(good, k, "", now)
	if err != nil {
		t.Fatal(err)
	}
	if s.Leaf.Subject.CommonName != "test.example" || s.ChainPEM != "" || !strings.Contains(s.KeyPEM, "BEGIN PRIVATE KEY") {
		t.Fatalf("validated: %+v", s)
	}
	// PKCS#1 keys are read too.
	pkcs1 := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsa2048)}))
	if _, err := ValidateServer(good, pkcs1, "", now); err != nil {
		t.Fatalf("PKCS#1 key: %v", err)
	}

	// With a chain: an intermediate CA signs the leaf.
	ca, caPEM := makeCert(t, certSpec{key: rsa2048b, ca: true, name: "Test CA"})
	_, leaf := makeCert(t, certSpec{key: rsa2048, parent: ca, signer: rsa2048b})
	s, err = ValidateServer(leaf, k, caPEM, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Chain) != 1 || s.ChainPEM != caPEM {
		t.Fatalf("chain: %d certificates, %q", len(s.Chain), s.ChainPEM)
	}

	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecSEC1, _ := x509.MarshalECPrivateKey(ec)
	_, expired := makeCert(t, certSpec{key: rsa2048, from: now.Add(-48 * time.Hour), to: now.Add(-24 * time.Hour)})
	_, future := makeCert(t, certSpec{key: rsa2048, from: now.Add(24 * time.Hour), to: now.Add(48 * time.Hour)})
	_, small := makeCert(t, certSpec{key: rsa1024})
	_, sha384 := makeCert(t, certSpec{key: rsa2048, sigAlg: x509.SHA384WithRSA})
	_, other := makeCert(t, certSpec{key: rsa2048b})
	_, ecCert := makeCert(t, certSpec{key: ec})

	for _, c := range []struct {
		what, cert, key, chain string
		code                   string
		params                 []string
	}{
		{"expired", expired, k, "", xerr.ServerCertificateExpired, nil},
		{"not valid yet", future, k, "", xerr.ServerCertificateNotValidYet, nil},
		{"RSA 1024", small, keyPEM(t, rsa1024), "", xerr.ServerCertificateKeyRSALengthNotSupported, []string{"1024"}},
		{"EC key (PKCS#8)", ecCert, keyPEM(t, ec), "", xerr.ServerCertificateKeyAlgorithmNotSupported, []string{"P256"}},
		{"EC key (SEC 1)", ecCert, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecSEC1})), "",
			xerr.ServerCertificateKeyAlgorithmNotSupported, []string{"P256"}},
		{"Ed25519 key", good, keyPEM(t, edKey), "", xerr.ServerCertificateKeyAlgorithmNotSupported, []string{"ED25519"}},
		{"key mismatch", other, k, "", xerr.ServerCertificateKeyMismatch, []string{}},
		{"SHA-384 signature", sha384, k, "", xerr.ServerCertificateSignatureNotSupported, []string{}},
		{"chain not PEM", good, k, "not a certificate", xerr.ServerCertificateChainInvalid, []string{}},
		{"chain garbage DER", good, k, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")})),
			xerr.ServerCertificateChainInvalid, []string{}},
		{"chain too big", good, k, strings.Repeat(caPEM, MaxChainPEM/len(caPEM)+1), xerr.ServerCertificateChainInvalid, []string{}},
		{"no key", good, "", "", xerr.ServerCertificateKeyInvalid, []string{}},
		{"two keys", good, k + k, "", xerr.ServerCertificateKeyInvalid, []string{}},
		{"key garbage", good, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("junk")})), "",
			xerr.ServerCertificateKeyInvalid, []string{}},
		{"key too big", good, k + strings.Repeat(" ", MaxCertPEM), "", xerr.ServerCertificateKeyInvalid, []string{}},
		{"certificate not PEM", "hello", k, "", xerr.ServerCertificateInvalid, []string{}},
		{"two certificates", good + other, k, "", xerr.ServerCertificateInvalid, []string{}},
		{"certificate too big", good + strings.Repeat(" ", MaxCertPEM), k, "", xerr.ServerCertificateInvalid, []string{}},
	} {
		_, err := ValidateServer(c.cert, c.key, c.chain, now)
		wantErr(t, c.what, err, c.code, c.params...)
	}

	// The times in the validity errors are xapi's: now, then the bound.
	_, err = ValidateServer(expired, k, "", now)
	e := err.(*xerr.Error)
	if len(e.Params) != 2 || e.Params[0] != now.UTC().Format(time.RFC3339) || !strings.HasSuffix(e.Params[1], "Z") {
		t.Fatalf("expired: %q", e.Params)
	}
	// A bad key is reported before a bad certificate, as xapi checks it
	// first.
	_, err = ValidateServer("junk", keyPEM(t, rsa1024), "", now)
	wantErr(t, "bad key and certificate", err, xerr.ServerCertificateKeyRSALengthNotSupported, "1024")
}

func TestParseCA(t *testing.T) {
	keys(t)
	now := time.Now()
	_, ca := makeCert(t, certSpec{key: rsa2048b, ca: true, name: "Test CA"})
	c, err := ParseCA(ca, now)
	if err != nil || c.Subject.CommonName != "Test CA" {
		t.Fatalf("ParseCA: %v %v", c, err)
	}
	_, expired := makeCert(t, certSpec{key: rsa2048b, ca: true, from: now.Add(-48 * time.Hour), to: now.Add(-time.Hour)})
	_, future := makeCert(t, certSpec{key: rsa2048b, ca: true, from: now.Add(time.Hour), to: now.Add(48 * time.Hour)})
	_, err = ParseCA(expired, now)
	wantErr(t, "expired CA", err, xerr.CACertificateExpired)
	_, err = ParseCA(future, now)
	wantErr(t, "future CA", err, xerr.CACertificateNotValidYet)
	_, err = ParseCA("nothing", now)
	wantErr(t, "not PEM", err, xerr.CACertificateInvalid)
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"ca.pem", "My_CA-1.pem", "a.b.pem"} {
		if err := CheckName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".hidden.pem", "ca.crt", "../x.pem", "a/b.pem", "sp ace.pem", "pem"} {
		wantErr(t, "name "+bad, CheckName(bad), xerr.CertificateNameInvalid, bad)
	}
}
