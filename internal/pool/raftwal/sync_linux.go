package raftwal

import (
	"os"
	"syscall"
)

// onFD runs call on f's descriptor, again while it is interrupted. The
// descriptor stays open until call returns, even if another goroutine
// closes f meanwhile (the syncer syncs a file a delete may close).
func onFD(f *os.File, call func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if cerr = call(int(fd)); cerr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return cerr
}

// fdatasync syncs a file's data and the metadata needed to read it back
// (its size), not its times. f may be closed by another goroutine
// meanwhile (see onFD).
func fdatasync(f *os.File) error { return onFD(f, syscall.Fdatasync) }

// preallocate extends f by n bytes from off, reading as zeros, with the
// blocks reserved: writing into them later does not grow the file.
func preallocate(f *os.File, off, n int64) error {
	return onFD(f, func(fd int) error { return syscall.Fallocate(fd, 0, off, n) })
}
