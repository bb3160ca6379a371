package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"

	"toolstackd/internal/certs"
)

// poolTLS is the pool layer's TLS configuration when the host serves
// HTTPS: its certificate (made now if this is the first time) is the one
// the other hosts pin. nil when it does not: pool traffic is plain HTTP.
func (o options) poolTLS() (*tls.Config, error) {
	if o.listenHTTPS == "" {
		return nil, nil
	}
	certPath, keyPath, err := ensureCertificate(o.dataDir, o.ownIPs())
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

// ownIPs are the specific addresses this host serves its API on or is
// reached at (--listen, --listen-https, --advertise), for its
// certificate's subject alternative names: a client that checks the
// certificate of https://<address> finds it there.
func (o options) ownIPs() []net.IP {
	var ips []net.IP
	for _, a := range []string{o.listen, o.listenHTTPS, o.advertise} {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() && !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	return ips
}

// ensureCertificate makes a self-signed server certificate under the data
// dir the first time it is needed, naming the host, localhost and ips,
// and returns the certificate and key paths.
func ensureCertificate(dir string, ips []net.IP) (string, string, error) {
	certPath, keyPath := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if _, err := os.Stat(certPath); err == nil {
		if _, err := os.Stat(keyPath); err == nil {
			return certPath, keyPath, nil
		}
	}
	host, _ := os.Hostname()
	all := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, ip := range ips {
		if !slices.ContainsFunc(all, ip.Equal) {
			all = append(all, ip)
		}
	}
	certPEM, keyPEM, err := certs.SelfSigned(certs.Identity{Name: host, DNS: []string{host, "localhost"}, IPs: all}, 10)
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
