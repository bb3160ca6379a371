package crosspool

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// The destination's /migrate endpoint takes a session of its pool only
// when the session's role may call VM.migrate_send (pool-admin,
// pool-operator, vm-power-admin). A session of a lesser role gets 403
// with RBAC_PERMISSION_DENIED and nothing else: the stream is not
// upgraded, nothing it sends is read, no record is made.

// postMigrate is POST /migrate with the session, as an upgrade or not:
// the status, the body and the Upgrade header of the answer.
func postMigrate(t *testing.T, ctx context.Context, at, session string, upgrade bool) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+at+"/migrate?session_id="+url.QueryEscape(session), http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "toolstackd-crosspool-migrate/1")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(body), resp.Header.Get("Upgrade")
}

// vmCount is how many VM records the pool has (dom0 included).
func vmCount(r suite.RPC) int {
	r.T.Helper()
	var vms []string
	if err := json.Unmarshal(r.Call("VM.get_all"), &vms); err != nil {
		r.T.Fatal(err)
	}
	return len(vms)
}

func TestCrossPoolMigrateRefusesLimitedRoles(t *testing.T) {
	ctx := suite.Ctx(t)
	p, rs, hosts := suite.TwoPools(t, ctx, pooltest.Options{})
	a, b := rs[0], rs[1]
	sockB := filepath.Join(p.Hosts[1].DataDir, "xapi.sock")
	vmsB := vmCount(b)

	// vm-admin is the strongest role without VM.migrate_send; read-only
	// the weakest. vm-power-admin has it: the control.
	limited := map[string]string{
		"vm-admin":  suite.Account(t, b, sockB, "xvmadmin", "pw-vm-admin", "vm-admin"),
		"read-only": suite.Account(t, b, sockB, "xreader", "pw-reader", "read-only"),
	}
	power := suite.Account(t, b, sockB, "xpower", "pw-power", "vm-power-admin")

	for role, s := range limited {
		// The sessions are live (a call they may make works), so the
		// refusal is the role's, not a dead session's.
		if _, err := b.C.Call(ctx, b.At, "VM.get_all", s); err != nil {
			t.Fatalf("VM.get_all as %s: %v", role, err)
		}
		for _, upgrade := range []bool{true, false} {
			code, body, up := postMigrate(t, ctx, b.At, s, upgrade)
			if code != http.StatusForbidden || !strings.Contains(body, xerr.RBACPermissionDenied) {
				t.Fatalf("POST /migrate as %s (upgrade %v): %d %q, want 403 %s", role, upgrade, code, body, xerr.RBACPermissionDenied)
			}
			if up != "" {
				t.Fatalf("POST /migrate as %s: the refusal offers an upgrade (%q)", role, up)
			}
			if strings.Contains(body, s) {
				t.Fatalf("POST /migrate as %s: the refusal echoes the session: %q", role, body)
			}
		}
	}
	// The control passes the role check: without the upgrade it is told
	// to upgrade, not refused.
	if code, body, up := postMigrate(t, ctx, b.At, power, false); code != http.StatusUpgradeRequired || up == "" {
		t.Fatalf("POST /migrate as vm-power-admin without an upgrade: %d %q (Upgrade %q), want 426", code, body, up)
	}

	// A refused client that sends its stream's first message right behind
	// the request, as a migration source would after the upgrade, gets
	// the 403 and the message is not taken as a migration.
	ghost := uuid.NewString()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", b.At)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	hdr, _ := json.Marshal(map[string]any{"version": 1, "vm": "OpaqueRef:" + uuid.NewString(), "uuid": ghost,
		"dest": hosts[1], "source": strings.Repeat("s", 32), "power": "Halted",
		"import": map[string]any{"vm": map[string]string{"name_label": "ghost", "uuid": ghost}}})
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(hdr))) //nolint:gosec // a small message
	req := "POST /migrate?session_id=" + url.QueryEscape(limited["read-only"]) + " HTTP/1.1\r\nHost: " + b.At +
		"\r\nConnection: Upgrade\r\nUpgrade: toolstackd-crosspool-migrate/1\r\nContent-Length: 0\r\n\r\n"
	if _, err := conn.Write(append([]byte(req), append(frame, hdr...)...)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Upgrade") != "" {
		t.Fatalf("a pipelined stream after a refused upgrade: %s (Upgrade %q)", resp.Status, resp.Header.Get("Upgrade"))
	}
	_ = conn.Close()
	if _, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, ghost); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid %s on pool B after the refusal: %v", ghost, err)
	}
	if n := vmCount(b); n != vmsB {
		t.Fatalf("pool B has %d VMs after the refusals, had %d", n, vmsB)
	}

	// The whole path: pool A's VM.migrate_send with a dest map whose
	// session is pool B's read-only one fails with the permission error
	// and leaves the VM where it was and pool B as it was.
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd (the destination's export): the VM.migrate_send part is not run")
	}
	srA, srB := a.LocalSR(hosts[0]), b.LocalSR(hosts[1])
	vm, vdi, vif, _ := crossVM(t, a, srA, suite.MgmtNetwork(a, hosts[0]))
	vmUUID := a.Str("VM.get_uuid", vm)
	before := suite.SRVDIs(b, srB)
	dest := suite.DestMap(b, hosts[1])
	dest["session_id"] = limited["read-only"]
	vdiMap := map[string]string{vdi: srB}
	vifMap := map[string]string{vif: suite.MgmtNetwork(b, hosts[1])}
	_, err = a.C.Call(ctx, a.At, "VM.migrate_send", append([]any{a.S}, suite.MigrateSendArgs(vm, dest, vdiMap, vifMap, map[string]string{})...)...)
	suite.WantRefusal(t, "VM.migrate_send with a read-only destination session", err, xerr.RBACPermissionDenied)
	// The refusal is the endpoint's 403 (the source names the permission
	// it lacked there), not some earlier call's.
	var e *testdaemon.Error
	if !suite.AsXenError(err, &e) || len(e.Params) == 0 || e.Params[0] != "VM.migrate_send" {
		t.Fatalf("VM.migrate_send with a read-only destination session: %v, want the endpoint's refusal", err)
	}
	suite.WaitUntil(t, 30*time.Second, "the refused migration to be undone", func() bool { return len(suite.VMWhere(a, vm).Ops) == 0 })
	if s := suite.VMWhere(a, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("pool A's VM after the refusal: %+v", s)
	}
	if _, v := suite.VMDisk(a, vm); v != vdi {
		t.Fatalf("pool A's VM's VBD is on %s after the refusal, was %s", v, vdi)
	}
	if _, err := b.C.Call(ctx, b.At, "VM.get_by_uuid", b.S, vmUUID); pooltest.Code(err) != xerr.UUIDInvalid {
		t.Fatalf("VM.get_by_uuid on pool B after the refusal: %v", err)
	}
	if n := suite.SRVDIs(b, srB); n != before || suite.SimDomainIn(t, p.Hosts[1].DataDir, vmUUID) {
		t.Fatalf("pool B kept something: %d VDIs (had %d), domain %v", n, before, suite.SimDomainIn(t, p.Hosts[1].DataDir, vmUUID))
	}
	a.Call("VM.hard_shutdown", vm)
}
