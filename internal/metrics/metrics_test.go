package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The handler's output parses with Prometheus' own text parser, carries
// the call counters with their labels, and is refused without
// authentication unless open.
func TestHandlerServesParsableMetrics(t *testing.T) {
	r := New()
	r.ObserveCall("VM.start", "success", 3*time.Millisecond)
	r.ObserveCall("VM.start", "VM_BAD_POWER_STATE", time.Millisecond)
	r.ObserveCall("Async.VM.start", "success", time.Millisecond)
	r.ObserveCommit(2 * time.Millisecond)
	r.Gauge("sessions", "Sessions open.", func() float64 { return 7 })
	r.Counter("db_commits_total", "Write transactions.", func() float64 { return 11 })
	denied := func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return false
	}
	srv := httptest.NewServer(r.Handler(denied, false, time.Second))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a session: %d, want 401", resp.StatusCode)
	}

	open := httptest.NewServer(r.Handler(denied, true, time.Second))
	defer open.Close()
	resp, err = http.Get(open.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("the text format does not parse: %v\n%s", err, body)
	}
	calls := fams["toolstackd_api_calls_total"]
	if calls == nil {
		t.Fatalf("no toolstackd_api_calls_total in\n%s", body)
	}
	got := map[string]float64{}
	for _, m := range calls.GetMetric() {
		var method, result string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "method":
				method = l.GetValue()
			case "result":
				result = l.GetValue()
			}
		}
		got[method+" "+result] = m.GetCounter().GetValue()
	}
	for k, want := range map[string]float64{"VM.start success": 1, "VM.start VM_BAD_POWER_STATE": 1, "Async.VM.start success": 1} {
		if got[k] != want {
			t.Errorf("calls %q = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
	if h := fams["toolstackd_api_call_duration_seconds"]; h == nil || len(h.GetMetric()) != 2 {
		t.Errorf("latency histograms: %v", h)
	}
	if g := fams["toolstackd_sessions"]; g == nil || g.GetMetric()[0].GetGauge().GetValue() != 7 {
		t.Errorf("sessions gauge: %v", g)
	}
	if c := fams["toolstackd_db_commits_total"]; c == nil || c.GetMetric()[0].GetCounter().GetValue() != 11 {
		t.Errorf("commits counter: %v", c)
	}
	if fams["go_goroutines"] == nil || fams["toolstackd_db_commit_duration_seconds"] == nil {
		t.Error("the Go collector or the commit histogram is missing")
	}

	// A scraper that asks for OpenMetrics gets it, ending with # EOF.
	req, _ := http.NewRequest(http.MethodGet, open.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(string(body), "# EOF\n") {
		t.Fatalf("OpenMetrics: Content-Type %q, ends %q", ct, body[max(0, len(body)-20):])
	}
}

// BenchmarkObserveCall is what every wire call pays for /metrics: a
// counter and a histogram observation under two labels.
func BenchmarkObserveCall(b *testing.B) {
	r := New()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.ObserveCall("host.get_record", "success", 42*time.Microsecond)
		}
	})
}
