package storage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/netguard"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage/imageformat"
	"toolstackd/internal/xerr"
)

// Disk transfer over HTTP, as xapi serves it:
//
//	PUT /import_raw_vdi?session_id=&vdi=&format=raw|qcow2|vhd[&task_id=]
//	GET /export_raw_vdi?session_id=&vdi=&format=raw|qcow2|vhd[&base=][&task_id=]
//
// vdi and base are refs or uuids. Uploads may carry a Content-Length, be
// chunked, or (xapi's HTTP/1.0 clients) have neither and end when the
// client closes its side: the server answers 200 at once and reads to
// the end. A task (given, or made for the transfer) tracks progress and
// carries the outcome. Nothing is buffered whole: data moves in a few
// 4 MiB buffers.
//
// Formats: raw is the disk byte for byte. vhd is a dynamic VHD of the
// allocated blocks or, with base, a differencing VHD of the changed
// sectors (its parent is base's uuid), as xapi and Xen Orchestra's
// backups use; qcow2 is an image of the allocated (or changed) clusters.
// Importing a vhd or qcow2 writes what it carries and leaves the rest of
// the VDI as it is, so that successive deltas apply in order. Fixed VHDs
// are refused (IMPORT_ERROR): send them as raw.

func (s *Service) routes(r *mux.Router) {
	r.HandleFunc("/import_raw_vdi", s.serveImport).Methods(http.MethodPut, http.MethodPost)
	r.HandleFunc("/export_raw_vdi", s.serveExport).Methods(http.MethodGet, http.MethodHead)
}

// xferQuery is a transfer's parsed query.
type xferQuery struct {
	VDI    string
	Format string
	Base   string
	Task   string
}

// parseXferQuery checks a transfer's query parameters.
func parseXferQuery(q url.Values, export bool) (xferQuery, error) {
	x := xferQuery{VDI: q.Get("vdi"), Format: strings.ToLower(q.Get("format")), Base: q.Get("base"), Task: q.Get("task_id")}
	if x.VDI == "" {
		return x, xerr.New(xerr.InvalidValue, "vdi", "")
	}
	if !validID(x.VDI) {
		return x, xerr.New(xerr.UUIDInvalid, "VDI", clip(x.VDI, 100))
	}
	if x.Format == "" {
		x.Format = "raw"
	}
	switch x.Format {
	case "raw", "qcow2", "vhd":
	default:
		return x, xerr.New(xerr.ValueNotSupported, "format", clip(x.Format, 100), "format must be raw, vhd or qcow2")
	}
	if x.Task != "" && !strings.HasPrefix(x.Task, "OpaqueRef:") {
		return x, xerr.New(xerr.HandleInvalid, "task", clip(x.Task, 100))
	}
	if export {
		if x.Base != "" && !validID(x.Base) {
			return x, xerr.New(xerr.UUIDInvalid, "VDI", clip(x.Base, 100))
		}
		if x.Base != "" && x.Format == "raw" {
			return x, xerr.New(xerr.ValueNotSupported, "format", "raw", "a delta export (base=) needs format=vhd or qcow2: raw cannot tell unchanged blocks from zeroes")
		}
	} else if q.Get("chunked") == "true" {
		return x, xerr.New(xerr.ImportErrorCannotHandleChunked)
	}
	return x, nil
}

func validID(s string) bool {
	if strings.HasPrefix(s, "OpaqueRef:") {
		return schema.IsRef(s)
	}
	return isUUID(s)
}

// resolveVDI finds a VDI by ref or uuid.
func resolveVDI(snap db.Reader, id string) (*db.Row, error) {
	if strings.HasPrefix(id, "OpaqueRef:") {
		if r, ok := snap.Get(dm.VDI.Class, id); ok {
			return r, nil
		}
		return nil, xerr.New(xerr.HandleInvalid, "VDI", id)
	}
	if r, ok := snap.ByUUID(dm.VDI.Class, id); ok {
		return r, nil
	}
	return nil, xerr.New(xerr.UUIDInvalid, "VDI", id)
}

// writeError answers with a XenAPI error, as every HTTP handler does,
// without the host's paths (forClient).
func writeError(w http.ResponseWriter, err error) { api.WriteHTTPError(w, forClient(err)) }

