// Package safepath builds file-system paths from data that may be hostile
// (API arguments, suspend images, plugin output, records from other hosts)
// so that the result always stays inside a chosen directory.
//
// Every place in toolstackd that makes a path out of data goes through
// this package: a caller names the directory it trusts and the parts it
// was given, and gets back either a path inside that directory or
// ErrEscape. The checks are lexical (no "..", no absolute parts, no NUL)
// plus, with Resolve and Contains, a check of where symbolic links really
// lead. Code that then opens files below a directory an attacker can also
// write to should prefer os.Root, which holds the same promise while the
// file is opened.
package safepath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrEscape is returned for a path that would leave its directory.
var ErrEscape = errors.New("path leaves its directory")

// ErrBadName is returned for a name that is not one plain path component.
var ErrBadName = errors.New("not a plain file name")

// Error says which path was refused and why.
type Error struct {
	Dir, Elem string
	Err       error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%q in %q: %v", e.Elem, e.Dir, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Name checks that s is one plain path component: not empty, not "." or
// "..", without a separator or a NUL byte. UUIDs, refs and file names
// taken from data are checked with it before use.
func Name(s string) error {
	if s == "" || s == "." || s == ".." || strings.ContainsAny(s, "/\\\x00") {
		return &Error{Elem: s, Err: ErrBadName}
	}
	return nil
}

// Join joins relative parts onto dir and returns the cleaned result, which
// is dir itself or a path below it. A part that is absolute, contains a
// NUL byte, or has ".." reach above dir makes it fail with ErrEscape.
// Join does not look at the file system; see Resolve for links.
func Join(dir string, elem ...string) (string, error) {
	rel := filepath.Join(elem...)
	if rel == "" {
		return filepath.Clean(dir), nil
	}
	if strings.ContainsRune(rel, 0) || !filepath.IsLocal(rel) {
		return "", &Error{Dir: dir, Elem: rel, Err: ErrEscape}
	}
	return filepath.Join(dir, rel), nil
}

// JoinName is Join for a single component checked with Name: the usual
// case of "<dir>/<uuid>.<ext>" built from a uuid.
func JoinName(dir, name string) (string, error) {
	if err := Name(name); err != nil {
		return "", &Error{Dir: dir, Elem: name, Err: ErrBadName}
	}
	return filepath.Join(dir, name), nil
}

// Within reports whether path is dir or lies below it, comparing cleaned
// absolute forms lexically.
func Within(dir, path string) bool {
	d, err1 := filepath.Abs(dir)
	p, err2 := filepath.Abs(path)
	if err1 != nil || err2 != nil {
		return false
	}
	if d == p {
		return true
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && filepath.IsLocal(rel)
}

// Resolve returns path with every symbolic link in its existing part
// followed; a tail that does not exist yet is kept as written. It is what
// to compare when a path must not reach somewhere through a link.
func Resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	head, tail := abs, ""
	for {
		real, err := filepath.EvalSymlinks(head)
		if err == nil {
			return filepath.Join(real, tail), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(head)
		if parent == head {
			return abs, nil
		}
		tail = filepath.Join(filepath.Base(head), tail)
		head = parent
	}
}

// Contains reports whether path, with links followed, is dir or lies
// below it (dir's links followed too). Use it to refuse a location given
// by a user that would land inside a protected directory, and to accept
// a file only from an allowed directory.
func Contains(dir, path string) bool {
	d, err1 := Resolve(dir)
	p, err2 := Resolve(path)
	return err1 == nil && err2 == nil && Within(d, p)
}

// Overlaps reports whether a and b (links followed) are the same
// directory or one contains the other.
func Overlaps(a, b string) bool { return Contains(a, b) || Contains(b, a) }
