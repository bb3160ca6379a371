package xva

import (
	"archive/tar"
	"bytes"
	"crypto/sha1" //nolint:gosec // the legacy checksum under test
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"toolstackd/internal/xerr"
)

// testDisk is a disk of size bytes with data in the given 1 MiB blocks
// and zeroes elsewhere.
func testDisk(size int64, blocks ...int64) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(size), 7))
	for _, n := range blocks {
		for i := n * BlockSize; i < min((n+1)*BlockSize, size); i++ {
			b[i] = byte(r.Uint32())
		}
	}
	return b
}

func testHeader(disks map[string]int64) *Header {
	h := &Header{Version: ThisVersion("test")}
	h.Objects = append(h.Objects, Object{Class: "VM", ID: "Ref:0", Snapshot: map[string]any{"name_label": "vm", "memory_static_max": "1073741824"}})
	for id, size := range disks {
		h.Objects = append(h.Objects, Object{Class: "VDI", ID: id, Snapshot: map[string]any{"virtual_size": fmt.Sprint(size)}})
	}
	return h
}

// writeArchive writes an archive of the given disks with our Writer.
func writeArchive(t testing.TB, c Compression, disks map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, c)
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	var ids []string
	for id, d := range disks {
		sizes[id] = int64(len(d))
		ids = append(ids, id)
	}
	if err := w.WriteHeader(testHeader(sizes)); err != nil {
		t.Fatal(err)
	}
	DiskOrder(ids)
	for _, id := range ids {
		dw := w.Disk(id, int64(len(disks[id])))
		// In odd pieces, to cross block boundaries.
		d := disks[id]
		for len(d) > 0 {
			n := min(len(d), 300000)
			if _, err := dw.Write(d[:n]); err != nil {
				t.Fatal(err)
			}
			d = d[n:]
		}
		if err := dw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readArchive reads every disk of an archive, with Read.
func readArchive(data []byte, force bool) (*Header, map[string][]byte, error) {
	return readArchiveWith(data, force, false)
}

// readArchiveWith reads every disk of an archive with Read or, blocks,
// with Next into a buffer of zeroes.
func readArchiveWith(data []byte, force, blocks bool) (*Header, map[string][]byte, error) {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	r.Force = force
	out := map[string][]byte{}
	for {
		id, err := r.NextDisk()
		if err == io.EOF {
			return r.Header, out, nil
		}
		if err != nil {
			return nil, nil, err
		}
		o := r.Header.Find(id)
		if o == nil {
			return nil, nil, fmt.Errorf("no object %s", id)
		}
		size := num(o.Snapshot["virtual_size"])
		if blocks {
			buf := make([]byte, size)
			dr := r.Disk(id, size)
			for {
				off, b, err := dr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					return nil, nil, err
				}
				copy(buf[off:], b)
			}
			if !dr.Done() {
				return nil, nil, errPrematureEOF()
			}
			out[id] = buf
			continue
		}
		var b bytes.Buffer
		if _, err := io.Copy(&b, r.Disk(id, size)); err != nil {
			return nil, nil, err
		}
		out[id] = b.Bytes()
	}
}