// xferTask is the task of one transfer: the API's task facility, whose
// context task.cancel cancels, with progress held below 1 until the
// outcome is written.
type xferTask struct {
	*api.Task
	ref string
	// report, when set, takes the progress instead of the task (a
	// transfer that is one part of a larger piece of work).
	report func(float64)
}

// xferTask starts the transfer's task, or adopts the one the client
// made and named with task_id (only its owner, or pool-operator and
// above, may hand it over: the transfer writes its progress and outcome).
// The context it returns ends with the request or with task.cancel.
func (s *Service) xferTask(ctx context.Context, sess *api.Session, given, label string) (*xferTask, context.Context, error) {
	t, err := s.srv.TaskFor(ctx, sess, given, label)
	if err != nil {
		return nil, nil, err
	}
	return &xferTask{Task: t, ref: t.Ref}, t.Context(), nil
}

func (t *xferTask) progress(p float64) {
	if t.report != nil {
		t.report(p)
		return
	}
	t.Progress(min(p, 0.99))
}
func (t *xferTask) wasCancelled() bool { return t.Cancelled() }
func (t *xferTask) finish(err error)   { t.Finish(schema.Void, nil, forClient(err)) }

// xferRoles are the roles allowed to move disk contents: those that may
// create VDIs.
func (s *Service) xferRoles() schema.RoleSet {
	if m := s.srv.Model.Message("VDI.create"); m != nil {
		return m.Roles
	}
	return 0
}

// transferAttach attaches a VDI for a transfer under a datapath of its
// own; a writer must be the VDI's only one.
func (s *Service) transferAttach(ctx context.Context, dp, vdiRef string, write bool) (Datapath, func(), error) {
	d, err := s.Attach(ctx, dp, vdiRef, !write)
	if err != nil {
		return Datapath{}, nil, err
	}
	detach := func() {
		if err := s.Detach(context.Background(), dp, vdiRef); err != nil {
			s.log.Error("detaching after a transfer", "dp", dp, "vdi", vdiRef, "err", err)
		}
	}
	if write {
		if ws := s.writers(vdiRef); len(ws) > 1 {
			detach()
			return Datapath{}, nil, xerr.New(xerr.VDIInUse, vdiRef, "attached read-write by "+strings.Join(ws, ", "))
		}
	}
	return d, detach, nil
}

// transferDP attaches a VDI for a transfer and opens it.
func (s *Service) transferDP(ctx context.Context, dp, vdiRef string, write bool) (*device, func(), error) {
	d, detach, err := s.transferAttach(ctx, dp, vdiRef, write)
	if err != nil {
		return nil, nil, err
	}
	dev, err := openDevice(ctx, d, write, s.run)
	if err != nil {
		detach()
		return nil, nil, BackendError(smVDIUnavailable, err.Error())
	}
	return dev, func() {
		if err := dev.Close(); err != nil {
			s.log.Error("closing a transfer", "dp", dp, "err", err)
		}
		detach()
	}, nil
}

// appendable reports whether a datapath is an empty qcow2 image that an
// upload or copy can fill directly (see imageformat.Appender).
func appendable(d Datapath) bool {
	return d.Kind == "file" && d.Format == "qcow2" && !d.ReadOnly && imageformat.Appendable(d.Path)
}

// xferRequest authenticates an import or export request and reads its
// query; when either fails, the response is written and ok is false.
func (s *Service) xferRequest(w http.ResponseWriter, r *http.Request, export bool) (sess *api.Session, q xferQuery, ok bool) {
	sess = s.srv.HTTPSession(w, r, s.xferRoles())
	if sess == nil {
		return nil, q, false
	}
	q, err := parseXferQuery(r.URL.Query(), export)
	if err != nil {
		writeError(w, err)
		return nil, q, false
	}
	return sess, q, true
}

