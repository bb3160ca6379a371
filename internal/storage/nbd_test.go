package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

func needQemuNBD(t testing.TB) {
	t.Helper()
	needQemuImg(t)
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("qemu-nbd is not installed")
	}
}

func TestNBDRoundTrip(t *testing.T) {
	needQemuNBD(t)
	ctx := context.Background()
	dir := t.TempDir()
	img := filepath.Join(dir, "x.qcow2")
	if err := createQcow2(img, 64<<20, "", ""); err != nil {
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
	c, err := dialNBD(ctx, q.addr())
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

func TestParseNBDURI(t *testing.T) {
	for in, want := range map[string]nbdAddr{
		"nbd+unix:///vdi?socket=/run/x.sock": {"unix", "/run/x.sock", "vdi"},
		"nbd://10.0.0.1/exp":                 {"tcp", "10.0.0.1:10809", "exp"},
		"nbd://h:1234/":                      {"tcp", "h:1234", ""},
	} {
		got, err := parseNBDURI(in)
		if err != nil || got != want {
			t.Errorf("%s: %+v %v", in, got, err)
		}
	}
	for _, bad := range []string{"file:///x", "nbd+unix:///x", "nbd:///x", "::"} {
		if _, err := parseNBDURI(bad); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

// rwPair feeds a canned server transcript and swallows what the client writes.
type rwPair struct {
	io.Reader
}

func (rwPair) Write(p []byte) (int, error) { return len(p), nil }

func FuzzNBDHandshake(f *testing.F) {
	var good []byte
	good = append(good, "NBDMAGIC"...)
	good = append(good, "IHAVEOPT"...)
	good = append(good, 0, 3)
	good = append(good, 0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 12)
	good = append(good, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0x45)
	good = append(good, 0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0)
	f.Add(good)
	f.Add(good[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		size, _, err := nbdHandshake(rwPair{bytes.NewReader(b)}, "vdi")
		if err == nil && size < 0 {
			t.Fatal("negative size accepted")
		}
	})
}

func FuzzParseNBDURI(f *testing.F) {
	f.Add("nbd+unix:///vdi?socket=/run/x.sock")
	f.Add("nbd://h:1/e")
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseNBDURI(s)
		if err == nil && (a.Network == "" || a.Address == "") {
			t.Fatalf("%q gave %+v", s, a)
		}
	})
}
