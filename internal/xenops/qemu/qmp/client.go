package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"toolstackd/internal/lineio"
)

// A small client for the QEMU Machine Protocol: JSON objects, one per
// line, over a Unix socket. Commands carry an id and their replies are
// matched by it; asynchronous events go to a callback. A file descriptor
// can ride along with a command (SCM_RIGHTS), which is how getfd hands
// QEMU the file a suspend image is written to.

// Error is an error reply from QEMU.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// Event is one asynchronous event.
type Event struct {
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// maxLine bounds one QMP message (a line). The largest replies
// toolstackd asks for (query-block, query-migrate) are kilobytes; a
// QEMU that sends more is not trusted to be QEMU any more, and the
// connection ends.
const maxLine = 16 << 20

// ErrClosed is returned for commands on a connection that has ended
// (QEMU exited or the socket closed).
var ErrClosed = errors.New("qmp: connection closed")

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	ID     json.RawMessage `json:"id"`
	QMP    json.RawMessage `json:"QMP"`
}

// Conn is one connection to a QEMU monitor.
type Conn struct {
	conn    *net.UnixConn
	onEvent func(Event)

	wmu     sync.Mutex // one writer at a time
	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan reply
	closed  chan struct{}
	err     error
}

// Dial connects to a QMP socket, reads the greeting and leaves
// capabilities negotiation done, so that commands can be sent. onEvent,
// if not nil, is called from the reader goroutine for every event; it
// must not block for long.
func Dial(ctx context.Context, path string, onEvent func(Event)) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &Conn{conn: c.(*net.UnixConn), onEvent: onEvent, pending: map[string]chan reply{}, closed: make(chan struct{})}
	r := bufio.NewReader(q.conn)
	// The greeting comes first, before anything is asked.
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetReadDeadline(dl)
	} else {
		q.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	}
	line, err := lineio.ReadLine(r, maxLine)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", err)
	}
	var greet reply
	if json.Unmarshal(line, &greet) != nil || greet.QMP == nil {
		_ = c.Close()
		return nil, fmt.Errorf("qmp greeting: unexpected %q", truncate(string(line), 200))
	}
	q.conn.SetReadDeadline(time.Time{})
	go q.readLoop(r)
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		_ = q.Close()
		return nil, err
	}
	return q, nil
}

// Done is closed when the connection ends.
func (q *Conn) Done() <-chan struct{} { return q.closed }

// Close ends the connection.
func (q *Conn) Close() error { return q.conn.Close() }

func (q *Conn) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = lineio.ReadLine(r, maxLine)
		if err != nil {
			break // a line over the bound ends the connection too
		}
		var m reply
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if m.Event != "" {
			if q.onEvent != nil {
				var ev Event
				if json.Unmarshal(line, &ev) == nil {
					q.onEvent(ev)
				}
			}
			continue
		}
		id := string(m.ID)
		q.mu.Lock()
		ch := q.pending[id]
		delete(q.pending, id)
		q.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
	q.mu.Lock()
	q.err = err
	q.pending = nil
	close(q.closed)
	q.mu.Unlock()
	_ = q.conn.Close()
}

// Execute runs a command and decodes its return value into out (when out
// is not nil). A QEMU error reply is a *Error.
func (q *Conn) Execute(ctx context.Context, cmd string, args any, out any) error {
	return q.execute(ctx, cmd, args, out, -1)
}

// ExecuteFD is Execute with a file descriptor passed alongside the
// command (for getfd and add-fd).
func (q *Conn) ExecuteFD(ctx context.Context, cmd string, args any, fd int, out any) error {
	return q.execute(ctx, cmd, args, out, fd)
}

func (q *Conn) execute(ctx context.Context, cmd string, args any, out any, fd int) error {
	q.mu.Lock()
	if q.pending == nil {
		q.mu.Unlock()
		return ErrClosed
	}
	q.nextID++
	id := strconv.FormatUint(q.nextID, 10)
	ch := make(chan reply, 1)
	q.pending[`"`+id+`"`] = ch
	q.mu.Unlock()
	forget := func() {
		q.mu.Lock()
		if q.pending != nil {
			delete(q.pending, `"`+id+`"`)
		}
		q.mu.Unlock()
	}

	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		forget()
		return err
	}
	b = append(b, '\n')
	q.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetWriteDeadline(dl)
	} else {
		q.conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	}
	if fd >= 0 {
		_, _, err = q.conn.WriteMsgUnix(b, syscall.UnixRights(fd), nil)
	} else {
		_, err = q.conn.Write(b)
	}
	q.wmu.Unlock()
	if err != nil {
		forget()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case m := <-ch:
		if m.Error != nil {
			return m.Error
		}
		if out != nil && len(m.Return) > 0 {
			return json.Unmarshal(m.Return, out)
		}
		return nil
	case <-q.closed:
		return ErrClosed
	case <-ctx.Done():
		forget()
		return ctx.Err()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
