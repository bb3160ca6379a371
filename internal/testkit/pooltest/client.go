package pooltest

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// Client bounds: every call has a deadline, every reply a size.
const (
	// DefaultCallTimeout bounds one call when Client.Timeout is zero and
	// the context has no earlier deadline. It is for calls that are meant
	// to be answered, a synchronous migration of a VM with its disks
	// included, on a machine busy with other work: a test that wants a
	// call to an unreachable host to fail fast sets Client.Timeout.
	DefaultCallTimeout = 60 * time.Second
	// MaxReplyBytes bounds the reply read for one call; a longer one is
	// an error, not a memory blow-up.
	MaxReplyBytes = 64 << 20
	// maxConnsPerHost bounds the connections one Client keeps to one
	// address.
	maxConnsPerHost = 16
)

// Client makes XenAPI calls to any host of a pool, with a context, a
// deadline on every call and, optionally, a fixed source address (so that
// a fault proxy sees the call coming from a given host). Use NewClient; a
// Client may be used from many goroutines.
type Client struct {
	// Timeout bounds each call; zero: DefaultCallTimeout.
	Timeout time.Duration
	// MaxReply bounds the reply of one call; zero: MaxReplyBytes.
	MaxReply int64
	// Originator is the originator of the client's logins; empty:
	// "pooltest". The daemon caps the sessions of one originator (the
	// oldest go first), so clients that log in again and again should
	// each have their own.
	Originator string
	hc         *http.Client
}

// NewClient returns a client whose connections come from source (the
// zero Addr: whatever the system picks, 127.0.0.1 on loopback).
func NewClient(source netip.Addr) *Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	if source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
	}
	tr := &http.Transport{
		DialContext:           d.DialContext,
		MaxConnsPerHost:       maxConnsPerHost,
		MaxIdleConnsPerHost:   maxConnsPerHost,
		IdleConnTimeout:       20 * time.Second, // before the daemon's default idle timeout, 30 s
		ResponseHeaderTimeout: 0,                // the call's context bounds it
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

func (c *Client) originator() string {
	if c.Originator == "" {
		return "pooltest"
	}
	return c.Originator
}

// CloseIdle closes the connections the client keeps open between calls.
func (c *Client) CloseIdle() { c.hc.CloseIdleConnections() }

func (c *Client) post(ctx context.Context, addr, path, ctype string, body []byte) ([]byte, error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", ctype)
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close() //nolint:errcheck // read below; a close error changes nothing
	limit := c.MaxReply
	if limit <= 0 {
		limit = MaxReplyBytes
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("reply over %d bytes", limit)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
	}
	return b, nil
}

// Call makes a JSON-RPC 2.0 call on addr's /jsonrpc and returns the result
// as raw JSON. A XenAPI failure is a *testdaemon.Error; any other error
// means the call was not answered as RPC (refused connection, timeout,
// reset, a reply that is not JSON-RPC).
func (c *Client) Call(ctx context.Context, addr, method string, params ...any) (json.RawMessage, error) {
	if params == nil {
		params = []any{}
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return nil, fmt.Errorf("%s: encoding the call: %w", method, err)
	}
	b, err := c.post(ctx, addr, "/jsonrpc", "application/json", body)
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", method, addr, err)
	}
	var out struct {
		Result json.RawMessage
		Error  *struct {
			Message string
			Data    []any
		}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s on %s: not a JSON-RPC reply: %v: %.200s", method, addr, err, b)
	}
	if out.Error != nil {
		e := &testdaemon.Error{Code: out.Error.Message}
		for _, p := range out.Error.Data {
			e.Params = append(e.Params, fmt.Sprint(p))
		}
		return nil, e
	}
	if out.Result == nil {
		return nil, fmt.Errorf("%s on %s: JSON-RPC reply with neither result nor error: %.200s", method, addr, b)
	}
	return out.Result, nil
}

// CallString makes a JSON-RPC call whose result is a string.
func (c *Client) CallString(ctx context.Context, addr, method string, params ...any) (string, error) {
	raw, err := c.Call(ctx, addr, method, params...)
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s on %s: result is not a string: %.200s", method, addr, raw)
	}
	return s, nil
}

// CallXML makes an XML-RPC call on addr's /RPC2 with string parameters and
// returns the Value of a successful reply when it is a string (or the
// empty string for any other type). A XenAPI failure is a
// *testdaemon.Error.
func (c *Client) CallXML(ctx context.Context, addr, method string, params ...string) (string, error) {
	var b bytes.Buffer
	b.WriteString(`<?xml version="1.0"?><methodCall><methodName>`)
	_ = xml.EscapeText(&b, []byte(method)) // a bytes.Buffer does not fail
	b.WriteString(`</methodName><params>`)
	for _, p := range params {
		b.WriteString(`<param><value><string>`)
		_ = xml.EscapeText(&b, []byte(p))
		b.WriteString(`</string></value></param>`)
	}
	b.WriteString(`</params></methodCall>`)
	reply, err := c.post(ctx, addr, "/RPC2", "text/xml", b.Bytes())
	if err != nil {
		return "", fmt.Errorf("%s on %s: %w", method, addr, err)
	}
	return decodeXMLReply(method, addr, reply)
}

// xmlValue is an XML-RPC <value>: a bare string, or one typed child.
type xmlValue struct {
	Text   string     `xml:",chardata"`
	String *string    `xml:"string"`
	Struct *xmlStruct `xml:"struct"`
	Array  *struct {
		Values []xmlValue `xml:"data>value"`
	} `xml:"array"`
}

type xmlStruct struct {
	Members []struct {
		Name  string   `xml:"name"`
		Value xmlValue `xml:"value"`
	} `xml:"member"`
}

func (v *xmlValue) str() string {
	if v.String != nil {
		return *v.String
	}
	return strings.TrimSpace(v.Text)
}

// decodeXMLReply reads the XenAPI struct {Status, Value | ErrorDescription}
// of an XML-RPC reply.
func decodeXMLReply(method, addr string, reply []byte) (string, error) {
	var resp struct {
		Value xmlValue `xml:"params>param>value"`
	}
	if err := xml.Unmarshal(reply, &resp); err != nil {
		return "", fmt.Errorf("%s on %s: reply is not XML-RPC: %v: %.200s", method, addr, err, reply)
	}
	if resp.Value.Struct == nil {
		return "", fmt.Errorf("%s on %s: reply is not a XenAPI struct: %.200s", method, addr, reply)
	}
	var status string
	var value *xmlValue
	var desc []xmlValue
	for i := range resp.Value.Struct.Members {
		m := &resp.Value.Struct.Members[i]
		switch m.Name {
		case "Status":
			status = m.Value.str()
		case "Value":
			value = &m.Value
		case "ErrorDescription":
			if m.Value.Array != nil {
				desc = m.Value.Array.Values
			}
		}
	}
	switch {
	case status == "Success" && value != nil:
		return value.str(), nil
	case status == "Failure" && len(desc) > 0:
		e := &testdaemon.Error{Code: desc[0].str()}
		for i := 1; i < len(desc); i++ {
			e.Params = append(e.Params, desc[i].str())
		}
		return "", e
	}
	return "", fmt.Errorf("%s on %s: XenAPI reply with status %q and no usable value: %.200s", method, addr, status, reply)
}

// Code is the XenAPI error code in err's chain ("" when err is not a
// XenAPI failure).
func Code(err error) string {
	if e, ok := testdaemon.AsError(err); ok {
		return e.Code
	}
	return ""
}

// NotSent reports an error that proves the request never reached a
// server: the connection could not be made.
func NotSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
