package api_test

import (
	"slices"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// Issue 29, finding 12: session.get_rbac_permissions is what xapi
// records at login for a subject's session: for each of the subject's
// roles, the role's name and the names of the permissions it grants
// (lower-case wire names, "vm.start"; "task.destroy/any" for those that
// may act on others' tasks), without duplicates. The local superuser's
// is empty, as in xapi: its session is not checked against permissions.
func TestSessionRBACPermissions(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	_, subj := addAccount(h, root, "dora", "pw", "vm-operator", "read-only")
	s := h.login("dora", "pw")
	got := strs(h, h.ok("session.get_rbac_permissions", s, s))

	want := map[string]bool{"vm-operator": true, "read-only": true}
	for _, p := range strs(h, h.ok("subject.get_permissions_name_label", root, subj)) {
		want[p] = true
	}
	if len(got) != len(want) {
		t.Errorf("%d permissions, want %d", len(got), len(want))
	}
	seen := map[string]bool{}
	for _, p := range got {
		if !want[p] {
			t.Errorf("%q is not a permission of the session's roles", p)
		}
		if seen[p] {
			t.Errorf("%q twice", p)
		}
		seen[p] = true
	}
	for _, p := range []string{"vm.start", "vm.get_record", "session.logout", "vm-operator", "read-only"} {
		if !seen[p] {
			t.Errorf("%q missing", p)
		}
	}
	for _, p := range []string{"vm.destroy", "pool-admin", "vm-admin", "task.destroy/any", "async.vm.start", "VM.start"} {
		if seen[p] {
			t.Errorf("%q granted", p)
		}
	}

	// A pool operator may act on others' tasks: xapi's extra permission.
	addAccount(h, root, "olga", "pw", "pool-operator")
	op := h.login("olga", "pw")
	ops := strs(h, h.ok("session.get_rbac_permissions", op, op))
	for _, p := range []string{"pool-operator", api.PermTaskAny, "vm.destroy", "host.disable"} {
		if !slices.Contains(ops, p) {
			t.Errorf("pool-operator's session lacks %q", p)
		}
	}
	if holders := strs(h, h.ok("role.get_by_permission_name_label", root, api.PermTaskAny)); len(holders) != 2 {
		t.Errorf("%s held by %d roles, want pool-admin and pool-operator", api.PermTaskAny, len(holders))
	}

	if got := strs(h, h.ok("session.get_rbac_permissions", root, root)); len(got) != 0 {
		t.Errorf("the local superuser's session lists %d permissions, want none (as xapi)", len(got))
	}
}

// Issue 29, finding 12: a refused login is SESSION_AUTHENTICATION_FAILED
// [user name, "Authentication failure"], as xapi sends it (PAM's text),
// whether the user exists, the password is wrong or the account has no
// subject; change_password with a wrong old password likewise.
func TestAuthenticationFailedParameters(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	// An account without a subject.
	hash, err := api.HashPassword("lone-pw", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.User.Class, "", (&dm.UserRecord{ShortName: "lone", OtherConfig: map[string]string{}, PasswordHash: hash}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, user, pw string }{
		{"session.login_with_password", "root", "wrong"},
		{"session.login_with_password", "nobody", "x"},
		{"session.login_with_password", "lone", "lone-pw"},
	} {
		data := h.fails(xerr.SessionAuthenticationFailed, c.method, c.user, c.pw, "2.21", "test")
		if !slices.Equal(data, []string{c.user, "Authentication failure"}) {
			t.Errorf("%s %s: parameters %q", c.method, c.user, data)
		}
	}
	data := h.fails(xerr.SessionAuthenticationFailed, "session.change_password", root, "wrong", "new")
	if !slices.Equal(data, []string{"root", "Authentication failure"}) {
		t.Errorf("change_password: parameters %q", data)
	}
}
