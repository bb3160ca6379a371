package cli

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/cli/xe"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// addTestCommand registers a command for one test.
func (h *harness) addTestCommand(name string, run func(*Ctx) error, reqd ...string) {
	cmd := h.cli.register(name, "test", run, params(reqd, nil))
	cmd.finish()
}

func TestClientRefusesFilesNotOnCommandLine(t *testing.T) {
	h := newHarness(t, goldenFixture)
	h.addTestCommand("test-load", func(c *Ctx) error {
		_, err := c.loadFile("/etc/passwd", "file", 1<<20)
		return err
	}, "file")
	r := h.xe("test-load", "file=/tmp/other")
	if r.code != 1 || !strings.Contains(r.err, "File not permitted") || !strings.Contains(r.err, "/etc/passwd") {
		t.Fatalf("exit %d: %q", r.code, r.err)
	}
}

func TestClientUploadDownload(t *testing.T) {
	h := newHarness(t, goldenFixture)
	dir := t.TempDir()
	var uploaded bytes.Buffer
	h.route("/import_raw_vdi", xapiUpload(h, &uploaded), http.MethodPut)
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 300000)
	src := filepath.Join(dir, "disk.raw")
	os.WriteFile(src, data, 0o644)
	var progress bytes.Buffer
	r := h.xeWith(h.http, func(cl *xe.Client) {
		cl.Cwd = dir
		cl.Heartbeat = time.Nanosecond // a Wait after every block
		cl.Progress = true
		cl.Stderr = &progress
	}, "vdi-import", "uuid="+gVDIUUID, "filename=disk.raw", "-pw", rootPW)
	if r.code != 0 || !bytes.Equal(uploaded.Bytes(), data) {
		t.Fatalf("import: exit %d, %d bytes uploaded; stderr %q", r.code, uploaded.Len(), progress.String())
	}
	if !strings.Contains(progress.String(), "100%") {
		t.Errorf("no progress bar: %q", progress.String())
	}

	// Downloads: pool-dump-database writes a new file, mode 0600, and
	// will not overwrite one.
	r = h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "pool-dump-database", "file-name=db.xml", "-pw", rootPW)
	if r.code != 0 {
		t.Fatalf("dump: %d %s", r.code, r.err)
	}
	st, err := os.Stat(filepath.Join(dir, "db.xml"))
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() < 1000 {
		t.Fatalf("dump file: %v %v", st, err)
	}
	r = h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "pool-dump-database", "file-name=db.xml", "-pw", rootPW)
	if r.code != 1 || !strings.Contains(r.err, "Operation failed. Error:") {
		t.Fatalf("dump over a file: %d %q", r.code, r.err)
	}
	// And the database comes back with Load.
	r = h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "pool-restore-database", "file-name=db.xml", "-pw", rootPW)
	if r.code != 0 {
		t.Fatalf("restore: %d %s", r.code, r.err)
	}
	r = h.xeWith(h.http, func(cl *xe.Client) { cl.Cwd = dir }, "pool-restore-database", "file-name=missing.xml", "-pw", rootPW)
	if r.code != 1 || !strings.Contains(r.err, "Failed to read database file") {
		t.Fatalf("restore of a missing file: %d %q", r.code, r.err)
	}
}

func TestClientNotImplementedTransfer(t *testing.T) {
	h := newHarness(t, goldenFixture)
	r := h.xe("vdi-export", "uuid="+gVDIUUID, "filename=x")
	if r.code != 1 || r.err != "Error code: NOT_IMPLEMENTED\nError parameters: GET /export_raw_vdi\n" {
		t.Fatalf("%d %q", r.code, r.err)
	}
}

func TestClientPrompt(t *testing.T) {
	h := newHarness(t, goldenFixture)
	r := h.xeWith(h.http, func(cl *xe.Client) { cl.Stdin = strings.NewReader("yes\n") }, "vm-uninstall", "vm="+gVMUUID, "-pw", rootPW)
	if r.code != 0 || !strings.Contains(r.out, "Type 'yes' to continue") {
		t.Fatalf("%d %q %q", r.code, r.out, r.err)
	}
	if _, ok := h.d.Snapshot().ByUUID(dm.VM.Class, gVMUUID); ok {
		t.Fatal("VM not destroyed")
	}
}

