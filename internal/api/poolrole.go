package api

import (
	"context"
	"sync/atomic"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// PoolRole tells the server where the pool's coordinator is. Member
// reports whether this host is a pool member that is not the coordinator
// now; Coordinator is the coordinator's address as a member names it in
// HOST_IS_SLAVE ("" while there is none).
type PoolRole interface {
	Member() bool
	Coordinator() string
}

// poolRole holds the server's PoolRole (nil: a host alone, its own
// coordinator).
type poolRole struct{ v atomic.Pointer[PoolRole] }

// SetPoolRole installs the pool layer's view of who coordinates.
func (s *Server) SetPoolRole(r PoolRole) { s.role.v.Store(&r) }

// notCoordinator is HOST_IS_SLAVE [coordinator] on a pool member, nil on
// the coordinator or a host alone.
func (s *Server) notCoordinator() error {
	p := s.role.v.Load()
	if p == nil || !(*p).Member() {
		return nil
	}
	return xerr.New(xerr.HostIsSlave, (*p).Coordinator())
}

// slaveLocalLogin opens a session on this host's own replica of the
// database, coordinator or not, and whether or not the coordinator can be
// reached: xapi's way in for tools that must read a member's state.
func (s *Server) slaveLocalLogin(c *Call, a dm.SessionSlaveLocalLoginWithPasswordArgs) (dm.SessionRef, error) {
	return s.openLogin(c, a.Uname, a.Pwd, a.Uname, true)
}

// stillHeld reports whether what a slave-local session was opened with
// still holds in this host's replica: the account, its password, its
// subject and roles. Revocations are writes on the coordinator; the
// sessions they end there are in the coordinator's memory, and those a
// member opened are in the member's, so a member checks its own on every
// call against the replicated state (a map lookup or two), and a
// revocation reaches them as soon as it reaches the member's replica.
func (s *Server) stillHeld(sess *Session) bool {
	snap := s.DB.Snapshot()
	u := findUser(snap, sess.User)
	if u == nil || u.Ref != sess.userRef || u.String(dm.User.PasswordHash) != sess.hash {
		return false
	}
	if sess.LocalSuperuser {
		return true // root: all roles, no subject
	}
	subj := findSubject(snap, LocalSubjectID(sess.User))
	return subj != nil && subj.Ref == sess.Subject && rolesOf(snap, subj) == sess.Roles
}

// CheckPoolAdmin checks that user and pw are an account of this pool with
// the pool-admin role (a host asking to join, for example), under the same
// limits as a login.
func (s *Server) CheckPoolAdmin(ctx context.Context, user, pw string) error {
	u, err := s.CheckLogin(ctx, user, pw)
	if err != nil {
		return err
	}
	sess, _, err := s.whoIs(s.DB.Snapshot(), user, u.String(dm.User.PasswordHash), originOf(ctx))
	if err != nil {
		return err
	}
	if !sess.Roles.Has(schema.RolePoolAdmin) {
		return xerr.New(xerr.RBACPermissionDenied, "pool.join", "the account is not a pool administrator")
	}
	return nil
}

// Deposed ends the sessions clients opened while this host coordinated
// the pool (not those of the local socket, nor slave-local ones): their
// next call fails with SESSION_INVALID, they log in again, and the login
// sends them to the new coordinator (HOST_IS_SLAVE). The pool layer calls
// it when this host stops being the coordinator.
func (s *Server) Deposed() int {
	return s.revokeSessions(func(sess *Session) bool { return !sess.local && !sess.replica })
}
