package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"toolstackd/internal/atomicfile"
	"toolstackd/internal/xerr"
)

// PoolServerName is the TLS server name (SNI) the hosts of a pool send
// when they talk to each other: the listener answers it with the pool's
// internal certificate (host_internal, the one the pool pins), and every
// other client with the host certificate. xapi's stunnel does the same
// with its "pool" SNI.
const PoolServerName = "pool"

// The store's files, under the data dir.
const (
	// PoolCertFile and PoolKeyFile are the host_internal certificate and
	// key: the self-signed pair made at first start.
	PoolCertFile = "server.crt"
	PoolKeyFile  = "server.key"
	// hostFile holds the host certificate clients see when it is not the
	// internal one: key, leaf and chain in one file (xapi's xapi-ssl.pem),
	// so that one rename replaces all three.
	hostFile = "certs/host.pem"
	// caDir holds the trusted CA certificates, one file per name, and
	// caBundle all of them in one file for TLS clients.
	caDir    = "certs/ca"
	caBundle = "certs/ca-bundle.pem"
	// newSuffix marks a file written but not yet renamed into place.
	newSuffix = ".new"
)

// Store is a host's certificates on disk and the ones its HTTPS
// listener serves, swapped in place when they change.
type Store struct {
	dir string
	mu  sync.Mutex // one change at a time
	// pool is the host_internal pair; host the host certificate when it
	// is not the same (nil: clients get pool's too).
	pool, host atomic.Pointer[tls.Certificate]
}

// Open reads the certificates in the data dir dir. It finishes a
// replacement of the internal pair that a crash interrupted. Missing
// files are not an error: a host without HTTPS has none.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir}
	if err := s.recoverPool(); err != nil {
		return nil, err
	}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the data dir the store lives in.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) string { return filepath.Join(s.dir, filepath.FromSlash(name)) }

// Reload reads the certificate files again.
func (s *Store) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	pair, err := tls.LoadX509KeyPair(s.path(PoolCertFile), s.path(PoolKeyFile))
	switch {
	case err == nil:
		s.pool.Store(&pair)
	case errors.Is(err, fs.ErrNotExist):
		s.pool.Store(nil)
	default:
		return fmt.Errorf("certs: %s: %w", PoolCertFile, err)
	}
	b, err := os.ReadFile(s.path(hostFile))
	switch {
	case err == nil:
		pair, err := tls.X509KeyPair(b, b)
		if err != nil {
			return fmt.Errorf("certs: %s: %w", hostFile, err)
		}
		s.host.Store(&pair)
	case errors.Is(err, fs.ErrNotExist):
		s.host.Store(nil)
	default:
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}

// GetCertificate is the HTTPS listener's tls.Config.GetCertificate: the
// internal certificate for a pool peer (server name PoolServerName), the
// host certificate for anyone else. It reads the current pair at each
// handshake, so a replacement counts from the next connection on.
func (s *Store) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if hello == nil || hello.ServerName != PoolServerName {
		if c := s.host.Load(); c != nil {
			return c, nil
		}
	}
	if c := s.pool.Load(); c != nil {
		return c, nil
	}
	return nil, errEmpty
}

// ServerTLS is the HTTPS listener's configuration.
func (s *Store) ServerTLS() *tls.Config {
	return &tls.Config{GetCertificate: s.GetCertificate, MinVersion: tls.VersionTLS12}
}

// HostCertificate is the leaf clients see (the internal one when no
// host certificate of its own is installed), or nil for none.
func (s *Store) HostCertificate() *x509.Certificate {
	c, err := s.GetCertificate(nil)
	if err != nil {
		return nil
	}
	return leafOf(c)
}

// PoolCertificate is the internal (host_internal) leaf, or nil.
func (s *Store) PoolCertificate() *x509.Certificate { return leafOf(s.pool.Load()) }

// HasHostCertificate reports whether clients get a certificate other
// than the internal one.
func (s *Store) HasHostCertificate() bool { return s.host.Load() != nil }

func leafOf(c *tls.Certificate) *x509.Certificate {
	if c == nil || len(c.Certificate) == 0 {
		return nil
	}
	if c.Leaf != nil {
		return c.Leaf
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil
	}
	return leaf
}

// InstallHost makes a validated server certificate the host certificate:
// its file is replaced (written aside, then renamed over the old one) and
// the listener serves it from the next handshake on.
func (s *Store) InstallHost(srv *Server) error {
	text := srv.KeyPEM + srv.CertPEM + srv.ChainPEM
	pair, err := tls.X509KeyPair([]byte(text), []byte(text))
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeAtomic(s.path(hostFile), []byte(text), 0o600); err != nil {
		return err
	}
	s.host.Store(&pair)
	return nil
}

// Identity is what a self-signed certificate names.
type Identity struct {
	Name string // the subject's common name
	DNS  []string
	IPs  []net.IP
}

