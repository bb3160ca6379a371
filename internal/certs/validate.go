// Package certs is the host's TLS identity as a XenAPI host has it: the
// server certificate clients see on the HTTPS port (the "host"
// certificate, replaceable by the operator), the pool's internal one
// (host_internal, pinned by the other hosts of a pool) and the trusted CA
// certificates installed with pool.install_ca_certificate.
//
// Validation follows xapi's gencert library: a server certificate comes
// with an RSA private key of 2048 to 4096 bits, is valid now, matches the
// key and is signed with SHA-256 or SHA-512; a chain, when given, is one
// or more PEM certificates. Each failure is xapi's error with xapi's
// parameters.
package certs

import (
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // fingerprint_sha1 is a label xapi shows, never a check
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/xerr"
)

// Bounds on what a caller may send: far above any real certificate, far
// below what would hurt the daemon.
const (
	// MaxCertPEM bounds a certificate or a private key in PEM.
	MaxCertPEM = 64 << 10
	// MaxChainPEM bounds a certificate chain (or a CA bundle entry).
	MaxChainPEM = 512 << 10
	// maxChainCerts bounds the number of certificates in a chain.
	maxChainCerts = 32
)

// RSA key sizes xapi accepts for a server certificate.
const (
	minRSABits = 2048
	maxRSABits = 4096
)

// Server is a validated server certificate: its key, leaf and chain,
// and the same in normalised PEM.
type Server struct {
	Key   *rsa.PrivateKey
	Leaf  *x509.Certificate
	Chain []*x509.Certificate
	// KeyPEM (PKCS#8), CertPEM (the leaf) and ChainPEM ("" for none) are
	// re-encoded from what was parsed, as xapi writes them.
	KeyPEM, CertPEM, ChainPEM string
}

// pemBlocks returns the PEM blocks of text whose type is one of types,
// in order; anything else in the text (other blocks, text around them)
// is ignored, as xapi's PEM reader ignores it.
func pemBlocks(text []byte, types ...string) []*pem.Block {
	var out []*pem.Block
	for {
		var b *pem.Block
		b, text = pem.Decode(text)
		if b == nil {
			return out
		}
		for _, t := range types {
			if b.Type == t {
				out = append(out, b)
				break
			}
		}
	}
}

// ParsePrivateKey reads a server certificate's private key as xapi
// does: exactly one PEM private key (PKCS#8, PKCS#1 or SEC 1), RSA of
// 2048 to 4096 bits. Errors: SERVER_CERTIFICATE_KEY_INVALID,
// SERVER_CERTIFICATE_KEY_ALGORITHM_NOT_SUPPORTED [algorithm],
// SERVER_CERTIFICATE_KEY_RSA_LENGTH_NOT_SUPPORTED [bits],
// SERVER_CERTIFICATE_KEY_RSA_MULTI_NOT_SUPPORTED.
func ParsePrivateKey(text string) (*rsa.PrivateKey, error) {
	if len(text) > MaxCertPEM {
		return nil, xerr.New(xerr.ServerCertificateKeyInvalid)
	}
	blocks := pemBlocks([]byte(text), "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY")
	if len(blocks) != 1 {
		return nil, xerr.New(xerr.ServerCertificateKeyInvalid)
	}
	key, err := parseKeyBlock(blocks[0])
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *rsa.PrivateKey:
		if len(k.Primes) > 2 {
			return nil, xerr.New(xerr.ServerCertificateKeyRSAMultiNotSupported)
		}
		if bits := k.N.BitLen(); bits < minRSABits || bits > maxRSABits {
			return nil, xerr.New(xerr.ServerCertificateKeyRSALengthNotSupported, strconv.Itoa(bits))
		}
		if k.Validate() != nil {
			return nil, xerr.New(xerr.ServerCertificateKeyInvalid)
		}
		return k, nil
	default:
		return nil, xerr.New(xerr.ServerCertificateKeyAlgorithmNotSupported, keyTypeName(key))
	}
}

// parseKeyBlock parses one private key block of any kind Go knows.
func parseKeyBlock(b *pem.Block) (crypto.PrivateKey, error) {
	var key crypto.PrivateKey
	var err error
	switch b.Type {
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err == nil {
		return key, nil
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "multi-prime") || strings.Contains(msg, "multiprime"):
		return nil, xerr.New(xerr.ServerCertificateKeyRSAMultiNotSupported)
	case strings.Contains(msg, "unknown algorithm: "):
		_, oid, _ := strings.Cut(msg, "unknown algorithm: ")
		return nil, xerr.New(xerr.ServerCertificateKeyAlgorithmNotSupported, clip(oid))
	}
	return nil, xerr.New(xerr.ServerCertificateKeyInvalid)
}

// keyTypeName names a key type as xapi's X509 library does.
func keyTypeName(key crypto.PrivateKey) string {
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return strings.ReplaceAll(k.Curve.Params().Name, "-", "")
	case ed25519.PrivateKey:
		return "ED25519"
	case *ecdh.PrivateKey:
		if k.Curve() == ecdh.X25519() {
			return "X25519"
		}
		return "ECDH"
	}
	return "unknown"
}

// parseOneCert reads exactly one PEM certificate, or fails with invalid.
func parseOneCert(text string, limit int, invalid string) (*x509.Certificate, error) {
	if len(text) > limit {
		return nil, xerr.New(invalid)
	}
	blocks := pemBlocks([]byte(text), "CERTIFICATE")
	if len(blocks) != 1 {
		return nil, xerr.New(invalid)
	}
	cert, err := x509.ParseCertificate(blocks[0].Bytes)
	if err != nil {
		return nil, xerr.New(invalid)
	}
	return cert, nil
}

