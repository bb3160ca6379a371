package xenops

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/sim"
)

// statsVM makes a VM with two VCPUs, a raw disk at userdevice 0, an empty
// CD drive at 3 and a VIF at 0.
func (e *simEnv) statsVM(name string) string {
	e.t.Helper()
	rec := testdaemon.VMRecord(name)
	rec["VCPUs_max"], rec["VCPUs_at_startup"] = 2, 2
	vm := e.str("VM.create", rec)
	img := filepath.Join(e.t.TempDir(), name+".raw")
	if err := os.WriteFile(img, make([]byte, 4096), 0o600); err != nil {
		e.t.Fatal(err)
	}
	var vdi string
	if _, err := e.d.Update(func(tx *db.Tx) (err error) {
		r := &dm.VDIRecord{NameLabel: name, Location: img, VirtualSize: 4096, Type: dm.VDITypeUser, SR: "OpaqueRef:NULL",
			OtherConfig: map[string]string{}, XenstoreData: map[string]string{}, SMConfig: map[string]string{"type": "raw"}, Managed: true}
		vdi, err = tx.Insert(dm.VDI.Class, "", r.Row())
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	for _, d := range []struct{ vdi, dev, typ, mode string }{{vdi, "0", "Disk", "RW"}, {"OpaqueRef:NULL", "3", "CD", "RO"}} {
		e.call("VBD.create", map[string]any{"VM": vm, "VDI": d.vdi, "userdevice": d.dev, "bootable": d.dev == "0", "mode": d.mode,
			"type": d.typ, "unpluggable": true, "empty": d.vdi == "OpaqueRef:NULL", "other_config": map[string]string{},
			"qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	}
	e.call("VIF.create", map[string]any{"device": "0", "network": e.network(), "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
		"locking_mode": "network_default", "ipv4_allowed": []string{}, "ipv6_allowed": []string{}})
	return vm
}

func devices[T any](xs []T, name func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = name(x)
	}
	return out
}

func diskName(d stats.Disk) string { return d.Device }
func nicName(n stats.NIC) string   { return n.Device }

func TestStatsOnSimulator(t *testing.T) {
	e := newSimEnv(t)
	run, paused := e.statsVM("running"), e.statsVM("paused")
	e.call("VM.start", run, false, false)
	e.call("VM.start", paused, false, false)
	e.call("VM.pause", paused)
	runUUID := e.str("VM.get_uuid", run)
	e.statsVM("halted") // never started: not counted

	ctx := context.Background()
	a := e.m.Stats(ctx, time.Second)
	if len(a) != 1 || a[0].UUID != runUUID {
		t.Fatalf("Stats = %+v, want only %s", a, runUUID)
	}
	// Devices as the database names them: the disk and the CD under their
	// VBD's device, the NIC under its VIF's.
	if got := devices(a[0].Disks, diskName); !slices.Equal(got, []string{"hdd", "vda"}) {
		t.Errorf("disks %v, want [hdd vda]", got)
	}
	if got := devices(a[0].NICs, nicName); !slices.Equal(got, []string{"0"}) {
		t.Errorf("NICs %v", got)
	}
	if len(a[0].VCPUTime) != 2 || a[0].Memory != 128<<20 || a[0].MemoryTarget != 128<<20 {
		t.Errorf("VCPUs %v, memory %d target %d", a[0].VCPUTime, a[0].Memory, a[0].MemoryTarget)
	}
	// What the database records is what counts: a VBD whose device reads
	// xvda is reported as xvda.
	snap := e.d.Snapshot()
	vm, _ := snap.Get(dm.VM.Class, run)
	for _, vbd := range strs(snap.Value(vm, dm.VM.VBDs)) {
		if r, _ := snap.Get(dm.VBD.Class, vbd); r.String(dm.VBD.Userdevice) == "0" {
			if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VBD.Device, vbd, "xvda") }); err != nil {
				t.Fatal(err)
			}
		}
	}

	time.Sleep(50 * time.Millisecond)
	b := e.m.Stats(ctx, time.Second)
	if len(b) != 1 {
		t.Fatalf("second Stats = %+v", b)
	}
	if got := devices(b[0].Disks, diskName); !slices.Equal(got, []string{"hdd", "xvda"}) {
		t.Errorf("disks %v after VBD.device changed, want [hdd xvda]", got)
	}
	for i := range a[0].VCPUTime {
		if b[0].VCPUTime[i] <= a[0].VCPUTime[i] {
			t.Errorf("VCPU %d time %v then %v", i, a[0].VCPUTime[i], b[0].VCPUTime[i])
		}
	}
	for i := range a[0].Disks {
		x, y := a[0].Disks[i], b[0].Disks[i]
		if y.ReadBytes < x.ReadBytes || y.WriteBytes < x.WriteBytes || y.ReadOps < x.ReadOps || y.WriteOps < x.WriteOps ||
			y.ReadTime < x.ReadTime || y.WriteTime < x.WriteTime {
			t.Errorf("disk %d went down: %+v then %+v", i, x, y)
		}
	}
	if x, y := a[0].NICs[0], b[0].NICs[0]; y.RxBytes < x.RxBytes || y.TxBytes < x.TxBytes {
		t.Errorf("NIC went down: %+v then %+v", x, y)
	}

	// Unpaused, the other VM is counted too, in uuid order.
	e.call("VM.unpause", paused)
	c := e.m.Stats(ctx, time.Second)
	want := []string{runUUID, e.str("VM.get_uuid", paused)}
	sort.Strings(want)
	if got := devices(c, func(v stats.VM) string { return v.UUID }); !slices.Equal(got, want) {
		t.Errorf("after unpause: %v, want %v", got, want)
	}
}

// slowStats wraps the simulator: reading the VMs in slow blocks until the
// read's deadline, and every read records how many run at once.
type slowStats struct {
	*sim.Simulator
	slow map[string]bool
	hold time.Duration

	mu       sync.Mutex
	now, top int
}

func (s *slowStats) Stats(ctx context.Context, uuid string) (stats.VM, error) {
	s.mu.Lock()
	s.now++
	s.top = max(s.top, s.now)
	s.mu.Unlock()
	defer func() { s.mu.Lock(); s.now--; s.mu.Unlock() }()
	if s.slow[uuid] {
		<-ctx.Done()
		return stats.VM{}, ctx.Err()
	}
	time.Sleep(s.hold)
	return s.Simulator.Stats(ctx, uuid)
}

// A VM whose read does not finish in time is left out, the others are
// not held up by it, and no more than statsParallel reads run at once.
func TestStatsTimeoutAndConcurrency(t *testing.T) {
	e := newSimEnv(t)
	var uuids []string
	for i := 0; i < 40; i++ {
		vm := e.str("VM.create", testdaemon.VMRecord(fmt.Sprintf("vm%d", i)))
		e.call("VM.start", vm, false, false)
		uuids = append(uuids, e.str("VM.get_uuid", vm))
	}
	sort.Strings(uuids)
	wrap := &slowStats{Simulator: e.sim, slow: map[string]bool{uuids[7]: true}, hold: 10 * time.Millisecond}
	m := &Manager{be: wrap, db: e.d, host: e.host, log: e.m.log}
	t0 := time.Now()
	got := m.Stats(context.Background(), 300*time.Millisecond)
	took := time.Since(t0)
	want := slices.Delete(slices.Clone(uuids), 7, 8)
	if ids := devices(got, func(v stats.VM) string { return v.UUID }); !slices.Equal(ids, want) {
		t.Errorf("Stats gave %d VMs %v, want the %d but the slow one", len(ids), ids, len(want))
	}
	if wrap.top > statsParallel || wrap.top < 2 {
		t.Errorf("%d reads at once, want 2..%d", wrap.top, statsParallel)
	}
	// 40 reads of 10 ms, 16 at a time, beside one of 300 ms: about
	// 310 ms on a quiet machine. Without the timeout the slow read would
	// never end.
	if took > 5*time.Second {
		t.Errorf("Stats took %v", took)
	}
	t.Logf("40 VMs, one timing out at 300 ms: %v, %d reads at most at once", took.Round(time.Millisecond), wrap.top)

	// A cancelled tick returns at once with what it has.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := m.Stats(ctx, time.Second); len(got) != 0 {
		t.Errorf("a cancelled tick read %d VMs", len(got))
	}
}

