package conn_test

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

// TestSlowBodiesHeldToRate (issue 29, finding 10): with a stall timeout
// far longer than any pause the clients make, request bodies that trickle
// in at a byte a second to XML-RPC (POST /) and to the CLI (POST /cli) are
// cut once the body grace is spent, as the floor rate says; a body sent
// above the floor rate for longer than the grace is served; an idle
// keep-alive connection is closed after the idle timeout.
func TestSlowBodiesHeldToRate(t *testing.T) {
	const grace = time.Second
	d := start(t, 0, "--stall-timeout=1m", "--body-grace=1s", "--min-body-rate=1024", "--idle-timeout=1s")
	// A trickled body is cut about a second in on a quiet machine (the
	// grace; a byte buys a millisecond); ten times that is the bound.
	// Before the grace existed the allowance was the stall timeout, a
	// minute here.
	bound := 10 * grace
	dial := func(t *testing.T) net.Conn { return dialTo(t, d.Addr) }
	for _, path := range []string{"/", "/cli"} {
		t.Run("trickled "+path, func(t *testing.T) {
			// A few at once, each sending a byte a second.
			type slow struct {
				c     net.Conn
				begin time.Time
			}
			var conns []slow
			for range 3 {
				c := dial(t)
				begin := time.Now()
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\nContent-Length: 500\r\n\r\n", path)
				go func() {
					for range 500 {
						time.Sleep(time.Second)
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}()
				conns = append(conns, slow{c, begin})
			}
			for _, s := range conns {
				closedWithin(t, s.c, s.begin, bound)
			}
		})
	}
	t.Run("steady XML-RPC", func(t *testing.T) {
		// A login padded to 8 KiB, sent at 4 KiB a second (four times the
		// floor) over 2 s, twice the grace: served.
		c := dial(t)
		call := `<methodCall><methodName>session.login_with_password</methodName><params>` +
			`<param><value>root</value></param><param><value>` + rootPW + `</value></param></params></methodCall>`
		body := `<?xml version="1.0"?><!--` + strings.Repeat("x", 8<<10-len(call)-30) + `-->` + call
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/xml\r\nContent-Length: %d\r\n\r\n", len(body))
		for rest := body; rest != ""; {
			n := min(len(rest), 512)
			if _, err := io.WriteString(c, rest[:n]); err != nil {
				t.Fatalf("cut while sending at four times the floor: %v", err)
			}
			rest = rest[n:]
			time.Sleep(125 * time.Millisecond)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		reply, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(reply), "Success") {
			t.Fatalf("the steady call: %s %.200s", resp.Status, reply)
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		c := dial(t)
		body := `{"jsonrpc":"2.0","id":1,"method":"session.login_with_password","params":["root","` + rootPW + `"]}`
		fmt.Fprintf(c, "POST /jsonrpc HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("the call: %s close=%v", resp.Status, resp.Close)
		}
		// Closed a second after the reply on a quiet machine.
		closedWithin(t, c, time.Now(), 10*time.Second)
	})
}
