package xva

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/netguard"
	"toolstackd/internal/schema"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// Storage is what the service needs of the storage layer: a VDI's
// contents in as blocks and out as a raw stream (storage.Service).
type Storage interface {
	ImportBlocks(ctx context.Context, t *api.Task, vdiRef string, src storage.Blocks, size int64, progress func(float64)) error
	ExportRaw(ctx context.Context, t *api.Task, vdiRef string, w io.Writer, progress func(int64)) error
}

// Config configures the service.
type Config struct {
	HostRef string
	Log     *slog.Logger
	// FetchTimeout bounds how long VM.import waits for a byte from its
	// URL before giving up (default 60 s).
	FetchTimeout time.Duration
}

// Service serves /export, /export_metadata, /import and VM.import.
type Service struct {
	srv  *api.Server
	stor Storage
	cfg  Config
	log  *slog.Logger
}

// MaxDiskSize bounds a disk an archive may declare (64 TiB); the SR's
// free space bounds it further when the VDI is made.
const MaxDiskSize = 64 << 40

// Register adds the endpoints to the router and the VM.import handler to
// the API server.
func Register(srv *api.Server, r *mux.Router, stor Storage, cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 60 * time.Second
	}
	s := &Service{srv: srv, stor: stor, cfg: cfg, log: cfg.Log}
	r.HandleFunc("/export", s.serveExport).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/export_metadata", s.serveExportMetadata).Methods(http.MethodGet, http.MethodHead)
	r.HandleFunc("/import", s.serveImport).Methods(http.MethodPut, http.MethodPost)
	api.Register(srv, s.vmImport)
	return s
}

// roles: exporting and importing need what making a VM and its disks
// needs (xapi gives get_export and put_import to vm-admin).
func (s *Service) roles(msg string) schema.RoleSet {
	if m := s.srv.Model.Message(msg); m != nil {
		return m.Roles
	}
	return 0
}

// task starts the request's task, or adopts the one the client named.
func (s *Service) task(ctx context.Context, sess *api.Session, given, label string) (*api.Task, error) {
	if given != "" && !strings.HasPrefix(given, "OpaqueRef:") {
		return nil, xerr.New(xerr.HandleInvalid, "task", clip(given))
	}
	return s.srv.TaskFor(ctx, sess, given, label)
}

// refuse answers a request refused before its work started with err
// and, when the client named a task for it, ends that task with err too:
// a client whose upload the server stopped reading may only learn why
// from the task.
func (s *Service) refuse(w http.ResponseWriter, r *http.Request, sess *api.Session, err error) {
	if ref := r.URL.Query().Get("task_id"); ref != "" && strings.HasPrefix(ref, "OpaqueRef:") {
		if t, terr := s.srv.AdoptTask(r.Context(), sess, ref); terr == nil {
			t.Finish(schema.Void, nil, err)
		}
	}
	api.WriteHTTPError(w, err)
}

// caller is who the work's calls run as: the request's session, or for a
// request authenticated without one (basic authentication as root, the
// local socket) a session of the daemon's own for the local superuser.
func (s *Service) caller(sess *api.Session) (api.Caller, func(), error) {
	if sess.Ref != "" {
		// A session of this host, or the coordinator's for a request it
		// passed on (the request's context carries the caller).
		return s.srv.As(sess), func() {}, nil
	}
	if !sess.LocalSuperuser {
		return api.Caller{}, nil, xerr.New(xerr.SessionInvalid, sess.Ref)
	}
	return s.srv.InternalCaller("xva")
}

// findVM resolves the uuid= or ref= of a request.
func findVM(snap db.Reader, q map[string][]string) (*db.Row, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if ref := get("ref"); ref != "" {
		if r, ok := snap.Get(dm.VM.Class, ref); ok {
			return r, nil
		}
		return nil, xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, clip(ref))
	}
	if id := get("uuid"); id != "" {
		if r, ok := snap.ByUUID(dm.VM.Class, id); ok {
			return r, nil
		}
		return nil, xerr.New(xerr.UUIDInvalid, dm.VM.Class.Name, clip(id))
	}
	return nil, xerr.New(xerr.InvalidValue, "uuid", "")
}

