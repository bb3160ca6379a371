package rrdd

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/schema"
)

// The metrics HTTP endpoints, as xapi serves them (its rrdd_proxy checks
// the request and hands it to xcp-rrdd's rrdd_http_handler):
//
//	GET /rrd_updates  the xport of recent rows of the host's, VMs' and SRs' RRDs
//	GET /host_rrd     the host's whole RRD (also /host_rrds, XenCenter's old name)
//	GET /vm_rrd       a VM's whole RRD, ?uuid= (also /vm_rrds)
//	GET /sr_rrd       an SR's whole RRD, ?uuid=
//	PUT /rrd          an RRD sent from elsewhere (a VM's, following it), ?uuid=
//
// Reads need any role (xapi's _R_READ_ONLY, which is every role); PUT
// /rrd needs pool-admin (_R_POOL_ADMIN) or the pool's own authentication.
// Every answer is built in memory from a copy taken under the service's
// lock, then written with its Content-Length.
//
// Where xapi would answer 500 for a client's mistake (a start that is not
// a number, a q in an Accept header that is not one) these answer 400
// with a one-line reason, or use the default; an interval that is not a
// number, negative or over ten years is 400 too (xapi takes 0). A missing
// RRD is 404 for the host, VMs and SRs alike (xapi: 404 for a VM, 500 for
// the others). /rrd_updates for which no archive answers (no RRD
// selected at all, or a cf some selected RRD has no archive of: xapi's
// uncaught No_RRA_Available, a 500 there) is a 400 with that reason.

// MaxPutBytes bounds the body of PUT /rrd (gzip or plain XML); the
// decompressed dump is bounded by rrd.MaxXMLBytes as well.
const MaxPutBytes = 16 << 20

// maxInterval bounds /rrd_updates's interval: ten years, far beyond the
// longest archive (366 days), where every larger value gets the same
// answer.
const maxInterval = 10 * 366 * 86400

// maxFuture is how far past this host's clock a received RRD's last
// update may be: the service skips readings older than an RRD's last
// update, so one dated far ahead would stop its recording until then.
const maxFuture = time.Hour

// The content types xapi sends, exactly (no charset parameter).
const (
	mimeJSON = "application/json"
	mimeXML  = "text/xml"
)

// Role sets of xapi's http actions get_rrd_updates, get_host_rrd,
// get_vm_rrd, get_sr_rrd (_R_READ_ONLY) and put_rrd (_R_POOL_ADMIN).
var (
	readRRDRoles = api.AllRoles
	putRRDRoles  = schema.RoleSet(0).With(schema.RolePoolAdmin)
)

// httpHandlers serves the endpoints for a service.
type httpHandlers struct {
	s   *Service
	srv *api.Server
}

// routes adds the metrics endpoints to r; srv authenticates (srv.HTTPSession
// answers the client itself when the request is not authenticated) and
// resolves VM and SR uuids.
func (s *Service) routes(r *mux.Router, srv *api.Server) {
	h := &httpHandlers{s: s, srv: srv}
	r.HandleFunc("/rrd_updates", h.updates).Methods(http.MethodGet)
	for _, p := range []string{"/host_rrd", "/host_rrds"} {
		r.HandleFunc(p, h.hostRRD).Methods(http.MethodGet)
	}
	for _, p := range []string{"/vm_rrd", "/vm_rrds"} {
		r.HandleFunc(p, h.vmRRD).Methods(http.MethodGet)
	}
	r.HandleFunc("/sr_rrd", h.srRRD).Methods(http.MethodGet)
	r.HandleFunc("/rrd", h.put).Methods(http.MethodPut)
}

