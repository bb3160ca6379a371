package pool

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"toolstackd/internal/api"
	"toolstackd/internal/xerr"
)

// HTTP handlers' requests between hosts (api.HTTPForwarder): a disk
// transfer or a console the coordinator passes on to the host with the
// disk or the domain, with the same headers as a forwarded call (the pool
// secret, the caller's identity, the coordinator's raft index); and a
// member asking the coordinator about a session it does not hold.

// sessionPath answers a member asking who holds a session.
const sessionPath = "/pool/session"

// connectTimeout bounds opening a tunnel to another host (the tunnel
// itself lasts as long as the console is used).
const connectTimeout = 30 * time.Second

// sessionTimeout bounds a member's question about a session.
const sessionTimeout = 10 * time.Second

// ForwardHTTP sends req on to host (api.HTTPForwarder).
func (p *Pool) ForwardHTTP(ctx context.Context, hostRef string, req *http.Request, id api.Identity) (*http.Response, error) {
	addr, err := p.peerRequest(hostRef, req, id)
	if err != nil {
		return nil, err
	}
	resp, err := p.peer.Do(req.WithContext(ctx)) //nolint:gosec // the address is a pool member's from raft's configuration, not the client's
	if err != nil {
		// Do's error is a *url.Error naming the URL, whose query may hold
		// the session's ref (session_id): its cause is logged instead.
		p.log.Warn("cannot forward a request", "host", hostRef, "addr", addr, "path", req.URL.Path, "err", errors.Unwrap(err))
		return nil, xerr.New(xerr.CannotContactHost, hostRef)
	}
	return resp, nil
}

// ConnectHTTP opens a tunnel (a CONNECT) on host (api.HTTPForwarder).
func (p *Pool) ConnectHTTP(ctx context.Context, hostRef string, req *http.Request, id api.Identity) (net.Conn, *http.Response, error) {
	addr, err := p.peerRequest(hostRef, req, id)
	if err != nil {
		return nil, nil, err
	}
	unreachable := func(err error) error {
		p.log.Warn("cannot open a tunnel", "host", hostRef, "addr", addr, "err", err)
		return xerr.New(xerr.CannotContactHost, hostRef)
	}
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := p.dial(dctx, addr)
	if err != nil {
		return nil, nil, unreachable(err)
	}
	nonce, q := p.sign(req)
	br, resp, err := exchange(dctx, conn, req)
	if err != nil {
		return nil, nil, unreachable(err)
	}
	if !p.proven(resp, nonce, q) {
		_ = conn.Close()
		return nil, nil, unreachable(errNoProof)
	}
	if resp.StatusCode != http.StatusOK {
		// A refusal is small and has its length: read it before the
		// connection goes.
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = conn.Close()
		resp.Body = io.NopCloser(bytes.NewReader(msg))
		return nil, resp, nil
	}
	return &bufferedConn{Conn: conn, r: br}, resp, nil
}

// peerRequest addresses req to host with the intra-pool headers and
// returns the host's address.
func (p *Pool) peerRequest(hostRef string, req *http.Request, id api.Identity) (string, error) {
	addr := p.addressOf(hostRef)
	if addr == "" {
		p.log.Warn("cannot forward a request: the host is not in raft's configuration", "host", hostRef)
		return "", xerr.New(xerr.CannotContactHost, hostRef)
	}
	p.toPeer(req, addr)
	return addr, p.onBehalf(req, id)
}

