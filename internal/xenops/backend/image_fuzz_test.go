package backend

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
)

// imageBytes builds an image in memory (for seeds).
func imageBytes(meta any, stream uint64, data []byte, end bool) []byte {
	mb, _ := json.Marshal(meta)
	var b bytes.Buffer
	b.WriteString(imageSignature)
	hdr := func(typ, n uint64) {
		var h [16]byte
		binary.BigEndian.PutUint64(h[:8], typ)
		binary.BigEndian.PutUint64(h[8:], n)
		b.Write(h[:])
	}
	hdr(recMeta, uint64(len(mb)))
	b.Write(mb)
	hdr(stream, uint64(len(data)))
	b.Write(data)
	if end {
		hdr(recEnd, 0)
	}
	return b.Bytes()
}

// FuzzSuspendImage feeds arbitrary bytes to the suspend image parser and
// to the check of the VCPUs an image carries. Neither may panic, hang or
// allocate beyond its bounds, and whatever they accept must be framed
// inside the input and rebuilt from allowed parts only.
func FuzzSuspendImage(f *testing.F) {
	f.Add(imageBytes(&ImageMeta{Backend: "simulator"}, RecSim, []byte(`{"simulated-memory":1}`), true))
	f.Add(imageBytes(&ImageMeta{Backend: "qemu", Spec: Spec{UUID: "../../etc", Kernel: "/etc/shadow"},
		Disks:   []Disk{{Device: "0", Path: "/etc/shadow"}},
		HotCPUs: []CPUDevice{{ID: "cpu-hot-1-0-0", Args: map[string]any{"driver": "max-x86_64-cpu", "socket-id": 1, "core-id": 0, "thread-id": 0}}}},
		RecQEMU, []byte("QEVM\x00\x00\x00\x03"), true))
	f.Add(imageBytes(&ImageMeta{Backend: "qemu"}, RecQEMU, nil, false))
	f.Add([]byte(imageSignature + "\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff"))
	f.Add([]byte(imageSignature))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := parseImage(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if l.meta == nil || l.at < int64(len(imageSignature)) || l.length < 0 || l.at+l.length+16 > int64(len(data)) {
			t.Fatalf("accepted a layout outside the input: %+v (len %d)", l, len(data))
		}
		if want, _ := streamOf(l.meta.Backend); want != l.stream {
			t.Fatalf("stream %d for backend %q", l.stream, l.meta.Backend)
		}
		hot, err := CheckHotCPUs(l.meta.HotCPUs, &Spec{VCPUs: 1, MaxCPU: 8})
		if err != nil {
			return
		}
		for _, c := range hot {
			if !hotCPUID.MatchString(c.ID) || c.Args["id"] != c.ID {
				t.Fatalf("accepted VCPU %+v", c)
			}
			for k := range c.Args {
				if k != "id" && k != "driver" && !hotCPUProps[k] {
					t.Fatalf("accepted VCPU property %q", k)
				}
			}
		}
	})
}

// The parser's refusals, one per rule.
func TestParseImageRefuses(t *testing.T) {
	good := imageBytes(&ImageMeta{Backend: "simulator"}, RecSim, []byte("{}"), true)
	if _, err := parseImage(bytes.NewReader(good), int64(len(good))); err != nil {
		t.Fatalf("good image refused: %v", err)
	}
	// Bytes after the end record (the rest of a suspend VDI) are ignored.
	padded := append(bytes.Clone(good), make([]byte, 4096)...)
	if _, err := parseImage(bytes.NewReader(padded), int64(len(padded))); err != nil {
		t.Fatalf("image followed by zeros refused: %v", err)
	}
	meta2 := append([]byte(imageSignature), good[len(imageSignature):len(good)-16-16-2]...)
	meta2 = append(meta2, good[len(imageSignature):]...)
	for name, c := range map[string]struct {
		data []byte
		want error
	}{
		"unknown field":   {imageBytes(map[string]any{"Backend": "simulator", "Exec": "/bin/sh"}, RecSim, nil, true), ErrImageMeta},
		"unknown backend": {imageBytes(map[string]any{"Backend": "xen"}, RecSim, nil, true), ErrImageMeta},
		"trailing json":   {imageBytes(json.RawMessage(`{"Backend":"simulator"} {}`), RecSim, nil, true), ErrImageMeta},
		"too many cpus":   {imageBytes(&ImageMeta{Backend: "qemu", HotCPUs: make([]CPUDevice, MaxVCPUs+1)}, RecQEMU, nil, true), ErrImageMeta},
		"wrong stream":    {imageBytes(&ImageMeta{Backend: "simulator"}, RecQEMU, nil, true), ErrImageBackend},
		"unfinished":      {imageBytes(&ImageMeta{Backend: "simulator"}, RecSim, nil, false), ErrImageNoEnd},
		"metadata twice":  {meta2, ErrImageRecord},
		"short":           {good[:len(imageSignature)+3], ErrImageTruncated},
	} {
		if _, err := parseImage(bytes.NewReader(c.data), int64(len(c.data))); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
