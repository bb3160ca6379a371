package core

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/tests/pool/suite"
)

// The intra-pool endpoints answer nobody without the pool secret, and
// answer malformed messages from a holder of it with a clear refusal;
// /pool/join checks credentials before it reads a body. The daemon keeps
// serving throughout.
func TestIntraPoolEndpointsRefuseHostileInput(t *testing.T) {
	ctx := suite.Ctx(t)
	p := pooltest.Start(t, pooltest.Options{Hosts: 1})
	b, err := os.ReadFile(filepath.Join(p.Hosts[0].DataDir, "pool-secret"))
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(path, secret string, body []byte, header ...string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr(0)+path, bytes.NewReader(body))
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		switch {
		case strings.HasPrefix(secret, "plain:"):
			// The secret itself, as hosts sent it before requests were signed.
			req.Header.Set("X-Toolstackd-Pool-Secret", strings.TrimPrefix(secret, "plain:"))
		case secret != "":
			suite.SignPeerRequest(req, secret)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		defer resp.Body.Close()
		msg := new(bytes.Buffer)
		_, _ = msg.ReadFrom(resp.Body)
		return resp.StatusCode, msg.String()
	}
	paths := []string{"/pool/db", "/pool/call", "/pool/transfer", "/pool/rejoin", "/pool/readd", "/pool/secret", "/pool/leave",
		"/pool/session", "/pool/lease", "/pool/joined", "/pool/alive"}
	for _, path := range paths {
		for _, bad := range []string{"", "not-the-secret", secret + "x", "plain:" + secret} {
			if code, _ := post(path, bad, []byte("{}")); code != http.StatusForbidden {
				t.Errorf("%s with secret %q: %d, want 403", path, bad, code)
			}
		}
	}
	// Holders of the secret sending garbage.
	for _, path := range []string{"/pool/transfer", "/pool/readd", "/pool/secret", "/pool/leave", "/pool/session", "/pool/lease",
		"/pool/joined"} {
		if code, _ := post(path, secret, []byte("\x00not json")); code != http.StatusBadRequest {
			t.Errorf("%s with garbage: %d, want 400", path, code)
		}
	}
	if code, _ := post("/pool/secret", secret, []byte(`{"step":"rotate","secret":""}`)); code != http.StatusBadRequest {
		t.Errorf("an empty rotated secret: %d, want 400", code)
	}
	if code, _ := post("/pool/call", secret, []byte(`{}`), "X-Toolstackd-Identity", "{not json"); code != http.StatusBadRequest {
		t.Errorf("/pool/call with a garbled identity: %d, want 400", code)
	}
	if code, _ := post("/pool/call", secret, []byte(`{}`), "X-Toolstackd-Identity", `{"Roles":-1}`); code != http.StatusBadRequest {
		t.Errorf("/pool/call claiming roles that do not exist: %d, want 400", code)
	}
	// A session nobody holds is not described; a renewal for a host not
	// in the pool (or with HA off) is not granted.
	if code, _ := post("/pool/session", secret, []byte(`{"session":"OpaqueRef:nobody"}`)); code != http.StatusNotFound {
		t.Errorf("/pool/session for an unknown session: %d, want 404", code)
	}
	if code, _ := post("/pool/lease", secret, []byte(`{"host":"00000000-0000-0000-0000-000000000000"}`)); code == http.StatusOK {
		t.Error("/pool/lease granted a lease to a host that is not in the pool")
	}
	if code, _ := post("/pool/session", secret, bytes.Repeat([]byte(" "), 1<<20)); code != http.StatusBadRequest {
		t.Errorf("/pool/session with a megabyte of nothing: %d, want 400", code)
	}
	// An HTTP handler's request naming who it runs as must carry the
	// secret, and a holder of the secret must name a real identity.
	for _, c := range []struct{ secret, who string }{{"", `{"User":"root","Roles":1}`}, {secret, "{not json"}, {secret, `{"Roles":-1}`}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr(0)+"/export_raw_vdi?vdi=OpaqueRef:x&format=raw", nil)
		req.Header.Set("X-Toolstackd-Identity", c.who)
		if c.secret != "" {
			suite.SignPeerRequest(req, c.secret)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("export with identity %q (secret %v): %d, want 403", c.who, c.secret != "", resp.StatusCode)
		}
	}
	if code, _ := post("/pool/db", secret, []byte("\xff\xff garbage")); code == http.StatusOK {
		t.Error("/pool/db took garbage")
	}
	// /pool/join: no credentials, a large body: refused as a login is,
	// without the body being taken as a request.
	code, body := post("/pool/join", "", bytes.Repeat([]byte("x"), 8<<20))
	var rep struct{ Error []string }
	if code != http.StatusOK || json.Unmarshal([]byte(body), &rep) != nil || len(rep.Error) == 0 || rep.Error[0] != "SESSION_AUTHENTICATION_FAILED" {
		t.Errorf("/pool/join without credentials: %d %.200s", code, body)
	}
	// Still serving.
	if _, err := p.Login(ctx, pooltest.NewClient(netip.Addr{}), 0); err != nil {
		t.Fatalf("after the hostile requests: %v", err)
	}
}
