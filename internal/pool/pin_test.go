package pool

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// newCert makes a self-signed certificate and its key pair, as the
// daemon's first boot does.
func newCert(t testing.TB, name string) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour).Truncate(time.Second), NotAfter: time.Now().AddDate(1, 0, 0).Truncate(time.Second),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}

// tlsServer serves 200 over HTTPS on loopback with cert.
func tlsServer(t *testing.T, cert tls.Certificate) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// pinnedClient is an intra-pool client over d's pins (and extra), with a
// new connection for every request, so that every request is a handshake.
func pinnedClient(d *db.DB, extra *string) *http.Client {
	verify := func(cs tls.ConnectionState) error {
		return checkPinned(cs, *extra, func() db.Reader { return d.Snapshot() })
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: pinnedTLS(&tls.Config{}, verify), DisableKeepAlives: true}}
}

func get(c *http.Client, url string) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	return nil
}

// The fingerprint is xapi's: the SHA-256 of the DER bytes, uppercase hex
// pairs joined by colons.
func TestFingerprintFormat(t *testing.T) {
	_, leaf := newCert(t, "a")
	fp := Fingerprint(leaf.Raw)
	if !regexp.MustCompile(`^([0-9A-F]{2}:){31}[0-9A-F]{2}$`).MatchString(fp) {
		t.Fatalf("fingerprint %q", fp)
	}
	sum := sha256.Sum256(leaf.Raw)
	h := strings.ToUpper(hex.EncodeToString(sum[:]))
	var pairs []string
	for i := 0; i < len(h); i += 2 {
		pairs = append(pairs, h[i:i+2])
	}
	if want := strings.Join(pairs, ":"); fp != want {
		t.Fatalf("fingerprint %s, want %s", fp, want)
	}
	if got := Fingerprint([]byte{0x00, 0xab, 0x0f}); len(got) != 95 {
		t.Fatalf("fingerprint of 3 bytes: %q", got)
	}
}

