package api

import (
	"bufio"
	"bytes"
	"io"
	"net/http"

	"github.com/gorilla/mux"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/xmldb"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// MaxRestoreBytes bounds a database uploaded to PUT /pool/xmldbdump.
const MaxRestoreBytes = 1 << 30

// DumpRoutes adds GET and PUT /pool/xmldbdump: the whole database in
// xapi's state.db format, out and in.
func (s *Server) DumpRoutes(r *mux.Router) {
	r.HandleFunc("/pool/xmldbdump", s.getDump).Methods(http.MethodGet)
	r.HandleFunc("/pool/xmldbdump", s.putDump).Methods(http.MethodPut, http.MethodPost)
}

// HTTPSession authenticates an HTTP request as xapi does: a session_id
// query parameter or cookie, or basic authentication with a local
// account. It writes the error reply itself and returns nil on failure.
func (s *Server) HTTPSession(w http.ResponseWriter, r *http.Request, roles schema.RoleSet) *Session {
	id := r.URL.Query().Get("session_id")
	if id == "" {
		if c, err := r.Cookie("session_id"); err == nil {
			id = c.Value
		}
	}
	sess, handled := s.peerSession(w, r)
	switch {
	case handled:
		return nil
	case sess != nil:
	case id != "":
		if sess = s.sessions.get(id); sess == nil {
			if sess, handled = s.remoteSession(w, r, id); handled {
				return nil
			}
		}
	default:
		if user, pw, ok := r.BasicAuth(); ok {
			// Checked as a login is: same limits, same cost for any name.
			if _, err := s.CheckLogin(originContext(r), user, pw); err == nil && user == "root" {
				sess = &Session{User: user, Roles: AllRoles, LocalSuperuser: true}
			}
		} else if originOf(r.Context()).Local {
			sess = &Session{User: "root", Roles: AllRoles, LocalSuperuser: true}
		}
	}
	if sess == nil {
		w.Header().Set("WWW-Authenticate", `Basic realm="xapi"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return nil
	}
	if roles != 0 && !sess.Roles.Intersects(roles) {
		http.Error(w, xerr.RBACPermissionDenied, http.StatusForbidden)
		return nil
	}
	sess.touch()
	return sess
}

var poolAdmin = schema.RoleSet(0).With(schema.RolePoolAdmin)

func (s *Server) getDump(w http.ResponseWriter, r *http.Request) {
	if s.HTTPSession(w, r, poolAdmin) == nil {
		return
	}
	setType(w, "text/xml")
	bw := bufio.NewWriterSize(w, 64<<10)
	if err := xmldb.Encode(bw, s.Model, s.DB.Snapshot()); err != nil {
		s.Log.Error("database dump", "err", err)
		return
	}
	if err := bw.Flush(); err != nil {
		s.Log.Warn("database dump: client write", "err", err)
	}
}

// putDump restores a database: it is checked whole (format, schema,
// values, uniqueness) before anything changes, so a bad file leaves the
// running database untouched.
//
// A member refuses it (HOST_IS_SLAVE [coordinator]): its database is the
// pool's replica, which only the coordinator writes; a restore there
// would leave it apart from the pool.
func (s *Server) putDump(w http.ResponseWriter, r *http.Request) {
	if s.HTTPSession(w, r, poolAdmin) == nil {
		return
	}
	if err := s.notCoordinator(); err != nil {
		WriteHTTPError(w, err)
		return
	}
	body, ok := readLimited(w, r, MaxRestoreBytes, "database too large", "cannot read the database")
	if !ok {
		return
	}
	dump, err := xmldb.Decode(bytes.NewReader(body), s.Model)
	if err == nil {
		err = checkDump(s.Model, dump)
	}
	if err == nil {
		err = s.DB.Replace(func(l *db.Loader) error { return fillFrom(l, dump) })
	}
	if err != nil {
		s.Log.Warn("database restore refused", "err", err)
		http.Error(w, "database restore refused: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.afterRestore()
	setType(w, "text/plain")
	_, _ = io.WriteString(w, "database restored\n") // the restore is done; the client may have gone
}

// checkDump loads a dump into a scratch database, which finds what the
// decoder alone cannot (for example a uuid shared across tables).
func checkDump(m *schema.Model, dump *xmldb.Dump) error {
	scratch := db.New(m, db.Options{})
	return scratch.Load(dump.Generation, func(l *db.Loader) error { return fillFrom(l, dump) })
}

func fillFrom(l *db.Loader, dump *xmldb.Dump) error {
	for c, rows := range dump.Tables {
		if !c.Persist {
			continue
		}
		for _, r := range rows {
			if err := l.Row(c, r.Ref, r.Created, r.Modified, append([]any(nil), r.Values...)); err != nil {
				return err
			}
		}
	}
	return nil
}

// afterRestore finds this host again: the restored pool's master, whose
// identity this host takes.
func (s *Server) afterRestore() {
	// Sessions were granted against the old accounts and roles, which the
	// restored database may not have: every session but the local
	// superuser's ends, and its clients log in again against the new
	// accounts. (xapi restarts after a restore, which ends them all.)
	s.revokeSessions(func(x *Session) bool { return !x.LocalSuperuser })
	snap := s.DB.Snapshot()
	if _, ok := snap.Get(dm.Host.Class, s.Cfg.HostRef); ok {
		return
	}
	for _, p := range snap.All(dm.Pool.Class) {
		if master, ok := snap.Get(dm.Host.Class, p.String(dm.Pool.Master)); ok {
			s.Cfg.HostRef = master.Ref
			if s.OnRestore != nil {
				s.OnRestore(master)
			}
			return
		}
	}
}
