// Package cli is the server side of the xe command line: POST /cli
// speaking xapi's thin-CLI protocol (package proto), the command table
// (xapi's list of commands and their parameters, plus the list and
// param commands generated for every class of the datamodel), and the
// commands themselves, which run as XenAPI calls through api.Invoke.
//
// As in xapi the command table lives in the server and xe is a thin
// client: it sends its arguments, one per line, and then does what the
// server tells it (print, read a file, upload or download over HTTP,
// prompt, exit).
package cli

//go:generate go run ./gen -in ../datamodel/cli_commands.json -out zz_table.go

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	"toolstackd/internal/cli/proto"
	"toolstackd/internal/netguard"
	"toolstackd/internal/xerr"
)

// Options are the CLI server's settings.
type Options struct {
	// MaxBody bounds the request body (the arguments); xapi's limit is
	// 200 KiB.
	MaxBody int64
	// MaxUpload bounds a file the client sends with Load; xapi's limit
	// is 32 MiB.
	MaxUpload int64
	// Heartbeat is how often a client of protocol 0.2 or later sends
	// Response Wait during a long transfer (300 s). The server gives up
	// on a silent client after three of these.
	Heartbeat time.Duration
	// Log receives a line per command, with secrets left out.
	Log *slog.Logger
	// ClientTLS, when set, checks another pool's coordinator over https
	// (xe vm-migrate remote-master=): the roots its certificate must
	// lead to. Nil: the system's roots.
	ClientTLS func() *tls.Config
}

// DefaultOptions are xapi's limits.
func DefaultOptions() Options {
	return Options{MaxBody: 200 << 10, MaxUpload: 32 << 20, Heartbeat: 300 * time.Second}
}

// Server serves xe commands.
type Server struct {
	api    *api.Server
	opts   Options
	log    *slog.Logger
	router *mux.Router

	cmds    map[string]*Command
	names   []string // sorted
	classes map[string]*classView
	views   []*classView
}

// New makes the CLI server over an API server. Zero options take their
// defaults.
func New(srv *api.Server, opts Options) *Server {
	def := DefaultOptions()
	if opts.MaxBody <= 0 {
		opts.MaxBody = def.MaxBody
	}
	if opts.MaxUpload <= 0 {
		opts.MaxUpload = def.MaxUpload
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = def.Heartbeat
	}
	log := opts.Log
	if log == nil {
		log = srv.Log
	}
	s := &Server{api: srv, opts: opts, log: log, cmds: map[string]*Command{}, classes: map[string]*classView{}}
	s.buildTable()
	return s
}

// Routes adds POST /cli (and PUT, which costs nothing) to a router. The
// router is also how commands find out whether the HTTP endpoints they
// send the client to (VDI import and export, ...) exist yet.
func (s *Server) Routes(r *mux.Router) {
	s.router = r
	r.Handle("/cli", s).Methods(http.MethodPost, http.MethodPut)
}

// hasRoute reports whether the router serves method on path.
func (s *Server) hasRoute(method, path string) bool {
	if s.router == nil {
		return false
	}
	req, err := http.NewRequest(method, path, nil)
	if err != nil {
		return false
	}
	var m mux.RouteMatch
	return s.router.Match(req, &m) && m.MatchErr == nil
}

// ServeHTTP answers POST /cli. The reply is the thin-CLI protocol on the
// raw connection, with no HTTP status line, as xe expects.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > max(s.opts.MaxBody, 4<<20) {
		http.Error(w, "command too long", http.StatusRequestEntityTooLarge)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, s.opts.MaxBody+1))
	if err != nil {
		http.Error(w, "cannot read the command", http.StatusBadRequest)
		return
	}
	tooBig := int64(len(body)) > s.opts.MaxBody
	if tooBig {
		// Read the rest, so that the protocol starts after the body.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 4<<20)) // best effort: the refusal follows either way
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "the CLI needs an HTTP/1 connection", http.StatusHTTPVersionNotSupported)
		return
	}
	nc, rw, err := hj.Hijack()
	if err != nil {
		s.log.Debug("cli: hijack", "err", err)
		return
	}
	defer func(c func() error) { _ = c() }(nc.Close)
	nc.SetDeadline(time.Time{})
	conn := proto.NewConn(rw.Reader, bufio.NewWriterSize(nc, 64<<10))
	ctx := api.RequestContext(r)
	if tooBig {
		// The client still gets a protocol answer, not a reset.
		s.refuse(conn, nc, fmt.Sprintf("Error: the command is longer than the %d bytes allowed\n", s.opts.MaxBody))
		return
	}
	session, args := splitBody(string(body))
	s.serve(ctx, conn, nc, session, args)
}

