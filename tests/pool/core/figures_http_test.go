package core

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/tests/pool/suite"
)

// TestForwardingFigures measures what forwarding costs against the same
// work done where it lands, in one run: host.get_record over a member's
// local socket (sent whole to the coordinator) against the coordinator's
// own socket, and a disk export of a member's VDI through the
// coordinator (passed on) against the member serving it directly.
//
//	TOOLSTACKD_FIGURES=1 go test -v -run TestForwardingFigures ./tests/pool/
func TestForwardingFigures(t *testing.T) {
	if os.Getenv("TOOLSTACKD_FIGURES") != "1" {
		t.Skip("set TOOLSTACKD_FIGURES=1 to measure issue 12's figures")
	}
	// No fault proxies: the hosts talk to each other directly.
	p, r, hosts := suite.Joined(t, suite.Ctx(t), pooltest.Options{Hosts: 3})
	s := r.S
	direct := socketRecordP50(t, filepath.Join(p.Hosts[0].DataDir, "xapi.sock"), hosts[0], 500)
	forwarded := socketRecordP50(t, filepath.Join(p.Hosts[1].DataDir, "xapi.sock"), hosts[0], 500)
	t.Logf("host.get_record over a local socket, p50 of 500: the coordinator's %v; a member's (forwarded) %v; ratio %.2f",
		direct, forwarded, float64(forwarded)/float64(direct))

	const size = 256 << 20
	vdi := r.Str("VDI.create", map[string]any{"name_label": "export", "name_description": "", "SR": r.LocalSR(hosts[1]),
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	q := url.Values{"session_id": {s}, "vdi": {vdi}, "format": {"raw"}}
	data := bytes.Repeat([]byte("toolstackd pool"), size/15+1)[:size]
	if st, msg := suite.Transfer(t, http.MethodPut, p.Addr(0), "/import_raw_vdi", q, data); st != http.StatusOK {
		t.Fatalf("import: %d %s", st, msg)
	}
	at := func(addr string) time.Duration {
		var best time.Duration
		for range 3 {
			start := time.Now()
			resp, err := http.Get("http://" + addr + "/export_raw_vdi?" + q.Encode())
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || n != int64(len(data)) {
				t.Fatalf("export from %s: %d bytes, %v", addr, n, err)
			}
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		return best
	}
	onMember, through := at(p.Addr(1)), at(p.Addr(0))
	mbps := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }
	t.Logf("export of 256 MiB raw, best of 3: from the member %v (%.0f MiB/s); through the coordinator %v (%.0f MiB/s); ratio %.2f",
		onMember, mbps(onMember), through, mbps(through), float64(through)/float64(onMember))
}

// socketRecordP50 is the p50 of host.get_record over a host's local
// superuser socket.
func socketRecordP50(t *testing.T, sock, host string, n int) time.Duration {
	t.Helper()
	call := suite.SocketCaller(t, sock)
	var ls string
	_ = json.Unmarshal(call("session.login_with_password", "root", ""), &ls)
	took := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		call("host.get_record", ls, host)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2]
}
