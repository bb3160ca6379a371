package sysstatus

import (
	"bytes"
	"strings"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/xmldb"
	"toolstackd/internal/schema"
)

func TestSecretName(t *testing.T) {
	for _, c := range []struct {
		name string
		want bool
	}{
		{"password", true},
		{"admin_password", true},
		{"CHAPPassword", true},
		{"passwd", true},
		{"pool_secret", true},
		{"ssh-key", true},
		{"migration_key", true},
		{"auth_token", true},
		{"credentials", true},
		{"pass", true},
		{"ldap_pass", true},
		{"bind-pass", true},
		{"folder", false},
		{"name_label", false},
		{"passthrough", false},
		{"bypass_cache", false},
		{"listen", false},
		{"", false},
	} {
		if got := SecretName(c.name); got != c.want {
			t.Errorf("SecretName(%q) = %v, want %v", c.name, got, c.want)
		}
	}
}

// row makes a dump row of class c with the given field values (by API
// field name).
func row(t *testing.T, c *schema.Class, ref string, vals map[string]any) xmldb.Row {
	t.Helper()
	v := make([]any, len(c.Fields))
	for name, x := range vals {
		f := c.Field(name)
		if f == nil {
			t.Fatalf("%s has no field %s", c.Name, name)
		}
		v[f.Index] = x
	}
	return xmldb.Row{Ref: ref, Created: 1, Modified: 2, Values: v}
}

// TestRedactDump: each case is a value of the database and whether a
// redacted dump may still show it.
func TestRedactDump(t *testing.T) {
	type kept struct {
		text string
		kept bool
	}
	d := &xmldb.Dump{SchemaMajor: dm.Model.SchemaMajor, SchemaMinor: dm.Model.SchemaMinor, Generation: 7,
		Tables: map[*schema.Class][]xmldb.Row{
			dm.Session.Class: {row(t, dm.Session.Class, "OpaqueRef:session-bearer-1", map[string]any{"uuid": "5e551011-0000-4000-8000-000000000001"})},
			dm.Secret.Class: {row(t, dm.Secret.Class, "OpaqueRef:secret-1", map[string]any{
				"uuid": "5ec2e700-0000-4000-8000-000000000001", "value": "the-secret-value-1",
				"other_config": map[string]string{"purpose": "chap"}})},
			dm.Pool.Class: {row(t, dm.Pool.Class, "OpaqueRef:pool-1", map[string]any{
				"uuid": "9001a000-0000-4000-8000-000000000001", "name_label": "visible-pool-name",
				"repository_proxy_password": "OpaqueRef:secret-1",
				"other_config": map[string]string{"admin_password": "hunter2-pool", "migration_key": "k3y-material",
					"auth-token": "tok-123", "memory-ratio": "visible-ratio"}})},
			dm.User.Class: {row(t, dm.User.Class, "OpaqueRef:user-1", map[string]any{
				"uuid": "05e20000-0000-4000-8000-000000000001", "short_name": "visible-user",
				"password_hash": "$pbkdf2-sha256$hash-of-root"})},
			dm.Host.Class: {row(t, dm.Host.Class, "OpaqueRef:host-1", map[string]any{
				"uuid": "40570000-0000-4000-8000-000000000001", "hostname": "visible-host",
				"external_auth_configuration": map[string]string{"user": "visible-admin", "pass": "ad-pass-9"},
				"other_config":                map[string]string{}})},
		}}
	orig := d.Tables[dm.Pool.Class][0].Values[dm.Pool.OtherConfig.Index].(map[string]string)["admin_password"]
	out := RedactDump(d)
	var b bytes.Buffer
	if err := xmldb.EncodeDump(&b, dm.Model, out); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, c := range []kept{
		{"session-bearer-1", false},
		{"5e551011-0000-4000-8000-000000000001", false},
		{"the-secret-value-1", false},
		{"hunter2-pool", false},
		{"k3y-material", false},
		{"tok-123", false},
		{"$pbkdf2-sha256$hash-of-root", false},
		{"ad-pass-9", false},
		{"5ec2e700-0000-4000-8000-000000000001", true}, // the secret's row stays, its value goes
		{"chap", true},
		{"visible-pool-name", true},
		{"visible-ratio", true},
		{"OpaqueRef:secret-1", true}, // a reference to a secret is not the secret
		{"visible-user", true},
		{"visible-host", true},
		{"visible-admin", true},
		{Removed, true},
	} {
		if got := strings.Contains(text, c.text); got != c.kept {
			t.Errorf("dump holds %q: %v, want %v", c.text, got, c.kept)
		}
	}
	if _, ok := out.Tables[dm.Session.Class]; ok {
		t.Error("the redacted dump has a session table")
	}
	// The dump given is left as it was.
	if got := d.Tables[dm.Pool.Class][0].Values[dm.Pool.OtherConfig.Index].(map[string]string)["admin_password"]; got != orig {
		t.Errorf("RedactDump changed its input: %q", got)
	}
	if got := d.Tables[dm.Secret.Class][0].Values[dm.Secret.Value.Index]; got != "the-secret-value-1" {
		t.Errorf("RedactDump changed its input: %v", got)
	}
	if _, err := xmldb.Decode(strings.NewReader(text), dm.Model); err != nil {
		t.Errorf("the redacted dump does not read back: %v", err)
	}
}

