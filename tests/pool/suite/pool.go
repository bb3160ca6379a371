package suite

import (
	"context"
	"os"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
)

// Long says whether to run the full number of fault rounds.
func Long() bool { return os.Getenv("TOOLSTACKD_LONG") == "1" }

// Rounds is n in the long mode, ci otherwise.
func Rounds(ci, n int) int {
	if Long() {
		return n
	}
	return ci
}

// Ctx is the context a pool test's calls and waits run under. It is no
// figure of how long the test should take: it ends a grace period before
// the test binary's own deadline (go test -timeout), so that a test that
// is stuck fails with its own error and its daemons are stopped by its
// cleanups, instead of the whole binary panicking with them still
// running. How long each step may take is bounded where the step is
// (a call's timeout, WaitUntil's bound), at least ten times what the step
// takes on a quiet machine; how many fault rounds a test runs is bounded
// by its own budget (tests/pool/core).
func Ctx(t *testing.T) context.Context {
	d, ok := t.Deadline()
	if !ok {
		return context.Background()
	}
	// Not t.Context(): that ends before cleanups run, and some use it.
	ctx, cancel := context.WithDeadline(context.Background(), d.Add(-ctxGrace))
	t.Cleanup(cancel)
	return ctx
}

// ctxGrace is what Ctx leaves before the binary's deadline for the test
// to fail and its cleanups to stop daemons and print their logs.
const ctxGrace = 30 * time.Second

// StartPool runs three hosts behind fault proxies and joins them, or skips
// the test when the daemon has no pool support yet.
func StartPool(t *testing.T, ctx context.Context) *pooltest.Pool {
	t.Helper()
	return StartPoolWith(t, ctx, pooltest.Options{Hosts: 3, Proxy: true})
}

// StartPoolWith is StartPool with the pool's options: the hosts join the
// first and are live on it.
func StartPoolWith(t *testing.T, ctx context.Context, o pooltest.Options) *pooltest.Pool {
	t.Helper()
	if !pooltest.DaemonHasFlag(t, "--advertise") {
		t.Skip("toolstackd has no --advertise flag: no pool support yet (issue 12)")
	}
	p := pooltest.Start(t, o)
	if err := p.JoinOne(ctx, 1); err != nil {
		switch pooltest.Code(err) {
		case "NOT_IMPLEMENTED", "MESSAGE_NOT_IMPLEMENTED":
			t.Skipf("pool.join is not implemented yet (issue 12): %v", err)
		}
		t.Fatalf("first join: %v", err)
	}
	for i := 2; i < p.Len(); i++ {
		if err := p.JoinOne(ctx, i); err != nil {
			t.Fatalf("join: %v", err)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, pooltest.LiveTimeout)
	defer cancel()
	if err := p.WaitLive(lctx, p.Len()); err != nil {
		t.Fatalf("joined hosts within %v: %v", pooltest.LiveTimeout, err)
	}
	return p
}
