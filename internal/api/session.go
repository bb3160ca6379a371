package api

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Session is a logged-in client, as the server keeps it in memory (the
// database holds its record). Its context is cancelled at logout, which
// ends the session's event.from and event.next waits.
type Session struct {
	Ref            string
	UUID           string // the record's: what logs name it by, as Ref is the bearer secret
	User           string // the user name it logged in as
	Subject        string // subject ref, or the null ref
	Roles          schema.RoleSet
	LocalSuperuser bool
	Originator     string
	Created        time.Time

	userRef string // the user row it authenticated as by password, or ""
	local   bool   // opened over the local socket
	replica bool   // opened by slave_local_login: this host's own replica
	hash    string // a replica session's: the password hash it logged in with
	remote  bool   // the coordinator's, for one forwarded call or request
	peer    bool   // and that request came from another host of the pool

	// permissions is the record's rbac_permissions (sessionPermissions);
	// none for the local superuser, as in xapi.
	permissions []string

	lastActive atomic.Int64 // unix nanoseconds
	flushed    atomic.Int64 // last_active as last written to the database
	ctx        context.Context
	cancel     context.CancelFunc
}

// Context is done when the session ends.
func (s *Session) Context() context.Context { return s.ctx }

func (s *Session) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// capKey is what the per-originator cap counts: a user's sessions from
// one originator, so that no one can push out another user's sessions by
// claiming their originator.
func (s *Session) capKey() string { return s.User + "\x00" + s.Originator }

// AllRoles is what the local superuser and root hold.
var AllRoles = func() schema.RoleSet {
	var rs schema.RoleSet
	for r := schema.Role(0); r < schema.NumRoles; r++ {
		rs = rs.With(r)
	}
	return rs
}()

type sessionTable struct {
	mu         sync.RWMutex
	byRef      map[string]*Session
	byCap      map[string][]*Session // by (user, originator), oldest first
	byUser     map[string][]*Session // oldest first
	maxPerUser int
	// epoch counts revocations: a login that read the database before a
	// revocation and registers after it starts again (see add).
	epoch uint64

	guard     *authGuard
	subjectMu sync.Mutex // serializes subject.create's uniqueness check
}

func newSessionTable() *sessionTable {
	l := DefaultAuthLimits()
	return &sessionTable{byRef: map[string]*Session{}, byCap: map[string][]*Session{}, byUser: map[string][]*Session{},
		maxPerUser: l.MaxSessionsPerUser, guard: newAuthGuard(l)}
}

func (t *sessionTable) get(ref string) *Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.byRef[ref]
}

// currentEpoch is read by a login before it reads the database.
func (t *sessionTable) currentEpoch() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.epoch
}

// errStaleLogin: a revocation ran while the login was reading who the user
// is; the login reads again.
var errStaleLogin = xerr.New(xerr.InternalError, "login raced with a revocation")

// add registers a session and returns the sessions pushed out by the
// caps: perCap per (user, originator), and t.maxPerUser per user. It
// fails with errStaleLogin if a revocation ran since epoch.
func (t *sessionTable) add(s *Session, perCap int, epoch uint64) ([]*Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.epoch != epoch {
		return nil, errStaleLogin
	}
	t.byRef[s.Ref] = s
	t.byCap[s.capKey()] = append(t.byCap[s.capKey()], s)
	t.byUser[s.User] = append(t.byUser[s.User], s)
	var evicted []*Session
	for perCap > 0 && len(t.byCap[s.capKey()]) > perCap {
		old := t.byCap[s.capKey()][0]
		t.unlink(old)
		evicted = append(evicted, old)
	}
	for t.maxPerUser > 0 && len(t.byUser[s.User]) > t.maxPerUser {
		old := t.byUser[s.User][0]
		t.unlink(old)
		evicted = append(evicted, old)
	}
	return evicted, nil
}

// unlink drops a session from every index; the caller holds t.mu.
func (t *sessionTable) unlink(s *Session) {
	delete(t.byRef, s.Ref)
	drop := func(m map[string][]*Session, k string) {
		list := slices.DeleteFunc(m[k], func(x *Session) bool { return x == s })
		if len(list) == 0 {
			delete(m, k)
		} else {
			m[k] = list
		}
	}
	drop(t.byCap, s.capKey())
	drop(t.byUser, s.User)
}

func (t *sessionTable) remove(ref string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byRef[ref]
	if s == nil {
		return nil
	}
	t.unlink(s)
	return s
}

// revoke removes every session match selects and returns them; logins
// racing with it start again.
func (t *sessionTable) revoke(match func(*Session) bool) []*Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.epoch++
	var out []*Session
	for _, s := range t.byRef {
		if match(s) {
			out = append(out, s)
		}
	}
	for _, s := range out {
		t.unlink(s)
	}
	return out
}

