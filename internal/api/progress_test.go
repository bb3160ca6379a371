package api

import (
	"context"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
)

// A call made with WithProgress reports to its caller through a relay:
// a burst of reports reaches the caller as a few (at most one every
// relayInterval, the newest last), the call's own context no longer
// carries the sink (a call it makes in turn is not followed), and a call
// made without one reports nowhere.
func TestProgressRelay(t *testing.T) {
	s, sess := stageServer(t)
	var inner func(float64)
	Register(s, func(c *Call, a dm.VMCloneArgs) (dm.VMRef, error) {
		if c.ProgressTask() == nil {
			return "OpaqueRef:unfollowed", nil
		}
		inner = ProgressSink(c.Ctx)
		for i := 1; i <= 1000; i++ {
			c.SetProgress(float64(i) / 1000)
		}
		time.Sleep(2 * relayInterval)
		return "OpaqueRef:new", nil
	})
	var mu sync.Mutex
	var got []float64
	ctx := WithProgress(context.Background(), func(v float64) {
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	})
	start := time.Now()
	ref, err := (&dm.VMCloneArgs{VM: "OpaqueRef:vm", NewName: "copy"}).Call(ctx, s.As(sess))
	if err != nil || ref != "OpaqueRef:new" {
		t.Fatalf("%v %q", err, ref)
	}
	if inner != nil {
		t.Error("the call's own context still carries its caller's sink")
	}
	mu.Lock()
	n, last := len(got), 0.0
	if n > 0 {
		last = got[n-1]
	}
	mu.Unlock()
	if most := int(time.Since(start)/relayInterval) + 2; n == 0 || n > most {
		t.Fatalf("%d reports reached the caller (at most %d)", n, most)
	}
	if last != 1 {
		t.Fatalf("the last report %v, want 1", last)
	}
	ref, err = (&dm.VMCloneArgs{VM: "OpaqueRef:vm", NewName: "copy"}).Call(context.Background(), s.As(sess))
	if err != nil || ref != "OpaqueRef:unfollowed" {
		t.Fatalf("a call nobody follows: %v %q", err, ref)
	}
}
