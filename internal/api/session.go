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

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Session is a logged-in client, as the server keeps it in memory (the
// database holds its record). Its context is cancelled at logout, which
// ends the session's event.from and event.next waits.
type Session struct {
	Ref            string
	User           string // the user name it logged in as
	Subject        string // subject ref, or the null ref
	Roles          schema.RoleSet
	LocalSuperuser bool
	Originator     string
	Created        time.Time

	lastActive atomic.Int64 // unix nanoseconds
	flushed    atomic.Int64 // last_active as last written to the database
	ctx        context.Context
	cancel     context.CancelFunc
}

// Context is done when the session ends.
func (s *Session) Context() context.Context { return s.ctx }

func (s *Session) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// AllRoles is what the local superuser and root hold.
var AllRoles = func() schema.RoleSet {
	var rs schema.RoleSet
	for r := schema.Role(0); r < schema.NumRoles; r++ {
		rs = rs.With(r)
	}
	return rs
}()

type sessionTable struct {
	mu           sync.RWMutex
	byRef        map[string]*Session
	byOriginator map[string][]*Session // oldest first
}

func newSessionTable() *sessionTable {
	return &sessionTable{byRef: map[string]*Session{}, byOriginator: map[string][]*Session{}}
}

func (t *sessionTable) get(ref string) *Session {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.byRef[ref]
}

// add registers a session and returns the sessions pushed out by the
// per-originator cap.
func (t *sessionTable) add(s *Session, limit int) []*Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byRef[s.Ref] = s
	list := append(t.byOriginator[s.Originator], s)
	var evicted []*Session
	for limit > 0 && len(list) > limit {
		evicted = append(evicted, list[0])
		delete(t.byRef, list[0].Ref)
		list = list[1:]
	}
	t.byOriginator[s.Originator] = list
	return evicted
}

func (t *sessionTable) remove(ref string) *Session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.byRef[ref]
	if s == nil {
		return nil
	}
	delete(t.byRef, ref)
	list := t.byOriginator[s.Originator]
	list = slices.DeleteFunc(list, func(x *Session) bool { return x == s })
	if len(list) == 0 {
		delete(t.byOriginator, s.Originator)
	} else {
		t.byOriginator[s.Originator] = list
	}
	return s
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

// CheckPassword reports whether pw matches a stored hash.
func CheckPassword(stored, pw string) bool {
	parts := strings.Split(stored, "$")
	if len(parts) != 4 || parts[0] != "pbkdf2-sha256" {
		return false
	}
	iter, err := strconv.Atoi(parts[1])
	if err != nil || iter < 1 || iter > 10_000_000 {
		return false
	}
	enc := base64.RawStdEncoding
	salt, err1 := enc.DecodeString(parts[2])
	want, err2 := enc.DecodeString(parts[3])
	if err1 != nil || err2 != nil {
		return false
	}
	got, err := pbkdf2.Key(sha256.New, pw, salt, iter, len(want))
	return err == nil && subtle.ConstantTimeCompare(got, want) == 1
}