func (s *Service) serveImport(w http.ResponseWriter, r *http.Request) {
	// xapi closes the connection after an import. Saying so also lets an
	// error answered before the body is read go out at once: net/http
	// would otherwise first try to read what is left of the body, and a
	// client waiting for the answer before sending it would wait for the
	// read deadline.
	w.Header().Set("Connection", "close")
	sess, q, ok := s.xferRequest(w, r, false)
	if !ok {
		return
	}
	// An upload with no length, or Xen Orchestra's 1 PiB for "unknown"
	// (api.UnknownLength), is answered at once and read to the end of the
	// connection, as xapi does.
	toEOF := api.LegacyUpload(r)
	declared := r.ContentLength
	if toEOF {
		declared = 0
	}
	vdi, b, ok := s.importTarget(w, r, sess, q, declared)
	if !ok {
		return
	}
	rctx := r.Context()
	if toEOF {
		// Its connection is taken over below, and net/http cancels the
		// request's context when the client ends its side: the end of
		// the body, not a reason to stop.
		rctx = context.WithoutCancel(rctx)
	}
	task, ctx, err := s.xferTask(rctx, sess, q.Task, "VDI import")
	if err != nil {
		writeError(w, err)
		return
	}
	body := io.Reader(r.Body)
	var conn net.Conn
	if toEOF {
		var release func()
		if conn, body, release, ok = s.hijackUpload(ctx, w, task, vdi, q.Format); !ok {
			return
		}
		defer release()
	} else {
		w.Header().Set("Task-Id", task.ref)
	}
	err = s.importInto(ctx, task, b, vdi, q.Format, body, declared)
	if err != nil {
		s.log.Warn("VDI import failed", "vdi", vdi.UUID(), "task_ref", task.ref, "err", err)
	}
	task.finish(err)
	s.updateSRStats(context.Background(), vdi.String(dm.VDI.SR))
	if conn != nil {
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// importTarget finds the VDI an import of declared bytes writes and its
// SR, attached here, and admits the upload. When the import is not for
// this host to serve (an error, Xen Orchestra's probe, a disk on another
// host), the response is written and ok is false.
func (s *Service) importTarget(w http.ResponseWriter, r *http.Request, sess *api.Session, q xferQuery, declared int64) (*db.Row, *boundSR, bool) {
	snap := s.db.Snapshot()
	vdi, err := resolveVDI(snap, q.VDI)
	if err != nil {
		writeError(w, err)
		return nil, nil, false
	}
	if r.ContentLength == 0 && r.Header.Get("Content-Length") == "0" && q.Task == "" {
		// Xen Orchestra's probe before it streams a disk (to learn of a
		// redirect): xapi answers 200 before reading the empty body, and
		// nothing is written.
		w.WriteHeader(http.StatusOK)
		return nil, nil, false
	}
	if s.srv.ProxyHTTP(w, r, sess, forwarding.VDIHost(snap, s.srv.Cfg.HostRef, vdi.Ref)) {
		return nil, nil, false // served by the host with the disk
	}
	b, err := s.attached(vdi.String(dm.VDI.SR))
	if err != nil {
		writeError(w, err)
		return nil, nil, false
	}
	if err := s.admitImport(r.Context(), b, vdi, q.Format, declared); err != nil {
		writeError(w, err)
		return nil, nil, false
	}
	return vdi, b, true
}

// hijackUpload takes over the connection of an upload without a length
// into vdi, as xapi's protocol has it: the answer goes at once, then the
// rest of the connection is the body, which it returns once its first
// byte has come. release (stop the task's hold on the connection, then
// close it) is the caller's. When ok is false the task is finished, the
// connection closed, and there is nothing to write.
func (s *Service) hijackUpload(ctx context.Context, w http.ResponseWriter, task *xferTask, vdi *db.Row, format string) (conn net.Conn, body io.Reader, release func(), ok bool) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		task.finish(xerr.New(xerr.ImportError, "this connection cannot carry an upload without a length"))
		writeError(w, xerr.New(xerr.ImportError, "send a Content-Length or use chunked encoding"))
		return nil, nil, nil, false
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		task.finish(err)
		return nil, nil, nil, false
	}
	// A transfer that moves no byte for the stall timeout is dropped.
	// tc, not the named result conn: the returns below that fail set conn
	// to nil while the AfterFunc may be running.
	tc := netguard.Transfer(c, brw.Reader)
	conn = tc
	conn.SetDeadline(time.Time{})
	_, _ = brw.Write(netguard.Head(w, "HTTP/1.1 200 OK", http.Header{"Connection": {"close"}, "Task-Id": {task.ref}})) // sticky: the Flush reports it
	if err := brw.Flush(); err != nil {
		task.finish(err)
		_ = conn.Close()
		return nil, nil, nil, false
	}
	stop := context.AfterFunc(ctx, func() { tc.SetReadDeadline(time.Now()) })
	release = func() {
		stop()
		_ = tc.Close()
	}
	// Nothing is attached before the first byte: Xen Orchestra's
	// probe for a redirect is this same request with no data, closed
	// as soon as it is answered, while the upload itself follows on
	// another connection and must be the VDI's only writer.
	br := bufio.NewReaderSize(tc, 64<<10)
	if _, err := br.Peek(1); err != nil {
		switch {
		case errors.Is(err, io.EOF) && format == "raw":
			err = nil // an empty disk image: nothing to write
		case errors.Is(err, io.EOF):
			err = xerr.New(xerr.ImportError, "an empty upload is not a "+format+" image")
		default:
			err = s.importError(task, err, vdi.Ref)
		}
		task.finish(err)
		release()
		return nil, nil, nil, false
	}
	return conn, br, release, true
}