// Over real TLS handshakes on loopback: a peer whose certificate is
// pinned is accepted, another is refused, the pinned one is refused once
// its row is removed, and a join's first-contact pin is accepted while it
// is set.
func TestPinnedHandshakes(t *testing.T) {
	d, hostRef := bootedDB(t)
	pairA, leafA := newCert(t, "a")
	pairB, _ := newCert(t, "b")
	srvA, srvB := tlsServer(t, pairA), tlsServer(t, pairB)
	if _, err := d.Update(func(tx *db.Tx) error { return putHostCert(tx, hostRef, leafA) }); err != nil {
		t.Fatal(err)
	}
	extra := ""
	c := pinnedClient(d, &extra)
	if err := get(c, srvA.URL); err != nil {
		t.Fatalf("the pinned peer: %v", err)
	}
	if err := get(c, srvB.URL); !errors.Is(err, errNotPinned) {
		t.Fatalf("a peer with another certificate: %v", err)
	}
	// A join's first contact pins the coordinator it saw.
	extra = Fingerprint(pairB.Leaf.Raw)
	if err := get(c, srvB.URL); err != nil {
		t.Fatalf("the peer pinned at a join: %v", err)
	}
	extra = ""
	// A join's first contact accepts whatever it is shown, and says what.
	joiner := &Pool{cfg: Config{TLS: &tls.Config{MinVersion: tls.VersionTLS12}}, client: &http.Client{Transport: &http.Transport{}}}
	first, seen := joiner.firstContact()
	if err := get(first, srvB.URL); err != nil || seen() != Fingerprint(pairB.Leaf.Raw) {
		t.Fatalf("first contact: %q, %v", seen(), err)
	}
	// The row goes (pool.eject, host.forget): the next handshake fails.
	if _, err := d.Update(func(tx *db.Tx) error {
		for _, r := range tx.All(dm.Certificate.Class) {
			if err := tx.Delete(dm.Certificate.Class, r.Ref); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := get(c, srvA.URL); !errors.Is(err, errNotPinned) {
		t.Fatalf("after its row was removed: %v", err)
	}
	// A row of another type with the same fingerprint pins nothing.
	if _, err := d.Update(func(tx *db.Tx) error {
		rec := dm.CertificateRecord{Type: dm.CertificateTypeHost, Host: dm.HostRef(hostRef), FingerprintSha256: Fingerprint(leafA.Raw)}
		_, err := tx.Insert(dm.Certificate.Class, "", rec.Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := get(c, srvA.URL); !errors.Is(err, errNotPinned) {
		t.Fatalf("pinned by a row of type host: %v", err)
	}
}

// A joining host's certificate is read with bounds: one PEM CERTIFICATE
// block, nothing else; anything else refuses the join with INVALID_VALUE,
// and a join where one side speaks TLS and the other does not is
// POOL_JOINING_HOST_TLS_VERIFICATION_MISMATCH.
func TestJoinCertificate(t *testing.T) {
	pair, leaf := newCert(t, "joiner")
	good := certPEM(leaf)
	p := &Pool{cfg: Config{TLS: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}}}
	got, err := p.joinCert(good)
	if err != nil || !got.Equal(leaf) {
		t.Fatalf("a good certificate: %v", err)
	}
	if own := ownCert(p.cfg.TLS); own == nil || !own.Equal(leaf) {
		t.Fatal("ownCert is not the configured certificate")
	}
	keyDER, err := x509.MarshalECPrivateKey(pair.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"garbage":    "not a certificate at all",
		"wrong type": string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})),
		"two blocks": good + good,
		"bad DER":    string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("\x30\x03\x02\x01")})),
		"truncated":  good[:len(good)/2],
		"oversized":  good + strings.Repeat(" ", maxCertPEM),
		"binary":     "\x00\xff\xfe-----BEGIN CERTIFICATE-----\n\x00\n-----END CERTIFICATE-----\n",
	}
	for name, s := range bad {
		_, err := p.joinCert(s)
		if code(err) != xerr.InvalidValue {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := p.joinCert(""); code(err) != xerr.PoolJoiningHostTLSVerificationMismatch {
		t.Errorf("no certificate to a TLS coordinator: %v", err)
	}
	plain := &Pool{}
	if _, err := plain.joinCert(good); code(err) != xerr.PoolJoiningHostTLSVerificationMismatch {
		t.Errorf("a certificate to a plain coordinator: %v", err)
	}
	if c, err := plain.joinCert(""); c != nil || err != nil {
		t.Errorf("plain both sides: %v %v", c, err)
	}
}

// A host has one host_internal row, replaced when its certificate
// changes, kept when it does not, with xapi's fields; and the records a
// leaving host takes with it include it.
func TestHostCertificateRow(t *testing.T) {
	d, hostRef := bootedDB(t)
	_, leafA := newCert(t, "a")
	_, leafB := newCert(t, "b")
	put := func(c *x509.Certificate) {
		t.Helper()
		if _, err := d.Update(func(tx *db.Tx) error { return putHostCert(tx, hostRef, c) }); err != nil {
			t.Fatal(err)
		}
	}
	rows := func() []*db.Row { return d.Snapshot().All(dm.Certificate.Class) }
	put(leafA)
	put(leafA)
	if n := len(rows()); n != 1 {
		t.Fatalf("%d rows after putting one certificate twice", n)
	}
	first := rows()[0].Ref
	put(leafB)
	all := rows()
	if len(all) != 1 || all[0].Ref == first {
		t.Fatalf("rows after a new certificate: %d", len(all))
	}
	var rec dm.CertificateRecord
	rec.FromRow(d.Snapshot().Values(all[0]))
	fp := Fingerprint(leafB.Raw)
	if rec.Type != dm.CertificateTypeHostInternal || string(rec.Host) != hostRef || rec.Name != "" ||
		rec.FingerprintSha256 != fp || rec.Fingerprint != fp || len(rec.FingerprintSha1) != 59 ||
		!rec.NotBefore.Equal(leafB.NotBefore) || !rec.NotAfter.Equal(leafB.NotAfter) {
		t.Fatalf("the row: %+v", rec)
	}
	snap := d.Snapshot()
	host, _ := snap.Get(dm.Host.Class, hostRef)
	found := false
	for _, r := range hostRecords(snap, host, true) {
		found = found || r.Ref == all[0].Ref
	}
	if !found {
		t.Fatal("a leaving host's records do not include its certificate")
	}
	for _, r := range hostRecords(snap, host, false) {
		if r.Class == dm.Certificate.Class {
			t.Fatal("a joining host brings its certificate rows")
		}
	}
}

// BenchmarkHandshake is the cost of a new intra-pool connection on
// loopback: a request on a new connection, plain, over TLS checked by
// pinning, and over TLS checked by nothing (the pin's own cost).
func BenchmarkHandshake(b *testing.B) {
	d := db.New(dm.Model, db.Options{})
	hostRef, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pair, leaf := newCert(b, "a")
	if _, err := d.Update(func(tx *db.Tx) error { return putHostCert(tx, hostRef, leaf) }); err != nil {
		b.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	plain := httptest.NewServer(h)
	defer plain.Close()
	secure := httptest.NewUnstartedServer(h)
	secure.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	secure.StartTLS()
	defer secure.Close()
	extra := ""
	none := func(tls.ConnectionState) error { return nil }
	run := func(name, url string, c *http.Client) {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := get(c, url); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	run("plain", plain.URL, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}})
	run("tls-pinned", secure.URL, pinnedClient(d, &extra))
	run("tls-unchecked", secure.URL, &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: pinnedTLS(&tls.Config{}, none)}})
}
