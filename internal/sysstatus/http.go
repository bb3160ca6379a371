package sysstatus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Path is the endpoint of system status reports (xapi's
// Constants.system_status_uri).
const Path = "/system-status"

// reportRoles may fetch a report and upload one: xapi's _R_POOL_OP.
var reportRoles = schema.RoleSet(0).With(schema.RolePoolAdmin).With(schema.RolePoolOperator)

// Register makes a service and serves it: GET /system-status on r, and
// host.get_system_status_capabilities and host.bugreport_upload on srv.
func Register(srv *api.Server, r *mux.Router, cfg Config) *Service {
	if cfg.HostRef == "" {
		cfg.HostRef = srv.Cfg.HostRef
	}
	if cfg.Log == nil {
		cfg.Log = srv.Log
	}
	s := New(srv, cfg)
	r.HandleFunc(Path, s.serveHTTP).Methods(http.MethodGet, http.MethodHead)
	api.Register(srv, func(c *api.Call, a dm.HostGetSystemStatusCapabilitiesArgs) (string, error) {
		if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
			return "", err
		}
		return s.CapabilitiesXML(), nil
	})
	api.Register(srv, func(c *api.Call, a dm.HostBugreportUploadArgs) (dm.Void, error) {
		if _, err := c.Lookup(dm.Host.Class, string(a.Host)); err != nil {
			return dm.Void{}, err
		}
		return dm.Void{}, s.Upload(c.Ctx, a.URL, a.Options)
	})
	return s
}

// serveHTTP answers GET /system-status: the capabilities document with
// list, else a report of entries in output.
func (s *Service) serveHTTP(w http.ResponseWriter, r *http.Request) {
	sess := s.srv.HTTPSession(w, r, reportRoles)
	if sess == nil {
		return
	}
	q := r.URL.Query()
	if host := q.Get("host"); host != "" {
		ref, err := s.hostRef(host)
		if err != nil {
			s.refuse(w, r, sess, err)
			return
		}
		if s.srv.ProxyHTTP(w, r, sess, ref) {
			return
		}
	}
	if q.Has("list") {
		w.Header().Set("Content-Type", TypeXML)
		_, _ = io.WriteString(w, s.CapabilitiesXML()) // the client may have gone
		return
	}
	entries, err := s.Select(q.Get("entries"))
	if err != nil {
		s.refuse(w, r, sess, err)
		return
	}
	format, err := s.CheckFormat(q.Get("output"))
	if err != nil {
		s.refuse(w, r, sess, err)
		return
	}
	given := q.Get("task_id")
	if given != "" && !strings.HasPrefix(given, "OpaqueRef:") {
		api.WriteHTTPError(w, xerr.New(xerr.HandleInvalid, "task", clip(given)))
		return
	}
	task, err := s.srv.TaskFor(r.Context(), sess, given, "Retrieving system status")
	if err != nil {
		api.WriteHTTPError(w, err)
		return
	}
	if !api.WriteDownloadHeader(w, r, ContentType(format), s.downloadName(format), task.Ref) {
		task.Finish(schema.Void, nil, nil)
		return
	}
	err = s.Collect(task.Context(), entries, w, format)
	if err != nil && task.Cancelled() {
		err = xerr.New(xerr.TaskCancelled, task.Ref)
	}
	if err != nil {
		s.log.Warn("system status report failed", "entries", strings.Join(entries, ","), "err", err)
		if _, ok := errors.AsType[*xerr.Error](err); !ok {
			err = xerr.New(xerr.SystemStatusRetrievalFailed, err.Error())
		}
	} else {
		s.log.Info("system status report sent", "entries", strings.Join(entries, ","), "output", format)
	}
	task.Finish(schema.Void, nil, err)
}

// refuse answers a request refused before its report started and ends
// the task the client named, if any, with the same error.
func (s *Service) refuse(w http.ResponseWriter, r *http.Request, sess *api.Session, err error) {
	if ref := r.URL.Query().Get("task_id"); strings.HasPrefix(ref, "OpaqueRef:") {
		if t, terr := s.srv.AdoptTask(r.Context(), sess, ref); terr == nil {
			t.Finish(schema.Void, nil, err)
		}
	}
	api.WriteHTTPError(w, err)
}

