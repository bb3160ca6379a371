package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"toolstackd/internal/safepath"
)

// errOutside is returned for a removal refused because the path is not
// below its directory.
var errOutside = errors.New("refusing to remove a path outside its directory")

// removeBelow removes path and everything under it, provided path lies
// strictly below dir once links are followed (dir itself is never
// removed). Paths read back from journals go through it, so a journal
// that names another directory cannot make the daemon delete it.
func removeBelow(dir, path string) error {
	if path == "" {
		return nil
	}
	if !filepath.IsAbs(path) || filepath.Clean(path) == filepath.Clean(dir) || !safepath.Contains(dir, path) ||
		!safepath.Within(dir, path) {
		return fmt.Errorf("%w: %q is not below %q", errOutside, path, dir)
	}
	return os.RemoveAll(path)
}

// sockDirPrefix names the per-domain socket directories made in the
// temporary directory when the state directory's path is too long.
const sockDirPrefix = "toolstackd-"

// isTempSockDir reports whether dir is one of those.
func isTempSockDir(dir string) bool {
	return filepath.Dir(dir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(dir), sockDirPrefix) &&
		safepath.Name(filepath.Base(dir)) == nil
}