func TestClientNotACLIServer(t *testing.T) {
	h := newHarness(t, goldenFixture)
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	r := h.xeWith(web, nil, "vm-list")
	if r.code != 1 || r.err != "Server internal error.\n" {
		t.Fatalf("HTTP server: %d %q", r.code, r.err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"))
			c.Close()
		}
	}()
	var errb bytes.Buffer
	cl := &xe.Client{Stdout: &bytes.Buffer{}, Stderr: &errb, Getenv: func(string) string { return "" },
		Dial: func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", l.Addr().String()) }}
	if code := cl.Run([]string{"vm-list"}); code != 1 || !strings.Contains(errb.String(), "Failed to contact a running management agent") {
		t.Fatalf("other server: %d %q", code, errb.String())
	}
	errb.Reset()
	cl.Dial = nil
	if code := cl.Run([]string{"vm-list", "-s", "127.0.0.1", "-p", "1"}); code != 1 || !strings.Contains(errb.String(), "Unable to contact server") {
		t.Fatalf("nothing listening: %d %q", code, errb.String())
	}
}

func TestClientOptions(t *testing.T) {
	h := newHarness(t, goldenFixture)
	home := t.TempDir()
	// ~/.xe names a wrong password and a filter; XE_EXTRA_ARGS overrides
	// the password (\, is a comma) and the command line wins over both.
	os.WriteFile(filepath.Join(home, ".xe"), []byte("# defaults\npassword=from-rc\nparams=name-label\n"), 0o600)
	env := map[string]string{"XE_EXTRA_ARGS": "password=" + rootPW + ",--minimal"}
	run := func(args ...string) result {
		return h.xeWith(h.http, func(cl *xe.Client) {
			cl.Home = home
			cl.Getenv = func(k string) string { return env[k] }
		}, args...)
	}
	// (xeWith adds -pw only when no password is given: give one that the
	// environment then loses to.)
	if r := run("vm-list", "-pw", rootPW, "power-state=running"); r.code != 0 || r.out != "odd\\, name\\\\here\n" {
		t.Fatalf("rc+env: %d %q %q", r.code, r.out, r.err)
	}
	env["XE_EXTRA_ARGS"] = "--minimal"
	if r := run("vm-list", "password=x"); r.code != 1 || !strings.Contains(r.err, "Authentication failed") {
		t.Fatalf("command line password: %d %q", r.code, r.err)
	}
	pwf := filepath.Join(home, "pw")
	os.WriteFile(pwf, []byte("root\n"+rootPW+"\n"), 0o600)
	if r := run("host-list", "-pwf", pwf, "params=uuid"); r.code != 0 || r.out != gHostUUID+"\n" {
		t.Fatalf("-pwf: %d %q %q", r.code, r.out, r.err)
	}
	os.WriteFile(pwf, []byte("root\n"), 0o600)
	if r := run("host-list", "-pwf", pwf); r.code != 1 || !strings.Contains(r.err, "password file format") {
		t.Fatalf("-pwf short: %d %q", r.code, r.err)
	}
	if r := run("--help"); r.code != 0 || !strings.Contains(r.err, "Usage: xe") {
		t.Fatalf("--help: %d %q", r.code, r.err)
	}
	if r := run("-version"); r.code != 0 || r.out != "ThinCLI protocol: 0.2\n" {
		t.Fatalf("-version: %d %q", r.code, r.out)
	}
	if r := run("vm-list", "-p", "http"); r.code != 1 || !strings.Contains(r.err, "Port number must be an integer") {
		t.Fatalf("-p: %d %q", r.code, r.err)
	}
}

func TestLocalSuperuser(t *testing.T) {
	h := newHarness(t, goldenFixture)
	// Over the local socket no password is needed.
	if r := h.xeLocal("host-list", "params=uuid", "--minimal"); r.code != 0 || r.out != gHostUUID+"\n" {
		t.Fatalf("%d %q %q", r.code, r.out, r.err)
	}
	// user-password-change as the local superuser needs no old password.
	if r := h.xeLocal("user-password-change", "new=n3w"); r.code != 0 {
		t.Fatalf("%d %q", r.code, r.err)
	}
	if r := h.xe("host-list", "-pw", "n3w"); r.code != 0 {
		t.Fatalf("new password: %d %q", r.code, r.err)
	}
	if r := h.xe("user-password-change", "old=wrong", "new=x", "-pw", "n3w"); r.code != 1 {
		t.Fatalf("wrong old password accepted: %q", r.err)
	}
}

func TestCompletion(t *testing.T) {
	h := newHarness(t, goldenFixture)
	addr := h.http.Listener.Addr().String()
	cl := &xe.Client{Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" },
		Dial: func(ctx context.Context) (net.Conn, error) { return net.Dial("tcp", addr) }}
	pw := []string{"-pw", rootPW}
	words, _ := cl.Complete(pw, "vm-l")
	if !contains(words, "vm-list") || contains(words, "host-list") {
		t.Fatalf("commands: %q", words)
	}
	words, noSpace := cl.Complete(append(pw, "vm-param-get"), "param-")
	if !noSpace || !contains(words, "param-name=") || !contains(words, "param-key=") {
		t.Fatalf("parameters: %q", words)
	}
	words, _ = cl.Complete(append(pw, "vm-param-list"), "uuid=2")
	if len(words) != 1 || words[0] != "uuid="+gVMUUID {
		t.Fatalf("uuids: %q", words)
	}
	words, _ = cl.Complete(append(pw, "vbd-create"), "vdi-uuid=")
	if len(words) != 1 || words[0] != "vdi-uuid="+gVDIUUID {
		t.Fatalf("vdi-uuid: %q", words)
	}
	words, _ = cl.Complete(append(pw, "vm-start"), "v")
	if !contains(words, "vm=") {
		t.Fatalf("selectors: %q", words)
	}
	words, _ = cl.Complete(append(pw, "vm-start"), "vm=w")
	if len(words) != 1 || words[0] != "vm=web" {
		t.Fatalf("vm names: %q", words)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestClientConsole: console sends HttpConnect; the client CONNECTs and
// relays the terminal until Ctrl-].
func TestClientConsole(t *testing.T) {
	h := newHarness(t, goldenFixture)
	conUUID := "cccccccc-cccc-cccc-cccc-cccccccccccc"
	h.d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.Console.Class, "", (&dm.ConsoleRecord{UUID: conUUID, Protocol: dm.ConsoleProtocolVt100,
			Location: "/console?uuid=" + conUUID, VM: dm.VMRef(gVM)}).Row())
		return err
	})
	h.route("/console", func(w http.ResponseWriter, r *http.Request) {
		if h.api.HTTPSession(w, r, 0) == nil || r.URL.Query().Get("uuid") != conUUID {
			http.NotFound(w, r)
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.Write([]byte("HTTP/1.1 200 OK\r\n\r\nlogin: "))
		buf := make([]byte, 100)
		for {
			n, err := brw.Read(buf)
			if n > 0 {
				conn.Write(bytes.ToUpper(buf[:n]))
			}
			if err != nil {
				return
			}
		}
	}, "CONNECT")
	r := h.xeWith(h.http, func(cl *xe.Client) {
		pr, pw := io.Pipe()
		go func() {
			pw.Write([]byte("root\n"))
			time.Sleep(200 * time.Millisecond)
			pw.Write([]byte{0x1d})
		}()
		cl.Stdin = pr
	}, "console", "vm=web", "-pw", rootPW)
	if r.code != 0 || !strings.Contains(r.out, "login: ROOT\n") {
		t.Fatalf("%d %q %q", r.code, r.out, r.err)
	}
	if r := h.xe("console", "vm="+gVM2UUID); r.code != 1 || r.err != "No text console available\n" {
		t.Fatalf("no console: %d %q", r.code, r.err)
	}
}

// TestClientTLS: a server that is not this host is reached over TLS
// unless --nossl is given, and its certificate is verified unless
// --no-verify is given.
func TestClientTLS(t *testing.T) {
	h := newHarness(t, goldenFixture)
	var ip string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			ip = n.IP.String()
			break
		}
	}
	if ip == "" {
		t.Skip("no address other than loopback")
	}
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Skip(err)
	}
	srv := httptest.NewUnstartedServer(h.router)
	srv.Listener = l
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		cl := &xe.Client{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		code := cl.Run(append([]string{"-s", ip, "-p", port, "-pw", rootPW}, args...))
		return code, out.String(), errb.String()
	}
	if code, _, e := run("host-list", "params=uuid", "--minimal"); code != 1 || !strings.Contains(e, "--no-verify") {
		t.Fatalf("TLS to a server whose certificate does not verify: %d %q", code, e)
	}
	if code, out, e := run("host-list", "params=uuid", "--minimal", "--no-verify"); code != 0 || out != gHostUUID+"\n" {
		t.Fatalf("TLS: %d %q %q", code, out, e)
	}
	if code, _, e := run("host-list", "--nossl"); code != 1 || e != "Server internal error.\n" {
		t.Fatalf("plain to a TLS port: %d %q", code, e)
	}
}

func TestCommandPanic(t *testing.T) {
	h := newHarness(t, goldenFixture)
	h.addTestCommand("test-panic", func(c *Ctx) error { panic("boom") })
	r := h.xe("test-panic")
	if r.code != 1 || r.err != "Error code: INTERNAL_ERROR\nError parameters: xe test-panic: boom\n" {
		t.Fatalf("%d %q", r.code, r.err)
	}
	if r := h.xe("host-list", "--minimal"); r.code != 0 {
		t.Fatalf("after a panic: %d %q", r.code, r.err)
	}
}
