package netguard

import (
	"net/http/httptest"
	"testing"
)

func TestHeadKeepsTheHandlersHeaders(t *testing.T) {
	w := httptest.NewRecorder()
	w.Header().Set("X-Toolstackd-Pool-Proof", "proof")
	w.Header().Set("Connection", "keep-alive")
	w.Header().Set("X-Bad", "a\r\nInjected: yes")
	got := string(Head(w, "HTTP/1.1 200 OK", map[string][]string{"Connection": {"close"}, "Task-Id": {"OpaqueRef:t"}}))
	want := "HTTP/1.1 200 OK\r\nConnection: close\r\nTask-Id: OpaqueRef:t\r\nX-Bad: a  Injected: yes\r\nX-Toolstackd-Pool-Proof: proof\r\n\r\n"
	if got != want {
		t.Fatalf("Head:\n%q\nwant\n%q", got, want)
	}
}
