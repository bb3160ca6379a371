package api

import (
	"slices"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Accounts and roles through the API.
//
// The database holds the seven static roles as role rows with no
// subroles; there are no permission rows. A role's permissions are
// therefore worked out as xapi does (a role without subroles is a leaf,
// and a leaf is a permission), except that a leaf which is one of the
// static roles stands for the messages that role may call: their wire
// names in lower case ("vm.start"), the form xapi gives its permissions'
// name_label.
//
// Roles are not frozen at login. Whatever takes rights away or changes
// them (subject.destroy, subject.add_to_roles and remove_from_roles,
// user.destroy, session.change_password) ends the affected sessions at
// once, so that their next call is SESSION_INVALID and a new login picks
// the new rights up.

func (s *Server) registerRoles() {
	s.Handle("subject.create", s.subjectCreate)
	s.Handle("subject.destroy", s.subjectDestroy)
	Register(s, func(c *Call, a dm.SubjectAddToRolesArgs) (dm.Void, error) {
		return s.changeRoles(c, a.Self, a.Role, true)
	})
	Register(s, func(c *Call, a dm.SubjectRemoveFromRolesArgs) (dm.Void, error) {
		return s.changeRoles(c, a.Self, a.Role, false)
	})
	Register(s, s.subjectPermissionNames)
	s.Handle("user.destroy", s.userDestroy)
	Register(s, s.rolePermissions)
	Register(s, s.rolePermissionNames)
	Register(s, s.rolesByPermission)
	Register(s, s.rolesByPermissionName)
}

// subjectCreate adds a subject. Its identifier must be new
// (SUBJECT_ALREADY_EXISTS). The record may name roles, which must be role
// refs (ROLE_NOT_FOUND otherwise); without them the subject has none,
// as in xapi with RBAC enabled, and cannot log in until it is given some.
func (s *Server) subjectCreate(c *Call) (any, error) {
	rec, _ := c.Args[0].(map[string]any)
	id, _ := rec["subject_identifier"].(string)
	if id == "" {
		return nil, xerr.New(xerr.InvalidValue, "subject_identifier", id)
	}
	given, _ := rec["roles"].([]string)
	snap := c.Snapshot()
	roles := []string{}
	for _, ref := range given {
		if _, ok := snap.Get(dm.Role.Class, ref); !ok {
			return nil, xerr.New(xerr.RoleNotFound)
		}
		if !slices.Contains(roles, ref) {
			roles = append(roles, ref)
		}
	}
	s.sessions.subjectMu.Lock()
	defer s.sessions.subjectMu.Unlock()
	if findSubject(c.Snapshot(), id) != nil {
		return nil, xerr.New(xerr.SubjectAlreadyExists)
	}
	return s.implicitCreate(c, dm.Subject.Class, map[string]any{"roles": roles})
}

func (s *Server) subjectDestroy(c *Call) (any, error) {
	subj, err := c.Row(0, dm.Subject.Class)
	if err != nil {
		return nil, err
	}
	return nil, s.destroyAndRevoke(c, subj, func(x *Session) bool { return x.Subject == subj.Ref })
}

// destroyAndRevoke deletes a row that grants sessions their rights (a
// subject, a user) and ends the sessions that held them.
func (s *Server) destroyAndRevoke(c *Call, row *db.Row, held func(*Session) bool) error {
	if err := c.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(row.Class, row.Ref); !ok {
			return xerr.New(xerr.HandleInvalid, row.Class.Name, row.Ref)
		}
		return tx.Delete(row.Class, row.Ref)
	}); err != nil {
		return err
	}
	s.revokeSessions(held)
	return nil
}

// changeRoles adds or removes one role of a subject, with xapi's checks:
// adding a ref that is no role, or removing one the subject lacks, is
// ROLE_NOT_FOUND; adding one it has is ROLE_ALREADY_EXISTS. The subject's
// sessions end.
func (s *Server) changeRoles(c *Call, subject dm.SubjectRef, roleRef dm.RoleRef, add bool) (dm.Void, error) {
	subj, err := c.Lookup(dm.Subject.Class, string(subject))
	if err != nil {
		return dm.Void{}, err
	}
	role := string(roleRef)
	err = c.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.Subject.Class, subj.Ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.Subject.Class.Name, subj.Ref)
		}
		have, _ := row.Get(dm.Subject.Roles).([]string)
		switch {
		case add:
			if _, ok := tx.Get(dm.Role.Class, role); !ok {
				return xerr.New(xerr.RoleNotFound)
			}
			if slices.Contains(have, role) {
				return xerr.New(xerr.RoleAlreadyExists)
			}
			return tx.AddToSet(dm.Subject.Roles, subj.Ref, role)
		default:
			if !slices.Contains(have, role) {
				return xerr.New(xerr.RoleNotFound)
			}
			return tx.RemoveFromSet(dm.Subject.Roles, subj.Ref, role)
		}
	})
	if err != nil {
		return dm.Void{}, err
	}
	s.revokeSessions(func(x *Session) bool { return x.Subject == subj.Ref })
	return dm.Void{}, nil
}

