package imageformat

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func needQemuImg(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img is not installed (scripts/install-test-deps.sh installs it)")
	}
}

func TestCreateQcow2MatchesQemu(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	for _, size := range []int64{0, 1, 512, 1 << 20, 1 << 30, 100 << 30, 3<<40 + 12345, MaxVirtualSize} {
		p := filepath.Join(dir, "a.qcow2")
		os.Remove(p)
		if err := CreateQcow2(p, size, "", ""); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("qemu-img", "check", "-f", "qcow2", p).CombinedOutput(); err != nil {
			t.Fatalf("size %d: qemu-img check: %v\n%s", size, err, out)
		}
		out, err := exec.Command("qemu-img", "info", "--output=json", p).Output()
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			VirtualSize int64 `json:"virtual-size"`
		}
		json.Unmarshal(out, &info)
		size = RoundUp(size, 512)
		if info.VirtualSize != size {
			t.Fatalf("virtual size %d, want %d", info.VirtualSize, size)
		}
		h, err := ReadQcow2Header(p)
		if err != nil || int64(h.Size) != size || h.BackingFile != "" {
			t.Fatalf("header %+v %v", h, err)
		}
		if empty, err := Qcow2IsEmpty(p); err != nil || !empty {
			t.Fatalf("empty %v %v", empty, err)
		}
	}
	// An overlay, written to by QEMU afterwards.
	base := filepath.Join(dir, "b.base.qcow2")
	if err := CreateQcow2(base, 1<<30, "", ""); err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(dir, "t.qcow2")
	if err := CreateQcow2(top, 1<<30, "b.base.qcow2", "qcow2"); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 1M 3M", top).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v %s", err, out)
	}
	if out, err := exec.Command("qemu-img", "check", "-f", "qcow2", top).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img check: %v\n%s", err, out)
	}
	h, err := ReadQcow2Header(top)
	if err != nil || h.BackingFile != "b.base.qcow2" || h.BackingFormat != "qcow2" {
		t.Fatalf("header %+v %v", h, err)
	}
	if empty, _ := Qcow2IsEmpty(top); empty {
		t.Fatal("written overlay reads as empty")
	}
	if err := CreateQcow2(top, 1, "", ""); err == nil {
		t.Fatal("CreateQcow2 replaced an existing file")
	}
}

func FuzzParseQcow2Header(f *testing.F) {
	img := qcow2Image(1<<30, "parent.base.qcow2", "qcow2")
	f.Add(img.chunks[0].data)
	f.Add(qcow2Image(0, "", "").chunks[0].data)
	// A virtual size past int64 (issue 29, finding 9): read as an int64
	// it was negative, and passed the check against the disk's size.
	huge := slices.Clone(qcow2Image(1<<20, "", "").chunks[0].data)
	binary.BigEndian.PutUint64(huge[24:], 1<<63+4096)
	f.Add(huge)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseQcow2Header(b)
		if err == nil && h == nil {
			t.Fatal("nil header without error")
		}
		if err != nil {
			return
		}
		// The size converts to an int64 and rounds up to a cluster
		// without overflowing.
		if h.Size > MaxQcow2Size || int64(h.Size) < 0 || RoundUp(int64(h.Size), 1<<h.ClusterBits) < int64(h.Size) {
			t.Fatalf("virtual size %d accepted", h.Size)
		}
	})
}

// A header whose virtual size is past MaxQcow2Size is a SizeError with
// the size it declares; one at the bound is taken.
func TestParseQcow2HeaderSize(t *testing.T) {
	base := qcow2Image(1<<20, "", "").chunks[0].data
	for _, c := range []struct {
		size uint64
		ok   bool
	}{{1 << 20, true}, {MaxQcow2Size, true}, {MaxQcow2Size + 1, false}, {1<<63 + 4096, false}, {1 << 63, false}, {^uint64(0), false}} {
		b := slices.Clone(base)
		binary.BigEndian.PutUint64(b[24:], c.size)
		h, err := ParseQcow2Header(b)
		var se SizeError
		switch {
		case c.ok && (err != nil || h.Size != c.size):
			t.Errorf("size %d: %+v %v", c.size, h, err)
		case !c.ok && (!errors.As(err, &se) || se.Size != c.size):
			t.Errorf("size %d: %+v %v, want a SizeError", c.size, h, err)
		}
	}
}
