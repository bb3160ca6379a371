package rrdd

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
)

const (
	testHostUUID = "0b7f7c4e-1d2a-4c55-9a51-3b8e2f0a6c11"
	testVMUUID   = "6a1c9f20-8e4b-4d3f-b2a7-5c0d1e9f8a22"
)

// syncBuffer is a log sink safe for the race detector.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// count is how many log lines have every one of parts.
func (s *syncBuffer) count(parts ...string) int {
	n := 0
	for line := range strings.Lines(s.String()) {
		line = strings.TrimSuffix(line, "\n") + " "
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			n++
		}
	}
	return n
}

func testLogger() (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// writeFile replaces dir/name as a plugin would: a temporary file renamed
// over it.
func writeFile(t *testing.T, dir, name string, b []byte) {
	t.Helper()
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func encodeV2(t *testing.T, ts float64, srcs []plugin.Source, vals []rrd.Value) []byte {
	t.Helper()
	b, err := plugin.Encode(ts, srcs, vals)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gaugeSrc(name string) plugin.Source {
	return plugin.Source{Name: name, Type: rrd.Gauge, ValueType: plugin.Float, Default: true,
		Min: math.Inf(-1), Max: math.Inf(1), Description: "gauge " + name, Units: "u"}
}

func fv(f float64) rrd.Value { return rrd.Value{Kind: rrd.Float, F: f} }
func iv(i int64) rrd.Value   { return rrd.Value{Kind: rrd.Int, I: i} }

// writeGauge writes a one-source plugin file.
func writeGauge(t *testing.T, dir, name, src string, ts, v float64) {
	t.Helper()
	writeFile(t, dir, name, encodeV2(t, ts, []plugin.Source{gaugeSrc(src)}, []rrd.Value{fv(v)}))
}

func sample(t *testing.T, s Sampler, now time.Time) map[string]Reading {
	t.Helper()
	rs, err := s.Sample(context.Background(), now)
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	out := map[string]Reading{}
	for _, r := range rs {
		if _, dup := out[r.Source.Name]; dup {
			t.Fatalf("source %q read twice", r.Source.Name)
		}
		out[r.Source.Name] = r
	}
	return out
}

func TestPluginSamplerService(t *testing.T) {
	dir := t.TempDir()
	log, logs := testLogger()
	svc, err := New(Config{Dir: t.TempDir(), HostUUID: testHostUUID, Log: log,
		Samplers: []Named{{"plugins", PluginSampler(dir, log)}}})
	if err != nil {
		t.Fatal(err)
	}
	hostSrcs := []plugin.Source{
		{Name: "sample_gauge", Description: "a gauge", Units: "%", Type: rrd.Gauge, ValueType: plugin.Float,
			Default: true, Min: 0, Max: 100},
		{Name: "sample_counter", Description: "a counter", Units: "events/s", Type: rrd.Derive,
			ValueType: plugin.Int64, Default: true, Min: 0, Max: math.Inf(1)},
		{Name: "sample_extra", Description: "off by default", Units: "s", Type: rrd.Gauge,
			ValueType: plugin.Float, Min: math.Inf(-1), Max: math.Inf(1)},
	}
	vmSrcs := []plugin.Source{{Name: "vm_gauge", Description: "a VM's gauge", Units: "B", Type: rrd.Gauge,
		ValueType: plugin.Float, Default: true, Owner: plugin.Owner{Kind: plugin.VM, UUID: testVMUUID},
		Min: math.Inf(-1), Max: math.Inf(1)}}
	host := plugin.Owner{Kind: plugin.Host}
	vm := plugin.Owner{Kind: plugin.VM, UUID: testVMUUID}

	t0 := time.Unix(1_700_000_000, 0)
	tick := func(i int) time.Time {
		now := t0.Add(time.Duration(i) * Step)
		ts := float64(now.Unix())
		writeFile(t, dir, "host-plugin", encodeV2(t, ts, hostSrcs,
			[]rrd.Value{fv(10 + 7.5*float64(i)), iv(1000 + 50*int64(i)), fv(100 + float64(i))}))
		writeFile(t, dir, "vm-plugin", encodeV2(t, ts, vmSrcs, []rrd.Value{fv(3 + float64(i))}))
		svc.Tick(context.Background(), now)
		return now
	}
	var now time.Time
	for i := range 3 {
		now = tick(i)
	}
	query := func(o plugin.Owner, name string, want float64) {
		t.Helper()
		got, err := svc.Query(o, name, now)
		if err != nil || math.Abs(got-want) > 1e-9 {
			t.Errorf("Query(%v, %s) = %v, %v; want %v", o, name, got, err, want)
		}
	}
	query(host, "sample_gauge", 25)   // the last value written
	query(host, "sample_counter", 10) // 50 per 5 s
	query(vm, "vm_gauge", 5)
	if _, err := svc.Query(host, "sample_extra", now); err == nil {
		t.Error("a source not recorded by default can be queried")
	}

	find := func(o plugin.Owner, name string) DataSource {
		t.Helper()
		for _, d := range svc.DataSources(o) {
			if d.Name == name {
				return d
			}
		}
		t.Fatalf("DataSources(%v) lacks %s: %+v", o, name, svc.DataSources(o))
		return DataSource{}
	}
	if d := find(host, "sample_gauge"); !d.Enabled || !d.Standard || d.Units != "%" ||
		d.Description != "a gauge" || d.Min != 0 || d.Max != 100 {
		t.Errorf("sample_gauge: %+v", d)
	}
	if d := find(host, "sample_counter"); !d.Enabled || d.Units != "events/s" || d.Description != "a counter" {
		t.Errorf("sample_counter: %+v", d)
	}
	if d := find(vm, "vm_gauge"); !d.Enabled || d.Units != "B" || d.Description != "a VM's gauge" {
		t.Errorf("vm_gauge: %+v", d)
	}
	if d := find(host, "sample_extra"); d.Enabled || d.Standard || d.Units != "s" {
		t.Errorf("sample_extra before Record: %+v", d)
	}
	if err := svc.Record(host, "sample_extra", now); err != nil {
		t.Fatal(err)
	}
	if d := find(host, "sample_extra"); !d.Enabled {
		t.Errorf("sample_extra after Record: %+v", d)
	}
	now = tick(3)
	query(host, "sample_extra", 103)
	query(host, "sample_gauge", 32.5)

	if n := logs.count("level=WARN"); n != 0 {
		t.Errorf("warnings logged:\n%s", logs)
	}
}

// The plugin's own timestamp does not decide when a reading is recorded:
// a plugin whose clock is far off still lands at the tick.
func TestPluginSamplerTickTime(t *testing.T) {
	dir := t.TempDir()
	svc, err := New(Config{Dir: t.TempDir(), HostUUID: testHostUUID, Log: slog.New(slog.DiscardHandler),
		Samplers: []Named{{"plugins", PluginSampler(dir, nil)}}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 3 {
		writeGauge(t, dir, "p", "g", 12345+float64(i), float64(i))
		svc.Tick(context.Background(), t0.Add(time.Duration(i)*Step))
	}
	if got, err := svc.Query(plugin.Owner{Kind: plugin.Host}, "g", t0.Add(2*Step)); err != nil || got != 2 {
		t.Errorf("Query = %v, %v; want 2", got, err)
	}
}

func TestPluginSamplerNoUpdateAndForget(t *testing.T) {
	dir := t.TempDir()
	log, logs := testLogger()
	s := PluginSampler(dir, log)
	now := time.Unix(1_700_000_000, 0)
	writeGauge(t, dir, "p", "g", 1, 1)
	if got := sample(t, s, now); len(got) != 1 || got["g"].Value.F != 1 || got["g"].Source.Owner.Kind != plugin.Host {
		t.Fatalf("first read: %+v", got)
	}
	// Not rewritten: no readings, no log, and read again once rewritten
	// (no back-off).
	for range 3 {
		if got := sample(t, s, now); len(got) != 0 {
			t.Fatalf("unchanged file read again: %+v", got)
		}
	}
	writeGauge(t, dir, "p", "g", 2, 2)
	if got := sample(t, s, now); got["g"].Value.F != 2 {
		t.Fatalf("after rewrite: %+v", got)
	}
	// Removed, then written again with the same bytes as before: a new
	// file, read afresh rather than taken for no update.
	if err := os.Remove(filepath.Join(dir, "p")); err != nil {
		t.Fatal(err)
	}
	if got := sample(t, s, now); len(got) != 0 {
		t.Fatalf("removed file read: %+v", got)
	}
	writeGauge(t, dir, "p", "g", 2, 2)
	if got := sample(t, s, now); got["g"].Value.F != 2 {
		t.Fatalf("recreated file: %+v", got)
	}
	if logs.String() != "" {
		t.Errorf("logged:\n%s", logs)
	}
}

func TestPluginSamplerDir(t *testing.T) {
	s := PluginSampler(filepath.Join(t.TempDir(), "missing"), nil)
	if rs, err := s.Sample(context.Background(), time.Now()); err != nil || len(rs) != 0 {
		t.Errorf("missing dir: %v, %v", rs, err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s = PluginSampler(file, slog.New(slog.DiscardHandler))
	if _, err := s.Sample(context.Background(), time.Now()); err == nil {
		t.Error("a dir that is a file: no error")
	}
}

// tornCopy flips a bit of the first value without fixing the data CRC.
func tornCopy(b []byte) []byte {
	c := slices.Clone(b)
	c[31] ^= 0x40
	return c
}

// rawV2 builds a v2 file by hand with metaLen announced and meta appended.
func rawV2(metaLen uint32, meta []byte) []byte {
	b := []byte(plugin.Header)
	b = binary.BigEndian.AppendUint32(b, 0) // data CRC, filled in below
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(meta))
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(1_700_000_000))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(1))
	binary.BigEndian.PutUint32(b[11:], crc32.ChecksumIEEE(b[23:39]))
	b = binary.BigEndian.AppendUint32(b, metaLen)
	return append(b, meta...)
}

func TestPluginSamplerBadFiles(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	log, logs := testLogger()
	s := PluginSampler(dir, log)

	good := func(name string) []byte {
		return encodeV2(t, 1_700_000_000, []plugin.Source{gaugeSrc(name)}, []rrd.Value{fv(1)})
	}
	bigMeta := bytes.Repeat([]byte(" "), 10<<20)
	copy(bigMeta, `{"datasources":{"bigmeta":{"value_type":"float"}}}`)
	bad := map[string][]byte{
		"torn":      tornCopy(good("torn")),
		"truncated": good("truncated")[:40],
		"garbage":   append([]byte("GARBAGE!!!!"), good("garbage")[11:]...),
		"bigmeta":   rawV2(uint32(len(bigMeta)), bigMeta), // a 10 MB file
		"claimsbig": rawV2(10<<20, []byte(`{}`)),          // a small file announcing 10 MB
		"badmeta":   rawV2(9, []byte(`{"datasou`)),
		"badtime":   encodeV2(t, math.NaN(), []plugin.Source{gaugeSrc("badtime")}, []rrd.Value{fv(1)}),
		"empty":     nil,
	}
	for name, b := range bad {
		writeFile(t, dir, name, b)
	}
	// Ignored without a word: a link out of dir, a dot-file, a directory,
	// a FIFO.
	writeFile(t, outside, "target", good("link"))
	if err := os.Symlink(filepath.Join(outside, "target"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, ".hidden", good("hidden"))
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	now := time.Unix(1_700_000_000, 0)
	for i := range 40 {
		writeGauge(t, dir, "good", "good", float64(1_700_000_000+i), float64(i))
		got := sample(t, s, now)
		if len(got) != 1 || got["good"].Value.F != float64(i) {
			t.Fatalf("tick %d: readings %+v", i, got)
		}
	}
	for name := range bad {
		if n := logs.count("level=WARN", "plugin="+name+" "); n != 1 {
			t.Errorf("%s: %d warnings, want 1\n%s", name, n, logs)
		}
	}
	for _, name := range []string{"good", "link", "hidden", ".hidden", "sub", "fifo"} {
		if n := logs.count("plugin=" + name + " "); n != 0 {
			t.Errorf("%s: logged %d times", name, n)
		}
	}

	// Mended, the file is read again once its back-off is over, and its
	// recovery is logged once.
	writeFile(t, dir, "torn", good("torn"))
	mended := -1
	for i := range 600 {
		writeGauge(t, dir, "good", "good", float64(1_700_001_000+i), float64(i))
		got := sample(t, s, now)
		if _, ok := got["good"]; !ok {
			t.Fatalf("tick %d: good plugin missing", i)
		}
		if _, ok := got["torn"]; ok {
			mended = i
			break
		}
	}
	if mended < 0 || mended > maxPluginSkip {
		t.Fatalf("mended file read at tick %d", mended)
	}
	if n := logs.count("level=INFO", "plugin=torn "); n != 1 {
		t.Errorf("recovery logged %d times\n%s", n, logs)
	}
	if n := logs.count("level=WARN", "plugin=torn "); n != 1 {
		t.Errorf("torn: %d warnings after recovery", n)
	}
}

func TestPluginSamplerTooManyFiles(t *testing.T) {
	dir := t.TempDir()
	log, logs := testLogger()
	s := PluginSampler(dir, log)
	for i := range 300 {
		writeGauge(t, dir, fmt.Sprintf("p%03d", i), fmt.Sprintf("s%03d", i), 1, float64(i))
	}
	got := sample(t, s, time.Now())
	if len(got) != MaxPluginFiles {
		t.Fatalf("%d readings, want %d", len(got), MaxPluginFiles)
	}
	for i := range MaxPluginFiles {
		if r, ok := got[fmt.Sprintf("s%03d", i)]; !ok || r.Value.F != float64(i) {
			t.Fatalf("s%03d: %+v", i, r)
		}
	}
	sample(t, s, time.Now())
	if n := logs.count("level=WARN", "too many"); n != 1 {
		t.Errorf("%d warnings about the file count, want 1\n%s", n, logs)
	}
	for i := range 100 {
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("p%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// Now all 200 are read: those read before (their readers kept) have
	// no update unless rewritten, those left out before are new.
	writeGauge(t, dir, "p299", "s299", 2, 2)
	got = sample(t, s, time.Now())
	if _, ok := got["s100"]; len(got) != 300-MaxPluginFiles || ok || got["s299"].Value.F != 2 {
		t.Errorf("after removals: %d readings: %+v", len(got), got)
	}
	if n := logs.count("level=INFO", "within bounds"); n != 1 {
		t.Errorf("%d notes of recovery, want 1\n%s", n, logs)
	}
}

// encodeV1 writes a protocol v1 file as xapi's writer does.
func encodeV1(payload string) []byte {
	return fmt.Appendf(nil, "DATASOURCES\n%08x\n%x\n%s\n", len(payload), md5.Sum([]byte(payload)), payload)
}

func TestPluginSamplerV1(t *testing.T) {
	dir := t.TempDir()
	log, logs := testLogger()
	s := PluginSampler(dir, log)
	payload := `{"timestamp":1700000000.5,"datasources":{` +
		`"v1_gauge":{"description":"g","owner":"vm ` + testVMUUID + `","value":"0.25","value_type":"float",` +
		`"type":"gauge","default":"true","units":"%","min":"0.00","max":"100.00"},` +
		`"v1_counter":{"value":"9007199254740993","value_type":"INT64","type":"derive","transform":"bogus"},` +
		`"v1_plain":{"value":1.5}}}`
	writeFile(t, dir, "v1", encodeV1(payload))
	got := sample(t, s, time.Now())
	if len(got) != 3 {
		t.Fatalf("readings: %+v", got)
	}
	g := got["v1_gauge"]
	if g.Value.F != 0.25 || g.Source.Owner != (plugin.Owner{Kind: plugin.VM, UUID: testVMUUID}) ||
		g.Source.Type != rrd.Gauge || !g.Source.Default || g.Source.Units != "%" || g.Source.Max != 100 {
		t.Errorf("v1_gauge: %+v", g)
	}
	if c := got["v1_counter"]; c.Value.Kind != rrd.Int || c.Value.I != 9007199254740993 || c.Source.Type != rrd.Derive {
		t.Errorf("v1_counter: %+v", c)
	}
	if p := got["v1_plain"]; p.Value.F != 1.5 || p.Source.ValueType != plugin.Float || p.Source.Type != rrd.Absolute {
		t.Errorf("v1_plain: %+v", p)
	}
	// Unchanged: no update, silently.
	if got := sample(t, s, time.Now()); len(got) != 0 {
		t.Errorf("unchanged v1 file read again: %+v", got)
	}
	// A wrong digest, a length past the end, a payload that is no JSON:
	// skipped, each logged once.
	for name, b := range map[string][]byte{
		"digest":    bytes.Replace(encodeV1(payload), []byte(`"0.25"`), []byte(`"0.26"`), 1),
		"short":     encodeV1(payload)[:100],
		"notjson":   encodeV1(`{"timestamp":1,"datasources":[]}`),
		"novalue":   encodeV1(`{"timestamp":1,"datasources":{"x":{}}}`),
		"badlength": append([]byte("DATASOURCES\nzzzzzzzz\n"), encodeV1(payload)[21:]...),
	} {
		writeFile(t, dir, "bad-"+name, b)
	}
	for range 4 {
		if got := sample(t, s, time.Now()); len(got) != 0 {
			t.Errorf("bad v1 files read: %+v", got)
		}
	}
	for _, name := range []string{"digest", "short", "notjson", "novalue", "badlength"} {
		if n := logs.count("level=WARN", "plugin=bad-"+name+" "); n != 1 {
			t.Errorf("bad-%s: %d warnings\n%s", name, n, logs)
		}
	}
}

func TestSamplePluginScript(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	dir := t.TempDir()
	script, err := filepath.Abs("../../scripts/rrd-sample-plugin")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "python3", script, "--dir", dir, "--name", "sample",
		"--vm", strings.ToUpper(testVMUUID), "--once").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "sample"))
	if err != nil {
		t.Fatal(err)
	}
	var r plugin.Reader
	direct, err := r.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	ts := direct.Timestamp
	if d := time.Since(time.Unix(int64(ts), 0)); d < -time.Minute || d > time.Minute {
		t.Errorf("timestamp %v is not now", ts)
	}
	// The metadata is in the documented JSON shape, properties as strings.
	var meta map[string]map[string]map[string]any
	mlen := binary.BigEndian.Uint32(raw[31+8*len(direct.Sources):])
	if err := json.Unmarshal(raw[35+8*len(direct.Sources):][:mlen], &meta); err != nil {
		t.Fatal(err)
	}
	for name, props := range meta["datasources"] {
		for k, v := range props {
			if _, ok := v.(string); !ok {
				t.Errorf("%s.%s is %T, not a string", name, k, v)
			}
		}
	}

	log, logs := testLogger()
	got := sample(t, PluginSampler(dir, log), time.Now())
	if len(got) != 4 {
		t.Fatalf("readings: %+v", got)
	}
	wave := 50 + 50*math.Sin(2*math.Pi*ts/300)
	c := got["sample_counter"]
	if c.Source.Type != rrd.Derive || c.Source.ValueType != plugin.Int64 || !c.Source.Default ||
		c.Source.Units != "events/s" || c.Source.Min != 0 || !math.IsInf(c.Source.Max, 1) ||
		c.Source.Owner.Kind != plugin.Host || c.Value.Kind != rrd.Int || c.Value.I != int64(ts*10) {
		t.Errorf("sample_counter: %+v", c)
	}
	g := got["sample_gauge"]
	if g.Source.Type != rrd.Gauge || g.Source.ValueType != plugin.Float || !g.Source.Default ||
		g.Source.Units != "%" || g.Source.Min != 0 || g.Source.Max != 100 || g.Source.Description == "" ||
		math.Abs(g.Value.F-wave) > 1e-9 {
		t.Errorf("sample_gauge: %+v (want %v)", g, wave)
	}
	u := got["sample_uptime"]
	if u.Source.Default || u.Source.Units != "s" || u.Value.F < 0 || u.Value.F > 60 {
		t.Errorf("sample_uptime: %+v", u)
	}
	v := got["sample_vm_gauge"]
	if v.Source.Owner != (plugin.Owner{Kind: plugin.VM, UUID: testVMUUID}) || !v.Source.Default ||
		math.Abs(v.Value.F-wave) > 1e-9 {
		t.Errorf("sample_vm_gauge: %+v", v)
	}
	if logs.String() != "" {
		t.Errorf("logged:\n%s", logs)
	}
	// The temporary file is gone; only the plugin's file remains.
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries", len(ents))
	}
}