// dial connects to another host as the pool's HTTP client does (its
// source address; TLS when the pool speaks it).
func (p *Pool) dial(ctx context.Context, addr string) (net.Conn, error) {
	t, ok := p.client.Transport.(*http.Transport)
	if !ok || t.DialContext == nil {
		return nil, errors.New("the pool's client has no dialer")
	}
	conn, err := t.DialContext(ctx, "tcp", addr)
	if err != nil || t.TLSClientConfig == nil {
		return conn, err
	}
	tc := tls.Client(conn, t.TLSClientConfig.Clone())
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return tc, nil
}

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// PeerIdentity is who a request from another host of the pool runs as
// (api.HTTPForwarder). A request that names an identity must be signed
// with the pool secret and addressed to this host (its answer then
// carries this host's proof, set on w); it is served once this host holds
// the raft index the sender had.
func (p *Pool) PeerIdentity(w http.ResponseWriter, r *http.Request) (id api.Identity, ok, bad bool) {
	if r.Header.Get(headerIdentity) == "" {
		return id, false, false
	}
	if p.verify(w, r) != nil {
		return id, false, true
	}
	id, _, err := p.identityOf(r)
	return id, err == nil, err != nil
}

// identityOf reads who a request from another host runs as, and waits
// until this host holds the raft index the sender had; status is the
// HTTP status of a failure.
func (p *Pool) identityOf(r *http.Request) (id api.Identity, status int, err error) {
	if err := json.Unmarshal([]byte(r.Header.Get(headerIdentity)), &id); err != nil || id.Roles&^api.AllRoles != 0 {
		return id, http.StatusBadRequest, errors.New("a forwarded request names who it runs as")
	}
	if idx, perr := strconv.ParseUint(r.Header.Get(headerIndex), 10, 64); perr == nil {
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		t0 := time.Now()
		if err := p.cfg.Repl.WaitApplied(ctx, idx); err != nil {
			return id, http.StatusServiceUnavailable, err
		}
		p.log.Debug("waited for the raft index of a request from another host", "index", idx, "took", time.Since(t0), "path", r.URL.Path)
	}
	return id, http.StatusOK, nil
}

// sessionQuestion asks the coordinator about a session.
type sessionQuestion struct {
	Session string `json:"session"`
}

// RemoteSession asks the coordinator who holds a session
// (api.HTTPForwarder).
func (p *Pool) RemoteSession(ctx context.Context, ref string) (api.Identity, error) {
	var id api.Identity
	ctx, cancel := context.WithTimeout(ctx, sessionTimeout)
	defer cancel()
	leader, err := p.cfg.Repl.WaitLeader(ctx)
	if err != nil {
		return id, xerr.New(xerr.CannotContactHost, p.Coordinator())
	}
	body, err := json.Marshal(sessionQuestion{ref})
	if err != nil {
		return id, err
	}
	resp, err := p.post(ctx, leader, sessionPath, "application/json", body)
	if err != nil {
		return id, xerr.New(xerr.CannotContactHost, leader)
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return id, xerr.New(xerr.SessionInvalid, ref)
	default:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return id, xerr.New(xerr.InternalError, fmt.Sprintf("the coordinator %s: %s: %s", leader, resp.Status, msg))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxMessage)).Decode(&id); err != nil || id.Roles&^api.AllRoles != 0 {
		return api.Identity{}, xerr.New(xerr.InternalError, "the coordinator's answer about a session is not what was expected")
	}
	return id, nil
}

// serveSession answers a member asking who holds a session: 404 when
// nobody does here.
func (p *Pool) serveSession(w http.ResponseWriter, r *http.Request) {
	var q sessionQuestion
	if !readJSON(w, r, &q) {
		return
	}
	id, ok := p.cfg.Server.SessionIdentity(q.Session)
	if !ok {
		http.Error(w, "no such session", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(id)
}

// exchange writes req on a fresh connection to a peer and reads its
// answer, both within ctx; the connection then has no deadline of this
// side's making, and the reader holds whatever the peer sent after the
// answer's head (a tunnel's first bytes). On an error the connection is
// closed.
func exchange(ctx context.Context, conn net.Conn, req *http.Request) (*bufio.Reader, *http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	br := bufio.NewReader(conn)
	err := req.Write(conn)
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if !stop() || err != nil {
		_ = conn.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, nil, err
	}
	return br, resp, nil
}