// updates is GET /rrd_updates.
func (h *httpHandlers) updates(w http.ResponseWriter, r *http.Request) {
	if h.srv.HTTPSession(w, r, readRRDRoles) == nil {
		return
	}
	q := r.URL.Query()
	if !q.Has("start") {
		httpBadRequest(w, "get_rrd_updates: missing the 'start' parameter")
		return
	}
	start, err := strconv.ParseInt(q.Get("start"), 10, 64)
	if err != nil {
		httpBadRequest(w, fmt.Sprintf("get_rrd_updates: start is not an integer: %.40q", q.Get("start")))
		return
	}
	var interval int64
	if v := q.Get("interval"); v != "" {
		interval, err = strconv.ParseInt(v, 10, 64)
		if err != nil || interval < 0 || interval > maxInterval {
			httpBadRequest(w, fmt.Sprintf("get_rrd_updates: interval must be a number of seconds from 0 to %d: %.40q", maxInterval, v))
			return
		}
	}
	cf := rrd.ParseCFQuery(q.Get("cf"))
	host := rrd.SelectHost(q.Get("host"))
	vms := rrd.SelectOwners(lowerUUIDs(q["vm_uuid"]), true)
	srs := rrd.SelectOwners(lowerUUIDs(q["sr_uuid"]), false)
	asJSON := prefersJSON(r)

	x, err := h.s.Export(host, vms, srs, start, interval, cf)
	switch {
	case errors.Is(err, rrd.ErrNoRRA):
		// xapi answers 500 (its handler does not catch No_RRA_Available);
		// this is the client's request, so 400 with the reason.
		http.Error(w, "get_rrd_updates: no archive answers this request (No_RRA_Available): "+
			"no RRD is selected, or a selected RRD has no archive of this cf", http.StatusBadRequest)
		return
	case err != nil:
		h.s.log.Warn("metrics: rrd_updates", "err", err)
		http.Error(w, "get_rrd_updates: "+err.Error(), http.StatusInternalServerError)
		return
	}
	var body []byte
	if asJSON {
		body = x.AppendJSON(make([]byte, 0, xportSize(x, 4)))
	} else {
		body = x.AppendXML(make([]byte, 0, xportSize(x, 7)))
	}
	w.Header().Set("Access-Control-Allow-Headers", "X-Requested-With")
	writeDump(w, asJSON, body)
}

// xportSize guesses the size of an export's encoding, with perValue
// bytes of markup around each value, so that the answer is built without
// growing its buffer again and again (a thousand VMs make 20 MB).
func xportSize(x *rrd.Xport, perValue int) int {
	n := 512
	for _, l := range x.Legend {
		n += len(l) + 20
	}
	// Values print in 3 ("0.0") to 16 characters, mostly near the top.
	n += len(x.Rows) * (40 + len(x.Legend)*(perValue+14))
	return n
}

// hostRRD is GET /host_rrd.
func (h *httpHandlers) hostRRD(w http.ResponseWriter, r *http.Request) {
	if h.srv.HTTPSession(w, r, readRRDRoles) == nil {
		return
	}
	h.dump(w, r, plugin.Owner{Kind: plugin.Host})
}

// vmRRD is GET /vm_rrd. A VM whose RRD is not here and that runs on
// another host of the pool is served by that host, as xapi redirects
// there.
func (h *httpHandlers) vmRRD(w http.ResponseWriter, r *http.Request) {
	sess := h.srv.HTTPSession(w, r, readRRDRoles)
	if sess == nil {
		return
	}
	o, ok := ownerParam(w, r, plugin.VM, "get_vm_rrd")
	if !ok {
		return
	}
	if !h.s.hasRRD(o) {
		snap := h.srv.DB.Snapshot()
		if vm, found := snap.ByUUID(dm.VM.Class, o.UUID); found &&
			h.srv.ProxyHTTP(w, r, sess, forwarding.VMHost(snap, h.srv.Cfg.HostRef, vm.Ref)) {
			return
		}
	}
	h.dump(w, r, o)
}

// srRRD is GET /sr_rrd.
func (h *httpHandlers) srRRD(w http.ResponseWriter, r *http.Request) {
	if h.srv.HTTPSession(w, r, readRRDRoles) == nil {
		return
	}
	if o, ok := ownerParam(w, r, plugin.SR, "get_sr_rrd"); ok {
		h.dump(w, r, o)
	}
}

// dump answers with the owner's whole RRD, XML or JSON: 404 when there
// is none (xapi answers 404 for a VM; for the host and an SR its handler
// fails, and the client gets 500).
func (h *httpHandlers) dump(w http.ResponseWriter, r *http.Request, o plugin.Owner) {
	rd, err := h.s.Snapshot(o)
	if err != nil {
		what := "the host"
		if o.Kind != plugin.Host {
			what = ownerName(o)
		}
		http.Error(w, "no RRD for "+what, http.StatusNotFound)
		return
	}
	asJSON := prefersJSON(r)
	var body []byte
	if asJSON {
		body = rd.AppendJSON(nil)
	} else {
		body = rd.AppendXML(nil, false)
	}
	writeDump(w, asJSON, body)
}

// hasRRD says whether the service has an RRD for the VM or SR, in memory
// or archived.
func (s *Service) hasRRD(o plugin.Owner) bool {
	s.mu.Lock()
	se, ok := s.owned[o]
	inMemory := ok && se.rrd != nil
	s.mu.Unlock()
	if ok {
		return inMemory
	}
	p, err := s.path(o.UUID)
	if err != nil {
		return false
	}
	_, err = os.Stat(p)
	return err == nil
}

