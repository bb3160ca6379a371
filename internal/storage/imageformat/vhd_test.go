package imageformat

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
)

// memDevice is a disk in memory.
type memDevice struct{ b []byte }

func (m *memDevice) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, TooBigError{Size: int64(len(m.b))}
	}
	return copy(m.b[off:], p), nil
}

func (m *memDevice) dev() Disk {
	return Disk{Size: int64(len(m.b)), Write: func(b []byte, off int64) error { _, err := m.WriteAt(b, off); return err }, Zero: func(off, n int64) error {
		if off < 0 || off+n > int64(len(m.b)) {
			return TooBigError{Size: int64(len(m.b))}
		}
		clear(m.b[off : off+n])
		return nil
	}}
}

func randomDisk(rng *rand.Rand, size int64) ([]byte, []Extent) {
	b := make([]byte, size)
	var exts []Extent
	for off := int64(0); off < size; {
		n := min(int64(1+rng.IntN(5<<20))/512*512+512, size-off)
		zero := rng.IntN(2) == 0
		if !zero {
			fillRandom(b[off:off+n], rng.Uint64())
		}
		exts = append(exts, Extent{Offset: off, Length: n, Zero: zero})
		off += n
	}
	return b, exts
}

func TestVHDDynamicWithQemu(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	size := int64(37<<20 + 3*512)
	disk, exts := randomDisk(rng, size)
	plan := PlanVHD(size, exts, false, uuid.New(), uuid.Nil)
	var buf bytes.Buffer
	if err := plan.WriteTo(context.Background(), &buf, bytes.NewReader(disk), SequentialReader, nil); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != plan.Length() {
		t.Fatalf("wrote %d, planned %d", buf.Len(), plan.Length())
	}
	p := filepath.Join(dir, "d.vhd")
	os.WriteFile(p, buf.Bytes(), 0o600)
	raw := filepath.Join(dir, "d.raw")
	if out, err := exec.Command("qemu-img", "convert", "-f", "vpc", "-O", "raw", p, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img cannot read our VHD: %v %s", err, out)
	}
	got, _ := os.ReadFile(raw)
	if !bytes.Equal(got, disk) {
		t.Fatalf("QEMU reads different data from our VHD (%d bytes, want %d)", len(got), len(disk))
	}
	// And a VHD QEMU made imports back.
	src := filepath.Join(dir, "src.raw")
	os.WriteFile(src, disk, 0o600)
	q := filepath.Join(dir, "q.vhd")
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "vpc", "-o", "subformat=dynamic,force_size=on", src, q).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	f, _ := os.Open(q)
	defer f.Close()
	m := &memDevice{b: make([]byte, size)} // a fresh VDI
	if _, err := ApplyVHD(context.Background(), f, m.dev(), nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.b, disk) {
		t.Fatal("importing QEMU's VHD gave different data")
	}
}

// A differencing VHD carries exactly the changed sectors; applied to the
// base it rebuilds the disk.
func TestVHDDifferencing(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	size := int64(20 << 20)
	base, _ := randomDisk(rng, size)
	now := append([]byte(nil), base...)
	var changed []Extent
	for range 12 {
		off := rng.Int64N(size/512) * 512
		n := min(int64(1+rng.IntN(300))*512, size-off)
		zero := rng.IntN(3) == 0
		for i := off; i < off+n; i++ {
			if zero {
				now[i] = 0
			} else {
				now[i] = byte(rng.Uint32())
			}
		}
		changed = append(changed, Extent{Offset: off, Length: n, Zero: zero})
	}
	plan := PlanVHD(size, MergeExtents(changed), true, uuid.New(), uuid.New())
	var buf bytes.Buffer
	if err := plan.WriteTo(context.Background(), &buf, bytes.NewReader(now), SequentialReader, nil); err != nil {
		t.Fatal(err)
	}
	m := &memDevice{b: append([]byte(nil), base...)}
	if _, err := ApplyVHD(context.Background(), bytes.NewReader(buf.Bytes()), m.dev(), nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.b, now) {
		t.Fatal("base + differencing VHD differs from the disk")
	}
}

func FuzzApplyVHD(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 1))
	disk, exts := randomDisk(rng, 1<<20)
	var buf bytes.Buffer
	PlanVHD(1<<20, exts, false, uuid.New(), uuid.Nil).WriteTo(context.Background(), &buf, bytes.NewReader(disk), SequentialReader, nil)
	f.Add(buf.Bytes()[:8192])
	buf.Reset()
	PlanVHD(1<<20, exts[:min(2, len(exts))], true, uuid.New(), uuid.New()).WriteTo(context.Background(), &buf, bytes.NewReader(disk), SequentialReader, nil)
	f.Add(buf.Bytes()[:8192])
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &memDevice{b: make([]byte, 1<<20)}
		ApplyVHD(context.Background(), bytes.NewReader(b), m.dev(), nil)
	})
}
