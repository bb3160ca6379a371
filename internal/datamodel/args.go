package datamodel

import "context"

// Void is the result of a message that returns nothing.
type Void struct{}

// Invoker runs a message from inside the daemon: the generated argument
// structs' Call methods go through it (api.Caller is the one the daemon
// uses). args are canonical, without the session.
type Invoker interface {
	InvokeArgs(ctx context.Context, method string, args []any) (any, error)
}