// A backend that cannot read counters gives none.
func TestStatsWithoutReporter(t *testing.T) {
	e := newSimEnv(t)
	m := &Manager{be: struct{ backend.Backend }{e.sim}, db: e.d, host: e.host, log: e.m.log}
	if got := m.Stats(context.Background(), time.Second); got != nil {
		t.Errorf("Stats = %v, want nil", got)
	}
}

func TestRenameDevices(t *testing.T) {
	v := stats.VM{UUID: "x", Disks: []stats.Disk{{Device: "1"}, {Device: "0"}, {Device: "9"}, {Device: "27"}},
		NICs: []stats.NIC{{Device: "10"}, {Device: "2"}}}
	got := renameDevices(v, "ABC", map[string]string{"0": "xvda", "1": "xvdb", "27": "xvdab"}, map[string]string{"2": "2", "10": "10"})
	if got.UUID != "abc" {
		t.Errorf("UUID %q", got.UUID)
	}
	if d := devices(got.Disks, diskName); !slices.Equal(d, []string{"xvda", "xvdb", "xvdab"}) {
		t.Errorf("disks %v", d)
	}
	if n := devices(got.NICs, nicName); !slices.Equal(n, []string{"2", "10"}) {
		t.Errorf("NICs %v", n)
	}
}
