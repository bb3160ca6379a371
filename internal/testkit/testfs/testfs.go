// Package testfs gives tests real, small file systems to run out of space
// on: a tmpfs of a chosen size, and a way to fill one to the last block.
// The disk-full tests of the database, the daemon and storage use it.
package testfs

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// MountTmpfs mounts a tmpfs of the given size (mount's syntax: "16m") on a
// new temporary directory and unmounts it when the test ends. Where
// mounting is not allowed (no root or CAP_SYS_ADMIN) the test is skipped,
// and says why.
func MountTmpfs(t testing.TB, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("SKIPPED: this test needs to mount a tmpfs (root or CAP_SYS_ADMIN), and mount failed here: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Logf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes path until its file system has no space left, down to the
// last 512 bytes; any error but ENOSPC fails the test.
func Fill(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) //nolint:gosec // a test names a file on its own tmpfs
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, chunk := range []int{1 << 20, 4096, 512} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filling the disk: %v", err)
				}
				break
			}
		}
	}
}