// put is PUT /rrd?uuid=: the body, an rrdtool XML dump (gzip or not),
// replaces the owner's RRD. As in xapi, the database says what the uuid
// names, whatever is_host says: a VM or an SR (an extension: xapi takes
// VMs only) or this host; another host's uuid is refused with 400 (this
// host keeps only its own host RRD), and a uuid the database does not
// know gets 404. domid and archive are accepted and not used: the service
// keeps a VM's RRD in memory while the VM reports and archives it
// otherwise.
func (h *httpHandlers) put(w http.ResponseWriter, r *http.Request) {
	if h.srv.HTTPSession(w, r, putRRDRoles) == nil {
		return
	}
	q := r.URL.Query()
	if !q.Has("uuid") {
		httpBadRequest(w, "put_rrd: missing the 'uuid' parameter")
		return
	}
	uuid := q.Get("uuid")
	if err := validUUID(uuid); err != nil {
		httpBadRequest(w, "put_rrd: "+err.Error())
		return
	}
	uuid = strings.ToLower(uuid)
	o, status, reason := h.ownerOf(uuid)
	if status != 0 {
		http.Error(w, reason, status)
		return
	}
	body := &cappedBody{r: http.MaxBytesReader(w, r.Body, MaxPutBytes)}
	rd, err := rrd.Load(body)
	if err != nil {
		if body.over {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("put_rrd: body larger than %d bytes", MaxPutBytes), http.StatusRequestEntityTooLarge)
			return
		}
		httpBadRequest(w, "put_rrd: not an RRD: "+httpLine(err.Error()))
		return
	}
	if err := checkReceived(rd, time.Now()); err != nil {
		httpBadRequest(w, "put_rrd: "+err.Error())
		return
	}
	if err := h.s.Put(o, rd); err != nil {
		h.s.log.Warn("metrics: storing a received RRD", "uuid", uuid, "err", err)
		http.Error(w, "put_rrd: "+httpLine(err.Error()), http.StatusInternalServerError)
		return
	}
	h.s.log.Debug("metrics: received an RRD", "owner", ownerName(o))
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// cappedBody remembers whether a request body went over its bound,
// whatever the reader of it makes of the error.
type cappedBody struct {
	r    io.Reader
	over bool
}

func (c *cappedBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	var tooBig *http.MaxBytesError
	if err != nil && errors.As(err, &tooBig) {
		c.over = true
	}
	return n, err
}

// ownerOf is the owner a PUT's uuid names; status is not 0 when it names
// none this host keeps.
func (h *httpHandlers) ownerOf(uuid string) (o plugin.Owner, status int, reason string) {
	if strings.EqualFold(uuid, h.s.cfg.HostUUID) {
		return plugin.Owner{Kind: plugin.Host}, 0, ""
	}
	snap := h.srv.DB.Snapshot()
	if _, ok := snap.ByUUID(dm.VM.Class, uuid); ok {
		return plugin.Owner{Kind: plugin.VM, UUID: uuid}, 0, ""
	}
	if _, ok := snap.ByUUID(dm.SR.Class, uuid); ok {
		return plugin.Owner{Kind: plugin.SR, UUID: uuid}, 0, ""
	}
	if _, ok := snap.ByUUID(dm.Host.Class, uuid); ok {
		return o, http.StatusBadRequest, "put_rrd: the uuid names another host; this host keeps only its own host RRD"
	}
	return o, http.StatusNotFound, "put_rrd: invalid 'uuid' parameter: no VM, SR or host has it"
}

// checkReceived refuses an RRD the service could not continue: another
// step, more sources than an owner may have, or a last update far ahead
// of this host's clock.
func checkReceived(rd *rrd.RRD, now time.Time) error {
	if rd.Step() != int64(Step/time.Second) {
		return fmt.Errorf("the RRD's step is %d s, not %d s", rd.Step(), int64(Step/time.Second))
	}
	if n := len(rd.DSs()); n > MaxSourcesPerOwner {
		return fmt.Errorf("the RRD has %d data sources, more than %d", n, MaxSourcesPerOwner)
	}
	if lu := rd.LastUpdated(); lu > float64(now.Add(maxFuture).Unix()) {
		return fmt.Errorf("the RRD was last updated at %.0f, more than %v after this host's clock", lu, maxFuture)
	}
	return nil
}

