package raftwal

import (
	"os"
	"syscall"
)

// fdatasync syncs a file's data and the metadata needed to read it back
// (its size), not its times.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
