package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
)

// A thin-CLI client written from the protocol's description, byte by
// byte, as the XenServer xe binary speaks it; it shares no code with the
// server or with package proto.

type rawClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func le32(v int32) []byte {
	u := uint32(v)
	return []byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24)}
}

func readLE32(t *testing.T, r io.Reader) int32 {
	t.Helper()
	var b [4]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		t.Fatalf("reading an int32: %v", err)
	}
	return int32(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
}

const specBanner = "XenSource thin CLI protocol"

// dialRaw sends the request the way xe does and checks the server's
// banner: the 27-byte prefix, major 0, minor 2, and no HTTP status line.
func dialRaw(t *testing.T, addr string, args []string, major, minor int32) *rawClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	body := strings.Join(args, "\n")
	fmt.Fprintf(conn, "POST /cli HTTP/1.0\r\nUser-agent: xe-cli/Unix/0.2\r\noriginator: cli\r\ncontent-length: %d\r\n\r\n%s", len(body), body)
	c := &rawClient{t: t, conn: conn, r: bufio.NewReader(conn)}
	got := make([]byte, 35)
	if _, err := io.ReadFull(c.r, got); err != nil {
		t.Fatalf("reading the banner: %v", err)
	}
	want := append(append([]byte(specBanner), 0, 0, 0, 0), 2, 0, 0, 0)
	if !bytes.Equal(got, want) {
		t.Fatalf("banner %q, want %q", got, want)
	}
	conn.Write(append(append([]byte(specBanner), le32(major)...), le32(minor)...))
	return c
}

// msg is a decoded message: kind, tag and the rest of the payload.
type msg struct {
	kind, tag int32
	body      []byte
}

