package api

import (
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Role checks.
//
// A session may call a message when it is the local superuser (root, or
// any login over the local socket) or when one of its roles is in the
// message's role list. A message whose list is empty is therefore for the
// local superuser alone: no role grants it. xapi behaves the same way,
// since its datamodel marks such messages "local root only" and its check
// lets only local and superuser sessions past a permission no role holds.
//
// Besides the per-message permissions, xapi has one extra permission,
// "task.destroy/any": acting on a task that another subject's session
// created (cancel, destroy and the task setters). Pool-admin and
// pool-operator hold it; everyone may act on their own tasks.

// PermTaskAny is xapi's extra permission to act on other subjects' tasks.
const PermTaskAny = "task.destroy/any"

// taskAnyRoles hold PermTaskAny.
var taskAnyRoles = schema.RoleSet(0).With(schema.RolePoolAdmin).With(schema.RolePoolOperator)

// xapiRoleOrder is the order in which xapi lists roles in its
// RBAC_PERMISSION_DENIED message (its static roles, most privileged first).
var xapiRoleOrder = []schema.Role{schema.RolePoolAdmin, schema.RolePoolOperator, schema.RoleVMPowerAdmin,
	schema.RoleVMAdmin, schema.RoleVMOperator, schema.RoleClientCert, schema.RoleReadOnly}

// permissionDenied is xapi's RBAC_PERMISSION_DENIED: [permission, text],
// the text naming the roles that do hold the permission.
func permissionDenied(permission string, holders schema.RoleSet) *xerr.Error {
	var names []string
	for _, r := range xapiRoleOrder {
		if holders.Has(r) {
			names = append(names, r.String())
		}
	}
	return xerr.New(xerr.RBACPermissionDenied, permission,
		"No permission in user session. (Roles with this permission: "+strings.Join(names, ", ")+")")
}

// mayCall reports whether a session may call a message at all.
func mayCall(sess *Session, m *schema.Message) bool {
	return sess.LocalSuperuser || sess.Roles.Intersects(m.Roles)
}

// checkCall is the role check every call with a session goes through,
// from a client (Dispatch) or from inside the daemon (Invoke). The
// permission it names is the message's wire name in lower case, as
// xapi's permission names are.
func checkCall(sess *Session, m *schema.Message) error {
	if mayCall(sess, m) {
		return nil
	}
	return permissionDenied(strings.ToLower(m.Wire), m.Roles)
}

// ownerKey is who a session acts for when tasks are compared: the subject
// it logged in through, or, for sessions without one (the local
// superuser), its user name.
func ownerKey(sess *Session) string {
	if sess.Subject != "" && sess.Subject != schema.NullRef {
		return "subject:" + sess.Subject
	}
	return "user:" + sess.User
}

// mayActOnTask reports whether a session may change a task created by
// the session with ref owner (task.cancel, destroy and the setters): its
// own session's tasks, tasks of other sessions of the same subject, or
// any task with PermTaskAny.
func (s *Server) mayActOnTask(sess *Session, owner string) error {
	if sess == nil || sess.LocalSuperuser || sess.Roles.Intersects(taskAnyRoles) || owner == sess.Ref {
		return nil
	}
	if o := s.sessions.get(owner); o != nil && ownerKey(o) == ownerKey(sess) {
		return nil
	}
	return permissionDenied(PermTaskAny, taskAnyRoles)
}

// CheckTaskOwner applies the task rule above for code outside the API
// handlers that acts on a task a client names (an HTTP transfer given a
// task_id): nil when sess may change the task, HANDLE_INVALID when there
// is no such task, RBAC_PERMISSION_DENIED otherwise.
func (s *Server) CheckTaskOwner(sess *Session, task string) error {
	row, ok := s.DB.Snapshot().Get(dm.Task.Class, task)
	if !ok {
		return xerr.New(xerr.HandleInvalid, dm.Task.Class.Name, task)
	}
	return s.mayActOnTask(sess, row.String(dm.Task.Session))
}