// ownerParam reads the uuid parameter of /vm_rrd and /sr_rrd, answering
// 400 when it is missing or not a uuid.
func ownerParam(w http.ResponseWriter, r *http.Request, kind plugin.OwnerKind, action string) (plugin.Owner, bool) {
	q := r.URL.Query()
	if !q.Has("uuid") {
		httpBadRequest(w, action+": missing the 'uuid' parameter")
		return plugin.Owner{}, false
	}
	u := q.Get("uuid")
	if err := validUUID(u); err != nil {
		httpBadRequest(w, action+": "+err.Error())
		return plugin.Owner{}, false
	}
	return plugin.Owner{Kind: kind, UUID: strings.ToLower(u)}, true
}

// lowerUUIDs lowers the case of the values that are uuids, as the service
// keeps them; "all", "none" and anything else are left as they are.
func lowerUUIDs(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		if validUUID(v) == nil {
			v = strings.ToLower(v)
		}
		out[i] = v
	}
	return out
}

// writeDump answers 200 with body, its type and length, and the CORS
// header xapi sends.
func writeDump(w http.ResponseWriter, asJSON bool, body []byte) {
	hd := w.Header()
	if asJSON {
		hd["Content-Type"] = []string{mimeJSON}
	} else {
		hd["Content-Type"] = []string{mimeXML}
	}
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	hd.Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body) //nolint:gosec // text/xml or application/json that rrd encodes and escapes itself, not HTML; a client that went away needs no answer
}

func httpBadRequest(w http.ResponseWriter, reason string) {
	http.Error(w, httpLine(reason), http.StatusBadRequest)
}

// httpLine keeps a reason on one line.
func httpLine(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}

// prefersJSON is xapi's client_prefers_json: the Accept header decides
// when it parses and names application/json or text/xml (or a range
// covering them); otherwise JSON when the query has a json parameter,
// whatever its value (json=false too, as in xapi).
func prefersJSON(r *http.Request) bool {
	if v, ok := acceptPrefersJSON(r.Header.Get("Accept")); ok {
		return v
	}
	return r.URL.Query().Has("json")
}

// acceptRange is one media range of an Accept header: typ "" is */*,
// sub "" is typ/*; q is in thousandths.
type acceptRange struct {
	typ, sub string
	q        int
}

func (a acceptRange) matches(mime string) bool {
	switch {
	case a.typ == "":
		return true
	case a.sub == "":
		t, _, _ := strings.Cut(mime, "/")
		return t == a.typ
	}
	return a.typ+"/"+a.sub == mime
}

// acceptPrefersJSON reads an Accept header as xapi's Http.Accept does:
// ranges separated by commas with no white space trimmed, q in
// thousandths, no range excluded for q=0; among the ranges of the
// highest q that match JSON or XML, JSON wins a tie. ok is false when the
// header is empty, does not parse (where xapi answers 500 for a q that is
// not a number, this falls back to the json parameter), or matches
// neither.
func acceptPrefersJSON(h string) (asJSON, ok bool) {
	var ranges []acceptRange
	for _, part := range strings.Split(h, ",") {
		if part == "" {
			continue
		}
		a, good := parseAcceptRange(part)
		if !good {
			return false, false
		}
		ranges = append(ranges, a)
	}
	sort.SliceStable(ranges, func(i, j int) bool { return ranges[i].q > ranges[j].q })
	for i := 0; i < len(ranges); {
		j := i
		var js, xml bool
		for ; j < len(ranges) && ranges[j].q == ranges[i].q; j++ {
			js = js || ranges[j].matches(mimeJSON)
			xml = xml || ranges[j].matches(mimeXML)
		}
		if js || xml {
			return js, true
		}
		i = j
	}
	return false, false
}

func parseAcceptRange(s string) (acceptRange, bool) {
	fields := strings.Split(s, ";")
	ts := strings.Split(fields[0], "/")
	if len(ts) != 2 {
		return acceptRange{}, false
	}
	a := acceptRange{q: 1000}
	if ts[0] != "*" {
		a.typ = ts[0]
		if ts[1] != "*" {
			a.sub = ts[1]
		}
	}
	gotQ := false
	for _, p := range fields[1:] {
		k, v, found := strings.Cut(p, "=")
		if !found {
			return acceptRange{}, false
		}
		if k != "q" || gotQ {
			continue
		}
		gotQ = true
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e9 {
			return acceptRange{}, false
		}
		a.q = int(1000 * f)
	}
	return a, true
}
