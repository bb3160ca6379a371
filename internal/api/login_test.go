package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/api"
	"toolstackd/internal/xerr"
)

// clientFrom is an HTTP client whose connections come from a given
// loopback address, so that the server sees distinct clients.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: d.DialContext, MaxIdleConns: 100, MaxIdleConnsPerHost: 100}}
}

// callVia makes a JSON-RPC call with a client; it returns the result or
// the XenAPI error.
func callVia(t testing.TB, c *http.Client, url, method string, params ...any) (json.RawMessage, *rpcError) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := c.Post(url+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return nil, &rpcError{Code: "transport: " + err.Error()}
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage
		Error  *struct {
			Message string
			Data    []string
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Error(err)
		return nil, &rpcError{Code: "decode: " + err.Error()}
	}
	if out.Error != nil {
		return nil, &rpcError{out.Error.Message, out.Error.Data}
	}
	return out.Result, nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// Finding 6: a wrong password costs the same for a known and an unknown
// user. The work factor is the default (a tenth of it under the race
// detector, which slows hashing tenfold), high enough that skipping the
// hash for an unknown user shows: about 20 ms against well under 1 ms.
func TestLoginTimingKnownAndUnknownUser(t *testing.T) {
	iter := api.DefaultConfig().PasswordIterations
	if raceEnabled {
		iter /= 10
	}
	h := newHarness(t, func(c *api.Config) { c.PasswordIterations = iter })
	lim := api.DefaultAuthLimits()
	lim.FailuresBeforeDelay, lim.FailuresBeforeRefusal = 0, 0 // no back-off here
	h.srv.SetAuthLimits(lim)
	c := clientFrom("127.0.0.1")
	try := func(user string) time.Duration {
		start := time.Now()
		_, e := callVia(t, c, h.http.URL, "session.login_with_password", user, "wrong", "2.21", "t")
		d := time.Since(start)
		if e == nil || e.Code != xerr.SessionAuthenticationFailed {
			t.Fatalf("%s: %v", user, e)
		}
		return d
	}
	try("root") // warm the connection and the dummy hash
	try("nobody")
	// Pairs taken back to back, so that load from elsewhere on the
	// machine hits both sides alike; the median ratio is compared.
	var known, unknown []time.Duration
	var ratios []float64
	for i := 0; i < 25; i++ {
		k, u := try("root"), try("nobody-"+strings.Repeat("x", i))
		known, unknown = append(known, k), append(unknown, u)
		ratios = append(ratios, float64(u)/float64(k))
	}
	slices.Sort(ratios)
	r := ratios[len(ratios)/2]
	t.Logf("wrong password, median of 25: known user %v, unknown user %v; median ratio unknown/known %.2f",
		median(known), median(unknown), r)
	// About 1.0 on a quiet machine. An unknown user whose hash is skipped
	// costs a twentieth of a known one (0.05), ten times under the lower
	// bound; the bounds are wide so that a busy machine does not trip them.
	if r < 0.5 || r > 2 {
		t.Errorf("an unknown user's wrong password costs %.2f times a known user's", r)
	}
}

// Finding 6: repeated failures from one client are delayed, then refused
// before any password is checked, while other clients log in as usual;
// the refusal ends after its period.
func TestLoginBackoff(t *testing.T) {
	h := newHarness(t)
	lim := api.DefaultAuthLimits()
	lim.FailuresBeforeDelay, lim.FailureDelay = 2, 150*time.Millisecond
	lim.FailuresBeforeRefusal, lim.RefusalPeriod, lim.MaxRefusalPeriod = 4, 700*time.Millisecond, 10*time.Second
	h.srv.SetAuthLimits(lim)
	bad, good := clientFrom("127.0.0.2"), clientFrom("127.0.0.3")
	login := func(c *http.Client, pw string) (time.Duration, *rpcError) {
		start := time.Now()
		_, e := callVia(t, c, h.http.URL, "session.login_with_password", "root", pw, "2.21", "t")
		return time.Since(start), e
	}
	for i := 1; i <= 4; i++ {
		d, e := login(bad, "wrong")
		if e == nil || e.Code != xerr.SessionAuthenticationFailed || len(e.Data) != 2 || e.Data[1] != "Authentication failure" {
			t.Fatalf("failure %d: %v", i, e)
		}
		if delayed := d >= lim.FailureDelay; delayed != (i >= 2) {
			t.Errorf("failure %d took %v", i, d)
		}
	}
	// Refused now, even with the right password, and at once.
	d, e := login(bad, rootPW)
	if e == nil || e.Code != xerr.SessionAuthenticationFailed || len(e.Data) != 2 || !strings.Contains(e.Data[1], "too many failed logins") {
		t.Fatalf("during refusal: %v", e)
	}
	if d < lim.FailureDelay || d > lim.FailureDelay+200*time.Millisecond {
		t.Errorf("refusal took %v, want about the failure delay %v", d, lim.FailureDelay)
	}
	// Another client is not affected.
	if _, e := login(good, rootPW); e != nil {
		t.Fatalf("other client: %v", e)
	}
	// The refusal ends.
	time.Sleep(lim.RefusalPeriod + 50*time.Millisecond)
	if _, e := login(bad, rootPW); e != nil {
		t.Fatalf("after the refusal: %v", e)
	}
	// The next failure in the window is refused for twice as long.
	login(bad, "wrong")
	time.Sleep(lim.RefusalPeriod + 50*time.Millisecond)
	if _, e := login(bad, rootPW); e == nil || len(e.Data) != 2 {
		t.Fatalf("doubled refusal: %v", e)
	}
}

// Finding 6 acceptance: while one client hammers wrong passwords, its
// attempts are refused before hashing, and another client's calls
// (host.get_record, and logins with the right password) go on: their p99
// is logged (about 9 ms on a quiet machine) and held under 500 ms, so
// that only a flood that stalls others fails, not a busy machine. The
// work factor is a tenth of the default (a hundredth under the race
// detector, which slows hashing tenfold), so that a login costs a few
// milliseconds: at the default a single login takes about 20 ms of CPU,
// and on a small loaded machine its p99 is near 50 ms even without a
// flood. LOGIN_FLOOD_ITERATIONS sets another work factor for measuring.
func TestLoginFloodDoesNotSlowOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("timing test")
	}
	iter := api.DefaultConfig().PasswordIterations / 10
	if raceEnabled {
		iter /= 10
	}
	if n, err := strconv.Atoi(os.Getenv("LOGIN_FLOOD_ITERATIONS")); err == nil && n > 0 {
		iter = n
	}
	t.Logf("work factor %d", iter)
	h := newHarness(t, func(c *api.Config) { c.PasswordIterations = iter })
	lim := api.DefaultAuthLimits()
	lim.FailureDelay = 100 * time.Millisecond // reach the refusal phase within the test
	h.srv.SetAuthLimits(lim)
	good := clientFrom("127.0.0.3")
	root := str(t, h.ok("session.login_with_password", "root", rootPW, "2.21", "t"))
	host := strs(h, h.ok("host.get_all", root))[0]

	// measure runs the other client's calls for a while: host.get_record,
	// and a login with the right password (then a logout) every fourth.
	measure := func(d time.Duration) (get, login []time.Duration) {
		end := time.Now().Add(d)
		for i := 0; time.Now().Before(end); i++ {
			start := time.Now()
			if _, e := callVia(t, good, h.http.URL, "host.get_record", root, host); e != nil {
				t.Fatalf("host.get_record: %v", e)
			}
			get = append(get, time.Since(start))
			if i%4 == 0 {
				start = time.Now()
				r, e := callVia(t, good, h.http.URL, "session.login_with_password", "root", rootPW, "2.21", "t")
				if e != nil {
					t.Fatalf("login: %v", e)
				}
				login = append(login, time.Since(start))
				var s string
				json.Unmarshal(r, &s)
				callVia(t, good, h.http.URL, "session.logout", s)
			}
		}
		return get, login
	}
	measure(100 * time.Millisecond) // warm up

	// flood hammers wrong passwords from one address with 16 connections
	// while the other client measures; it returns the measurements.
	flood := func(from string) (get, login []time.Duration) {
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var attempts, refused atomic.Int64
		bad := clientFrom(from)
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					_, e := callVia(t, bad, h.http.URL, "session.login_with_password", "root", "guess", "2.21", "t")
					attempts.Add(1)
					if e != nil && len(e.Data) == 2 {
						refused.Add(1)
					}
				}
			}()
		}
		get, login = measure(2 * time.Second)
		stop()
		wg.Wait()
		t.Logf("flood from %s: %d wrong-password attempts, %d refused before hashing", from, attempts.Load(), refused.Load())
		if hashed := attempts.Load() - refused.Load(); hashed > int64(lim.FailuresBeforeRefusal)+16 {
			t.Errorf("%d of %d flood attempts were hashed", hashed, attempts.Load())
		}
		return get, login
	}
	// The machine may be busy with other work: a round whose p99 is over
	// the bound is tried again (with a new flooding address, so that
	// every round has its hashing phase), up to three times. A flood that
	// stalled others would fail every round.
	for round, from := range []string{"127.0.0.2", "127.0.0.4", "127.0.0.5"} {
		baseGet, baseLogin := measure(time.Second)
		floodGet, floodLogin := flood(from)
		t.Logf("round %d, other client without flood: host.get_record p50 %v p99 %v; login p50 %v p99 %v", round+1,
			median(baseGet), percentile(baseGet, 0.99), median(baseLogin), percentile(baseLogin, 0.99))
		t.Logf("round %d, other client during flood:  host.get_record p50 %v p99 %v; login p50 %v p99 %v", round+1,
			median(floodGet), percentile(floodGet, 0.99), median(floodLogin), percentile(floodLogin, 0.99))
		p := percentile(append(slices.Clone(floodGet), floodLogin...), 0.99)
		if p <= 500*time.Millisecond {
			return
		}
		t.Logf("round %d: p99 during the flood %v", round+1, p)
	}
	t.Errorf("other client's p99 during the flood over 500 ms in every round")
}
