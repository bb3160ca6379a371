// Package tls tests a pool whose hosts serve HTTPS: joining and replicating
// over TLS, the hosts' server certificates (installed, reset, rotated,
// pinned by the members) and HTTPS-only hosts.
package tls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// fingerprintOf is a DER certificate's SHA-256 fingerprint as xapi
// writes it: uppercase hex pairs separated by colons.
func fingerprintOf(der []byte) string {
	sum := sha256.Sum256(der)
	h := strings.ToUpper(hex.EncodeToString(sum[:]))
	pairs := make([]string, 0, len(sum))
	for i := 0; i < len(h); i += 2 {
		pairs = append(pairs, h[i:i+2])
	}
	return strings.Join(pairs, ":")
}

// served is the fingerprint of the certificate the HTTPS listener at addr
// presents.
func served(t *testing.T, addr string) string {
	t.Helper()
	return servedAs(t, addr, "")
}

// onDisk is the fingerprint of the certificate in a host's data dir.
func onDisk(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "server.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s/server.crt is not PEM", dir)
	}
	return fingerprintOf(block.Bytes)
}

// A pool whose hosts serve HTTPS talks over it: joins by the coordinator's
// IP (the HTTPS port), a write reaches every replica, a call forwarded to
// a member runs there, every host holds the three hosts' host_internal
// certificates with the fingerprints they serve, no host talks to another
// over the plain listener, and a host whose certificate is replaced is
// refused by the others (the pin is checked).
func TestTLSPool(t *testing.T) {
	ctx := suite.Ctx(t)
	p, https := suite.TLSPool(t, ctx, 3)
	c := pooltest.NewClient(netip.Addr{})
	if k := p.Coordinator(t, 30*time.Second); k != 0 {
		t.Fatalf("coordinator is host %d", k)
	}
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	refs := suite.HostRefs(t, ctx, c, p, 0, s) // host.address is each host's IP
	if len(refs) != 3 || refs[-1] != "" {
		t.Fatalf("hosts by address: %v", refs)
	}

	// A write reaches every replica.
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "over TLS"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		suite.WaitReplica(t, ctx, c, p, i, pool, "over TLS", 10*time.Second)
	}

	// A call forwarded to a member runs there.
	vm, err := c.CallString(ctx, p.Addr(0), "VM.create", s, testdaemon.VMRecord("tls-forwarded"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, refs[1], false, false); err != nil {
		t.Fatalf("VM.start_on a member over TLS: %v", err)
	}
	if on, err := c.CallString(ctx, p.Addr(0), "VM.get_resident_on", s, vm); err != nil || on != refs[1] {
		t.Fatalf("resident on %q (want %s): %v", on, refs[1], err)
	}
	if _, err := c.Call(ctx, p.Addr(0), "VM.hard_shutdown", s, vm); err != nil {
		t.Fatal(err)
	}

	// Every host holds the pool's three pins, each the certificate its
	// host serves and keeps in its data dir.
	want := map[string]string{} // host ref -> fingerprint
	for i := range 3 {
		fp := served(t, testdaemon.Addr(pooltest.HostIP(i).String(), https))
		if d := onDisk(t, p.Hosts[i].DataDir); d != fp {
			t.Fatalf("host %d serves %s but keeps %s", i, fp, d)
		}
		want[refs[i]] = fp
	}
	for i := range 3 {
		sess := s
		if i > 0 {
			if sess, err = p.LocalLogin(ctx, c, i); err != nil {
				t.Fatal(err)
			}
		}
		var certs map[string]map[string]any
		deadline := time.Now().Add(10 * time.Second)
		for {
			raw, err := c.Call(ctx, p.Addr(i), "Certificate.get_all_records", sess)
			if err != nil || json.Unmarshal(raw, &certs) != nil {
				t.Fatalf("Certificate.get_all_records on host %d: %s %v", i, raw, err)
			}
			if len(certs) >= 3 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		got := map[string]string{}
		for ref, r := range certs {
			if r["type"] != "host_internal" {
				t.Fatalf("host %d: certificate %s is %v", i, ref, r["type"])
			}
			h, _ := r["host"].(string)
			got[h], _ = r["fingerprint_sha256"].(string)
			if r["fingerprint"] != got[h] {
				t.Fatalf("host %d: fingerprint %v, fingerprint_sha256 %v", i, r["fingerprint"], got[h])
			}
		}
		if len(certs) != 3 || len(got) != 3 {
			t.Fatalf("host %d has %d host_internal certificates: %v", i, len(certs), certs)
		}
		for h, fp := range want {
			if got[h] != fp {
				t.Fatalf("host %d pins %s for %s, which serves %s", i, got[h], h, fp)
			}
		}
	}

	// Between hosts, only the HTTPS port carries traffic.
	if plain, tlsConns, ok := peerConnections(t, p, https); ok {
		t.Logf("connections between hosts: %d to the HTTPS port, %d to the plain one", tlsConns, plain)
		if plain != 0 || tlsConns == 0 {
			t.Fatalf("%d connections between hosts to the plain port, %d to the HTTPS one", plain, tlsConns)
		}
	}

	// Control: host 1 restarted with its certificate is live again (its
	// pins and the others' outlive a restart).
	p.Restart(1)
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, 3); err != nil {
		t.Fatalf("host 1 restarted: %v", err)
	}

	// Host 2 comes back with a new certificate: the pool does not accept
	// it, so it is not live and a call sent to it cannot reach it.
	if err := p.Hosts[2].Stop(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"server.crt", "server.key"} {
		if err := os.Remove(filepath.Join(p.Hosts[2].DataDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	p.Restart(2)
	newFP := served(t, testdaemon.Addr(pooltest.HostIP(2).String(), https))
	if newFP == want[refs[2]] {
		t.Fatal("the restarted host serves its old certificate")
	}
	metrics, err := c.CallString(ctx, p.Addr(0), "host.get_metrics", s, refs[2])
	if err != nil {
		t.Fatal(err)
	}
	// The coordinator says why: that certificate is not pinned.
	refused := "not one of the pool's host certificates (" + newFP + ")"
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, err := c.Call(ctx, p.Addr(0), "host_metrics.get_live", s, metrics)
		if err != nil {
			t.Fatal(err)
		}
		if string(raw) == "false" && strings.Contains(p.Hosts[0].Log(), refused) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host 2 with a new certificate: live %s; the coordinator's log:\n%s", raw, p.Hosts[0].LogTail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	_, err = c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, refs[2], false, false)
	if code := pooltest.Code(err); code != "CANNOT_CONTACT_HOST" && code != "HOST_OFFLINE" {
		t.Fatalf("VM.start_on the host with a new certificate: %v", err)
	}
	t.Logf("VM.start_on the host with a new certificate: %v", err)
	// Host 1 is still served.
	if _, err := c.Call(ctx, p.Addr(0), "VM.start_on", s, vm, refs[1], false, false); err != nil {
		t.Fatalf("VM.start_on host 1 afterwards: %v", err)
	}
	// Forgetting host 2 removes its pin.
	if _, err := c.Call(ctx, p.Addr(0), "host.destroy", s, refs[2]); err != nil {
		t.Fatalf("host.destroy of the refused host: %v", err)
	}
	raw, err := c.Call(ctx, p.Addr(0), "Certificate.get_all_records", s)
	var certs map[string]map[string]any
	if err != nil || json.Unmarshal(raw, &certs) != nil {
		t.Fatalf("Certificate.get_all_records: %s %v", raw, err)
	}
	for _, r := range certs {
		if r["host"] == refs[2] {
			t.Fatalf("the forgotten host's certificate is still pinned: %v", r)
		}
	}
	if len(certs) != 2 {
		t.Fatalf("%d certificates after forgetting a host of three", len(certs))
	}
}

// peerConnections counts the established TCP connections from one host
// of p to another's plain port and to its HTTPS port, from ss; ok is
// false when ss cannot say.
func peerConnections(t *testing.T, p *pooltest.Pool, https int) (plain, tlsConns int, ok bool) {
	t.Helper()
	out, err := exec.Command("ss", "-tnH", "state", "established").Output()
	if err != nil {
		t.Logf("ss: %v: not checking connections", err)
		return 0, 0, false
	}
	isHost := func(a netip.Addr) bool {
		for i := range p.Len() {
			if a.Unmap() == pooltest.HostIP(i) {
				return true
			}
		}
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		local, err1 := netip.ParseAddrPort(f[len(f)-2])
		peer, err2 := netip.ParseAddrPort(f[len(f)-1])
		if err1 != nil || err2 != nil || !isHost(local.Addr()) || !isHost(peer.Addr()) {
			continue
		}
		switch strconv.Itoa(int(peer.Port())) {
		case strconv.Itoa(p.Port):
			plain++
		case strconv.Itoa(https):
			tlsConns++
		}
	}
	return plain, tlsConns, true
}

// TestTLSFigures measures a forwarded call's round trip over TLS against
// plain HTTP in the same run: VM.start_on + VM.hard_shutdown of a
// simulated VM on a member (forwarded) and on the coordinator (local), in
// a pool of two over TLS and one over plain HTTP. It runs with
// TOOLSTACKD_FIGURES=1.
func TestTLSFigures(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure TLS's cost")
	}
	ctx := suite.Ctx(t)
	secure, _ := suite.TLSPool(t, ctx, 2)
	plain := pooltest.Start(t, pooltest.Options{Hosts: 2})
	if err := plain.TryJoin(ctx); err != nil {
		t.Fatal(err)
	}
	c := pooltest.NewClient(netip.Addr{})
	measure := func(name string, p *pooltest.Pool) (local, forwarded time.Duration) {
		t.Logf("measuring the %s pool", name)
		s, err := p.Login(ctx, c, 0)
		if err != nil {
			t.Fatal(err)
		}
		refs := suite.HostRefs(t, ctx, c, p, 0, s)
		suite.StartCycles(t, ctx, c, p.Addr(0), s, refs[1], 3) // warm up
		local = suite.StartCycles(t, ctx, c, p.Addr(0), s, refs[0], 30)
		forwarded = suite.StartCycles(t, ctx, c, p.Addr(0), s, refs[1], 30)
		return local, forwarded
	}
	tl, tf := measure("TLS", secure)
	pl, pf := measure("plain", plain)
	t.Logf("VM.start_on + VM.hard_shutdown p50: plain local %v forwarded %v (%.2fx); TLS local %v forwarded %v (%.2fx); forwarded TLS/plain %.2f",
		pl, pf, float64(pf)/float64(pl), tl, tf, float64(tf)/float64(tl), float64(tf)/float64(pf))
}
