package pool

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"toolstackd/internal/certs"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// Pinned certificates: TLS between the hosts of a pool.
//
// A host that serves HTTPS (Config.TLS) speaks TLS to the other hosts of
// its pool, on every intra-pool connection: raft's streams, joins,
// forwarded calls, deltas, transfers, secret rotations, leaving. As xapi's
// pool certificates do, each host's own certificate is a Certificate row
// of type host_internal (host = its host, fingerprint_sha256 its SHA-256
// fingerprint as uppercase hex pairs joined by colons), and the client
// side of every intra-pool connection accepts a peer only when the SHA-256
// fingerprint of the certificate it presents is one of those rows in the
// local database. Neither the certificate chain nor the name in it is
// checked: the pin is the check. The rows are read at each handshake, so
// a row replicated in or removed (pool.eject, host.forget) counts from the
// next connection on.
//
// Joining: the joining host cannot check the coordinator it first talks
// to, as nothing is pinned yet; the pool's credentials protect that
// exchange, as in xapi's pool.join. It keeps the fingerprint it saw on
// that connection and trusts it alone until the pool's database (with the
// pool's rows) arrives. It sends its own certificate (PEM) in the join
// request; the coordinator records it before the joiner's raft starts.
// The coordinator's own row is written when the pool is formed, by the
// first join.

// maxCertPEM bounds a joining host's certificate.
const maxCertPEM = 16 << 10

// errNotPinned is the handshake's error for a peer whose certificate is
// none of the pool's.
var errNotPinned = errors.New("pool: the peer's certificate is not one of the pool's host certificates")

// Fingerprint is a certificate's SHA-256 fingerprint (of its DER bytes)
// as xapi writes it: uppercase hex pairs separated by colons.
func Fingerprint(der []byte) string { return certs.FingerprintSHA256Of(der) }

// fingerprintSHA1 is the SHA-1 fingerprint, for Certificate.fingerprint_sha1.
func fingerprintSHA1(der []byte) string { return certs.FingerprintSHA1Of(der) }