// userDestroy removes a local account; the sessions that authenticated as
// it end.
func (s *Server) userDestroy(c *Call) (any, error) {
	u, err := c.Row(0, dm.User.Class)
	if err != nil {
		return nil, err
	}
	// root is the local superuser's account: a pool-admin may manage
	// other accounts but not shut root out of the network.
	if u.String(dm.User.ShortName) == "root" && !c.Session.LocalSuperuser {
		return nil, xerr.New(xerr.UserIsNotLocalSuperuser, "only the local superuser may destroy the root account")
	}
	return nil, s.destroyAndRevoke(c, u, func(x *Session) bool { return x.userRef == u.Ref })
}

// leafRoles returns the permissions of a role as xapi works them out: the
// leaves under it, the role itself when it has no subroles.
func leafRoles(snap db.Reader, ref string) []string {
	var out []string
	walkRoles(snap, []string{ref}, func(r *db.Row, subroles []string) {
		if len(subroles) == 0 {
			out = append(out, r.Ref)
		}
	})
	slices.Sort(out)
	return out
}

// walkRoles visits each role reachable from refs through subroles once,
// a role before its subroles; refs naming no role are skipped.
func walkRoles(snap db.Reader, refs []string, visit func(r *db.Row, subroles []string)) {
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
			sub, _ := r.Get(dm.Role.Subroles).([]string)
			visit(r, sub)
			walk(sub)
		}
	}
	walk(refs)
}

// permissionNames returns the permission names a role grants: for a
// static role, the lower-case wire names of the messages it may call
// and, for those that hold it, PermTaskAny (xapi's one permission that
// is not a message); for any other leaf, its name_label.
func (s *Server) permissionNames(snap db.Reader, ref string) []string {
	set := map[string]bool{}
	for _, leaf := range leafRoles(snap, ref) {
		r, _ := snap.Get(dm.Role.Class, leaf)
		label := r.String(dm.Role.NameLabel)
		role, static := schema.ParseRole(label)
		if !static {
			set[label] = true
			continue
		}
		for _, m := range s.Model.Messages {
			if m.Roles.Has(role) {
				set[strings.ToLower(m.Wire)] = true
			}
		}
		if taskAnyRoles.Has(role) {
			set[PermTaskAny] = true
		}
	}
	return schema.SortedKeys(set)
}

func (s *Server) rolePermissions(c *Call, a dm.RoleGetPermissionsArgs) ([]dm.RoleRef, error) {
	r, err := c.Lookup(dm.Role.Class, string(a.Self))
	if err != nil {
		return nil, err
	}
	return refsAs[dm.RoleRef](leafRoles(c.Snapshot(), r.Ref)), nil
}

func (s *Server) rolePermissionNames(c *Call, a dm.RoleGetPermissionsNameLabelArgs) ([]string, error) {
	r, err := c.Lookup(dm.Role.Class, string(a.Self))
	if err != nil {
		return nil, err
	}
	return s.permissionNames(c.Snapshot(), r.Ref), nil
}

func (s *Server) subjectPermissionNames(c *Call, a dm.SubjectGetPermissionsNameLabelArgs) ([]string, error) {
	subj, err := c.Lookup(dm.Subject.Class, string(a.Self))
	if err != nil {
		return nil, err
	}
	snap := c.Snapshot()
	set := map[string]bool{}
	roles, _ := subj.Get(dm.Subject.Roles).([]string)
	for _, r := range roles {
		for _, p := range s.permissionNames(snap, r) {
			set[p] = true
		}
	}
	return schema.SortedKeys(set), nil
}

// rolesByPermission lists the roles, other than the permission itself,
// whose permissions include it.
func (s *Server) rolesByPermission(c *Call, a dm.RoleGetByPermissionArgs) ([]dm.RoleRef, error) {
	perm := string(a.Permission)
	snap := c.Snapshot()
	out := []dm.RoleRef{}
	for _, r := range snap.All(dm.Role.Class) {
		if r.Ref != perm && slices.Contains(leafRoles(snap, r.Ref), perm) {
			out = append(out, dm.RoleRef(r.Ref))
		}
	}
	return out, nil
}

// rolesByPermissionName lists the roles, other than one so named, that
// grant a permission named label ("vm.start"; case is ignored).
func (s *Server) rolesByPermissionName(c *Call, a dm.RoleGetByPermissionNameLabelArgs) ([]dm.RoleRef, error) {
	label := strings.ToLower(a.Label)
	snap := c.Snapshot()
	out := []dm.RoleRef{}
	for _, r := range snap.All(dm.Role.Class) {
		if strings.EqualFold(r.String(dm.Role.NameLabel), label) {
			continue
		}
		if _, found := slices.BinarySearch(s.permissionNames(snap, r.Ref), label); found {
			out = append(out, dm.RoleRef(r.Ref))
		}
	}
	return out, nil
}
