package rrdd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/rrd"
	"toolstackd/internal/rrd/plugin"
	"toolstackd/internal/rrdd/stats"
)

const (
	hostUUID = "11111111-2222-3333-4444-555555555555"
	vmUUID   = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	vm2UUID  = "aaaaaaaa-bbbb-cccc-dddd-ffffffffffff"
)

// t0 is on a step boundary.
var t0 = time.Unix(1_700_000_000, 0)

func at(i int) time.Time { return t0.Add(time.Duration(i) * Step) }

// fake is a sampler whose readings the test sets between ticks.
type fake struct {
	readings []Reading
	err      error
}

func (f *fake) Sample(context.Context, time.Time) ([]Reading, error) { return f.readings, f.err }

func gauge(o plugin.Owner, name string, def bool, v float64) Reading {
	return Reading{Source: plugin.Source{Name: name, Owner: o, Type: rrd.Gauge, Default: def, Min: 0, Max: math.Inf(1),
		Description: "the " + name, Units: "B"}, Value: rrd.FloatValue(v)}
}

func derive(o plugin.Owner, name string, n int64) Reading {
	return Reading{Source: plugin.Source{Name: name, Owner: o, Type: rrd.Derive, Default: true, Min: 0, Max: math.Inf(1)},
		Value: rrd.IntValue(n)}
}

var (
	hostOwner = plugin.Owner{Kind: plugin.Host}
	vmOwner   = plugin.Owner{Kind: plugin.VM, UUID: vmUUID}
	vm2Owner  = plugin.Owner{Kind: plugin.VM, UUID: vm2UUID}
)

