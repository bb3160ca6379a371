package netguard

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// Upgrade switches the connection of a request that asked for protocol
// (HTTP/1.1 Upgrade) over to it: it answers 101 Switching Protocols and
// takes the connection over from net/http. The connection it returns
// reads first any bytes the client sent right behind its request. The
// 101 must be written within timeout; after it the connection has no
// deadline and no stall bound, unlike Transfer's: the protocol sets its
// own. The caller checks the request's headers first.
//
// When the server cannot hand the connection over (HTTP/2), the request
// is answered 505 HTTP Version Not Supported; when the connection fails,
// it is closed. Either way the error says so and nothing more is to be
// written.
func Upgrade(w http.ResponseWriter, protocol string, timeout time.Duration) (net.Conn, error) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "connection cannot be upgraded (HTTP/2?)", http.StatusHTTPVersionNotSupported)
		return nil, errors.New("netguard: the connection cannot be taken over")
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	head := Head(w, "HTTP/1.1 101 Switching Protocols", http.Header{"Upgrade": {protocol}, "Connection": {"Upgrade"}})
	if _, err := conn.Write(head); err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	if n := rw.Reader.Buffered(); n > 0 {
		pre, _ := rw.Reader.Peek(n)
		return &upgraded{Conn: conn, r: bufio.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(pre)), conn))}, nil
	}
	return conn, nil
}

// upgraded is an upgraded connection whose first bytes were read with
// the request: reads come from r.
type upgraded struct {
	net.Conn
	r *bufio.Reader
}

func (c *upgraded) Read(p []byte) (int, error) { return c.r.Read(p) }
