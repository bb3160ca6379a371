package conn_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// secret is a value no log may hold, made fresh for each run so that it
// cannot be in the log by chance.
func secret(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b)
}

// journalSink stands in for systemd-journald: it keeps every datagram
// the daemon sends to its socket.
type journalSink struct {
	conn *net.UnixConn
	mu   sync.Mutex
	all  strings.Builder
	n    int
	done chan struct{}
}

func newJournalSink(t *testing.T) (*journalSink, string) {
	path := filepath.Join(t.TempDir(), "journal.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	j := &journalSink{conn: c, done: make(chan struct{})}
	go func() {
		defer close(j.done)
		buf := make([]byte, 1<<20)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			j.mu.Lock()
			j.all.Write(buf[:n])
			j.all.WriteByte(0)
			j.n++
			j.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = c.Close(); <-j.done })
	return j, path
}

func (j *journalSink) text() (string, int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.all.String(), j.n
}

// TestNoSecretsInLog runs the daemon at debug level with each log target
// and does what a client does with secrets: logs in (over JSON-RPC and
// XML-RPC), fails to log in with a wrong password, makes good and bad
// calls with its session, passes the session in the query of HTTP
// handlers and in a cookie, sends basic authentication, tries to change
// the password with a wrong old one, and logs out. The whole log (and,
// with the journal target, every entry sent to the journal) must hold
// neither password nor the session's ref.
func TestNoSecretsInLog(t *testing.T) {
	for _, target := range []string{"stderr", "json", "journal"} {
		t.Run(target, func(t *testing.T) {
			t.Parallel()
			pw := secret(t, "pw-")
			wrong := secret(t, "wrong-")
			newPW := secret(t, "new-")
			o := testdaemon.Options{LogLevel: "debug", Password: pw, ExtraArgs: []string{"--log-target", target}}
			var j *journalSink
			if target == "journal" {
				var path string
				j, path = newJournalSink(t)
				o.Env = []string{"TOOLSTACKD_JOURNAL_SOCKET=" + path}
			}
			d := testdaemon.Start(t, o)
			c := d.Client()

			if _, err := c.Login("root", wrong); err == nil {
				t.Fatal("a wrong password logged in")
			}
			if _, err := c.CallXML("session.login_with_password", "root", wrong, "1.0", "nosecrets"); err == nil {
				t.Fatal("a wrong password logged in over XML-RPC")
			}
			sess := d.Login(t)
			xmlSess, err := c.CallXML("session.login_with_password", "root", pw, "1.0", "nosecrets")
			if err != nil {
				t.Fatal(err)
			}
			refs := []string{sess}
			if s, ok := xmlSess.(string); ok {
				refs = append(refs, s)
			}

			// Calls that succeed, and calls that fail.
			mustCall := func(method string, params ...any) {
				if _, err := c.Call(method, params...); err != nil {
					t.Fatalf("%s: %v", method, err)
				}
			}
			raw, err := c.Call("VM.get_all_records", sess)
			if err != nil {
				t.Fatal(err)
			}
			var vms map[string]struct {
				IsATemplate bool `json:"is_a_template"`
			}
			if err := json.Unmarshal(raw, &vms); err != nil {
				t.Fatal(err)
			}
			for ref, vm := range vms {
				if vm.IsATemplate { // a task that runs a while and succeeds
					mustCall("Async.VM.clone", sess, ref, "nosecrets")
					break
				}
			}
			mustCall("session.get_uuid", sess, sess)
			for _, bad := range [][]any{
				{"VM.get_record", sess, sess},                   // the ref where a VM's goes
				{"VM.no_such_call", sess, pw},                   // unknown, with the password as an argument
				{"VM.get_all", sess + "x"},                      // a session that does not exist
				{"session.change_password", sess, wrong, newPW}, // the old password is wrong
				{"host.call_plugin", sess, "OpaqueRef:NULL", "p", "f", map[string]string{"password": pw}},
				{"pool.join", sess, "127.0.0.1:1", "root", pw},
			} {
				if _, err := c.Call(bad[0].(string), bad[1:]...); err == nil {
					t.Errorf("%s succeeded", bad[0])
				}
			}
			if _, err := c.CallXML("VM.get_by_uuid", refs[len(refs)-1], "nonesuch"); err == nil {
				t.Error("VM.get_by_uuid of nonesuch succeeded")
			}

			// HTTP handlers given the session in their query, in a cookie,
			// and root's password in basic authentication.
			hc := &http.Client{Timeout: 30 * time.Second}
			q := "session_id=" + url.QueryEscape(sess)
			for _, r := range []struct{ method, path string }{
				{"GET", "/export_raw_vdi?" + q + "&vdi=OpaqueRef:nonesuch&format=raw"},
				{"PUT", "/import_raw_vdi?" + q + "&vdi=OpaqueRef:nonesuch&format=raw"},
				{"GET", "/export?" + q + "&uuid=nonesuch"},
				{"PUT", "/import?" + q},
				{"GET", "/rrd_updates?" + q + "&start=0"},
				{"GET", "/pool/xmldbdump?" + q},
				{"GET", "/console?" + q + "&ref=OpaqueRef:nonesuch"},
				{"GET", "/metrics"},
				{"GET", "/no/such/handler?" + q},
			} {
				for _, auth := range []string{"query", "cookie", "basic"} {
					req, err := http.NewRequest(r.method, d.URL+r.path, strings.NewReader("not an archive"))
					if err != nil {
						t.Fatal(err)
					}
					switch auth {
					case "cookie":
						req.URL.RawQuery = strings.Replace(req.URL.RawQuery, q, "", 1)
						req.AddCookie(&http.Cookie{Name: "session_id", Value: sess})
					case "basic":
						req.URL.RawQuery = strings.Replace(req.URL.RawQuery, q, "", 1)
						req.SetBasicAuth("root", pw)
					}
					resp, err := hc.Do(req)
					if err != nil {
						t.Fatalf("%s %s: %v", r.method, r.path, err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
			for _, s := range refs {
				mustCall("session.logout", s)
			}
			if _, err := c.Call("VM.get_all", sess); err == nil {
				t.Error("a session logged out still works")
			}
			if err := d.Stop(); err != nil {
				t.Logf("stop: %v", err)
			}

			log := d.Log()
			logs := map[string]string{"the daemon's output": log}
			if j != nil {
				text, n := j.text()
				if n == 0 {
					t.Error("nothing reached the journal")
				}
				if !strings.Contains(text, "PRIORITY=7\n") || !strings.Contains(text, "SYSLOG_IDENTIFIER=toolstackd\n") {
					t.Errorf("the journal got no debug entries from toolstackd:\n%.2000s", text)
				}
				logs["the journal"] = text
			}
			forbidden := map[string]string{"root's password": pw, "the wrong password": wrong, "the new password": newPW}
			for i, s := range refs {
				forbidden["session ref "+string(rune('0'+i))] = s
				forbidden["session ref "+string(rune('0'+i))+" without its prefix"] = strings.TrimPrefix(s, "OpaqueRef:")
			}
			for where, text := range logs {
				for what, s := range forbidden {
					if i := strings.Index(text, s); i >= 0 {
						t.Errorf("%s holds %s: ...%s...", where, what, text[max(0, i-300):min(len(text), i+len(s)+100)])
					}
				}
			}
			switch target {
			case "stderr":
				if !strings.Contains(log, "level=DEBUG") {
					t.Errorf("no debug entry in the log:\n%.2000s", log)
				}
			case "json":
				n := 0
				for line := range strings.Lines(log) {
					if !strings.HasPrefix(line, "{") {
						continue
					}
					var m map[string]any
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Errorf("not JSON: %q", line)
					}
					n++
				}
				if n == 0 || !strings.Contains(log, `"level":"DEBUG"`) {
					t.Errorf("%d JSON entries, none at debug:\n%.2000s", n, log)
				}
			case "journal":
				if strings.Contains(log, "level=INFO") {
					t.Errorf("the journal target wrote text to standard error:\n%.2000s", log)
				}
			}
			t.Logf("%s: %d bytes of log", target, len(log))
		})
	}
}
