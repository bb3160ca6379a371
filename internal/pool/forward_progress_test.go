package pool

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/api"
)

// A forwarded call's progress crosses real HTTP on loopback as interim
// responses: the caller's sink gets each value the running side
// reports, in order, before the final response, which arrives intact
// with the handler's own headers; a report after the final response has
// started, or after the handler returned, sends nothing.
func TestForwardedProgressInterimResponses(t *testing.T) {
	reported := make(chan struct{})
	var late *progressWriter
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(headerProgress) == "" {
			http.Error(w, "no progress asked for", http.StatusBadRequest)
			return
		}
		pw := newProgressWriter(w)
		defer pw.close()
		late = pw
		sink := api.ProgressSink(api.WithProgress(r.Context(), pw.report))
		// Reports race with the handler filling its headers, as the
		// relay's goroutine does with serveJSON's.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, v := range []float64{0.1, 0.25, 0.5} {
				sink(v)
			}
		}()
		for range 100 {
			pw.Header().Set("X-Test", "handler")
		}
		wg.Wait()
		close(reported)
		pw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(pw, `{"result":"done"}`)
		pw.report(0.9) // the final response has started: dropped
	}))
	defer srv.Close()

	var mu sync.Mutex
	var got []float64
	ctx := api.WithProgress(context.Background(), func(v float64) {
		mu.Lock()
		got = append(got, v)
		mu.Unlock()
	})
	ctx, want := followProgress(ctx)
	if !want {
		t.Fatal("a context with a sink does not ask for progress")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, http.NoBody)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(headerProgress, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	<-reported
	if resp.StatusCode != http.StatusOK || string(body) != `{"result":"done"}` {
		t.Fatalf("final response %d %q", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Test") != "handler" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the handler's headers were lost: %v", resp.Header)
	}
	if resp.Header.Get(headerProgress) != "" {
		t.Fatalf("the final response carries progress: %v", resp.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[0] != 0.1 || got[1] != 0.25 || got[2] != 0.5 {
		t.Fatalf("progress seen by the caller: %v", got)
	}
	late.report(1) // after the handler returned: nothing, no panic
}

// A context without a sink forwards as before: no progress asked for.
func TestForwardedProgressNotAsked(t *testing.T) {
	ctx, want := followProgress(context.Background())
	if want || ctx != context.Background() {
		t.Fatal("progress asked for without a sink")
	}
}

// The values a host reports are trusted only within [0, 1].
func TestForwardedProgressRange(t *testing.T) {
	var got []float64
	ctx, _ := followProgress(api.WithProgress(context.Background(), func(v float64) { got = append(got, v) }))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, v := range []string{"-1", "2", "NaN", "x", "0.5"} {
			w.Header().Set(headerProgress, v)
			w.WriteHeader(statusProgress)
		}
		w.Header().Del(headerProgress)
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, http.NoBody)
	ctxTimeout, cancel := context.WithTimeout(req.Context(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctxTimeout))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if len(got) != 1 || got[0] != 0.5 {
		t.Fatalf("progress taken: %v", got)
	}
}
