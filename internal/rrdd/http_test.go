package rrdd

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/testkit/testdaemon"
)

// The HTTP tests run the endpoints behind a real api.Server (database,
// logins, roles) on loopback, as the daemon mounts them (api.TrimSlash
// around the router).

const (
	hHostUUID = "0d0d0d0d-0000-4000-8000-000000000001"
	hVM1      = "a0a0a0a0-0000-4000-8000-000000000001"
	hVM2      = "a0a0a0a0-0000-4000-8000-000000000002"
	hVM3      = "a0a0a0a0-0000-4000-8000-000000000003" // in the database, never reporting
	hSR       = "c0c0c0c0-0000-4000-8000-000000000001"
	hSR2      = "c0c0c0c0-0000-4000-8000-000000000002" // in the database, never reporting
	hNobody   = "e0e0e0e0-0000-4000-8000-000000000001" // nowhere
)

// hT0 is on a step boundary (1,700,000,000 is a multiple of 5).
var hT0 = time.Unix(1_700_000_000, 0)

type httpEnv struct {
	t    testing.TB
	s    *Service
	d    *db.DB
	url  string
	sess string // root's
	c    *testdaemon.Client
}

// newHTTPEnv is a service with samplers, its endpoints and the API on one
// loopback server, with the test's VMs and SRs in the database and the
// host's uuid set to hHostUUID.
func newHTTPEnv(t testing.TB, samplers ...Named) *httpEnv {
	t.Helper()
	d := db.New(dm.Model, db.Options{})
	acfg := api.DefaultConfig()
	acfg.PasswordIterations = 1000
	hash, err := api.HashPassword("pw", acfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.Host.UUID, host, hHostUUID); err != nil {
			return err
		}
		for _, u := range []string{hVM1, hVM2, hVM3} {
			if _, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{UUID: u, NameLabel: u[:8]}).Row()); err != nil {
				return err
			}
		}
		for _, u := range []string{hSR, hSR2} {
			if _, err := tx.Insert(dm.SR.Class, "", (&dm.SRRecord{UUID: u, NameLabel: u[:8]}).Row()); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	acfg.HostRef = host
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := api.New(d, acfg, quiet)
	srv.Start()
	s, err := New(Config{Dir: t.TempDir(), HostUUID: hHostUUID, Samplers: samplers, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	router := mux.NewRouter()
	srv.Routes(router)
	s.routes(router, srv)
	hs := httptest.NewServer(api.TrimSlash(router))
	t.Cleanup(func() { hs.Close(); srv.Close() })
	e := &httpEnv{t: t, s: s, d: d, url: hs.URL, c: &testdaemon.Client{URL: hs.URL}}
	if e.sess, err = e.c.Login("root", "pw"); err != nil {
		t.Fatal(err)
	}
	return e
}

// addReadOnlyUser adds a local account holding the read-only role.
func (e *httpEnv) addReadOnlyUser(name, pw string) {
	e.t.Helper()
	hash, err := api.HashPassword(pw, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.d.Update(func(tx *db.Tx) error {
		if _, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: name, OtherConfig: map[string]string{}, PasswordHash: hash}).Row()); err != nil {
			return err
		}
		roles := tx.ByNameLabel(dm.Role.Class, "read-only")
		if len(roles) != 1 {
			return fmt.Errorf("read-only role: %d rows", len(roles))
		}
		_, err := tx.Insert(dm.Subject.Class, "", (&dm.SubjectRecord{SubjectIdentifier: api.LocalSubjectID(name),
			OtherConfig: map[string]string{}, Roles: []dm.RoleRef{dm.RoleRef(roles[0].Ref)}}).Row())
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

type hResp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with root's session unless the query names one
// (session_id=- sends none).
func (e *httpEnv) do(method, pathQuery string, body []byte, hdr ...string) hResp {
	e.t.Helper()
	u := e.url + pathQuery
	switch {
	case strings.Contains(pathQuery, "session_id=-"):
		u = strings.Replace(u, "session_id=-", "", 1)
	case !strings.Contains(pathQuery, "session_id="):
		sep := "?"
		if strings.Contains(pathQuery, "?") {
			sep = "&"
		}
		u += sep + "session_id=" + url.QueryEscape(e.sess)
	}
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return hResp{res.StatusCode, res.Header, b}
}

func (e *httpEnv) get(pathQuery string, hdr ...string) hResp {
	e.t.Helper()
	return e.do(http.MethodGet, pathQuery, nil, hdr...)
}

// ok checks a 200 answer of the type wanted with the length it says.
func (r hResp) ok(t testing.TB, what, mime string) []byte {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: status %d: %s", what, r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != mime {
		t.Errorf("%s: Content-Type %q, want %q", what, ct, mime)
	}
	if cl := r.header.Get("Content-Length"); cl != strconv.Itoa(len(r.body)) {
		t.Errorf("%s: Content-Length %q for %d bytes", what, cl, len(r.body))
	}
	if r.header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("%s: no Access-Control-Allow-Origin: *", what)
	}
	return r.body
}

func src(o plugin.Owner, name string, ty rrd.DSType, hi float64) plugin.Source {
	return plugin.Source{Name: name, Owner: o, Type: ty, Default: true, Min: 0, Max: hi}
}

// goldenSampler gives the golden readings at tick i = (now - hT0) / 5 s,
// for i = 0..4:
//
//	owner  source                type    i=0   1      2        3        4
//	host   cpu0 (max 1)          DERIVE  0.0   2.5    5.0      (none)   10.0   float seconds
//	host   memory_free_kib       GAUGE   1000  2000   unknown  4000     5000
//	vm1    memory                GAUGE   2^30 at every tick
//	vm1    vbd_xvda_read         DERIVE  0     5120   10240    10240    61440  int64 bytes
//	vm1    vbd_xvda_iops_read    DERIVE  not recorded by default (never in the RRD)
//	vm2    memory                GAUGE   -     -      2^29     2^29     2^29
//	sr     size                  GAUGE   10 GiB at every tick
//	sr     physical_utilisation  GAUGE   2^30 + i * 2^20
func goldenSampler() Named {
	host := plugin.Owner{Kind: plugin.Host}
	vm1 := plugin.Owner{Kind: plugin.VM, UUID: hVM1}
	vm2 := plugin.Owner{Kind: plugin.VM, UUID: hVM2}
	sr := plugin.Owner{Kind: plugin.SR, UUID: hSR}
	inf := math.Inf(1)
	return Named{Name: "golden", Sampler: SamplerFunc(func(_ context.Context, now time.Time) ([]Reading, error) {
		i := min(int(now.Sub(hT0)/Step), 4) // later ticks repeat the last readings
		var out []Reading
		if i != 3 {
			out = append(out, Reading{src(host, "cpu0", rrd.Derive, 1), rrd.FloatValue([]float64{0, 2.5, 5, 0, 10}[i])})
		}
		mem := rrd.FloatValue([]float64{1000, 2000, 0, 4000, 5000}[i])
		if i == 2 {
			mem = rrd.UnknownValue()
		}
		iops := src(vm1, "vbd_xvda_iops_read", rrd.Derive, inf)
		iops.Default = false
		out = append(out,
			Reading{src(host, "memory_free_kib", rrd.Gauge, inf), mem},
			Reading{src(vm1, "memory", rrd.Gauge, inf), rrd.IntValue(1 << 30)},
			Reading{src(vm1, "vbd_xvda_read", rrd.Derive, inf), rrd.IntValue([]int64{0, 5120, 10240, 10240, 61440}[i])},
			Reading{iops, rrd.IntValue(int64(i))},
			Reading{src(sr, "size", rrd.Gauge, inf), rrd.IntValue(10 << 30)},
			Reading{src(sr, "physical_utilisation", rrd.Gauge, inf), rrd.IntValue(1<<30 + int64(i)<<20)})
		if i >= 2 {
			out = append(out, Reading{src(vm2, "memory", rrd.Gauge, inf), rrd.IntValue(1 << 29)})
		}
		return out, nil
	})}
}

// newGoldenEnv has ticked the golden sampler at hT0 + 0, 5, ... 20 s.
func newGoldenEnv(t testing.TB) *httpEnv {
	t.Helper()
	e := newHTTPEnv(t, goldenSampler())
	for i := range 5 {
		e.s.Tick(context.Background(), hT0.Add(time.Duration(i)*Step))
	}
	return e
}

// The golden /rrd_updates, worked by hand (testdata/http_rrd_updates.*).
//
// start=1700000000 (hT0) with interval 0: the first archive of each RRD
// whose rows are at least 0 steps and that reaches back past the start
// (last point 1700000020, minus 120 rows x 5 s) is the 5 s AVERAGE one,
// so every column is AVERAGE at 5 s; the host's MIN and MAX archives
// start at 1 minute and have another shape. Columns: the host first, then
// the VMs and the SRs each sorted by uuid; vm1's vbd_xvda_iops_read is
// not recorded by default, so it is not a column. Rows are newest first,
// from the last update (1700000020) back to the last row not before
// start (1700000000): 5 rows. meta start is xapi's first row boundary
// after start, 1700000000/5*5 + 5 = 1700000005, although a row for
// 1700000000 follows; end is the last row, 1700000020.
//
// How each reading becomes a point (all readings 5 s apart, within the
// 300 s heartbeat; one step ends at each tick):
//
//   - GAUGE (memory_free_kib, memory, size, physical_utilisation): the
//     reading itself. The unknown reading at i=2 repeats the previous
//     rate (2000) for one point, as xapi does.
//   - DERIVE (cpu0, vbd_xvda_read): the difference from the previous
//     reading over 5 s. The first tick of a new RRD is a fresh series, in
//     which xapi takes the raw reading as the count (0 here: both counters
//     start at 0, so the first point is 0/5 = 0). vbd_xvda_read: 5120/5 =
//     1024, 5120/5 = 1024, 0/5 = 0, 51200/5 = 10240. cpu0: 2.5/5 = 0.5
//     twice; at i=3 it is not reported, so the service gives it an unknown
//     reading, and at i=4 its previous raw reading is that unknown: both
//     points are unknown.
//   - Unknown points in the 5 s archive: it has one step per row, and xapi
//     counts an unknown point against a row only when the rest of the row
//     can be renormalised, which in a one-step row it cannot; the row
//     keeps its starting value, 0 for AVERAGE, printed "0.0" as xapi
//     prints zero. So cpu0's two lost points show as 0.0, not NaN.
//   - vm2 reports from i=2 on. Its RRD is made then, with every row before
//     (the rows for 1700000000 and 1700000005) never written: NaN, an
//     unknown as the dump prints it.
//
// Values are stored in single precision; all of these are exact in it
// (2^30 + i*2^20 needs 11 significant bits, 10 GiB = 5 x 2^31).
//
//	t           cpu0  mem_free  vm1 memory  vm1 vbd_read  vm2 memory  sr size      sr phys_util
//	1700000020  0.0   5000      1073741824  10240         536870912   10737418240  1077936128
//	1700000015  0.0   4000      1073741824  0.0           536870912   10737418240  1076887552
//	1700000010  0.5   2000      1073741824  1024          536870912   10737418240  1075838976
//	1700000005  0.5   2000      1073741824  1024          NaN         10737418240  1074790400
//	1700000000  0.0   1000      1073741824  0.0           NaN         10737418240  1073741824
func TestHTTPRRDUpdatesGolden(t *testing.T) {
	e := newGoldenEnv(t)
	const q = "/rrd_updates?start=1700000000&host=true&vm_uuid=all&sr_uuid=all"
	hGolden(t, "http_rrd_updates.xml", e.get(q).ok(t, "xml", "text/xml"))
	r := e.get(q + "&json=true")
	hGolden(t, "http_rrd_updates.json", r.ok(t, "json", "application/json"))
	if r.header.Get("Access-Control-Allow-Headers") != "X-Requested-With" {
		t.Errorf("Access-Control-Allow-Headers %q", r.header.Get("Access-Control-Allow-Headers"))
	}
	// A trailing slash is the same endpoint (the daemon's TrimSlash).
	hGolden(t, "http_rrd_updates.xml", e.get(strings.Replace(q, "?", "/?", 1)).ok(t, "slash", "text/xml"))
	// The start relative to the last update: -20 is 1700000000 again.
	hGolden(t, "http_rrd_updates.xml", e.get(strings.Replace(q, "1700000000", "-20", 1)).ok(t, "relative", "text/xml"))
}

// xapi's client_prefers_json: the Accept header decides when it names
// JSON or XML, else the presence of json (whatever its value).
func TestHTTPJSONChoice(t *testing.T) {
	e := newGoldenEnv(t)
	const q = "/rrd_updates?start=-10&host=true"
	for _, c := range []struct {
		query, accept, want string
	}{
		{"", "", "text/xml"},
		{"&json=true", "", "application/json"},
		{"&json=false", "", "application/json"}, // presence, as xapi
		{"&json", "", "application/json"},
		{"", "*/*", "application/json"}, // JSON is listed first
		{"", "text/xml", "text/xml"},
		{"&json=true", "text/xml", "text/xml"},
		{"", "application/json", "application/json"},
		{"", "text/*", "text/xml"},
		{"", "application/*;q=0.5,text/xml", "text/xml"},
		{"", "text/xml;q=0.2,application/json;q=0.9", "application/json"},
		{"", "text/html", "text/xml"},                   // matches neither: the query decides
		{"&json=1", "text/html", "application/json"},    // same
		{"", "text/xml, application/json", "text/xml"},  // " application/json" is not trimmed, as xapi
		{"&json=1", "text/xml;q=x", "application/json"}, // a bad q: the query decides (xapi: 500)
		{"", "nonsense", "text/xml"},
	} {
		r := e.get(q+c.query, "Accept", c.accept)
		r.ok(t, c.query+" "+c.accept, c.want)
	}
	for _, p := range []string{"/host_rrd", "/host_rrd?json", "/vm_rrd?uuid=" + hVM1 + "&json=true"} {
		want := "text/xml"
		if strings.Contains(p, "json") {
			want = "application/json"
		}
		e.get(p).ok(t, p, want)
		e.get(p, "Accept", "text/xml").ok(t, p+" Accept: text/xml", "text/xml")
	}
}

// The whole RRDs are rrd's own dumps (internal/rrd's golden tests check
// those bytes): the HTTP layer adds nothing.
func TestHTTPWholeRRDs(t *testing.T) {
	e := newGoldenEnv(t)
	for _, c := range []struct {
		path string
		o    plugin.Owner
	}{
		{"/host_rrd", plugin.Owner{Kind: plugin.Host}},
		{"/host_rrds/", plugin.Owner{Kind: plugin.Host}},
		{"/vm_rrd?uuid=" + hVM1, plugin.Owner{Kind: plugin.VM, UUID: hVM1}},
		{"/vm_rrds?uuid=" + strings.ToUpper(hVM2), plugin.Owner{Kind: plugin.VM, UUID: hVM2}},
		{"/sr_rrd?uuid=" + hSR, plugin.Owner{Kind: plugin.SR, UUID: hSR}},
	} {
		rd, err := e.s.Snapshot(c.o)
		if err != nil {
			t.Fatal(c.path, err)
		}
		sep := "?"
		if strings.Contains(c.path, "?") {
			sep = "&"
		}
		if got := e.get(c.path).ok(t, c.path, "text/xml"); !bytes.Equal(got, rd.AppendXML(nil, false)) {
			t.Errorf("%s: the body is not the RRD's dump", c.path)
		}
		if got := e.get(c.path+sep+"json").ok(t, c.path, "application/json"); !bytes.Equal(got, rd.AppendJSON(nil)) {
			t.Errorf("%s: the JSON body is not the RRD's JSON", c.path)
		}
	}
	// What there is no RRD of: 404 (xapi's answer for a VM).
	for _, p := range []string{"/vm_rrd?uuid=" + hVM3, "/vm_rrd?uuid=" + hNobody, "/sr_rrd?uuid=" + hSR2, "/sr_rrd?uuid=" + hVM1} {
		if r := e.get(p); r.status != http.StatusNotFound {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
	fresh := newHTTPEnv(t)
	if r := fresh.get("/host_rrd"); r.status != http.StatusNotFound {
		t.Errorf("host_rrd before any tick: %d %s", r.status, r.body)
	}
}

// legend is the columns /rrd_updates gives for a query, as
// "CF:kind:<last two characters of the uuid>", once per run of columns.
func (e *httpEnv) legend(query string) (string, int) {
	e.t.Helper()
	r := e.get("/rrd_updates?start=-10" + query)
	if r.status != http.StatusOK {
		return "", r.status
	}
	x := string(r.body)
	var owners []string
	for _, part := range strings.Split(x, "<entry>")[1:] {
		entry, _, _ := strings.Cut(part, "</entry>")
		f := strings.Split(entry, ":")
		o := f[0] + ":" + f[1] + ":" + f[2][len(f[2])-2:]
		if len(owners) == 0 || owners[len(owners)-1] != o {
			owners = append(owners, o)
		}
	}
	return strings.Join(owners, " "), r.status
}

// The selection rules of xapi's rrd_updates.
func TestHTTPRRDUpdatesSelection(t *testing.T) {
	e := newGoldenEnv(t)
	const (
		h  = "AVERAGE:host:01"
		v1 = "AVERAGE:vm:01"
		v2 = "AVERAGE:vm:02"
		s1 = "AVERAGE:sr:01"
	)
	for _, c := range []struct {
		query, want string
	}{
		{"", v1 + " " + v2},                     // vm_uuid absent: all VMs; host and sr_uuid absent: none
		{"&host=true", h + " " + v1 + " " + v2}, //
		{"&host=TRUE&vm_uuid=none", ""},         // only "true" takes the host: nothing selected
		{"&host=true&vm_uuid=none", h},
		{"&host=true&vm_uuid=none&sr_uuid=all", h + " " + s1},
		{"&vm_uuid=" + hVM2, v2},
		{"&vm_uuid=" + strings.ToUpper(hVM1) + "&vm_uuid=" + hVM2, v1 + " " + v2},
		{"&vm_uuid=not-a-uuid&sr_uuid=" + hSR, s1},
		{"&vm_uuid=all&vm_uuid=none&sr_uuid=none", v1 + " " + v2},
		{"&host=true&vm_uuid=none&cf=MIN", "MIN:host:01"}, // the host has MIN from 1 minute on
		{"&host=true&vm_uuid=none&cf=bogus", h},           // an unknown cf is any
		{"&host=true&vm_uuid=none&interval=60", h + " MIN:host:01 MAX:host:01"},
	} {
		got, status := e.legend(c.query)
		if c.want == "" {
			// Nothing selected: xapi's No_RRA_Available (xapi: 500; a
			// client's request, so 400 here).
			if status != http.StatusBadRequest {
				t.Errorf("%q: status %d, want 400", c.query, status)
			}
			continue
		}
		if status != http.StatusOK || got != c.want {
			t.Errorf("%q: %d %q, want %q", c.query, status, got, c.want)
		}
	}
	// Exact columns for one of them.
	r := e.get("/rrd_updates?start=-10&vm_uuid=" + hVM2 + "&sr_uuid=" + hSR)
	body := string(r.ok(t, "vm2+sr", "text/xml"))
	for _, col := range []string{"AVERAGE:vm:" + hVM2 + ":memory", "AVERAGE:sr:" + hSR + ":size"} {
		if !strings.Contains(body, "<entry>"+col+"</entry>") {
			t.Errorf("no column %s in %s", col, body)
		}
	}
	if strings.Contains(body, hVM1) || strings.Contains(body, "host:") {
		t.Errorf("unselected owners in %s", body)
	}
	// cf=MIN with VMs, whose RRDs have no MIN archive (the pool has not
	// asked for min/max): xapi's No_RRA_Available, a 400 with a reason.
	r = e.get("/rrd_updates?start=-10&host=true&cf=MIN")
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "No_RRA_Available") {
		t.Errorf("cf=MIN with VMs: %d %s", r.status, r.body)
	}
}

// Bad parameters get 400 with a reason on one line, never 500; no
// session gets 401 as every handler of the api package answers; a
// read-only session may read but not PUT (403).
func TestHTTPBadInput(t *testing.T) {
	e := newGoldenEnv(t)
	for _, p := range []string{
		"/rrd_updates?host=true",
		"/rrd_updates?start=abc",
		"/rrd_updates?start=",
		"/rrd_updates?start=1e9",
		"/rrd_updates?start=99999999999999999999",
		"/rrd_updates?start=0&interval=-1",
		"/rrd_updates?start=0&interval=99999999999",
		"/rrd_updates?start=0&interval=abc",
		"/vm_rrd",
		"/vm_rrd?uuid=../../etc/passwd",
		"/vm_rrd?uuid=" + url.QueryEscape("../../../../../../../../../etc/x"),
		"/sr_rrd?uuid=" + hSR + "x",
		"/sr_rrd?uuid=",
	} {
		r := e.get(p)
		if r.status != http.StatusBadRequest || bytes.Count(bytes.TrimSpace(r.body), []byte("\n")) != 0 || len(r.body) < 10 {
			t.Errorf("%s: %d %q", p, r.status, r.body)
		}
	}
	if r := e.get("/rrd_updates?start=0&interval="); r.status != http.StatusOK {
		t.Errorf("empty interval (the default): %d %s", r.status, r.body)
	}

	for _, p := range []string{"/rrd_updates?start=0&session_id=-", "/host_rrd?session_id=-", "/vm_rrd?uuid=" + hVM1 + "&session_id=-",
		"/sr_rrd?uuid=" + hSR + "&session_id=-", "/host_rrd?session_id=OpaqueRef:nonsense"} {
		r := e.get(p)
		if r.status != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %s", p, r.status, r.body)
		}
	}
	if r := e.do(http.MethodPut, "/rrd?uuid="+hVM3+"&session_id=-", []byte("x")); r.status != http.StatusUnauthorized {
		t.Errorf("PUT without a session: %d", r.status)
	}

	e.addReadOnlyUser("ro", "ro-pw")
	ro, err := e.c.Login("ro", "ro-pw")
	if err != nil {
		t.Fatal(err)
	}
	sid := "session_id=" + url.QueryEscape(ro)
	e.get("/rrd_updates?start=0&host=true&"+sid).ok(t, "read-only rrd_updates", "text/xml")
	e.get("/vm_rrd?uuid="+hVM1+"&"+sid).ok(t, "read-only vm_rrd", "text/xml")
	dump := e.get("/vm_rrd?uuid="+hVM1).ok(t, "vm_rrd", "text/xml")
	if r := e.do(http.MethodPut, "/rrd?uuid="+hVM3+"&"+sid, dump); r.status != http.StatusForbidden {
		t.Errorf("read-only PUT: %d %s", r.status, r.body)
	}
	if r := e.get("/vm_rrd?uuid=" + hVM3); r.status != http.StatusNotFound {
		t.Errorf("a refused PUT stored something: %d", r.status)
	}
	// Basic authentication as root is a session too, as in xapi.
	req, _ := http.NewRequest(http.MethodGet, e.url+"/host_rrd", nil)
	req.SetBasicAuth("root", "pw")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("basic auth: %d", res.StatusCode)
	}
}