func (c *rawClient) read() msg {
	c.t.Helper()
	n := readLE32(c.t, c.r)
	if n < 8 || n > 1<<26 {
		c.t.Fatalf("payload length %d", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(c.r, p); err != nil {
		c.t.Fatalf("payload: %v", err)
	}
	br := bytes.NewReader(p)
	m := msg{kind: readLE32(c.t, br), tag: readLE32(c.t, br)}
	m.body, _ = io.ReadAll(br)
	return m
}

// str reads a length-prefixed string from a body.
func str(t *testing.T, b *bytes.Reader) string {
	n := readLE32(t, b)
	s := make([]byte, n)
	if _, err := io.ReadFull(b, s); err != nil {
		t.Fatalf("string: %v", err)
	}
	return string(s)
}

func (c *rawClient) send(kind, tag int32, extra ...[]byte) {
	p := append(le32(kind), le32(tag)...)
	for _, e := range extra {
		p = append(p, e...)
	}
	c.conn.Write(append(le32(int32(len(p))), p...))
}

func (c *rawClient) respond(tag int32) { c.send(10, tag) }

// transcript collects what the server said until Exit, answering
// commands through the handlers given.
type transcript struct {
	stdout, stderr strings.Builder
	exit           int32
}

func (c *rawClient) run(handle func(m msg) bool) transcript {
	c.t.Helper()
	var tr transcript
	for {
		m := c.read()
		if m.kind != 9 {
			c.t.Fatalf("expected a command, got kind %d", m.kind)
		}
		b := bytes.NewReader(m.body)
		switch m.tag {
		case 0:
			tr.stdout.WriteString(str(c.t, b) + "\n")
		case 16:
			tr.stderr.WriteString(str(c.t, b))
		case 15:
		case 14:
			code := str(c.t, b)
			n := readLE32(c.t, b)
			var ps []string
			for range n {
				ps = append(ps, str(c.t, b))
			}
			fmt.Fprintf(&tr.stderr, "Error code: %s\nError parameters: %s\n", code, strings.Join(ps, ", "))
		case 4:
			tr.exit = readLE32(c.t, b)
			return tr
		default:
			if handle == nil || !handle(m) {
				c.t.Fatalf("unexpected command tag %d", m.tag)
			}
		}
	}
}

func TestProtocolHandshakeAndPrint(t *testing.T) {
	h := newHarness(t, goldenFixture)
	c := dialRaw(t, h.http.Listener.Addr().String(), []string{"vm-list", "--minimal", "params=name-label", "username=root", "password=" + rootPW}, 0, 2)
	tr := c.run(nil)
	if tr.exit != 0 || tr.stdout.String() != "web,odd\\, name\\\\here\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", tr.exit, tr.stdout.String(), tr.stderr.String())
	}
	// A body whose lines end in CRLF and starts with session_id= is a
	// forwarded command, run as that session.
	sess, _, err := h.api.Invoke(t.Context(), "", "session.login_with_password", "root", rootPW, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	c = dialRaw(t, h.http.Listener.Addr().String(), []string{"session_id=" + sess.(string) + "\r", "host-list\r", "--minimal\r", "params=name-label"}, 0, 2)
	if tr := c.run(nil); tr.exit != 0 || tr.stdout.String() != "host1\n" {
		t.Fatalf("forwarded: exit %d, %q %q", tr.exit, tr.stdout.String(), tr.stderr.String())
	}
	c = dialRaw(t, h.http.Listener.Addr().String(), []string{"session_id=OpaqueRef:nope", "host-list"}, 0, 2)
	if tr := c.run(nil); tr.exit != 1 || !strings.Contains(tr.stderr.String(), "SESSION_INVALID") {
		t.Fatalf("bad session: exit %d, %q", tr.exit, tr.stderr.String())
	}
}

func TestProtocolVersionMismatch(t *testing.T) {
	h := newHarness(t, goldenFixture)
	c := dialRaw(t, h.http.Listener.Addr().String(), []string{"vm-list"}, 1, 0)
	// The server hangs up without running anything.
	if n, err := c.r.Read(make([]byte, 1)); err == nil || n != 0 {
		t.Fatalf("server went on after a major version mismatch (%d bytes, %v)", n, err)
	}
}

func TestProtocolBodyLimit(t *testing.T) {
	h := newHarness(t, goldenFixture, func(o *Options) { o.MaxBody = 1000 })
	args := []string{"vm-list", "name-label=" + strings.Repeat("x", 2000)}
	c := dialRaw(t, h.http.Listener.Addr().String(), args, 0, 2)
	tr := c.run(nil)
	if tr.exit != 1 || !strings.Contains(tr.stderr.String(), "longer than the 1000 bytes allowed") {
		t.Fatalf("exit %d, stderr %q", tr.exit, tr.stderr.String())
	}
}

// xapiUpload is an upload endpoint that keeps xapi's contract with xe:
// it takes the task (progress 0), answers 200 before reading the body,
// reads it, and completes the task.
func xapiUpload(h *harness, got *bytes.Buffer) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.api.HTTPSession(w, r, 0) == nil {
			return
		}
		task := r.URL.Query().Get("task_id")
		h.api.Invoke(r.Context(), r.URL.Query().Get("session_id"), "task.set_progress", task, 0.0)
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		_, err := io.Copy(got, r.Body)
		h.api.FinishTask(task, schema.Void, nil, err, false)
	}
}

