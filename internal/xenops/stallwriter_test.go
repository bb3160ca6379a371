package xenops

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// A write the other end does not take within d fails as a stall; an
// interruption (backend.InterruptIO) is not reported as one, and ends
// writes for good; a cancelled context ends them too.
func TestStallWriter(t *testing.T) {
	a, b := net.Pipe() // unbuffered: a write waits for a read
	defer a.Close()
	defer b.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &stallWriter{ctx: ctx, w: a, c: a, d: 100 * time.Millisecond}

	go func() { buf := make([]byte, 4); _, _ = b.Read(buf) }()
	if n, err := w.Write([]byte("take")); err != nil || n != 4 {
		t.Fatalf("a write the other end takes: %d %v", n, err)
	}
	start := time.Now()
	if _, err := w.Write([]byte("nobody reads this")); !errors.Is(err, errSendStalled) {
		t.Fatalf("a write nobody takes: %v, want the stall", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the stall was seen after %v, want about 100ms", d)
	}

	w2 := &stallWriter{ctx: ctx, w: a, c: a, d: time.Minute}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = w2.SetWriteDeadline(time.Unix(1, 0))
	}()
	if _, err := w2.Write([]byte("blocked")); errors.Is(err, errSendStalled) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an interrupted write: %v, want the deadline, not a stall", err)
	}
	if _, err := w2.Write([]byte("again")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write after the interruption: %v", err)
	}

	cancel()
	w3 := &stallWriter{ctx: ctx, w: a, c: a, d: time.Minute}
	if _, err := w3.Write([]byte("late")); !errors.Is(err, context.Canceled) {
		t.Fatalf("a write after the task ended: %v", err)
	}
}