// refuse does the handshake and ends the conversation with an error.
func (s *Server) refuse(conn *proto.Conn, nc net.Conn, msg string) {
	_, _ = conn.W.Write(proto.Banner(proto.Major, proto.Minor)) // sticky: the Flush or Recv after reports it
	conn.Flush()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := proto.ReadBanner(conn.R); err != nil {
		return
	}
	conn.Send(proto.PrintStderr(msg))
	conn.Send(proto.Exit(1))
	conn.Flush()
	// Read what the client is still sending, so that closing does not
	// reset the connection before it reads the reply.
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, _ = io.CopyN(io.Discard, conn.R, 1<<20) // draining until the client closes or the deadline
}

// serve runs one conversation: handshake, command, Exit.
func (s *Server) serve(ctx context.Context, conn *proto.Conn, nc net.Conn, session string, args []string) {
	_, _ = conn.W.Write(proto.Banner(proto.Major, proto.Minor)) // sticky: the Flush or Recv after reports it
	if err := conn.Flush(); err != nil {
		return
	}
	// A client that does not answer the banner within the stall timeout
	// is dropped. (Writes to a client that stops reading are bounded by
	// the listener's write timeout.)
	nc.SetReadDeadline(time.Now().Add(netguard.StallTimeout(nc)))
	major, minor, err := proto.ReadBanner(conn.R)
	nc.SetReadDeadline(time.Time{})
	if err != nil {
		s.log.Debug("cli: client banner", "err", err)
		return
	}
	if major != proto.Major {
		s.log.Info("cli: refusing a client of another protocol version", "major", major, "minor", minor)
		return
	}
	c := &Ctx{s: s, ctx: ctx, conn: conn, nc: nc, session: session, heartbeats: major*10+minor >= proto.HeartbeatVersion}
	defer func() {
		// A bug in a command ends that command, not the daemon.
		if r := recover(); r != nil {
			s.log.Error("cli: command panicked", "command", c.name, "panic", r)
			conn.Send(proto.Error(xerr.InternalError, []string{fmt.Sprintf("xe %s: %v", c.name, r)}))
			conn.Send(proto.Exit(1))
			conn.Flush()
		}
	}()
	code := c.run(args)
	conn.Send(proto.Exit(code))
	conn.Flush()
}

// Ctx is one command being run.
type Ctx struct {
	s          *Server
	ctx        context.Context
	conn       *proto.Conn
	nc         net.Conn
	heartbeats bool

	cmd     *Command
	name    string
	params  []param
	bare    []string
	user    string
	session string // the session the command runs as
	out     printer
}

// run parses and runs a command and returns its exit status.
func (c *Ctx) run(args []string) int {
	c.out = printer{conn: c.conn}
	name, params, bare, err := parseArgs(args)
	if err != nil {
		return c.report(err)
	}
	c.name, c.params, c.bare = name, params, bare
	if v, ok := c.param("minimal"); ok {
		c.out.minimal, _ = parseBool(v)
	}
	c.user, _ = c.param("username")
	c.logCommand()
	if err := c.exec(); err != nil {
		return c.report(err)
	}
	c.out.flush()
	return 0
}

// prepare finds the command and checks its parameters, before any
// login: an unknown command or a missing parameter is reported even with
// a wrong password, as xapi does.
func (c *Ctx) prepare() error {
	cmd := c.s.cmds[c.name]
	if cmd == nil {
		return unknownCommand(c.name)
	}
	c.cmd = cmd
	if len(c.bare) > 0 && !cmd.positional {
		return syntaxError("malformed argument '" + c.bare[0] + "': expected name=value")
	}
	for _, p := range cmd.Reqd {
		if _, ok := c.param(strings.TrimSuffix(p, ":")); !ok && !(strings.HasSuffix(p, ":") && c.hasMapParam(p)) {
			return missingParam(p)
		}
	}
	if err := c.checkParams(); err != nil {
		return err
	}
	if cmd.Run == nil {
		return xerr.New(xerr.NotImplemented, cmd.Name)
	}
	return nil
}

func (c *Ctx) exec() error {
	if err := c.prepare(); err != nil {
		return err
	}
	cmd := c.cmd
	if !cmd.noSession {
		done, err := c.login()
		if err != nil {
			return err
		}
		defer done()
	}
	return cmd.Run(c)
}

// login opens the command's session: the one the request named, or a
// new one from username and password. The returned function ends a
// session the command opened.
func (c *Ctx) login() (func(), error) {
	if c.session != "" {
		if c.s.api.SessionFor(c.session) == nil {
			return nil, xerr.New(xerr.SessionInvalid, c.session)
		}
		return func() {}, nil
	}
	pw, _ := c.param("password")
	res, _, err := c.s.api.Invoke(c.ctx, "", "session.login_with_password", c.user, pw, "", "cli")
	if err != nil {
		return nil, err
	}
	c.session = res.(string)
	return func() {
		// The conversation is over; a session left behind expires.
		// SESSION_INVALID (it ended meanwhile) is not logged: it names the ref.
		if _, _, err := c.s.api.Invoke(context.WithoutCancel(c.ctx), c.session, "session.logout"); err != nil && !xerr.HasCode(err, xerr.SessionInvalid) {
			c.s.log.Warn("cli: session.logout", "err", err)
		}
	}, nil
}

