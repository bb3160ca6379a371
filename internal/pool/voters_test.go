package pool

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

// A joiner runs the coordinator's XenAPI and schema versions or is
// refused with xapi's errors, [joiner's, coordinator's] as "major.minor"
// ("" for a version not given), the API version checked first.
func TestCheckVersions(t *testing.T) {
	ours := APIVersion()
	schema := SchemaVersion(dm.Model)
	if ours.String() != "2.21" || ours.Major != api.APIVersionMajor || schema.Major != int64(dm.SchemaMajor) || schema.Minor != int64(dm.SchemaMinor) {
		t.Fatalf("this toolstackd's versions: API %s, schema %s", ours, schema)
	}
	older := &Version{Major: ours.Major, Minor: ours.Minor - 1}
	newerSchema := &Version{Major: schema.Major, Minor: schema.Minor + 1}
	for _, c := range []struct {
		name              string
		api, schema       *Version
		code              string
		hostParam, master string
	}{
		{"the same", ours, schema, "", "", ""},
		{"an older API", older, schema, xerr.PoolJoiningHostMustHaveSameAPIVersion, older.String(), ours.String()},
		{"a newer schema", ours, newerSchema, xerr.PoolJoiningHostMustHaveSameDBSchema, newerSchema.String(), schema.String()},
		{"both differ", older, newerSchema, xerr.PoolJoiningHostMustHaveSameAPIVersion, older.String(), ours.String()},
		{"no API version", nil, schema, xerr.PoolJoiningHostMustHaveSameAPIVersion, "", ours.String()},
		{"no schema version", ours, nil, xerr.PoolJoiningHostMustHaveSameDBSchema, "", schema.String()},
	} {
		err := checkVersions(c.api, c.schema, ours, schema)
		if c.code == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		xe := xerr.From(err)
		if xe.Code != c.code || !slices.Equal(xe.Params, []string{c.hostParam, c.master}) {
			t.Errorf("%s: %v, want %s [%q %q]", c.name, err, c.code, c.hostParam, c.master)
		}
		if names, _ := xerr.ParamNames(c.code); len(names) != len(xe.Params) {
			t.Errorf("%s: %d parameters, the error table names %v", c.name, len(xe.Params), names)
		}
	}
}

// The coordinator checks the versions before anything else of a join
// request: not even the rows (which another schema would not decode) are
// read, and nothing of the pool is touched (this Pool has no raft and no
// database; reaching either would panic).
func TestAdmitRefusesOtherVersions(t *testing.T) {
	p := &Pool{cfg: Config{Server: &api.Server{Model: dm.Model}}}
	req := JoinRequest{UUID: "6e5fd7a4-1f3c-4a61-9b52-3c0d2a1e8f00", Address: "127.0.0.9:1", Rows: []byte("not rows")}
	_, err := p.admit(context.Background(), req)
	if e := xerr.From(err); e.Code != xerr.PoolJoiningHostMustHaveSameAPIVersion || !slices.Equal(e.Params, []string{"", APIVersion().String()}) {
		t.Fatalf("a joiner that names no versions: %v", err)
	}
	req.APIVersion = APIVersion()
	req.DBSchema = &Version{Major: 4, Minor: 0}
	_, err = p.admit(context.Background(), req)
	if e := xerr.From(err); e.Code != xerr.PoolJoiningHostMustHaveSameDBSchema || !slices.Equal(e.Params, []string{"4.0", SchemaVersion(dm.Model).String()}) {
		t.Fatalf("a joiner of another schema: %v", err)
	}
}

func servers(spec string) []raft.Server {
	var out []raft.Server
	for i, f := range strings.Fields(spec) {
		s := raft.Server{ID: raft.ServerID(f[1:]), Address: raft.ServerAddress("127.0.0." + string(rune('2'+i)) + ":443")}
		if f[0] == 'V' {
			s.Suffrage = raft.Voter
		} else {
			s.Suffrage = raft.Nonvoter
		}
		out = append(out, s)
	}
	return out
}

func ids(ss []raft.Server) string {
	var out []string
	for _, s := range ss {
		out = append(out, string(s.ID))
	}
	return strings.Join(out, " ")
}

