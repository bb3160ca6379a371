package core

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/pool"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// deadAddress is an address nothing listens at: a port of 127.0.0.1 that
// was free a moment ago.
func deadAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// Issue 29, finding 4: two programs that are no hosts joined a pool of
// three with pool-admin credentials and became voters, and after one
// real host died the pool had no coordinator. A member now votes only
// once it has shown it is a live toolstackd: the bare joiners stay
// non-voters (and the coordinator says so in its log), so the pool keeps
// its quorum of real hosts and a coordinator when one of them is killed.
func TestBareJoinersNeverVote(t *testing.T) {
	ctx, p, c, _ := suite.JoinedPool(t)
	var bare []string
	for i := range 2 {
		req := suite.BareJoin(t, "bare-"+string(rune('a'+i)), deadAddress(t))
		if got := suite.PostJoin(t, ctx, p, 0, req); got != nil {
			t.Fatalf("bare joiner %d: %v (a join with pool-admin credentials is admitted)", i, got)
		}
		bare = append(bare, req.UUID)
	}
	// The coordinator looks at them at once (quietly, within a second)
	// and says they stay non-voters.
	staysNonVoter := func(i int) func() bool {
		return func() bool {
			log := p.Hosts[i].Log()
			for _, id := range bare {
				if !slices.ContainsFunc(strings.Split(log, "\n"), func(l string) bool {
					return strings.Contains(l, "stays a non-voter") && strings.Contains(l, id)
				}) {
					return false
				}
			}
			return true
		}
	}
	waitOrError(t, 30*time.Second, "the coordinator logs both bare joiners as staying non-voters", staysNonVoter(0))

	// The coordinator dies: the two real hosts left are two of the
	// pool's three voters, and elect one of themselves (about 2 s).
	p.Kill(0)
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	now, s2, err := p.FindCoordinator(fctx, c)
	if err != nil || now == 0 {
		t.Fatalf("no coordinator among the real hosts within a minute of the kill (%d): %v", now, err)
	}
	pool := suite.PoolRef(t, ctx, c, p, now, s2)
	if _, err := c.Call(ctx, p.Addr(now), "pool.set_name_description", s2, pool, "after the kill"); err != nil {
		t.Fatalf("a write on the new coordinator: %v", err)
	}
	other := 3 - now // hosts 1 and 2 are left
	suite.WaitReplica(t, ctx, c, p, other, pool, "after the kill", 30*time.Second)
	// The new coordinator does not give them a vote either.
	waitOrError(t, 30*time.Second, "the new coordinator logs both bare joiners as staying non-voters", staysNonVoter(now))
}

// waitOrError waits until cond holds, polling, for at most bound, and
// marks the test failed (and goes on) when it does not.
func waitOrError(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("%s: not within %v", what, bound)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Issue 29, finding 4: versions. A joiner whose XenAPI or database schema
// version is not the coordinator's is refused with xapi's errors,
// [joiner's, coordinator's] as "major.minor", before anything changes; a
// joiner that names none is refused too. The coordinator says its
// versions to a GET with its credentials only.
func TestJoinerVersionsChecked(t *testing.T) {
	ctx := suite.Ctx(t)
	p := pooltest.Start(t, pooltest.Options{Hosts: 1})
	ours, schema := pool.APIVersion(), pool.SchemaVersion(dm.Model)
	if ours.String() != "2.21" || schema.Major != dm.SchemaMajor || schema.Minor != dm.SchemaMinor {
		t.Fatalf("the versions under test: API %s, schema %s", ours, schema)
	}
	older := &pool.Version{Major: api.APIVersionMajor, Minor: api.APIVersionMinor - 1}
	other := &pool.Version{Major: schema.Major - 1, Minor: 0}
	for _, c := range []struct {
		name        string
		api, schema *pool.Version
		want        []string
	}{
		{"an older API", older, schema, []string{"POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION", older.String(), ours.String()}},
		{"another schema", ours, other, []string{"POOL_JOINING_HOST_MUST_HAVE_SAME_DB_SCHEMA", other.String(), schema.String()}},
		{"no versions", nil, nil, []string{"POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION", "", ours.String()}},
	} {
		req := suite.BareJoin(t, "versions", deadAddress(t))
		req.APIVersion, req.DBSchema = c.api, c.schema
		if got := suite.PostJoin(t, ctx, p, 0, req); !slices.Equal(got, c.want) {
			t.Errorf("a joiner with %s: %q, want %q", c.name, got, c.want)
		}
	}
	// Nothing was admitted: the host is alone.
	cl := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, cl, 0)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cl.Call(ctx, p.Addr(0), "host.get_all", s)
	var hosts []string
	if err != nil || json.Unmarshal(raw, &hosts) != nil || len(hosts) != 1 {
		t.Fatalf("the hosts after the refused joins: %s %v", raw, err)
	}

	// GET /pool/join: the coordinator's versions, to its credentials.
	get := func(pw string) pool.JoinReply {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr(0)+pool.JoinPath, nil)
		req.SetBasicAuth("root", pw)
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var rep pool.JoinReply
		if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
			t.Fatalf("GET %s: %s %v", pool.JoinPath, resp.Status, err)
		}
		return rep
	}
	if rep := get(p.Password()); rep.APIVersion.String() != ours.String() || rep.DBSchema.String() != schema.String() || rep.Error != nil {
		t.Errorf("the coordinator's versions: %+v, want API %s, schema %s", rep, ours, schema)
	}
	if rep := get("not-the-password"); rep.APIVersion != nil || rep.DBSchema != nil || len(rep.Error) == 0 || rep.Error[0] != "SESSION_AUTHENTICATION_FAILED" {
		t.Errorf("the versions without the credentials: %+v, want SESSION_AUTHENTICATION_FAILED alone", rep)
	}
}

// The joiner checks the coordinator's versions before it sends its own
// request: pool.join towards a coordinator of another API version (a
// stand-in answering the versions' GET) fails with
// POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION [joiner's, coordinator's],
// and the stand-in is sent nothing else.
func TestJoinerChecksCoordinatorVersions(t *testing.T) {
	ctx := suite.Ctx(t)
	ours, schema := pool.APIVersion(), pool.SchemaVersion(dm.Model)
	newer := &pool.Version{Major: ours.Major + 1, Minor: 0}
	var mu sync.Mutex
	var seen []string
	stand := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodGet {
			_ = json.NewEncoder(w).Encode(pool.JoinReply{Error: []string{"INTERNAL_ERROR", "the stand-in admits nobody"}})
			return
		}
		_ = json.NewEncoder(w).Encode(pool.JoinReply{APIVersion: newer, DBSchema: schema})
	}))
	t.Cleanup(stand.Close)

	alone := pooltest.Start(t, pooltest.Options{Hosts: 1})
	c := pooltest.NewClient(netip.Addr{})
	s, err := alone.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(stand.URL, "http://")
	_, err = c.Call(ctx, alone.Addr(0), "pool.join", s, addr, "root", "the-coordinators-password")
	e, ok := testdaemon.AsError(err)
	if !ok || e.Code != "POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION" || !slices.Equal(e.Params, []string{ours.String(), newer.String()}) {
		t.Fatalf("pool.join towards a coordinator of API %s: %v, want POOL_JOINING_HOST_MUST_HAVE_SAME_API_VERSION [%s %s]",
			newer, err, ours, newer)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []string{"GET " + pool.JoinPath}) {
		t.Fatalf("the stand-in coordinator was sent %q, want the versions' GET alone", seen)
	}
}
