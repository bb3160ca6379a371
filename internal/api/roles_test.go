package api_test

import (
	"encoding/json"
	"slices"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// addAccount makes a local account (user row with a password) and, with
// roles given by name, its subject through subject.create. It returns
// the user and subject refs.
func addAccount(h *harness, root, name, pw string, roles ...string) (user, subject string) {
	h.t.Helper()
	hash, err := api.HashPassword(pw, h.srv.Cfg.PasswordIterations)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.d.Update(func(tx *db.Tx) (err error) {
		user, err = tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: name, OtherConfig: map[string]string{}, PasswordHash: hash}).Row())
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	refs := []string{}
	for _, r := range roles {
		refs = append(refs, roleRef(h, root, r))
	}
	subject = str(h.t, h.ok("subject.create", root, map[string]any{
		"subject_identifier": api.LocalSubjectID(name), "other_config": map[string]any{}, "roles": refs}))
	return user, subject
}

func roleRef(h *harness, root, name string) string {
	h.t.Helper()
	var refs []string
	json.Unmarshal(h.ok("role.get_by_name_label", root, name), &refs)
	if len(refs) != 1 {
		h.t.Fatalf("role %s: %v", name, refs)
	}
	return refs[0]
}

func strs(h *harness, raw json.RawMessage) []string {
	h.t.Helper()
	var out []string
	if err := json.Unmarshal(raw, &out); err != nil {
		h.t.Fatalf("not a string list: %s", raw)
	}
	return out
}

func firstVM(h *harness, s string) string {
	vms := strs(h, h.ok("VM.get_all", s))
	for _, vm := range vms {
		var dom0 bool
		json.Unmarshal(h.ok("VM.get_is_control_domain", s, vm), &dom0)
		if !dom0 {
			return vm
		}
	}
	h.t.Fatal("no VM")
	return ""
}

// Finding 3: revoking an account, changing its roles or its password ends
// its sessions at once; roles are not frozen at login.
func TestRevocationEndsSessions(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	vm := firstVM(h, root)

	{ // subject.destroy
		_, subj := addAccount(h, root, "gone", "pw1", "vm-admin")
		s := h.login("gone", "pw1")
		h.ok("VM.set_name_description", s, vm, "by gone")
		h.ok("subject.destroy", root, subj)
		h.fails(xerr.SessionInvalid, "VM.get_record", s, vm)
		h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "gone", "pw1", "2.21", "test")
	}

	{ // roles removed
		_, subj := addAccount(h, root, "demoted", "pw2", "vm-admin", "read-only")
		s := h.login("demoted", "pw2")
		h.ok("VM.set_name_description", s, vm, "by demoted")
		h.ok("subject.remove_from_roles", root, subj, roleRef(h, root, "vm-admin"))
		h.fails(xerr.SessionInvalid, "VM.set_name_description", s, vm, "still?")
		s = h.login("demoted", "pw2")
		h.fails(xerr.RBACPermissionDenied, "VM.set_name_description", s, vm, "still?")
		h.ok("VM.get_record", s, vm)
	}

	{ // roles added
		_, subj := addAccount(h, root, "promoted", "pw3", "read-only")
		s := h.login("promoted", "pw3")
		h.fails(xerr.RBACPermissionDenied, "VM.set_name_description", s, vm, "x")
		h.ok("subject.add_to_roles", root, subj, roleRef(h, root, "vm-admin"))
		h.fails(xerr.SessionInvalid, "VM.get_record", s, vm)
		s = h.login("promoted", "pw3")
		h.ok("VM.set_name_description", s, vm, "by promoted")
	}

	{ // user.destroy
		user, _ := addAccount(h, root, "fired", "pw4", "pool-operator")
		s := h.login("fired", "pw4")
		h.ok("user.destroy", root, user)
		h.fails(xerr.SessionInvalid, "VM.get_record", s, vm)
		h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "fired", "pw4", "2.21", "test")
	}

	{ // change_password: root's (only the local superuser may call it, as in xapi)
		mine := h.login("root", rootPW)
		thief := h.login("root", rootPW)
		addAccount(h, root, "alice", "a-pw", "vm-operator")
		other := h.login("alice", "a-pw")
		h.ok("session.change_password", mine, rootPW, "new-pw")
		h.fails(xerr.SessionInvalid, "VM.get_record", thief, vm)
		h.fails(xerr.SessionInvalid, "VM.get_record", root, vm)
		h.ok("VM.get_record", mine, vm) // the caller's own session stays
		h.ok("VM.get_record", other, vm)
		h.fails(xerr.SessionAuthenticationFailed, "session.login_with_password", "root", rootPW, "2.21", "test")
		root = h.login("root", "new-pw")
	}

	{ // logout_subject_identifier
		addAccount(h, root, "bob", "pw5", "vm-operator")
		s := h.login("bob", "pw5")
		h.ok("session.logout_subject_identifier", root, api.LocalSubjectID("bob"))
		h.fails(xerr.SessionInvalid, "VM.get_record", s, vm)
		h.ok("VM.get_record", root, vm)
	}
}

