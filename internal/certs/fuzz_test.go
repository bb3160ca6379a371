package certs

import (
	"testing"
	"time"

	"toolstackd/internal/xerr"
)

// The parsers take what any caller with the right role sends: they must
// not panic, and each failure must be one of xapi's errors.

func isXAPIError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if _, ok := err.(*xerr.Error); !ok {
		t.Fatalf("not a XenAPI error: %v", err)
	}
}

func FuzzParsePrivateKey(f *testing.F) {
	keys(f)
	f.Add(keyPEM(f, rsa2048))
	f.Add(keyPEM(f, rsa1024))
	f.Add("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParsePrivateKey(s)
		isXAPIError(t, err)
		if err == nil && (k == nil || k.N.BitLen() < minRSABits || k.N.BitLen() > maxRSABits) {
			t.Fatalf("accepted %v", k)
		}
	})
}

func FuzzValidateServer(f *testing.F) {
	keys(f)
	ca, caPEM := makeCert(f, certSpec{key: rsa2048b, ca: true, name: "Fuzz CA"})
	_, leaf := makeCert(f, certSpec{key: rsa2048, parent: ca, signer: rsa2048b})
	k := keyPEM(f, rsa2048)
	f.Add(leaf, k, caPEM)
	f.Add(leaf, k, "")
	f.Add(caPEM, k, leaf)
	f.Add("x", "y", "z")
	now := time.Now()
	f.Fuzz(func(t *testing.T, cert, key, chain string) {
		s, err := ValidateServer(cert, key, chain, now)
		isXAPIError(t, err)
		if err == nil && (s.Leaf == nil || s.Key == nil || s.CertPEM == "" || s.KeyPEM == "") {
			t.Fatalf("accepted an incomplete certificate: %+v", s)
		}
	})
}

func FuzzParseChain(f *testing.F) {
	keys(f)
	_, a := makeCert(f, certSpec{key: rsa2048})
	f.Add(a)
	f.Add(a + a)
	f.Add("-----BEGIN CERTIFICATE-----\n\n-----END CERTIFICATE-----\n")
	f.Fuzz(func(t *testing.T, s string) {
		chain, err := ParseChain(s)
		isXAPIError(t, err)
		if err == nil && (len(chain) == 0 || len(chain) > maxChainCerts) {
			t.Fatalf("accepted %d certificates", len(chain))
		}
	})
}

func FuzzParseCA(f *testing.F) {
	keys(f)
	_, a := makeCert(f, certSpec{key: rsa2048b, ca: true})
	f.Add(a)
	f.Add("not a certificate")
	now := time.Now()
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCA(s, now)
		isXAPIError(t, err)
		if err == nil && c == nil {
			t.Fatal("accepted nothing")
		}
	})
}

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{"ca.pem", "../x.pem", ".pem", "a\x00.pem"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := CheckName(s)
		isXAPIError(t, err)
		if err == nil {
			for _, c := range []byte(s) {
				if c == '/' || c == 0 {
					t.Fatalf("accepted %q", s)
				}
			}
			if s[0] == '.' {
				t.Fatalf("accepted %q", s)
			}
		}
	})
}
