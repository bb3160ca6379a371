package certs

import (
	"crypto/x509"
	"log/slog"
	"net"
	"slices"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// Config is what the certificate messages need.
type Config struct {
	// Store is this host's certificates (its HTTPS listener serves them).
	Store *Store
	// HostRef is this host.
	HostRef string
	Log     *slog.Logger
	// PinGrace is how long host.refresh_server_certificate waits, in a
	// pool, between pinning a new internal certificate and serving it, so
	// that the other hosts have the pin first (default 2 s).
	PinGrace time.Duration
	// Now is the clock certificates are checked against (tests).
	Now func() time.Time
}

// The messages, as xapi has them:
//
//   - host.install_server_certificate: the operator's certificate, key
//     and chain, checked (see ValidateServer), become the certificate
//     clients see on the HTTPS port, from the next connection on; the
//     host's Certificate row of type host is replaced. Refused with HA
//     on (HA_IS_ENABLED), as xapi refuses it.
//   - host.reset_server_certificate: a new self-signed host certificate,
//     row replaced; host.emergency_reset_server_certificate: the same
//     without touching the database (it is for a host whose database
//     cannot be reached).
//   - host.refresh_server_certificate: a new internal (host_internal)
//     certificate, the one pool peers pin: pinned first (a second row),
//     then served, then the old row removed, so that the pool keeps
//     talking to this host throughout.
//   - host.get_server_certificate: the certificate clients see, in PEM.
//   - pool.install_ca_certificate / pool.certificate_install: a trusted
//     CA certificate under a name (a Certificate row of type ca, and a
//     file in the store's CA bundle); pool.uninstall_ca_certificate /
//     pool.certificate_uninstall remove it; pool.certificate_list names
//     them.
//
// The routing table (internal/datamodel/routes.json) runs the host
// messages on the host named and the pool ones on the coordinator.

// Register binds the certificate messages on srv.
func Register(srv *api.Server, cfg Config) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.PinGrace <= 0 {
		cfg.PinGrace = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &messages{cfg: cfg}
	api.Register(srv, m.installServer)
	api.Register(srv, m.resetServer)
	api.Register(srv, m.emergencyReset)
	api.Register(srv, m.refreshServer)
	api.Register(srv, m.getServer)
	api.Register(srv, func(c *api.Call, a dm.PoolInstallCaCertificateArgs) (dm.Void, error) {
		return dm.Void{}, m.installCA(c, a.Name, a.Cert)
	})
	api.Register(srv, func(c *api.Call, a dm.PoolCertificateInstallArgs) (dm.Void, error) {
		return dm.Void{}, m.installCA(c, a.Name, a.Cert)
	})
	api.Register(srv, func(c *api.Call, a dm.PoolUninstallCaCertificateArgs) (dm.Void, error) {
		return dm.Void{}, m.uninstallCA(c, a.Name, a.Force)
	})
	api.Register(srv, func(c *api.Call, a dm.PoolCertificateUninstallArgs) (dm.Void, error) {
		return dm.Void{}, m.uninstallCA(c, a.Name, false)
	})
	api.Register(srv, m.listCA)
}

type messages struct{ cfg Config }

func (m *messages) installServer(c *api.Call, a dm.HostInstallServerCertificateArgs) (dm.Void, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return dm.Void{}, err
	}
	if haEnabled(c.Snapshot()) {
		return dm.Void{}, xerr.New(xerr.HAIsEnabled)
	}
	srv, err := ValidateServer(a.Certificate, a.PrivateKey, a.CertificateChain, m.cfg.Now())
	if err != nil {
		return dm.Void{}, err
	}
	if err := m.cfg.Store.InstallHost(srv); err != nil {
		return dm.Void{}, xerr.New(xerr.InternalError, err.Error())
	}
	m.cfg.Log.Info("installed a server certificate", "fingerprint", FingerprintSHA256(srv.Leaf),
		"subject", srv.Leaf.Subject.String(), "not_after", srv.Leaf.NotAfter)
	return dm.Void{}, m.replaceRows(c, dm.CertificateTypeHost, srv.Leaf, true)
}