func boolParam(r *http.Request, k string, def bool) bool {
	v := r.URL.Query().Get(k)
	if v == "" {
		if c, err := r.Cookie(k); err == nil {
			v = c.Value
		}
	}
	switch strings.ToLower(v) {
	case "true", "1", "yes", "on":
		return true
	case "false", "0", "no", "off":
		return false
	}
	return def
}

// exportSet is what an export carries: the header and, per disk id, the
// VDI whose contents follow.
type exportSet struct {
	header *Header
	disks  map[string]*db.Row
}

// gather builds the header of an export of vms. withDisks also lists the
// disks whose contents follow (those of the VMs' non-CD VBDs on SRs that
// are not ISO libraries); snapshots adds the VMs' snapshots' metadata.
func (s *Service) gather(snap db.Reader, vms []*db.Row, withDisks, snapshots bool) *exportSet {
	ids := map[string]string{}
	type entry struct {
		cls *schema.Class
		row *db.Row
	}
	var order []entry
	add := func(cls *schema.Class, ref string) *db.Row {
		if ref == "" || ref == schema.NullRef {
			return nil
		}
		if _, ok := ids[ref]; ok {
			return nil
		}
		row, ok := snap.Get(cls, ref)
		if !ok {
			return nil
		}
		ids[ref] = "Ref:" + strconv.Itoa(len(ids))
		order = append(order, entry{cls, row})
		return row
	}
	set := &exportSet{disks: map[string]*db.Row{}}
	var addVM func(vm *db.Row, withSnaps bool)
	addVM = func(vm *db.Row, withSnaps bool) {
		if add(dm.VM.Class, vm.Ref) == nil {
			return
		}
		for _, vbdRef := range refs(snap.Value(vm, dm.VM.VBDs)) {
			vbd := add(dm.VBD.Class, vbdRef)
			if vbd == nil {
				continue
			}
			vdi := add(dm.VDI.Class, vbd.String(dm.VBD.VDI))
			if vdi == nil {
				continue
			}
			sr := vdi.String(dm.VDI.SR)
			add(dm.SR.Class, sr)
			srRow, _ := snap.Get(dm.SR.Class, sr)
			iso := srRow != nil && srRow.String(dm.SR.ContentType) == "iso"
			if withDisks && vbd.String(dm.VBD.Type) != string(dm.VBDTypeCD) && !iso {
				set.disks[ids[vdi.Ref]] = vdi
			}
		}
		for _, vifRef := range refs(snap.Value(vm, dm.VM.VIFs)) {
			if vif := add(dm.VIF.Class, vifRef); vif != nil {
				add(dm.Network.Class, vif.String(dm.VIF.Network))
			}
		}
		if withSnaps {
			for _, sn := range refs(snap.Value(vm, dm.VM.Snapshots)) {
				if r, ok := snap.Get(dm.VM.Class, sn); ok {
					addVM(r, false)
				}
			}
		}
	}
	for _, vm := range vms {
		addVM(vm, snapshots)
	}
	h := &Header{Version: ThisVersion(s.hostname(snap))}
	for _, e := range order {
		rec := snapshotOf(snap, e.cls, e.row, ids)
		if e.cls == dm.VM.Class {
			// An exported VM is halted, with no domain or operations.
			rec["power_state"] = string(dm.VMPowerStateHalted)
			rec["resident_on"] = schema.NullRef
			rec["current_operations"] = map[string]any{}
			rec["allowed_operations"] = []any{}
			rec["domid"] = int64(-1)
			if !snapshots {
				// Without the snapshots' metadata a snapshot goes out as
				// what it is made of, a template (xapi's
				// with_snapshot_metadata=false).
				rec["is_a_snapshot"] = false
				rec["snapshot_of"] = schema.NullRef
				rec["parent"] = schema.NullRef
				rec["snapshots"] = []any{}
				rec["snapshot_time"] = time.Unix(0, 0).UTC()
				rec["transportable_snapshot_id"] = ""
			}
		}
		for _, k := range []string{"current_operations", "allowed_operations"} {
			if _, ok := rec[k]; ok {
				if _, isMap := rec[k].(map[string]any); isMap {
					rec[k] = map[string]any{}
				} else {
					rec[k] = []any{}
				}
			}
		}
		if e.cls == dm.VBD.Class || e.cls == dm.VIF.Class {
			rec["currently_attached"] = false
		}
		h.Objects = append(h.Objects, Object{Class: e.cls.Name, ID: ids[e.row.Ref], Snapshot: rec})
	}
	set.header = h
	return set
}

