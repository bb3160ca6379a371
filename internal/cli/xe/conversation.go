package xe

import (
	"bufio"
	"context"
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
	"toolstackd/internal/lineio"
)

// conversation is the client's side of one command.
type conversation struct {
	cl         *Client
	c          *proto.Conn
	permitted  map[string]bool
	heartbeats bool
}

// permitError says the server asked for a file not named on the command
// line.
type permitError struct{ name string }

func (e *permitError) Error() string { return "file not permitted: " + e.name }

// clientSideError fails a transfer: the server is told, the message is
// printed, and xe exits 1.
type clientSideError struct{ msg string }

func (e *clientSideError) Error() string { return e.msg }

// canonical is a file name as an absolute, cleaned path.
func (cl *Client) canonical(name string) string {
	if !filepath.IsAbs(name) {
		name = filepath.Join(cl.Cwd, name)
	}
	return filepath.Clean(name)
}

// permittedFiles are the files the server may read or write: the values
// of the key=value arguments, as paths. The server is trusted with
// nothing else.
func (cl *Client) permittedFiles(args []string) map[string]bool {
	out := map[string]bool{}
	for _, a := range args {
		if _, v, ok := strings.Cut(a, "="); ok && strings.TrimSpace(v) != "" {
			out[cl.canonical(v)] = true
		}
	}
	return out
}

func (s *conversation) permit(name string, cwdToo bool) error {
	p := s.cl.canonical(name)
	if s.permitted[p] || (cwdToo && p == s.cl.canonical(".")) {
		return nil
	}
	return &permitError{name}
}

// loop does what the server says until it says Exit.
func (s *conversation) loop() (int, error) {
	cl := s.cl
	for {
		m, err := s.c.Recv()
		if err != nil {
			return 1, err
		}
		cl.debugf("Read: %s\n", m)
		if m.Kind != proto.KindCommand {
			return 1, &fatalError{fmt.Sprintf("Unexpected message from server: %s\n", m)}
		}
		switch m.Tag {
		case proto.TagPrint:
			fmt.Fprintln(cl.Stdout, m.Text)
		case proto.TagPrintStderr:
			fmt.Fprint(cl.Stderr, m.Text)
		case proto.TagDebug:
			cl.debugf("debug from server: %s\n", m.Text)
		case proto.TagError:
			fmt.Fprintf(cl.Stderr, "Error code: %s\n", m.Text)
			fmt.Fprintf(cl.Stderr, "Error parameters: %s\n", strings.Join(m.Params, ", "))
		case proto.TagExit:
			return int(m.Code), nil
		case proto.TagLoad:
			if err := s.load(m.Text); err != nil {
				return 1, err
			}
		case proto.TagPrompt:
			if err := s.prompt(); err != nil {
				return 1, err
			}
		case proto.TagHTTPPut, proto.TagHTTPGet:
			err := s.transfer(m.Tag == proto.TagHTTPPut, m.Text, m.URL)
			var ce *clientSideError
			switch {
			case errors.As(err, &ce):
				s.c.Send(proto.Failed())
				s.c.Flush()
				fmt.Fprintf(cl.Stderr, "Operation failed. Error: %s\n", ce.msg)
				return 1, nil
			case err != nil:
				var pe *permitError
				if errors.As(err, &pe) {
					return 1, err
				}
				cl.debugf("transfer failed: %v\n", err)
				if err := s.c.Send(proto.Failed()); err != nil {
					return 1, err
				}
			default:
				if err := s.c.Send(proto.OK()); err != nil {
					return 1, err
				}
			}
		case proto.TagHTTPConnect:
			if err := s.connect(m.Text); err != nil {
				return 1, err
			}
		default:
			return 1, &fatalError{fmt.Sprintf("Unexpected message from server: %s\n", m)}
		}
	}
}

// load sends a file the server asked for, whole, as one chunk.
func (s *conversation) load(name string) error {
	if err := s.permit(name, false); err != nil {
		return err
	}
	f, err := os.Open(s.cl.canonical(name))
	var size int64
	if err == nil {
		var st os.FileInfo
		if st, err = f.Stat(); err == nil {
			size = st.Size()
		}
		defer func(c func() error) { _ = c() }(f.Close)
	}
	if err != nil {
		s.cl.debugf("Load %s: %v\n", name, err)
		return s.c.Send(proto.Failed())
	}
	if err := s.c.Send(proto.OK()); err != nil {
		return err
	}
	if err := s.c.WriteBlob(f, size); err != nil {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
			return &fatalError{fmt.Sprintf("Client Side error: Failed to upload file %s.\n", name)}
		}
		return err
	}
	return s.c.Flush()
}

