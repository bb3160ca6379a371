package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"toolstackd/internal/xerr"
)

func TestParsePluginError(t *testing.T) {
	for _, c := range []struct {
		stdout string
		code   string
		params []string
	}{
		{`{"error": {"code": "SR_BACKEND_FAILURE_44", "params": ["", "no space", ""]}}`, "SR_BACKEND_FAILURE_44", []string{"", "no space", ""}},
		{`{"error": {"code": "VDI_IN_USE", "params": ["x", "y"]}}`, "VDI_IN_USE", []string{"x", "y"}},
		{`{"error": {"code": "MY_OWN_ERROR", "params": ["a"]}}`, "SR_BACKEND_FAILURE", []string{"1", "MY_OWN_ERROR: a", "oops"}},
		{`{"error": {"code": "lower case", "params": []}}`, "SR_BACKEND_FAILURE", nil},
		{`Traceback (most recent call last)`, "SR_BACKEND_FAILURE", []string{"1", "Traceback (most recent call last)", "oops"}},
		{``, "SR_BACKEND_FAILURE", []string{"1", "", "oops"}},
	} {
		e := parsePluginError("1", []byte(c.stdout), []byte("oops"))
		if e.Code != c.code || (c.params != nil && !reflect.DeepEqual(e.Params, c.params)) {
			t.Errorf("%q: %s %q", c.stdout, e.Code, e.Params)
		}
	}
}

func FuzzParsePluginOutput(f *testing.F) {
	f.Add([]byte(`{"error": {"code": "SR_BACKEND_FAILURE_44", "params": ["", "no space", ""]}}`))
	f.Add([]byte(`{"key": "k", "virtual_size": 10, "uri": ["samplenbd:///x"]}`))
	f.Add([]byte(`[{"key": "a"}]`))
	f.Add([]byte(`{"kind": "nbd", "uri": "nbd+unix:///vdi?socket=/x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := parsePluginError("1", b, b)
		if e == nil || !codeRE.MatchString(e.Code) {
			t.Fatalf("bad error %v", e)
		}
		for _, p := range e.Params {
			if len(p) > 4096+3 {
				t.Fatal("param not clipped")
			}
		}
		var v pluginVolume
		if parsePluginResult(b, &v) == nil {
			if vol, err := v.volume(); err == nil && (vol.Key == "" || vol.VirtualSize < 0) {
				t.Fatal("accepted a bad volume")
			}
		}
		var vs []pluginVolume
		parsePluginResult(b, &vs)
		var d Datapath
		parsePluginResult(b, &d)
		parsePluginResult(b, nil)
	})
}

func FuzzParseXferQuery(f *testing.F) {
	f.Add("vdi=OpaqueRef:3b0a5d9e-7a8c-4a55-9b6e-6f2f3c5d4e1f&format=qcow2&base=0b6e2b3c-2a44-4d5e-8f7a-1c2d3e4f5a6b")
	f.Add("vdi=0b6e2b3c-2a44-4d5e-8f7a-1c2d3e4f5a6b&format=vhd&task_id=OpaqueRef:x")
	f.Add("vdi=&format=RAW&chunked=true")
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		for _, export := range []bool{false, true} {
			x, err := parseXferQuery(q, export)
			if err != nil {
				if xe := xerr.From(err); xe.Code == xerr.InternalError {
					t.Fatalf("internal error for %q", raw)
				}
				continue
			}
			if x.Format != "raw" && x.Format != "qcow2" && x.Format != "vhd" {
				t.Fatalf("format %q accepted", x.Format)
			}
			if !validID(x.VDI) {
				t.Fatalf("vdi %q accepted", x.VDI)
			}
		}
	})
}

func FuzzParseMap(f *testing.F) {
	f.Add([]byte(`[{ "start": 0, "length": 1048576, "depth": 0, "present": true, "zero": false, "data": true, "offset": 327680},
{ "start": 1048576, "length": 3145728, "depth": 1, "present": false, "zero": true, "data": false}]`), int64(4194304))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		exts, err := parseMap(b, size)
		if err != nil {
			return
		}
		var next int64
		for _, e := range exts {
			if e.Start != next || e.Length <= 0 {
				t.Fatal("accepted a gap or an empty extent")
			}
			next += e.Length
		}
	})
}

// Every error code the package raises is a published XenAPI error (or an
// SR_BACKEND_FAILURE_<n>).
func TestErrorCodesArePublished(t *testing.T) {
	b, err := os.ReadFile("../api/datamodel/errors.json")
	if err != nil {
		t.Skip(err)
	}
	var published map[string]any
	json.Unmarshal(b, &published)
	re := regexp.MustCompile(`(?:xerr\.New|errorCode)\(\s*"([A-Z_0-9]+)"|err[A-Z][A-Za-z]+\s*=\s*"([A-Z_0-9]+)"`)
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, _ := os.ReadFile(f)
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			code := m[1] + m[2]
			if _, ok := published[code]; !ok {
				t.Errorf("%s: %s is not in errors.json", f, code)
			}
		}
	}
}

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
		plan := planQcow2(size, exts, round%2 == 0)
		var buf bytes.Buffer
		if err := plan.WriteTo(context.Background(), &buf, tailReader{bytes.NewReader(src), int64(len(src))}, nil); err != nil {
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
		p := planQcow2(size, exts, true)
		if p.Length()%qcowClusterSize != 0 || p.nClusters < 1+p.rtClusters+p.rbClusters+p.l1Clusters+int64(len(p.l2Tables))+p.nData {
			t.Fatal("inconsistent plan")
		}
		if p.rbClusters*(qcowClusterSize/2) < p.nClusters {
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
