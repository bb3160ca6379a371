package sysstatus

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"encoding/xml"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
)

// The HTTP tests run the endpoint and the messages behind a real
// api.Server (database, logins, roles) on loopback, mounted as the daemon
// mounts them.

const rootPW = "pw"

// newServer is an API server over a first-booted database with root's
// password rootPW.
func newServer(t testing.TB) (*api.Server, string) {
	t.Helper()
	d := db.New(dm.Model, db.Options{})
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1000
	hash, err := api.HashPassword(rootPW, cfg.PasswordIterations)
	if err != nil {
		t.Fatal(err)
	}
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	cfg.HostRef = host
	srv := api.New(d, cfg, slog.New(slog.DiscardHandler))
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, host
}

type env struct {
	t    *testing.T
	srv  *api.Server
	s    *Service
	url  string
	c    *testdaemon.Client
	sess string
	host string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv, host := newServer(t)
	r := mux.NewRouter()
	srv.Routes(r)
	s := Register(srv, r, Config{DataDir: t.TempDir(), Settings: map[string]string{"listen": "127.0.0.1:1"}})
	hermetic(t, s)
	hs := httptest.NewServer(api.TrimSlash(r))
	t.Cleanup(hs.Close)
	e := &env{t: t, srv: srv, s: s, url: hs.URL, c: &testdaemon.Client{URL: hs.URL}, host: host}
	var err error
	if e.sess, err = e.c.Login("root", rootPW); err != nil {
		t.Fatal(err)
	}
	return e
}

// get fetches path with query q (the session added unless q has one;
// session_id=- sends none).
func (e *env) get(q url.Values) (int, http.Header, []byte) {
	e.t.Helper()
	switch q.Get("session_id") {
	case "":
		q.Set("session_id", e.sess)
	case "-":
		q.Del("session_id")
	}
	resp, err := http.Get(e.url + Path + "?" + q.Encode())
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// addUser adds a local account holding a role.
func (e *env) addUser(name, pw, role string) {
	e.t.Helper()
	hash, err := api.HashPassword(pw, 1000)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.srv.DB.Update(func(tx *db.Tx) error {
		if _, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: name, OtherConfig: map[string]string{}, PasswordHash: hash}).Row()); err != nil {
			return err
		}
		roles := tx.ByNameLabel(dm.Role.Class, role)
		if len(roles) != 1 {
			return fmt.Errorf("%s role: %d rows", role, len(roles))
		}
		_, err := tx.Insert(dm.Subject.Class, "", (&dm.SubjectRecord{SubjectIdentifier: api.LocalSubjectID(name),
			OtherConfig: map[string]string{}, Roles: []dm.RoleRef{dm.RoleRef(roles[0].Ref)}}).Row())
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

func TestHTTPReport(t *testing.T) {
	e := newEnv(t)
	code, hdr, body := e.get(url.Values{"entries": {CapDB + "," + CapConfig}, "output": {FormatZip}})
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/zip" {
		t.Errorf("Content-Type %q", ct)
	}
	if cd := hdr.Get("Content-Disposition"); !strings.HasPrefix(cd, `attachment; filename="system_status-`) || !strings.HasSuffix(cd, `.zip"`) {
		t.Errorf("Content-Disposition %q", cd)
	}
	files := unzip(t, body)
	names := sortedKeys(files)
	wantDirs := []string{CapDB + "/", CapConfig + "/"}
	for _, d := range wantDirs {
		found := false
		for _, n := range names {
			if strings.HasSuffix(n, "/"+d) {
				found = true
			}
		}
		if !found {
			t.Errorf("no %s in %v", d, names)
		}
	}
	var dump string
	for n, b := range files {
		if strings.HasSuffix(n, "/"+CapDB+"/state.db.xml") {
			dump = string(b)
		}
		if strings.Contains(n, CapLogs) || strings.Contains(n, CapQEMU) {
			t.Errorf("%s: not asked for", n)
		}
	}
	if dump == "" {
		t.Fatalf("no database dump in %v", names)
	}
	// The session that asked is in no dump.
	if strings.Contains(dump, e.sess) {
		t.Error("the dump holds the session's ref")
	}
	if !strings.Contains(dump, `<table name="host">`) {
		t.Error("the dump has no host table")
	}
	// The task the report ran as succeeded.
	task := hdr.Get("Task-Id")
	if row, ok := e.srv.DB.Snapshot().Get(dm.Task.Class, task); !ok || row.String(dm.Task.Status) != string(dm.TaskStatusTypeSuccess) {
		t.Errorf("task %q: %v", task, row)
	}
}