// PUT /rrd: a dump fetched from one owner, put to another, reads back the
// same; the database says what the uuid is.
func TestHTTPPutRoundTrip(t *testing.T) {
	e := newGoldenEnv(t)
	dump := e.get("/vm_rrd?uuid="+hVM1).ok(t, "vm1", "text/xml")

	// To a VM of the database that does not report here: it is archived,
	// and reads back as put (sameRRD: but for last_ds, which xapi's
	// reader drops).
	if r := e.do(http.MethodPut, "/rrd?uuid="+hVM3+"&is_host=false&domid=7", dump); r.status != http.StatusOK {
		t.Fatalf("PUT: %d %s", r.status, r.body)
	}
	if got := e.get("/vm_rrd?uuid="+hVM3).ok(t, "vm3", "text/xml"); !sameRRD(t, got, dump) {
		t.Errorf("vm3's RRD differs from what was put")
	}
	if _, err := os.Stat(filepath.Join(e.s.cfg.Dir, hVM3+".gz")); err != nil {
		t.Errorf("not archived: %v", err)
	}

	// Gzipped, to an SR that does not report here (an upper-case uuid).
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(dump)
	_ = zw.Close()
	if r := e.do(http.MethodPut, "/rrd?uuid="+strings.ToUpper(hSR2), gz.Bytes()); r.status != http.StatusOK {
		t.Fatalf("gzip PUT: %d %s", r.status, r.body)
	}
	if got := e.get("/sr_rrd?uuid="+hSR2).ok(t, "sr2", "text/xml"); !sameRRD(t, got, dump) {
		t.Errorf("sr2's RRD differs from what was put")
	}

	// To a VM that reports here: it replaces the RRD in memory, and the
	// next tick continues from it.
	if r := e.do(http.MethodPut, "/rrd?uuid="+hVM2, dump); r.status != http.StatusOK {
		t.Fatalf("PUT to vm2: %d %s", r.status, r.body)
	}
	if got := e.get("/vm_rrd?uuid="+hVM2).ok(t, "vm2", "text/xml"); !sameRRD(t, got, dump) {
		t.Errorf("vm2's RRD in memory differs from what was put")
	}
	e.s.Tick(context.Background(), hT0.Add(5*Step))
	if rd, err := e.s.Snapshot(plugin.Owner{Kind: plugin.VM, UUID: hVM2}); err != nil || rd.LastUpdated() != float64(hT0.Unix()+25) {
		t.Errorf("vm2 after a tick: %v", err)
	}

	// The host's own uuid, with is_host: the host's RRD.
	host := e.get("/host_rrd").ok(t, "host", "text/xml")
	if r := e.do(http.MethodPut, "/rrd?uuid="+hHostUUID+"&is_host=true", dump); r.status != http.StatusOK {
		t.Fatalf("PUT to the host: %d %s", r.status, r.body)
	}
	if got := e.get("/host_rrd").ok(t, "host", "text/xml"); !sameRRD(t, got, dump) || bytes.Equal(got, host) {
		t.Errorf("the host's RRD was not replaced")
	}

	// Refusals, each leaving nothing stored.
	hugeStep := bytes.Replace(dump, []byte("<step>5</step>"), []byte("<step>10</step>"), 1)
	future := bytes.Replace(dump, []byte("<lastupdate>1700000020</lastupdate>"),
		[]byte("<lastupdate>"+strconv.FormatInt(time.Now().Add(48*time.Hour).Unix(), 10)+"</lastupdate>"), 1)
	if bytes.Equal(future, dump) || bytes.Equal(hugeStep, dump) {
		t.Fatal("the dump does not have the expected step and lastupdate")
	}
	for _, c := range []struct {
		name, query string
		body        []byte
		want        int
	}{
		{"garbage", "uuid=" + hVM1, []byte("<rrd><version>0003</version>garbage"), http.StatusBadRequest},
		{"empty", "uuid=" + hVM1, nil, http.StatusBadRequest},
		{"bad gzip", "uuid=" + hVM1, append([]byte{0x1f, 0x8b}, "not gzip"...), http.StatusBadRequest},
		{"truncated gzip", "uuid=" + hVM1, gz.Bytes()[:gz.Len()/2], http.StatusBadRequest},
		{"another step", "uuid=" + hVM1, hugeStep, http.StatusBadRequest},
		{"from the future", "uuid=" + hVM1, future, http.StatusBadRequest},
		{"no uuid", "is_host=true", dump, http.StatusBadRequest},
		{"not a uuid", "uuid=../../etc/passwd", dump, http.StatusBadRequest},
		{"unknown uuid", "uuid=" + hNobody, dump, http.StatusNotFound},
		{"too large", "uuid=" + hVM1, bytes.Repeat([]byte(" "), MaxPutBytes+1), http.StatusRequestEntityTooLarge},
	} {
		before := e.get("/vm_rrd?uuid=" + hVM1).body
		r := e.do(http.MethodPut, "/rrd?"+c.query, c.body)
		if r.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.want)
		}
		if after := e.get("/vm_rrd?uuid=" + hVM1).body; !bytes.Equal(before, after) {
			t.Errorf("%s: vm1's RRD changed", c.name)
		}
	}
	if _, err := os.Stat(filepath.Join(e.s.cfg.Dir, hNobody+".gz")); err == nil {
		t.Errorf("an unknown uuid was archived")
	}
}

