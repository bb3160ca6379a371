package api_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

func (h *harness) dump(s string) []byte {
	h.t.Helper()
	resp, err := http.Get(h.http.URL + "/pool/xmldbdump?session_id=" + s)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/xml" {
		h.t.Fatalf("dump: %d %s", resp.StatusCode, b)
	}
	return b
}

func (h *harness) restore(s string, body []byte) (int, string) {
	req, _ := http.NewRequest(http.MethodPut, h.http.URL+"/pool/xmldbdump?session_id="+s, bytes.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// records reads every persistent class's records.
func (h *harness) records(s string) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for _, c := range dm.Model.Classes {
		if !c.InDB || !c.Persist || !c.HasGetAllRecords {
			continue
		}
		out[c.Name] = h.ok(c.Name+".get_all_records", s)
	}
	return out
}

func TestDumpAndRestoreRoundTrip(t *testing.T) {
	a := newHarness(t)
	sa := a.login("root", rootPW)
	net := str(t, a.ok("network.create", sa, map[string]any{"name_label": "odd name\twith %. and 'quotes'", "other_config": map[string]any{"k": "v w"}}))
	a.ok("network.add_tags", sa, net, "t1")
	dump := a.dump(sa)

	b := newHarness(t)
	sb := b.login("root", rootPW)
	if code, msg := b.restore(sb, dump); code != 200 {
		t.Fatalf("restore: %d %s", code, msg)
	}
	ra, rb := a.records(sa), b.records(sb)
	for cls, want := range ra {
		if !bytes.Equal(want, rb[cls]) {
			t.Errorf("%s records differ after restore:\n%.300s\n%.300s", cls, want, rb[cls])
		}
	}
	// The restored pool's root password is the dumped one; the session
	// that did the restore keeps working.
	b.ok("host.get_all", sb)
	// A dump of the restored database is the same document, but for the
	// generations.
	if len(b.dump(sb)) < len(dump)/2 {
		t.Error("second dump much smaller")
	}
}

func TestRestoreRefusesBadInputAndKeepsTheDatabase(t *testing.T) {
	h := newHarness(t)
	s := h.login("root", rootPW)
	good := h.dump(s)
	before := h.d.Generation()
	recs := h.records(s)
	text := string(good)
	vm := strings.Index(text, `<table name="VM">`)
	for name, body := range map[string]string{
		"not XML":        "this is not xml",
		"truncated":      text[:len(text)/2],
		"unknown table":  strings.Replace(text, `<table name="VM">`, `<table name="Nope"><row ref="OpaqueRef:x"/></table><table name="VM">`, 1),
		"unknown column": text[:vm] + strings.Replace(text[vm:], `<row ref=`, `<row bogus_column="1" ref=`, 1),
		"newer schema":   strings.Replace(text, `key="schema_major_vsn" value="5"`, `key="schema_major_vsn" value="6"`, 1),
		"bad int":        strings.Replace(text, `memory__static_max="`, `memory__static_max="x`, 1),
		"duplicate uuid": duplicateRow(text),
	} {
		code, msg := h.restore(s, []byte(body))
		if code != http.StatusBadRequest {
			t.Errorf("%s: %d %s", name, code, msg)
		} else {
			t.Logf("%s: %s", name, strings.TrimSpace(msg))
		}
	}
	if h.d.Generation() != before {
		t.Error("a refused restore changed the database")
	}
	after := h.records(s)
	for cls := range recs {
		if !bytes.Equal(recs[cls], after[cls]) {
			t.Errorf("%s changed", cls)
		}
	}
	// Without a session: 401.
	resp, _ := http.Get(h.http.URL + "/pool/xmldbdump")
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous dump: %d", resp.StatusCode)
	}
}

// duplicateRow copies the first VM row under a new ref (same uuid).
func duplicateRow(text string) string {
	i := strings.Index(text, `<table name="VM"><row `)
	if i < 0 {
		return text
	}
	start := i + len(`<table name="VM">`)
	end := strings.Index(text[start:], "/>") + start + 2
	row := text[start:end]
	dup := strings.Replace(row, `ref="OpaqueRef:`, `ref="OpaqueRef:dup-`, 2)
	return text[:end] + dup + text[end:]
}

func TestRestoreXapiFixture(t *testing.T) {
	body, err := os.ReadFile("../db/xmldb/testdata/xapi-state.db")
	if err != nil {
		t.Skip("fixture not present")
	}
	h := newHarness(t)
	s := h.login("root", rootPW)
	if code, msg := h.restore(s, body); code != 200 {
		t.Fatalf("restoring a state.db written in xapi's format: %d %s", code, msg)
	}
	var vms map[string]map[string]any
	json.Unmarshal(h.ok("VM.get_all_records", s), &vms)
	if len(vms) == 0 {
		t.Error("no VMs after restoring the fixture")
	}
}

// A restore ends the sessions of accounts other than the local superuser:
// their rights were granted against the database that is gone.
func TestRestoreEndsOtherSessions(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	addAccount(h, root, "ro", "ro-pw", "read-only")
	ro := h.login("ro", "ro-pw")
	h.ok("host.get_all", ro)
	if code, body := h.restore(root, h.dump(root)); code != 200 {
		t.Fatalf("restore: %d %s", code, body)
	}
	h.fails("SESSION_INVALID", "host.get_all", ro)
	h.ok("host.get_all", root)
}

// Only the local superuser may destroy the root account: a pool-admin
// could otherwise shut root out of the network.
func TestRootAccountNeedsSuperuser(t *testing.T) {
	h := newHarness(t)
	root := h.login("root", rootPW)
	addAccount(h, root, "admin", "admin-pw", "pool-admin")
	admin := h.login("admin", "admin-pw")
	var rootUser string
	h.d.Snapshot().Ascend(dm.User.Class, func(r *db.Row) bool {
		if r.String(dm.User.ShortName) == "root" {
			rootUser = r.Ref
		}
		return true
	})
	if rootUser == "" {
		t.Fatal("no root user row")
	}
	h.fails("USER_IS_NOT_LOCAL_SUPERUSER", "user.destroy", admin, rootUser)
	h.login("root", rootPW)
}
