package xenops

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/storage"
)

// copyNBD between two real NBD exports (qemu-nbd on raw files), the
// destination reached through a storage.Relay as in a storage migration:
// the bytes arrive, runs of zeroes are not written (the destination's
// file stays sparse there), and a cancelled context ends the copy.
func TestCopyNBD(t *testing.T) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("no qemu-nbd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	const size = 24 << 20
	data := make([]byte, size)
	if _, err := rand.Read(data[:4<<20]); err != nil {
		t.Fatal(err)
	}
	copy(data[16<<20:], data[:4<<20]) // 4..16 MiB and 20..24 MiB stay zero
	src, dst := filepath.Join(dir, "src.raw"), filepath.Join(dir, "dst.raw")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(dst, size); err != nil {
		t.Fatal(err)
	}
	se, err := storage.ExportImage(ctx, dir, src, "raw")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = se.Close() }()
	de, err := storage.ExportImage(ctx, dir, dst, "raw")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = de.Close() }()
	relay, err := storage.NewRelay(dir, func(context.Context) (net.Conn, error) {
		a, b := net.Pipe()
		go func() { _ = de.Serve(ctx, b) }() // the tunnel's life, not the dial's
		return a, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relay.Close() }()
	var last float64
	if err := copyNBD(ctx, se.URI(), relay.URI(), func(f float64) { last = f }); err != nil {
		t.Fatal(err)
	}
	if last != 1 {
		t.Fatalf("progress ended at %v", last)
	}
	_ = de.Close()
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the copy differs")
	}
	// 8 MiB of data written; the 16 MiB of zeroes were not.
	var fs syscall.Stat_t
	if err := syscall.Stat(dst, &fs); err != nil {
		t.Fatal(err)
	}
	if used := fs.Blocks * 512; used > 12<<20 {
		t.Fatalf("the copy wrote the zeroes: %d bytes allocated", used)
	}
	// A cancelled context ends a copy at once.
	cctx, stop := context.WithCancel(ctx)
	stop()
	if err := copyNBD(cctx, se.URI(), se.URI(), nil); err == nil {
		t.Fatal("a cancelled copy succeeded")
	}
	if allZero(data[:4<<20]) || !allZero(data[4<<20:16<<20]) {
		t.Fatal("allZero")
	}
}
