package xe

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"toolstackd/internal/cli/proto"
	"toolstackd/internal/version"
)

// Client runs xe commands. The zero value is not usable: see New.
type Client struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment (XE_EXTRA_ARGS, TOOLSTACKD_SOCKET, ...).
	Getenv func(string) string
	// Home is where ~/.xe is looked for ("" : nowhere).
	Home string
	// Cwd resolves relative file names on the command line.
	Cwd string
	// Heartbeat is how often a long transfer sends Response Wait.
	Heartbeat time.Duration
	// Progress shows a progress bar on Stderr during transfers.
	Progress bool
	// Terminal is the console's terminal (stdin's descriptor) or nil.
	Terminal Terminal
	// Dial, when set, replaces the network: every connection (the CLI's
	// and the transfers') is made by it. For tests.
	Dial func(ctx context.Context) (net.Conn, error)

	opts  Options
	debug io.Writer
}

// New makes a client on the process's standard streams and environment.
func New() *Client {
	cwd, _ := os.Getwd()
	home, _ := os.UserHomeDir()
	cl := &Client{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Home: home, Cwd: cwd,
		Heartbeat: 300 * time.Second}
	cl.Progress = isTerminal(os.Stderr)
	if isTerminal(os.Stdin) {
		cl.Terminal = stdinTerminal{}
	}
	return cl
}

func (cl *Client) getenv(k string) string {
	if cl.Getenv == nil {
		return ""
	}
	return cl.Getenv(k)
}

// fatalError ends the client with its text on stderr and status 1.
type fatalError struct{ msg string }

func (e *fatalError) Error() string { return e.msg }

// errNotCLI is reported when the far end is not a thin-CLI server.
var errNotCLI = errors.New("not a CLI server")

// Run runs one xe command line (without the program name) and returns
// the exit status.
func (cl *Client) Run(args []string) int {
	for _, a := range args {
		if a == "-version" || a == "--version" {
			if a == "--version" {
				fmt.Fprintf(cl.Stdout, "xe %s\n", version.Version)
			}
			fmt.Fprintf(cl.Stdout, "ThinCLI protocol: %d.%d\n", proto.Major, proto.Minor)
			return 0
		}
	}
	opts, rest, err := cl.parseCommandLine(args)
	if err != nil {
		return cl.fail(err)
	}
	cl.opts = opts
	var debugBuf strings.Builder
	switch {
	case opts.Debug:
		cl.debug = cl.Stderr
	case opts.DebugOnFail:
		cl.debug = &debugBuf
	}
	if len(rest) == 0 {
		return cl.fail(&usageError{})
	}
	code, err := cl.session(rest)
	if err != nil {
		code = cl.fail(err)
	}
	if opts.DebugOnFail && code != 0 && debugBuf.Len() > 0 {
		fmt.Fprintf(cl.Stderr, "\nDebug info:\n\n%s", debugBuf.String())
	}
	return code
}

func (cl *Client) debugf(format string, args ...any) {
	if cl.debug != nil {
		fmt.Fprintf(cl.debug, format, args...)
	}
}

// usage is xe's help on its own options.
func (cl *Client) usage() {
	fmt.Fprint(cl.Stderr, "Usage: xe <command> [-s server] [-p port] ([-u username] [-pw password] or [-pwf <password file>]) "+
		"[--nossl] [--cafile file] [--no-verify] [--traceparent traceparent] <other arguments>\n\n"+
		"The commands come from the server: to list them, run\n\txe help [--all] [-s <server> -p <port>]\n")
}

