package backend

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

func TestMigrateStreamRoundTrip(t *testing.T) {
	data := make([]byte, 3*MaxMigrateFrame+12345)
	_, _ = rand.Read(data)
	var buf bytes.Buffer
	w, err := NewMigrateWriter(&buf, "qemu")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 1000, MaxMigrateFrame + 7} {
		if _, err := w.Write(data[:n]); err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.End(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("write after end accepted")
	}
	buf.WriteString("AFTER") // the carrier's next traffic
	r := NewMigrateReader(&buf, "qemu")
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(len(got)) != w.Total() || r.Total() != w.Total() {
		t.Errorf("read %d bytes, wrote %d", len(got), w.Total())
	}
	if buf.String() != "AFTER" {
		t.Errorf("the reader read past the end frame: %q left", buf.String())
	}
}

func TestMigrateStreamAbort(t *testing.T) {
	var buf bytes.Buffer
	w, _ := NewMigrateWriter(&buf, "simulator")
	_, _ = w.Write([]byte("partial"))
	_ = w.Abort(strings.Repeat("r", 10000))
	_, err := io.ReadAll(NewMigrateReader(&buf, "simulator"))
	var a *MigrateAborted
	if !errors.As(err, &a) || len(a.Reason) != maxAbortReason {
		t.Fatalf("got %v", err)
	}
}

func FuzzMigrateReader(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewMigrateWriter(&buf, "qemu")
	_, _ = w.Write([]byte("hello"))
	_ = w.End()
	f.Add(buf.Bytes())
	f.Add([]byte(migrateSignature + "\x04qemuD\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewMigrateReader(bytes.NewReader(b), "qemu")
		got, err := io.ReadAll(r)
		if err == nil && uint64(len(got)) != r.Total() {
			t.Fatal("total mismatch")
		}
		if len(got) > len(b) {
			t.Fatal("more data than input")
		}
	})
}

// BenchmarkMigrateStreamLoopback is the framed stream's own cost: 32 KiB
// writes (QEMU's buffer) framed into loopback TCP and read back.
func BenchmarkMigrateStreamLoopback(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	send, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer send.Close()
	recv := <-acc
	defer recv.Close()
	const total = 64 << 20
	chunk := make([]byte, 32<<10)
	b.SetBytes(total)
	for b.Loop() {
		done := make(chan error, 1)
		go func() {
			n, err := io.Copy(io.Discard, NewMigrateReader(recv, "qemu"))
			if err == nil && n != total {
				err = io.ErrShortWrite
			}
			done <- err
		}()
		w, err := NewMigrateWriter(send, "qemu")
		if err != nil {
			b.Fatal(err)
		}
		for range total / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.End(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
}
