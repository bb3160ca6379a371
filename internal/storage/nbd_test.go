package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage/imageformat"
)

func needQemuNBD(t testing.TB) {
	t.Helper()
	needQemuImg(t)
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("qemu-nbd is not installed")
	}
}

// TestNBDRoundTrip drives a qcow2 image through the private qemu-nbd
// storage starts and the NBD client (URI parsing and the protocol itself
// are tested in internal/nbd).
func TestNBDRoundTrip(t *testing.T) {
	needQemuNBD(t)
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "x.qcow2")
	if err := imageformat.CreateQcow2(img, 64<<20, "", ""); err != nil {
		t.Fatal(err)
	}
	rd, err := runDir("")
	if err != nil {
		t.Fatal(err)
	}
	q, err := startQemuNBD(ctx, rd, img, "qcow2", false)
	if err != nil {
		t.Fatal(err)
	}
	defer q.stop()
	c, err := nbd.Dial(ctx, q.uri())
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 64<<20 {
		t.Fatalf("size %d", c.Size())
	}
	data := make([]byte, 16<<20)
	rand.Read(data)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.WriteAt(data[i*4<<20:(i+1)*4<<20], int64(i)*4<<20); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := c.WriteZeroes(32<<20, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 16<<20)
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if _, err := c.ReadAt(got[:1], 64<<20); err == nil {
		t.Fatal("read beyond the end succeeded")
	}
	c.Close()
	if err := q.stop(); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "check", img).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
}
