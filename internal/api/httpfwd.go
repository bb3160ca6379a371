package api

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"toolstackd/internal/netguard"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// HTTP handlers in a pool.
//
// Disk transfers (/import_raw_vdi, /export_raw_vdi) and consoles
// (/console) touch one host's disks or domains. A client sends them to
// the coordinator, or (a console's location) straight to the host that
// runs the VM, with a session of the coordinator's:
//
//   - On the coordinator, the handler authenticates the request, finds
//     the host that must serve it and, when that is another host, calls
//     ProxyHTTP: the request goes on to that host with the caller's
//     identity and the coordinator's raft index (as a forwarded call
//     does), and the answer, or the console's byte stream, comes back
//     through the coordinator. A task the client named with task_id
//     stays on the coordinator, where the client polls it; the coordinator
//     writes its outcome from the host's answer.
//   - On a member, HTTPSession accepts what the coordinator forwarded
//     (HTTPForwarder.PeerIdentity: the pool secret and an identity), and
//     asks the coordinator about a session it does not hold itself
//     (HTTPForwarder.RemoteSession), as xapi's members check sessions in
//     the master's database.

// HTTPForwarder is a Forwarder that also carries HTTP handlers' requests
// between the hosts of a pool.
type HTTPForwarder interface {
	Forwarder
	// ForwardHTTP sends req (its body streamed) to host to run as id and
	// returns that host's response. A host that cannot be reached is
	// CANNOT_CONTACT_HOST.
	ForwardHTTP(ctx context.Context, host string, req *http.Request, id Identity) (*http.Response, error)
	// ConnectHTTP sends req (a CONNECT) to host to run as id. When the
	// host answers 200, conn is the connection, now carrying the
	// tunnel's bytes (what the host sent after its answer first, in
	// conn's reads); otherwise conn is nil and resp is the refusal.
	ConnectHTTP(ctx context.Context, host string, req *http.Request, id Identity) (conn net.Conn, resp *http.Response, err error)
	// PeerIdentity is who r runs as when another host of the pool sent
	// it (ok), checked by its signature with the pool secret, whose proof
	// it then sets on w's headers; bad reports a request that names an
	// identity without a valid signature.
	PeerIdentity(w http.ResponseWriter, r *http.Request) (id Identity, ok, bad bool)
	// RemoteSession asks the coordinator who holds session ref
	// (SESSION_INVALID when nobody does).
	RemoteSession(ctx context.Context, ref string) (Identity, error)
}

// httpForwarder is the installed forwarder, if it carries HTTP.
func (s *Server) httpForwarder() HTTPForwarder {
	f := s.forwarder.Load()
	if f == nil {
		return nil
	}
	h, _ := (*f).(HTTPForwarder)
	return h
}

// SessionIdentity is the identity of a session for a call or a request
// forwarded on its behalf (ok false when ref names no live session here).
func (s *Server) SessionIdentity(ref string) (Identity, bool) {
	sess := s.sessions.get(ref)
	if sess == nil {
		return Identity{}, false
	}
	return sess.identity(), true
}

func (sess *Session) identity() Identity {
	return Identity{Session: sess.Ref, User: sess.User, Originator: sess.Originator, Roles: sess.Roles, Superuser: sess.LocalSuperuser}
}

// peerSession is the session of a request another host of the pool sent
// here (nil if it is not one); handled reports that it was refused.
func (s *Server) peerSession(w http.ResponseWriter, r *http.Request) (sess *Session, handled bool) {
	f := s.httpForwarder()
	if f == nil {
		return nil, false
	}
	who, ok, bad := f.PeerIdentity(w, r)
	switch {
	case bad:
		http.Error(w, "pool secret required", http.StatusForbidden)
		return nil, true
	case ok:
		sess := forwardedSession(r.Context(), who)
		sess.peer = true
		return sess, false
	}
	return nil, false
}

// remoteSession is, on a pool member, the coordinator's session id as the
// coordinator describes it (nil if it holds no such session); handled
// reports that the coordinator could not be asked, and the request was
// answered.
func (s *Server) remoteSession(w http.ResponseWriter, r *http.Request, id string) (sess *Session, handled bool) {
	f := s.httpForwarder()
	if f == nil || s.notCoordinator() == nil {
		return nil, false
	}
	who, err := f.RemoteSession(r.Context(), id)
	switch {
	case err == nil:
		return forwardedSession(r.Context(), who), false
	case xerr.HasCode(err, xerr.SessionInvalid):
		return nil, false
	}
	WriteHTTPError(w, err)
	return nil, true
}