// BenchmarkRRDUpdates1000VMs is /rrd_updates over HTTP for the host and
// 1,000 VMs of 8 data sources each after 10 minutes (120 ticks): the 5 s
// archive answers, 120 rows of 8,000+ columns. It reports the size of the
// answer.
func BenchmarkRRDUpdates1000VMs(b *testing.B) {
	const n, perVM = 1000, 8
	vms := make([]plugin.Owner, n)
	for k := range vms {
		vms[k] = plugin.Owner{Kind: plugin.VM, UUID: fmt.Sprintf("b0b0b0b0-0000-4000-8000-%012x", k)}
	}
	inf := math.Inf(1)
	sampler := Named{Name: "bench", Sampler: SamplerFunc(func(_ context.Context, now time.Time) ([]Reading, error) {
		i := int64(now.Sub(hT0) / Step)
		out := make([]Reading, 0, n*perVM+2)
		host := plugin.Owner{Kind: plugin.Host}
		out = append(out, Reading{src(host, "cpu0", rrd.Derive, 1), rrd.FloatValue(float64(i) * 2.1)},
			Reading{src(host, "memory_free_kib", rrd.Gauge, inf), rrd.IntValue(1<<24 - i)})
		for k, o := range vms {
			for j := range perVM {
				name := "vbd_xvda_" + strconv.Itoa(j)
				if j%2 == 0 {
					out = append(out, Reading{src(o, name, rrd.Gauge, inf), rrd.FloatValue(float64(k*j) + float64(i)/7)})
				} else {
					out = append(out, Reading{src(o, name, rrd.Derive, inf), rrd.IntValue(i * int64(k+j) * 4099)})
				}
			}
		}
		return out, nil
	})}
	e := newHTTPEnv(b, sampler)
	for i := range 120 {
		e.s.Tick(context.Background(), hT0.Add(time.Duration(i)*Step))
	}
	// now-600 with now 3 s after the last tick, as a client polling
	// between ticks asks: the 5 s archive reaches back that far.
	start := strconv.FormatInt(hT0.Unix()+119*5+3-600, 10)
	for _, form := range []string{"xml", "json"} {
		b.Run(form, func(b *testing.B) {
			q := "/rrd_updates?start=" + start + "&host=true"
			if form == "json" {
				q += "&json=true"
			}
			var size int
			b.ReportAllocs()
			for b.Loop() {
				r := e.get(q)
				if r.status != http.StatusOK {
					b.Fatalf("%d %s", r.status, r.body)
				}
				size = len(r.body)
			}
			b.ReportMetric(float64(size), "bytes/answer")
		})
	}
}

var lastDS = regexp.MustCompile(`<last_ds>[^<]*</last_ds>`)

// sameRRD says whether got, a dump read back after PUT /rrd, is what was
// put: byte for byte what rrd's reader makes of it, which is the dump put
// but for each source's last_ds (xapi's reader ignores it, so a DERIVE
// source's next reading after a move is unknown).
func sameRRD(t *testing.T, got, put []byte) bool {
	t.Helper()
	rd, err := rrd.ParseXML(bytes.NewReader(put))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(got, rd.AppendXML(nil, false)) &&
		bytes.Equal(lastDS.ReplaceAll(got, nil), lastDS.ReplaceAll(put, nil))
}

func hGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs:\n got %s\nwant %s", name, got, want)
	}
}
