package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"toolstackd/internal/certs"
)

// poolTLS is the pool layer's TLS configuration when the host serves
// HTTPS: its certificate (made now if this is the first time) is the one
// the other hosts pin. nil when it does not: pool traffic is plain HTTP.
func (o options) poolTLS() (*tls.Config, error) {
	if o.listenHTTPS == "" {
		return nil, nil
	}
	certPath, keyPath, err := ensureCertificate(o.dataDir)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	// Peers ask for the pool's server name: the listener answers it with
	// this (pinned) certificate even once clients get an operator's one.
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
		ServerName: certs.PoolServerName}, nil
}

// ensureCertificate makes a self-signed server certificate under the data
// dir the first time it is needed and returns the certificate and key
// paths.
func ensureCertificate(dir string) (string, string, error) {
	certPath, keyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if _, err := os.Stat(certPath); err == nil {
		if _, err := os.Stat(keyPath); err == nil {
			return certPath, keyPath, nil
		}
	}
	host, _ := os.Hostname()
	certPEM, keyPEM, err := certs.SelfSigned(certs.Identity{Name: host, DNS: []string{host, "localhost"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}, 10)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil { //nolint:gosec // a certificate is public; its key is written 0600
		return "", "", err
	}
	return certPath, keyPath, nil
}
