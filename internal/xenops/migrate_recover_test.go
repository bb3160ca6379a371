package xenops

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"toolstackd/internal/xenops/backend"
)

// The destination's guard on the memory stream: bytes pass as they come,
// however slowly; a wait longer than the allowance with no byte is
// errStalled; an interruption from outside (backend.InterruptIO, as a
// backend does when it gives up) ends every later read, and is not taken
// for a stall.
func TestStallReader(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	s := &stallReader{r: a, c: a, d: 150 * time.Millisecond}
	go func() {
		// 180 ms in all, slower overall than d, but never near d without
		// a byte: 15 ms apart, a tenth of it (a busy machine may sleep
		// late).
		for _, p := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
			time.Sleep(15 * time.Millisecond)
			_, _ = io.WriteString(b, p)
		}
	}()
	buf := make([]byte, 12)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "abcdefghijkl" {
		t.Fatalf("a slow stream: %q %v", buf, err)
	}
	start := time.Now()
	if _, err := s.Read(buf); !errors.Is(err, errStalled) {
		t.Fatalf("a stalled stream: %v", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the stall was seen after %v", d)
	}

	// A storage migration's memory comes once its disks are mirrored:
	// the first byte may be long in coming, the next ones may not.
	e, f := net.Pipe()
	defer e.Close()
	defer f.Close()
	s = &stallReader{r: e, c: e, d: 100 * time.Millisecond, waitFirst: true}
	go func() {
		time.Sleep(400 * time.Millisecond)
		_, _ = io.WriteString(f, "x")
	}()
	if _, err := s.Read(buf); err != nil {
		t.Fatalf("a late first byte: %v", err)
	}
	if _, err := s.Read(buf); !errors.Is(err, errStalled) {
		t.Fatalf("a stall after the first byte: %v", err)
	}

	c, d := net.Pipe()
	defer c.Close()
	defer d.Close()
	s = &stallReader{r: c, c: c, d: time.Hour}
	done := make(chan error, 1)
	go func() {
		_, err := s.Read(buf)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if !backend.InterruptIO(s) {
		t.Fatal("the guard cannot be interrupted")
	}
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errStalled) {
			t.Fatalf("an interrupted read: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("InterruptIO did not end the read")
	}
	if _, err := s.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read after the interruption: %v", err)
	}
}

// host.evacuate's progress: each move an equal share, a move in flight
// by its own progress, never going back.
func TestEvacProgress(t *testing.T) {
	var got []float64
	e := newEvacProgress(4, func(v float64) { got = append(got, v) })
	e.set("a", 0.5)
	e.set("b", 0.5)
	e.set("a", 0.25) // late, older report: ignored
	e.set("a", 1)
	e.set("c", 1)
	e.set("d", 1)
	e.set("b", 1)
	want := []float64{0.125, 0.25, 0.375, 0.625, 0.875, 1}
	if len(got) != len(want) {
		t.Fatalf("reports %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("reports %v, want %v", got, want)
		}
	}
}
