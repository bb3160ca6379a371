package xenops_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
)

// TestQEMUStats reads a running guest's counters through the manager
// (xenops.Manager.Stats, in process) before and after the guest reads its
// whole disk and keeps its VCPU busy: the disk's read counters grow by at
// least the disk, the VCPU time by at least a second.
func TestQEMUStats(t *testing.T) {
	g := testGuest(t)
	t.Logf("guest accelerator: %s", g.accel)
	r := newResolver()
	e := qemuEnv(t, g, r)
	vm := e.guestVM(g, "qemu-stats", nil)
	uuid := e.uuidOf(vm)
	const size = 8 << 20
	img := filepath.Join(e.dir, "stats.raw")
	if err := os.WriteFile(img, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	vdi := e.addVDI("stats", img, size)
	r.add(vdi, img)
	vbd := e.addVBD(vm, vdi, "0", "Disk", "RW")
	e.addVIF(vm, "0")
	e.call("VM.start", vm, false, false)
	con := e.console(vm, "vt100")
	defer con.Close()
	ready := con.waitFor(t, "GUEST-READY", 3*time.Minute)
	// The guest's name for its disk, from its /sys/block.
	var gdev string
	if _, list, ok := strings.Cut(ready, "disks:"); ok {
		for _, d := range strings.Fields(list) {
			if strings.HasPrefix(d, "vd") || strings.HasPrefix(d, "sd") || strings.HasPrefix(d, "hd") {
				gdev = d
				break
			}
		}
	}
	if gdev == "" {
		t.Fatalf("the guest lists no disk: %q", ready)
	}
	name := e.field("VBD", vbd, "device").(string)

	ctx := context.Background()
	read := func() stats.VM {
		t.Helper()
		for _, v := range e.m.Stats(ctx, 5*time.Second) {
			if v.UUID == uuid {
				return v
			}
		}
		t.Fatalf("Stats has no entry for the running VM %s", uuid)
		return stats.VM{}
	}
	disk := func(v stats.VM) stats.Disk {
		t.Helper()
		for _, d := range v.Disks {
			if d.Device == name {
				return d
			}
		}
		t.Fatalf("no disk %q in %+v", name, v.Disks)
		return stats.Disk{}
	}
	cpu := func(v stats.VM) (sum time.Duration) {
		for _, c := range v.VCPUTime {
			sum += c
		}
		return sum
	}

	before := read()
	if len(before.VCPUTime) != 1 || before.Memory <= 0 || before.MemoryTarget <= 0 || before.MemoryInternalFree != stats.Unknown {
		t.Errorf("before: VCPUs %v, memory %d, target %d, free %d", before.VCPUTime, before.Memory, before.MemoryTarget, before.MemoryInternalFree)
	}
	if got := disk(before); got.ReadBytes == 0 {
		t.Logf("disk %s read nothing while booting: %+v", name, got)
	}
	if !slices.ContainsFunc(before.NICs, func(n stats.NIC) bool { return n.Device == "0" }) {
		t.Errorf("no NIC 0 in %+v", before.NICs)
	}

	// The whole disk, past the guest's page cache; then four seconds of a
	// busy shell.
	fmt.Fprintf(con, "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/%s of=/dev/null bs=64k; echo DD-DONE-$?\n", gdev)
	con.waitFor(t, "DD-DONE-0", 2*time.Minute)
	fmt.Fprintf(con, "end=$(($(date +%%s)+4)); while [ $(date +%%s) -lt $end ]; do :; done; echo BUSY-DONE-$?\n")
	con.waitFor(t, "BUSY-DONE-0", 2*time.Minute)

	after := read()
	b, a := disk(before), disk(after)
	t.Logf("disk %s (guest %s): read %d bytes in %d requests (%v), CPU %v -> %v, memory %d",
		name, gdev, a.ReadBytes-b.ReadBytes, a.ReadOps-b.ReadOps, a.ReadTime-b.ReadTime, cpu(before), cpu(after), after.Memory)
	if a.ReadBytes < b.ReadBytes+size {
		t.Errorf("read bytes grew by %d, want at least the disk's %d", a.ReadBytes-b.ReadBytes, size)
	}
	if a.ReadOps <= b.ReadOps {
		t.Errorf("read requests %d then %d", b.ReadOps, a.ReadOps)
	}
	if a.WriteBytes < b.WriteBytes || a.WriteOps < b.WriteOps || a.ReadTime < b.ReadTime {
		t.Errorf("a counter went down: %+v then %+v", b, a)
	}
	// About 4 s on a quiet machine; a busy one gives the VCPU's thread
	// less of a core while the guest spins for its 4 s.
	if grew := cpu(after) - cpu(before); grew < 400*time.Millisecond {
		t.Errorf("VCPU time grew by %v, want at least 400 ms", grew)
	}
	if after.Memory <= 0 {
		t.Errorf("memory %d", after.Memory)
	}

	// How long one read takes: the backend's own, and the manager's tick.
	sr := e.m.Backend().(backend.StatsReporter)
	var lat []time.Duration
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		if _, err := sr.Stats(ctx, uuid); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	t0 := time.Now()
	read()
	t.Logf("QEMU Stats for one VM: min %v, median %v, max %v; Manager.Stats %v",
		lat[0], lat[len(lat)/2], lat[len(lat)-1], time.Since(t0))

	e.call("VM.hard_shutdown", vm)
	if got := e.m.Stats(ctx, 5*time.Second); len(got) != 0 {
		t.Errorf("Stats after shutdown: %+v", got)
	}
	if _, err := sr.Stats(ctx, uuid); err == nil {
		t.Error("the backend read counters of a domain that is gone")
	}
	noLeftovers(t, e, vm)
}