// Finding 4 (sessions): the per-originator cap counts one user's sessions,
// so that a read-only user claiming root's originator cannot log root out.
func TestSessionCapIsPerUserAndOriginator(t *testing.T) {
	h := newHarness(t, func(c *api.Config) { c.MaxSessionsPerOriginator = 50 })
	rootSess := str(t, h.ok("session.login_with_password", "root", rootPW, "2.21", "X"))
	root := h.login("root", rootPW)
	addAccount(h, root, "ro", "ro-pw", "read-only")
	var first string
	for i := 0; i < 600; i++ {
		s := str(t, h.ok("session.login_with_password", "ro", "ro-pw", "2.21", "X"))
		if i == 0 {
			first = s
		}
	}
	h.ok("host.get_all", rootSess) // root's session with originator X lives
	h.fails(xerr.SessionInvalid, "host.get_all", first)

	// One user's sessions over every originator are capped too.
	lim := api.DefaultAuthLimits()
	lim.MaxSessionsPerUser = 20
	h.srv.SetAuthLimits(lim)
	var mine []string
	for i := 0; i < 30; i++ {
		mine = append(mine, str(t, h.ok("session.login_with_password", "ro", "ro-pw", "2.21", "o"+string(rune('a'+i)))))
	}
	h.fails(xerr.SessionInvalid, "host.get_all", mine[0])
	h.ok("host.get_all", mine[29])
	h.ok("host.get_all", rootSess)
	n := 0
	for _, id := range strs(h, h.ok("session.get_all_subject_identifiers", root)) {
		if id == api.LocalSubjectID("ro") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("subject identifiers %d", n)
	}
}

// Finding 10: roles managed through the API, with xapi's checks.
func TestRoleManagement(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	vm := firstVM(h, root)
	ro, op := roleRef(h, root, "read-only"), roleRef(h, root, "vm-operator")

	h.fails(xerr.RoleNotFound, "subject.create", root, map[string]any{"subject_identifier": "local:x", "roles": []string{vm}})
	_, subj := addAccount(h, root, "carol", "pw", "read-only")
	h.fails(xerr.SubjectAlreadyExists, "subject.create", root, map[string]any{"subject_identifier": "local:carol"})
	if got := strs(h, h.ok("subject.get_roles", root, subj)); !slices.Equal(got, []string{ro}) {
		t.Errorf("roles %v", got)
	}
	h.fails(xerr.RoleAlreadyExists, "subject.add_to_roles", root, subj, ro)
	h.fails(xerr.RoleNotFound, "subject.add_to_roles", root, subj, vm)
	h.fails(xerr.RoleNotFound, "subject.add_to_roles", root, subj, "OpaqueRef:nonsense")
	h.fails(xerr.RoleNotFound, "subject.remove_from_roles", root, subj, op)
	h.fails(xerr.HandleInvalid, "subject.add_to_roles", root, vm, op)
	h.ok("subject.add_to_roles", root, subj, op)
	if got := strs(h, h.ok("subject.get_roles", root, subj)); len(got) != 2 {
		t.Errorf("roles %v", got)
	}
	s := h.login("carol", "pw")
	h.fails(xerr.RBACPermissionDenied, "subject.add_to_roles", s, subj, roleRef(h, root, "pool-admin"))

	perms := strs(h, h.ok("role.get_permissions_name_label", s, op))
	for _, want := range []string{"vm.start", "vm.clean_shutdown", "vm.get_record", "session.logout"} {
		if _, ok := slices.BinarySearch(perms, want); !ok {
			t.Errorf("vm-operator lacks %s", want)
		}
	}
	for _, not := range []string{"vm.destroy", "vm.set_name_label", "subject.add_to_roles"} {
		if _, ok := slices.BinarySearch(perms, not); ok {
			t.Errorf("vm-operator has %s", not)
		}
	}
	roPerms := strs(h, h.ok("role.get_permissions_name_label", s, ro))
	if _, ok := slices.BinarySearch(roPerms, "vm.start"); ok || len(roPerms) == 0 {
		t.Errorf("read-only permissions: %d, vm.start in them", len(roPerms))
	}
	union := strs(h, h.ok("subject.get_permissions_name_label", s, subj))
	if len(union) != len(perms) { // read-only's are a subset of vm-operator's
		t.Errorf("subject permissions %d, vm-operator's %d", len(union), len(perms))
	}
	if got := strs(h, h.ok("role.get_permissions", s, op)); !slices.Equal(got, []string{op}) {
		t.Errorf("get_permissions %v", got)
	}
	if got := strs(h, h.ok("role.get_by_permission", s, op)); len(got) != 0 {
		t.Errorf("get_by_permission %v", got)
	}
	holders := strs(h, h.ok("role.get_by_permission_name_label", s, "vm.start"))
	want := map[string]bool{}
	for _, n := range []string{"pool-admin", "pool-operator", "vm-power-admin", "vm-admin", "vm-operator"} {
		want[roleRef(h, root, n)] = true
	}
	for _, r := range holders {
		delete(want, r)
		if r == ro {
			t.Error("read-only holds vm.start")
		}
	}
	if len(want) != 0 {
		t.Errorf("vm.start holders %v miss %v", holders, want)
	}
	h.fails(xerr.HandleInvalid, "role.get_permissions", s, vm)

	// A subject whose roles are all removed cannot log in.
	h.ok("subject.remove_from_roles", root, subj, ro)
	h.ok("subject.remove_from_roles", root, subj, op)
	h.fails(xerr.RBACPermissionDenied, "session.login_with_password", "carol", "pw", "2.21", "t")
}

