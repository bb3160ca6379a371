package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

func fuzzServer(f *testing.F) *api.Server {
	cfg := api.DefaultConfig()
	cfg.PasswordIterations = 1
	d := db.New(dm.Model, db.Options{})
	hash, _ := api.HashPassword("pw", 1)
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		f.Fatal(err)
	}
	cfg.HostRef = host
	s := api.New(d, cfg, nil)
	f.Cleanup(s.Close)
	return s
}

// bounded gives a request a deadline, as a client that hangs up would:
// fuzzed event.from and event.next calls may ask to wait for a long time.
func bounded(r *http.Request) *http.Request {
	ctx, cancel := context.WithTimeout(r.Context(), 100*time.Millisecond)
	_ = cancel // released when the deadline passes
	return r.WithContext(ctx)
}

// FuzzServeXML sends arbitrary bodies through the whole XML-RPC path
// (decode, dispatch, parameter conversion, encode): never a panic, always
// an answer.
func FuzzServeXML(f *testing.F) {
	s := fuzzServer(f)
	h := s.Handler()
	for _, seed := range []string{
		`<methodCall><methodName>session.login_with_password</methodName><params><param><value>root</value></param><param><value>pw</value></param></params></methodCall>`,
		`<methodCall><methodName>VM.get_all_records_where</methodName><params><param><value>x</value></param><param><value>field "a" = "b"</value></param></params></methodCall>`,
		`<methodCall><methodName>network.create</methodName><params><param><value>OpaqueRef:x</value></param><param><value><struct><member><name>MTU</name><value><i4>5</i4></value></member></struct></value></param></params></methodCall>`,
		`<methodCall><methodName>event.from</methodName><params><param><value>s</value></param><param><value><array><data/></array></value></param><param><value>1,2</value></param><param><value><double>0.01</double></value></param></params></methodCall>`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, bounded(httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))))
		if w.Code != 200 && w.Code != 400 && w.Code != 413 {
			t.Fatalf("status %d", w.Code)
		}
	})
}

// FuzzServeJSON does the same for JSON-RPC, with a logged-in session so
// that calls reach the handlers.
func FuzzServeJSON(f *testing.F) {
	s := fuzzServer(f)
	h := s.Handler()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/jsonrpc", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"session.login_with_password","params":["root","pw"]}`)))
	sess := strings.Split(w.Body.String(), `"`)[5]
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"VM.get_all_records","params":["SESSION"]}`,
		`{"jsonrpc":"2.0","id":1,"method":"VM.add_to_other_config","params":["SESSION","OpaqueRef:x","k","v"]}`,
		`{"id":1,"method":"network.create","params":["SESSION",{"name_label":"x","other_config":{},"MTU":"12"}]}`,
		`{"jsonrpc":"2.0","id":1,"method":"event.from","params":["SESSION",["*"],"",0.001]}`,
		`{"jsonrpc":"2.0","id":1,"method":"Async.VM.destroy","params":["SESSION","OpaqueRef:x"]}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		body = strings.ReplaceAll(body, "SESSION", sess)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, bounded(httptest.NewRequest(http.MethodPost, "/jsonrpc", strings.NewReader(body))))
		if w.Code != 200 && w.Code != 400 && w.Code != 413 {
			t.Fatalf("status %d", w.Code)
		}
	})
}