// parseCertPEM reads a joining host's certificate: one PEM CERTIFICATE
// block and nothing else, at most maxCertPEM bytes. Its errors say what
// is wrong in words fit for the joining host's INVALID_VALUE.
func parseCertPEM(s string) (*x509.Certificate, error) {
	if len(s) > maxCertPEM {
		return nil, fmt.Errorf("over %d bytes", maxCertPEM)
	}
	block, rest := pem.Decode([]byte(s))
	switch {
	case block == nil:
		return nil, errors.New("not PEM")
	case block.Type != "CERTIFICATE":
		return nil, fmt.Errorf("a PEM %q block, not a CERTIFICATE", block.Type)
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, errors.New("more than one PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	return cert, nil
}

// certPEM is cert as PEM.
func certPEM(cert *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
}

// pinned reports whether fp is the SHA-256 fingerprint of one of the
// pool's host_internal certificates in r.
func pinned(r db.Reader, fp string) bool {
	found := false
	r.Ascend(dm.Certificate.Class, func(row *db.Row) bool {
		if row.String(dm.Certificate.Type) == string(dm.CertificateTypeHostInternal) &&
			row.String(dm.Certificate.FingerprintSha256) == fp {
			found = true
		}
		return !found
	})
	return found
}

// checkPinned accepts a peer whose leaf certificate is pinned in the
// database read() returns now, or whose fingerprint is extra (the
// coordinator seen at a join, until the pool's database arrives; "" when
// none). It is the heart of every intra-pool VerifyConnection.
func checkPinned(cs tls.ConnectionState, extra string, read func() db.Reader) error {
	if len(cs.PeerCertificates) == 0 {
		return errNotPinned
	}
	fp := Fingerprint(cs.PeerCertificates[0].Raw)
	if extra != "" && extra == fp {
		return nil
	}
	if pinned(read(), fp) {
		return nil
	}
	return fmt.Errorf("%w (%s)", errNotPinned, fp)
}

// pinnedTLS is the client side of intra-pool TLS made from the daemon's
// configuration: the peer is checked by verify alone.
func pinnedTLS(base *tls.Config, verify func(tls.ConnectionState) error) *tls.Config {
	c := base.Clone()
	c.Certificates = nil // the host's own, for the join request; peers ask for none
	// The chain and the name are not what is checked: VerifyConnection
	// accepts only a pinned certificate.
	c.InsecureSkipVerify = true //nolint:gosec // verified by pinning in VerifyConnection
	c.VerifyConnection = verify
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// ownCert is this host's pinned certificate now: Config.OwnCert's, or
// Config.TLS's first; nil without TLS.
func (p *Pool) ownCert() *x509.Certificate {
	if p.cfg.TLS == nil {
		return nil
	}
	if p.cfg.OwnCert != nil {
		return p.cfg.OwnCert()
	}
	return ownCert(p.cfg.TLS)
}

// ownCert is the first certificate of c, or nil.
func ownCert(c *tls.Config) *x509.Certificate {
	if c == nil || len(c.Certificates) == 0 || len(c.Certificates[0].Certificate) == 0 {
		return nil
	}
	if leaf := c.Certificates[0].Leaf; leaf != nil {
		return leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificates[0].Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// putHostCert makes cert the host's one host_internal Certificate row,
// replacing any other it had; a row already holding it is left as is.
func putHostCert(tx *db.Tx, hostRef string, cert *x509.Certificate) error {
	fp := Fingerprint(cert.Raw)
	kept := false
	for _, row := range tx.All(dm.Certificate.Class) {
		if row.String(dm.Certificate.Host) != hostRef || row.String(dm.Certificate.Type) != string(dm.CertificateTypeHostInternal) {
			continue
		}
		if row.String(dm.Certificate.FingerprintSha256) == fp && !kept {
			kept = true
			continue
		}
		if err := tx.Delete(dm.Certificate.Class, row.Ref); err != nil {
			return err
		}
	}
	if kept {
		return nil
	}
	rec := dm.CertificateRecord{Type: dm.CertificateTypeHostInternal, Host: dm.HostRef(hostRef),
		NotBefore: cert.NotBefore.UTC(), NotAfter: cert.NotAfter.UTC(),
		Fingerprint: fp, FingerprintSha256: fp, FingerprintSha1: fingerprintSHA1(cert.Raw),
		Purpose: []dm.CertificatePurpose{}}
	_, err := tx.Insert(dm.Certificate.Class, "", rec.Row())
	return err
}

// joinCert is the certificate a joining host sent, checked against this
// coordinator's use of TLS: both or neither speak it
// (POOL_JOINING_HOST_TLS_VERIFICATION_MISMATCH), and a certificate that
// does not parse refuses the join (INVALID_VALUE). nil when neither does.
func (p *Pool) joinCert(s string) (*x509.Certificate, error) {
	if (s != "") != (p.cfg.TLS != nil) {
		return nil, xerr.New(xerr.PoolJoiningHostTLSVerificationMismatch)
	}
	if s == "" {
		return nil, nil
	}
	cert, err := parseCertPEM(s)
	if err != nil {
		return nil, xerr.New(xerr.InvalidValue, "certificate", err.Error())
	}
	return cert, nil
}

// firstContact is the HTTP client of a join's requests to the
// coordinator, which nothing pinned can check yet: it accepts the
// certificate presented first, and only that one afterwards, and seen()
// is its fingerprint. Without TLS it is the pool's own client.
func (p *Pool) firstContact() (client *http.Client, seen func() string) {
	if p.cfg.TLS == nil {
		return p.client, func() string { return "" }
	}
	var mu sync.Mutex
	var fp string
	record := func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errNotPinned
		}
		got := Fingerprint(cs.PeerCertificates[0].Raw)
		mu.Lock()
		defer mu.Unlock()
		// A join makes more than one connection (its versions, then the
		// join itself): each must be to the coordinator first seen.
		if fp != "" && fp != got {
			return fmt.Errorf("%w: the coordinator presented %s, then %s", errNotPinned, fp, got)
		}
		fp = got
		return nil
	}
	base, ok := p.client.Transport.(*http.Transport)
	if !ok {
		return p.client, func() string { return "" }
	}
	tr := base.Clone()
	tr.TLSClientConfig = pinnedTLS(p.cfg.TLS, record)
	tr.DisableKeepAlives = true
	// No redirect: the fingerprint kept is the coordinator's asked for.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &http.Client{Transport: tr, CheckRedirect: noRedirect}, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fp
	}
}

// verifyPeer is the VerifyConnection of this host's intra-pool TLS.
func (p *Pool) verifyPeer(cs tls.ConnectionState) error {
	return checkPinned(cs, p.joinPinned(), func() db.Reader { return p.cfg.Server.DB.Snapshot() })
}

// joinPinned is the coordinator's fingerprint seen at a join in progress.
func (p *Pool) joinPinned() string {
	if s := p.joinPin.Load(); s != nil {
		return *s
	}
	return ""
}
