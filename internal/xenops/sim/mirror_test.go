package sim

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// mirrorDomain makes a running domain with a raw disk of size bytes of
// random data at device 0 and returns the data.
func mirrorDomain(t *testing.T, s *Simulator, uuid, img string, size int) []byte {
	t.Helper()
	ctx := context.Background()
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(img, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, &backend.Spec{UUID: uuid, VMRef: "OpaqueRef:" + uuid, Memory: 64 << 20, Target: 64 << 20, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddDisk(ctx, uuid, backend.Disk{VDI: "OpaqueRef:vdi", Device: "0", Path: img, Format: "raw"}); err != nil {
		t.Fatal(err)
	}
	if err := s.StartDeviceModel(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	if err := s.Unpause(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	return data
}

func rawExport(t *testing.T, dir, name string, size int64) *storage.Export {
	t.Helper()
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		t.Skip("qemu-nbd is not installed")
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	e, err := storage.ExportImage(context.Background(), "", p, "raw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// TestSimMirror: the simulator's mirror checks its target for real, gets
// in sync after its delay, copies a raw disk's bytes on completion,
// pivots, cancels, and fails as injected.
func TestSimMirror(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s := newSimForMirror(t, Config{Delays: map[string]time.Duration{"mirror-copy": 200 * time.Millisecond}})
	const uuid = "00000000-0000-4000-8000-00000000a001"
	data := mirrorDomain(t, s, uuid, filepath.Join(dir, "src.raw"), 3<<20)

	// Unusable targets.
	if err := s.StartMirror(ctx, uuid, "0", backend.MirrorTarget{URI: "nbd+unix:///vdi?socket=" + filepath.Join(dir, "none")}); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("unreachable target: %v", err)
	}
	if err := s.StartMirror(ctx, uuid, "0", backend.MirrorTarget{URI: "file:///etc/passwd"}); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("not an NBD URI: %v", err)
	}
	small := rawExport(t, dir, "small", 1<<20)
	if err := s.StartMirror(ctx, uuid, "0", backend.MirrorTarget{URI: small.URI().String()}); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("small target: %v", err)
	}
	if err := s.StartMirror(ctx, uuid, "9", backend.MirrorTarget{URI: small.URI().String()}); err == nil {
		t.Fatal("mirror of a disk the domain does not have")
	}

	// Start, not yet in sync, in sync, complete: the target has the data.
	dst := rawExport(t, dir, "dst", 4<<20)
	tg := backend.MirrorTarget{URI: dst.URI().String()}
	if err := s.StartMirror(ctx, uuid, "0", tg); err != nil {
		t.Fatal(err)
	}
	if err := s.StartMirror(ctx, uuid, "0", tg); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("second mirror: %v", err)
	}
	if err := s.CompleteMirror(ctx, uuid, "0", false); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("complete before sync: %v", err)
	}
	var seen []float64
	if err := s.WaitMirrorReady(ctx, uuid, "0", func(p float64) { seen = append(seen, p) }); err != nil {
		t.Fatal(err)
	}
	if len(seen) < 2 || seen[len(seen)-1] != 1 {
		t.Fatalf("progress %v", seen)
	}
	if err := s.CompleteMirror(ctx, uuid, "0", false); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.MirrorStatus(ctx, uuid, "0"); st.Active {
		t.Fatalf("after completion: %+v", st)
	}
	c, err := nbd.Dial(ctx, dst.URI())
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("the target does not hold the disk's bytes")
	}

	// An injected failure, then cancel.
	if err := s.StartMirror(ctx, uuid, "0", tg); err != nil {
		t.Fatal(err)
	}
	s.SetFail("mirror-copy", errors.New("target went away"))
	if err := s.WaitMirrorReady(ctx, uuid, "0", nil); !xerr.HasCode(err, xerr.MirrorFailed) {
		t.Fatalf("failed mirror: %v", err)
	}
	if st, _ := s.MirrorStatus(ctx, uuid, "0"); !st.Active || st.Error == "" {
		t.Fatalf("failed mirror reads as %+v", st)
	}
	s.SetFail("mirror-copy", nil)
	if err := s.CancelMirror(ctx, uuid, "0"); err != nil {
		t.Fatal(err)
	}
	if err := s.CancelMirror(ctx, uuid, "0"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.MirrorStatus(ctx, uuid, "0"); st.Active {
		t.Fatalf("after cancel: %+v", st)
	}

	// A cancelled wait leaves the mirror running; a pivot moves the disk.
	if err := s.StartMirror(ctx, uuid, "0", tg); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.WaitMirrorReady(wctx, uuid, "0", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	if err := s.WaitMirrorReady(ctx, uuid, "0", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteMirror(ctx, uuid, "0", true); err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(uuid)
	if p := info.Disks[0].Path; p != dst.URI().String() || info.Disks[0].Format != "raw" {
		t.Fatalf("after pivot the disk is %q (%s)", p, info.Disks[0].Format)
	}

	// A destroyed domain's mirrors go with it.
	if err := s.StartMirror(ctx, uuid, "0", tg); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy(ctx, uuid); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MirrorStatus(ctx, uuid, "0"); err == nil {
		t.Fatal("status of a destroyed domain's mirror")
	}
	s.mu.Lock()
	n := len(s.mirrors)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d mirrors left", n)
	}
}

func newSimForMirror(t *testing.T, cfg Config) *Simulator {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
