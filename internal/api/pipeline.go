package api

import (
	"context"
	"strconv"
	"strings"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// The call pipeline.
//
// Every call, from a client or from inside the daemon, goes through the
// same stages, each a small method on *Server that either passes the
// request on or stops it with a XenAPI error:
//
//	decode        the message and its arity (MESSAGE_METHOD_UNKNOWN,
//	              MESSAGE_PARAMETER_COUNT_MISMATCH)
//	authenticate  the session (SESSION_INVALID)
//	authorize     the session's roles against the message's
//	              (RBAC_PERMISSION_DENIED)
//	arguments     each argument to its canonical type (FIELD_TYPE_ERROR,
//	              INVALID_VALUE) and within the size limits
//	bind          the handler: explicit, or the implicit database one
//	              (NOT_IMPLEMENTED)
//	route         where the call runs and what it marks (forwarding)
//	admit         the operation marks in current_operations
//	run           the handler, at once or as a task
//
// Arguments are converted only once the caller is known to be allowed to
// make the call, so an unauthenticated client never gets its values
// parsed. The two entries differ only in the first stages: Dispatch
// takes a wire method name and neutral values, Invoke (and the typed
// Do) canonical values from inside the daemon; from authenticate on, the
// stages are the same.

// request is one call on its way through the pipeline.
type request struct {
	ctx     context.Context
	method  string // as the caller named it
	msg     *schema.Message
	async   bool
	sessRef string
	sess    *Session
	first   int   // 1 when the message takes a session (args exclude it)
	args    []any // canonical values, without the session
	handler Handler
	target  forwarding.Target
	// whole: sent whole to the coordinator, to be routed there
	// (forwardWhole).
	whole bool
}

// underscored finds a message named with "_" for its ".", as xapi also
// answers (event_from, VM_get_all, VM_guest_metrics_get_record: the
// XenServer SDK's samples use them): the first split whose left side
// names a class (without regard to case) and whose right side one of its
// messages.
func (s *Server) underscored(name string) *schema.Message {
	for i := 0; i < len(name); i++ {
		if name[i] != '_' {
			continue
		}
		if c := s.Model.ClassFold(name[:i]); c != nil {
			if m := s.Model.Message(c.Name + "." + name[i+1:]); m != nil {
				return m
			}
		}
	}
	return nil
}

// lookup finds the message a method name names: Async. variants, and
// class names matched without regard to case as xapi does.
func (s *Server) lookup(r *request) error {
	name, async := strings.CutPrefix(r.method, "Async.")
	m := s.Model.Message(name)
	if m == nil {
		if cls, msg, ok := strings.Cut(name, "."); ok {
			if c := s.Model.ClassFold(cls); c != nil {
				m = s.Model.Message(c.Name + "." + msg)
			}
		}
	}
	if m == nil && !strings.Contains(name, ".") {
		m = s.underscored(name)
	}
	if m == nil || (async && !m.Async) {
		return xerr.New(xerr.MessageMethodUnknown, r.method)
	}
	r.msg, r.async = m, async
	if m.TakesSession {
		r.first = 1
	}
	return nil
}

// decodeWire is the decode stage for a wire call: the message, the
// number of parameters, and the session reference.
func (s *Server) decodeWire(r *request, params []any) error {
	if err := s.lookup(r); err != nil {
		return err
	}
	m := r.msg
	required := 0
	for _, p := range m.Params {
		if p.Required {
			required++
		}
	}
	if len(params) < required || len(params) > len(m.Params) {
		return xerr.New(xerr.MessageParameterCountMismatch, r.method, strconv.Itoa(len(m.Params)), strconv.Itoa(len(params)))
	}
	if m.TakesSession {
		r.sessRef, _ = params[0].(string)
	}
	return nil
}

// decodeInternal is the decode stage for a call from inside the daemon:
// args are canonical already and exclude the session.
func (s *Server) decodeInternal(r *request, args []any) error {
	if err := s.lookup(r); err != nil {
		return err
	}
	n := len(r.msg.Params) - r.first
	if len(args) > n {
		return xerr.New(xerr.MessageParameterCountMismatch, r.method, strconv.Itoa(len(r.msg.Params)), strconv.Itoa(len(args)+r.first))
	}
	r.args = make([]any, n)
	copy(r.args, args)
	return nil
}

// authenticate finds the call's session.
func (s *Server) authenticate(r *request) error {
	if !r.msg.TakesSession {
		return nil
	}
	sess := s.sessions.get(r.sessRef)
	if sess == nil {
		// A call another host forwarded runs as its caller there.
		if id, ok := forwardedIdentity(r.ctx); ok && id.Session == r.sessRef {
			r.sess = forwardedSession(r.ctx, id)
			return nil
		}
		return xerr.New(xerr.SessionInvalid, r.sessRef)
	}
	if !sess.local && !sess.replica && s.notCoordinator() != nil {
		// Opened while this host coordinated the pool: its clients
		// belong to the new coordinator now (they log in again and are
		// sent there).
		s.revokeSessions(func(x *Session) bool { return x == sess })
		return xerr.New(xerr.SessionInvalid, r.sessRef)
	}
	if sess.replica && !sess.local && !s.stillHeld(sess) {
		// Revoked (on the coordinator, replicated here) since it opened.
		s.revokeSessions(func(x *Session) bool { return x == sess })
		return xerr.New(xerr.SessionInvalid, r.sessRef)
	}
	sess.touch()
	r.sess = sess
	return nil
}

// authorize checks the session's roles (see rbac.go).
func (s *Server) authorize(r *request) error {
	if r.sess == nil {
		return nil
	}
	return checkCall(r.sess, r.msg)
}

// convertArgs turns a wire call's parameters into canonical values.
func (s *Server) convertArgs(r *request, params []any) error {
	m := r.msg
	r.args = make([]any, len(m.Params)-r.first)
	for i := r.first; i < len(m.Params) && i < len(params); i++ {
		v, err := decodeValue(m.Params[i].Type, params[i], m.Params[i].Name)
		if err != nil {
			return err
		}
		r.args[i-r.first] = v
	}
	return nil
}

// limitArgs holds every argument to the size limits (see limits.go).
func (s *Server) limitArgs(r *request) error {
	return s.checkArgs(r.msg, r.first, r.args)
}

// bind finds the handler: the registered one, else the implicit database
// handler for implicit messages and plain field accessors.
func (s *Server) bind(r *request) error {
	h := s.handlers[r.msg.Wire]
	if h == nil {
		if !r.msg.Implicit && !fieldAccessor(r.msg) {
			return xerr.New(xerr.NotImplemented, r.msg.Wire)
		}
		h = s.implicitH
	}
	r.handler = h
	return nil
}

// route works out where the call runs and what it marks. A host alone
// runs everything here; in a pool, admitAndRun forwards a call routed to
// another host (see forward.go).
func (s *Server) route(r *request) error {
	t, err := forwarding.Resolve(r.msg, r.args, s.DB.Snapshot(), s.Cfg.HostRef)
	if err != nil {
		return err
	}
	r.target = t
	return nil
}

// execute is the run stage: the call at once, or as a task whose ref is
// the reply. The call's marks are taken in the task, so that a refusal
// is the task's outcome, as xapi reports it.
func (s *Server) execute(r *request) (any, error) {
	c := &Call{Ctx: r.ctx, Server: s, Session: r.sess, Msg: r.msg, Args: r.args}
	c.Ctx, c.relay = takeProgress(r.ctx)
	if s.toCoordinator(r) {
		return s.forwardWhole(c, r)
	}
	if r.async {
		ref, err := s.startTask(c, *r)
		if err != nil {
			return nil, err
		}
		return ref, nil
	}
	return s.admitAndRun(c, r)
}

// admitAndRun takes the call's marks, runs the handler (here, or on the
// host the call is routed to) and drops them. A call forwarded here runs
// under the marks the coordinator took.
func (s *Server) admitAndRun(c *Call, r *request) (any, error) {
	if id, fwd := forwardedIdentity(r.ctx); !fwd || id.Route {
		for _, g := range s.guards[r.msg.Wire] {
			if err := g(c); err != nil {
				return nil, err
			}
		}
		release, err := s.admit(c, r.target.Marks)
		if err != nil {
			return nil, err
		}
		defer release()
		if r.target.Placed != "" && c.Snapshot().Count(dm.Host.Class) > 1 {
			defer s.schedule(r.target.Placed, r.target.Host())()
		}
	}
	if s.remote(r) {
		return s.forward(c, r)
	}
	return s.run(c, r.handler)
}

// prepare runs the stages shared by both entries, from authenticate to
// route; convert, when given, turns wire parameters into arguments.
func (s *Server) prepare(r *request, convert func(*request) error) error {
	if err := s.authenticate(r); err != nil {
		return err
	}
	if err := s.authorize(r); err != nil {
		return err
	}
	if convert != nil {
		if err := convert(r); err != nil {
			return err
		}
	}
	if err := s.limitArgs(r); err != nil {
		return err
	}
	if err := s.bind(r); err != nil {
		return err
	}
	return s.route(r)
}

// Dispatch runs one call given its neutral wire parameters and returns a
// value ready for a wire encoder (or Unwrapped, or nil for void), or a
// *xerr.Error.
func (s *Server) Dispatch(ctx context.Context, method string, params []any) (any, error) {
	switch method {
	case "system.listMethods":
		return Unwrapped{s.methodList()}, nil
	case "system.methodHelp", "system.methodSignature":
		return Unwrapped{""}, nil
	}
	r := &request{ctx: ctx, method: method}
	start := time.Now()
	v, err := s.dispatch(r, params)
	s.observe(r, start, err)
	return v, err
}

// dispatch runs a wire call through the stages.
func (s *Server) dispatch(r *request, params []any) (any, error) {
	if err := s.decodeWire(r, params); err != nil {
		return nil, err
	}
	if err := s.prepare(r, func(r *request) error { return s.convertArgs(r, params) }); err != nil {
		return nil, err
	}
	v, err := s.execute(r)
	if err != nil {
		return nil, err
	}
	if r.async {
		return v, nil
	}
	return s.wireResult(r.msg.Result, v), nil
}

// Invoke runs a call from inside toolstackd (the xe CLI server, HTTP
// handlers) as the given session: args are canonical values without the
// session, and the result comes back canonical (rows as *db.Row, ref ->
// record maps as []*db.Row) with its type. Roles and argument limits are
// checked as for any client. Code that knows the message at compile time
// uses Do with the generated argument struct instead.
func (s *Server) Invoke(ctx context.Context, session, method string, args ...any) (any, *schema.Type, error) {
	return s.invoke(ctx, session, method, args)
}

// invoke is Invoke with the arguments as a slice. A call made from
// inside another (VM.clone cloning its disks) gets no task of its own:
// its context carries the outer call's cancellation, and its marks are
// keyed afresh so that they never collide with the outer call's.
func (s *Server) invoke(ctx context.Context, session, method string, args []any) (any, *schema.Type, error) {
	r := &request{ctx: ctx, method: method, sessRef: session}
	if err := s.decodeInternal(r, args); err != nil {
		return nil, nil, err
	}
	if err := s.prepare(r, nil); err != nil {
		return nil, nil, err
	}
	v, err := s.execute(r)
	if r.async {
		return v, schema.String, err
	}
	return v, r.msg.Result, err
}
