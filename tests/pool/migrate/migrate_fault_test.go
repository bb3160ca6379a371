package migrate

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/testkit/faultproxy"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// Faults during VM.pool_migrate (issue 18): the destination's daemon
// dying after the commit point, the network between the hosts cut while
// the memory goes and while the move is committed, and the progress of
// a migration forwarded from the coordinator to the VM's host.
//
// The destination's crash is made exact with the daemon's test fault
// points (internal/xenops, migrate_recover.go): TOOLSTACKD_TEST_FAULTS
// names a directory, and a file named after a point there makes the
// daemon kill itself (SIGKILL) when it gets there, once.

// withFaults is o with a directory for the fault points, which it
// returns.
func withFaults(t *testing.T, o pooltest.Options) (pooltest.Options, string) {
	dir := t.TempDir()
	o.Daemon.Env = append(o.Daemon.Env, "TOOLSTACKD_TEST_FAULTS="+dir)
	return o, dir
}

// armFault makes the next daemon that reaches point crash there.
func armFault(t *testing.T, dir, point string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, point), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The destination's daemon dies right after it was told go (the move is
// recorded: resident_on names it) and before it adopted the domain, on
// the simulator, whose domains do not outlive the daemon before they are
// complete: the restarted destination cannot adopt the guest, so the
// database is made true (the VM Halted, resident nowhere), and neither
// host keeps a domain.
func TestPoolMigrateDestinationDiesAfterCommitSimulator(t *testing.T) {
	ctx := suite.Ctx(t)
	o, faults := withFaults(t, pooltest.Options{})
	p, r, hosts, sr := migratePool(t, ctx, o)
	vm := suite.SharedVM(r, sr, "orphan", nil)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	armFault(t, faults, "migrate-in-after-go")
	task := r.Str("Async.VM.pool_migrate", vm, hosts[1], map[string]string{})
	select {
	case <-p.Hosts[1].Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the destination did not crash at the fault point")
	}
	// The source recorded the move: its call succeeds, and it drops its
	// stopped domain.
	if st, info := suite.WaitTask(t, r, task); st != "success" {
		t.Fatalf("the migration: %s %v", st, info)
	}
	if s := suite.VMWhere(r, vm); s.On != hosts[1] || s.Power != "Running" {
		t.Fatalf("after the commit: %+v", s)
	}
	if suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatal("the source kept its domain")
	}
	p.Restart(1)
	if err := p.WaitLive(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var last suite.VMState
	suite.WaitUntil(t, 30*time.Second, "the VM halted", func() bool {
		last = suite.VMWhere(r, vm)
		return last.Power == "Halted"
	})
	if last.On != "OpaqueRef:NULL" || suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) || suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatalf("a halted VM: %+v, domains on host 0 %v, host 1 %v", last,
			suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid), suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid))
	}
	// It says so, whether its database had the commit when it started or
	// got it from the pool after.
	if l := p.Hosts[1].Log(); !strings.Contains(l, "did not keep the guest's state across the restart") &&
		!strings.Contains(l, "a migration that committed before a restart") {
		t.Error("the restarted destination did not say why the VM is halted")
	}
	// It starts again, and moves.
	r.Call("VM.start_on", vm, hosts[1], false, false)
	r.Call("VM.pool_migrate", vm, hosts[0], map[string]string{})
	if s := suite.VMWhere(r, vm); s.On != hosts[0] || s.Power != "Running" {
		t.Fatalf("the next move: %+v", s)
	}
}

// The same crash on real QEMU (TCG): the QEMU process outlives the
// daemon, paused with the guest's state, and the restarted destination
// adopts it: the guest (a counter printing "TICK n" on its serial port)
// goes on counting from where it stopped on the source. The serial ports
// of both hosts' QEMUs are read throughout: no tick number is printed by
// both, and every tick of the destination comes after the source's last
// one, so at no point did the two run the guest at once (and there are
// never more than the two QEMU processes, one at the end).
//
// The crash comes right after go on a member (whose database at its
// restart does not show the commit yet: it waits for its replica to
// catch up), or on the coordinator once it applied the commit (its
// database has it at start-up: it takes the VM over at once).
func TestPoolMigrateDestinationDiesAfterCommitQEMU(t *testing.T) {
	g := suite.TickGuest(t)
	t.Run("member", func(t *testing.T) { destinationDiesQEMU(t, g, "migrate-in-after-go", 0, 1) })
	t.Run("coordinator", func(t *testing.T) { destinationDiesQEMU(t, g, "migrate-in-committed", 1, 0) })
}