// findUser finds a local account by name.
func findUser(snap db.Reader, name string) *db.Row {
	var found *db.Row
	snap.Ascend(dm.User.Class, func(r *db.Row) bool {
		if r.String(dm.User.ShortName) == name {
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
	seen := map[string]bool{}
	var walk func(refs []string)
	walk = func(refs []string) {
		for _, ref := range refs {
			if seen[ref] {
				continue
			}
			seen[ref] = true
			r, ok := snap.Get(dm.Role.Class, ref)
			if !ok {
				continue
			}
			if role, ok := schema.ParseRole(r.String(dm.Role.NameLabel)); ok {
				rs = rs.With(role)
			}
			sub, _ := r.Get(dm.Role.Subroles).([]string)
			walk(sub)
		}
	}
	roles, _ := subject.Get(dm.Subject.Roles).([]string)
	walk(roles)
	return rs
}

func (s *Server) login(c *Call) (any, error) {
	user, pw, originator := c.String(0), c.String(1), c.String(3)
	if originator == "" {
		originator = user
	}
	local := originOf(c.Ctx).Local
	snap := c.Snapshot()
	sess := &Session{User: user, Subject: schema.NullRef, Originator: originator, Created: time.Now()}
	userRef := schema.NullRef
	switch u := findUser(snap, user); {
	case local:
		// The local socket is trusted: any name logs in as the superuser.
		sess.Roles, sess.LocalSuperuser = AllRoles, true
		if u != nil {
			userRef = u.Ref
		}
	case u == nil || !CheckPassword(u.String(dm.User.PasswordHash), pw):
		return nil, xerr.New(xerr.SessionAuthenticationFailed)
	case user == "root":
		sess.Roles, sess.LocalSuperuser, userRef = AllRoles, true, u.Ref
	default:
		userRef = u.Ref
		var subj *db.Row
		snap.Ascend(dm.Subject.Class, func(r *db.Row) bool {
			if r.String(dm.Subject.SubjectIdentifier) == LocalSubjectID(user) {
				subj = r
				return false
			}
			return true
		})
		if subj == nil {
			return nil, xerr.New(xerr.SessionAuthenticationFailed)
		}
		sess.Subject, sess.Roles = subj.Ref, rolesOf(snap, subj)
	}
	return s.openSession(sess, userRef)
}

func (s *Server) openSession(sess *Session, userRef string) (string, error) {
	now := time.Now().UTC()
	rec := &dm.SessionRecord{
		ThisHost:         dm.HostRef(s.Cfg.HostRef),
		ThisUser:         dm.UserRef(userRef),
		LastActive:       now,
		OtherConfig:      map[string]string{},
		IsLocalSuperuser: sess.LocalSuperuser,
		Subject:          dm.SubjectRef(sess.Subject),
		ValidationTime:   now,
		AuthUserName:     sess.User,
		RbacPermissions:  []string{},
		Originator:       sess.Originator,
	}
	for _, r := range sess.Roles.Roles() {
		rec.RbacPermissions = append(rec.RbacPermissions, r.String())
	}
	var ref string
	_, err := s.DB.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Session.Class, "", rec.Row())
		return err
	})
	if err != nil {
		return "", err
	}
	sess.Ref = ref
	sess.ctx, sess.cancel = context.WithCancel(context.Background())
	sess.touch()
	sess.flushed.Store(sess.lastActive.Load())
	for _, old := range s.sessions.add(sess, s.Cfg.MaxSessionsPerOriginator) {
		s.endSession(old)
	}
	return ref, nil
}

// endSession forgets a session that has already left the table: its
// waiters end and its database record goes.
func (s *Server) endSession(sess *Session) {
	sess.cancel()
	s.events.Forget(sess.Ref)
	s.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Session.Class, sess.Ref); ok {
			return tx.Delete(dm.Session.Class, sess.Ref)
		}
		return nil
	})
}

func (s *Server) logout(c *Call) (any, error) {
	if sess := s.sessions.remove(c.Session.Ref); sess != nil {
		s.endSession(sess)
	}
	return nil, nil
}

func (s *Server) changePassword(c *Call) (any, error) {
	oldPW, newPW := c.String(0), c.String(1)
	snap := c.Snapshot()
	u := findUser(snap, c.Session.User)
	if u == nil {
		return nil, xerr.New("CHANGE_PASSWORD_REJECTED", "the session's user is not a local account")
	}
	if !c.Session.LocalSuperuser || !originOf(c.Ctx).Local {
		if !CheckPassword(u.String(dm.User.PasswordHash), oldPW) {
			return nil, xerr.New(xerr.SessionAuthenticationFailed)
		}
	}
	if newPW == "" {
		return nil, xerr.New("CHANGE_PASSWORD_REJECTED", "the new password is empty")
	}
	h, err := HashPassword(newPW, s.Cfg.PasswordIterations)
	if err != nil {
		return nil, err
	}
	return nil, c.Update(func(tx *db.Tx) error { return tx.Set(dm.User.PasswordHash, u.Ref, h) })
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
	s.DB.Update(func(tx *db.Tx) error {
		for _, sess := range flush {
			last := sess.lastActive.Load()
			if _, ok := tx.Get(dm.Session.Class, sess.Ref); ok {
				tx.Set(dm.Session.LastActive, sess.Ref, time.Unix(0, last).UTC())
			}
			sess.flushed.Store(last)
		}
		return nil
	})
}
