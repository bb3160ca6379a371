package imageformat

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The appender's images pass qemu-img check and read back what was
// written, gaps and partial clusters included, on images large enough to
// need several L2 tables and refcount blocks.
func TestAppender(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	for round, size := range []int64{1 << 20, 100<<20 + 4096, 3<<30 + 512} {
		p := filepath.Join(dir, "a.qcow2")
		os.Remove(p)
		if err := CreateQcow2(p, size, "", ""); err != nil {
			t.Fatal(err)
		}
		if !Appendable(p) {
			t.Fatal("a new image is not appendable")
		}
		if round == 2 {
			// Start near the end of what the first refcount block covers,
			// so that new blocks are needed.
			os.Truncate(p, (ClusterSize/2-10)*ClusterSize)
		}
		a, err := OpenAppender(p)
		if err != nil {
			t.Fatal(err)
		}
		type w struct {
			off  int64
			data []byte
		}
		var ws []w
		off := int64(0)
		for off < size {
			off += int64(rng.IntN(3)) * int64(1+rng.IntN(1<<20)) // a gap, sometimes
			n := min(int64(1+rng.IntN(3<<20)), size-off)
			if n <= 0 || round == 2 && off > 40<<20 && off < 3<<30-8<<20 {
				off = max(off, 3<<30-8<<20)
				continue
			}
			b := make([]byte, n)
			fillRandom(b, rng.Uint64())
			if rng.IntN(4) == 0 {
				clear(b[:n/2]) // a zero run inside
			}
			if err := a.Write(off, b); err != nil {
				t.Fatal(err)
			}
			ws = append(ws, w{off, b})
			off += n
		}
		if err := a.Commit(); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("qemu-img", "check", p).CombinedOutput(); err != nil {
			t.Fatalf("size %d: %v\n%s", size, err, out)
		}
		raw := filepath.Join(dir, "a.raw")
		if out, err := exec.Command("qemu-img", "convert", "-O", "raw", p, raw).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		f, _ := os.Open(raw)
		for _, x := range ws {
			got := make([]byte, len(x.data))
			f.ReadAt(got, x.off)
			if !bytes.Equal(got, x.data) {
				t.Fatalf("size %d: data at %d differs", size, x.off)
			}
		}
		f.Close()
		if Appendable(p) && len(ws) > 0 {
			t.Fatal("a filled image still counts as empty")
		}
	}
}
