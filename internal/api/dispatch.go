package api

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"toolstackd/internal/api/wire"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Origin says where a call came from.
type Origin struct {
	// Local is true for calls over the local Unix socket, which run as the
	// local superuser without a password, as xapi's do.
	Local  bool
	Remote string // the peer address, for logs
}

type originKey struct{}

// WithOrigin attaches an origin to a context (the HTTP layer does this
// per connection).
func WithOrigin(ctx context.Context, o Origin) context.Context {
	return context.WithValue(ctx, originKey{}, o)
}

func originOf(ctx context.Context) Origin {
	o, _ := ctx.Value(originKey{}).(Origin)
	return o
}

// Unwrapped marks a result that goes on the wire without the
// Status/Value wrapping (system.listMethods).
type Unwrapped struct{ V any }

// void is the result of calls that return nothing.
type void struct{}

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
	name, async := strings.CutPrefix(method, "Async.")
	m := s.Model.Message(name)
	if m == nil {
		// Class names are matched without regard to case, as xapi does.
		if cls, msg, ok := strings.Cut(name, "."); ok {
			if c := s.Model.ClassFold(cls); c != nil {
				m = s.Model.Message(c.Name + "." + msg)
			}
		}
	}
	if m == nil || (async && !m.Async) {
		return nil, xerr.New(xerr.MessageMethodUnknown, method)
	}
	required := 0
	for _, p := range m.Params {
		if p.Required {
			required++
		}
	}
	if len(params) < required || len(params) > len(m.Params) {
		return nil, xerr.New(xerr.MessageParameterCountMismatch, method, strconv.Itoa(len(m.Params)), strconv.Itoa(len(params)))
	}
	c := &Call{Ctx: ctx, Server: s, Msg: m}
	first := 0
	if m.TakesSession {
		ref, _ := params[0].(string)
		sess := s.sessions.get(ref)
		if sess == nil {
			return nil, xerr.New(xerr.SessionInvalid, ref)
		}
		sess.touch()
		if err := checkCall(sess, m); err != nil {
			return nil, err
		}
		c.Session = sess
		first = 1
	}
	c.Args = make([]any, len(m.Params)-first)
	for i := first; i < len(m.Params); i++ {
		if i >= len(params) {
			continue // optional and omitted
		}
		v, err := decodeValue(m.Params[i].Type, params[i], m.Params[i].Name)
		if err != nil {
			return nil, err
		}
		c.Args[i-first] = v
	}
	if err := s.checkArgs(m, first, c.Args); err != nil {
		return nil, err
	}
	h := s.handlers[m.Wire]
	if h == nil {
		if !m.Implicit && !fieldAccessor(m) {
			return nil, xerr.New(xerr.NotImplemented, m.Wire)
		}
		h = s.implicit
	}
	if async {
		ref, err := s.startTask(c, h)
		if err != nil {
			return nil, err
		}
		return ref, nil
	}
	v, err := s.run(c, h)
	if err != nil {
		return nil, err
	}
	return s.wireResult(m.Result, v), nil
}

// accessorArity is the parameter count (with session and self) of each
// field accessor form.
var accessorArity = []struct {
	prefix string
	n      int
}{{"get_", 2}, {"set_", 3}, {"add_to_", 4}, {"remove_from_", 3}, {"add_", 3}, {"remove_", 3}}

// fieldAccessor reports whether an explicit message has exactly the shape
// of an implicit field accessor (VM.add_to_other_config, ...): until a
// handler adds its checks, it behaves as the implicit one.
func fieldAccessor(m *schema.Message) bool {
	for _, a := range accessorArity {
		name, ok := strings.CutPrefix(m.Name, a.prefix)
		if !ok {
			continue
		}
		if f := m.Class.Field(name); f != nil && !f.Internal && len(m.Params) == a.n &&
			m.Params[1].Type.Kind == schema.KRef && m.Params[1].Type.Class == m.Class {
			return true
		}
	}
	return false
}

