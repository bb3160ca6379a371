package imageformat

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Streamed qcow2 images are valid (qemu-img check) and hold exactly the
// planned clusters with the source's data.
func TestQcow2StreamIsValid(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 8 {
		size := int64(1+rng.IntN(300)) << 20
		if round == 7 {
			size = 3<<29 + 12345*512 // several L2 tables, a partial last cluster
		}
		src := make([]byte, min(size, 64<<20))
		fillRandom(src, uint64(round))
		var exts []Extent
		for off := int64(0); off < size; {
			n := int64(1+rng.IntN(64)) << 16
			if round%2 == 1 {
				n = int64(1 + rng.IntN(200000))
			}
			n = min(n, size-off)
			exts = append(exts, Extent{Offset: off, Length: n, Zero: rng.IntN(3) != 0 || off+n > int64(len(src))})
			off += n
		}
		plan := PlanQcow2(size, exts, round%2 == 0)
		var buf bytes.Buffer
		if err := plan.WriteTo(context.Background(), &buf, tailReader{bytes.NewReader(src), int64(len(src))}, SequentialReader, nil); err != nil {
			t.Fatal(err)
		}
		if int64(buf.Len()) != plan.Length() {
			t.Fatalf("wrote %d bytes, planned %d", buf.Len(), plan.Length())
		}
		p := filepath.Join(dir, "s.qcow2")
		os.WriteFile(p, buf.Bytes(), 0o600)
		if out, err := exec.Command("qemu-img", "check", p).CombinedOutput(); err != nil {
			t.Fatalf("round %d: %v\n%s", round, err, out)
		}
		raw := filepath.Join(dir, "s.raw")
		if out, err := exec.Command("qemu-img", "convert", "-O", "raw", p, raw).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		st, _ := os.Stat(raw)
		if st.Size() != size {
			t.Fatalf("virtual size %d, want %d", st.Size(), size)
		}
		rf, _ := os.Open(raw)
		got := make([]byte, len(src))
		rf.ReadAt(got, 0)
		rf.Close()
		for _, e := range exts {
			if e.Zero || e.Offset >= int64(len(src)) {
				continue
			}
			end := min(e.Offset+e.Length, int64(len(src)))
			if !bytes.Equal(got[e.Offset:end], src[e.Offset:end]) {
				t.Fatalf("round %d: data at %d differs", round, e.Offset)
			}
		}
	}
}

func FuzzPlanQcow2(f *testing.F) {
	f.Add(int64(1<<30), []byte{1, 2, 3, 4, 5, 6})
	f.Fuzz(func(t *testing.T, size int64, shape []byte) {
		if size <= 0 || size > 1<<40 || len(shape) > 64 {
			return
		}
		var exts []Extent
		off := int64(0)
		for i, b := range shape {
			n := (int64(b) + 1) * 4096 * int64(i+1)
			if off >= size {
				break
			}
			n = min(n, size-off)
			exts = append(exts, Extent{Offset: off, Length: n, Zero: b%2 == 0})
			off += n
		}
		p := PlanQcow2(size, exts, true)
		if p.Length()%ClusterSize != 0 || p.nClusters < 1+p.rtClusters+p.rbClusters+p.l1Clusters+int64(len(p.l2Tables))+p.nData {
			t.Fatal("inconsistent plan")
		}
		if p.rbClusters*(ClusterSize/2) < p.nClusters {
			t.Fatal("refcount blocks do not cover the image")
		}
	})
}

// fillRandom fills b with deterministic pseudo-random bytes.
func fillRandom(b []byte, seed uint64) {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	rand.NewChaCha8(key).Read(b)
}