// TestProtocolLoadAndHttpPut runs a Load (pool-restore-database) and an
// HttpPut (vdi-import, to a test endpoint) as the spec describes them,
// heartbeats included.
func TestProtocolLoadAndHttpPut(t *testing.T) {
	h := newHarness(t, goldenFixture)
	addr := h.http.Listener.Addr().String()
	var uploaded bytes.Buffer
	h.route("/import_raw_vdi", xapiUpload(h, &uploaded), http.MethodPut)

	// Load: the server names the file; the client says OK, then sends
	// one Chunk with the whole file and End.
	dump := dumpDatabase(t, h)
	c := dialRaw(t, addr, []string{"pool-restore-database", "file-name=/tmp/db.xml", "username=root", "password=" + rootPW}, 0, 2)
	tr := c.run(func(m msg) bool {
		if m.tag != 1 {
			return false
		}
		if name := str(t, bytes.NewReader(m.body)); name != "/tmp/db.xml" {
			t.Fatalf("Load %q", name)
		}
		c.respond(5)
		c.send(11, 7, le32(int32(len(dump))))
		c.conn.Write(dump)
		c.send(11, 8)
		return true
	})
	if tr.exit != 0 {
		t.Fatalf("restore: exit %d: %s", tr.exit, tr.stderr.String())
	}

	// HttpPut: the client opens a new connection, PUTs the file after the
	// 200, and answers OK (after a few Wait heartbeats).
	data := bytes.Repeat([]byte("0123456789abcdef"), 100000)
	c = dialRaw(t, addr, []string{"vdi-import", "uuid=" + gVDIUUID, "filename=disk.raw", "username=root", "password=" + rootPW}, 0, 2)
	tr = c.run(func(m msg) bool {
		if m.tag != 13 {
			return false
		}
		b := bytes.NewReader(m.body)
		name, url := str(t, b), str(t, b)
		if name != "disk.raw" || !strings.HasPrefix(url, "/import_raw_vdi?") || !strings.Contains(url, "task_id=") {
			t.Fatalf("HttpPut %q %q", name, url)
		}
		put, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(put, "PUT %s HTTP/1.0\r\nContent-length: %d\r\n\r\n", url, len(data))
		br := bufio.NewReader(put)
		status, _ := br.ReadString('\n')
		if !strings.Contains(status, " 200 ") {
			t.Fatalf("PUT status %q", status)
		}
		for {
			line, err := br.ReadString('\n')
			if err != nil || line == "\r\n" {
				break
			}
		}
		for i := 0; i < len(data); i += 65536 {
			put.Write(data[i:min(i+65536, len(data))])
			if i%(4*65536) == 0 {
				c.respond(18) // Wait
			}
		}
		put.Close()
		c.respond(5)
		return true
	})
	if tr.exit != 0 {
		t.Fatalf("import: exit %d: %s", tr.exit, tr.stderr.String())
	}
	if !bytes.Equal(uploaded.Bytes(), data) {
		t.Fatalf("uploaded %d bytes, want %d", uploaded.Len(), len(data))
	}
	// The transfer's task is gone afterwards.
	for _, r := range h.d.Snapshot().All(dm.Task.Class) {
		t.Errorf("task left behind: %s", r.String(dm.Task.NameLabel))
	}
}

func dumpDatabase(t *testing.T, h *harness) []byte {
	resp, err := http.Get(h.http.URL + "/pool/xmldbdump?session_id=" + login(t, h))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("dump: %s", resp.Status)
	}
	return b
}

func login(t *testing.T, h *harness) string {
	s, _, err := h.api.Invoke(t.Context(), "", "session.login_with_password", "root", rootPW, "", "test")
	if err != nil {
		t.Fatal(err)
	}
	return s.(string)
}

// TestProtocolFailedTransfer: a client that cannot do the upload answers
// Failed; with no handler having taken the task the command fails with
// CLIENT_ERROR.
func TestProtocolFailedTransfer(t *testing.T) {
	h := newHarness(t, goldenFixture)
	h.route("/import_raw_vdi", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, http.MethodPut)
	c := dialRaw(t, h.http.Listener.Addr().String(), []string{"vdi-import", "uuid=" + gVDIUUID, "filename=x", "username=root", "password=" + rootPW}, 0, 2)
	tr := c.run(func(m msg) bool {
		if m.tag != 13 {
			return false
		}
		c.respond(6)
		return true
	})
	if tr.exit != 1 || !strings.Contains(tr.stderr.String(), "CLIENT_ERROR") {
		t.Fatalf("exit %d, %q", tr.exit, tr.stderr.String())
	}
}

