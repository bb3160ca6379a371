package storage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"toolstackd/internal/storage/imageformat"
)

func qemuIO(t *testing.T, path, cmd string) {
	t.Helper()
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", cmd, path).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io %s: %v %s", cmd, err, out)
	}
}

func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	err := exec.Command("qemu-img", "compare", "-q", "-f", "qcow2", "-F", "qcow2", a, b).Run()
	return err == nil
}

func TestFileDriverSnapshotCloneCoalesce(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	d := NewFileDriver(nil)
	srUUID := uuid.NewString()
	if _, err := d.Create(ctx, SRSpec{UUID: srUUID, DeviceConfig: map[string]string{"location": dir}}); err != nil {
		t.Fatal(err)
	}
	h, err := d.Attach(ctx, SRSpec{UUID: srUUID, DeviceConfig: map[string]string{"location": dir}})
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*fileSR)
	defer s.Detach(ctx)
	a, err := s.VolumeCreate(ctx, VolumeSpec{UUID: uuid.NewString(), Name: "a", Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ap, _, _ := s.pathOf(a.Key)
	qemuIO(t, ap, "write -P 0x11 0 8M")
	snap, err := s.VolumeSnapshot(ctx, a.Key, VolumeSpec{Name: "snap"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sp, _, _ := s.pathOf(snap.Key)
	qemuIO(t, ap, "write -P 0x22 4M 8M")
	clone, err := s.VolumeClone(ctx, snap.Key, VolumeSpec{Name: "clone"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp, _, _ := s.pathOf(clone.Key)
	if !sameContent(t, sp, cp) {
		t.Fatal("clone of snapshot differs from it")
	}
	if sameContent(t, ap, sp) {
		t.Fatal("snapshot follows later writes")
	}
	qemuIO(t, sp, "read -P 0x11 0 8M")
	qemuIO(t, ap, "read -P 0x22 4M 8M")
	vols, err := s.Scan(ctx)
	if err != nil || len(vols) != 3 {
		t.Fatalf("scan %v %v", vols, err)
	}
	// Dropping the snapshot and the clone leaves a alone on its base;
	// collection folds the chain back into one file.
	if err := s.VolumeDestroy(ctx, snap.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.VolumeDestroy(ctx, clone.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Collect(ctx); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if h, _ := imageformat.ReadQcow2Header(ap); h.BackingFile != "" {
		t.Fatalf("chain not coalesced: %v, backing %q", names, h.BackingFile)
	}
	for _, n := range names {
		if strings.HasSuffix(n, baseSuffix) {
			t.Fatalf("stray base left: %v", names)
		}
	}
	qemuIO(t, ap, "read -P 0x11 0 4M")
	qemuIO(t, ap, "read -P 0x22 4M 8M")
	if out, err := exec.Command("qemu-img", "check", ap).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	_ = filepath.Join
}

func TestFileDriverConstantTimeSnapshot(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	d := NewFileDriver(nil)
	id := uuid.NewString()
	d.Create(ctx, SRSpec{UUID: id, DeviceConfig: map[string]string{"location": dir}})
	h, err := d.Attach(ctx, SRSpec{UUID: id, DeviceConfig: map[string]string{"location": dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Detach(ctx)
	for _, size := range []int64{1 << 30, 100 << 30} {
		v, err := h.VolumeCreate(ctx, VolumeSpec{UUID: uuid.NewString(), Size: size})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		if _, err := h.VolumeSnapshot(ctx, v.Key, VolumeSpec{}, nil); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if _, err := h.VolumeClone(ctx, v.Key, VolumeSpec{}, nil); err != nil {
			t.Fatal(err)
		}
		t.Logf("size %d GiB: snapshot %v clone %v", size>>30, t1.Sub(t0), time.Since(t1))
	}
}
