package xenops

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"toolstackd/internal/xerr"
)

// The source's side of the wire to another pool (crosspool.go): a small
// XenAPI JSON-RPC client for the remote pool's coordinator, and the
// stream to the remote destination host's /migrate endpoint, both
// authenticated by the session the dest map carries.

const (
	// remoteCallTimeout bounds one call to the remote pool.
	remoteCallTimeout = 30 * time.Second
	// maxRemoteReply bounds a reply from the remote pool.
	maxRemoteReply = 16 << 20
	// crossPoolProtocol is the protocol /migrate upgrades to.
	crossPoolProtocol = "toolstackd-crosspool-migrate/1"
)

// remotePool is the remote pool as the dest map names it.
type remotePool struct {
	master  *url.URL // the coordinator's API, http(s)://addr[:port]/
	session string   // a session of the remote pool (dest["session_id"])
	host    string   // the destination host's ref there (dest["host"])
	port    string   // the port to assume where an address names none
	hc      *http.Client
	// tls checks the other pool's hosts over https (nil: the system's
	// roots).
	tls *tls.Config
}

// newRemotePool reads a dest map naming a host of another pool. port is
// the API port to assume when the master URL names none (pools whose
// hosts all listen on one port, as xapi's do on 80 and 443).
func newRemotePool(dest map[string]string, port string, tlsConfig *tls.Config) (*remotePool, error) {
	if dest["session_id"] == "" || dest["host"] == "" || dest["master"] == "" {
		return nil, xerr.New(xerr.InvalidValue, "dest", "the dest map needs host, session_id and master (host.migrate_receive's answer)")
	}
	u, err := url.Parse(dest["master"])
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, xerr.New(xerr.InvalidValue, "dest[master]", clipRemote(dest["master"]))
	}
	if u.Port() == "" && port != "" {
		u.Host = net.JoinHostPort(u.Hostname(), port)
	}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	// Idle connections go before a toolstackd's default idle timeout (30 s).
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2, IdleConnTimeout: 20 * time.Second,
		ResponseHeaderTimeout: remoteCallTimeout, TLSHandshakeTimeout: 10 * time.Second, TLSClientConfig: tlsConfig}
	return &remotePool{master: u, session: dest["session_id"], host: dest["host"], port: port, tls: tlsConfig,
		hc: &http.Client{Transport: tr, Timeout: remoteCallTimeout}}, nil
}

// close lets go of the client's idle connections.
func (rp *remotePool) close() { rp.hc.CloseIdleConnections() }

// call makes one JSON-RPC call with the dest map's session (added first);
// a XenAPI failure comes back as its error, an unreachable pool as
// CANNOT_CONTACT_HOST.
func (rp *remotePool) call(ctx context.Context, method string, params ...any) (json.RawMessage, error) {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": append([]any{rp.session}, params...)})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, remoteCallTimeout)
	defer cancel()
	u := *rp.master
	u.Path = "/jsonrpc"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rp.hc.Do(req)
	if err != nil {
		return nil, transportErr(rp.host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxRemoteReply))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, xerr.New(xerr.CannotContactHost, rp.host)
	}
	var reply struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Message string   `json:"message"` // the code (JSON-RPC 2.0)
			Data    []string `json:"data"`    // its parameters
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		return nil, xerr.New(xerr.InternalError, "the remote pool's reply to "+method+" is not JSON-RPC")
	}
	if reply.Error != nil {
		if reply.Error.Message == "" {
			return nil, xerr.New(xerr.InternalError, "the remote pool failed "+method+" without saying why")
		}
		return nil, xerr.New(reply.Error.Message, reply.Error.Data...)
	}
	return reply.Result, nil
}

// str is call for a string result.
func (rp *remotePool) str(ctx context.Context, method string, params ...any) (string, error) {
	raw, err := rp.call(ctx, method, params...)
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", xerr.New(xerr.InternalError, "the remote pool's answer to "+method+" is not a string")
	}
	return s, nil
}

// hostAddr is the destination host's API address: its address in the
// remote pool with the master URL's port.
func (rp *remotePool) hostAddr(ctx context.Context) (string, error) {
	a, err := rp.str(ctx, "host.get_address", rp.host)
	if err != nil {
		return "", err
	}
	port := rp.master.Port()
	if port == "" {
		port = rp.port
	}
	if port == "" {
		port = "80"
		if rp.master.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.Trim(a, "[]"), port), nil
}

// dialMigrate opens a stream to the destination host's /migrate, as the
// remote session: the HTTP request is upgraded in place. ctx bounds the
// handshake only.
func (rp *remotePool) dialMigrate(ctx context.Context, addr string) (net.Conn, error) {
	hctx, cancel := context.WithTimeout(ctx, migrateMsgTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if rp.master.Scheme == "https" {
		// The stream goes over TLS as the calls do, the host checked by
		// the same roots.
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if rp.tls != nil {
			cfg = rp.tls.Clone()
		}
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(hctx); err != nil {
			_ = conn.Close()
			return nil, err
		}
		conn = tc
	}
	stop := context.AfterFunc(hctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	q := url.Values{"session_id": {rp.session}}
	req := "POST /migrate?" + q.Encode() + " HTTP/1.1\r\nHost: " + addr +
		"\r\nConnection: Upgrade\r\nUpgrade: " + crossPoolProtocol + "\r\nContent-Length: 0\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		_ = conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		_ = conn.Close()
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return nil, xerr.New(xerr.SessionInvalid, rp.session)
		case http.StatusForbidden:
			return nil, xerr.New(xerr.RBACPermissionDenied, "VM.migrate_send", "the remote session's role may not receive a migration")
		}
		return nil, fmt.Errorf("the destination refused the migration stream: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	if !stop() {
		_ = conn.Close()
		return nil, hctx.Err()
	}
	_ = conn.SetDeadline(time.Time{})
	return &prefixConn{Conn: conn, r: br}, nil
}

// prefixConn is a connection whose first bytes were read into r.
type prefixConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// clipRemote shortens a value quoted back in an error.
func clipRemote(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// transportErr is the XenAPI error for a failed connection to the other
// pool: SSL_VERIFY_ERROR when its certificate is not trusted here (as
// xapi names it), CANNOT_CONTACT_HOST otherwise.
func transportErr(host string, err error) error {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var name x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &name) || errors.As(err, &verify) {
		return xerr.New(xerr.SSLVerifyError, err.Error())
	}
	return xerr.New(xerr.CannotContactHost, host)
}