// Invoke runs a call from inside toolstackd (the xe CLI server, HTTP
// handlers) as the given session: args are canonical values without the
// session, and the result comes back canonical (rows as *db.Row, ref ->
// record maps as []*db.Row) with its type. Roles and argument limits are
// checked as for any client.
func (s *Server) Invoke(ctx context.Context, session, method string, args ...any) (any, *schema.Type, error) {
	name, async := strings.CutPrefix(method, "Async.")
	m := s.Model.Message(name)
	if m == nil || (async && !m.Async) {
		return nil, nil, xerr.New(xerr.MessageMethodUnknown, method)
	}
	c := &Call{Ctx: ctx, Server: s, Msg: m}
	n := len(m.Params)
	if m.TakesSession {
		sess := s.sessions.get(session)
		if sess == nil {
			return nil, nil, xerr.New(xerr.SessionInvalid, session)
		}
		sess.touch()
		if err := checkCall(sess, m); err != nil {
			return nil, nil, err
		}
		c.Session = sess
		n--
	}
	if len(args) > n {
		return nil, nil, xerr.New(xerr.MessageParameterCountMismatch, method, strconv.Itoa(len(m.Params)), strconv.Itoa(len(args)+len(m.Params)-n))
	}
	c.Args = make([]any, n)
	copy(c.Args, args)
	if err := s.checkArgs(m, len(m.Params)-n, c.Args); err != nil {
		return nil, nil, err
	}
	h := s.handlers[m.Wire]
	if h == nil {
		if !m.Implicit && !fieldAccessor(m) {
			return nil, nil, xerr.New(xerr.NotImplemented, m.Wire)
		}
		h = s.implicit
	}
	if async {
		ref, err := s.startTask(c, h)
		return ref, schema.String, err
	}
	v, err := s.run(c, h)
	return v, m.Result, err
}

// SessionFor returns the live session with a ref, or nil.
func (s *Server) SessionFor(ref string) *Session { return s.sessions.get(ref) }

// run calls a handler, turning a panic into INTERNAL_ERROR so that one bad
// call never takes the server down.
func (s *Server) run(c *Call, h Handler) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.Log.Error("handler panic", "method", c.Msg.Wire, "panic", r)
			v, err = nil, xerr.New(xerr.InternalError, fmt.Sprintf("%s: %v", c.Msg.Wire, r))
		}
	}()
	v, err = h(c)
	if err != nil {
		return nil, xerr.From(err)
	}
	return v, nil
}

// wireResult wraps a handler's canonical result for the encoders.
func (s *Server) wireResult(t *schema.Type, v any) any {
	if t == nil {
		t = schema.Void
	}
	switch x := v.(type) {
	case nil, void:
		if t.Kind == schema.KVoid {
			return ""
		}
	case wire.Marshaler:
		return x
	}
	return typed{t: t, v: v, snap: s.DB.Snapshot(), rows: s.rows}
}

func (s *Server) methodList() []string {
	out := make([]string, 0, 2*len(s.Model.Messages)+1)
	for _, m := range s.Model.Messages {
		out = append(out, m.Wire)
	}
	for _, m := range s.Model.Messages {
		if m.Async {
			out = append(out, "Async."+m.Wire)
		}
	}
	return append(out, "system.listMethods")
}

// Snapshot is a shorthand for handlers.
func (c *Call) Snapshot() *db.Snapshot { return c.Server.DB.Snapshot() }

// Ref returns argument i as a ref that must name a row of class cls.
func (c *Call) Row(i int, cls *schema.Class) (*db.Row, error) {
	ref, _ := c.Args[i].(string)
	row, ok := c.Snapshot().Get(cls, ref)
	if !ok {
		return nil, xerr.New(xerr.HandleInvalid, cls.Name, ref)
	}
	return row, nil
}

// String returns argument i as a string ("" when omitted).
func (c *Call) String(i int) string { s, _ := c.Args[i].(string); return s }

// Update runs a database transaction for a handler.
func (c *Call) Update(fn func(tx *db.Tx) error) error {
	_, err := c.Server.DB.Update(fn)
	return err
}
