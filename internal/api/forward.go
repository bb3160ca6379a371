package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"toolstackd/internal/api/wire"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Forwarding calls to other hosts of a pool.
//
// The route stage names the host a call must run on. When that is another
// host and a Forwarder is installed (the pool layer), the coordinator
// takes the call's marks as for any call, then sends the call to that
// host as a JSON-RPC request with the caller's identity (Identity); the
// host runs it as that caller without a session of its own, without
// taking the marks again and without forwarding it further, and the
// coordinator returns its answer. An Async call's task stays on the
// coordinator, where the client polls it; its progress comes back from
// the host while the call runs (progress.go).

// Identity is who a forwarded call runs as: the caller's session on the
// coordinator and what it may do.
type Identity struct {
	Session    string
	User       string
	Originator string
	Roles      schema.RoleSet
	Superuser  bool
	// Route marks a call a member sent whole to the coordinator (its
	// local socket's and its own internal sessions' calls, as xapi's
	// slaves send theirs to the master): the coordinator routes it as a
	// call of its own, marks taken and forwarded on to the host its
	// route names. Without it a forwarded call runs where it arrives.
	Route bool `json:",omitempty"`
}

// Forwarder sends a call to another host of the pool.
type Forwarder interface {
	// Forward sends body, a JSON-RPC request, to host (a host ref) to run
	// as id, and returns the JSON-RPC reply's body. A host that cannot be
	// reached is CANNOT_CONTACT_HOST.
	Forward(ctx context.Context, host string, body []byte, id Identity) ([]byte, error)
}

// SetForwarder installs the pool layer's forwarder.
func (s *Server) SetForwarder(f Forwarder) { s.forwarder.Store(&f) }

type forwardedKey struct{}

// forwardedIdentity is the identity of a call forwarded from the
// coordinator, if ctx carries one.
func forwardedIdentity(ctx context.Context) (Identity, bool) {
	if ctx == nil {
		return Identity{}, false
	}
	id, ok := ctx.Value(forwardedKey{}).(Identity)
	return id, ok
}

// Forwarded reports whether the call was forwarded here by the
// coordinator, which runs the caller's task (if any): the call's context
// ends when the coordinator stops waiting for it (the task cancelled).
func (c *Call) Forwarded() bool {
	_, ok := forwardedIdentity(c.Ctx)
	return ok
}

// ownHost reports whether a message is about what each host keeps for
// itself: sessions and their tasks (in memory, never replicated), which
// its calls always find here.
func ownHost(m *schema.Message) bool {
	switch m.Class.Name {
	case "session", "task", "event":
		return true
	}
	return false
}

// remote reports whether the routed call runs on another host.
func (s *Server) remote(r *request) bool {
	if ownHost(r.msg) || len(r.target.Hosts) == 0 || r.target.Host() == s.Cfg.HostRef || r.target.Host() == schema.NullRef {
		return false
	}
	if id, fwd := forwardedIdentity(r.ctx); fwd && !id.Route {
		return false // it was sent here to run: it runs here
	}
	return s.forwarder.Load() != nil
}

// toCoordinator reports whether a call made over a member's local socket
// goes whole to the coordinator, as xapi's do (xe on a member): not the
// session's own calls, nor event waits, nor tasks (sessions and their
// tasks are each host's own: an Async call keeps its task here, and its
// work goes where its route says), nor calls of a slave-local session,
// which reads the member's replica.
func (s *Server) toCoordinator(r *request) bool {
	if r.sess == nil || !r.sess.local || r.sess.replica || r.async || s.forwarder.Load() == nil {
		return false
	}
	if _, fwd := forwardedIdentity(r.ctx); fwd {
		return false
	}
	return !ownHost(r.msg) && s.notCoordinator() != nil
}

// forwardWhole sends a call to the coordinator (the pool's master).
func (s *Server) forwardWhole(c *Call, r *request) (any, error) {
	master := schema.NullRef
	for _, p := range c.Snapshot().All(dm.Pool.Class) {
		master = p.String(dm.Pool.Master)
	}
	if master == schema.NullRef || master == "" {
		return nil, s.notCoordinator()
	}
	fr := *r
	fr.target.Hosts = []string{master}
	fr.whole = true
	return s.forward(c, &fr)
}

