package netguard

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rateConfig is a listener where only the floor rate can end a body: the
// stall timeout is far longer than any pause the tests' clients make.
func rateConfig() Config {
	cfg := fast()
	cfg.StallTimeout = time.Minute
	cfg.IdleTimeout = time.Minute
	cfg.BodyGrace = 500 * time.Millisecond
	cfg.MinBodyRate = 1024
	return cfg
}

// rateMux reads the body whole on /read (as the RPC handlers and /cli do),
// answers /early without reading it (as a refusal does) and, on /flush,
// sends its reply's header before reading (net/http then reads the body
// itself, before the handler has read a byte).
var rateMux = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/early":
		http.Error(w, "not here", http.StatusNotFound)
		return
	case "/flush":
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "got %d", len(b))
})

// trickle writes one byte to c every period until c fails or stop closes.
func trickle(c net.Conn, period time.Duration, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(period):
		}
		if _, err := c.Write([]byte("x")); err != nil {
			return
		}
	}
}

// A body that trickles in far below the floor rate, each byte well within
// the stall timeout, is cut once the grace is spent, whether the handler
// reads it, answers without reading it or sends its reply first; a body
// sent above the rate for longer than the grace is served.
func TestBodyRateAfterGrace(t *testing.T) {
	cfg := rateConfig()
	_, addr := serve(t, cfg, rateMux)
	// Cut after the 500 ms grace (and the few milliseconds its bytes buy)
	// on a quiet machine; ten times that is the bound. Before the grace
	// existed the allowance was the stall timeout, a minute here.
	bound := 10 * cfg.BodyGrace
	for _, path := range []string{"/read", "/early", "/flush"} {
		t.Run("trickled "+path, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			stop := make(chan struct{})
			defer close(stop)
			begin := time.Now()
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n", path)
			go trickle(c, 100*time.Millisecond, stop)
			closedWithin(t, c, bound)
			t.Logf("closed %v after the headers", time.Since(begin).Round(time.Millisecond))
		})
	}
	t.Run("steady", func(t *testing.T) {
		// 8 KiB a second, eight times the floor, for 2.5 s, five times the
		// grace.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const chunk, n = 400, 50
		fmt.Fprintf(c, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", chunk*n)
		for range n {
			if _, err := c.Write([]byte(strings.Repeat("y", chunk))); err != nil {
				t.Fatalf("cut while sending at eight times the floor: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if want := fmt.Sprintf("got %d", chunk*n); string(b) != want {
			t.Fatalf("reply %q, want %q", b, want)
		}
	})
}
