package pool

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"sync"

	"toolstackd/internal/api"
)

// The progress of a forwarded call.
//
// When the caller follows the call's progress (its Async task on the
// coordinator; api.ProgressSink), the coordinator asks for it with the
// headerProgress request header. The host running the call then sends,
// while it runs, interim responses (102 Processing, HTTP's 1xx
// informational responses, which come before the final one on the same
// request) each with the newest progress in headerProgress; the final
// response is the call's reply as before. The running host's relay
// (internal/api, progress.go) sends at most a few a second, the
// coordinator's task coalesces what it gets, and the request itself is
// unchanged: cancelling the coordinator's task still ends the request,
// and so the call on the host (api.Call.Forwarded).

const (
	// headerProgress asks for progress (request) and carries it (interim
	// responses), a decimal from 0 to 1.
	headerProgress = "X-Toolstackd-Progress"
	// statusProgress is the interim response that carries progress.
	statusProgress = http.StatusProcessing
)

// followProgress prepares a forwarded call's request context: when ctx
// carries a progress sink, the interim responses are read into it, and
// want says to ask for them.
func followProgress(ctx context.Context) (_ context.Context, want bool) {
	sink := api.ProgressSink(ctx)
	if sink == nil {
		return ctx, false
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code != statusProgress {
				return nil
			}
			v, err := strconv.ParseFloat(h.Get(headerProgress), 64)
			if err == nil && v >= 0 && v <= 1 {
				sink(v)
			}
			return nil
		},
	}), true
}

// progressWriter is the response of a forwarded call whose caller wants
// its progress: report sends interim responses until the handler starts
// its final response. The handler gets a header map of its own, so that
// reports from the relay's goroutine never touch the one it fills.
type progressWriter struct {
	w      http.ResponseWriter
	header http.Header

	mu   sync.Mutex
	done bool // the final response has started, or the handler returned
}

func newProgressWriter(w http.ResponseWriter) *progressWriter {
	return &progressWriter{w: w, header: http.Header{}}
}

// Header implements http.ResponseWriter.
func (pw *progressWriter) Header() http.Header { return pw.header }

// begin starts the final response: the handler's headers go out with it.
func (pw *progressWriter) begin() {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.done {
		return
	}
	pw.done = true
	h := pw.w.Header()
	h.Del(headerProgress)
	for k, v := range pw.header {
		h[k] = v
	}
}

// WriteHeader implements http.ResponseWriter.
func (pw *progressWriter) WriteHeader(code int) {
	pw.begin()
	pw.w.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (pw *progressWriter) Write(b []byte) (int, error) {
	pw.begin()
	return pw.w.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (pw *progressWriter) Unwrap() http.ResponseWriter { return pw.w }

// report sends progress v as an interim response, unless the final
// response has started.
func (pw *progressWriter) report(v float64) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if pw.done {
		return
	}
	pw.w.Header().Set(headerProgress, strconv.FormatFloat(v, 'f', 4, 64))
	pw.w.WriteHeader(statusProgress)
}

// close ends the reports: the handler has returned.
func (pw *progressWriter) close() {
	pw.mu.Lock()
	pw.done = true
	pw.mu.Unlock()
}
