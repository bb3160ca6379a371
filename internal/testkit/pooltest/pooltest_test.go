package pooltest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/testkit/faultproxy"
	"toolstackd/internal/testkit/lincheck"
	"toolstackd/internal/testkit/testdaemon"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Three standalone hosts on 127.0.0.2-4 share one port and each answers a
// root login; none is anybody's member, so each is its own coordinator.
func TestStandaloneHostsShareAPort(t *testing.T) {
	p := Start(t, Options{Hosts: 3})
	ctx := ctxFor(t, 60*time.Second)
	c := NewClient(netip.Addr{})
	for i := range 3 {
		want := fmt.Sprintf("127.0.0.%d:%d", i+2, p.Port)
		if p.Addr(i) != want || p.Hosts[i].Addr != want || p.Advertised(i) != want {
			t.Fatalf("host %d at %s (daemon %s, advertised %s), want %s", i, p.Addr(i), p.Hosts[i].Addr, p.Advertised(i), want)
		}
		s, err := p.Login(ctx, c, i)
		if err != nil || !strings.HasPrefix(s, "OpaqueRef:") {
			t.Fatalf("login on host %d: %q, %v", i, s, err)
		}
		if got := p.IndexOf(fmt.Sprintf("127.0.0.%d", i+2)); got != i {
			t.Errorf("IndexOf(127.0.0.%d) = %d", i+2, got)
		}
	}
	if p.Link != nil {
		t.Fatal("a Link without Options.Proxy")
	}
	if got := p.Coordinator(t, 10*time.Second); got < 0 || got > 2 {
		t.Fatalf("Coordinator = %d", got)
	}
	// A workload with a Duration ends by itself.
	w := &Workload{Clients: 2, Keys: 2, Duration: 500 * time.Millisecond}
	if err := w.Setup(ctx, p); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	st := w.Start(ctx).Wait()
	if took := time.Since(start); took < 500*time.Millisecond || took > 10*time.Second || st.AckedPuts == 0 {
		t.Fatalf("a 500 ms workload took %v: %v", took, st)
	}
}

// capture is a testing.TB that keeps the errors reported to it.
type capture struct {
	testing.TB
	errs []string
}

func (c *capture) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}
func (c *capture) Helper() {}