func (t *sessionTable) all() []*Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]*Session, 0, len(t.byRef))
	for _, s := range t.byRef {
		out = append(out, s)
	}
	return out
}

func (t *sessionTable) closeAll() {
	for _, s := range t.all() {
		t.remove(s.Ref)
		s.cancel()
	}
}

// Passwords are stored as "pbkdf2-sha256$<iterations>$<salt>$<key>".

// HashPassword makes a stored password hash.
func HashPassword(pw string, iterations int) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key, err := pbkdf2.Key(sha256.New, pw, salt, iterations, 32)
	if err != nil {
		return "", err
	}
	enc := base64.RawStdEncoding
	return fmt.Sprintf("pbkdf2-sha256$%d$%s$%s", iterations, enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// CheckPassword reports whether pw matches a stored hash. The work is
// the stored hash's, whatever pw is, and the keys are compared in
// constant time.
func CheckPassword(stored, pw string) bool {
	iter, salt, want, ok := parseHash(stored)
	if !ok {
		return false
	}
	got, err := pbkdf2.Key(sha256.New, pw, salt, iter, len(want))
	return err == nil && subtle.ConstantTimeCompare(got, want) == 1
}

// parseHash splits a stored hash into its work factor, salt and key.
func parseHash(stored string) (iter int, salt, key []byte, ok bool) {
	parts := strings.Split(stored, "$")
	if len(parts) != 4 || parts[0] != "pbkdf2-sha256" {
		return 0, nil, nil, false
	}
	iter, err := strconv.Atoi(parts[1])
	if err != nil || iter < 1 || iter > 10_000_000 {
		return 0, nil, nil, false
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[2])
	key, err2 := enc.DecodeString(parts[3])
	if err1 != nil || err2 != nil || len(key) == 0 || len(key) > 64 {
		return 0, nil, nil, false
	}
	return iter, salt, key, true
}

// findUser finds a local account by name.
func findUser(snap db.Reader, name string) *db.Row { return findBy(snap, dm.User.ShortName, name) }

// findBy finds the first row whose field f holds v, or nil.
func findBy(snap db.Reader, f *schema.Field, v string) *db.Row {
	var found *db.Row
	snap.Ascend(f.Class, func(r *db.Row) bool {
		if r.String(f) == v {
			found = r
			return false
		}
		return true
	})
	return found
}

// LocalSubjectID is the subject_identifier that gives a local account
// (other than root) its roles: "local:<name>".
func LocalSubjectID(user string) string { return "local:" + user }

// rolesOf expands a subject's roles (and their subroles) to a role set.
func rolesOf(snap db.Reader, subject *db.Row) schema.RoleSet {
	var rs schema.RoleSet
	roles, _ := subject.Get(dm.Subject.Roles).([]string)
	walkRoles(snap, roles, func(r *db.Row, _ []string) {
		if role, ok := schema.ParseRole(r.String(dm.Role.NameLabel)); ok {
			rs = rs.With(role)
		}
	})
	return rs
}

func (s *Server) login(c *Call, a dm.SessionLoginWithPasswordArgs) (dm.SessionRef, error) {
	// A pool member sends clients to the coordinator, before looking at
	// the password (as xapi); the local socket stays its own.
	if !originOf(c.Ctx).Local {
		if err := s.notCoordinator(); err != nil {
			return "", err
		}
	}
	return s.openLogin(c, a.Uname, a.Pwd, a.Originator, false)
}

// openLogin checks a password (not over the local socket) and opens a
// session; replica marks a session on this host's own replica.
func (s *Server) openLogin(c *Call, user, pw, originator string, replica bool) (dm.SessionRef, error) {
	if originator == "" {
		originator = user
	}
	origin := originOf(c.Ctx)
	// The password is checked once; who the user is (subject, roles) is
	// read again if a revocation races with the login.
	hash := ""
	if !origin.Local {
		u, err := s.CheckLogin(c.Ctx, user, pw)
		if err != nil {
			return "", err
		}
		hash = u.String(dm.User.PasswordHash)
	}
	for try := 0; try < 100; try++ {
		epoch := s.sessions.currentEpoch()
		sess, userRef, err := s.whoIs(c.Snapshot(), user, hash, origin)
		if err != nil {
			return "", err
		}
		sess.Originator, sess.replica = originator, replica
		if replica {
			// As the datamodel says (xapi: local root only).
			if !sess.Roles.Has(schema.RolePoolAdmin) {
				return "", xerr.New(xerr.RBACPermissionDenied, "session.slave_local_login_with_password", "the account is not a pool administrator")
			}
			sess.hash = hash
		}
		ref, err := s.openSession(sess, userRef, epoch)
		if err != errStaleLogin {
			return dm.SessionRef(ref), err
		}
	}
	return "", xerr.New(xerr.InternalError, "login kept racing with revocations")
}

// whoIs makes the session of a user whose password was checked against
// hash (or who came over the local socket), from the database as it is
// now: the account must still be there with the same password.
func (s *Server) whoIs(snap db.Reader, user, hash string, origin Origin) (*Session, string, error) {
	sess := &Session{User: user, Subject: schema.NullRef, Created: time.Now(), local: origin.Local}
	u := findUser(snap, user)
	switch {
	case origin.Local:
		// The local socket is trusted: any name logs in as the superuser.
		sess.Roles, sess.LocalSuperuser = AllRoles, true
		if u != nil {
			return sess, u.Ref, nil
		}
		return sess, schema.NullRef, nil
	case u == nil || u.String(dm.User.PasswordHash) != hash:
		return nil, "", authFailed(user)
	case user == "root":
		sess.Roles, sess.LocalSuperuser, sess.userRef = AllRoles, true, u.Ref
		return sess, u.Ref, nil
	}
	subj := findSubject(snap, LocalSubjectID(user))
	if subj == nil {
		return nil, "", authFailed(user)
	}
	sess.Subject, sess.Roles, sess.userRef = subj.Ref, rolesOf(snap, subj), u.Ref
	sess.permissions = s.sessionPermissions(snap, subj)
	if sess.Roles == 0 {
		// As xapi: a subject without roles may not log in.
		return nil, "", xerr.New(xerr.RBACPermissionDenied, "session.login_with_password", "the subject has no roles in this pool")
	}
	return sess, u.Ref, nil
}

// sessionPermissions is what xapi records as the rbac_permissions of a
// subject's session: for each of the subject's roles, the role's own
// name and the names of the permissions it grants (permissionNames),
// each once, sorted. A role that has gone is passed over, as in xapi.
func (s *Server) sessionPermissions(snap db.Reader, subject *db.Row) []string {
	set := map[string]bool{}
	roles, _ := subject.Get(dm.Subject.Roles).([]string)
	for _, ref := range roles {
		r, ok := snap.Get(dm.Role.Class, ref)
		if !ok {
			continue
		}
		set[r.String(dm.Role.NameLabel)] = true
		for _, p := range s.permissionNames(snap, ref) {
			set[p] = true
		}
	}
	return schema.SortedKeys(set)
}

// findSubject finds a subject by its identifier.
func findSubject(snap db.Reader, id string) *db.Row {
	return findBy(snap, dm.Subject.SubjectIdentifier, id)
}

func (s *Server) openSession(sess *Session, userRef string, epoch uint64) (string, error) {
	now := time.Now().UTC()
	rec := &dm.SessionRecord{
		UUID:             uuid.NewString(),
		ThisHost:         dm.HostRef(s.Cfg.HostRef),
		ThisUser:         dm.UserRef(userRef),
		LastActive:       now,
		OtherConfig:      map[string]string{},
		IsLocalSuperuser: sess.LocalSuperuser,
		Subject:          dm.SubjectRef(sess.Subject),
		ValidationTime:   now,
		AuthUserName:     sess.User,
		RbacPermissions:  append([]string{}, sess.permissions...),
		Originator:       sess.Originator,
	}
	var ref string
	_, err := s.DB.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Session.Class, "", rec.Row())
		return err
	})
	if err != nil {
		return "", err
	}
	sess.Ref, sess.UUID = ref, rec.UUID
	sess.ctx, sess.cancel = context.WithCancel(context.Background())
	sess.touch()
	sess.flushed.Store(sess.lastActive.Load())
	evicted, err := s.sessions.add(sess, s.Cfg.MaxSessionsPerOriginator, epoch)
	if err != nil {
		s.endSession(sess)
		return "", err
	}
	for _, old := range evicted {
		s.endSession(old)
	}
	return ref, nil
}