// checkValidity fails with notYet [now, not_before] or expired [now,
// not_after] when now is outside the certificate's validity.
func checkValidity(cert *x509.Certificate, now time.Time, notYet, expired string) error {
	switch {
	case now.Before(cert.NotBefore):
		return xerr.New(notYet, stamp(now), stamp(cert.NotBefore))
	case now.After(cert.NotAfter):
		return xerr.New(expired, stamp(now), stamp(cert.NotAfter))
	}
	return nil
}

// stamp is a time as xapi writes it in these errors: RFC 3339 in UTC.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// ParseChain reads a certificate chain: one or more PEM certificates,
// else SERVER_CERTIFICATE_CHAIN_INVALID.
func ParseChain(text string) ([]*x509.Certificate, error) {
	if len(text) > MaxChainPEM {
		return nil, xerr.New(xerr.ServerCertificateChainInvalid)
	}
	blocks := pemBlocks([]byte(text), "CERTIFICATE")
	if len(blocks) == 0 || len(blocks) > maxChainCerts {
		return nil, xerr.New(xerr.ServerCertificateChainInvalid)
	}
	out := make([]*x509.Certificate, 0, len(blocks))
	for _, b := range blocks {
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, xerr.New(xerr.ServerCertificateChainInvalid)
		}
		out = append(out, c)
	}
	return out, nil
}

// ValidateServer checks a server certificate, its private key and its
// chain ("" for none) at time now, in xapi's order: the key, then the
// certificate (parse, validity), that they match, its signature
// algorithm, then the chain.
func ValidateServer(certPEM, keyPEM, chainPEM string, now time.Time) (*Server, error) {
	key, err := ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, err := parseOneCert(certPEM, MaxCertPEM, xerr.ServerCertificateInvalid)
	if err != nil {
		return nil, err
	}
	if err := checkValidity(leaf, now, xerr.ServerCertificateNotValidYet, xerr.ServerCertificateExpired); err != nil {
		return nil, err
	}
	if pub, ok := leaf.PublicKey.(*rsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, xerr.New(xerr.ServerCertificateKeyMismatch)
	}
	if !signatureSupported(leaf.SignatureAlgorithm) {
		return nil, xerr.New(xerr.ServerCertificateSignatureNotSupported)
	}
	s := &Server{Key: key, Leaf: leaf}
	if chainPEM != "" {
		if s.Chain, err = ParseChain(chainPEM); err != nil {
			return nil, err
		}
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, xerr.New(xerr.ServerCertificateKeyInvalid)
	}
	s.KeyPEM = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
	s.CertPEM = EncodeCert(leaf)
	var chain strings.Builder
	for _, c := range s.Chain {
		chain.WriteString(EncodeCert(c))
	}
	s.ChainPEM = chain.String()
	return s, nil
}

// signatureSupported: xapi takes SHA-256 and SHA-512 signatures only.
func signatureSupported(a x509.SignatureAlgorithm) bool {
	switch a {
	case x509.SHA256WithRSA, x509.SHA512WithRSA, x509.SHA256WithRSAPSS, x509.SHA512WithRSAPSS,
		x509.ECDSAWithSHA256, x509.ECDSAWithSHA512:
		return true
	}
	return false
}

// ParseCA reads a CA certificate for pool.install_ca_certificate at time
// now: exactly one PEM certificate, valid now. Errors:
// CA_CERTIFICATE_INVALID, CA_CERTIFICATE_NOT_VALID_YET [now, not_before],
// CA_CERTIFICATE_EXPIRED [now, not_after].
func ParseCA(text string, now time.Time) (*x509.Certificate, error) {
	cert, err := parseOneCert(text, MaxCertPEM, xerr.CACertificateInvalid)
	if err != nil {
		return nil, err
	}
	if err := checkValidity(cert, now, xerr.CACertificateNotValidYet, xerr.CACertificateExpired); err != nil {
		return nil, err
	}
	return cert, nil
}

// CheckName checks a trusted certificate's name as xapi does: letters,
// digits, '.', '_' and '-', not starting with '.', ending in ".pem";
// else CERTIFICATE_NAME_INVALID [name].
func CheckName(name string) error {
	ok := name != "" && name[0] != '.' && strings.HasSuffix(name, ".pem") && len(name) <= 255
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return xerr.New(xerr.CertificateNameInvalid, clip(name))
	}
	return nil
}

// EncodeCert is a certificate in PEM.
func EncodeCert(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

// FingerprintSHA256 is a certificate's SHA-256 fingerprint as xapi
// writes it: uppercase hex pairs joined by colons.
func FingerprintSHA256(c *x509.Certificate) string { return FingerprintSHA256Of(c.Raw) }

// FingerprintSHA1 is the SHA-1 fingerprint, written the same way.
func FingerprintSHA1(c *x509.Certificate) string { return FingerprintSHA1Of(c.Raw) }

// FingerprintSHA256Of is the SHA-256 fingerprint of a certificate's DER
// bytes.
func FingerprintSHA256Of(der []byte) string {
	sum := sha256.Sum256(der)
	return hexPairs(sum[:])
}

// FingerprintSHA1Of is the SHA-1 fingerprint of a certificate's DER bytes.
func FingerprintSHA1Of(der []byte) string {
	sum := sha1.Sum(der) //nolint:gosec // a label, see the import
	return hexPairs(sum[:])
}

func hexPairs(b []byte) string {
	const digits = "0123456789ABCDEF"
	var s strings.Builder
	s.Grow(3 * len(b))
	for i, c := range b {
		if i > 0 {
			s.WriteByte(':')
		}
		s.WriteByte(digits[c>>4])
		s.WriteByte(digits[c&0xf])
	}
	return s.String()
}

// clip shortens caller-supplied text quoted in an error.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// errEmpty is returned for a store without the file asked for.
var errEmpty = errors.New("certs: no certificate")