func destinationDiesQEMU(t *testing.T, g suite.TickGuestFiles, point string, from, to int) {
	ctx := suite.Ctx(t)
	o, faults := withFaults(t, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg", "TOOLSTACKD_GUEST_KERNEL_DIRS=" + g.Dir}}})
	p, r, hosts, sr := migratePool(t, ctx, o)
	vm := suite.SharedVM(r, sr, "ticker", nil)
	uuid := r.Str("VM.get_uuid", vm)
	g.SetOn(r, vm)
	t.Cleanup(func() { suite.KillQEMUs(uuid) })
	r.Call("VM.start_on", vm, hosts[from], false, false)
	ticks := &suite.TickLog{}
	t.Cleanup(ticks.Close)
	src, err := ticks.Follow(p.Hosts[from].DataDir, uuid, from)
	if err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, from, 3, 2*time.Minute)
	// The QEMU processes of the guest, counted throughout.
	most, stopCount := countQEMUs(uuid)
	defer stopCount()
	armFault(t, faults, point)
	task := r.Str("Async.VM.pool_migrate", vm, hosts[to], map[string]string{})
	// The destination's serial port, from the moment its QEMU exists.
	dst := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(suite.QEMUJournal(p.Hosts[to].DataDir, uuid)); err == nil {
				_, err := ticks.Follow(p.Hosts[to].DataDir, uuid, to)
				dst <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		dst <- errors.New("the destination made no domain")
	}()
	select {
	case <-p.Hosts[to].Exited():
	case <-time.After(time.Minute):
		t.Fatal("the destination did not crash at the fault point")
	}
	if err := <-dst; err != nil {
		t.Fatal(err)
	}
	if to != 0 {
		// The task is on the coordinator, which lives on: the source
		// recorded the move, so the call succeeds.
		if st, info := suite.WaitTask(t, r, task); st != "success" {
			t.Fatalf("the migration: %s %v", st, info)
		}
		if s := suite.VMWhere(r, vm); s.On != hosts[to] || s.Power != "Running" {
			t.Fatalf("after the commit: %+v", s)
		}
	}
	// The source's QEMU is gone; the destination's outlived its daemon,
	// paused.
	suite.WaitUntil(t, 30*time.Second, "the source's QEMU to go", func() bool { return len(suite.QEMUOf(uuid)) == 1 })
	<-src
	if st := qmpStatus(t, p.Hosts[to].DataDir, uuid); st != "paused" {
		t.Fatalf("the destination's QEMU while its daemon is down: %q", st)
	}
	if n := ticks.Count(to); n != 0 {
		t.Fatalf("the destination's guest ran before its daemon adopted it: %d ticks", n)
	}
	p.Restart(to)
	if err := p.WaitLive(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if to == 0 {
		// The coordinator's sessions died with it.
		s, err := p.Login(ctx, r.C, 0)
		if err != nil {
			t.Fatal(err)
		}
		r.S = s
	}
	// The reader connected to the destination's serial port since its
	// QEMU started still reads it.
	ticks.Wait(t, to, 5, time.Minute)
	if s := suite.VMWhere(r, vm); s.On != hosts[to] || s.Power != "Running" {
		t.Fatalf("after the restart: %+v", s)
	}
	if pids := suite.QEMUOf(uuid); len(pids) != 1 {
		t.Fatalf("QEMU processes of the VM: %v", pids)
	}
	if n := most(); n > 2 {
		t.Fatalf("%d QEMU processes of the VM at once", n)
	}
	ticks.Check(t)
	if l := p.Hosts[to].Log(); !strings.Contains(l, "took over a VM whose migration here committed") {
		t.Error("the restarted destination did not say it took the VM over")
	} else if strings.Contains(l, "waiting for the database to say whether it committed") {
		t.Log("the restarted destination took the VM over once its replica caught up")
	} else {
		t.Log("the restarted destination took the VM over at start-up")
	}
	// The adopted VM is managed as any other: it moves back (once the
	// marks a dead coordinator left are cleared).
	suite.WaitUntil(t, 30*time.Second, "the VM unmarked", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
	r.Call("VM.pool_migrate", vm, hosts[from], map[string]string{})
	if s := suite.VMWhere(r, vm); s.On != hosts[from] || s.Power != "Running" {
		t.Fatalf("the move back: %+v", s)
	}
}

// The network between the hosts held (a blackhole: nothing passes,
// nothing is reset) while the memory goes: the destination gives up once
// the stream has stalled and removes its incoming domain, while the
// source waits for it; once the link heals, the source hears of the
// failure and the VM runs on, on the source, as the database says.
func TestPoolMigrateBlackholeMemory(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{Proxy: true})
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	task := startMigration(t, p, r, vm, hosts, 1)
	if err := p.Link.Partition([]string{pooltest.Name(0)}, []string{pooltest.Name(1)}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	suite.WaitUntil(t, 45*time.Second, "the destination to drop the incoming migration", func() bool {
		return strings.Contains(p.Hosts[1].Log(), `msg="incoming migration not taken" component=xenops vm=`+uuid)
	})
	t.Logf("the destination gave up %v after the cut", time.Since(cut).Round(time.Millisecond))
	// Meanwhile the database still has the VM on the source.
	if s := suite.VMWhere(r, vm); s.On != hosts[0] || s.Power != "Running" {
		t.Fatalf("during the cut: %+v", s)
	}
	p.Link.HealAll()
	if st, info := suite.WaitTask(t, r, task); st != "failure" {
		t.Fatalf("a migration whose stream stalled: %s %v", st, info)
	}
	suite.WaitUntil(t, 30*time.Second, "the VM unmarked", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
	if s := suite.VMWhere(r, vm); s.On != hosts[0] || s.Power != "Running" {
		t.Fatalf("after the failed move: %+v", s)
	}
	if !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) || suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) {
		t.Fatal("the VM's domain should be on the source only")
	}
	// The guest runs: a pause and unpause go through; then it moves.
	r.Call("VM.pause", vm)
	r.Call("VM.unpause", vm)
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.Call("VM.pool_migrate", vm, hosts[1], map[string]string{})
	if s := suite.VMWhere(r, vm); s.On != hosts[1] || s.Power != "Running" {
		t.Fatalf("the next move: %+v", s)
	}
}

// The link between source and destination held while the move is
// committed: the destination has said received, the source records the
// move (through the coordinator, a third host, whose links are whole)
// and its go is held. The destination sees the commit in its replica and
// runs the VM without waiting for go; the source's call succeeds (once
// the link heals here, else when its wait for the destination's
// confirmation ends) and it removes its stopped domain.
func TestPoolMigrateBlackholeCommit(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts := suite.Joined(t, ctx, pooltest.Options{Hosts: 3, Proxy: true, Daemon: testdaemon.Options{LogLevel: "debug"}})
	sr := sharedSR3(t, r, hosts)
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[1], false, false)
	// The source's writes reach the coordinator a second late: the commit
	// takes that long, long enough to cut the stream after received.
	if err := p.Link.SetLink(pooltest.Name(1), pooltest.Name(0), faultproxy.Delay(time.Second, 0)); err != nil {
		t.Fatal(err)
	}
	task := startMigration(t, p, r, vm, hosts, 2)
	suite.WaitUntil(t, 30*time.Second, "the destination to have the guest's state", func() bool {
		return strings.Contains(p.Hosts[2].Log(), `msg="migration received" component=xenops vm=`+uuid)
	})
	time.Sleep(50 * time.Millisecond) // received is on its way: loopback takes far less
	if err := p.Link.Partition([]string{pooltest.Name(1)}, []string{pooltest.Name(2)}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	suite.WaitUntil(t, 30*time.Second, "the VM running on the destination", func() bool {
		s := suite.VMWhere(r, vm)
		return s.On == hosts[2] && s.Power == "Running" && strings.Contains(p.Hosts[2].Log(), "lost the source of a migration after its commit")
	})
	t.Logf("the destination ran the VM %v after the cut", time.Since(cut).Round(time.Millisecond))
	// The source still waits for the destination's confirmation (at most
	// 30 s); the link healed, it learns that the stream is gone.
	p.Link.HealAll()
	if st, info := suite.WaitTask(t, r, task); st != "success" {
		t.Fatalf("a recorded migration: %s %v", st, info)
	}
	suite.WaitUntil(t, 30*time.Second, "the source to drop its domain", func() bool { return !suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) })
	if !suite.SimDomainIn(t, p.Hosts[2].DataDir, uuid) {
		t.Fatal("no domain on the destination")
	}
	if s := suite.VMWhere(r, vm); s.On != hosts[2] || s.Power != "Running" {
		t.Fatalf("after the move: %+v", s)
	}
	r.Call("VM.pause", vm)
	r.Call("VM.unpause", vm)
}

