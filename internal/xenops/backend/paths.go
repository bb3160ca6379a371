package backend

import (
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