// hostRef resolves a host= parameter: a host's ref or uuid.
func (s *Service) hostRef(v string) (string, error) {
	snap := s.srv.DB.Snapshot()
	if row, ok := snap.Get(dm.Host.Class, v); ok {
		return row.Ref, nil
	}
	if row, ok := snap.ByUUID(dm.Host.Class, v); ok {
		return row.Ref, nil
	}
	return "", xerr.New(xerr.HandleInvalid, "host", clip(v))
}

// downloadName is the file name a report is offered under, as xapi names
// it: system_status-<time>-<hostname>.<ext>.
func (s *Service) downloadName(format string) string {
	return "system_status-" + s.now().UTC().Format("20060102T150405Z") + "-" + safeName(s.hostname()) + "." + format
}

// safeName keeps letters, digits, '.', '-' and '_' of a name that goes in
// a header or a URL path.
func safeName(n string) string {
	var b strings.Builder
	for _, r := range n {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 || b.Len() > 64 {
		return "host"
	}
	return b.String()
}

// maxAnswer bounds what is read of an upload server's answer.
const maxAnswer = 64 * kib

// Upload collects the default-checked capabilities into a tar.gz and PUTs
// it to rawURL (http or https). A URL ending in '/' gets the archive's
// name appended, as curl -T does. options["http_proxy"] names a proxy
// (else the environment's, as xapi falls back to $http_proxy);
// options["output"] may ask for another format. The whole upload is
// bounded by Config.UploadTimeout and ctx.
func (s *Service) Upload(ctx context.Context, rawURL string, options map[string]string) error {
	if rawURL == "" {
		return xerr.New(xerr.InvalidValue, "url", "")
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		shown := clip(rawURL)
		if err == nil {
			shown = clip(u.Redacted())
		}
		return xerr.New(xerr.ValueNotSupported, "url", shown, "only http and https URLs are supported")
	}
	proxy := http.ProxyFromEnvironment
	if p := options["http_proxy"]; p != "" {
		pu, err := url.Parse(p)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return xerr.New(xerr.ValueNotSupported, "http_proxy", clip(RedactValue("", p)), "the proxy must be an http or https URL")
		}
		proxy = http.ProxyURL(pu)
	}
	format, err := s.CheckFormat(cmp.Or(options["output"], FormatTarGz))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.UploadTimeout)
	defer cancel()
	// Buffered in a file first, so that the upload has a length: servers
	// that store uploads (presigned URLs) refuse chunked ones.
	tmp, err := os.CreateTemp(s.cfg.TempDir, "bug-report-*")
	if err != nil {
		return xerr.New(xerr.SystemStatusRetrievalFailed, err.Error())
	}
	defer func() { _ = os.Remove(tmp.Name()); _ = tmp.Close() }() // a scratch file
	if err := s.Collect(ctx, nil, tmp, format); err != nil {
		if _, ok := errors.AsType[*xerr.Error](err); ok {
			return err
		}
		return xerr.New(xerr.SystemStatusRetrievalFailed, err.Error())
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err == nil {
		_, err = tmp.Seek(0, io.SeekStart)
	}
	if err != nil {
		return xerr.New(xerr.SystemStatusRetrievalFailed, err.Error())
	}
	if strings.HasSuffix(u.Path, "/") {
		u.Path += "bug-report-" + safeName(s.hostname()) + "-" + s.now().UTC().Format("20060102150405") + "." + format
		u.RawPath = ""
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), io.NopCloser(tmp))
	if err != nil {
		return xerr.New(xerr.InternalError, "upload: "+err.Error())
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", ContentType(format))
	client := &http.Client{Transport: &http.Transport{Proxy: proxy, TLSHandshakeTimeout: 30 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		s.log.Warn("bug report upload failed", "url", u.Redacted(), "err", err)
		return xerr.New(xerr.InternalError, "Failed to upload the bug report to "+u.Redacted()+": "+err.Error())
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer)) // only for the error message
	_ = resp.Body.Close()                                       // read what was needed
	if resp.StatusCode/100 != 2 {
		return xerr.New(xerr.InternalError, fmt.Sprintf("the upload server answered %s: %s", resp.Status,
			clip(strings.TrimSpace(string(body)))))
	}
	s.log.Info("bug report uploaded", "url", u.Redacted(), "bytes", size)
	return nil
}

func (s *Service) hostname() string {
	if s.srv != nil {
		if row, ok := s.srv.DB.Snapshot().Get(dm.Host.Class, s.cfg.HostRef); ok {
			return row.String(dm.Host.Hostname)
		}
	}
	h, _ := os.Hostname()
	return h
}
