package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// conn is one keep-alive HTTP/1.1 connection used by one client goroutine.
// It writes prebuilt requests and reads responses with http.ReadResponse,
// so the client spends as little CPU as possible per call and every client
// (toolstackd or the baseline) sees byte-identical requests.
type conn struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
	body bytes.Buffer
}

func dial(addr string) (*conn, error) { return dialSize(addr, 16<<10) }

// dialSize connects with a read buffer of size bytes.
func dialSize(addr string, size int) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &conn{addr: addr, c: c, br: bufio.NewReaderSize(c, size)}, nil
}

func (c *conn) Close() error { return c.c.Close() }

// roundTrip sends a prebuilt request and returns the response body, valid
// until the next call on c.
func (c *conn) roundTrip(req []byte) ([]byte, error) {
	if _, err := c.c.Write(req); err != nil {
		return nil, err
	}
	return c.readResponse()
}

func (c *conn) readResponse() ([]byte, error) {
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, err
	}
	c.body.Reset()
	_, err = c.body.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %s: %.200s", resp.Status, c.body.Bytes())
	}
	if resp.Close {
		return c.body.Bytes(), errConnClosed
	}
	return c.body.Bytes(), nil
}

var errConnClosed = errors.New("server closed the connection")

// httpPost frames body as a POST request to path.
func httpPost(addr, path, ctype string, body []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: tsload\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
		path, addr, ctype, len(body))
	b.Write(body)
	return b.Bytes()
}

// Transports.
type transport int

const (
	jsonRPC transport = iota
	xmlRPC
)

func (t transport) String() string {
	if t == jsonRPC {
		return "JSON-RPC"
	}
	return "XML-RPC"
}

// request builds a complete HTTP request for method(params...) on the
// transport. Params may be string, []string, float64, int, bool or
// map[string]any / any JSON-encodable value (JSON-RPC only for maps).
func request(addr string, t transport, method string, params ...any) []byte {
	if t == jsonRPC {
		body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
		if err != nil {
			panic(err)
		}
		return httpPost(addr, "/jsonrpc", "application/json", body)
	}
	var b strings.Builder
	b.WriteString("<?xml version='1.0'?>\n<methodCall><methodName>")
	xmlEscape(&b, method)
	b.WriteString("</methodName><params>")
	for _, p := range params {
		b.WriteString("<param>")
		xmlValue(&b, p)
		b.WriteString("</param>")
	}
	b.WriteString("</params></methodCall>\n")
	return httpPost(addr, "/", "text/xml", []byte(b.String()))
}

func xmlValue(b *strings.Builder, v any) {
	b.WriteString("<value>")
	switch v := v.(type) {
	case string:
		b.WriteString("<string>")
		xmlEscape(b, v)
		b.WriteString("</string>")
	case []string:
		b.WriteString("<array><data>")
		for _, s := range v {
			xmlValue(b, s)
		}
		b.WriteString("</data></array>")
	case float64:
		b.WriteString("<double>" + strconv.FormatFloat(v, 'f', -1, 64) + "</double>")
	case int:
		b.WriteString("<int>" + strconv.Itoa(v) + "</int>")
	case bool:
		if v {
			b.WriteString("<boolean>1</boolean>")
		} else {
			b.WriteString("<boolean>0</boolean>")
		}
	default:
		panic(fmt.Sprintf("xmlValue: %T", v))
	}
	b.WriteString("</value>")
}

func xmlEscape(b *strings.Builder, s string) {
	for _, r := range s {
		switch r {
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '&':
			b.WriteString("&amp;")
		case '"':
			b.WriteString("&quot;")
		default:
			b.WriteRune(r)
		}
	}
}

// okReply is the cheap check the load loops make on every reply: a
// JSON-RPC result (not an error) or an XML-RPC Status Success.
func okReply(t transport, body []byte) bool {
	head := body[:min(len(body), 256)]
	if t == jsonRPC {
		return bytes.Contains(head, []byte(`"result":`)) && !bytes.Contains(head, []byte(`"error":`))
	}
	return bytes.Contains(head, []byte("<name>Status</name><value>Success</value>"))
}

// client is a JSON-RPC client for setup calls (login, lookups) that decodes
// replies fully.
type client struct {
	addr    string
	c       *conn
	session string
}

func newClient(addr string) (*client, error) {
	c, err := dial(addr)
	if err != nil {
		return nil, err
	}
	return &client{addr: addr, c: c}, nil
}

type rpcError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("%s %s", e.Message, e.Data) }

// call runs method(params...) over JSON-RPC and decodes the result into
// out (if not nil).
func (cl *client) call(out any, method string, params ...any) error {
	body, err := cl.c.roundTrip(request(cl.addr, jsonRPC, method, params...))
	if errors.Is(err, errConnClosed) {
		// The reply is complete; the next call needs a new connection.
		// (body lives in the old conn, which is not reused.)
		old := cl.c
		old.Close()
		if cl.c, err = dial(cl.addr); err != nil {
			return err
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	var reply struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return fmt.Errorf("%s: decoding reply: %v (%.200s)", method, err, body)
	}
	if reply.Error != nil {
		return fmt.Errorf("%s: %w", method, reply.Error)
	}
	if out != nil {
		return json.Unmarshal(reply.Result, out)
	}
	return nil
}

// rawCall returns the raw reply body of a call over either transport,
// with the time from sending to the last byte.
func rawCall(addr string, t transport, method string, params ...any) ([]byte, time.Duration, error) {
	c, err := dial(addr)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	req := request(addr, t, method, params...)
	start := time.Now()
	body, err := c.roundTrip(req)
	d := time.Since(start)
	if errors.Is(err, errConnClosed) {
		err = nil
	}
	if err == nil && !okReply(t, body) {
		err = fmt.Errorf("%s over %s: %.300s", method, t, body)
	}
	return bytes.Clone(body), d, err
}

func (cl *client) login(user, pw string) error {
	return cl.call(&cl.session, "session.login_with_password", user, pw, "1.0", "tsload")
}
