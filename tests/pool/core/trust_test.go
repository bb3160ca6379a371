package core

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// foreignListener is a listener that is not of the pool, as an attacker
// would run: it records what it is sent and answers each request with
// 200 and an empty JSON object.
type foreignListener struct {
	ln   net.Listener
	mu   sync.Mutex
	got  bytes.Buffer
	conn int
}

func listenForeign(t *testing.T) *foreignListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &foreignListener{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(c)
		}
	}()
	return f
}

func (f *foreignListener) serve(c net.Conn) {
	defer c.Close()
	f.mu.Lock()
	f.conn++
	f.mu.Unlock()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadBytes('\n')
		f.mu.Lock()
		f.got.Write(line)
		f.mu.Unlock()
		if err != nil {
			return
		}
		if len(bytes.TrimSpace(line)) == 0 { // the end of the head: take what body came, answer
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			rest, _ := io.ReadAll(br)
			f.mu.Lock()
			f.got.Write(rest)
			f.mu.Unlock()
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
			return
		}
	}
}

func (f *foreignListener) addr() string { return f.ln.Addr().String() }

func (f *foreignListener) received() (conns int, got []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conn, bytes.Clone(f.got.Bytes())
}

func readSecret(t *testing.T, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "pool-secret"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
}

// Issue 29, finding 1: the pool secret went to whatever address a caller
// named. pool.emergency_reset_master now refuses an address that is not
// one of the pool's hosts (before anything changes, and nothing is sent
// there), and refuses to run on the coordinator, whose raft state it
// dropped; pool.join sends the joiner's secret nowhere.
func TestSecretNeverLeavesThePool(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	foreign := listenForeign(t)
	local, err := p.LocalLogin(ctx, c, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(1), "pool.emergency_reset_master", local, foreign.addr())
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "INVALID_VALUE" || len(e.Params) != 2 || e.Params[0] != "master_address" {
		t.Fatalf("pool.emergency_reset_master towards a foreign address: %v, want INVALID_VALUE [master_address, ...]", err)
	}
	// On the coordinator: refused, and the pool goes on as it was.
	_, err = c.Call(ctx, p.Addr(0), "pool.emergency_reset_master", s, p.Advertised(1))
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "OPERATION_NOT_ALLOWED" {
		t.Fatalf("pool.emergency_reset_master on the coordinator: %v, want OPERATION_NOT_ALLOWED", err)
	}
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(0), "pool.set_name_description", s, pool, "still a pool"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < p.Len(); i++ {
		suite.WaitReplica(t, ctx, c, p, i, pool, "still a pool", 30*time.Second)
	}
	if n, got := foreign.received(); n != 0 {
		t.Fatalf("the foreign listener was contacted %d times:\n%s", n, got)
	}

	// A host alone joining "a pool" at the foreign address: the listener
	// sees the join request, with the credentials given for it, but not
	// this host's own secret.
	alone := pooltest.Start(t, pooltest.Options{Hosts: 1})
	ac := pooltest.NewClient(netip.Addr{})
	as, err := alone.Login(ctx, ac, 0)
	if err != nil {
		t.Fatal(err)
	}
	own := readSecret(t, alone.Hosts[0].DataDir)
	if _, err := ac.Call(ctx, alone.Addr(0), "pool.join", as, foreign.addr(), "root", "the-coordinators-password"); err == nil {
		t.Fatal("pool.join to a listener that is no toolstackd succeeded")
	}
	n, got := foreign.received()
	if n == 0 || !bytes.Contains(got, []byte("/pool/join")) {
		t.Fatalf("the foreign listener got no join request (%d connections):\n%s", n, got)
	}
	if bytes.Contains(got, []byte(own)) {
		t.Fatalf("the joining host sent its own pool secret to the address it was given:\n%s", got)
	}
	if bytes.Contains(got, []byte("X-Toolstackd-Pool")) {
		t.Fatalf("the join request carries intra-pool authentication:\n%s", got)
	}
	// The host is still alone and serving.
	if _, err := alone.Login(ctx, ac, 0); err != nil {
		t.Fatalf("the host after the failed join: %v", err)
	}
}

// Issue 29, finding 2: a slave-local session on a member outlived the
// revocation of its account on the coordinator, and any account could
// open one. Only pool administrators open one now (as the datamodel
// says), and a revocation written on the coordinator ends it on the
// member as soon as the member's replica has the write.
func TestMemberSessionsFollowRevocation(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	r := suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(0), S: s}
	sock := filepath.Join(p.Hosts[0].DataDir, "xapi.sock")
	suite.Account(t, r, sock, "padmin", "pw-padmin", "pool-admin")
	suite.Account(t, r, sock, "poper", "pw-poper", "pool-operator")
	// The replica applies the log in order: once the later account is
	// known there (its login fails for its role, not for its password),
	// so is the earlier one.
	var err error
	suite.WaitUntil(t, 30*time.Second, "the accounts reach the member's replica", func() bool {
		_, err = c.CallString(ctx, p.Addr(1), "session.slave_local_login_with_password", "poper", "pw-poper")
		e, ok := testdaemon.AsError(err)
		return err == nil || !ok || e.Code != "SESSION_AUTHENTICATION_FAILED"
	})
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "RBAC_PERMISSION_DENIED" {
		t.Fatalf("a pool-operator's slave-local login: %v, want RBAC_PERMISSION_DENIED", err)
	}
	local, err := c.CallString(ctx, p.Addr(1), "session.slave_local_login_with_password", "padmin", "pw-padmin")
	if err != nil {
		t.Fatalf("a pool-admin's slave-local login: %v", err)
	}
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	if _, err := c.Call(ctx, p.Addr(1), "pool.set_name_description", local, pool, "by the member's session"); err != nil {
		t.Fatalf("a write through the slave-local session: %v", err)
	}
	// The coordinator destroys the account's subject.
	var subjects map[string]map[string]any
	if err := json.Unmarshal(r.Call("subject.get_all_records"), &subjects); err != nil {
		t.Fatal(err)
	}
	for ref, rec := range subjects {
		if rec["subject_identifier"] == "local:padmin" {
			r.Call("subject.destroy", ref)
		}
	}
	suite.WaitUntil(t, 30*time.Second, "the member ends the revoked session", func() bool {
		_, err := c.Call(ctx, p.Addr(1), "pool.get_name_description", local, pool)
		e, ok := testdaemon.AsError(err)
		return ok && e.Code == "SESSION_INVALID"
	})
	if _, err := c.Call(ctx, p.Addr(1), "pool.set_name_description", local, pool, "after the revocation"); err == nil {
		t.Fatal("a revoked slave-local session still writes")
	}
}