// One host under the workload, killed with SIGKILL and restarted three
// times: what the clients saw is linearizable and every acknowledged write
// is in the state read after the last restart.
func TestWorkloadThroughKills(t *testing.T) {
	p := Start(t, Options{Hosts: 1})
	ctx := ctxFor(t, 80*time.Second)
	w := &Workload{Clients: 4, Keys: 6, OpTimeout: 3 * time.Second, FindTimeout: 10 * time.Second}
	if err := w.Setup(ctx, p); err != nil {
		t.Fatal(err)
	}
	run := w.Start(ctx)
	waitAcks := func(n int64, what string) {
		t.Helper()
		target := run.Acked() + n
		deadline := time.Now().Add(20 * time.Second)
		for run.Acked() < target {
			if time.Now().After(deadline) {
				run.Stop()
				t.Fatalf("%s: %d acknowledged operations, waited for %d", what, run.Acked(), target)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for cycle := range 3 {
		waitAcks(150, fmt.Sprintf("before kill %d", cycle))
		p.Kill(0)
		time.Sleep(100 * time.Millisecond)
		p.Restart(0)
	}
	waitAcks(150, "after the last restart")
	st := run.Stop()
	t.Logf("workload: %v", st)
	if st.AckedPuts == 0 || st.AckedGets == 0 {
		t.Fatalf("workload did too little: %v", st)
	}
	final, err := w.Final(ctxFor(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for _, v := range final {
		if v != "" {
			written++
		}
	}
	if len(final) != 6 || written == 0 {
		t.Fatalf("final state of %d keys, %d written: %v", len(final), written, final)
	}
	w.Check(t, final, 20*time.Second)

	// The judge is not asleep: the same history against a final state
	// where every key is back to "" has lost every acknowledged write.
	wiped := map[string]string{}
	for k := range final {
		wiped[k] = ""
	}
	ct := &capture{TB: t}
	w.Check(ct, wiped, 20*time.Second)
	if len(ct.errs) == 0 || !strings.Contains(strings.Join(ct.errs, "\n"), "lost write") {
		t.Fatalf("Check of a wiped final state reported %q", ct.errs)
	}
}

// The lost-write check in Check is not vacuous: a final state that misses
// an acknowledged write is reported. (A second Recorder, fed by hand,
// stands for the run.)
func TestCheckCatchesALostWrite(t *testing.T) {
	rec := lincheck.NewRecorder(Classify, 0)
	tok := rec.Begin(0, lincheck.PutOp("k0", "c0-1"))
	rec.End(tok, lincheck.Result{}, nil)
	tok = rec.Begin(0, lincheck.PutOp("k0", "c0-2"))
	rec.End(tok, lincheck.Result{}, nil)
	lost, err := rec.LostWrites(map[string]string{"k0": "c0-1"})
	if err != nil || len(lost) != 1 || lost[0].Write.Op.Value != "c0-2" {
		t.Fatalf("LostWrites = %v, %v", lost, err)
	}
	// A put whose connection was reset stays in the history as unknown;
	// one refused by HOST_IS_SLAVE leaves it.
	tok = rec.Begin(1, lincheck.PutOp("k0", "c1-1"))
	rec.End(tok, lincheck.Result{}, &net.OpError{Op: "read", Err: errors.New("connection reset by peer")})
	tok = rec.Begin(1, lincheck.PutOp("k0", "c1-2"))
	rec.End(tok, lincheck.Result{}, &testdaemon.Error{Code: "HOST_IS_SLAVE", Params: []string{"127.0.1.2:80"}})
	if st := rec.Stats(); st.Unknown != 1 || st.Refused != 1 || st.Completed != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want lincheck.Outcome
	}{
		{&testdaemon.Error{Code: "HOST_IS_SLAVE", Params: []string{"127.0.1.3"}}, lincheck.Refused},
		{fmt.Errorf("wrapped: %w", &testdaemon.Error{Code: "SESSION_INVALID"}), lincheck.Refused},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, lincheck.Refused},
		{fmt.Errorf("x: %w", lincheck.ErrRefused), lincheck.Refused},
		{&testdaemon.Error{Code: "CANNOT_CONTACT_HOST"}, lincheck.Ambiguous},
		{&net.OpError{Op: "read", Err: errors.New("reset")}, lincheck.Ambiguous},
		{context.DeadlineExceeded, lincheck.Ambiguous},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// With Proxy (and no --advertise, which the daemon may not know yet), the
// proxy in front of a host passes XML-RPC, a blackhole from one host's
// source address makes that host's calls time out while other sources
// still pass, and healing lets it through again.
func TestProxyPassesAndBlackholes(t *testing.T) {
	p := Start(t, Options{Hosts: 2, Proxy: true, NoAdvertise: true})
	if p.Link == nil || p.Link.Addr(Name(0)) != p.Advertised(0) {
		t.Fatalf("link %v, advertised %s", p.Link, p.Advertised(0))
	}
	if want := fmt.Sprintf("127.0.1.2:%d", p.Port); p.Advertised(0) != want {
		t.Fatalf("advertised %s, want %s", p.Advertised(0), want)
	}
	if p.IndexOf(p.Advertised(1)) != 1 || p.IndexOf("127.0.1.3") != 1 {
		t.Fatalf("IndexOf the proxy of host 1: %d", p.IndexOf(p.Advertised(1)))
	}
	ctx := ctxFor(t, 60*time.Second)
	login := func(c *Client) (string, error) {
		return c.CallXML(ctx, p.Advertised(0), "session.login_with_password", "root", p.Password(), "1.0", "pooltest")
	}
	fromH1 := NewClient(HostIP(1))
	fromH1.Timeout = 1500 * time.Millisecond
	if s, err := login(fromH1); err != nil || !strings.HasPrefix(s, "OpaqueRef:") {
		t.Fatalf("XML-RPC login through the proxy: %q, %v", s, err)
	}
	before := p.Link.Proxy(Name(0)).Stats().Accepted
	if before < 1 {
		t.Fatalf("the proxy accepted %d connections", before)
	}
	// A XenAPI failure comes through the proxy as one.
	if _, err := NewClient(HostIP(1)).CallXML(ctx, p.Advertised(0), "session.login_with_password", "root", "wrong"); Code(err) != "SESSION_AUTHENTICATION_FAILED" {
		t.Fatalf("wrong password through the proxy: %v", err)
	}

	if err := p.Link.SetLink(Name(1), Name(0), faultproxy.Blackhole()); err != nil {
		t.Fatal(err)
	}
	held := NewClient(HostIP(1))
	held.Timeout = 1500 * time.Millisecond
	start := time.Now()
	_, err := login(held)
	took := time.Since(start)
	if err == nil || Code(err) != "" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("through a blackhole: %v", err)
	}
	if took < 1400*time.Millisecond || took > 10*time.Second {
		t.Fatalf("blackholed call ended after %v, want about 1.5 s", took)
	}
	if Classify(err) != lincheck.Ambiguous {
		t.Fatal("a timeout must be ambiguous")
	}
	// The test's own source, 127.0.0.1, is no member: not held.
	if _, err := login(NewClient(netip.Addr{})); err != nil {
		t.Fatalf("from 127.0.0.1 during the blackhole: %v", err)
	}
	// Nor is the other direction: host 0 to host 1's proxy.
	if _, err := NewClient(HostIP(0)).CallXML(ctx, p.Advertised(1), "session.login_with_password", "root", p.Password()); err != nil {
		t.Fatalf("h0 → h1 during the h1 → h0 blackhole: %v", err)
	}

	p.Link.HealAll()
	healed := NewClient(HostIP(1))
	healed.Timeout = 5 * time.Second
	if _, err := login(healed); err != nil {
		t.Fatalf("after HealAll: %v", err)
	}
}

// The client gives clear errors, never a hang or a crash, for replies
// that are not XenAPI: garbage, HTTP errors, oversized or endless bodies,
// a server that never answers, a refused connection.
func TestClientHostileReplies(t *testing.T) {
	mode.Store(ptr(""))
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mode := *mode.Load()
		switch r.URL.Path {
		case "/jsonrpc":
			switch mode {
			case "garbage":
				_, _ = w.Write([]byte("<html>not json"))
			case "500":
				http.Error(w, "boom", http.StatusInternalServerError)
			case "empty":
				_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1}`))
			case "huge":
				chunk := []byte(strings.Repeat(" ", 1<<20))
				for range 3 {
					if _, err := w.Write(chunk); err != nil {
						return
					}
				}
			case "hang":
				select {
				case <-release:
				case <-r.Context().Done():
				}
			case "error":
				_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"HOST_IS_SLAVE","data":["127.0.1.2",7]}}`))
			}
		case "/RPC2":
			_, _ = w.Write([]byte(xmlReplies[mode]))
		}
	}))
	defer srv.Close()
	defer close(release)
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := NewClient(netip.Addr{})
	c.Timeout = time.Second
	c.MaxReply = 1 << 20
	ctx := ctxFor(t, 30*time.Second)

	for _, m := range []string{"garbage", "500", "empty", "huge", "hang"} {
		mode.Store(&m)
		start := time.Now()
		_, err := c.Call(ctx, addr, "x.y")
		if err == nil || Code(err) != "" {
			t.Errorf("%s: %v", m, err)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("%s: took %v", m, time.Since(start))
		}
	}
	mode.Store(ptr("error"))
	_, err := c.Call(ctx, addr, "x.y")
	if e, ok := testdaemon.AsError(err); !ok || e.Code != "HOST_IS_SLAVE" || len(e.Params) != 2 || e.Params[1] != "7" {
		t.Errorf("XenAPI error: %#v", err)
	}
	for m, want := range map[string]string{"xok": "OpaqueRef:1", "xbare": "plain", "xfail": "HOST_IS_SLAVE", "xgarbage": "", "xnostruct": "", "xnovalue": ""} {
		mode.Store(&m)
		v, err := c.CallXML(ctx, addr, "x.y", "a<&>b")
		switch {
		case m == "xfail":
			if e, ok := testdaemon.AsError(err); !ok || e.Code != want || len(e.Params) != 1 || e.Params[0] != "127.0.1.2:80" {
				t.Errorf("%s: %v", m, err)
			}
		case want == "":
			if err == nil || Code(err) != "" {
				t.Errorf("%s: %q, %v", m, v, err)
			}
		case err != nil || v != want:
			t.Errorf("%s: %q, %v", m, v, err)
		}
	}
	// A closed port: the call was never sent.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	_ = ln.Close()
	if _, err := c.Call(ctx, closed, "x.y"); !NotSent(err) || Classify(err) != lincheck.Refused {
		t.Errorf("refused connection: %v", err)
	}
}

