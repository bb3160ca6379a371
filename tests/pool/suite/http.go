package suite

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/pool/peerauth"
	"toolstackd/internal/testkit/pooltest"
)

// RPC makes calls through one host with one session, failing the test on
// an error.
type RPC struct {
	T   *testing.T
	Ctx context.Context
	C   *pooltest.Client
	At  string
	S   string
}

// Call calls method with the session and params, failing the test on an
// error, and returns the result as raw JSON.
func (r RPC) Call(method string, params ...any) json.RawMessage {
	r.T.Helper()
	raw, err := r.C.Call(r.Ctx, r.At, method, append([]any{r.S}, params...)...)
	if err != nil {
		r.T.Fatalf("%s: %v", method, err)
	}
	return raw
}

// Str is Call for a method whose result is a string.
func (r RPC) Str(method string, params ...any) string {
	r.T.Helper()
	var v string
	if err := json.Unmarshal(r.Call(method, params...), &v); err != nil {
		r.T.Fatalf("%s: %v", method, err)
	}
	return v
}

// LocalSR is the "Local storage" SR of host (a ref).
func (r RPC) LocalSR(host string) string {
	r.T.Helper()
	var pbds map[string]map[string]any
	if err := json.Unmarshal(r.Call("PBD.get_all_records"), &pbds); err != nil {
		r.T.Fatal(err)
	}
	for _, pbd := range pbds {
		if pbd["host"] != host {
			continue
		}
		sr := pbd["SR"].(string)
		if r.Str("SR.get_type", sr) == "file" {
			return sr
		}
	}
	r.T.Fatalf("host %s has no local SR: %v", host, pbds)
	return ""
}

// Transfer makes a disk transfer request on addr and returns the status
// and body.
func Transfer(t *testing.T, method, addr, path string, q url.Values, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == nil {
		req.Body = nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return resp.StatusCode, out
}

// QEMUOf lists the QEMU processes whose command line names the VM's uuid.
func QEMUOf(uuid string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if s := string(cmd); strings.Contains(s, "qemu-system") && strings.Contains(s, uuid) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// IsDir reports whether path is a directory.
func IsDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// IsFile reports whether path is a regular file.
func IsFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// SignPeerRequest signs req as a host of the pool holding secret would
// (package peerauth), covering the identity header it names, if any.
// Set every header first.
func SignPeerRequest(req *http.Request, secret string) {
	peerauth.Sign(req.Header, secret, peerauth.Of(req, "X-Toolstackd-Identity"), time.Now())
}