// forward runs a routed call on its host and returns its canonical
// result.
func (s *Server) forward(c *Call, r *request) (any, error) {
	host := r.target.Host()
	if !hostLive(c.Snapshot(), host) {
		return nil, xerr.New(xerr.HostOffline, host)
	}
	body, err := s.encodeCall(r)
	if err != nil {
		return nil, err
	}
	id := Identity{Session: r.sessRef}
	if sess := c.Session; sess != nil {
		id = sess.identity()
	}
	id.Route = r.whole
	ctx := c.Ctx
	if t := c.ProgressTask(); t != nil {
		ctx = WithProgress(ctx, t.Progress) // the host sends it back (progress.go)
	}
	reply, err := (*s.forwarder.Load()).Forward(ctx, host, body, id)
	if err != nil {
		return nil, err
	}
	return s.decodeResult(r.msg.Result, reply)
}

// encodeCall writes a call as a JSON-RPC 2.0 request.
func (s *Server) encodeCall(r *request) ([]byte, error) {
	params := make([]any, 0, len(r.args)+1)
	if r.first == 1 {
		params = append(params, r.sessRef)
	}
	for i, a := range r.args {
		params = append(params, s.wireResult(r.msg.Params[i+r.first].Type, a))
	}
	method, err := json.Marshal(r.msg.Wire)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.WriteString(`{"jsonrpc":"2.0","id":1,"method":`)
	buf.Write(method)
	buf.WriteString(`,"params":`)
	e := wire.NewJSONEncoder(&buf)
	wire.Encode(e, params)
	if err := e.Flush(); err != nil {
		return nil, err
	}
	buf.WriteString(`}`)
	return buf.Bytes(), nil
}

// jsonReply is a JSON-RPC 2.0 reply as toolstackd writes it.
type jsonReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string   `json:"message"`
		Data    []string `json:"data"`
	} `json:"error"`
}

// decodeResult turns a host's JSON-RPC reply into a canonical result of
// type t, or its XenAPI error. The result is read exactly as a call's
// parameter of that type would be.
func (s *Server) decodeResult(t *schema.Type, body []byte) (any, error) {
	var rep jsonReply
	if err := json.Unmarshal(body, &rep); err != nil {
		return nil, xerr.New(xerr.InternalError, "a forwarded call's reply: "+err.Error())
	}
	if rep.Error != nil {
		return nil, xerr.New(rep.Error.Message, rep.Error.Data...)
	}
	if t == nil || t.Kind == schema.KVoid {
		return nil, nil
	}
	var call bytes.Buffer
	call.WriteString(`{"jsonrpc":"2.0","id":1,"method":"r","params":[`)
	call.Write(rep.Result)
	call.WriteString(`]}`)
	req, err := wire.DecodeJSONRequest(call.Bytes())
	if err != nil || len(req.Params) != 1 {
		return nil, xerr.New(xerr.InternalError, fmt.Sprintf("a forwarded call's result: %v", err))
	}
	return decodeValue(t, req.Params[0], "result")
}

// ServeForwarded answers a call another host forwarded here, to run as
// id: a JSON-RPC request, as on /jsonrpc. The caller (the pool layer) has
// checked that the request comes from a host of the pool.
func (s *Server) ServeForwarded(w http.ResponseWriter, r *http.Request, id Identity) {
	ctx := context.WithValue(originContext(r), forwardedKey{}, id)
	s.serveJSON(w, r.WithContext(ctx))
}

// forwardedSession is the session a forwarded call runs with: the
// caller's on the coordinator, known here only for this call.
func forwardedSession(ctx context.Context, id Identity) *Session {
	sess := &Session{Ref: id.Session, User: id.User, Originator: id.Originator, Roles: id.Roles,
		LocalSuperuser: id.Superuser, Subject: schema.NullRef, remote: true}
	sess.ctx, sess.cancel = context.WithCancel(ctx)
	sess.touch()
	return sess
}

// hostLive reports whether the database believes a host live: its
// metrics say so (a host without metrics is given the benefit of the
// doubt: the forwarding itself will tell).
func hostLive(snap db.Reader, host string) bool {
	h, ok := snap.Get(dm.Host.Class, host)
	if !ok {
		return true
	}
	live, known := forwarding.MetricsLive(snap, h)
	return live || !known
}
