// Package conn_test holds the connection tests of the real daemon: slow
// and silent clients are dropped within their deadlines, long polls still
// get their replies, and a flood of idle keep-alive connections from many
// addresses neither exhausts the daemon's file limit nor locks out other
// clients.
//
// The flood test runs in a bounded CI mode by default; set
// TOOLSTACKD_CONN_FLOOD=20000 for the full run (20,000 connections against
// a daemon whose file limit is 20,000).
package conn_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

const rootPW = "conn-test-pw"

// daemon is the daemon under test, with the calls these tests make.
type daemon struct {
	*testdaemon.Daemon
	client *testdaemon.Client
}

// start runs the daemon with args (TOOLSTACKD_BIN overrides the build, to
// measure another one); nofile > 0 sets its file limit (soft and hard)
// first.
func start(t testing.TB, nofile int, args ...string) *daemon {
	t.Helper()
	d := testdaemon.Start(t, testdaemon.Options{LogLevel: "warn", ExtraArgs: args, Password: rootPW, NoFile: nofile})
	// Each call on a fresh connection.
	return &daemon{d, &testdaemon.Client{URL: d.URL, Timeout: 30 * time.Second, NoKeepAlive: true}}
}

// call makes a JSON-RPC call on a fresh connection.
func (d *daemon) call(t testing.TB, method string, params ...any) (json.RawMessage, error) {
	t.Helper()
	return d.client.Call(method, params...)
}

func (d *daemon) must(t testing.TB, method string, params ...any) json.RawMessage {
	t.Helper()
	r, err := d.call(t, method, params...)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return r
}

func str(r json.RawMessage) string {
	s, _ := testdaemon.String(r)
	return s
}

func (d *daemon) login(t testing.TB) string {
	return str(d.must(t, "session.login_with_password", "root", rootPW, "2.21", "conn-test"))
}

// closedWithin reads c until the daemon closes it (EOF or reset) and fails
// if that takes longer than bound.
func closedWithin(t *testing.T, c net.Conn, start time.Time, bound time.Duration) time.Duration {
	t.Helper()
	c.SetReadDeadline(start.Add(bound + 3*time.Second))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("still open after %v (bound %v)", took.Round(time.Millisecond), bound)
	}
	if took > bound {
		t.Fatalf("closed after %v, bound %v", took.Round(time.Millisecond), bound)
	}
	t.Logf("closed after %v (bound %v)", took.Round(time.Millisecond), bound)
	return took
}

// TestSlowClients: each kind of slow or silent client is dropped within
// its deadline plus a margin, while a long poll that is silent for longer
// than every deadline still gets its reply.
func TestSlowClients(t *testing.T) {
	// Each is dropped about a second in on a quiet machine; the bound is
	// ten times that (the defaults, 30 s and more, would keep it longer).
	const timeout = time.Second
	const margin = 9 * time.Second
	bound := timeout + margin
	d := start(t, 0, "--header-timeout=1s", "--idle-timeout=1s", "--stall-timeout=1s", "--write-timeout=1s", "--min-body-rate=1024")
	sess := d.login(t)
	var srs []string
	json.Unmarshal(d.must(t, "SR.get_by_name_label", sess, "Local storage"), &srs)
	if len(srs) != 1 {
		t.Fatalf("Local storage: %v", srs)
	}
	vdi := str(d.must(t, "VDI.create", sess, map[string]any{"SR": srs[0], "virtual_size": "1048576", "name_label": "slow",
		"name_description": "", "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{}}))

	dial := func(t *testing.T) net.Conn { return dialTo(t, d.Addr) }
	// trickle writes one byte of s a second until the connection fails.
	trickle := func(c net.Conn, s string) {
		go func() {
			for i := range len(s) {
				if _, err := c.Write([]byte{s[i]}); err != nil {
					return
				}
				time.Sleep(time.Second)
			}
		}()
	}

	// The long poll runs alongside the others: it is silent for five
	// times every deadline.
	type pollResult struct {
		took time.Duration
		err  error
	}
	poll := make(chan pollResult, 1)
	go func() {
		r, err := d.call(t, "event.from", sess, []string{"vm"}, "", 0.0)
		if err != nil {
			poll <- pollResult{err: err}
			return
		}
		var first struct{ Token string }
		json.Unmarshal(r, &first)
		begin := time.Now()
		_, err = d.call(t, "event.from", sess, []string{"vm"}, first.Token, 5.0)
		poll <- pollResult{time.Since(begin), err}
	}()

	t.Run("silent", func(t *testing.T) {
		c := dial(t)
		closedWithin(t, c, time.Now(), bound)
	})
	t.Run("slow header", func(t *testing.T) {
		c := dial(t)
		begin := time.Now()
		trickle(c, "POST /jsonrpc HTTP/1.1\r\nHost: x\r\n")
		closedWithin(t, c, begin, bound)
	})
	t.Run("slow body", func(t *testing.T) {
		c := dial(t)
		begin := time.Now()
		fmt.Fprintf(c, "POST /jsonrpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n")
		trickle(c, strings.Repeat(" ", 200))
		closedWithin(t, c, begin, bound)
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c := dial(t)
		body := `{"jsonrpc":"2.0","id":1,"method":"session.get_this_host","params":["` + sess + `","` + sess + `"]}`
		fmt.Fprintf(c, "POST /jsonrpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("the good request: %s close=%v", resp.Status, resp.Close)
		}
		closedWithin(t, c, time.Now(), bound)
	})
	t.Run("slow cli", func(t *testing.T) {
		// The command is sent; the daemon answers with its banner and
		// waits for the client's, which never comes.
		c := dial(t)
		cmd := "vm-list\nusername=root\npassword=" + rootPW + "\n"
		fmt.Fprintf(c, "POST /cli HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(cmd), cmd)
		banner := make([]byte, 8)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, banner); err != nil {
			t.Fatalf("no banner: %v", err)
		}
		closedWithin(t, c, time.Now(), bound)
	})
	xfer := "/import_raw_vdi?" + url.Values{"session_id": {sess}, "vdi": {vdi}, "format": {"raw"}}.Encode()
	t.Run("stalled import", func(t *testing.T) {
		c := dial(t)
		fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n", xfer)
		c.Write(make([]byte, 64<<10))
		closedWithin(t, c, time.Now(), bound)
	})
	t.Run("stalled legacy import", func(t *testing.T) {
		// No length: xapi's protocol answers at once and reads the raw
		// connection to its end (a hijacked connection).
		c := dial(t)
		fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\n\r\n", xfer)
		c.Write(make([]byte, 64<<10))
		br := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, "200") {
			t.Fatalf("reply %q %v", line, err)
		}
		begin := time.Now()
		c.SetReadDeadline(begin.Add(bound + 3*time.Second))
		_, err = io.Copy(io.Discard, br)
		if took := time.Since(begin); took > bound {
			t.Fatalf("closed after %v (%v), bound %v", took, err, bound)
		} else {
			t.Logf("closed after %v (bound %v)", took.Round(time.Millisecond), bound)
		}
	})
	t.Run("long poll", func(t *testing.T) {
		r := <-poll
		if r.err != nil {
			t.Fatalf("event.from: %v", r.err)
		}
		if r.took < 4*time.Second {
			t.Fatalf("event.from returned after %v, want ~5s", r.took)
		}
		t.Logf("event.from with timeout 5s replied after %v", r.took.Round(time.Millisecond))
	})
	// The daemon is still healthy, and the import's VDI is usable.
	d.must(t, "VDI.get_record", sess, vdi)
}

// dialTo opens a TCP connection to addr, closed when the test ends.
func dialTo(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
