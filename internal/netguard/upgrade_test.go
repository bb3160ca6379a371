package netguard

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUpgrade switches a real loopback connection to an echo protocol:
// the 101 names the protocol, and bytes the client sent right behind its
// request reach the protocol before the later ones.
func TestUpgrade(t *testing.T) {
	errc := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := Upgrade(w, "echo/1", 5*time.Second)
		errc <- err
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(c, io.LimitReader(c, int64(len("early|late"))))
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// The request and the protocol's first bytes in one write.
	if _, err := io.WriteString(c, "POST /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo/1\r\nContent-Length: 0\r\n\r\nearly|"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "echo/1" {
		t.Fatalf("answer %s, Upgrade %q", resp.Status, resp.Header.Get("Upgrade"))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "late"); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "early|late" {
		t.Fatalf("echoed %q, want %q", got, "early|late")
	}
}

// TestUpgradeCannotTakeOver: a writer that cannot give its connection
// up (as HTTP/2's) is answered 505 and the caller told so.
func TestUpgradeCannotTakeOver(t *testing.T) {
	rec := httptest.NewRecorder()
	c, err := Upgrade(rec, "echo/1", time.Second)
	if err == nil || c != nil {
		t.Fatalf("upgraded a recorder: %v, %v", c, err)
	}
	if rec.Code != http.StatusHTTPVersionNotSupported || !strings.Contains(rec.Body.String(), "cannot be upgraded") {
		t.Fatalf("answer %d %q", rec.Code, rec.Body.String())
	}
}