// endSession forgets a session that has already left the table: its
// waiters end, its tasks go and its database record goes.
func (s *Server) endSession(sess *Session) {
	sess.cancel()
	s.events.Forget(sess.Ref)
	s.sessionEndedTasks(sess.Ref)
	// The session has ended in memory whatever happens here; its callers
	// (logout, expiry, revocation) have nobody to hand a failure to.
	if _, err := s.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Session.Class, sess.Ref); ok {
			return tx.Delete(dm.Session.Class, sess.Ref)
		}
		return nil
	}); err != nil {
		s.Log.Error("cannot delete an ended session's record", "session", sess.UUID, "err", err)
	}
}

// revokeSessions ends at once every live session match selects (an
// account revoked, its roles or password changed): their next call gets
// SESSION_INVALID. It returns how many ended.
func (s *Server) revokeSessions(match func(*Session) bool) int {
	ended := s.sessions.revoke(match)
	for _, sess := range ended {
		s.endSession(sess)
	}
	return len(ended)
}

func (s *Server) logout(c *Call, _ dm.SessionLogoutArgs) (dm.Void, error) {
	if sess := s.sessions.remove(c.Session.Ref); sess != nil {
		s.endSession(sess)
	}
	return dm.Void{}, nil
}

// changePassword changes the password of the session's own account. The
// old password is checked (through the login limits) unless the caller is
// the local superuser on the local socket. Every other session that
// authenticated as that account with a password ends: whoever knew the
// old password is logged out (xapi keeps them; we do not).
func (s *Server) changePassword(c *Call, a dm.SessionChangePasswordArgs) (dm.Void, error) {
	oldPW, newPW := a.OldPwd, a.NewPwd
	_, err := s.setPassword(c, oldPW, newPW)
	return dm.Void{}, err
}