// TestDumpOfRealDatabase dumps a database made by a first boot, with a
// secret and a password in the pool's other_config.
func TestDumpOfRealDatabase(t *testing.T) {
	srv, _ := newServer(t)
	if _, err := srv.DB.Update(func(tx *db.Tx) error {
		if _, err := tx.Insert(dm.Secret.Class, "", (&dm.SecretRecord{UUID: "5ec2e700-0000-4000-8000-000000000002",
			Value: "db-secret-value", OtherConfig: map[string]string{}}).Row()); err != nil {
			return err
		}
		pool := tx.All(dm.Pool.Class)[0]
		return tx.AddToMap(dm.Pool.OtherConfig, pool.Ref, "backup_password", "db-pool-password")
	}); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := xmldb.EncodeDump(&b, dm.Model, RedactDump(DumpOf(dm.Model, srv.DB.Snapshot()))); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, s := range []string{"db-secret-value", "db-pool-password"} {
		if strings.Contains(text, s) {
			t.Errorf("dump holds %q", s)
		}
	}
	for _, s := range []string{"5ec2e700-0000-4000-8000-000000000002", "backup_password", `<table name="host">`} {
		if !strings.Contains(text, s) {
			t.Errorf("dump lacks %q", s)
		}
	}
}

func TestRedactConfig(t *testing.T) {
	in := "# a comment with password = shown\n" +
		"listen = 0.0.0.0:80\n" +
		"redo-log = /var/lib/redo\n" +
		"ldap-password = \"p4ss word\"\n" +
		"api_token=abc\n" +
		"proxy = http://user:pr0xy@proxy:3128/\n" +
		"not a setting\n"
	got := string(RedactConfig([]byte(in)))
	for _, bad := range []string{"p4ss", "abc", "pr0xy"} {
		if strings.Contains(got, bad) {
			t.Errorf("redacted config holds %q:\n%s", bad, got)
		}
	}
	for _, good := range []string{"# a comment with password = shown", "listen = 0.0.0.0:80", "redo-log = /var/lib/redo",
		"ldap-password = " + Removed, "api_token = " + Removed, "http://user:" + Removed + "@proxy:3128/", "not a setting"} {
		if !strings.Contains(got, good) {
			t.Errorf("redacted config lacks %q:\n%s", good, got)
		}
	}
}

func TestRedactArgs(t *testing.T) {
	in := []string{"qemu-system-x86_64", "-object", "secret,id=vnc0,data=s3cret,format=raw",
		"-vnc", "127.0.0.1:1,password=on", "-spice", "port=5900,password-secret=sec0",
		"-drive", "file=/var/lib/toolstackd/disk.img,if=virtio"}
	got := strings.Join(RedactArgs(in), " ")
	if strings.Contains(got, "s3cret") || strings.Contains(got, "sec0") {
		t.Errorf("args keep a secret: %s", got)
	}
	for _, want := range []string{"secret,id=vnc0,data=" + Removed + ",format=raw", "file=/var/lib/toolstackd/disk.img,if=virtio"} {
		if !strings.Contains(got, want) {
			t.Errorf("args lack %q: %s", want, got)
		}
	}
	if in[2] != "secret,id=vnc0,data=s3cret,format=raw" {
		t.Error("RedactArgs changed its input")
	}
}