// admitImport checks an upload of declared bytes (0: unknown) in format
// into vdi before anything is written: the VDI writable, a raw image no
// larger than it, room in its SR, and the disk reserve (importInto
// checks that again as data arrives).
func (s *Service) admitImport(ctx context.Context, b *boundSR, vdi *db.Row, format string, declared int64) error {
	if boolField(vdi, dm.VDI.ReadOnly) {
		return xerr.New(xerr.VDIReadonly, vdi.Ref)
	}
	if format == "raw" && declared > vdiSize(vdi) {
		return xerr.New(xerr.VDITooSmall, vdi.Ref, strconv.FormatInt(declared, 10))
	}
	if declared > 0 {
		if sr, ok := s.db.Snapshot().Get(dm.SR.Class, vdi.String(dm.VDI.SR)); ok {
			if err := s.checkSpace(ctx, b, sr, declared-vdiPhys(vdi)); err != nil {
				return err
			}
		}
	}
	return s.importGuard(b, format).check(max(declared-vdiPhys(vdi), 0))
}

// vdiPhys is a VDI's physical utilisation, at least 0, so that declared
// less it (both at least 0) cannot overflow.
func vdiPhys(r *db.Row) int64 { n, _ := r.Get(dm.VDI.PhysicalUtilisation).(int64); return max(n, 0) }

// localDirer is an SR whose volumes are files in a local directory.
type localDirer interface{ localDir() string }

// importGuard watches the file systems an import into b writes to: the
// SR's directory for local SRs and, for qcow2 uploads, the spool.
func (s *Service) importGuard(b *boundSR, format string) *spaceGuard {
	var dirs []string
	if l, ok := b.sr.(localDirer); ok {
		dirs = append(dirs, l.localDir())
	}
	if format == "qcow2" {
		dirs = append(dirs, s.spoolDir())
	}
	return s.guardFor(dirs...)
}

// importInto writes an upload into a VDI. Whatever happens the VDI is
// left consistent: writes made are flushed and the image closed cleanly.
// The free space is checked as data arrives (see spaceGuard): when the
// data would eat into the disk reserve the import stops with SR_FULL,
// and an image that was empty before is emptied again.
func (s *Service) importInto(ctx context.Context, task *xferTask, b *boundSR, vdi *db.Row, format string, body io.Reader, length int64) error {
	dpName := "import/" + task.ref
	d, detach, err := s.transferAttach(ctx, dpName, vdi.Ref, true)
	if err != nil {
		return err
	}
	defer detach()
	g := s.importGuard(b, format)
	if d.Kind == "file" && d.Path != "" {
		g.dirs = append(g.dirs, filepath.Dir(d.Path))
	}
	body = g.reader(body)
	expect := length
	if expect <= 0 {
		expect = vdiSize(vdi)
	}
	progress := func(done int64) { task.progress(float64(done) / float64(max(expect, 1))) }
	var n int64
	if format == "raw" && appendable(d) {
		// An empty image: write it directly.
		a, err := imageformat.OpenAppender(d.Path)
		if err != nil {
			return BackendError(smVDIUnavailable, err.Error())
		}
		n, err = importRawSeq(ctx, body, a, progress)
		if err != nil {
			return s.importError(task, err, vdi.Ref)
		}
		s.log.Info("VDI imported", "vdi", vdi.UUID(), "format", format, "bytes", n, "direct", true)
		return nil
	}
	dev, err := openDevice(ctx, d, true, s.run)
	if err != nil {
		return BackendError(smVDIUnavailable, err.Error())
	}
	defer func() {
		if err := dev.Close(); err != nil {
			s.log.Error("closing an import", "vdi", vdi.UUID(), "err", err)
		}
	}()
	switch format {
	case "raw":
		n, err = importRaw(ctx, body, dev, progress)
	case "qcow2":
		n, err = s.importQcow2(ctx, body, dev, vdi, task)
	case "vhd":
		n, err = imageformat.ApplyVHD(ctx, body, dev.vhdTarget(), progress)
		if err != nil && !errors.As(err, new(imageformat.TooBigError)) && !isStreamErr(err) && !isSpaceErr(err) &&
			!errors.As(err, new(*xerr.Error)) && ctx.Err() == nil {
			err = xerr.New(xerr.ImportError, "VHD: "+err.Error())
		}
	}
	if ferr := flushDevice(dev); err == nil {
		err = ferr
	}
	if err != nil {
		return s.importError(task, err, vdi.Ref)
	}
	s.log.Info("VDI imported", "vdi", vdi.UUID(), "format", format, "bytes", n)
	return nil
}

