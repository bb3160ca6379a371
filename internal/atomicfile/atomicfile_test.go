package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	if err := WriteFile(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "two" {
		t.Fatalf("%q %v", b, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// A failed fill leaves the old contents and no temporary file.
	boom := errors.New("boom")
	if err := Write(p, 0o600, "", func(w io.Writer) error {
		_, _ = w.Write([]byte("half"))
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two" {
		t.Fatalf("after a failed write: %q", b)
	}
	// A rename that fails (the target is a directory) leaves nothing behind.
	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(sub, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(sub, []byte("x"), 0o600); err == nil {
		t.Fatal("a file replaced a directory")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("left in the directory: %v", ents)
	}
	// A prefix names the temporary file.
	if err := Write(p, 0o600, ".tmp-", func(w io.Writer) error {
		m, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
		if len(m) != 1 {
			t.Errorf("temporary files %v", m)
		}
		_, err := w.Write([]byte("three"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
