package backend

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSuspendImageFormat(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	meta := &ImageMeta{Spec: Spec{UUID: "u", VCPUs: 2}, Disks: []Disk{{VBD: "OpaqueRef:b", Device: "0"}}, Backend: "qemu"}
	at, err := WriteImageHeader(f, meta, RecQEMU)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("QEVM-stream"))
	// Incomplete: no length, no end record.
	if _, err := ReadImageMeta(path); !errors.Is(err, ErrImageNoEnd) {
		t.Fatalf("incomplete image: %v", err)
	}
	if err := FinishImage(f, at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	got, err := ReadImageMeta(path)
	if err != nil || got.Spec.UUID != "u" || got.Spec.VCPUs != 2 || len(got.Disks) != 1 {
		t.Fatalf("read back: %+v %v", got, err)
	}
	s, m, err := OpenImageStream(path, RecQEMU)
	if err != nil || m.Spec.UUID != "u" {
		t.Fatal(err)
	}
	rest := make([]byte, 11)
	s.Read(rest)
	s.Close()
	if string(rest) != "QEVM-stream" {
		t.Fatalf("stream %q", rest)
	}
	b, _ := os.ReadFile(path)
	bad := func(name string, data []byte, want error) {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o600)
		if _, err := ReadImageMeta(p); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	bad("signature", append([]byte("XenSavedDomain\n"), b[15:]...), ErrImageSignature)
	bad("truncated", b[:len(imageSignature)+10], ErrImageTruncated)
	unknown := bytes.Clone(b)
	unknown[len(imageSignature)+7] = 9
	bad("unknown", unknown, ErrImageRecord)
	huge := bytes.Clone(b)
	huge[len(imageSignature)+8] = 0x7f
	bad("huge", huge, ErrImageTooLarge)
	bad("noend", b[:len(b)-16], ErrImageNoEnd)
}