func newService(t *testing.T, dir string, samplers ...Named) (*Service, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	s, err := New(Config{Dir: dir, HostUUID: hostUUID, Samplers: samplers,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	return s, &logs
}

func names(dss []DataSource) string {
	var b strings.Builder
	for _, d := range dss {
		b.WriteString(d.Name)
		if d.Enabled {
			b.WriteString("+")
		}
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

func TestRecordingAndDataSources(t *testing.T) {
	f := &fake{}
	s, _ := newService(t, t.TempDir(), Named{"fake", f})
	ctx := context.Background()
	for i := range 5 {
		f.readings = []Reading{
			gauge(hostOwner, "mem", true, float64(100+i)),
			derive(hostOwner, "bytes", int64(1000*i)), // 200 B/s
			gauge(hostOwner, "extra", false, 7),
			gauge(vmOwner, "memory", true, 4096),
		}
		s.Tick(ctx, at(i))
	}
	if got := names(s.DataSources(hostOwner)); got != "bytes+ extra mem+" {
		t.Fatalf("host data sources: %s", got)
	}
	if got := names(s.DataSources(vmOwner)); got != "memory+" {
		t.Fatalf("VM data sources: %s", got)
	}
	if d := s.DataSources(hostOwner)[2]; d.Description != "the mem" || d.Units != "B" || !d.Standard {
		t.Fatalf("mem: %+v", d)
	}
	if v, err := s.Query(hostOwner, "mem", at(4)); err != nil || v != 104 {
		t.Fatalf("query mem: %v %v", v, err)
	}
	if v, err := s.Query(hostOwner, "bytes", at(4)); err != nil || v != 200 {
		t.Fatalf("query bytes: %v %v", v, err)
	}
	// A source that is not recorded: Datasource_missing, as rrdd.
	var missing *MissingError
	if _, err := s.Query(hostOwner, "extra", at(4)); !errors.As(err, &missing) || missing.What != "extra" {
		t.Fatalf("query of a source not recorded: %v", err)
	}
	if _, err := s.Query(vm2Owner, "memory", at(4)); !errors.As(err, &missing) || missing.What != "VM: "+vm2UUID {
		t.Fatalf("query of a VM with no RRD: %v", err)
	}
	if err := s.Record(hostOwner, "nosuch", at(4)); !errors.As(err, &missing) {
		t.Fatalf("record of a source nobody reports: %v", err)
	}

	// Record the optional source: it is enabled and filled from then on.
	if err := s.Record(hostOwner, "extra", at(4)); err != nil {
		t.Fatal(err)
	}
	f.readings = append(f.readings[:0], gauge(hostOwner, "mem", true, 1), derive(hostOwner, "bytes", 5000), gauge(hostOwner, "extra", false, 7))
	s.Tick(ctx, at(5))
	if got := names(s.DataSources(hostOwner)); got != "bytes+ extra+ mem+" {
		t.Fatalf("after record: %s", got)
	}
	if v, err := s.Query(hostOwner, "extra", at(5)); err != nil || v != 7 {
		t.Fatalf("query extra: %v %v", v, err)
	}
	// Forget: still reported, so listed, but disabled and its history gone.
	if err := s.Forget(hostOwner, "mem"); err != nil {
		t.Fatal(err)
	}
	if got := names(s.DataSources(hostOwner)); got != "bytes+ extra+ mem" {
		t.Fatalf("after forget: %s", got)
	}
	// A source recorded but no longer reported stays listed, disabled,
	// without a description.
	f.readings = []Reading{derive(hostOwner, "bytes", 6000)}
	s.Tick(ctx, at(6))
	s2, _ := newService(t, t.TempDir())
	if err := s2.Put(hostOwner, mustSnapshot(t, s, hostOwner)); err != nil {
		t.Fatal(err)
	}
	var extra DataSource
	for _, d := range s2.DataSources(hostOwner) {
		if d.Name == "extra" {
			extra = d
		}
	}
	if extra.Enabled || extra.Description != "description not available" || extra.Units != "unknown" {
		t.Fatalf("an archived source not reported: %+v", extra)
	}
}

func mustSnapshot(t *testing.T, s *Service, o plugin.Owner) *rrd.RRD {
	t.Helper()
	r, err := s.Snapshot(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Archives outlive the service: a clean stop writes them, a new service
// continues them.
func TestArchivesSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	f := &fake{}
	s, _ := newService(t, dir, Named{"fake", f})
	ctx, cancel := context.WithCancel(context.Background())
	for i := range 4 {
		f.readings = []Reading{gauge(hostOwner, "mem", true, float64(i)), gauge(vmOwner, "memory", true, float64(10*i))}
		s.Tick(ctx, at(i))
	}
	cancel()
	if err := s.ArchiveAll(); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{hostUUID, vmUUID} {
		if _, err := os.Stat(filepath.Join(dir, u+".gz")); err != nil {
			t.Fatalf("archive of %s: %v", u, err)
		}
	}
	before := mustSnapshot(t, s, vmOwner)

	s2, _ := newService(t, dir, Named{"fake", f})
	if got := mustSnapshot(t, s2, hostOwner).LastUpdated(); got != float64(at(3).Unix()) {
		t.Fatalf("host RRD after restart last updated at %v, want %v", got, at(3).Unix())
	}
	// The VM's RRD is read from its archive until the VM reports again.
	after := mustSnapshot(t, s2, vmOwner)
	if after.LastUpdated() != before.LastUpdated() {
		t.Fatalf("the VM's RRD read back was updated at %v, archived at %v", after.LastUpdated(), before.LastUpdated())
	}
	for a := range before.Archives() {
		for age := range 4 {
			x, _ := before.Row(a, 0, age)
			y, _ := after.Row(a, 0, age)
			if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
				t.Fatalf("archive %d row %d: %v archived, %v read back", a, age, x, y)
			}
		}
	}
	f.readings = []Reading{gauge(hostOwner, "mem", true, 9), gauge(vmOwner, "memory", true, 90)}
	s2.Tick(context.Background(), at(4))
	r := mustSnapshot(t, s2, vmOwner)
	if v, _ := r.Row(0, 0, 0); v != 90 {
		t.Fatalf("newest VM row %v", v)
	}
	if v, _ := r.Row(0, 0, 1); v != 30 {
		t.Fatalf("the row before the restart: %v, want 30", v)
	}
}

// A VM that stops reporting leaves memory after three ticks, archived,
// and comes back with its history.
func TestOwnerStopsReporting(t *testing.T) {
	dir := t.TempDir()
	f := &fake{readings: []Reading{gauge(vmOwner, "memory", true, 5), gauge(vm2Owner, "memory", true, 6)}}
	s, _ := newService(t, dir, Named{"fake", f})
	ctx := context.Background()
	s.Tick(ctx, at(0))
	s.Tick(ctx, at(1))
	f.readings = f.readings[1:]
	for i := 2; i < 2+missedLimit; i++ {
		s.Tick(ctx, at(i))
	}
	if got := s.Owners(); len(got) != 1 || got[0] != vm2Owner {
		t.Fatalf("owners in memory: %v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, vmUUID+".gz")); err != nil {
		t.Fatalf("the stopped VM was not archived: %v", err)
	}
	if got := names(s.DataSources(vmOwner)); got != "memory" {
		t.Fatalf("an archived VM's sources: %q", got)
	}
	// The export leaves out what is not in memory.
	x, err := s.Export(false, rrd.SelectOwners(nil, true), rrd.SelectOwners(nil, false), -60, 0, rrd.Average)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Legend) != 1 || !strings.Contains(x.Legend[0], vm2UUID) {
		t.Fatalf("legend %v", x.Legend)
	}
	if err := s.Remove(vmOwner); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot(vmOwner); !errors.Is(err, ErrNoRRD) {
		t.Fatalf("after Remove: %v", err)
	}
}

// Hostile readings are dropped; a failing sampler is skipped and logged
// once.
func TestHostileReadingsAndFailingSamplers(t *testing.T) {
	bad := &fake{err: errors.New("boom")}
	f := &fake{}
	s, logs := newService(t, t.TempDir(), Named{"bad", bad}, Named{"fake", f})
	s.cfg.Exists = func(o plugin.Owner) bool { return o.UUID != vm2UUID }
	f.readings = []Reading{
		gauge(plugin.Owner{Kind: plugin.VM, UUID: "../../etc/passwd"}, "x", true, 1),
		gauge(plugin.Owner{Kind: plugin.SR, UUID: ""}, "x", true, 1),
		gauge(vm2Owner, "x", true, 1), // not in the database
		gauge(plugin.Owner{Kind: plugin.VM, UUID: strings.ToUpper(vmUUID)}, "x", true, 1),
	}
	for i := range MaxSourcesPerOwner + 10 {
		f.readings = append(f.readings, gauge(hostOwner, "s"+strconv.Itoa(i), true, 1))
	}
	for i := range 3 {
		s.Tick(context.Background(), at(i))
	}
	if got := s.Owners(); len(got) != 1 || got[0] != vmOwner {
		t.Fatalf("owners: %v", got)
	}
	if n := len(s.DataSources(hostOwner)); n != MaxSourcesPerOwner {
		t.Fatalf("host has %d sources, bound %d", n, MaxSourcesPerOwner)
	}
	if n := strings.Count(logs.String(), "a sampler failed"); n != 1 {
		t.Fatalf("failing sampler logged %d times:\n%s", n, logs)
	}
	bad.err = nil
	s.Tick(context.Background(), at(3))
	if !strings.Contains(logs.String(), "a sampler recovered") {
		t.Fatalf("recovery not logged:\n%s", logs)
	}
	entries, _ := os.ReadDir(s.cfg.Dir)
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".gz") {
			t.Errorf("unexpected file %s", e.Name())
		}
	}
	if err := s.Put(plugin.Owner{Kind: plugin.VM, UUID: "../x"}, mustSnapshot(t, s, vmOwner)); err == nil {
		t.Fatal("Put with a bad uuid accepted")
	}
}

// The names clients match on.
func TestReadingNames(t *testing.T) {
	h := stats.Host{CPUBusy: []time.Duration{time.Second, 3 * time.Second}, CPUTotal: []time.Duration{2 * time.Second, 4 * time.Second},
		MemoryTotal: 8 << 30, MemoryFree: 2 << 30, LoadAverage: 0.5,
		NICs:  []stats.NIC{{Device: "eth0", RxBytes: 10, TxBytes: 20}, {Device: "tap1", RxBytes: 1}},
		Disks: []stats.Disk{{Device: "sda", ReadBytes: 512}}}
	got := map[string]rrd.Value{}
	for _, r := range HostReadings(h, func(d string) bool { return d == "eth0" }) {
		got[r.Source.Name] = r.Value
	}
	for _, n := range []string{"cpu0", "cpu1", "cpu_avg", "memory_total_kib", "memory_free_kib", "loadavg",
		"pif_eth0_rx", "pif_eth0_tx", "pif_eth0_rx_errors", "pif_aggr_rx", "disk_sda_read"} {
		if _, ok := got[n]; !ok {
			t.Errorf("host reading %s missing", n)
		}
	}
	if _, ok := got["pif_tap1_rx"]; ok {
		t.Error("a device that is not a PIF was reported")
	}
	if got["memory_total_kib"].I != 8<<20 || got["cpu_avg"].F != 2 {
		t.Errorf("memory_total_kib %v cpu_avg %v", got["memory_total_kib"], got["cpu_avg"])
	}
	v := stats.VM{UUID: vmUUID, VCPUTime: []time.Duration{time.Second}, Memory: 1 << 30, MemoryTarget: 1 << 30, MemoryInternalFree: stats.Unknown,
		Disks: []stats.Disk{{Device: "xvda", ReadBytes: 1, ReadOps: 1}}, NICs: []stats.NIC{{Device: "0", RxBytes: 5}}}
	got = map[string]rrd.Value{}
	for _, r := range VMReadings(v) {
		if r.Source.Owner != vmOwner {
			t.Fatalf("owner %v", r.Source.Owner)
		}
		got[r.Source.Name] = r.Value
	}
	for _, n := range []string{"cpu0", "memory", "memory_target", "vbd_xvda_read", "vbd_xvda_write", "vbd_xvda_iops_read", "vif_0_rx", "vif_0_tx"} {
		if _, ok := got[n]; !ok {
			t.Errorf("VM reading %s missing", n)
		}
	}
	if _, ok := got["memory_internal_free"]; ok {
		t.Error("an unknown memory_internal_free was reported")
	}
}

// Prune deletes the archives of owners the database no longer has.
func TestPrune(t *testing.T) {
	dir := t.TempDir()
	f := &fake{readings: []Reading{gauge(hostOwner, "mem", true, 1), gauge(vmOwner, "memory", true, 5), gauge(vm2Owner, "memory", true, 6)}}
	s, _ := newService(t, dir, Named{"fake", f})
	s.Tick(context.Background(), at(0))
	if err := s.ArchiveAll(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	gone := false
	s.cfg.Exists = func(o plugin.Owner) bool { return o.UUID == vmUUID || (o.UUID == vm2UUID && !gone) }
	f.readings = f.readings[:2]
	for i := 1; i <= missedLimit; i++ {
		s.Tick(context.Background(), at(i))
	}
	gone = true
	if err := s.Prune(); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{hostUUID + ".gz": true, vmUUID + ".gz": true, vm2UUID + ".gz": false, "notes.txt": true} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", name, err == nil, want)
		}
	}
}

// host.backup_rrds: one pending backup at a time, moved earlier, never
// later; it writes every RRD in memory.
func TestBackupAfter(t *testing.T) {
	dir := t.TempDir()
	f := &fake{readings: []Reading{gauge(hostOwner, "mem", true, 1), gauge(vmOwner, "memory", true, 5)}}
	s, _ := newService(t, dir, Named{"fake", f})
	s.Tick(context.Background(), at(0))
	s.BackupAfter(time.Hour)
	s.BackupAfter(2 * time.Hour) // later: ignored
	s.mu.Lock()
	due := time.Until(s.backupDue)
	s.mu.Unlock()
	if due > time.Hour || due < 59*time.Minute {
		t.Fatalf("backup due in %v", due)
	}
	s.BackupAfter(time.Duration(math.NaN()))
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, vmUUID+".gz")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no archive written by BackupAfter(now)")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A VM's RRD arriving (Put: a migration's) while the host's tick first
// sees the VM report is continued, never replaced by a fresh RRD of the
// tick's one reading.
func TestPutRacingTheFirstTick(t *testing.T) {
	src, _ := newService(t, t.TempDir(), Named{Name: "f", Sampler: &fake{readings: []Reading{gauge(vmOwner, "cpu", true, 1)}}})
	for i := range 5 {
		src.Tick(context.Background(), at(i))
	}
	sent := mustSnapshot(t, src, vmOwner)
	for round := range 50 {
		dst, _ := newService(t, t.TempDir(), Named{Name: "f", Sampler: &fake{readings: []Reading{gauge(vmOwner, "cpu", true, 2)}}})
		done := make(chan error, 1)
		go func() { done <- dst.Put(vmOwner, sent.Clone()) }()
		dst.Tick(context.Background(), at(10))
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		dst.Tick(context.Background(), at(11))
		got := mustSnapshot(t, dst, vmOwner)
		if got.LastUpdated() < float64(at(11).Unix()) {
			t.Fatalf("round %d: the RRD was not updated by the last tick", round)
		}
		var b bytes.Buffer
		if err := got.WriteXML(&b, true); err != nil {
			t.Fatal(err)
		}
		// The first archive's rows with a value: the sent RRD's and the
		// ones since; a fresh RRD would have the last two ticks' only.
		dump := b.String()
		dump = dump[:strings.Index(dump, "</database>")]
		if n := len(strings.Split(dump, "<row>")) - 1 - strings.Count(dump, "<row><v>NaN</v></row>"); n < 5 {
			t.Fatalf("round %d: %d rows with a value", round, n)
		}
	}
}
