package storage

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// A disk with two snapshots, as a storage migration sees them: each
// snapshot differs from the one before exactly where the disk was
// written between them, and the disk reads as its newest snapshot with
// its own top over it, until that snapshot's top is written itself.
func TestFileSRChainForMigration(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	d := NewFileDriver(nil)
	sr := uuid.NewString()
	cfg := map[string]string{"location": dir}
	if _, err := d.Create(ctx, SRSpec{UUID: sr, DeviceConfig: cfg}); err != nil {
		t.Fatal(err)
	}
	h, err := d.Attach(ctx, SRSpec{UUID: sr, DeviceConfig: cfg})
	if err != nil {
		t.Fatal(err)
	}
	s := h.(*fileSR)
	defer func() { _ = s.Detach(ctx) }()
	disk, err := s.VolumeCreate(ctx, VolumeSpec{UUID: uuid.NewString(), Name: "disk", Size: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dp, _, _ := s.pathOf(disk.Key)
	qemuIO(t, dp, "write -P 0x11 0 16M")
	s1, err := s.VolumeSnapshot(ctx, disk.Key, VolumeSpec{Name: "s1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	qemuIO(t, dp, "write -P 0x22 4M 1M")
	qemuIO(t, dp, "write -z 8M 1M")
	s2, err := s.VolumeSnapshot(ctx, disk.Key, VolumeSpec{Name: "s2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	qemuIO(t, dp, "write -P 0x33 20M 1M")

	ext, err := s.ChangedExtents(ctx, s2.Key, s1.Key)
	if err != nil {
		t.Fatal(err)
	}
	var data, zero int64
	for _, e := range ext {
		if e.Zero {
			zero += e.Length
		} else {
			data += e.Length
		}
		if e.Offset < 4<<20 || e.Offset+e.Length > 9<<20 {
			t.Errorf("s2 differs from s1 at %d+%d, outside what was written", e.Offset, e.Length)
		}
	}
	if data != 1<<20 || zero != 1<<20 {
		t.Fatalf("s2 against s1: %d bytes of data and %d of zeroes (%v), want 1 MiB each", data, zero, ext)
	}
	for _, c := range []struct {
		key, base string
		want      bool
	}{{disk.Key, s2.Key, true}, {disk.Key, s1.Key, false}, {s2.Key, s1.Key, false}} {
		got, err := s.IsOverlayOf(ctx, c.key, c.base)
		if err != nil || got != c.want {
			t.Errorf("IsOverlayOf(%s, %s) = %v, %v; want %v", c.key, c.base, got, err, c.want)
		}
	}
	// A snapshot written since is no longer the disk's base.
	s2p, _, _ := s.pathOf(s2.Key)
	qemuIO(t, s2p, "write -P 0x44 0 64k")
	if got, err := s.IsOverlayOf(ctx, disk.Key, s2.Key); err != nil || got {
		t.Fatalf("IsOverlayOf after the snapshot was written: %v, %v", got, err)
	}
}
