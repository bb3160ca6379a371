package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecretLifecycle(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Current()
	if len(first) != 2*secretBytes || !s.Check(first) || s.Check("") || s.Check(first+"x") || s.Check(first[:10]) {
		t.Fatalf("made secret %q", first)
	}
	st, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file %v %v", st, err)
	}
	// The same secret after a restart.
	s2, err := Open(dir)
	if err != nil || s2.Current() != first {
		t.Fatalf("reopened: %v %q", err, s2.Current())
	}
	// Rotation: accepted first (the old one still presented), then
	// presented, both valid until retired, and across a restart.
	next, _ := New()
	if err := s.Accept(next); err != nil {
		t.Fatal(err)
	}
	if !s.Check(first) || !s.Check(next) || s.Current() != first {
		t.Fatal("Accept did not keep presenting the old secret")
	}
	if err := s.Rotate(next); err != nil {
		t.Fatal(err)
	}
	if !s.Check(first) || !s.Check(next) || s.Current() != next || len(s.Valid()) != 2 {
		t.Fatal("rotation lost a secret")
	}
	s3, err := Open(dir)
	if err != nil || !s3.Check(first) || !s3.Check(next) {
		t.Fatalf("rotation not kept across a restart: %v", err)
	}
	if err := s.Retire(); err != nil {
		t.Fatal(err)
	}
	if s.Check(first) || !s.Check(next) || len(s.Valid()) != 1 {
		t.Fatal("retired secret still valid")
	}
	// Joining a pool: its secret replaces ours.
	if err := s.Set("pool-secret-of-the-coordinator"); err != nil {
		t.Fatal(err)
	}
	if s.Check(next) || !s.Check("pool-secret-of-the-coordinator") {
		t.Fatal("Set kept the old secret")
	}
	// No temporary files left behind.
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("dir holds %v", ents)
	}
}

func TestSecretRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "has space", "new\nline", strings.Repeat("a", maxLen+1), "\x00"} {
		if s.Set(bad) == nil || s.Rotate(bad) == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	// A damaged file is an error, not an empty secret.
	for _, body := range []string{"", "\n", "a\nb\nc\n", "bad secret\n"} {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, FileName), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(d); err == nil {
			t.Errorf("opened a file holding %q", body)
		}
	}
}
