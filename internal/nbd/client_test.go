package nbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startQemuNBD serves a fresh raw file of size bytes as export "vdi" on a
// Unix socket with the real qemu-nbd, and returns its URI.
func startQemuNBD(t *testing.T, size int64, readOnly bool) (URI, string) {
	t.Helper()
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("qemu-nbd is not installed")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nbd.sock")
	args := []string{"--persistent", "--shared=8", "-f", "raw", "-x", "vdi", "--socket=" + sock, "--cache=none", "--aio=threads"}
	if readOnly {
		args = append(args, "--read-only")
	}
	cmd := exec.Command("qemu-nbd", append(args, img)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	// Ready when it accepts: the socket's file exists from bind(2),
	// before listen(2), and a connection in between is refused.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", sock); err == nil {
			_ = c.Close()
			return URI{Network: "unix", Socket: sock, Export: "vdi"}, img
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("qemu-nbd did not start: %s", stderr.String())
	return URI{}, ""
}

func TestClientAgainstQemuNBD(t *testing.T) {
	u, img := startQemuNBD(t, 32<<20, false)
	ctx := context.Background()
	c, err := Dial(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size() != 32<<20 || c.ReadOnly() {
		t.Fatalf("size %d read-only %v", c.Size(), c.ReadOnly())
	}
	// Writes longer than MaxRequest from several goroutines at once.
	data := make([]byte, 12<<20)
	_, _ = rand.Read(data)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := c.WriteAt(data[i*6<<20:(i+1)*6<<20], int64(i)*6<<20); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := c.WriteZeroes(4<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	clear(data[4<<20 : 5<<20])
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	if _, err := c.ReadAt(got[:1], 32<<20); err == nil {
		t.Fatal("read beyond the end succeeded")
	}
	if err := c.WriteZeroes(32<<20-1, 2); err == nil {
		t.Fatal("zeroing beyond the end succeeded")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(got[:1], 0); err == nil {
		t.Fatal("read after Close succeeded")
	}
	onDisk, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk[:len(data)], data) {
		t.Fatal("the file does not hold what was written")
	}
}

func TestClientReadOnlyAndMissingExport(t *testing.T) {
	u, _ := startQemuNBD(t, 1<<20, true)
	c, err := Dial(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.ReadOnly() {
		t.Fatal("export not read-only")
	}
	var se ServerError
	if _, err := c.WriteAt([]byte{1}, 0); !errors.As(err, &se) {
		t.Fatalf("write to a read-only export: %v", err)
	}
	u.Export = "nosuch"
	if _, err := Dial(context.Background(), u); err == nil {
		t.Fatal("a missing export was negotiated")
	}
}

// A server that accepts and then says nothing must not hang Dial past
// its context's deadline; one that speaks another protocol is refused.
func TestDialHostileServer(t *testing.T) {
	for name, greeting := range map[string][]byte{"silent": nil, "http": []byte("HTTP/1.1 400 Bad Request\r\n\r\n")} {
		t.Run(name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go func() {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				_, _ = conn.Write(greeting)
				_, _ = io.Copy(io.Discard, conn)
			}()
			addr := l.Addr().(*net.TCPAddr)
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err = Dial(ctx, URI{Network: "tcp", Host: "127.0.0.1", Port: addr.Port})
			if err == nil {
				t.Fatal("handshake succeeded")
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("Dial took %v", time.Since(start))
			}
		})
	}
}

func TestServerErrorIsENOSPC(t *testing.T) {
	if !errors.Is(ServerError(errENOSPC), syscall.ENOSPC) || errors.Is(ServerError(5), syscall.ENOSPC) {
		t.Fatal("ServerError does not map ENOSPC")
	}
}

// rwPair feeds a canned server transcript and swallows what the client writes.
type rwPair struct {
	io.Reader
}

func (rwPair) Write(p []byte) (int, error) { return len(p), nil }

func FuzzHandshake(f *testing.F) {
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
		size, _, err := handshake(rwPair{bytes.NewReader(b)}, "vdi")
		if err == nil && size < 0 {
			t.Fatal("negative size accepted")
		}
	})
}