func TestHTTPRefusals(t *testing.T) {
	e := newEnv(t)
	e.addUser("reader", "rpw", "read-only")
	reader, err := e.c.Login("reader", "rpw")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		q    url.Values
		code int
		want []string
	}{
		{"no session", url.Values{"session_id": {"-"}}, http.StatusUnauthorized, nil},
		{"bad session", url.Values{"session_id": {"OpaqueRef:nobody"}}, http.StatusUnauthorized, nil},
		{"read-only", url.Values{"session_id": {reader}}, http.StatusForbidden, []string{xerr.RBACPermissionDenied}},
		{"unknown entries", url.Values{"entries": {"system-info,../../etc/shadow,xenserver-logs"}}, http.StatusBadRequest,
			[]string{xerr.ValueNotSupported, "../../etc/shadow,xenserver-logs", CapDB}},
		{"unknown output", url.Values{"output": {"rar"}}, http.StatusBadRequest, []string{xerr.ValueNotSupported, "rar"}},
		{"unknown host", url.Values{"host": {"OpaqueRef:nohost"}}, http.StatusNotFound, []string{xerr.HandleInvalid}},
		{"bad task", url.Values{"task_id": {"nonsense"}}, http.StatusNotFound, []string{xerr.HandleInvalid}},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, body := e.get(c.q)
			if code != c.code {
				t.Fatalf("status %d, want %d: %s", code, c.code, body)
			}
			for _, w := range c.want {
				if !strings.Contains(string(body), w) {
					t.Errorf("answer lacks %q: %s", w, body)
				}
			}
		})
	}
}

// capsDoc is the capabilities document as a client reads it.
type capsDoc struct {
	XMLName xml.Name `xml:"system-status-capabilities"`
	Caps    []struct {
		Key            string `xml:"key,attr"`
		PII            string `xml:"pii,attr"`
		MinSize        int64  `xml:"min-size,attr"`
		MaxSize        int64  `xml:"max-size,attr"`
		MinTime        int    `xml:"min-time,attr"`
		MaxTime        int    `xml:"max-time,attr"`
		ContentType    string `xml:"content-type,attr"`
		DefaultChecked string `xml:"default-checked,attr"`
	} `xml:"capability"`
}

func TestCapabilities(t *testing.T) {
	e := newEnv(t)
	raw, err := e.c.Call("host.get_system_status_capabilities", e.sess, e.host)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := testdaemon.String(raw)
	if err != nil {
		t.Fatal(err)
	}
	var d capsDoc
	if err := xml.Unmarshal([]byte(doc), &d); err != nil {
		t.Fatalf("%v:\n%s", err, doc)
	}
	keys := map[string]bool{}
	for _, c := range d.Caps {
		keys[c.Key] = true
		switch {
		case c.PII != PIINo && c.PII != PIIYes && c.PII != PIIMaybe && c.PII != PIIIfCustomized:
			t.Errorf("%s: pii %q", c.Key, c.PII)
		case c.ContentType != TypeText && c.ContentType != TypeXML:
			t.Errorf("%s: content-type %q", c.Key, c.ContentType)
		case c.DefaultChecked != "yes" && c.DefaultChecked != "no":
			t.Errorf("%s: default-checked %q", c.Key, c.DefaultChecked)
		case c.MaxSize <= 0 || c.MaxTime <= 0:
			t.Errorf("%s: max-size %d max-time %d", c.Key, c.MaxSize, c.MaxTime)
		}
	}
	for _, k := range []string{CapLogs, CapDB, CapConfig, CapSystemInfo, CapQEMU} {
		if !keys[k] {
			t.Errorf("no capability %s in\n%s", k, doc)
		}
	}
	// GET /system-status?list serves the same document.
	code, hdr, body := e.get(url.Values{"list": {""}})
	if code != http.StatusOK || string(body) != doc || hdr.Get("Content-Type") != TypeXML {
		t.Errorf("list: %d %q\n%s", code, hdr.Get("Content-Type"), body)
	}
	if _, err := e.c.Call("host.get_system_status_capabilities", e.sess, "OpaqueRef:nohost"); err == nil {
		t.Error("an unknown host was accepted")
	}
}

