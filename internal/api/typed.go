package api

import "context"

// Typed handlers and calls.
//
// The generator gives every explicit message an argument struct in
// package datamodel (VM.clone: datamodel.VMCloneArgs{VM, NewName}) whose
// methods move it to and from the canonical arguments the pipeline
// carries, and a result type (datamodel.VMRef; datamodel.Void for none;
// any where the result holds records). A module binds its handler with
//
//	api.Register(srv, func(c *api.Call, a dm.VMCloneArgs) (dm.VMRef, error) { ... })
//
// which names the message through the argument type, so a handler can
// only be bound to a message that exists and with the right types; and
// runs a message from inside the daemon, through the whole pipeline as
// the caller's session, with
//
//	ref, err := (&dm.VDICloneArgs{VDI: vdi}).Call(ctx, c.Caller())

// TypedArgs is what the generated argument structs implement; R is the
// message's result type.
type TypedArgs[R any] interface {
	Message() string
	FromArgs(args []any)
	Result(r R) any
}

// Register binds a typed handler to the message its argument type names.
func Register[A any, R any, PA interface {
	*A
	TypedArgs[R]
}](s *Server, h func(c *Call, a A) (R, error)) {
	s.handle(PA(new(A)).Message(), func(c *Call) (any, error) {
		var a A
		PA(&a).FromArgs(c.Args)
		r, err := h(c, a)
		if err != nil {
			return nil, err
		}
		return PA(&a).Result(r), nil
	})
}

// Caller runs messages from inside the daemon as a session: the
// datamodel.Invoker the generated Call methods take.
type Caller struct {
	s       *Server
	session string
}

// As returns a Caller acting as sess.
func (s *Server) As(sess *Session) Caller {
	c := Caller{s: s}
	if sess != nil {
		c.session = sess.Ref
	}
	return c
}

// Caller returns a Caller acting as this call's session: work a call
// hands on (VM.clone cloning its disks) is checked against the same
// roles as the call itself.
func (c *Call) Caller() Caller { return c.Server.As(c.Session) }

// InvokeArgs runs a message through the pipeline; args are canonical,
// without the session.
func (c Caller) InvokeArgs(ctx context.Context, method string, args []any) (any, error) {
	v, _, err := c.s.invoke(ctx, c.session, method, args)
	return v, err
}

// refsAs converts refs to their typed form.
func refsAs[T ~string](refs []string) []T {
	out := make([]T, len(refs))
	for i, r := range refs {
		out[i] = T(r)
	}
	return out
}
