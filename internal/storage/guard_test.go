package storage

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"toolstackd/internal/xerr"
)

func TestLocationPolicy(t *testing.T) {
	data := t.TempDir()
	home := filepath.Join(data, "storage", "local")
	os.MkdirAll(home, 0o700)
	other := t.TempDir()
	link := filepath.Join(other, "link")
	os.Symlink(data, link)
	p := &locationPolicy{protected: []string{data}, homes: []string{home}}
	for _, c := range []struct {
		loc string
		ok  bool
	}{
		{other, true},
		{filepath.Join(other, "sub"), true},
		{home, true},
		{data, false},
		{filepath.Dir(data), false},
		{filepath.Join(data, "storage"), false},
		{filepath.Join(home, "sub"), false},
		{link, false},
		{filepath.Join(link, "storage", "local", "x"), false},
		{"/", false},
		{"/etc", false},
		{"/etc/ssh", false},
		{"/boot", false},
		{"/dev", false},
		{"/proc/self", false},
		{"/sys", false},
		{"/usr/share", false},
	} {
		if err := p.check(c.loc); (err == nil) != c.ok {
			t.Errorf("check(%s) = %v, want ok=%v", c.loc, err, c.ok)
		}
	}
}

func TestHostilePluginOutput(t *testing.T) {
	for _, k := range []string{"", "/etc/shadow", "../x", "a/../../x", "..", "a\x00b"} {
		if checkVolumeKey(k) == nil {
			t.Errorf("key %q accepted", k)
		}
	}
	for _, k := range []string{"v1", "lv-00/x", "disk.qcow2"} {
		if err := checkVolumeKey(k); err != nil {
			t.Errorf("key %q refused: %v", k, err)
		}
	}
	for _, u := range []string{"file:///srv/../etc/shadow", "raw+file://../x", "nbd+unix:///../x?socket=/s"} {
		if checkPluginURI(u) == nil {
			t.Errorf("URI %q accepted", u)
		}
	}
	if err := checkPluginURI("nbd+unix:///export?socket=/run/x.sock"); err != nil {
		t.Error(err)
	}
	data := t.TempDir()
	p := &locationPolicy{protected: []string{data}}
	for _, f := range []string{"/etc/shadow", "/boot/vmlinuz", filepath.Join(data, "toolstackd.db"), "relative/x", "/srv/../etc/shadow"} {
		if p.checkDatapathFile(f) == nil {
			t.Errorf("file datapath %q accepted", f)
		}
	}
	for _, f := range []string{"/dev/mapper/vg-lv", filepath.Join(t.TempDir(), "v.raw")} {
		if err := p.checkDatapathFile(f); err != nil {
			t.Errorf("file datapath %q refused: %v", f, err)
		}
	}
}

// The guard refuses as soon as what was read, with what may still be in
// flight, no longer fits above the reserve.
func TestGuardedReader(t *testing.T) {
	dir := t.TempDir()
	fill := filepath.Join(dir, "fill")
	// The file system's free space as this test alone moves it: what it
	// was at the start less what the test's file holds (other tests
	// write and delete large files on the same disk meanwhile).
	var start syscall.Statfs_t
	if err := syscall.Statfs(dir, &start); err != nil {
		t.Fatal(err)
	}
	r := &reserve{dataDir: dir, statfs: func(path string, st *syscall.Statfs_t) error {
		if err := syscall.Statfs(path, st); err != nil {
			return err
		}
		var used int64
		if fi, err := os.Stat(fill); err == nil {
			used = fi.Size()
		}
		st.Bavail = start.Bavail - uint64((used+start.Bsize-1)/start.Bsize)
		st.Blocks = start.Blocks
		return nil
	}}
	room, err := r.room(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A reserve that leaves 10 chunks of room.
	r.bytes = room - 10*xferChunk
	g := &spaceGuard{r: r, dirs: []string{dir}}
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := io.Copy(f, g.reader(io.LimitReader(randReader{}, 100*xferChunk)))
	if !xerr.HasCode(err, xerr.SRFull) {
		t.Fatalf("read %d bytes, err %v; want SR_FULL", n, err)
	}
	if n == 0 || n > 12*xferChunk {
		t.Fatalf("stopped after %d bytes (room %d, in flight %d)", n, 10*xferChunk, xferInflight)
	}
	// A reader on another file system than the data dir's, or without
	// a data dir, only needs the free space.
	r2 := &reserve{bytes: 1 << 62}
	if err := (&spaceGuard{r: r2, dirs: []string{dir}}).check(1); err != nil {
		t.Fatal(err)
	}
}

// randReader gives bytes that are not zero (so that nothing is sparse).
type randReader struct{}

func (randReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return len(p), nil
}

func TestReserveDefaults(t *testing.T) {
	r := newReserve(Config{DataDir: "/x"})
	if r.bytes != 1<<30 || r.percent != 5 {
		t.Fatalf("default reserve %d bytes, %v%%", r.bytes, r.percent)
	}
	r = newReserve(Config{DataDir: "/x", ReserveBytes: -1, ReservePercent: -1})
	if r.bytes != 0 || r.percent != 0 {
		t.Fatalf("disabled reserve %d bytes, %v%%", r.bytes, r.percent)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// BenchmarkSpaceCheck is the cost of one check (statfs and the device
// comparison), which a transfer pays once per spaceCheckEvery bytes.
func BenchmarkSpaceCheck(b *testing.B) {
	dir := b.TempDir()
	g := &spaceGuard{r: &reserve{dataDir: dir, bytes: 1 << 20}, dirs: []string{dir}}
	for b.Loop() {
		if err := g.check(0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardedRead compares reading 4 MiB chunks with and without
// the guard.
func BenchmarkGuardedRead(b *testing.B) {
	dir := b.TempDir()
	g := &spaceGuard{r: &reserve{dataDir: dir, bytes: 1 << 20}, dirs: []string{dir}}
	buf := make([]byte, xferChunk)
	for _, guarded := range []bool{false, true} {
		name := "plain"
		if guarded {
			name = "guarded"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(xferChunk)
			for b.Loop() {
				src := io.Reader(io.LimitReader(zeroReader{}, xferChunk))
				if guarded {
					src = g.reader(src)
				}
				if _, err := io.ReadFull(src, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