// mode says what the hostile server answers.
var mode atomic.Pointer[string]

func ptr(s string) *string { return &s }

var xmlReplies = map[string]string{
	"xok":       `<?xml version="1.0"?><methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value><string>OpaqueRef:1</string></value></member></struct></value></param></params></methodResponse>`,
	"xbare":     `<methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member><member><name>Value</name><value>plain</value></member></struct></value></param></params></methodResponse>`,
	"xfail":     `<methodResponse><params><param><value><struct><member><name>Status</name><value>Failure</value></member><member><name>ErrorDescription</name><value><array><data><value>HOST_IS_SLAVE</value><value>127.0.1.2:80</value></data></array></value></member></struct></value></param></params></methodResponse>`,
	"xgarbage":  `<methodResponse><params><param`,
	"xnostruct": `<methodResponse><params><param><value><string>x</string></value></param></params></methodResponse>`,
	"xnovalue":  `<methodResponse><params><param><value><struct><member><name>Status</name><value>Success</value></member></struct></value></param></params></methodResponse>`,
}

func TestIndexOfHostileAddresses(t *testing.T) {
	p := &Pool{Port: 4000, opts: Options{Proxy: true}, listen: []string{"127.0.0.2:4000", "127.0.0.3:4000"}}
	for addr, want := range map[string]int{
		"127.0.0.2:4000": 0, "127.0.0.3": 1, "127.0.1.3:4000": 1, "[::ffff:127.0.0.3]:4000": 1,
		"127.0.0.2:4001": -1, "127.0.0.4": -1, "": -1, "host:4000": -1, "::1": -1,
		strings.Repeat("9", 10000): -1, "127.0.0.2:": -1, " 127.0.0.2 ": 0,
	} {
		if got := p.IndexOf(addr); got != want {
			t.Errorf("IndexOf(%.40q) = %d, want %d", addr, got, want)
		}
	}
}

func TestWorkloadBounds(t *testing.T) {
	ctx := ctxFor(t, 5*time.Second)
	for _, w := range []Workload{{Clients: -1}, {Clients: MaxClients + 1}, {Keys: MaxKeys + 1}, {Duration: -time.Second}, {ReadFraction: 1}, {ReadFraction: -0.5}} {
		if err := w.Setup(ctx, &Pool{}); err == nil {
			t.Errorf("Setup accepted %+v", w)
		}
	}
}
