// Package atomicfile replaces small files so that a crash leaves either
// the old contents or the new, never a mixture or nothing.
//
// The new contents go to a temporary file in the same directory, which
// is synced, closed and renamed over the old file; then the directory
// is synced, so that the rename itself survives a power cut. On any
// error the old file is left as it was and the temporary file removed.
package atomicfile

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// DefaultPrefix starts the name of the temporary file when the caller
// names no prefix: a hidden file, ".NAME.tmp-" and random digits.
func DefaultPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// WriteFile replaces the file at path with data, made with mode perm.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(path, perm, "", Data(data))
}

// Data is the fill of Write that writes data.
func Data(data []byte) func(w io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// Write replaces the file at path with what fill writes, made with mode
// perm. The temporary file's name starts with prefix (DefaultPrefix when
// empty), for directories whose readers skip such files.
func Write(path string, perm fs.FileMode, prefix string, fill func(w io.Writer) error) (err error) {
	if prefix == "" {
		prefix = DefaultPrefix(path)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, prefix)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()           // already closed on the way to a failed rename
			_ = os.Remove(f.Name()) // the temporary file never stays
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = fill(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes the creations, renames and removals in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir) //nolint:gosec // a directory the caller writes in
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