func members(t *testing.T, data []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(data))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestRoundTrip(t *testing.T) {
	disks := map[string][]byte{
		"Ref:1":  testDisk(5*BlockSize+12345, 1, 3), // zero blocks 2 and 4 left out
		"Ref:10": testDisk(BlockSize / 2),           // one short block: first and last
		"Ref:2":  testDisk(3 * BlockSize),           // all zero: first and last only
	}
	for _, c := range []Compression{None, Gzip, Zstd} {
		t.Run(string(c)+"none", func(t *testing.T) {
			data := writeArchive(t, c, disks)
			for _, blocks := range []bool{false, true} {
				h, got, err := readArchiveWith(data, false, blocks)
				if err != nil {
					t.Fatal(err)
				}
				if len(h.Objects) != 4 || h.Version.ExportVsn != ExportVsn {
					t.Fatalf("header: %+v", h)
				}
				for id, d := range disks {
					if !bytes.Equal(got[id], d) {
						t.Fatalf("disk %s differs (%d vs %d bytes, blocks %v)", id, len(got[id]), len(d), blocks)
					}
				}
			}
			if c != None {
				return
			}
			want := []string{"ova.xml",
				"Ref:1/00000000", "Ref:1/00000000.xxhash", "Ref:1/00000001", "Ref:1/00000001.xxhash",
				"Ref:1/00000003", "Ref:1/00000003.xxhash", "Ref:1/00000005", "Ref:1/00000005.xxhash",
				"Ref:10/00000000", "Ref:10/00000000.xxhash",
				"Ref:2/00000000", "Ref:2/00000000.xxhash", "Ref:2/00000002", "Ref:2/00000002.xxhash"}
			if got := members(t, data); strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("members:\n got %v\nwant %v", got, want)
			}
		})
	}
}

// handTar builds an archive member by member, as xapi lays it out.
type handTar struct {
	buf bytes.Buffer
	tw  *tar.Writer
}

func newHandTar() *handTar {
	h := &handTar{}
	h.tw = tar.NewWriter(&h.buf)
	return h
}

func (h *handTar) add(name string, b []byte) *handTar {
	_ = h.tw.WriteHeader(&tar.Header{Name: name, Size: int64(len(b)), Mode: 0o400, Typeflag: tar.TypeReg, Format: tar.FormatUSTAR})
	_, _ = h.tw.Write(b)
	return h
}

func (h *handTar) bytes() []byte { _ = h.tw.Close(); return h.buf.Bytes() }

func sha1Hex(b []byte) string { s := sha1.Sum(b); return hex.EncodeToString(s[:]) } //nolint:gosec // see the import

func ovaXML(size int64, vsn int) []byte {
	return []byte(fmt.Sprintf(`<?xml version="1.0"?><value><struct><member><name>version</name><value><struct>`+
		`<member><name>hostname</name><value>xs</value></member><member><name>xapi_major</name><value><int>1</int></value></member>`+
		`<member><name>xapi_minor</name><value><int>3</int></value></member><member><name>export_vsn</name><value><int>%d</int></value></member>`+
		`</struct></value></member><member><name>objects</name><value><array><data>`+
		`<value><struct><member><name>class</name><value>VDI</value></member><member><name>id</name><value>Ref:7</value></member>`+
		`<member><name>snapshot</name><value><struct><member><name>virtual_size</name><value>%d</value></member></struct></value></member>`+
		`</struct></value></data></array></value></member></struct></value>`, vsn, size))
}

// An archive laid out by hand as xapi writes it: SHA-1 and XXH64
// checksums mixed, a keep-alive member of length 0, a left-out block.
func TestHandBuiltArchive(t *testing.T) {
	d := testDisk(3*BlockSize+100, 0, 2, 3)
	b0, b2, b3 := d[:BlockSize], d[2*BlockSize:3*BlockSize], d[3*BlockSize:]
	data := newHandTar().add("ova.xml", ovaXML(int64(len(d)), 1)).
		add("Ref:7/00000000", b0).add("Ref:7/00000000.checksum", []byte(sha1Hex(b0))).
		add("Ref:7/00000002", nil).add("Ref:7/00000002.xxhash", []byte(XXHash(nil))).
		add("Ref:7/00000002", b2).add("Ref:7/00000002.xxhash", []byte(XXHash(b2))).
		add("Ref:7/00000003", b3).add("Ref:7/00000003.xxhash", []byte(strings.ToLower(XXHash(b3)))).bytes()
	h, got, err := readArchive(data, false)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version.XapiMinor != 3 || h.Version.Hostname != "xs" {
		t.Fatalf("version %+v", h.Version)
	}
	if !bytes.Equal(got["Ref:7"], d) {
		t.Fatal("disk differs")
	}
	// An archive from before checksums (export_vsn 0) has none.
	old := newHandTar().add("ova.xml", ovaXML(int64(len(d)), 0)).
		add("Ref:7/00000000", b0).add("Ref:7/00000002", b2).add("Ref:7/00000003", b3).bytes()
	if _, got, err := readArchive(old, false); err != nil || !bytes.Equal(got["Ref:7"], d) {
		t.Fatalf("export_vsn 0: %v", err)
	}
}

