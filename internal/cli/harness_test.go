package cli

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	"toolstackd/internal/cli/xe"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

const rootPW = "secret"

// harness is a CLI server over an API server and an in-memory database,
// served on a loopback port (remote callers, passwords needed) and, for
// local callers, through api.LocalHandler.
type harness struct {
	t      *testing.T
	d      *db.DB
	api    *api.Server
	cli    *Server
	router *mux.Router
	http   *httptest.Server // remote
	local  *httptest.Server // as the local socket
	host   string
}

// fixture fills a database; it returns this host's ref.
type fixture func(t testing.TB, d *db.DB, pwHash string) string

func newHarness(t testing.TB, fill fixture, tweak ...func(*Options)) *harness {
	t.Helper()
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	d := db.New(dm.Model, db.Options{})
	hash, err := api.HashPassword(rootPW, cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = fill(t, d, hash)
	srv := api.New(d, cfg, slog.New(slog.DiscardHandler))
	opts := Options{Log: slog.New(slog.DiscardHandler)}
	for _, f := range tweak {
		f(&opts)
	}
	c := New(srv, opts)
	r := mux.NewRouter()
	srv.Routes(r)
	c.Routes(r)
	h := &harness{d: d, api: srv, cli: c, router: r, host: cfg.HostRef}
	h.http = httptest.NewServer(r)
	h.local = httptest.NewServer(api.LocalHandler(r))
	t.Cleanup(func() { h.http.Close(); h.local.Close(); srv.Close() })
	if tt, ok := t.(*testing.T); ok {
		h.t = tt
	}
	return h
}

// result is what an xe run printed.
type result struct {
	out, err string
	code     int
}

// xe runs the xe client (the library cmd/xe uses) against the harness:
// remotely with the root password unless the args say otherwise.
func (h *harness) xe(args ...string) result {
	return h.xeWith(h.http, nil, args...)
}

// xeLocal runs xe as the local superuser (no password).
func (h *harness) xeLocal(args ...string) result {
	return h.xeWith(h.local, nil, args...)
}

func (h *harness) xeWith(hs *httptest.Server, tweak func(*xe.Client), args ...string) result {
	var out, errb bytes.Buffer
	addr := hs.Listener.Addr().String()
	cl := &xe.Client{
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Getenv: func(string) string { return "" }, Cwd: "/", Heartbeat: time.Hour,
		Dial: func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	}
	if tweak != nil {
		tweak(cl)
	}
	full := args
	if hs == h.http && !hasPassword(args) {
		full = append(append([]string{}, args...), "-pw", rootPW)
	}
	code := cl.Run(full)
	return result{out.String(), errb.String(), code}
}

func hasPassword(args []string) bool {
	for _, a := range args {
		if a == "-pw" || a == "-pwf" || strings.HasPrefix(a, "password=") {
			return true
		}
	}
	return false
}

// route adds a test endpoint.
func (h *harness) route(path string, fn http.HandlerFunc, methods ...string) {
	h.router.HandleFunc(path, fn).Methods(methods...)
}