func (s *Server) setPassword(c *Call, oldPW, newPW string) (any, error) {
	origin := originOf(c.Ctx)
	u := findUser(c.Snapshot(), c.Session.User)
	if u == nil {
		return nil, xerr.New(xerr.ChangePasswordRejected, "the session's user is not a local account")
	}
	if !c.Session.LocalSuperuser || !origin.Local {
		if c.Session.userRef != u.Ref && !c.Session.local {
			return nil, xerr.New(xerr.ChangePasswordRejected, "the session's account has gone")
		}
		if err := s.sessions.guard.check(c.Ctx, origin, c.Session.User, u.String(dm.User.PasswordHash), oldPW, s.Cfg.PasswordIterations); err != nil {
			return nil, err
		}
	}
	if newPW == "" {
		return nil, xerr.New(xerr.ChangePasswordRejected, "the new password is empty")
	}
	h, err := HashPassword(newPW, s.Cfg.PasswordIterations)
	if err != nil {
		return nil, err
	}
	if err := c.Update(func(tx *db.Tx) error { return tx.Set(dm.User.PasswordHash, u.Ref, h) }); err != nil {
		return nil, err
	}
	s.revokeSessions(func(x *Session) bool { return x.userRef == u.Ref && x != c.Session })
	return nil, nil
}

// expireSessions logs out sessions idle too long and writes last_active
// of busy ones back to the database (at most once a minute each).
func (s *Server) expireSessions(now time.Time) {
	idle := now.Add(-s.Cfg.SessionIdleTimeout).UnixNano()
	var flush []*Session
	for _, sess := range s.sessions.all() {
		last := sess.lastActive.Load()
		switch {
		case last < idle:
			if s.sessions.remove(sess.Ref) != nil {
				s.endSession(sess)
			}
		case last-sess.flushed.Load() > int64(time.Minute):
			flush = append(flush, sess)
		}
	}
	if len(flush) == 0 {
		return
	}
	// A background sweep: a failure is logged, and the next sweep writes
	// last_active again.
	if _, err := s.DB.Update(func(tx *db.Tx) error {
		for _, sess := range flush {
			last := sess.lastActive.Load()
			if _, ok := tx.Get(dm.Session.Class, sess.Ref); ok {
				if err := tx.Set(dm.Session.LastActive, sess.Ref, time.Unix(0, last).UTC()); err != nil {
					return err
				}
			}
			sess.flushed.Store(last)
		}
		return nil
	}); err != nil {
		for _, sess := range flush {
			sess.flushed.Store(0)
		}
		s.Log.Error("cannot record sessions' last_active", "sessions", len(flush), "err", err)
	}
}

// InternalCaller opens a session for the daemon's own work (HA restarting
// a dead host's VMs): the local superuser, held on this host like a local
// socket's session, named by originator. end logs it out.
func (s *Server) InternalCaller(originator string) (c Caller, end func(), err error) {
	sess, userRef, err := s.whoIs(s.DB.Snapshot(), "root", "", Origin{Local: true})
	if err != nil {
		return Caller{}, nil, err
	}
	sess.Originator = originator
	if _, err := s.openSession(sess, userRef, s.sessions.currentEpoch()); err != nil {
		return Caller{}, nil, err
	}
	return s.As(sess), func() {
		if gone := s.sessions.remove(sess.Ref); gone != nil {
			s.endSession(gone)
		}
	}, nil
}
