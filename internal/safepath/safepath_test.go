package safepath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestJoin(t *testing.T) {
	for _, c := range []struct {
		elem []string
		want string // "" for ErrEscape
	}{
		{[]string{"a"}, "/d/a"},
		{[]string{"a", "b.img"}, "/d/a/b.img"},
		{[]string{"a/../b"}, "/d/b"},
		{nil, "/d"},
		{[]string{".."}, ""},
		{[]string{"a/../../etc/shadow"}, ""},
		{[]string{"/etc/shadow"}, ""},
		{[]string{"a\x00b"}, ""},
		{[]string{"a", "..", ".."}, ""},
	} {
		got, err := Join("/d", c.elem...)
		if c.want == "" {
			if !errors.Is(err, ErrEscape) {
				t.Errorf("Join(%q) = %q, %v; want ErrEscape", c.elem, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Join(%q) = %q, %v; want %q", c.elem, got, err, c.want)
		}
	}
}

func TestName(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a\\b", "a\x00"} {
		if Name(bad) == nil {
			t.Errorf("Name(%q) accepted", bad)
		}
		if _, err := JoinName("/d", bad); !errors.Is(err, ErrBadName) {
			t.Errorf("JoinName(%q) = %v", bad, err)
		}
	}
	if p, err := JoinName("/d", "0b7c.img"); err != nil || p != "/d/0b7c.img" {
		t.Errorf("JoinName = %q, %v", p, err)
	}
}

func TestWithinAndLinks(t *testing.T) {
	root := t.TempDir()
	inside := filepath.Join(root, "inside")
	outside := filepath.Join(root, "outside")
	os.Mkdir(inside, 0o700)
	os.Mkdir(outside, 0o700)
	if !Within(root, inside) || Within(inside, root) || !Within(root, root) {
		t.Fatal("Within is wrong on plain directories")
	}
	if Within(inside, inside+"x") {
		t.Fatal("a sibling with a common prefix counted as inside")
	}
	link := filepath.Join(inside, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if !Within(inside, filepath.Join(link, "f")) {
		t.Fatal("lexically the link is inside")
	}
	if Contains(inside, filepath.Join(link, "f")) {
		t.Fatal("Contains followed no link: a path through a link out of the directory was accepted")
	}
	if !Contains(outside, filepath.Join(link, "new", "file")) {
		t.Fatal("Contains should resolve the existing prefix of a path that does not exist yet")
	}
	if !Overlaps(root, inside) || Overlaps(inside, outside) {
		t.Fatal("Overlaps is wrong")
	}
}

func FuzzJoin(f *testing.F) {
	for _, s := range []string{"a", "..", "a/../..", "/x", "a\x00", "./.././a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, elem string) {
		p, err := Join("/base/dir", elem)
		if err == nil && !Within("/base/dir", p) {
			t.Fatalf("Join(%q) = %q escapes", elem, p)
		}
	})
}