func flushDevice(d *device) error {
	if d.flush != nil {
		return d.flush()
	}
	return nil
}

// importError names why an import failed: cancelled by its task, the
// client gone before the end (IMPORT_ERROR_PREMATURE_EOF), too much data,
// or the storage's own failure.
func (s *Service) importError(task *xferTask, err error, vdiRef string) error {
	var big imageformat.TooBigError
	switch {
	case errors.As(err, &big):
		return xerr.New(xerr.VDITooSmall, vdiRef, strconv.FormatInt(big.Size+1, 10))
	case isSpaceErr(err):
		return errSpace(err)
	case task.wasCancelled():
		return xerr.New(xerr.TaskCancelled, task.ref)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, context.Canceled), isTimeout(err), strings.Contains(err.Error(), "connection reset"):
		return xerr.New(xerr.ImportErrorPrematureEOF)
	}
	var xe *xerr.Error
	if errors.As(err, &xe) {
		return xe
	}
	return BackendError(smVDIUnavailable, err.Error())
}

// isStreamErr reports a failure of the connection rather than of the
// data.
func isStreamErr(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// importQcow2 applies an uploaded qcow2 image: it is spooled to a file
// (qcow2 is not laid out for streaming), checked (no backing file, no
// external data, not encrypted, no larger than the VDI), and its
// allocated clusters written into the VDI.
func (s *Service) importQcow2(ctx context.Context, body io.Reader, dev *device, vdi *db.Row, task *xferTask) (int64, error) {
	var written int64
	err := s.importQcow2Into(ctx, body, dev, vdi, task, &written)
	return written, err
}

func (s *Service) importQcow2Into(ctx context.Context, body io.Reader, dev *device, vdi *db.Row, task *xferTask, written *int64) error {
	dir := s.spoolDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("staging the upload: %w", err)
	}
	f, err := os.CreateTemp(dir, spoolPattern)
	if err != nil {
		return fmt.Errorf("staging the upload: %w", err)
	}
	defer func(name string) { _ = os.Remove(name) }(f.Name())
	defer func(c func() error) { _ = c() }(f.Close)
	limit := spoolLimit(dev.size)
	n, err := io.Copy(f, io.LimitReader(body, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return imageformat.TooBigError{Size: dev.size}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("staging the upload: %w", err)
	}
	task.progress(0.5)
	h, err := imageformat.ReadQcow2HeaderFrom(f)
	var big imageformat.SizeError
	switch {
	case errors.As(err, &big):
		return xerr.New(xerr.VDITooSmall, vdi.Ref, strconv.FormatUint(big.Size, 10))
	case err != nil:
		return xerr.New(xerr.ImportError, "the upload is not a qcow2 image: "+err.Error())
	}
	switch {
	case h.BackingFile != "":
		return xerr.New(xerr.ImportError, "the qcow2 image names a backing file; upload a self-contained image")
	case h.ExternalDataFile:
		return xerr.New(xerr.ImportError, "the qcow2 image has an external data file")
	case h.CryptMethod != 0:
		return xerr.New(xerr.ImportError, "the qcow2 image is encrypted")
	case h.Size > uint64(max(dev.size, 0)): // compared unsigned: Size need not fit an int64
		return xerr.New(xerr.VDITooSmall, vdi.Ref, strconv.FormatUint(h.Size, 10))
	}
	src, err := openQcow2Read(ctx, f.Name(), s.run)
	if err != nil {
		return xerr.New(xerr.ImportError, "the qcow2 image cannot be read: "+err.Error())
	}
	defer func(c func() error) { _ = c() }(src.Close)
	m, err := imageMap(ctx, f.Name(), "qcow2", src.size)
	if err != nil {
		return xerr.New(xerr.ImportError, "qemu-img cannot map the qcow2 image: "+err.Error())
	}
	var data []Extent
	var total int64
	for _, e := range m {
		switch {
		case !e.Present || e.Depth != 0:
		case e.Data:
			data = append(data, Extent{Offset: e.Start, Length: e.Length})
			total += e.Length
		case e.Zero && dev.zero != nil:
			if err := dev.zero(e.Start, e.Length); err != nil {
				return err
			}
		}
	}
	p := newPipeline(ctx)
	var done int64
	var mu sync.Mutex
	err = readOrdered(p.ctx, src.r, data, func(off int64, b []byte) error {
		bp := bufPool.Get().(*[]byte)
		c := (*bp)[:len(b)]
		copy(c, b)
		return p.spawn(func() error {
			defer bufPool.Put(bp)
			mu.Lock()
			done += int64(len(c))
			d := done
			*written = d
			mu.Unlock()
			task.progress(0.5 + 0.5*float64(d)/float64(max(total, 1)))
			_, err := dev.w.WriteAt(c, off)
			return err
		})
	})
	if werr := p.wait(); werr != nil {
		return werr
	}
	return err
}

// spoolLimit is the most a qcow2 upload into a disk of size bytes may
// spool: the data plus a 64th for metadata plus 64 MiB, short of
// math.MaxInt64 so that one more byte can be asked for.
func spoolLimit(size int64) int64 {
	const slack = 64 << 20
	size = max(size, 0)
	if size > (math.MaxInt64-slack-1)/65*64 {
		return math.MaxInt64 - 1
	}
	return size + size/64 + slack
}

func (s *Service) spoolDir() string {
	if s.cfg.DataDir != "" {
		return filepath.Join(s.cfg.DataDir, "storage", "spool")
	}
	return filepath.Join(os.TempDir(), "toolstackd-spool")
}

func (s *Service) serveExport(w http.ResponseWriter, r *http.Request) {
	sess, q, ok := s.xferRequest(w, r, true)
	if !ok {
		return
	}
	snap := s.db.Snapshot()
	vdi, err := resolveVDI(snap, q.VDI)
	if err != nil {
		writeError(w, err)
		return
	}
	var base *db.Row
	if q.Base != "" {
		if base, err = resolveVDI(snap, q.Base); err != nil {
			writeError(w, err)
			return
		}
	}
	if s.srv.ProxyHTTP(w, r, sess, forwarding.VDIHost(snap, s.srv.Cfg.HostRef, vdi.Ref)) {
		return // served by the host with the disk
	}
	b, err := s.attached(vdi.String(dm.VDI.SR))
	if err != nil {
		writeError(w, err)
		return
	}
	task, ctx, err := s.xferTask(r.Context(), sess, q.Task, "VDI export")
	if err != nil {
		writeError(w, err)
		return
	}
	err = s.exportFrom(ctx, w, r, task, b, vdi, base, q.Format)
	if err != nil && ctx.Err() != nil {
		err = xerr.New(xerr.TaskCancelled, "")
	}
	if err != nil {
		s.log.Warn("VDI export failed", "vdi", vdi.UUID(), "task_ref", task.ref, "err", err)
	}
	task.finish(err)
}

// headerWriter remembers whether the response has started.
type headerWriter struct {
	http.ResponseWriter
	started bool
}

func (h *headerWriter) Write(b []byte) (int, error) {
	h.started = true
	return h.ResponseWriter.Write(b)
}

func (h *headerWriter) ReadFrom(r io.Reader) (int64, error) {
	h.started = true
	if rf, ok := h.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(h.ResponseWriter, r)
}

func (s *Service) exportFrom(ctx context.Context, rw http.ResponseWriter, r *http.Request, task *xferTask, b *boundSR, vdi, base *db.Row, format string) error {
	w := &headerWriter{ResponseWriter: rw}
	fail := func(err error) error {
		if !w.started {
			writeError(rw, err)
		}
		return err
	}
	dev, done, err := s.transferDP(ctx, "export/"+task.ref, vdi.Ref, false)
	if err != nil {
		return fail(err)
	}
	defer done()
	var plan interface {
		Length() int64
		WriteTo(ctx context.Context, w io.Writer, r io.ReaderAt, readRanges imageformat.RangeReader, progress func(int64)) error
	}
	exts := dev.extents()
	if base != nil {
		if exts, err = s.changedExtents(ctx, task, b, vdi, base, dev); err != nil {
			return fail(err)
		}
	}
	var length int64
	switch format {
	case "raw":
		length = dev.size
	case "qcow2":
		plan = imageformat.PlanQcow2(dev.size, exts, base != nil)
	case "vhd":
		var parent uuid.UUID
		if base != nil {
			parent, _ = uuid.Parse(base.UUID())
		}
		id, _ := uuid.Parse(vdi.UUID())
		plan = imageformat.PlanVHD(dev.size, exts, base != nil, id, parent)
	}
	if plan != nil {
		length = plan.Length()
	}
	h := rw.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(length, 10))
	h.Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", vdi.UUID()+"."+format))
	h.Set("Task-Id", task.ref)
	rw.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return nil
	}
	progress := func(n int64) { task.progress(float64(n) / float64(max(length, 1))) }
	if plan != nil {
		err = plan.WriteTo(ctx, w, dev.r, readOrdered, progress)
	} else {
		err = exportRaw(ctx, w, dev, progress)
	}
	if err != nil {
		return BackendError(smVDIUnavailable, "export: "+err.Error())
	}
	s.log.Info("VDI exported", "vdi", vdi.UUID(), "format", format, "bytes", length, "delta", base != nil)
	return nil
}