// SelfSigned makes a self-signed server certificate (ECDSA P-256,
// SHA-256, valid for years from an hour ago) and returns it and its key
// in PEM.
func SelfSigned(id Identity, years int) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: id.Name, Organization: []string{"toolstackd"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(years, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     id.DNS,
		IPAddresses:  id.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// ResetHost replaces the host certificate with a new self-signed one
// (host.reset_server_certificate) and returns its leaf.
func (s *Store) ResetHost(id Identity) (*x509.Certificate, error) {
	certPEM, keyPEM, err := SelfSigned(id, 10)
	if err != nil {
		return nil, err
	}
	text := append(keyPEM, certPEM...)
	pair, err := tls.X509KeyPair(text, text)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := writeAtomic(s.path(hostFile), text, 0o600); err != nil {
		return nil, err
	}
	s.host.Store(&pair)
	return leafOf(&pair), nil
}

// NewPoolPair makes a new internal pair without installing it: the
// caller pins it in the pool first, then installs it with SetPool.
func NewPoolPair(id Identity) (certPEM, keyPEM []byte, leaf *x509.Certificate, err error) {
	certPEM, keyPEM, err = SelfSigned(id, 10)
	if err != nil {
		return nil, nil, nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, err
	}
	return certPEM, keyPEM, leafOf(&pair), nil
}

// SetPool replaces the internal pair (server.crt and server.key) and
// serves it to pool peers from the next handshake on. Both files are
// written aside first, then the key and then the certificate renamed
// into place; Open finishes the renames if a crash stops them half way.
func (s *Store) SetPool(certPEM, keyPEM []byte) error {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	crt, key := s.path(PoolCertFile), s.path(PoolKeyFile)
	if err := writeSynced(key+newSuffix, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeSynced(crt+newSuffix, certPEM, 0o644); err != nil {
		_ = os.Remove(key + newSuffix)
		return err
	}
	if err := os.Rename(key+newSuffix, key); err != nil {
		return err
	}
	if err := os.Rename(crt+newSuffix, crt); err != nil {
		return err
	}
	_ = atomicfile.SyncDir(s.dir) // best effort: the renames are done
	s.pool.Store(&pair)
	return nil
}

// recoverPool completes or undoes an interrupted SetPool: with both new
// files present nothing was renamed yet (drop them); with the
// certificate's alone the key is in place already (rename it too).
func (s *Store) recoverPool() error {
	crt, key := s.path(PoolCertFile), s.path(PoolKeyFile)
	_, errKey := os.Stat(key + newSuffix)
	_, errCrt := os.Stat(crt + newSuffix)
	switch {
	case errKey == nil && errCrt == nil:
		_ = os.Remove(key + newSuffix)
		_ = os.Remove(crt + newSuffix)
	case errCrt == nil:
		return os.Rename(crt+newSuffix, crt)
	case errKey == nil:
		_ = os.Remove(key + newSuffix) // a crash while writing the certificate
	}
	return nil
}

// InstallCA adds a trusted CA certificate (already checked) under name:
// CERTIFICATE_ALREADY_EXISTS [name] when one is there.
func (s *Store) InstallCA(name string, cert *x509.Certificate) error {
	if err := CheckName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := filepath.Join(s.path(caDir), name)
	if _, err := os.Stat(p); err == nil {
		return xerr.New(xerr.CertificateAlreadyExists, name)
	}
	if err := os.MkdirAll(s.path(caDir), 0o700); err != nil {
		return xerr.New(xerr.CertificateLibraryCorrupt)
	}
	if err := writeAtomic(p, []byte(EncodeCert(cert)), 0o644); err != nil {
		return xerr.New(xerr.CertificateLibraryCorrupt)
	}
	if err := s.writeBundle(); err != nil {
		return xerr.New(xerr.CertificateLibraryCorrupt)
	}
	return nil
}

// UninstallCA removes the trusted CA certificate name:
// CERTIFICATE_DOES_NOT_EXIST [name] when there is none, unless force.
func (s *Store) UninstallCA(name string, force bool) error {
	if err := CheckName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := filepath.Join(s.path(caDir), name)
	if _, err := os.Lstat(p); err != nil {
		if force {
			return nil
		}
		return xerr.New(xerr.CertificateDoesNotExist, name)
	}
	if err := os.Remove(p); err != nil {
		return xerr.New(xerr.CertificateCorrupt, name)
	}
	if err := s.writeBundle(); err != nil {
		return xerr.New(xerr.CertificateCorrupt, name)
	}
	return nil
}

// CANames are the names of the trusted CA certificates installed here.
func (s *Store) CANames() []string {
	entries, err := os.ReadDir(s.path(caDir))
	if err != nil {
		return []string{}
	}
	names := []string{}
	for _, e := range entries {
		if e.Type().IsRegular() && CheckName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	return names
}

// CABundle is the path of the bundle of trusted CA certificates (every
// one installed, in name order), for TLS clients that check a server by
// them (xe --cafile); it does not exist while none is installed.
func (s *Store) CABundle() string { return s.path(caBundle) }

// writeBundle rewrites the CA bundle from the CA directory (under mu).
func (s *Store) writeBundle() error {
	names := s.CANames()
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(s.path(caDir), n)) //nolint:gosec // a checked name in the store's own directory
		if err != nil {
			return err
		}
		b.Write(data)
	}
	if b.Len() == 0 {
		if err := os.Remove(s.path(caBundle)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeAtomic(s.path(caBundle), []byte(b.String()), 0o644)
}

// writeAtomic replaces path with data (atomicfile), making its
// directory first.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, mode)
}

// writeSynced writes a file and syncs it to disk.
func writeSynced(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode) //nolint:gosec // the store's own files
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