func (s *Service) hostname(snap db.Reader) string {
	if h, ok := snap.Get(dm.Host.Class, s.cfg.HostRef); ok {
		return h.String(dm.Host.Hostname)
	}
	name, _ := os.Hostname()
	return name
}

func refs(v any) []string { xs, _ := v.([]string); return xs }

func (s *Service) serveExport(w http.ResponseWriter, r *http.Request) {
	sess := s.srv.HTTPSession(w, r, s.roles("VM.clone"))
	if sess == nil {
		return
	}
	snap := s.srv.DB.Snapshot()
	vm, err := findVM(snap, r.URL.Query())
	if err != nil {
		s.refuse(w, r, sess, err)
		return
	}
	set := s.gather(snap, []*db.Row{vm}, true, false)
	// The disks are read where their SR is plugged.
	for _, vdi := range set.disks {
		if s.srv.ProxyHTTP(w, r, sess, forwarding.VDIHost(snap, s.cfg.HostRef, vdi.Ref)) {
			return
		}
		break
	}
	if ps := vm.String(dm.VM.PowerState); ps != string(dm.VMPowerStateHalted) {
		s.refuse(w, r, sess, xerr.New(xerr.VMBadPowerState, vm.Ref, strings.ToLower(string(dm.VMPowerStateHalted)), strings.ToLower(ps)))
		return
	}
	comp := ParseCompression(r.URL.Query().Get("use_compression"))
	task, err := s.task(r.Context(), sess, r.URL.Query().Get("task_id"), "VM.export")
	if err != nil {
		api.WriteHTTPError(w, err)
		return
	}
	if !api.WriteDownloadHeader(w, r, "application/octet-stream", "export.xva", task.Ref) {
		task.Finish(schema.Void, nil, nil)
		return
	}
	err = s.Export(task.Context(), task, w, set, comp)
	if err != nil && task.Cancelled() {
		err = xerr.New(xerr.TaskCancelled, task.Ref)
	}
	if err != nil {
		s.log.Warn("VM export failed", "vm", vm.UUID(), "task_ref", task.Ref, "err", err)
	} else {
		s.log.Info("VM exported", "vm", vm.UUID(), "disks", len(set.disks), "compression", string(comp))
	}
	task.Finish(schema.Void, nil, err)
}

// Export writes an archive of set to w: ova.xml, then the disks in the
// order of their ids.
func (s *Service) Export(ctx context.Context, task *api.Task, w io.Writer, set *exportSet, comp Compression) error {
	xw, err := NewWriter(w, comp)
	if err != nil {
		return err
	}
	if err := xw.WriteHeader(set.header); err != nil {
		return err
	}
	ids := make([]string, 0, len(set.disks))
	var total, done int64
	for id, vdi := range set.disks {
		ids = append(ids, id)
		total += vdiSize(vdi)
	}
	DiskOrder(ids)
	for _, id := range ids {
		vdi := set.disks[id]
		size := vdiSize(vdi)
		dw := xw.Disk(id, size)
		base := done
		err := s.stor.ExportRaw(ctx, task, vdi.Ref, dw, func(n int64) {
			task.Progress(min(float64(base+n)/float64(max(total, 1)), 0.99))
		})
		if err == nil {
			err = dw.Close()
		}
		if err != nil {
			return err
		}
		done += size
	}
	return xw.Close()
}

func vdiSize(r *db.Row) int64 { n, _ := r.Get(dm.VDI.VirtualSize).(int64); return n }