func (m *messages) resetServer(c *api.Call, a dm.HostResetServerCertificateArgs) (dm.Void, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return dm.Void{}, err
	}
	leaf, err := m.cfg.Store.ResetHost(m.identity(c.Snapshot()))
	if err != nil {
		return dm.Void{}, xerr.New(xerr.InternalError, err.Error())
	}
	m.cfg.Log.Info("reset the server certificate", "fingerprint", FingerprintSHA256(leaf))
	return dm.Void{}, m.replaceRows(c, dm.CertificateTypeHost, leaf, true)
}

func (m *messages) emergencyReset(c *api.Call, _ dm.HostEmergencyResetServerCertificateArgs) (dm.Void, error) {
	leaf, err := m.cfg.Store.ResetHost(m.identity(c.Snapshot()))
	if err != nil {
		return dm.Void{}, xerr.New(xerr.InternalError, err.Error())
	}
	m.cfg.Log.Warn("emergency reset of the server certificate (the database is not updated)", "fingerprint", FingerprintSHA256(leaf))
	return dm.Void{}, nil
}

// refreshServer replaces the internal certificate in three steps: the
// new one is pinned beside the old (a second host_internal row), served
// once the other hosts have had time to apply the pin, and the old row
// is removed. A peer connection made at any point meets a pinned
// certificate.
func (m *messages) refreshServer(c *api.Call, a dm.HostRefreshServerCertificateArgs) (dm.Void, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return dm.Void{}, err
	}
	snap := c.Snapshot()
	certPEM, keyPEM, leaf, err := NewPoolPair(m.identity(snap))
	if err != nil {
		return dm.Void{}, xerr.New(xerr.InternalError, err.Error())
	}
	if err := m.replaceRows(c, dm.CertificateTypeHostInternal, leaf, false); err != nil {
		return dm.Void{}, err
	}
	if snap.Count(dm.Host.Class) > 1 {
		time.Sleep(m.cfg.PinGrace)
	}
	if err := m.cfg.Store.SetPool(certPEM, keyPEM); err != nil {
		// Not served: take the new pin back.
		_ = c.Update(func(tx *db.Tx) error {
			return deleteRows(tx, m.cfg.HostRef, dm.CertificateTypeHostInternal, FingerprintSHA256(leaf), true)
		})
		return dm.Void{}, xerr.New(xerr.InternalError, err.Error())
	}
	m.cfg.Log.Info("refreshed the pool's internal certificate", "fingerprint", FingerprintSHA256(leaf))
	return dm.Void{}, c.Update(func(tx *db.Tx) error {
		return deleteRows(tx, m.cfg.HostRef, dm.CertificateTypeHostInternal, FingerprintSHA256(leaf), false)
	})
}

func (m *messages) getServer(c *api.Call, a dm.HostGetServerCertificateArgs) (string, error) {
	if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
		return "", err
	}
	leaf := m.cfg.Store.HostCertificate()
	if leaf == nil {
		return "", xerr.New(xerr.CertificateLibraryCorrupt)
	}
	return EncodeCert(leaf), nil
}

func (m *messages) installCA(c *api.Call, name, text string) error {
	cert, err := ParseCA(text, m.cfg.Now())
	if err != nil {
		return err
	}
	if err := m.cfg.Store.InstallCA(name, cert); err != nil {
		return err
	}
	return c.Update(func(tx *db.Tx) error {
		for _, row := range tx.All(dm.Certificate.Class) {
			if row.String(dm.Certificate.Type) == string(dm.CertificateTypeCa) && row.String(dm.Certificate.Name) == name {
				if err := tx.Delete(dm.Certificate.Class, row.Ref); err != nil {
					return err
				}
			}
		}
		rec := record(dm.CertificateTypeCa, "", cert)
		rec.Name = name
		_, err := tx.Insert(dm.Certificate.Class, "", rec.Row())
		return err
	})
}

