package xenops

import (
	"net"
	"net/http"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/netguard"
	"toolstackd/internal/schema"
)

// consoleRoles may use consoles (xapi: vm-operator and above).
var consoleRoles = schema.RoleSet(0).With(schema.RolePoolAdmin).With(schema.RolePoolOperator).
	With(schema.RoleVMPowerAdmin).With(schema.RoleVMAdmin).With(schema.RoleVMOperator)

// serveConsole is /console: "CONNECT /console?uuid=...", or ?ref=, as a
// console record's location says, authenticated as any HTTP handler of
// xapi's (session_id parameter or cookie, or basic authentication). After
// "200 OK" the connection carries the console's own protocol: RFB from
// QEMU's VNC server for an rfb console, the serial port's bytes for a
// vt100 one.
func (m *Manager) serveConsole(w http.ResponseWriter, r *http.Request) {
	sess := m.srv.HTTPSession(w, r, consoleRoles)
	if sess == nil {
		return
	}
	snap := m.db.Snapshot()
	q := r.URL.Query()
	var con *db.Row
	var ok bool
	switch {
	case q.Get("ref") != "":
		con, ok = snap.Get(dm.Console.Class, q.Get("ref"))
	case q.Get("uuid") != "":
		con, ok = snap.ByUUID(dm.Console.Class, q.Get("uuid"))
	}
	if !ok {
		http.Error(w, "no such console", http.StatusNotFound)
		return
	}
	vm, ok := snap.Get(dm.VM.Class, con.String(dm.Console.VM))
	if !ok {
		http.Error(w, "the console's VM is gone", http.StatusNotFound)
		return
	}
	if m.srv.ProxyHTTP(w, r, sess, forwarding.VMHost(snap, m.host, vm.Ref)) {
		return // the domain runs on another host of the pool
	}
	path, err := m.be.ConsolePath(vm.UUID(), con.String(dm.Console.Protocol))
	if err != nil {
		http.Error(w, "console unavailable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	backend, err := net.DialTimeout("unix", path, 5*time.Second) //nolint:gosec // the backend's own console socket in its state dir
	if err != nil {
		http.Error(w, "console unavailable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		_ = backend.Close()
		http.Error(w, "connection cannot be taken over", http.StatusInternalServerError)
		return
	}
	raw, rw, err := hj.Hijack()
	if err != nil {
		_ = backend.Close()
		return
	}
	// Dropped after a long time with no traffic either way.
	client := netguard.Interactive(raw, rw.Reader)
	client.SetDeadline(time.Time{})
	if _, err := client.Write(netguard.Head(w, "HTTP/1.1 200 OK", http.Header{"Connection": {"keep-alive"}})); err != nil {
		_ = client.Close()
		_ = backend.Close()
		return
	}
	m.log.Debug("console connected", "vm", vm.UUID(), "protocol", con.String(dm.Console.Protocol), "peer", r.RemoteAddr)
	api.Splice(client, client, backend)
}
