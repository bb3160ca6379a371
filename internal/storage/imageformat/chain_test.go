package imageformat

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A chain follows relative names from each image's own directory, takes
// a backing file's format from its header or its name, and refuses a
// loop.
func TestChain(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(p("base.raw"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, backing, format string }{
		{p("mid.qcow2"), "base.raw", ""},
		{filepath.Join(sub, "top.qcow2"), "../mid.qcow2", "qcow2"},
		{p("loop1.qcow2"), "loop2.qcow2", "qcow2"},
		{p("loop2.qcow2"), "loop1.qcow2", "qcow2"},
	} {
		if err := CreateQcow2(c.path, 1<<20, c.backing, c.format); err != nil {
			t.Fatal(err)
		}
	}
	paths, formats, err := Chain(filepath.Join(sub, "top.qcow2"), "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(sub, "top.qcow2"), p("mid.qcow2"), p("base.raw")}; !slices.Equal(paths, want) {
		t.Fatalf("paths %v, want %v", paths, want)
	}
	if want := []string{"qcow2", "qcow2", "raw"}; !slices.Equal(formats, want) {
		t.Fatalf("formats %v, want %v", formats, want)
	}
	if _, _, err := Chain(p("loop1.qcow2"), "qcow2"); err == nil {
		t.Fatal("a looping chain was accepted")
	}
	if paths, _, err := Chain(p("base.raw"), "raw"); err != nil || len(paths) != 1 {
		t.Fatalf("a raw image: %v %v", paths, err)
	}
}