// prompt reads a line from the user and sends it.
func (s *conversation) prompt() error {
	line, err := bufio.NewReader(s.cl.Stdin).ReadString('\n')
	if err != nil && line == "" {
		return &fatalError{"Error: no answer: standard input ended\n"}
	}
	line = strings.TrimRight(line, "\r\n")
	if err := s.c.Send(proto.Chunk(int32(len(line)))); err != nil {
		return err
	}
	_, _ = s.c.W.WriteString(line) // sticky: the Recv after reports it
	if err := s.c.Send(proto.End()); err != nil {
		return err
	}
	return s.c.Flush()
}

// dialURL connects for a transfer: a full http(s) URL names its host;
// a path goes to the server the command went to, the same way.
func (s *conversation) dialURL(ctx context.Context, url string) (net.Conn, string, error) {
	cl := s.cl
	for _, scheme := range []string{"https://", "http://"} {
		rest, ok := strings.CutPrefix(url, scheme)
		if !ok {
			continue
		}
		host, path, _ := strings.Cut(rest, "/")
		path = "/" + path
		if cl.Dial != nil {
			c, err := cl.Dial(ctx)
			return c, path, err
		}
		if h, p, err := net.SplitHostPort(host); err == nil {
			port, _ := strconv.Atoi(p)
			saved := cl.opts.Port
			cl.opts.Port = port
			c, err := cl.dialHost(ctx, h, scheme == "https://")
			cl.opts.Port = saved
			return c, path, err
		}
		c, err := cl.dialHost(ctx, host, scheme == "https://")
		return c, path, err
	}
	c, err := cl.dialCLI(ctx)
	return c, url, err
}

// httpReply is the status and headers of an HTTP reply.
type httpReply struct {
	code     int
	status   string
	location string
	length   int64
}

// maxReplyHeader bounds an HTTP reply's status line and headers
// together, as net/http's client bounds them: a server (or one that a
// redirect names) cannot make xe hold more than this for them.
const maxReplyHeader = 64 << 10

// readReply reads an HTTP reply's status line and headers.
func readReply(br *bufio.Reader) (httpReply, error) {
	r := httpReply{length: -1}
	budget := maxReplyHeader
	line, err := readHeaderLine(br, &budget)
	if err != nil {
		return r, err
	}
	r.status = line
	parts := strings.Fields(r.status)
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "HTTP/") {
		return r, fmt.Errorf("bad response from HTTP server: %q", r.status)
	}
	if r.code, err = strconv.Atoi(parts[1]); err != nil {
		return r, fmt.Errorf("bad response from HTTP server: %q", r.status)
	}
	for {
		line, err := readHeaderLine(br, &budget)
		if err != nil {
			return r, err
		}
		if line == "" {
			return r, nil
		}
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "location":
			r.location = v
		case "content-length":
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				r.length = n
			}
		}
	}
}

// readHeaderLine reads one line of a reply's head, without its line
// ending, taking its length from what *budget still allows.
func readHeaderLine(br *bufio.Reader, budget *int) (string, error) {
	line, err := lineio.ReadLine(br, *budget)
	if errors.Is(err, lineio.ErrTooLong) {
		return "", fmt.Errorf("bad response from HTTP server: status line and headers over %d bytes", maxReplyHeader)
	}
	if err != nil {
		return "", err
	}
	*budget -= len(line)
	return strings.TrimRight(string(line), "\r\n"), nil
}

// transfer uploads (put) or downloads a file over HTTP, following
// redirects, with heartbeats to the CLI server and a progress bar.
func (s *conversation) transfer(put bool, name, url string) error {
	if put {
		if err := s.permit(name, false); err != nil {
			return err
		}
	}
	for range 10 {
		next, err := s.transferOnce(put, name, url)
		if err != nil || next == "" {
			return err
		}
		url = next
	}
	return errors.New("too many redirects")
}