// uploadServer records the PUTs it receives.
type uploadServer struct {
	mu     sync.Mutex
	status int
	reqs   []upload
}

type upload struct {
	method, path, ctype string
	length              int64
	body                []byte
}

func (u *uploadServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.reqs = append(u.reqs, upload{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.ContentLength, b})
	status := u.status
	u.mu.Unlock()
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "stored\n")
}

func TestBugreportUpload(t *testing.T) {
	e := newEnv(t)
	up := &uploadServer{}
	us := httptest.NewServer(up)
	defer us.Close()
	if _, err := e.c.Call("host.bugreport_upload", e.sess, e.host, us.URL+"/incoming/", map[string]string{}); err != nil {
		t.Fatal(err)
	}
	if len(up.reqs) != 1 {
		t.Fatalf("%d uploads", len(up.reqs))
	}
	r := up.reqs[0]
	if r.method != http.MethodPut || !strings.HasPrefix(r.path, "/incoming/bug-report-") || !strings.HasSuffix(r.path, ".tar.gz") {
		t.Errorf("%s %s", r.method, r.path)
	}
	if r.ctype != "application/gzip" || r.length != int64(len(r.body)) {
		t.Errorf("Content-Type %q, Content-Length %d for %d bytes", r.ctype, r.length, len(r.body))
	}
	files := untar(t, r.body, true)
	for _, k := range []string{CapLogs, CapDB, CapConfig, CapSystemInfo, CapQEMU} {
		found := false
		for n := range files {
			if strings.Contains(n, "/"+k+"/") {
				found = true
			}
		}
		if !found {
			t.Errorf("upload has nothing of %s: %v", k, sortedKeys(files))
		}
	}

	// A URL naming the file is used as it is.
	if _, err := e.c.Call("host.bugreport_upload", e.sess, e.host, us.URL+"/exact.tgz", map[string]string{"http_proxy": ""}); err != nil {
		t.Fatal(err)
	}
	if p := up.reqs[1].path; p != "/exact.tgz" {
		t.Errorf("uploaded to %s", p)
	}

	for _, c := range []struct {
		url     string
		options map[string]string
		code    string
	}{
		{"", nil, xerr.InvalidValue},
		{"ftp://example.com/x", nil, xerr.ValueNotSupported},
		{"file:///etc/passwd", nil, xerr.ValueNotSupported},
		{"/relative", nil, xerr.ValueNotSupported},
		{us.URL + "/x", map[string]string{"http_proxy": "socks5://p:1"}, xerr.ValueNotSupported},
		{us.URL + "/x", map[string]string{"output": "rar"}, xerr.ValueNotSupported},
	} {
		opts := c.options
		if opts == nil {
			opts = map[string]string{}
		}
		_, err := e.c.Call("host.bugreport_upload", e.sess, e.host, c.url, opts)
		if xe, ok := testdaemon.AsError(err); !ok || xe.Code != c.code {
			t.Errorf("%q %v: %v, want %s", c.url, c.options, err, c.code)
		}
	}
	if n := len(up.reqs); n != 2 {
		t.Errorf("refused uploads reached the server: %d requests", n)
	}

	// A server that refuses the upload is an error.
	up.mu.Lock()
	up.status = http.StatusForbidden
	up.mu.Unlock()
	_, err := e.c.Call("host.bugreport_upload", e.sess, e.host, us.URL+"/x", map[string]string{})
	if xe, ok := testdaemon.AsError(err); !ok || xe.Code != xerr.InternalError || !strings.Contains(strings.Join(xe.Params, " "), "403") {
		t.Errorf("refused upload: %v", err)
	}
}

func unzip(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		out[f.Name] = data
	}
	return out
}

func untar(t *testing.T, b []byte, gz bool) map[string][]byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(b)
	if gz {
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	return readTar(t, r)
}

func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	tr := tar.NewReader(r)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = data
	}
}
