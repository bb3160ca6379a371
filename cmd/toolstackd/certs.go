package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"toolstackd/internal/certs"
)

// The host's certificates (internal/certs): the HTTPS listener serves
// them through the store's GetCertificate, so that a certificate
// installed over XenAPI counts from the next connection without a
// restart. Pool peers ask for certs.PoolServerName and get the internal
// (pinned, host_internal) certificate; every other client gets the host
// certificate, the operator's once one is installed.

// openCertStore makes the internal certificate on first start when the
// host serves HTTPS and opens the store.
func openCertStore(o options) (*certs.Store, error) {
	if o.listenHTTPS != "" {
		if _, _, err := ensureCertificate(o.dataDir, o.ownIPs()); err != nil {
			return nil, fmt.Errorf("certificate: %w", err)
		}
	}
	s, err := certs.Open(o.dataDir)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	return s, nil
}

// checkHTTPSOnly refuses --https-only without an HTTPS listener: the host
// would serve its API nowhere but the local socket.
func (o options) checkHTTPSOnly() error {
	if o.httpsOnly && o.listenHTTPS == "" {
		return fmt.Errorf("--https-only needs --listen-https")
	}
	return nil
}

// plainHandler is what the plain HTTP listeners (--listen and systemd's
// API sockets) serve. As xapi's host.https_only closes port 80, with
// --https-only they answer every request 403 Forbidden, naming the HTTPS
// port; without it they serve everything (xapi with https_only false
// serves its API on port 80; toolstackd has no web site to withhold).
// The local superuser socket is never restricted.
func plainHandler(o options, h http.Handler) http.Handler {
	if !o.httpsOnly {
		return h
	}
	msg := "This host serves HTTPS only (https-only): use https://HOST:" + portOf(o.listenHTTPS) + "/"
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, msg, http.StatusForbidden)
	})
}

// portOf is the port of a listen address.
func portOf(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return port
}

// clientTLS is the TLS configuration for connections to servers outside
// the pool (another pool's hosts): the system's roots and the pool's CA
// certificates; nil before the certificate store is open.
func (o *options) clientTLS() *tls.Config {
	if o.certStore == nil {
		return nil
	}
	return o.certStore.ClientTLS()
}