func (s *conversation) transferOnce(put bool, name, url string) (redirect string, err error) {
	cl := s.cl
	ctx := context.Background()
	var src *os.File
	var size int64 = -1
	if put {
		path := cl.canonical(name)
		st, err := os.Stat(path)
		if err != nil {
			return "", &clientSideError{fmt.Sprintf("file '%s' does not exist", name)}
		}
		if src, err = os.Open(path); err != nil { //nolint:gosec // the xe user's own file, opened with the user's rights
			return "", &clientSideError{err.Error()}
		}
		defer func(c func() error) { _ = c() }(src.Close)
		if st.Mode().IsRegular() {
			size = st.Size()
		}
	}
	conn, path, err := s.dialURL(ctx, url)
	if err != nil {
		return "", err
	}
	defer func(c func() error) { _ = c() }(conn.Close)
	var req string
	if put {
		cl.debugf("PUTting to path [%s]\n", path)
		req = "PUT " + path + " HTTP/1.0\r\n"
		if size >= 0 {
			req += "Content-length: " + strconv.FormatInt(size, 10) + "\r\n"
		}
	} else {
		cl.debugf("GETting path [%s]\n", path)
		req = "GET " + path + " HTTP/1.0\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		return "", err
	}
	br := bufio.NewReaderSize(conn, 1<<20)
	if put {
		return s.upload(conn, br, src, size)
	}
	reply, err := readReply(br)
	if err != nil {
		return "", err
	}
	cl.debugf("Got %s\n", reply.status)
	switch reply.code {
	case 200:
	case 302:
		if reply.location == "" {
			return "", errors.New("redirect without a location")
		}
		return reply.location, nil
	default:
		return "", fmt.Errorf("unhandled response: %s", reply.status)
	}
	var dst io.Writer
	if name == "" {
		dst = cl.Stdout
	} else {
		if err := s.permit(name, true); err != nil {
			return "", err
		}
		f, err := os.OpenFile(cl.canonical(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return "", &clientSideError{err.Error()}
		}
		defer func(c func() error) { _ = c() }(f.Close)
		dst = f
	}
	if _, err := s.copy(dst, br, reply.length); err != nil {
		return "", err
	}
	return "", nil
}

// replyOrErr is an HTTP reply read in the background.
type replyOrErr struct {
	r   httpReply
	err error
}

// upload sends a file after the PUT's headers. xapi's endpoints answer
// 200 before they read; others answer once they have read it all. So the
// reply is read alongside: the file goes out unless an early reply other
// than 200 comes, and the transfer succeeds on a 200 before or after.
func (s *conversation) upload(conn net.Conn, br *bufio.Reader, src io.Reader, size int64) (string, error) {
	cl := s.cl
	replies := make(chan replyOrErr, 1)
	go func() {
		r, err := readReply(br)
		replies <- replyOrErr{r, err}
	}()
	var early *replyOrErr
	stop := func() bool {
		if early != nil {
			return early.r.code != 200
		}
		select {
		case re := <-replies:
			early = &re
			cl.debugf("Got %s (before the end of the upload)\n", re.r.status)
			return re.err != nil || re.r.code != 200
		default:
			return false
		}
	}
	_, cerr := s.copyUntil(conn, src, size, stop)
	// Without a length the end of the data is the end of the stream.
	// With one the connection stays open both ways: a server may take a
	// half-closed connection for a client that went away.
	if cerr == nil && size < 0 && (early == nil || early.r.code == 200) {
		if tc, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite() // the reply read next reports a broken connection
		}
	}
	re := early
	if re == nil {
		got, err := s.waitReply(replies)
		if err != nil {
			return "", err
		}
		re = &got
		cl.debugf("Got %s\n", re.r.status)
	}
	switch {
	case re.err != nil:
		if cerr != nil {
			return "", cerr
		}
		return "", re.err
	case re.r.code == 302 && re.r.location != "":
		return re.r.location, nil
	case re.r.code != 200:
		return "", fmt.Errorf("unhandled response: %s", re.r.status)
	}
	return "", cerr
}

// waitReply waits for a reply, sending heartbeats meanwhile.
func (s *conversation) waitReply(replies <-chan replyOrErr) (replyOrErr, error) {
	tick := time.NewTicker(max(s.cl.Heartbeat, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case re := <-replies:
			return re, nil
		case <-tick.C:
			if s.heartbeats {
				if err := s.c.Send(proto.Wait()); err != nil {
					return replyOrErr{}, err
				}
				if err := s.c.Flush(); err != nil {
					return replyOrErr{}, err
				}
			}
		}
	}
}

