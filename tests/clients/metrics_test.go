package clients

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"toolstackd/internal/testkit/testdaemon"
)

// GET /metrics on a real daemon (issue 15, item 6): refused without a
// session, served with one (query parameter or basic authentication) in a
// form Prometheus' parser reads, with the calls counted under the
// method names the wire used and made-up names folded into "unknown";
// --metrics-open serves it to anyone.
func TestMetricsEndpoint(t *testing.T) {
	d := testdaemon.Start(t, testdaemon.Options{Backend: "simulator"})
	c := d.Client()
	s := d.Login(t)
	if _, err := c.Call("host.get_all", s); err != nil {
		t.Fatal(err)
	}
	c.Call("VM.start", s, "OpaqueRef:nothing", false, false) //nolint:errcheck // the error is the point: counted by its code
	c.Call("no.such_method", s)                              //nolint:errcheck // counted as "unknown"
	get := func(url string, basic bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if basic {
			req.SetBasicAuth("root", testdaemon.DefaultPassword)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := get(d.URL+"/metrics", false); st != http.StatusUnauthorized {
		t.Fatalf("without a session: %d, want 401", st)
	}
	if st, _ := get(d.URL+"/metrics/", true); st != http.StatusOK {
		t.Fatalf("basic authentication, trailing slash: %d", st)
	}
	st, body := get(d.URL+"/metrics?session_id="+s, false)
	if st != http.StatusOK {
		t.Fatalf("with a session: %d %s", st, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("does not parse: %v", err)
	}
	seen := map[string]bool{}
	for _, m := range fams["toolstackd_api_calls_total"].GetMetric() {
		var lv []string
		for _, l := range m.GetLabel() {
			lv = append(lv, l.GetName()+"="+l.GetValue())
		}
		seen[strings.Join(lv, ",")] = true
	}
	for _, want := range []string{"method=host.get_all,result=success", "method=VM.start,result=HANDLE_INVALID",
		"method=session.login_with_password,result=success", "method=unknown,result=MESSAGE_METHOD_UNKNOWN"} {
		if !seen[want] {
			t.Errorf("no %s among %v", want, seen)
		}
	}
	for _, name := range []string{"toolstackd_db_generation", "toolstackd_sessions", "toolstackd_tasks_pending",
		"toolstackd_event_watchers", "toolstackd_xenops_queue_depth", "toolstackd_db_commits_total",
		"toolstackd_db_commit_duration_seconds", "toolstackd_api_call_duration_seconds", "process_resident_memory_bytes"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}

	open := testdaemon.Start(t, testdaemon.Options{Backend: "simulator", ExtraArgs: []string{"--metrics-open"}})
	if st, _ := get(open.URL+"/metrics", false); st != http.StatusOK {
		t.Fatalf("--metrics-open without a session: %d", st)
	}
}
