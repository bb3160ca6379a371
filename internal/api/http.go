package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/gorilla/mux"

	"toolstackd/internal/api/wire"
	"toolstackd/internal/xerr"
)

// Routes adds the RPC endpoints to a router: XML-RPC on POST /, /RPC2 and
// /xmlrpc; JSON-RPC 1.0 and 2.0 on POST /jsonrpc (with CORS).
func (s *Server) Routes(r *mux.Router) {
	r.HandleFunc("/jsonrpc", s.serveJSON).Methods(http.MethodPost)
	r.HandleFunc("/jsonrpc", serveOptions).Methods(http.MethodOptions)
	s.DumpRoutes(r)
	for _, p := range []string{"/", "/RPC2", "/xmlrpc"} {
		r.HandleFunc(p, s.serveXML).Methods(http.MethodPost)
	}
}

// Handler is a router with just the RPC endpoints.
func (s *Server) Handler() http.Handler {
	r := mux.NewRouter()
	s.Routes(r)
	return r
}

// TrimSlash serves h with one trailing slash dropped from the path (not
// from "/"): xapi's HTTP handlers match by prefix, and Xen Orchestra
// sends PUT /import_raw_vdi/?... and GET /export_raw_vdi/?....
func TrimSlash(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; len(p) > 1 && p[len(p)-1] == '/' {
			r2 := *r
			u := *r.URL
			u.Path = p[:len(p)-1]
			u.RawPath = ""
			r2.URL = &u
			r = &r2
		}
		h.ServeHTTP(w, r)
	})
}

// LocalHandler marks every request as coming over the local socket, whose
// callers run as the local superuser.
func LocalHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithOrigin(r.Context(), Origin{Local: true, Remote: "local"})))
	})
}

func serveOptions(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Content-Type, Accept")
	h.Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusOK)
}

// readBody reads a request body up to the limit; over it the client gets
// 413 and the connection is closed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	return readLimited(w, r, s.Cfg.MaxBodyBytes, "request body too large", "cannot read request body")
}

// readLimited reads a request body of at most limit bytes, answering 413
// (tooLarge) past it and 400 (unreadable) when reading fails.
func readLimited(w http.ResponseWriter, r *http.Request, limit int64, tooLarge, unreadable string) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		} else {
			http.Error(w, unreadable, http.StatusBadRequest)
		}
		return nil, false
	}
	return body, true
}

// WriteDownloadHeader starts the answer to a file download that task
// taskRef follows, as xapi's download handlers answer: 200, contentType,
// the body as an attachment named filename (a plain name: no quote, no
// path) and the task in Task-Id. Other headers (Content-Length) must be
// set before. It reports whether the body is to follow: false for a HEAD
// request, whose answer is then complete.
func WriteDownloadHeader(w http.ResponseWriter, r *http.Request, contentType, filename, taskRef string) bool {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Disposition", `attachment; filename="`+filename+`"`)
	h.Set("Task-Id", taskRef)
	w.WriteHeader(http.StatusOK)
	return r.Method != http.MethodHead
}

// setType sets Content-Type exactly as given: Xen Orchestra's client
// rejects a charset parameter.
func setType(w http.ResponseWriter, ct string) {
	w.Header()["Content-Type"] = []string{ct}
}

func (s *Server) serveXML(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	method, params, err := wire.DecodeXMLRequest(bytes.NewReader(body))
	if err != nil {
		setType(w, "text/xml")
		w.WriteHeader(http.StatusBadRequest)
		_ = wire.WriteXMLFault(w, 400, err.Error()) // a client that is gone needs no fault
		return
	}
	res, err := s.Dispatch(originContext(r), method, params)
	setType(w, "text/xml")
	switch {
	case err != nil:
		xe := xerr.From(err)
		err = wire.WriteXMLFailure(w, xe.Code, xe.Params)
	default:
		if u, isRaw := res.(Unwrapped); isRaw {
			err = wire.WriteXMLRaw(w, u.V)
		} else {
			err = wire.WriteXMLSuccess(w, res)
		}
	}
	if err != nil {
		s.Log.Debug("writing reply", "call", method, "err", err)
	}
}

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Access-Control-Allow-Origin", "*")
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	req, err := wire.DecodeJSONRequest(body)
	if err != nil {
		setType(w, "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = wire.WriteJSONParseFailure(w, xerr.InternalError, []string{err.Error()}) // a client that is gone needs no answer
		return
	}
	res, err := s.Dispatch(originContext(r), req.Method, req.Params)
	setType(w, "application/json")
	switch {
	case err != nil:
		xe := xerr.From(err)
		err = wire.WriteJSONFailure(w, req, xe.Code, xe.Params)
	default:
		if u, isRaw := res.(Unwrapped); isRaw {
			res = u.V
		}
		err = wire.WriteJSONSuccess(w, req, res)
	}
	if err != nil {
		s.Log.Debug("writing reply", "call", req.Method, "err", err)
	}
}

// RequestContext is the context a call made for an HTTP request runs in:
// it carries the request's origin (the local socket, or the peer's
// address, which the login limits count failures by).
func RequestContext(r *http.Request) context.Context { return originContext(r) }

// originContext keeps an origin set by LocalHandler, or records the peer.
func originContext(r *http.Request) context.Context {
	if _, ok := r.Context().Value(originKey{}).(Origin); ok {
		return r.Context()
	}
	return WithOrigin(r.Context(), Origin{Remote: r.RemoteAddr})
}
