package api

import (
	"context"
	"time"
)

// Progress that crosses hosts.
//
// A call forwarded to the host that must run it has no task there: the
// caller's task stays on the coordinator (forward.go). Its progress
// still reaches that task: the coordinator asks for it when it forwards
// the call, and the pool layer carries it back while the call runs (see
// internal/pool, forward.go). On the running host the call's work
// reports as to a task of its own (Call.ProgressTask); a relay coalesces
// those reports to at most one every relayInterval and hands the newest
// to the caller's side.
//
// The same carries the progress of a call made from inside another to
// the outer call: host.evacuate follows each VM.pool_migrate it makes,
// on this host or on the VM's host, by making it with WithProgress.

type progressKey struct{}

// relayInterval is the least time between two progress reports a relay
// passes on: a few a second, whatever the work reports.
const relayInterval = 250 * time.Millisecond

// WithProgress returns a context whose next call through the pipeline
// (Invoke, a typed Call, a forwarded call served here) reports its
// progress (0 to 1) to f, coalesced, from another goroutine. Calls that
// call makes in turn do not inherit f.
func WithProgress(ctx context.Context, f func(float64)) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// ProgressSink is the function WithProgress put in ctx, or nil.
func ProgressSink(ctx context.Context) func(float64) {
	if ctx == nil {
		return nil
	}
	f, _ := ctx.Value(progressKey{}).(func(float64))
	return f
}

// takeProgress gives a call made with ctx the relay of ctx's progress
// sink, if any, and the context the call runs in, without the sink.
func takeProgress(ctx context.Context) (context.Context, *Task) {
	f := ProgressSink(ctx)
	if f == nil {
		return ctx, nil
	}
	ctx = context.WithValue(ctx, progressKey{}, (func(float64))(nil))
	return ctx, &Task{ctx: ctx, relay: f}
}

// ProgressTask is where the call's work reports its progress: the task
// running it, or the relay to a caller that follows it from elsewhere
// (the coordinator's task of a forwarded call, an outer call); nil when
// nobody follows it. Its Ref is empty unless it is the call's own task.
func (c *Call) ProgressTask() *Task {
	if c.task != nil {
		return c.task
	}
	return c.relay
}