// changedExtents finds what differs between a VDI and an older base: from
// the driver's metadata when it can tell (a shared backing chain),
// otherwise by reading and comparing both.
func (s *Service) changedExtents(ctx context.Context, task *xferTask, b *boundSR, vdi, base *db.Row, dev *device) ([]Extent, error) {
	if d, ok := b.sr.(Differ); ok && base.String(dm.VDI.SR) == vdi.String(dm.VDI.SR) {
		ext, err := d.ChangedExtents(ctx, vdi.String(dm.VDI.Location), base.String(dm.VDI.Location))
		if err == nil {
			return ext, nil
		}
		if !errors.Is(err, errNoCommonHistory) {
			return nil, asBackend(err, smVDIUnavailable)
		}
	}
	bdev, done, err := s.transferDP(ctx, "export/"+task.ref+"/base", base.Ref, false)
	if err != nil {
		return nil, err
	}
	defer done()
	return compareDevices(ctx, dev, bdev)
}

// compareDevices lists the blocks where a differs from base (and, past
// the end of base, where a has data).
func compareDevices(ctx context.Context, a, base *device) ([]Extent, error) {
	const blk = zeroBlock
	var out []Extent
	add := func(off, n int64, zero bool) {
		if k := len(out); k > 0 && out[k-1].Offset+out[k-1].Length == off && out[k-1].Zero == zero {
			out[k-1].Length += n
			return
		}
		out = append(out, Extent{Offset: off, Length: n, Zero: zero})
	}
	// Only where either side has data can they differ.
	ranges, _ := a.dataExtents()
	for _, e := range base.extents() {
		if !e.Zero && e.Offset < a.size {
			ranges = append(ranges, Extent{Offset: e.Offset, Length: min(e.Length, a.size-e.Offset)})
		}
	}
	ranges = imageformat.MergeExtents(ranges)
	bbuf := make([]byte, xferChunk)
	err := readOrdered(ctx, a.r, ranges, func(off int64, chunk []byte) error {
		n := int64(len(chunk))
		bb := bbuf[:n]
		clear(bb)
		if off < base.size {
			k := min(n, base.size-off)
			if _, err := base.r.ReadAt(bb[:k], off); err != nil {
				return err
			}
		}
		for i := int64(0); i < n; i += blk {
			j := min(i+blk, n)
			if string(chunk[i:j]) != string(bb[i:j]) {
				add(off+i, j-i, imageformat.IsZero(chunk[i:j]))
			}
		}
		return nil
	})
	return out, err
}