// The promotion rule: the pool wants the largest odd number of voters up
// to MaxVoters, only members that have shown they are live fill the
// seats, and a seat that would make an even number stays empty; the
// coordinator is never demoted.
func TestPlanVoters(t *testing.T) {
	for _, c := range []struct {
		name, servers, proven string
		promote, demote       string
		self                  raft.ServerID // "c" when empty
	}{
		{"a second host waits", "Vc Na", "a", "", "", ""},
		{"the third host fills two seats", "Vc Na Nb", "a b", "a b", "", ""},
		{"an unproven member gets no seat", "Vc Na Nb", "b", "", "", ""},
		{"two voters stay two", "Vc Va Nb Nd", "", "", "", ""},
		{"an odd number again", "Vc Va Nb Nd", "d", "d", "", ""},
		// Issue 29, finding 4: two bare joiners in a pool of three get
		// no vote, however many seats are open.
		{"two bare joiners", "Vc Va Vb Nx Ny", "", "", "", ""},
		{"a real host after bare joiners waits for another", "Vc Va Vb Nx Ny Nd", "d", "", "", ""},
		{"two real hosts after a bare joiner", "Vc Va Vb Nx Nd Ne", "d e", "d e", "", ""},
		{"seats are filled in raft's order", "Vc Va Vb Nd Ne Nf", "d e f", "d e", "", ""},
		{"a full pool", "Vc Va Vb Vd Ve Nf", "f", "", "", ""},
		{"one voter too many", "Vc Va Vb Vd", "", "", "a", ""},
		{"the coordinator stays", "Va Vc", "", "", "c", "a"},
	} {
		proven := map[raft.ServerID]bool{}
		for _, id := range strings.Fields(c.proven) {
			proven[raft.ServerID(id)] = true
		}
		self := c.self
		if self == "" {
			self = "c"
		}
		promote, demote := planVoters(servers(c.servers), self, func(id raft.ServerID) bool { return proven[id] })
		if ids(promote) != c.promote || ids(demote) != c.demote {
			t.Errorf("%s (%s, proven %q): promote %q demote %q, want %q %q",
				c.name, c.servers, c.proven, ids(promote), ids(demote), c.promote, c.demote)
		}
	}
}

// What a member must show: its own uuid, its own pinned certificate where
// the pool speaks TLS, and a raft that follows the coordinator, has the
// configuration that added it and is no more than maxTrailing entries
// behind.
func TestAliveCheck(t *testing.T) {
	const id = "0b8c3f59-5b7e-4d52-8c1d-6a3f0e9b2c41"
	good := aliveReport{UUID: id, Term: 3, LastIndex: 100, Listed: true}
	plain := aliveWant{id: id, term: 3, commit: 120}
	tls := aliveWant{id: id, term: 3, commit: 120, tls: true, pins: []string{"AA:BB"}}
	with := func(f func(*aliveReport)) aliveReport { r := good; f(&r); return r }
	for _, c := range []struct {
		name string
		want aliveWant
		rep  aliveReport
		fp   string
		ok   bool
		why  string
	}{
		{"caught up", plain, good, "", true, ""},
		{"caught up, over TLS", tls, good, "AA:BB", true, ""},
		{"another host's answer", plain, with(func(r *aliveReport) { r.UUID = "x" }), "", false, "answers as host"},
		{"another certificate", tls, good, "CC:DD", false, "not the one pinned"},
		{"no certificate", tls, good, "", false, "not the one pinned"},
		{"nothing pinned", aliveWant{id: id, term: 3, commit: 120, tls: true}, good, "AA:BB", false, "not the one pinned"},
		{"not in its own configuration", plain, with(func(r *aliveReport) { r.Listed = false }), "", false, "configuration"},
		{"another term", plain, with(func(r *aliveReport) { r.Term = 2 }), "", false, "term"},
		{"far behind", aliveWant{id: id, term: 3, commit: 5000}, good, "", false, "log ends at 100"},
		{"just within", aliveWant{id: id, term: 3, commit: 100 + maxTrailing}, good, "", true, ""},
	} {
		err := c.want.check(c.rep, c.fp)
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), c.why)) {
			t.Errorf("%s: %v, want ok=%v (%q)", c.name, err, c.ok, c.why)
		}
	}
}

func TestWantVoters(t *testing.T) {
	for n, want := range map[int]int{1: 1, 2: 1, 3: 3, 4: 3, 5: 5, 6: 5, 7: 5, 128: 5} {
		if got := wantVoters(n); got != want {
			t.Errorf("%d members: %d voters, want %d", n, got, want)
		}
	}
}
