package backend

import (
	"io"
	"os"

	"toolstackd/internal/safepath"
	"toolstackd/internal/xerr"
)

// Every path xenops builds from data (a VM's uuid from the database or a
// journal, a hook's file name) goes through helpers that use
// internal/safepath: a uuid must be one plain file name, and whatever is
// removed must lie strictly below the directory that owns it.

// EntryPath is dir/<name><suffix> for a name taken from data (a VM uuid),
// refused as INVALID_VALUE when it is not a plain file name.
func EntryPath(dir, name, suffix string) (string, error) {
	p, err := safepath.JoinName(dir, name+suffix)
	if err != nil || safepath.Name(name) != nil {
		return "", xerr.New(xerr.InvalidValue, "uuid", name)
	}
	return p, nil
}

// CopyFile copies a file into a state directory with mode 0600: a suspend
// image into a clone, the firmware's variable store into a domain's
// directory. to is a path built with EntryPath or below such a path.
func CopyFile(from, to string) error {
	in, err := os.Open(from) //nolint:gosec // the configured OVMF vars or a suspend image in the suspend dir
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(in.Close)
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) //nolint:gosec // a path in a backend's state dir or the suspend dir
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
