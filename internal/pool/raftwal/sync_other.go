//go:build !linux

package raftwal

import (
	"errors"
	"os"
)

func fdatasync(f *os.File) error { return f.Sync() }

// preallocate is not done here: each write extends the file.
func preallocate(*os.File, int64, int64) error { return errors.ErrUnsupported }
