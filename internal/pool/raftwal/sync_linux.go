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

// preallocate extends f by n bytes from off, reading as zeros, with the
// blocks reserved: writing into them later does not grow the file.
func preallocate(f *os.File, off, n int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, off, n)
		if err != syscall.EINTR {
			return err
		}
	}
}

// fdatasyncShared is fdatasync on a file another goroutine may close
// meanwhile: the descriptor stays open until the call returns.
func fdatasyncShared(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