// Issue 29, finding 5: a database restore on a member was accepted and
// left its replica apart from the pool. A member refuses it with
// HOST_IS_SLAVE [coordinator]; the coordinator still takes it.
func TestMemberRefusesDatabaseRestore(t *testing.T) {
	ctx, p, _, _ := suite.JoinedPool(t)
	client := &http.Client{Timeout: 60 * time.Second}
	do := func(method, addr string, body []byte) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+"/pool/xmldbdump", bytes.NewReader(body))
		req.SetBasicAuth("root", p.Password())
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, dump := do(http.MethodGet, p.Addr(1), nil)
	if code != http.StatusOK || !bytes.Contains(dump, []byte("<database")) {
		t.Fatalf("the member's dump: %d %.200s", code, dump)
	}
	code, body := do(http.MethodPut, p.Addr(1), dump)
	if code == http.StatusOK || !bytes.HasPrefix(body, []byte("HOST_IS_SLAVE ")) {
		t.Fatalf("a restore on a member: %d %s, want HOST_IS_SLAVE", code, body)
	}
}

// Issue 29, finding 6: pool.emergency_transition_to_master on a member of
// a healthy pool made two hosts accept logins as coordinator for a few
// seconds. While the coordinator answers, it is refused, and the pool
// keeps its one coordinator.
func TestEmergencyTransitionRefusedWhileTheCoordinatorLives(t *testing.T) {
	ctx, p, c, _ := suite.JoinedPool(t)
	local, err := p.LocalLogin(ctx, c, 2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(ctx, p.Addr(2), "pool.emergency_transition_to_master", local)
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "OPERATION_NOT_ALLOWED" {
		t.Fatalf("pool.emergency_transition_to_master with the coordinator alive: %v, want OPERATION_NOT_ALLOWED", err)
	}
	for i := 1; i < p.Len(); i++ {
		_, err := p.Login(ctx, c, i)
		if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_SLAVE" || p.IndexOf(e.Params[0]) != 0 {
			t.Fatalf("login on host %d: %v, want HOST_IS_SLAVE naming host 0", i, err)
		}
	}
	if _, err := p.Login(ctx, c, 0); err != nil {
		t.Fatalf("login on the coordinator: %v", err)
	}
}

// Issue 29, finding 4: a program holding pool-admin credentials that
// joined claiming a member's uuid took the member's place in raft, and a
// joiner's rows overwrote the coordinator's. The coordinator now refuses
// a uuid or an address the pool has, and every row not the joiner's own
// (internal/pool TestCheckJoinRows covers the rows one by one).
func TestForgedJoinerRefused(t *testing.T) {
	ctx, p, c, s := suite.JoinedPool(t)
	r := suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(0), S: s}
	var hosts []string
	if err := json.Unmarshal(r.Call("host.get_all"), &hosts); err != nil {
		t.Fatal(err)
	}
	memberUUID := ""
	for _, h := range hosts {
		if a := r.Str("host.get_address", h); strings.HasPrefix(p.Advertised(1), a+":") {
			memberUUID = r.Str("host.get_uuid", h)
		}
	}
	if memberUUID == "" {
		t.Fatal("no host row for host 1")
	}
	claiming := suite.BareJoin(t, "claims-a-uuid", "127.0.0.9:4321")
	claiming.UUID = memberUUID
	if got := suite.PostJoin(t, ctx, p, 0, claiming); len(got) < 2 || got[0] != "INVALID_VALUE" || got[1] != "uuid" {
		t.Fatalf("a joiner claiming host 1's uuid: %v, want INVALID_VALUE [uuid, ...]", got)
	}
	if got := suite.PostJoin(t, ctx, p, 0, suite.BareJoin(t, "claims-an-address", p.Advertised(2))); len(got) < 2 || got[0] != "INVALID_VALUE" || got[1] != "address" {
		t.Fatalf("a joiner claiming host 2's address: %v, want INVALID_VALUE [address, ...]", got)
	}
	// The pool is as it was: every member replicates.
	pool := suite.PoolRef(t, ctx, c, p, 0, s)
	r.Call("pool.set_name_description", pool, "after the forged joins")
	for i := 1; i < p.Len(); i++ {
		suite.WaitReplica(t, ctx, c, p, i, pool, "after the forged joins", 30*time.Second)
	}
}