// ProxyHTTP serves r on host when host is another host of the pool and
// reports whether it did (the response written, whatever the outcome).
// The handler calls it once it has authenticated r (sess) and found the
// host that must serve it; with false it serves r itself.
func (s *Server) ProxyHTTP(w http.ResponseWriter, r *http.Request, sess *Session, host string) bool {
	f := s.httpForwarder()
	if f == nil || host == "" || host == schema.NullRef || host == s.Cfg.HostRef || sess.peer {
		return false // (a request another host sent here runs here)
	}
	q := r.URL.Query()
	ctx := r.Context()
	legacy := r.Method == http.MethodPut && LegacyUpload(r)
	if r.Method == http.MethodConnect || legacy {
		// The connection is taken over: net/http cancels the request's
		// context when the client ends its side, which here is how the
		// body ends, not a reason to stop.
		ctx = context.WithoutCancel(ctx)
	}
	var task *Task
	if ref := q.Get("task_id"); ref != "" {
		t, err := s.AdoptTask(ctx, sess, ref)
		if err != nil {
			WriteHTTPError(w, err)
			return true
		}
		task = t
		// The task stays here; the host serving the request makes its
		// own, and its answer decides this one's outcome.
		q.Del("task_id")
	}
	if task != nil {
		ctx = task.Context()
	}
	out := r.Clone(ctx)
	out.URL.RawQuery = q.Encode()
	out.RequestURI = ""
	id := sess.identity()
	var err error
	switch {
	case r.Method == http.MethodConnect:
		err = s.proxyConnect(w, r, out, f, host, id)
	case legacy:
		err = s.proxyLegacyUpload(w, out, f, host, id, task)
	default:
		err = s.proxyRequest(w, out, f, host, id)
	}
	if task != nil {
		task.Finish(schema.Void, nil, err)
	}
	return true
}

// UnknownLength is the Content-Length Xen Orchestra's client (npm
// xen-api) declares for a stream whose length it does not know (1 PiB):
// it sends what it has and closes its side, and xapi, which answers an
// upload before reading it, takes the end of the connection as the end of
// the data. Nothing uploaded is that large, so such a length means
// "unknown" here too.
const UnknownLength = 1 << 50

// LegacyUpload reports an upload whose body runs to the end of the
// connection: HTTP/1.0-style with neither a length nor chunking, or with
// the UnknownLength declaration.
func LegacyUpload(r *http.Request) bool {
	noLength := r.ContentLength == 0 && r.Header.Get("Content-Length") == "" && len(r.TransferEncoding) == 0
	return noLength || r.ContentLength >= UnknownLength
}

