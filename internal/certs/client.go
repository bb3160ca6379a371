package certs

import (
	"crypto/tls"
	"crypto/x509"
	"os"
)

// ClientTLS is the configuration for this host's own TLS connections to
// servers outside its pool (another pool's hosts, for cross-pool
// migration): a server is trusted when its chain leads to one of the
// system's roots or to a CA certificate installed in the pool
// (pool.install_ca_certificate), read as they are now. A pool's own
// hosts are checked by their pinned certificates instead (raftnet).
func (s *Store) ClientTLS() *tls.Config {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if pem, err := os.ReadFile(s.CABundle()); err == nil {
		roots.AppendCertsFromPEM(pem)
	}
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}