// sharedSR3 is sharedSR for a pool of three: the SR plugged everywhere.
func sharedSR3(t *testing.T, r suite.RPC, hosts map[int]string) string {
	t.Helper()
	sr := sharedSR(t, r, hosts)
	var pbds []string
	if err := json.Unmarshal(r.Call("SR.get_PBDs", sr), &pbds); err != nil {
		t.Fatal(err)
	}
	for _, pbd := range pbds {
		if r.Str("PBD.get_host", pbd) == hosts[2] && string(r.Call("PBD.get_currently_attached", pbd)) != "true" {
			r.Call("PBD.plug", pbd)
		}
	}
	return sr
}

// Async.VM.pool_migrate made on the coordinator for a VM on a member runs
// on the member; the coordinator's task shows its progress as it goes
// (values strictly between 0 and 1 before the end), and task.cancel on
// the coordinator still stops the member's work. host.evacuate of the
// member shows its one move's progress the same way.
func TestPoolMigrateForwardedProgress(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[1], false, false)

	// seen polls the task's progress until it ends and returns the
	// distinct values seen.
	seen := func(task string, stopAt float64) []float64 {
		t.Helper()
		var vals []float64
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			var prog float64
			_ = json.Unmarshal(r.Call("task.get_progress", task), &prog)
			if len(vals) == 0 || vals[len(vals)-1] != prog {
				vals = append(vals, prog)
			}
			if st := r.Str("task.get_status", task); st != "pending" || (stopAt > 0 && prog >= stopAt) {
				return vals
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("the task did not end; progress seen %v", vals)
		return nil
	}
	between := func(vals []float64) int {
		n := 0
		for _, v := range vals {
			if v > 0 && v < 1 {
				n++
			}
		}
		return n
	}
	monotonic := func(what string, vals []float64) {
		t.Helper()
		if !sort.Float64sAreSorted(vals) {
			t.Errorf("%s: progress went back: %v", what, vals)
		}
	}

	// A forwarded migration, cancelled once it is a third done.
	task := r.Str("Async.VM.pool_migrate", vm, hosts[0], map[string]string{})
	vals := seen(task, 0.3)
	if between(vals) == 0 {
		t.Fatalf("the coordinator's task showed no progress before the cancel: %v", vals)
	}
	monotonic("the cancelled migration", vals)
	r.Call("task.cancel", task)
	if st, info := suite.WaitTask(t, r, task); st != "cancelled" {
		t.Fatalf("a cancelled forwarded migration: %s %v", st, info)
	}
	suite.WaitUntil(t, 30*time.Second, "the member to undo the move", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
	if s := suite.VMWhere(r, vm); s.On != hosts[1] || s.Power != "Running" {
		t.Fatalf("after the cancel: %+v", s)
	}
	suite.WaitUntil(t, 30*time.Second, "the destination to drop the incoming domain", func() bool {
		return !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid)
	})

	// The same migration to its end.
	task = r.Str("Async.VM.pool_migrate", vm, hosts[0], map[string]string{})
	vals = seen(task, 0)
	if st, info := suite.WaitTask(t, r, task); st != "success" {
		t.Fatalf("the forwarded migration: %s %v", st, info)
	}
	if n := between(vals); n < 2 {
		t.Fatalf("the coordinator's task showed %d progress values between 0 and 1: %v", n, vals)
	}
	monotonic("the forwarded migration", vals)
	t.Logf("progress seen on the coordinator: %v", vals)

	// host.evacuate of host 0 (the coordinator) runs there; its move of
	// the VM runs there too. Back to the member first, then evacuate the
	// member: the evacuation runs on the coordinator, its move is
	// forwarded to the member.
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.Call("VM.pool_migrate", vm, hosts[1], map[string]string{})
	r.Call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	task = r.Str("Async.host.evacuate", hosts[1], "OpaqueRef:NULL", 0)
	vals = seen(task, 0)
	if st, info := suite.WaitTask(t, r, task); st != "success" {
		t.Fatalf("host.evacuate: %s %v", st, info)
	}
	if between(vals) == 0 {
		t.Fatalf("host.evacuate showed no progress before the end: %v", vals)
	}
	monotonic("host.evacuate", vals)
	if s := suite.VMWhere(r, vm); s.On != hosts[0] || s.Power != "Running" {
		t.Fatalf("after the evacuation: %+v", s)
	}
}