func code(err error) string {
	if xe, ok := err.(*xerr.Error); ok {
		return xe.Code
	}
	return fmt.Sprint(err)
}

func TestBadArchives(t *testing.T) {
	d := testDisk(2*BlockSize, 0, 1)
	b0, b1 := d[:BlockSize], d[BlockSize:]
	ova := ovaXML(int64(len(d)), 2)
	good := func() *handTar {
		return newHandTar().add("ova.xml", ova).add("Ref:7/00000000", b0).add("Ref:7/00000000.xxhash", []byte(XXHash(b0)))
	}
	bad := b1[:len(b1):len(b1)]
	flipped := append([]byte{}, bad...)
	flipped[7] ^= 1
	whole := good().add("Ref:7/00000001", b1).add("Ref:7/00000001.xxhash", []byte(XXHash(b1))).bytes()
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, xerr.ImportError},
		{"not a tar", []byte(strings.Repeat("hello", 300)), xerr.ImportError},
		{"first member not ova.xml", newHandTar().add("Ref:7/00000000", b0).bytes(), xerr.ImportErrorUnexpectedFile},
		{"ova.xml not xml", newHandTar().add("ova.xml", []byte("<value><struct>")).bytes(), xerr.ImportError},
		{"ova.xml no objects", newHandTar().add("ova.xml", []byte("<value><struct><member><name>version</name><value><struct></struct></value></member></struct></value>")).bytes(), xerr.ImportError},
		{"checksum mismatch", good().add("Ref:7/00000001", flipped).add("Ref:7/00000001.xxhash", []byte(XXHash(b1))).bytes(), xerr.ImportErrorSomeChecksumsFailed},
		{"sha1 mismatch", good().add("Ref:7/00000001", flipped).add("Ref:7/00000001.checksum", []byte(sha1Hex(b1))).bytes(), xerr.ImportErrorSomeChecksumsFailed},
		{"no checksum", good().add("Ref:7/00000001", b1).add("Ref:7/00000002", nil).bytes(), xerr.ImportErrorUnexpectedFile},
		{"no checksum at the end", good().add("Ref:7/00000001", b1).bytes(), xerr.ImportErrorPrematureEOF},
		{"last block missing", good().bytes(), xerr.ImportErrorPrematureEOF},
		{"truncated", whole[:len(whole)-BlockSize/2-2048], xerr.ImportErrorPrematureEOF},
		{"truncated header", whole[:len(ova)+600+BlockSize+300], xerr.ImportErrorPrematureEOF},
		{"out of order", good().add("Ref:7/00000000", b0).bytes(), xerr.ImportError},
		{"past the end", good().add("Ref:7/00000002", b1).bytes(), xerr.ImportError},
		{"block too big", good().add("Ref:7/00000001", append(b1, 0)).bytes(), xerr.ImportError},
		{"short block not last", newHandTar().add("ova.xml", ova).add("Ref:7/00000000", b0[:10]).add("Ref:7/00000000.xxhash", []byte(XXHash(b0[:10]))).bytes(), xerr.ImportError},
		{"bad block name", good().add("Ref:7/0000000x", b1).bytes(), xerr.ImportErrorUnexpectedFile},
		{"other disk inside", good().add("Ref:8/00000001", b1).bytes(), xerr.ImportErrorUnexpectedFile},
		{"gzip garbage", append([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0}, bytes.Repeat([]byte{0xff}, 100)...), xerr.ImportError},
		{"zstd garbage", append([]byte{0x28, 0xb5, 0x2f, 0xfd}, bytes.Repeat([]byte{0xff}, 100)...), xerr.ImportError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, blocks := range []bool{false, true} {
				_, _, err := readArchiveWith(c.data, false, blocks)
				if code(err) != c.want {
					t.Fatalf("got %v, want %s (blocks %v)", err, c.want, blocks)
				}
			}
		})
	}
	// force imports blocks whose checksum fails.
	data := good().add("Ref:7/00000001", flipped).add("Ref:7/00000001.xxhash", []byte(XXHash(b1))).bytes()
	if _, _, err := readArchive(data, true); err != nil {
		t.Fatalf("force: %v", err)
	}
}

