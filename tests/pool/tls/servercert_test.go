package tls

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// An operator's certificate (host.install_server_certificate) on a host
// that serves HTTPS: the RSA keys and certificates the tests install.
type opCert struct {
	caPEM, leafPEM, keyPEM string
	ca, leaf               *x509.Certificate
}

// newOpCert makes a CA and a leaf it signs for the given IPs, valid
// from..to, with an RSA key of bits.
func newOpCert(t *testing.T, bits int, from, to time.Time, ips ...string) opCert {
	t.Helper()
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	key, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toolstackd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "operator"},
		NotBefore: from, NotAfter: to, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(typ string, b []byte) string { return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})) }
	return opCert{caPEM: enc("CERTIFICATE", caDER), leafPEM: enc("CERTIFICATE", der), keyPEM: enc("PRIVATE KEY", kder), ca: ca, leaf: leaf}
}

// servedAs is the fingerprint of the certificate the HTTPS listener at
// addr presents to a client sending the server name sni ("" for none;
// "pool" is what the hosts of a pool send each other).
func servedAs(t *testing.T, addr, sni string) string {
	t.Helper()
	// A daemon just restarted is ready once its plain listener answers;
	// its TLS listener may open a moment later: a refused connection is
	// tried again for a few seconds.
	var conn *tls.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{ServerName: sni, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // only reading what it presents
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	return fingerprintOf(conn.ConnectionState().PeerCertificates[0].Raw)
}

// certRecords are the Certificate records on host i (through session s),
// by ref.
func certRecords(t *testing.T, ctx context.Context, c *pooltest.Client, p *pooltest.Pool, i int, s string) map[string]map[string]any {
	t.Helper()
	raw, err := c.Call(ctx, p.Addr(i), "Certificate.get_all_records", s)
	var certs map[string]map[string]any
	if err != nil || json.Unmarshal(raw, &certs) != nil {
		t.Fatalf("Certificate.get_all_records on host %d: %s %v", i, raw, err)
	}
	return certs
}

// ofType are the records of a type for host ("" : any host).
func ofType(certs map[string]map[string]any, typ, host string) []map[string]any {
	var out []map[string]any
	for _, r := range certs {
		if r["type"] == typ && (host == "" || r["host"] == host) {
			out = append(out, r)
		}
	}
	return out
}

func wantCode(t *testing.T, what string, err error, code string, params ...string) {
	t.Helper()
	if got := pooltest.Code(err); got != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	for _, p := range params {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: %v, want %s with %q", what, err, code, p)
		}
	}
}

