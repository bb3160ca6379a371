package api

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"toolstackd/internal/api/wire"
	dm "toolstackd/internal/datamodel"
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

// SessionFor returns the live session with a ref, or nil.
func (s *Server) SessionFor(ref string) *Session { return s.sessions.get(ref) }

// run calls a handler, turning a panic into INTERNAL_ERROR so that one bad
// call never takes the server down.
func (s *Server) run(c *Call, h Handler) (v any, err error) {
	defer func() {
		if r := recover(); r != nil {
			s.Log.Error("handler panic", append(c.logArgs(), "panic", r)...)
			v, err = nil, xerr.New(xerr.InternalError, fmt.Sprintf("%s: %v", c.Msg.Wire, r))
		}
	}()
	v, err = h(c)
	if err != nil {
		return nil, xerr.From(err)
	}
	return v, nil
}

// logArgs name a call in the log (internal/journal's fields): its wire
// name, its session's uuid and its task's. Never the session's ref: that
// is the bearer secret.
func (c *Call) logArgs() []any {
	args := []any{"call", c.Msg.Wire}
	if c.Session != nil && c.Session.UUID != "" {
		args = append(args, "session", c.Session.UUID)
	}
	if c.Task != "" {
		args = append(args, c.Server.uuidAttr("task", dm.Task.Class, c.Task))
	}
	return args
}

// uuidAttr names the object ref of class cls in the log by its uuid
// under key, or by its ref under key_ref once its record is gone.
func (s *Server) uuidAttr(key string, cls *schema.Class, ref string) slog.Attr {
	if row, ok := s.DB.Snapshot().Get(cls, ref); ok {
		return slog.String(key, row.UUID())
	}
	return slog.String(key+"_ref", ref)
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

// Row returns argument i as a ref that must name a row of class cls (for
// the implicit handlers, which serve every class).
func (c *Call) Row(i int, cls *schema.Class) (*db.Row, error) {
	ref, _ := c.Args[i].(string)
	return c.Lookup(cls, ref)
}

// Lookup returns the row of class cls a ref names, or HANDLE_INVALID
// [class, ref].
func (c *Call) Lookup(cls *schema.Class, ref string) (*db.Row, error) {
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

// Given reports whether the caller sent the optional parameter param (a
// typed argument struct holds the zero value for both "omitted" and
// "sent as zero"; a few messages default an omitted one otherwise).
func (c *Call) Given(param string) bool {
	first := 0
	if c.Msg.TakesSession {
		first = 1
	}
	for i, p := range c.Msg.Params[first:] {
		if p.Name == param {
			return i < len(c.Args) && c.Args[i] != nil
		}
	}
	return false
}