// call runs a XenAPI call as the command's session.
func (c *Ctx) call(method string, args ...any) (any, error) {
	v, _, err := c.s.api.Invoke(c.ctx, c.session, method, args...)
	return v, err
}

// param returns the first value given for a parameter.
func (c *Ctx) param(k string) (string, bool) {
	for _, p := range c.params {
		if p.k == k {
			return p.v, true
		}
	}
	return "", false
}

// paramOr returns a parameter or a default.
func (c *Ctx) paramOr(k, def string) string {
	if v, ok := c.param(k); ok {
		return v
	}
	return def
}

// boolParam reads a boolean parameter (false when absent).
func (c *Ctx) boolParam(k string) (bool, error) { return c.boolParamOr(k, false) }

// boolParamOr is boolParam with def for a parameter not given.
func (c *Ctx) boolParamOr(k string, def bool) (bool, error) {
	v, ok := c.param(k)
	if !ok {
		return def, nil
	}
	b, ok := parseBool(v)
	if !ok {
		return false, failf("Failed to parse parameter '%s': expected a boolean (true or false), got '%s'", k, v)
	}
	return b, nil
}

// mapParams returns the "prefix:key=value" parameters as key -> value.
func (c *Ctx) mapParams(prefix string) map[string]string {
	prefix = strings.TrimSuffix(prefix, ":") + ":"
	out := map[string]string{}
	for _, p := range c.params {
		if k, ok := strings.CutPrefix(p.k, prefix); ok && k != "" {
			out[k] = p.v
		}
	}
	return out
}

func (c *Ctx) hasMapParam(prefix string) bool {
	for _, p := range c.params {
		if strings.HasPrefix(p.k, prefix) && len(p.k) > len(prefix) {
			return true
		}
	}
	return false
}

// require returns a required parameter (the table has checked that it is
// there).
func (c *Ctx) require(k string) string {
	v, _ := c.param(k)
	return v
}

// checkParams refuses parameters the command does not take.
func (c *Ctx) checkParams() error {
	cmd := c.cmd
	if cmd.anyParams {
		return nil
	}
	for _, p := range c.params {
		k := p.k
		if standardParams[k] || k == "session_id" || cmd.takes(k) {
			continue
		}
		if cmd.accepts != nil {
			ok, err := cmd.accepts(c, k)
			if err != nil {
				return err
			}
			if ok {
				continue
			}
		}
		return unknownParam(k)
	}
	return nil
}

// secretParam reports whether a parameter's value stays out of the log.
func secretParam(cmd, k string) bool {
	lk := strings.ToLower(k)
	switch {
	case strings.Contains(lk, "password"), strings.Contains(lk, "secret"), k == "url", lk == "session_id":
		return true
	case cmd == "user-password-change" && (k == "old" || k == "new"):
		return true
	case strings.HasSuffix(cmd, "auth") && k == "config:pass":
		return true
	case cmd == "host-call-plugin" && strings.HasPrefix(k, "args"):
		return true
	}
	return false
}

func (c *Ctx) logCommand() {
	parts := make([]string, 0, len(c.params))
	for _, p := range c.params {
		v := p.v
		if secretParam(c.name, p.k) {
			v = "(omitted)"
		}
		parts = append(parts, p.k+"="+v)
	}
	level := slog.LevelInfo
	for _, suffix := range []string{"help", "-get", "-list"} {
		if strings.HasSuffix(c.name, suffix) {
			level = slog.LevelDebug
		}
	}
	c.s.log.Log(c.ctx, level, "xe "+c.name, "args", strings.Join(parts, " "))
}

// recv reads the client's next message, skipping the Wait heartbeats of
// a long transfer. With heartbeats a client that stays silent for three
// intervals is taken for dead.
func (c *Ctx) recv() (proto.Message, error) {
	for {
		if c.heartbeats {
			c.nc.SetReadDeadline(time.Now().Add(3 * c.s.opts.Heartbeat))
		}
		m, err := c.conn.Recv()
		if c.heartbeats {
			c.nc.SetReadDeadline(time.Time{})
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return m, failf("the client sent no heartbeat for %s", 3*c.s.opts.Heartbeat)
			}
			return m, err
		}
		if m.Is(proto.KindResponse, proto.TagWait) {
			continue
		}
		return m, nil
	}
}

// sortedNames lists command names (made once, by buildTable).
func (s *Server) sortedNames() []string { return s.names }