// --- The ticking guest -------------------------------------------------

// qmpStatus asks a QEMU its run state over its monitor (free only while
// its daemon is down).
func qmpStatus(t *testing.T, dataDir, uuid string) string {
	t.Helper()
	_, path, err := suite.ReadSockets(dataDir, uuid)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatalf("QMP: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	dec := json.NewDecoder(conn)
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		t.Fatalf("QMP greeting: %v", err)
	}
	exec := func(cmd string) map[string]any {
		if _, err := io.WriteString(conn, `{"execute":"`+cmd+`"}`); err != nil {
			t.Fatalf("QMP %s: %v", cmd, err)
		}
		for {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				t.Fatalf("QMP %s: %v", cmd, err)
			}
			if _, ev := m["event"]; !ev {
				return m
			}
		}
	}
	exec("qmp_capabilities")
	ret, _ := exec("query-status")["return"].(map[string]any)
	st, _ := ret["status"].(string)
	return st
}

// countQEMUs samples, every 50 ms until stop, how many QEMU processes
// the VM has; most is the largest count seen.
func countQEMUs(uuid string) (most func() int, stop func()) {
	var mu sync.Mutex
	top := 0
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			n := len(suite.QEMUOf(uuid))
			mu.Lock()
			top = max(top, n)
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var once sync.Once
	return func() int {
			mu.Lock()
			defer mu.Unlock()
			return top
		}, func() {
			once.Do(func() { close(done) })
			<-ended
		}
}