func TestHeaderBounds(t *testing.T) {
	var b strings.Builder
	b.WriteString("<value><struct><member><name>version</name><value><struct></struct></value></member><member><name>objects</name><value><array><data>")
	// The count is checked before the objects themselves.
	b.WriteString(strings.Repeat("<value/>", MaxObjects+1))
	b.WriteString("</data></array></value></member></struct></value>")
	if _, err := DecodeHeader([]byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("too many objects: %v", err)
	}
	if _, err := DecodeHeader(bytes.Repeat([]byte(" "), MaxOVASize+1)); err == nil {
		t.Fatal("an oversized ova.xml was read")
	}
	// An ova.xml that tries to close the wrapping it is read in.
	if _, err := DecodeHeader([]byte("<value>a</value></param><param><value>b</value>")); err == nil {
		t.Fatal("two values read as one")
	}
}

// FuzzReader reads arbitrary bytes as an archive: never a panic, never
// more than the disks' declared sizes (held small here) produced.
func FuzzReader(f *testing.F) {
	// Small seeds: the fuzzer slows to a crawl on inputs of megabytes.
	// Compressed, a disk of several blocks, mostly zeroes, is a few KiB.
	d := make([]byte, 3*BlockSize+5)
	copy(d, "some data at the start of the disk")
	f.Add(writeArchive(f, None, map[string][]byte{"Ref:1": d[:1000]}))
	f.Add(writeArchive(f, Gzip, map[string][]byte{"Ref:1": d, "Ref:2": d[:99]}))
	f.Add(writeArchive(f, Zstd, map[string][]byte{"Ref:1": d}))
	f.Add(newHandTar().add("ova.xml", ovaXML(10, 0)).add("Ref:7/00000000", []byte("0123456789")).bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		defer r.Close()
		for i := range 8 {
			id, err := r.NextDisk()
			if err != nil {
				return
			}
			size := min(max(num(r.Header.objectSize(id)), 0), 8*BlockSize)
			dr := r.Disk(id, size)
			if i%2 == 1 {
				// As the import reads: blocks at offsets, inside the disk.
				for {
					off, b, err := dr.Next()
					if err != nil {
						break
					}
					if off < 0 || off+int64(len(b)) > size || len(b) == 0 {
						t.Fatalf("block of %d at %d in a disk of %d", len(b), off, size)
					}
				}
				continue
			}
			n, err := io.Copy(io.Discard, dr)
			if n > size {
				t.Fatalf("%d bytes from a disk of %d", n, size)
			}
			if err != nil {
				return
			}
		}
	})
}

// objectSize is a disk object's declared size, for the fuzzer.
func (h *Header) objectSize(id string) any {
	if o := h.Find(id); o != nil {
		return o.Snapshot["virtual_size"]
	}
	return nil
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(ovaXML(10, 2))
	f.Add(testHeader(map[string]int64{"Ref:1": 5}).Encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHeader(data)
		if err != nil {
			return
		}
		// What was read is written back and read again the same.
		h2, err := DecodeHeader(h.Encode())
		if err != nil || len(h2.Objects) != len(h.Objects) {
			t.Fatalf("re-reading: %v", err)
		}
		_, _ = planImport(h)
	})
}