// Finding 10: one account per role; a message of each role works for it
// and is denied to the role just below.
func TestEachRoleGetsItsMessages(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	vm := firstVM(h, root)
	pool := strs(h, h.ok("pool.get_all", root))[0]
	hosts := strs(h, h.ok("host.get_all", root))
	rootUser := ""
	h.d.Snapshot().Ascend(dm.User.Class, func(r *db.Row) bool { rootUser = r.Ref; return false })

	type probe struct {
		method string
		args   []any
	}
	cases := []struct {
		role, below string
		probe       probe
	}{
		{"pool-admin", "pool-operator", probe{"user.add_to_other_config", []any{rootUser, "k", "v"}}},
		{"pool-operator", "vm-power-admin", probe{"pool.add_to_other_config", []any{pool, "k", "v"}}},
		{"vm-power-admin", "vm-admin", probe{"VM.set_affinity", []any{vm, hosts[0]}}},
		{"vm-admin", "vm-operator", probe{"VM.set_name_description", []any{vm, "d"}}},
		{"vm-operator", "read-only", probe{"VM.add_tags", []any{vm, "t"}}},
		{"read-only", "", probe{"host.get_record", []any{hosts[0]}}},
		{"client-cert", "read-only", probe{"pool.set_wlb_enabled", []any{pool, false}}},
	}
	sessions := map[string]string{}
	for _, c := range cases {
		name := "u-" + c.role
		addAccount(h, root, name, "pw-"+c.role, c.role)
		sessions[c.role] = h.login(name, "pw-"+c.role)
	}
	// A subject with no roles, below read-only, cannot even log in.
	addAccount(h, root, "u-none", "pw-none")
	h.fails(xerr.RBACPermissionDenied, "session.login_with_password", "u-none", "pw-none", "2.21", "t")
	for _, c := range cases {
		args := append([]any{sessions[c.role]}, c.probe.args...)
		if _, e := h.jsonCall(c.probe.method, args...); e != nil {
			t.Errorf("%s: %s failed: %s %v", c.role, c.probe.method, e.Code, e.Data)
		}
		if c.below == "" {
			continue
		}
		args[0] = sessions[c.below]
		if _, e := h.jsonCall(c.probe.method, args...); e == nil || e.Code != xerr.RBACPermissionDenied {
			t.Errorf("%s: %s by %s: %v, want RBAC_PERMISSION_DENIED", c.role, c.probe.method, c.below, e)
		}
	}
}
