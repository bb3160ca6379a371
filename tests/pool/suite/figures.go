package suite

import (
	"context"
	"slices"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
)

// StartCycles is the median time of n VM.start_on + VM.hard_shutdown
// cycles of a new diskless VM on host.
func StartCycles(t *testing.T, ctx context.Context, c *pooltest.Client, addr, s, host string, n int) time.Duration {
	t.Helper()
	vm, err := c.CallString(ctx, addr, "VM.create", s, testdaemon.VMRecord("cycles"))
	if err != nil {
		t.Fatal(err)
	}
	var times []time.Duration
	for range n {
		start := time.Now()
		if _, err := c.Call(ctx, addr, "VM.start_on", s, vm, host, false, false); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Call(ctx, addr, "VM.hard_shutdown", s, vm); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	return times[len(times)/2]
}