func (m *messages) uninstallCA(c *api.Call, name string, force bool) error {
	if err := m.cfg.Store.UninstallCA(name, force); err != nil {
		return err
	}
	return c.Update(func(tx *db.Tx) error {
		found := false
		for _, row := range tx.All(dm.Certificate.Class) {
			if row.String(dm.Certificate.Type) == string(dm.CertificateTypeCa) && row.String(dm.Certificate.Name) == name {
				found = true
				if err := tx.Delete(dm.Certificate.Class, row.Ref); err != nil {
					return err
				}
			}
		}
		if !found {
			// xapi: the file is gone but no row names it.
			return xerr.New(xerr.InvalidValue, "certificate:name", name)
		}
		return nil
	})
}

func (m *messages) listCA(c *api.Call, _ dm.PoolCertificateListArgs) ([]string, error) {
	names := []string{}
	c.Snapshot().Ascend(dm.Certificate.Class, func(row *db.Row) bool {
		if row.String(dm.Certificate.Type) == string(dm.CertificateTypeCa) && row.String(dm.Certificate.Name) != "" {
			names = append(names, row.String(dm.Certificate.Name))
		}
		return true
	})
	return names, nil
}

// replaceRows writes cert as this host's Certificate row of type typ;
// with dropOld the host's other rows of that type go in the same
// transaction (without, they stay: the refresh's second pin).
func (m *messages) replaceRows(c *api.Call, typ dm.CertificateType, cert *x509.Certificate, dropOld bool) error {
	fp := FingerprintSHA256(cert)
	return c.Update(func(tx *db.Tx) error {
		if dropOld {
			if err := deleteRows(tx, m.cfg.HostRef, typ, fp, false); err != nil {
				return err
			}
		}
		for _, row := range tx.All(dm.Certificate.Class) {
			if row.String(dm.Certificate.Host) == m.cfg.HostRef && row.String(dm.Certificate.Type) == string(typ) &&
				row.String(dm.Certificate.FingerprintSha256) == fp {
				return nil // already there
			}
		}
		rec := record(typ, m.cfg.HostRef, cert)
		_, err := tx.Insert(dm.Certificate.Class, "", rec.Row())
		return err
	})
}

// deleteRows deletes host's Certificate rows of type typ other than the
// one with fingerprint keep (only that one, with only).
func deleteRows(tx *db.Tx, host string, typ dm.CertificateType, keep string, only bool) error {
	for _, row := range tx.All(dm.Certificate.Class) {
		if row.String(dm.Certificate.Host) != host || row.String(dm.Certificate.Type) != string(typ) {
			continue
		}
		if (row.String(dm.Certificate.FingerprintSha256) == keep) != only {
			continue
		}
		if err := tx.Delete(dm.Certificate.Class, row.Ref); err != nil {
			return err
		}
	}
	return nil
}

// record is a Certificate row for cert.
func record(typ dm.CertificateType, host string, cert *x509.Certificate) dm.CertificateRecord {
	fp := FingerprintSHA256(cert)
	return dm.CertificateRecord{Type: typ, Host: dm.HostRef(host),
		NotBefore: cert.NotBefore.UTC(), NotAfter: cert.NotAfter.UTC(),
		Fingerprint: fp, FingerprintSha256: fp, FingerprintSha1: FingerprintSHA1(cert),
		Purpose: []dm.CertificatePurpose{}}
}

// identity is what this host's self-signed certificates name: its
// hostname and address, and the loopback names.
func (m *messages) identity(r db.Reader) Identity {
	id := Identity{Name: "localhost", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}
	if h, ok := r.Get(dm.Host.Class, m.cfg.HostRef); ok {
		if name := h.String(dm.Host.Hostname); name != "" {
			id.Name = name
			if name != "localhost" {
				id.DNS = append([]string{name}, id.DNS...)
			}
		}
		if ip := net.ParseIP(h.String(dm.Host.Address)); ip != nil && !slices.ContainsFunc(id.IPs, ip.Equal) {
			id.IPs = append([]net.IP{ip}, id.IPs...)
		}
	}
	return id
}

// haEnabled reports whether HA is on in the pool.
func haEnabled(r db.Reader) bool {
	on := false
	r.Ascend(dm.Pool.Class, func(row *db.Row) bool {
		on, _ = row.Get(dm.Pool.HAEnabled).(bool)
		return false
	})
	return on
}