// TestProtocolHeartbeatTimeout: a client silent for three heartbeat
// intervals during a transfer is given up on.
func TestProtocolHeartbeatTimeout(t *testing.T) {
	h := newHarness(t, goldenFixture, func(o *Options) { o.Heartbeat = 100 * time.Millisecond })
	h.route("/import_raw_vdi", func(w http.ResponseWriter, r *http.Request) {}, http.MethodPut)
	c := dialRaw(t, h.http.Listener.Addr().String(), []string{"vdi-import", "uuid=" + gVDIUUID, "filename=x", "username=root", "password=" + rootPW}, 0, 2)
	start := time.Now()
	tr := c.run(func(m msg) bool {
		if m.tag != 13 {
			return false
		}
		// Heartbeats 30 ms apart, a tenth of the 300 ms the server waits
		// (a busy machine may sleep late), for 450 ms; then silence. The
		// server gives up 300 ms after the last one, not 300 ms after the
		// first: 750 ms in all at the least.
		for range 15 {
			time.Sleep(30 * time.Millisecond)
			c.respond(18)
		}
		return true
	})
	if tr.exit != 1 || !strings.Contains(tr.stderr.String(), "no heartbeat") {
		t.Fatalf("exit %d, %q", tr.exit, tr.stderr.String())
	}
	if d := time.Since(start); d < 750*time.Millisecond {
		t.Fatalf("gave up after %s, despite the heartbeats", d)
	}
}

// TestProtocolPrompt: vm-uninstall asks for "yes" with Prompt; the
// client answers with a Chunk and End.
func TestProtocolPrompt(t *testing.T) {
	h := newHarness(t, goldenFixture)
	addr := h.http.Listener.Addr().String()
	answer := func(text string) transcript {
		c := dialRaw(t, addr, []string{"vm-uninstall", "vm=web", "username=root", "password=" + rootPW}, 0, 2)
		return c.run(func(m msg) bool {
			if m.tag != 3 {
				return false
			}
			c.send(11, 7, le32(int32(len(text))))
			c.conn.Write([]byte(text))
			c.send(11, 8)
			return true
		})
	}
	tr := answer("no")
	if tr.exit != 0 || !strings.Contains(tr.stdout.String(), "Aborted (you typed: 'no')") ||
		!strings.Contains(tr.stdout.String(), "VDI: "+gVDIUUID+" (disk0)") {
		t.Fatalf("no: exit %d, %q", tr.exit, tr.stdout.String())
	}
	if _, ok := h.d.Snapshot().ByUUID(dm.VM.Class, gVMUUID); !ok {
		t.Fatal("VM destroyed after 'no'")
	}
	if tr := answer("yes"); tr.exit != 0 {
		t.Fatalf("yes: exit %d: %s", tr.exit, tr.stderr.String())
	}
	snap := h.d.Snapshot()
	if _, ok := snap.ByUUID(dm.VM.Class, gVMUUID); ok {
		t.Fatal("VM still there after 'yes'")
	}
	if _, ok := snap.ByUUID(dm.VDI.Class, gVDIUUID); ok {
		t.Fatal("its disk is still there")
	}
}

// TestProtocolHttpGet: vdi-export sends HttpGet; the client downloads.
func TestProtocolHttpGet(t *testing.T) {
	h := newHarness(t, goldenFixture)
	addr := h.http.Listener.Addr().String()
	content := strings.Repeat("disk-bytes ", 10000)
	h.route("/export_raw_vdi", func(w http.ResponseWriter, r *http.Request) {
		if h.api.HTTPSession(w, r, 0) == nil {
			return
		}
		task := r.URL.Query().Get("task_id")
		h.api.Invoke(r.Context(), r.URL.Query().Get("session_id"), "task.set_progress", task, 0.0)
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		io.WriteString(w, content)
		h.api.FinishTask(task, schema.Void, nil, nil, false)
	}, http.MethodGet)
	c := dialRaw(t, addr, []string{"vdi-export", "uuid=" + gVDIUUID, "filename=out.raw", "username=root", "password=" + rootPW}, 0, 2)
	var got []byte
	tr := c.run(func(m msg) bool {
		if m.tag != 12 {
			return false
		}
		b := bytes.NewReader(m.body)
		name, url := str(t, b), str(t, b)
		if name != "out.raw" {
			t.Fatalf("HttpGet %q", name)
		}
		resp, err := http.Get("http://" + addr + url)
		if err != nil {
			t.Fatal(err)
		}
		got, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		c.respond(5)
		return true
	})
	if tr.exit != 0 || string(got) != content {
		t.Fatalf("exit %d (%s), %d bytes", tr.exit, tr.stderr.String(), len(got))
	}
}
