package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A download's answer: 200 with the type, the attachment's name and the
// task, and a body only for GET.
func TestWriteDownloadHeader(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(method, "/export?uuid=x", nil)
		body := WriteDownloadHeader(w, r, "application/octet-stream", "export.xva", "OpaqueRef:task")
		if body != (method == http.MethodGet) {
			t.Errorf("%s: body %v", method, body)
		}
		h := w.Result().Header
		if w.Code != http.StatusOK || h.Get("Content-Type") != "application/octet-stream" ||
			h.Get("Content-Disposition") != `attachment; filename="export.xva"` || h.Get("Task-Id") != "OpaqueRef:task" {
			t.Errorf("%s: %d %v", method, w.Code, h)
		}
	}
}