// serveExportMetadata writes an archive with ova.xml alone: one VM
// (uuid= or ref=) or, with all=true, every VM but the default templates
// (and the control domain unless include_dom0=true, the default).
// export_snapshots (default true) adds the VMs' snapshots.
// include_vhd_parents and excluded_device_types are accepted and have no
// effect: there are no parent disks to name, and every device is written.
func (s *Service) serveExportMetadata(w http.ResponseWriter, r *http.Request) {
	sess := s.srv.HTTPSession(w, r, s.roles("VM.clone"))
	if sess == nil {
		return
	}
	snap := s.srv.DB.Snapshot()
	var vms []*db.Row
	if boolParam(r, "all", false) {
		dom0 := boolParam(r, "include_dom0", true)
		snap.Ascend(dm.VM.Class, func(vm *db.Row) bool {
			isTrue := func(f *schema.Field) bool { b, _ := vm.Get(f).(bool); return b }
			oc, _ := vm.Get(dm.VM.OtherConfig).(map[string]string)
			switch {
			case isTrue(dm.VM.IsDefaultTemplate), isTrue(dm.VM.IsATemplate) && oc["default_template"] == "true":
			case isTrue(dm.VM.IsControlDomain) && !dom0:
			case isTrue(dm.VM.IsASnapshot):
			default:
				vms = append(vms, vm)
			}
			return true
		})
	} else {
		vm, err := findVM(snap, r.URL.Query())
		if err != nil {
			s.refuse(w, r, sess, err)
			return
		}
		vms = append(vms, vm)
	}
	task, err := s.task(r.Context(), sess, r.URL.Query().Get("task_id"), "VM.export_metadata")
	if err != nil {
		api.WriteHTTPError(w, err)
		return
	}
	set := s.gather(snap, vms, false, boolParam(r, "export_snapshots", true))
	// Written whole into memory first (it is bounded by the database) so
	// that the length is known, as xapi sends it.
	var buf strings.Builder
	xw, err := NewWriter(&sbWriter{&buf}, None)
	if err == nil {
		err = xw.WriteHeader(set.header)
	}
	if err == nil {
		err = xw.Close()
	}
	if err != nil {
		task.Finish(schema.Void, nil, err)
		api.WriteHTTPError(w, err)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	if api.WriteDownloadHeader(w, r, "application/octet-stream", "export.xva", task.Ref) {
		_, err = io.WriteString(w, buf.String())
	}
	task.Finish(schema.Void, nil, err)
}

type sbWriter struct{ b *strings.Builder }

func (w *sbWriter) Write(p []byte) (int, error) { return w.b.Write(p) }

// ImportOptions are an import's parameters.
type ImportOptions struct {
	SR          string // the SR the disks go to; "" for the pool's default SR
	FullRestore bool   // accepted; the VM gets a new uuid all the same
	Force       bool   // import blocks whose checksums fail
}

func (s *Service) serveImport(w http.ResponseWriter, r *http.Request) {
	sess := s.srv.HTTPSession(w, r, s.roles("VM.import"))
	if sess == nil {
		return
	}
	q := r.URL.Query()
	opts, ok := s.importOptions(w, r, sess, q)
	if !ok {
		return
	}
	legacy := api.LegacyUpload(r)
	rctx := r.Context()
	if legacy {
		// The connection is taken over below; its end is the body's end.
		rctx = context.WithoutCancel(rctx)
	}
	task, err := s.task(rctx, sess, q.Get("task_id"), "VM.import")
	if err != nil {
		api.WriteHTTPError(w, err)
		return
	}
	ctx := task.Context()
	body := io.Reader(r.Body)
	var conn net.Conn
	unwatch := func() bool { return false }
	if legacy {
		var release func()
		if conn, release, ok = hijackImport(ctx, w, task); !ok {
			return
		}
		defer release()
		body = conn
	} else {
		w.Header().Set("Task-Id", task.Ref)
		// A read of the body waits for the client whatever the context
		// says: a cancelled task ends it.
		rc := http.NewResponseController(w)
		unwatch = context.AfterFunc(ctx, func() { _ = rc.SetReadDeadline(time.Now()) })
	}
	caller, end, err := s.caller(sess)
	if err != nil {
		unwatch()
		task.Finish(schema.Void, nil, err)
		if conn == nil {
			api.WriteHTTPError(w, err)
		}
		return
	}
	defer end()
	vms, err := s.Import(ctx, caller, task, body, opts)
	unwatch() // finishing the task ends its context: the connection lives on
	s.finishImport(task, vms, err)
	if conn != nil {
		return
	}
	if err != nil {
		api.WriteHTTPError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// importOptions reads an import's options from its query q, its SR
// resolved (sr_id, sr_uuid, else the pool's default SR). When the import
// is not for this host to serve (an error, a probe before the upload,
// an SR plugged on another host), the response is written and ok is
// false.
func (s *Service) importOptions(w http.ResponseWriter, r *http.Request, sess *api.Session, q url.Values) (ImportOptions, bool) {
	snap := s.srv.DB.Snapshot()
	opts := ImportOptions{FullRestore: boolParam(r, "restore", false), Force: boolParam(r, "force", false)}
	switch {
	case q.Get("sr_id") != "":
		opts.SR = q.Get("sr_id")
	case q.Get("sr_uuid") != "":
		row, ok := snap.ByUUID(dm.SR.Class, q.Get("sr_uuid"))
		if !ok {
			s.refuse(w, r, sess, xerr.New(xerr.UUIDInvalid, dm.SR.Class.Name, clip(q.Get("sr_uuid"))))
			return opts, false
		}
		opts.SR = row.Ref
	}
	sr, err := s.targetSR(snap, opts.SR)
	if err != nil {
		s.refuse(w, r, sess, err)
		return opts, false
	}
	opts.SR = sr
	// The disks are written where the SR is plugged.
	if s.srv.ProxyHTTP(w, r, sess, srHost(snap, s.cfg.HostRef, sr)) {
		return opts, false
	}
	if r.ContentLength == 0 && r.Header.Get("Content-Length") == "0" && q.Get("task_id") == "" {
		w.WriteHeader(http.StatusOK) // a probe before the upload, as for /import_raw_vdi
		return opts, false
	}
	return opts, true
}

// hijackImport takes over the connection of an upload without a length,
// as xapi's protocol has it: the answer goes at once, and the rest of the
// connection is the body. release (stop the task's hold on the
// connection, then close it) is the caller's. When ok is false the task
// is finished, the connection closed, and there is nothing to write.
func hijackImport(ctx context.Context, w http.ResponseWriter, task *api.Task) (conn net.Conn, release func(), ok bool) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		err := xerr.New(xerr.ImportError, "send a Content-Length or use chunked encoding")
		task.Finish(schema.Void, nil, err)
		api.WriteHTTPError(w, err)
		return nil, nil, false
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		task.Finish(schema.Void, nil, err)
		return nil, nil, false
	}
	conn = netguard.Transfer(c, brw.Reader)
	_ = conn.SetDeadline(time.Time{})                                                                                  // the stall guard of netguard.Transfer remains
	_, _ = brw.Write(netguard.Head(w, "HTTP/1.1 200 OK", http.Header{"Connection": {"close"}, "Task-Id": {task.Ref}})) // sticky: Flush reports it
	if err := brw.Flush(); err != nil {
		task.Finish(schema.Void, nil, err)
		_ = conn.Close()
		return nil, nil, false
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	return conn, func() {
		stop()
		_ = conn.Close()
	}, true
}

// finishImport writes an import's outcome to its task: the new VMs.
func (s *Service) finishImport(task *api.Task, vms []string, err error) {
	if err != nil && task.Cancelled() {
		err = xerr.New(xerr.TaskCancelled, task.Ref)
	}
	var rt *schema.Type
	if m := s.srv.Model.Message("VM.import"); m != nil {
		rt = m.Result
	}
	if err != nil || rt == nil {
		task.Finish(schema.Void, nil, err)
		return
	}
	task.Finish(rt, vms, nil)
}

// targetSR is the SR an import's disks go to: the one asked for, else the
// pool's default SR.
func (s *Service) targetSR(snap db.Reader, sr string) (string, error) {
	if sr == "" {
		for _, p := range snap.All(dm.Pool.Class) {
			sr = p.String(dm.Pool.DefaultSR)
		}
		if _, ok := snap.Get(dm.SR.Class, sr); !ok {
			return "", xerr.New(xerr.DefaultSRNotFound, orNull(sr))
		}
	}
	row, ok := snap.Get(dm.SR.Class, sr)
	if !ok {
		return "", xerr.New(xerr.HandleInvalid, dm.SR.Class.Name, clip(sr))
	}
	if row.String(dm.SR.ContentType) == "iso" {
		return "", xerr.New(xerr.SROperationNotSupported, sr)
	}
	return sr, nil
}

// srHost is the host an import into sr runs on: this one when it has
// the SR plugged (or no host has), else the first that has.
func srHost(snap db.Reader, self, sr string) string {
	var hosts []string
	snap.Ascend(dm.PBD.Class, func(p *db.Row) bool {
		if b, _ := p.Get(dm.PBD.CurrentlyAttached).(bool); b && p.String(dm.PBD.SR) == sr {
			hosts = append(hosts, p.String(dm.PBD.Host))
		}
		return true
	})
	if len(hosts) == 0 || slices.Contains(hosts, self) {
		return self
	}
	return hosts[0]
}

func orNull(s string) string {
	if s == "" {
		return schema.NullRef
	}
	return s
}

// vmImport is VM.import: the archive at an http or https URL.
func (s *Service) vmImport(c *api.Call, a dm.VMImportArgs) ([]dm.VMRef, error) {
	u := a.URL
	lower := strings.ToLower(u)
	if !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
		return nil, xerr.New(xerr.ValueNotSupported, "url", clip(u), "VM.import fetches archives over http or https only")
	}
	snap := s.srv.DB.Snapshot()
	sr, err := s.targetSR(snap, nullToEmpty(string(a.SR)))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(c.Ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, xerr.New(xerr.ImportError, "bad url: "+err.Error())
	}
	client := &http.Client{Transport: &http.Transport{
		Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: s.cfg.FetchTimeout, TLSHandshakeTimeout: s.cfg.FetchTimeout,
		DialContext: (&net.Dialer{Timeout: s.cfg.FetchTimeout}).DialContext,
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return nil, xerr.New(xerr.ImportError, "cannot fetch the archive: "+err.Error())
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, xerr.New(xerr.ImportError, fmt.Sprintf("fetching the archive: HTTP %d", resp.StatusCode))
	}
	// A source that stops sending is given up after FetchTimeout.
	body := &stallReader{r: resp.Body, d: s.cfg.FetchTimeout, cancel: cancel}
	defer body.stop()
	task := c.RunningTask()
	if task == nil {
		// A call without a task of its own: the disks' transfers still
		// need one to be named by and cancelled through.
		t, err := s.srv.StartTask(ctx, c.Session, "VM.import", "")
		if err != nil {
			return nil, err
		}
		task = t
		defer func() { t.Finish(schema.Void, nil, nil) }()
	}
	vms, err := s.Import(ctx, c.Caller(), task, body, ImportOptions{SR: sr, FullRestore: a.FullRestore, Force: a.Force})
	if err != nil {
		if body.stalled() {
			return nil, xerr.New(xerr.ImportErrorPrematureEOF)
		}
		return nil, err
	}
	out := make([]dm.VMRef, len(vms))
	for i, v := range vms {
		out[i] = dm.VMRef(v)
	}
	return out, nil
}

func nullToEmpty(s string) string {
	if s == schema.NullRef {
		return ""
	}
	return s
}

// stallReader cancels a transfer that moves no byte for d.
type stallReader struct {
	r      io.Reader
	d      time.Duration
	cancel func()
	timer  *time.Timer
	fired  chan struct{}
}

func (s *stallReader) Read(p []byte) (int, error) {
	if s.timer == nil {
		s.fired = make(chan struct{})
		s.timer = time.AfterFunc(s.d, func() { close(s.fired); s.cancel() })
	}
	n, err := s.r.Read(p)
	if n > 0 {
		s.timer.Reset(s.d)
	}
	return n, err
}

func (s *stallReader) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

func (s *stallReader) stalled() bool {
	if s.fired == nil {
		return false
	}
	select {
	case <-s.fired:
		return true
	default:
		return false
	}
}

var errNoVM = errors.New("the archive describes no VM")