// A host serving HTTPS takes an operator's certificate over XenAPI: it is
// checked as xapi checks one (expired, RSA 1024, key mismatch refused,
// nothing served changes), served to clients from the next connection
// without a restart (chain included, verifiable with the CA), recorded
// as the host's Certificate of type host, kept across a restart, and
// replaced by host.reset_server_certificate; pool peers (server name
// "pool") keep getting the internal certificate all along. Trusted CAs
// are installed, listed and removed with xapi's errors.
func TestServerCertificate(t *testing.T) {
	ctx := suite.Ctx(t)
	p, https := suite.TLSPool(t, ctx, 1)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	host := suite.HostRefs(t, ctx, c, p, 0, s)[0]
	ip := pooltest.HostIP(0).String()
	addr := testdaemon.Addr(ip, https)
	internal := onDisk(t, p.Hosts[0].DataDir)
	if got := servedAs(t, addr, ""); got != internal {
		t.Fatalf("before an install, clients get %s, not the internal %s", got, internal)
	}

	now := time.Now()
	op := newOpCert(t, 2048, now.Add(-time.Hour), now.Add(24*time.Hour), ip)

	// Refused: nothing served changes.
	expired := newOpCert(t, 2048, now.Add(-48*time.Hour), now.Add(-24*time.Hour), ip)
	_, err = c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, host, expired.leafPEM, expired.keyPEM, "")
	wantCode(t, "an expired certificate", err, "SERVER_CERTIFICATE_EXPIRED")
	small := newOpCert(t, 1024, now.Add(-time.Hour), now.Add(24*time.Hour), ip)
	_, err = c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, host, small.leafPEM, small.keyPEM, "")
	wantCode(t, "an RSA 1024 key", err, "SERVER_CERTIFICATE_KEY_RSA_LENGTH_NOT_SUPPORTED", "1024")
	_, err = c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, host, op.leafPEM, expired.keyPEM, "")
	wantCode(t, "another certificate's key", err, "SERVER_CERTIFICATE_KEY_MISMATCH")
	_, err = c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, host, op.leafPEM, op.keyPEM, "no chain")
	wantCode(t, "a chain that is not PEM", err, "SERVER_CERTIFICATE_CHAIN_INVALID")
	if got := servedAs(t, addr, ""); got != internal {
		t.Fatal("a refused certificate changed what is served")
	}

	// Installed: served at once, with its chain.
	if _, err := c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, host, op.leafPEM, op.keyPEM, op.caPEM); err != nil {
		t.Fatal(err)
	}
	want := fingerprintOf(op.leaf.Raw)
	if got := servedAs(t, addr, ""); got != want {
		t.Fatalf("after the install, clients get %s, want %s", got, want)
	}
	if got := servedAs(t, addr, "pool"); got != internal {
		t.Fatalf("after the install, pool peers get %s, want the internal %s", got, internal)
	}
	roots := x509.NewCertPool()
	roots.AddCert(op.ca)
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: ip, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("checking the installed certificate with its CA: %v", err)
	}
	if n := len(conn.ConnectionState().PeerCertificates); n != 2 {
		t.Errorf("%d certificates presented, want the leaf and its chain", n)
	}
	_ = conn.Close()
	pemOut, err := c.CallString(ctx, p.Addr(0), "host.get_server_certificate", s, host)
	if err != nil || strings.TrimSpace(pemOut) != strings.TrimSpace(op.leafPEM) {
		t.Fatalf("host.get_server_certificate: %v\n%s", err, pemOut)
	}
	certs := certRecords(t, ctx, c, p, 0, s)
	hostCerts := ofType(certs, "host", host)
	if len(hostCerts) != 1 || hostCerts[0]["fingerprint_sha256"] != want || hostCerts[0]["fingerprint"] != want ||
		hostCerts[0]["fingerprint_sha1"] == "" || hostCerts[0]["not_after"] == "" || hostCerts[0]["name"] != "" {
		t.Fatalf("the host's certificate records: %v", certs)
	}

	// Kept across a restart.
	p.Restart(0)
	if got := servedAs(t, addr, ""); got != want {
		t.Fatal("the installed certificate is not served after a restart")
	}
	if got := servedAs(t, addr, "pool"); got != internal {
		t.Fatal("the internal certificate changed across a restart")
	}

	// Reset: a new self-signed certificate, the record replaced.
	if s, err = p.Login(ctx, c, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "host.reset_server_certificate", s, host); err != nil {
		t.Fatal(err)
	}
	reset := servedAs(t, addr, "")
	if reset == want || reset == internal {
		t.Fatalf("after a reset, clients get %s (installed %s, internal %s)", reset, want, internal)
	}
	hostCerts = ofType(certRecords(t, ctx, c, p, 0, s), "host", host)
	if len(hostCerts) != 1 || hostCerts[0]["fingerprint_sha256"] != reset {
		t.Fatalf("the host's certificate records after a reset: %v", hostCerts)
	}

	// Trusted CAs.
	list := func() string {
		t.Helper()
		raw, err := c.Call(ctx, p.Addr(0), "pool.certificate_list", s)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	if got := list(); got != "[]" {
		t.Fatalf("pool.certificate_list at first: %s", got)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.certificate_install", s, "test-ca.pem", op.caPEM); err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(0), "pool.install_ca_certificate", s, "test-ca.pem", op.caPEM)
	wantCode(t, "the same name again", err, "CERTIFICATE_ALREADY_EXISTS", "test-ca.pem")
	_, err = c.Call(ctx, p.Addr(0), "pool.certificate_install", s, "../x.pem", op.caPEM)
	wantCode(t, "a name with a slash", err, "CERTIFICATE_NAME_INVALID")
	_, err = c.Call(ctx, p.Addr(0), "pool.certificate_install", s, "expired.pem", expired.leafPEM)
	wantCode(t, "an expired CA", err, "CA_CERTIFICATE_EXPIRED")
	_, err = c.Call(ctx, p.Addr(0), "pool.certificate_install", s, "junk.pem", "junk")
	wantCode(t, "not a certificate", err, "CA_CERTIFICATE_INVALID")
	if got := list(); got != `["test-ca.pem"]` {
		t.Fatalf("pool.certificate_list: %s", got)
	}
	cas := ofType(certRecords(t, ctx, c, p, 0, s), "ca", "")
	if len(cas) != 1 || cas[0]["name"] != "test-ca.pem" || cas[0]["fingerprint_sha256"] != fingerprintOf(op.ca.Raw) {
		t.Fatalf("the CA's record: %v", cas)
	}
	bundle, err := os.ReadFile(filepath.Join(p.Hosts[0].DataDir, "certs", "ca-bundle.pem"))
	if err != nil || !bytes.Contains(bundle, []byte(strings.TrimSpace(op.caPEM))) {
		t.Fatalf("the CA bundle: %v\n%s", err, bundle)
	}
	if _, err := c.Call(ctx, p.Addr(0), "pool.certificate_uninstall", s, "test-ca.pem"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(0), "pool.certificate_uninstall", s, "test-ca.pem")
	wantCode(t, "uninstalling it again", err, "CERTIFICATE_DOES_NOT_EXIST", "test-ca.pem")
	if got := list(); got != "[]" {
		t.Fatalf("pool.certificate_list after the uninstall: %s", got)
	}
}

// In a two-host TLS pool, an operator's certificate installed on the
// coordinator (and one on the member, through the coordinator) changes
// what clients see but not what the hosts pin: writes still replicate, a
// call forwarded to the member runs, a restarted member comes back live.
// host.refresh_server_certificate then replaces the member's internal
// certificate: pinned before it is served, so that the pool still
// reaches the member, also after it restarts with it.
func TestTLSPoolServerCertificate(t *testing.T) {
	ctx := suite.Ctx(t)
	p, https := suite.TLSPool(t, ctx, 2)
	c := pooltest.NewClient(netip.Addr{})
	if k := p.Coordinator(t, 30*time.Second); k != 0 {
		t.Fatalf("coordinator is host %d", k)
	}
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	refs := suite.HostRefs(t, ctx, c, p, 0, s)
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	addr := func(i int) string { return testdaemon.Addr(pooltest.HostIP(i).String(), https) }
	internal := map[int]string{0: onDisk(t, p.Hosts[0].DataDir), 1: onDisk(t, p.Hosts[1].DataDir)}

	now := time.Now()
	for i := range 2 {
		op := newOpCert(t, 2048, now.Add(-time.Hour), now.Add(24*time.Hour), pooltest.HostIP(i).String())
		// Both calls go to the coordinator; the member's is forwarded.
		if _, err := c.Call(ctx, p.Addr(0), "host.install_server_certificate", s, refs[i], op.leafPEM, op.keyPEM, ""); err != nil {
			t.Fatalf("installing host %d's certificate: %v", i, err)
		}
		if got, want := servedAs(t, addr(i), ""), fingerprintOf(op.leaf.Raw); got != want {
			t.Fatalf("host %d serves %s to clients, want the installed %s", i, got, want)
		}
		if got := servedAs(t, addr(i), "pool"); got != internal[i] {
			t.Fatalf("host %d serves %s to peers, want its internal %s", i, got, internal[i])
		}
	}

	stillWorks := func(what, desc string) {
		t.Helper()
		if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, desc); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		suite.WaitReplica(t, ctx, c, p, 1, pool, desc, 15*time.Second)
		vm, err := c.CallString(ctx, p.Addr(0), "VM.create", s, testdaemon.VMRecord("servercert-"+desc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, refs[1], false, false); err != nil {
			t.Fatalf("%s: VM.start_on the member: %v\n%s", what, err, p.Hosts[0].LogTail(30))
		}
		if _, err := c.Call(ctx, p.Addr(0), "VM.hard_shutdown", s, vm); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	stillWorks("after installing operator certificates", "operator-certs")

	// The member restarted: it dials the coordinator anew and is live.
	p.Restart(1)
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, 2); err != nil {
		t.Fatalf("the member restarted after the install: %v", err)
	}
	stillWorks("after the member restarted", "member-restarted")

	// The member's internal certificate refreshed: pinned, then served.
	if _, err := c.Call(ctx, p.Addr(0), "host.refresh_server_certificate", s, refs[1]); err != nil {
		t.Fatal(err)
	}
	fresh := onDisk(t, p.Hosts[1].DataDir)
	if fresh == internal[1] {
		t.Fatal("host.refresh_server_certificate left the internal certificate as it was")
	}
	if got := servedAs(t, addr(1), "pool"); got != fresh {
		t.Fatalf("the member serves %s to peers, want the refreshed %s", got, fresh)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		pins := ofType(certRecords(t, ctx, c, p, 0, s), "host_internal", refs[1])
		if len(pins) == 1 && pins[0]["fingerprint_sha256"] == fresh {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member's pins after the refresh: %v", pins)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stillWorks("after the refresh", "refreshed")
	p.Restart(1)
	lctx2, cancel2 := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel2()
	if err := p.WaitLive(lctx2, 2); err != nil {
		t.Fatalf("the member restarted with its refreshed certificate: %v", err)
	}
	stillWorks("after the member restarted with its refreshed certificate", "refreshed-restarted")
}

// With --https-only the plain listener refuses every request (as xapi's
// host.https_only closes port 80) while HTTPS and the local superuser
// socket serve as before.
func TestHTTPSOnly(t *testing.T) {
	if !pooltest.DaemonHasFlag(t, "--https-only") {
		t.Skip("toolstackd has no --https-only")
	}
	httpsAddr := testdaemon.FreeAddr(t, "127.0.0.1")
	d := testdaemon.Start(t, testdaemon.Options{ExtraArgs: []string{"--listen-https", httpsAddr, "--https-only"},
		Ready: func(*testdaemon.Daemon) bool { return true }})
	body := `{"jsonrpc":"2.0","id":1,"method":"session.login_with_password","params":["root","` + testdaemon.DefaultPassword + `","1.0","test"]}`
	post := func(hc *http.Client, url string) (int, string) {
		t.Helper()
		var resp *http.Response
		var err error
		for range 100 { // the HTTPS listener opens just after the plain one
			if resp, err = hc.Post(url, "application/json", strings.NewReader(body)); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, text := post(http.DefaultClient, d.URL+"/jsonrpc")
	if code != http.StatusForbidden || !strings.Contains(text, "HTTPS only") {
		t.Fatalf("plain HTTP with --https-only: %d %s", code, text)
	}
	tlsClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // the daemon's self-signed certificate
	code, text = post(tlsClient, "https://"+httpsAddr+"/jsonrpc")
	if code != http.StatusOK || !strings.Contains(text, `"result":"OpaqueRef:`) {
		t.Fatalf("HTTPS with --https-only: %d %s", code, text)
	}
	local := suite.SocketCaller(t, filepath.Join(d.DataDir, "xapi.sock"))
	var ls string
	_ = json.Unmarshal(local("session.login_with_password", "root", ""), &ls) // no password on the local socket
	if raw := local("host.get_all", ls); !strings.Contains(string(raw), "OpaqueRef:") {
		t.Fatalf("the local socket with --https-only: %s", raw)
	}
}