// hopHeaders are a connection's own headers, never passed on.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// proxyRequest passes a request on and its answer back, and returns the
// outcome the host reported: nil for a 2xx answer, else its XenAPI error.
func (s *Server) proxyRequest(w http.ResponseWriter, out *http.Request, f HTTPForwarder, host string, id Identity) error {
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	resp, err := f.ForwardHTTP(out.Context(), host, out, id)
	if err != nil {
		WriteHTTPError(w, err)
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	for k, vs := range resp.Header {
		if !isHop(k) {
			w.Header()[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_, _ = w.Write(msg)
		return answerError(resp.StatusCode, msg)
	}
	// Large reads, one flush each: a disk streams at close to the speed
	// of the host serving it.
	if _, err := io.CopyBuffer(flushWriter{w}, resp.Body, make([]byte, 1<<20)); err != nil {
		return xerr.New(xerr.InternalError, "the transfer was cut: "+err.Error())
	}
	return nil
}

// proxyLegacyUpload serves an upload without a length as xapi does (200 at
// once, then the body to the end of the connection) and sends it on
// chunked; the host's answer, at the end, is the outcome.
func (s *Server) proxyLegacyUpload(w http.ResponseWriter, out *http.Request, f HTTPForwarder, host string, id Identity, task *Task) error {
	hj, ok := w.(http.Hijacker)
	if !ok {
		err := xerr.New(xerr.ImportError, "send a Content-Length or use chunked encoding")
		WriteHTTPError(w, err)
		return err
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return err
	}
	conn := netguard.Transfer(c, brw.Reader)
	defer func() { _ = conn.Close() }()
	conn.SetDeadline(time.Time{})
	extra := http.Header{"Connection": {"close"}}
	if task != nil {
		extra.Set("Task-Id", task.Ref)
	}
	if _, err := conn.Write(netguard.Head(w, "HTTP/1.1 200 OK", extra)); err != nil {
		return err
	}
	out.Body = io.NopCloser(conn)
	out.ContentLength = -1
	out.Header.Del("Content-Length")
	resp, err := f.ForwardHTTP(out.Context(), host, out, id)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return answerError(resp.StatusCode, msg)
	}
	return nil
}

// proxyConnect opens the tunnel on host and joins the client to it.
func (s *Server) proxyConnect(w http.ResponseWriter, r, out *http.Request, f HTTPForwarder, host string, id Identity) error {
	conn, resp, err := f.ConnectHTTP(out.Context(), host, out, id)
	if err != nil {
		WriteHTTPError(w, err)
		return err
	}
	if conn == nil {
		defer func() { _ = resp.Body.Close() }()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		http.Error(w, strings.TrimSpace(string(msg)), resp.StatusCode)
		return answerError(resp.StatusCode, msg)
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = conn.Close()
		http.Error(w, "connection cannot be taken over", http.StatusInternalServerError)
		return errors.New("no hijacker")
	}
	raw, rw, err := hj.Hijack()
	if err != nil {
		_ = conn.Close()
		return err
	}
	client := netguard.Interactive(raw, rw.Reader)
	client.SetDeadline(time.Time{})
	if _, err := client.Write(netguard.Head(w, "HTTP/1.1 200 OK", http.Header{"Connection": {"keep-alive"}})); err != nil {
		_ = client.Close()
		_ = conn.Close()
		return err
	}
	s.Log.Debug("console forwarded", "host", host, "peer", r.RemoteAddr)
	Splice(client, client, conn)
	return nil
}

// Splice copies both ways between a client and a backend until either
// side ends, then closes both.
func Splice(client net.Conn, fromClient io.Reader, backend net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(backend, fromClient)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(client, backend)
		done <- struct{}{}
	}()
	<-done // either side ending ends the session
	_ = client.Close()
	_ = backend.Close()
	<-done
}

func isHop(k string) bool {
	for _, h := range hopHeaders {
		if strings.EqualFold(k, h) {
			return true
		}
	}
	return false
}

// answerError reads a host's refusal: handlers answer with the XenAPI
// error's code and parameters on one line.
func answerError(status int, body []byte) error {
	fields := strings.Fields(strings.TrimSpace(string(body)))
	if len(fields) > 0 && xerr.Published(fields[0]) {
		return xerr.New(fields[0], fields[1:]...)
	}
	return xerr.New(xerr.InternalError, http.StatusText(status)+": "+strings.TrimSpace(string(body)))
}

// HTTPStatus is the HTTP status an HTTP handler answers a XenAPI error
// with.
func HTTPStatus(err error) int {
	switch xerr.From(err).Code {
	case xerr.HandleInvalid, xerr.UUIDInvalid:
		return http.StatusNotFound
	case xerr.InvalidValue, xerr.ValueNotSupported, xerr.ImportErrorCannotHandleChunked, xerr.ImportError:
		return http.StatusBadRequest
	case xerr.VDIInUse, xerr.OtherOperationInProgress, xerr.OperationNotAllowed:
		return http.StatusConflict
	case xerr.VDIReadonly, xerr.RBACPermissionDenied:
		return http.StatusForbidden
	case xerr.SRFull:
		return http.StatusInsufficientStorage
	case xerr.VDITooSmall:
		return http.StatusRequestEntityTooLarge
	case xerr.SRNotAttached, xerr.SRHasNoPBDs:
		return http.StatusServiceUnavailable
	case xerr.CannotContactHost, xerr.HostOffline:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// WriteHTTPError answers an HTTP handler's request with a XenAPI error:
// its status (HTTPStatus) and the code and parameters on one line of
// text, which the pool's forwarding reads back (answerError). The
// connection is closed after it: an upload refused before its body is
// read is then answered at once, where net/http would first wait to read
// what is left of the body (a client that waits for the answer before
// sending, like Xen Orchestra's probe, would wait for the read deadline).
func WriteHTTPError(w http.ResponseWriter, err error) {
	xe := xerr.From(err)
	w.Header().Set("Connection", "close")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(HTTPStatus(err))
	_, _ = io.WriteString(w, strings.Join(append([]string{xe.Code}, xe.Params...), " ")+"\n") //nolint:gosec // text/plain, not HTML: nothing to script
}

// flushWriter flushes after every write, so a stream keeps moving.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}
