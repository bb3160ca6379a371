package gctune

import (
	"context"
	"runtime/debug"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		live, floor uint64
		want        int
	}{
		{16 * mib, 64 * mib, 300},   // grows to 64 MiB
		{8 * mib, 64 * mib, 700},    // likewise
		{32 * mib, 64 * mib, 100},   // half the floor: the default
		{1024 * mib, 64 * mib, 100}, // a large host: the default
		{1, 64 * mib, 5000},         // bounded
		{0, 64 * mib, 5000},         // no collection yet: counted as 1 MiB, bounded
		{31 * mib, 64 * mib, 106},
	}
	for _, c := range cases {
		if got := Percent(c.live, c.floor); got != c.want {
			t.Errorf("Percent(%d MiB, %d MiB) = %d, want %d", c.live/mib, c.floor/mib, got, c.want)
		}
	}
}

// Run raises GOGC on a small heap at once and puts back 100 when it
// returns.
func TestRun(t *testing.T) {
	t.Setenv("GOGC", "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Run(ctx, 1<<40); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p := debug.SetGCPercent(-1)
		debug.SetGCPercent(p)
		if p > 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GOGC is %d after 5s", p)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	if p := debug.SetGCPercent(100); p != 100 {
		t.Errorf("GOGC is %d after Run returned", p)
	}
}

// A GOGC in the environment is the operator's: Run leaves it.
func TestRunRespectsEnvironment(t *testing.T) {
	t.Setenv("GOGC", "100")
	done := make(chan struct{})
	go func() { Run(context.Background(), 1<<40); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run ran with GOGC set")
	}
}
