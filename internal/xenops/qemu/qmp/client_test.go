package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/lineio"
)

// fakeQMP is a QMP server speaking just enough of the protocol: greeting,
// capabilities, a few commands, events on demand, and getfd.
type fakeQMP struct {
	t      *testing.T
	l      *net.UnixListener
	events chan string
	gotFD  chan int
}

func newFakeQMP(t *testing.T) (*fakeQMP, string) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeQMP{t: t, l: l, events: make(chan string, 10), gotFD: make(chan int, 1)}
	go f.serve()
	t.Cleanup(func() { l.Close() })
	return f, path
}

func (f *fakeQMP) serve() {
	c, err := f.l.AcceptUnix()
	if err != nil {
		return
	}
	defer c.Close()
	w := bufio.NewWriter(c)
	send := func(v any) {
		b, _ := json.Marshal(v)
		w.Write(append(b, '\n'))
		w.Flush()
	}
	send(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
	go func() {
		for ev := range f.events {
			b, _ := json.Marshal(map[string]any{"event": ev, "data": map[string]any{"guest": true, "reason": "guest-shutdown"},
				"timestamp": map[string]any{"seconds": 1, "microseconds": 2}})
			c.Write(append(b, '\n'))
		}
	}()
	buf := make([]byte, 4096)
	oob := make([]byte, 128)
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		if oobn > 0 {
			msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if fds, err := syscall.ParseUnixRights(&m); err == nil {
					f.gotFD <- fds[0]
				}
			}
		}
		for _, line := range splitLines(buf[:n]) {
			var cmd struct {
				Execute string
				ID      json.RawMessage
			}
			if json.Unmarshal(line, &cmd) != nil {
				continue
			}
			switch cmd.Execute {
			case "qmp_capabilities", "getfd":
				send(map[string]any{"return": map[string]any{}, "id": cmd.ID})
			case "query-status":
				send(map[string]any{"return": map[string]any{"status": "running", "running": true}, "id": cmd.ID})
			case "slow":
				go func(id json.RawMessage) {
					time.Sleep(200 * time.Millisecond)
					b, _ := json.Marshal(map[string]any{"return": map[string]any{}, "id": id})
					c.Write(append(b, '\n'))
				}(cmd.ID)
			case "quit":
				return
			default:
				send(map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "no " + cmd.Execute}, "id": cmd.ID})
			}
		}
	}
}

func splitLines(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != '\n' {
			i++
		}
		out = append(out, b[:i])
		if i < len(b) {
			i++
		}
		b = b[i:]
	}
	return out
}

func TestQMPClient(t *testing.T) {
	f, path := newFakeQMP(t)
	events := make(chan Event, 1)
	ctx := context.Background()
	q, err := Dial(ctx, path, func(ev Event) { events <- ev })
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var st struct{ Status string }
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("query-status: %v %+v", err, st)
	}
	var qe *Error
	if err := q.Execute(ctx, "bogus", nil, nil); !errors.As(err, &qe) || qe.Class != "CommandNotFound" {
		t.Fatalf("error reply: %v", err)
	}
	// Replies are matched by id, whatever order they come in.
	slow := make(chan error, 1)
	go func() { slow <- q.Execute(ctx, "slow", nil, nil) }()
	time.Sleep(20 * time.Millisecond)
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	// A context bounds the wait.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := q.Execute(cctx, "slow", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("timeout: %v", err)
	}
	// Events go to the callback.
	f.events <- "SHUTDOWN"
	select {
	case ev := <-events:
		var data struct {
			Guest  bool
			Reason string
		}
		json.Unmarshal(ev.Data, &data)
		if ev.Event != "SHUTDOWN" || !data.Guest || data.Reason != "guest-shutdown" {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no event")
	}
	// A file descriptor rides along with getfd.
	file, err := os.CreateTemp(t.TempDir(), "img")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if err := q.ExecuteFD(ctx, "getfd", map[string]any{"fdname": "x"}, int(file.Fd()), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case fd := <-f.gotFD:
		syscall.Close(fd)
	case <-time.After(2 * time.Second):
		t.Fatal("no file descriptor received")
	}
	// When QEMU goes, callers are told.
	q.Execute(ctx, "quit", nil, nil)
	select {
	case <-q.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("connection not closed")
	}
	if err := q.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestQMPBadGreeting(t *testing.T) {
	path := servePeer(t, func(c net.Conn) { c.Write([]byte("hello\n")) })
	if _, err := Dial(context.Background(), path, nil); err == nil {
		t.Fatal("a non-QMP peer was accepted")
	}
}

// servePeer serves one connection on a new Unix socket with fn, which
// stands for whatever is at the other end of a QMP socket; it returns
// the socket's path.
func servePeer(t *testing.T, fn func(net.Conn)) string {
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fn(c)
	}()
	return path
}

// TestQMPEndlessLine: a peer that never ends its greeting line is
// refused once the line passes maxLine, not read into memory for ever.
func TestQMPEndlessLine(t *testing.T) {
	path := servePeer(t, func(c net.Conn) {
		chunk := make([]byte, 1<<20)
		for i := range chunk {
			chunk[i] = '{'
		}
		for range maxLine>>20 + 2 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
	if _, err := Dial(context.Background(), path, nil); !errors.Is(err, lineio.ErrTooLong) {
		t.Fatalf("an endless greeting: %v", err)
	}
}