// copy moves data, sending the CLI server a Wait every heartbeat
// interval and drawing the progress bar.
func (s *conversation) copy(dst io.Writer, src io.Reader, size int64) (int64, error) {
	return s.copyUntil(dst, src, size, nil)
}

// copyUntil is copy that also stops when stop says so.
func (s *conversation) copyUntil(dst io.Writer, src io.Reader, size int64, stop func() bool) (int64, error) {
	cl := s.cl
	buf := make([]byte, 1<<20)
	var bar *progressBar
	if cl.Progress {
		bar = newProgressBar(cl.Stderr, size)
		defer bar.finish()
	}
	last := time.Now()
	var done int64
	// A file to a connection goes by sendfile, a segment at a time.
	_, fromFile := src.(*os.File)
	for {
		if stop != nil && stop() {
			return done, nil
		}
		var n int
		var rerr error
		if fromFile {
			k, err := io.CopyN(dst, src, 8<<20)
			done += k
			if bar != nil {
				bar.update(done)
			}
			if err == nil && k == 0 {
				err = io.EOF
			}
			if err != nil && err != io.EOF {
				return done, err
			}
			rerr = err
		} else {
			n, rerr = src.Read(buf)
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return done, err
			}
			done += int64(n)
			if bar != nil {
				bar.update(done)
			}
		}
		if s.heartbeats && cl.Heartbeat > 0 && time.Since(last) >= cl.Heartbeat {
			if err := s.c.Send(proto.Wait()); err != nil {
				return done, err
			}
			if err := s.c.Flush(); err != nil {
				return done, err
			}
			last = time.Now()
		}
		if rerr == io.EOF {
			return done, nil
		}
		if rerr != nil {
			return done, rerr
		}
	}
}

// connect attaches the terminal to a console: the server side of the
// connection speaks raw bytes after a 200 reply. Ctrl-] detaches.
func (s *conversation) connect(url string) error {
	cl := s.cl
	conn, path, err := s.dialURL(context.Background(), url)
	if err != nil {
		fmt.Fprintln(cl.Stderr, err)
		return s.c.Send(proto.Failed())
	}
	defer func(c func() error) { _ = c() }(conn.Close)
	if _, err := io.WriteString(conn, "CONNECT "+path+" HTTP/1.0\r\ncontent-length: 0\r\n\r\n"); err != nil {
		return s.c.Send(proto.Failed())
	}
	br := bufio.NewReader(conn)
	reply, err := readReply(br)
	if err != nil {
		fmt.Fprintln(cl.Stderr, err)
		return s.c.Send(proto.Failed())
	}
	switch reply.code {
	case 200:
	case 404:
		fmt.Fprint(cl.Stderr, "Server replied with HTTP 404: the console is not available\n")
		return s.c.Send(proto.Failed())
	default:
		fmt.Fprintf(cl.Stderr, "Server said: %s\n", reply.status)
		return s.c.Send(proto.Failed())
	}
	if cl.Terminal != nil {
		restore, err := cl.Terminal.Raw()
		if err == nil {
			defer func() {
				restore()
				fmt.Fprint(cl.Stdout, "\r\n")
			}()
		}
	}
	remoteDone := make(chan struct{})
	go func() {
		_, _ = io.Copy(cl.Stdout, br) // ends when either side closes: both end the console
		close(remoteDone)
	}()
	localDone := make(chan struct{})
	go func() {
		defer close(localDone)
		buf := make([]byte, 4096)
		for {
			n, err := cl.Stdin.Read(buf)
			if i := strings.IndexByte(string(buf[:n]), 0x1d); i >= 0 {
				_, _ = conn.Write(buf[:i]) // the user is leaving the console: the connection closes next
				return
			}
			if n > 0 {
				if _, werr := conn.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	tick := time.NewTicker(max(cl.Heartbeat, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-remoteDone:
			return s.c.Send(proto.OK())
		case <-localDone:
			_ = conn.Close()
			<-remoteDone
			return s.c.Send(proto.OK())
		case <-tick.C:
			if s.heartbeats {
				s.c.Send(proto.Wait())
				s.c.Flush()
			}
		}
	}
}

// addCA adds the certificates of the PEM file at path (--cafile) to
// pool.
func addCA(pool *x509.CertPool, path string) error {
	pem, err := os.ReadFile(path) //nolint:gosec // --cafile, named by the xe user
	if err != nil {
		return err
	}
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s: no certificates", path)
	}
	return nil
}