// fail reports a client-side error as xe does and returns status 1 (0
// for a plain request for usage).
func (cl *Client) fail(err error) int {
	var ue *usageError
	var fe *fatalError
	var pe *permitError
	var ne *net.DNSError
	var oe *net.OpError
	switch {
	case errors.As(err, &ue):
		if ue.msg != "" {
			fmt.Fprintln(cl.Stderr, ue.msg)
			cl.usage()
			return 1
		}
		cl.usage()
		return 0
	case errors.As(err, &fe):
		fmt.Fprint(cl.Stderr, fe.msg)
	case errors.Is(err, errNotCLI):
		fmt.Fprint(cl.Stderr, "Failed to contact a running management agent.\nTry specifying a server name and port.\n")
		cl.usage()
	case errors.Is(err, proto.ErrHTTP):
		fmt.Fprint(cl.Stderr, "Server internal error.\n")
	case errors.As(err, &pe):
		fmt.Fprintf(cl.Stderr, "File not permitted: Blocked upload/download of the file %s, which was requested by the server. "+
			"The file name was not present on the command line.\n", pe.name)
	case errors.As(err, &ne):
		fmt.Fprintf(cl.Stderr, "Host '%s' not found.\n", ne.Name)
	case errors.As(err, &oe) && oe.Op == "dial":
		fmt.Fprintf(cl.Stderr, "Unable to contact server. Please check server and port settings. (%v)\n", oe.Err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		fmt.Fprint(cl.Stderr, "Lost connection to the server.\n")
	default:
		fmt.Fprintf(cl.Stderr, "Error: %v\n", err)
	}
	return 1
}

// isLoopback reports whether a server name is this host.
func isLoopback(host string) bool {
	h := strings.Trim(host, "[]")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// useTLS reports whether connections to host are TLS: they are unless
// --nossl is given or the host is this one.
func (cl *Client) useTLS(host string) bool { return !cl.opts.NoSSL && !isLoopback(host) }

func (cl *Client) port(tls bool) int {
	if cl.opts.Port != 0 {
		return cl.opts.Port
	}
	if tls {
		return 443
	}
	return 80
}

// socketPaths are where the local superuser socket may be, in order:
// TOOLSTACKD_SOCKET, DATA_DIR/xapi.sock for TOOLSTACKD_DATA_DIR and for
// the daemon's default data directories, and xapi's own path.
func (cl *Client) socketPaths() []string {
	if p := cl.getenv("TOOLSTACKD_SOCKET"); p != "" {
		return []string{p}
	}
	var out []string
	if d := cl.getenv("TOOLSTACKD_DATA_DIR"); d != "" {
		out = append(out, filepath.Join(d, "xapi.sock"))
	}
	if d := cl.getenv("XDG_STATE_HOME"); d != "" {
		out = append(out, filepath.Join(d, "toolstackd", "xapi.sock"))
	}
	if os.Geteuid() == 0 {
		out = append(out, "/var/lib/toolstackd/xapi.sock")
	}
	if cl.Home != "" {
		out = append(out, filepath.Join(cl.Home, ".local", "state", "toolstackd", "xapi.sock"))
	}
	return append(out, "/var/lib/xcp/xapi")
}

// dialCLI connects to the server: the local socket when no server was
// named and one is there, TCP otherwise (TLS unless local or --nossl).
func (cl *Client) dialCLI(ctx context.Context) (net.Conn, error) {
	if cl.Dial != nil {
		return cl.Dial(ctx)
	}
	if !cl.opts.ServerSet {
		for _, p := range cl.socketPaths() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", p)
			if err == nil {
				cl.debugf("Connected to the local socket %s\n", p)
				return c, nil
			}
		}
	}
	return cl.dialHost(ctx, cl.opts.Server, cl.useTLS(cl.opts.Server))
}

// dialHost connects to a host by TCP, with TLS or not.
func (cl *Client) dialHost(ctx context.Context, host string, useTLS bool) (net.Conn, error) {
	h := strings.Trim(host, "[]")
	addr := net.JoinHostPort(h, strconv.Itoa(cl.port(useTLS)))
	cl.debugf("Connecting to %s (TLS: %v)\n", addr, useTLS)
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !useTLS {
		return d.DialContext(ctx, "tcp", addr)
	}
	cfg, err := cl.tlsConfig(h)
	if err != nil {
		return nil, err
	}
	td := &tls.Dialer{NetDialer: d, Config: cfg}
	c, err := td.DialContext(ctx, "tcp", addr)
	if err != nil && isVerifyError(err) {
		return nil, &fatalError{fmt.Sprintf("The certificate of %s could not be verified: %v\n"+
			"Name the CA that issued it with --cafile FILE (or XE_CA_FILE), or skip the check with --no-verify.\n", addr, err)}
	}
	return c, err
}

// tlsConfig is the TLS configuration for host. Unlike xapi's xe, which
// never checks the server (its stunnel runs without verify), the
// server's certificate is checked against the system's CAs and those of
// --cafile (or $XE_CA_FILE), and must name the server; --no-verify skips
// the check (a host's first self-signed certificate).
func (cl *Client) tlsConfig(host string) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	if cl.opts.NoVerify {
		cfg.InsecureSkipVerify = true //nolint:gosec // asked for with --no-verify
		return cfg, nil
	}
	ca := cl.opts.CAFile
	if ca == "" {
		ca = cl.getenv("XE_CA_FILE")
	}
	if ca == "" {
		return cfg, nil // the system's roots
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if err := addCA(roots, ca); err != nil {
		return nil, err
	}
	cfg.RootCAs = roots
	return cfg, nil
}

// isVerifyError reports whether a TLS dial failed on the server's
// certificate.
func isVerifyError(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// session sends the command and runs the conversation.
func (cl *Client) session(args []string) (int, error) {
	ctx := context.Background()
	conn, err := cl.dialCLI(ctx)
	if err != nil {
		return 1, err
	}
	defer func(c func() error) { _ = c() }(conn.Close)
	permitted := cl.permittedFiles(args)
	body := strings.Join(append(args, "username="+cl.opts.User, "password="+cl.opts.Password), "\n")
	var req strings.Builder
	req.WriteString("POST /cli HTTP/1.0\r\n")
	fmt.Fprintf(&req, "User-agent: xe-cli/Unix/%d.%d\r\n", proto.Major, proto.Minor)
	if cl.opts.Traceparent != "" {
		fmt.Fprintf(&req, "traceparent: %s\r\n", cl.opts.Traceparent)
	}
	fmt.Fprintf(&req, "content-length: %d\r\n\r\n", len(body))
	req.WriteString(body)
	if _, err := io.WriteString(conn, req.String()); err != nil {
		return 1, err
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	major, minor, err := proto.ReadBanner(br)
	switch {
	case err == io.EOF:
		return 1, &fatalError{"Unable to contact server. Please check server and port settings.\n"}
	case errors.Is(err, proto.ErrNotCLI):
		return 1, errNotCLI
	case err != nil:
		return 1, err
	}
	cl.debugf("Server has protocol version %d.%d. Client has %d.%d\n", major, minor, proto.Major, proto.Minor)
	if major != proto.Major {
		return 1, &fatalError{fmt.Sprintf("Protocol version mismatch: Server has protocol version %d.%d. Client has %d.%d.\n"+
			"Try specifying a server name and port on the command-line.\n", major, minor, proto.Major, proto.Minor)}
	}
	c := proto.NewConn(br, conn)
	_, _ = c.W.Write(proto.Banner(proto.Major, proto.Minor)) // sticky: the Recv after reports it
	if err := c.Flush(); err != nil {
		return 1, err
	}
	s := &conversation{cl: cl, c: c, permitted: permitted, heartbeats: major*10+minor >= proto.HeartbeatVersion}
	return s.loop()
}
