// Package migrate tests moving running VMs between the hosts of one pool:
// live migration on the simulator and on QEMU, cancelled, refused, with
// the destination killed or blackholed at each phase, forwarded progress,
// placement by free memory, and the HTTP handlers (disk transfer, the
// console) reached through the coordinator for a VM on a member.
package migrate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
	"toolstackd/tests/pool/suite"
)

// VM.pool_migrate between the hosts of a pool (issue 18): simulated
// hosts, the VMs' disks on a sharedfs SR both hosts have plugged.

// migratePool starts a pool of two simulated hosts (o may add flags),
// with a sharedfs SR plugged on both: calls through host 0, the hosts'
// refs by index, and the SR.
func migratePool(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, suite.RPC, map[int]string, string) {
	t.Helper()
	o.Hosts = 2
	p, r, hosts := suite.Joined(t, ctx, o)
	return p, r, hosts, sharedSR(t, r, hosts)
}

// sharedSR makes a sharedfs SR plugged on hosts 0 and 1.
func sharedSR(t *testing.T, r suite.RPC, hosts map[int]string) string {
	t.Helper()
	sr := r.Str("SR.create", hosts[0], map[string]string{"location": t.TempDir()}, 0, "shared", "", "sharedfs", "user", true,
		map[string]string{})
	var pbds []string
	if err := json.Unmarshal(r.Call("SR.get_PBDs", sr), &pbds); err != nil {
		t.Fatal(err)
	}
	for _, pbd := range pbds {
		if r.Str("PBD.get_host", pbd) == hosts[1] {
			r.Call("PBD.plug", pbd)
		}
	}
	return sr
}

// vmRRD is GET /vm_rrd for the VM on the host at addr: the status and
// body.
func vmRRD(t *testing.T, addr, session, uuid string) (int, string) {
	t.Helper()
	q := url.Values{"session_id": {session}, "uuid": {uuid}}
	resp, err := http.Get("http://" + addr + "/vm_rrd?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// rrdReadings counts the rows of an RRD dump's first archive that hold
// a known value.
func rrdReadings(dump string) int {
	i := strings.Index(dump, "<database>")
	j := strings.Index(dump, "</database>")
	if i < 0 || j < i {
		return 0
	}
	n := 0
	for _, row := range strings.Split(dump[i:j], "<row>")[1:] {
		for _, v := range strings.Split(row, "<v>")[1:] {
			if !strings.HasPrefix(v, "NaN") {
				n++
				break
			}
		}
	}
	return n
}

var migratedLog = regexp.MustCompile(`msg="VM migrated" component=xenops vm=(\S+) dest=\S+ total=(\S+) send=(\S+) prepare=(\S+)`)

// migrationTimes reads the durations the host logged for its migrations
// of the VM: total (the orchestration), send (the backend's SendLive)
// and prepare (the destination building the incoming domain).
func migrationTimes(d *testdaemon.Daemon, uuid string) (total, send, prep []time.Duration) {
	for _, m := range migratedLog.FindAllStringSubmatch(d.Log(), -1) {
		if m[1] != uuid {
			continue
		}
		a, err1 := time.ParseDuration(m[2])
		b, err2 := time.ParseDuration(m[3])
		c, err3 := time.ParseDuration(m[4])
		if err1 == nil && err2 == nil && err3 == nil {
			total, send, prep = append(total, a), append(send, b), append(prep, c)
		}
	}
	return total, send, prep
}

// A running VM on the shared SR moves to the other host and back: the
// record follows it (resident_on, domid, Running, VM_metrics, its disk
// and consoles), the backend's domain exists on exactly one host, and its
// RRD goes with it.
func TestPoolMigrateSimulator(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := suite.SharedVM(r, sr, "mover", nil)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	// The VM's RRD on its host, with two readings at least (a host makes
	// a new RRD with one reading at its first tick).
	suite.WaitUntil(t, 40*time.Second, "two readings in the VM's RRD", func() bool {
		st, body := vmRRD(t, p.Addr(0), r.S, uuid)
		return st == http.StatusOK && rrdReadings(body) >= 2
	})
	check := func(at, away int) {
		t.Helper()
		s := suite.VMWhere(r, vm)
		if s.Power != "Running" || s.On != hosts[at] || s.Domid < 0 || len(s.Ops) != 0 {
			t.Fatalf("after the move to host %d: %+v", at, s)
		}
		if !suite.SimDomainIn(t, p.Hosts[at].DataDir, uuid) {
			t.Fatalf("no domain on host %d", at)
		}
		// The source removes its stopped domain as it finishes.
		if suite.SimDomainIn(t, p.Hosts[away].DataDir, uuid) {
			t.Fatalf("a domain left on host %d", away)
		}
		var vbds []string
		_ = json.Unmarshal(r.Call("VM.get_VBDs", vm), &vbds)
		for _, vbd := range vbds {
			if string(r.Call("VBD.get_currently_attached", vbd)) != "true" {
				t.Fatalf("VBD %s not attached after the move", vbd)
			}
		}
		var consoles []string
		_ = json.Unmarshal(r.Call("VM.get_consoles", vm), &consoles)
		if len(consoles) == 0 {
			t.Fatal("no consoles after the move")
		}
		for _, c := range consoles {
			if loc := r.Str("console.get_location", c); !strings.Contains(loc, pooltest.HostIP(at).String()) {
				t.Fatalf("a console at %s after the move to host %d", loc, at)
			}
		}
		metrics := r.Str("VM.get_metrics", vm)
		var state []string
		_ = json.Unmarshal(r.Call("VM_metrics.get_state", metrics), &state)
		if !slices.Equal(state, []string{"running"}) {
			t.Fatalf("VM_metrics.state %v", state)
		}
		// The RRD came along: the destination's has the readings taken
		// on the source (its own would have one at most by now).
		if st, body := vmRRD(t, p.Addr(at), r.S, uuid); st != http.StatusOK || rrdReadings(body) < 2 {
			t.Fatalf("the VM's RRD on host %d: %d, %d readings", at, st, rrdReadings(body))
		}
	}
	var wall []time.Duration
	for _, to := range []int{1, 0, 1, 0} {
		t0 := time.Now()
		r.Call("VM.pool_migrate", vm, hosts[to], map[string]string{"live": "true"})
		wall = append(wall, time.Since(t0))
		check(to, 1-to)
	}
	// For docs/performance.md: the call's wall time against the
	// backend's own send time, as the source logged it.
	// Each move left xapi's message about it, on the source (messages
	// are each host's own: a member's stay on it).
	n := 0
	for i := range 2 {
		ls, err := p.LocalLogin(ctx, r.C, i)
		if err != nil {
			t.Fatal(err)
		}
		var msgs map[string]map[string]any
		raw, err := r.C.Call(ctx, p.Addr(i), "message.get_all_records", ls)
		if err != nil || json.Unmarshal(raw, &msgs) != nil {
			t.Fatalf("message.get_all_records on host %d: %v", i, err)
		}
		for _, m := range msgs {
			if m["name"] == "VM_MIGRATED" && m["obj_uuid"] == uuid && m["cls"] == "VM" {
				n++
			}
		}
	}
	if n != 4 {
		t.Errorf("%d VM_MIGRATED messages for 4 moves", n)
	}
	logMigrationFigures(t, "simulator", p, uuid, wall)
}

// What VM.pool_migrate and VM.assert_can_migrate refuse, with xapi's codes
// and parameters: a halted VM, the host it runs on, a disabled host, a
// disk the destination cannot see, too little memory there, and a host
// that is not live. (A network the destination lacks and PCI devices:
// internal/xenops's TestAssertCanMigrate, as the simulated pool cannot
// make such records.)
func TestPoolMigrateRefusals(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{HostArgs: map[int][]string{1: {"--host-memory", "1GiB"}}})
	vm := suite.SharedVM(r, sr, "refused", nil)
	try := func(params ...any) error {
		_, err := r.C.Call(ctx, r.At, "VM.pool_migrate", append([]any{r.S}, params...)...)
		return err
	}
	can := func(v, host string) error {
		_, err := r.C.Call(ctx, r.At, "VM.assert_can_migrate", r.S, v, map[string]string{"host": host}, true,
			map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{})
		return err
	}
	suite.WantRefusal(t, "a halted VM", try(vm, hosts[1], map[string]string{}), xerr.VMBadPowerState, vm, "running", "halted")
	suite.WantRefusal(t, "assert_can_migrate of a halted VM", can(vm, hosts[1]), xerr.VMBadPowerState, vm, "running", "halted")
	r.Call("VM.start_on", vm, hosts[0], false, false)
	suite.WantRefusal(t, "to its own host", try(vm, hosts[0], map[string]string{}), xerr.OperationNotAllowed)
	r.Call("host.disable", hosts[1])
	suite.WantRefusal(t, "to a disabled host", try(vm, hosts[1], map[string]string{}), xerr.HostDisabled, hosts[1])
	suite.WantRefusal(t, "assert_can_migrate to a disabled host", can(vm, hosts[1]), xerr.HostDisabled, hosts[1])
	r.Call("host.enable", hosts[1])
	if err := can(vm, hosts[1]); err != nil {
		t.Fatalf("assert_can_migrate of a VM that can move: %v", err)
	}

	// A disk on host 0's local SR.
	local := r.LocalSR(hosts[0])
	lvm := suite.SharedVM(r, local, "local disk", nil)
	r.Call("VM.start_on", lvm, hosts[0], false, false)
	suite.WantRefusal(t, "a disk the destination cannot see", try(lvm, hosts[1], map[string]string{}), xerr.VMRequiresSR, lvm, local)
	suite.WantRefusal(t, "assert_can_migrate of it", can(lvm, hosts[1]), xerr.VMRequiresSR, lvm, local)

	// 2 GiB into a host of 1 GiB.
	big := testdaemon.VMRecord("big")
	for _, f := range []string{"memory_static_max", "memory_dynamic_max", "memory_dynamic_min", "memory_target"} {
		big[f] = 2 << 30
	}
	bvm := r.Str("VM.create", big)
	r.Call("VM.start_on", bvm, hosts[0], false, false)
	suite.WantRefusal(t, "too little memory", try(bvm, hosts[1], map[string]string{}), xerr.HostNotEnoughFreeMemory, "2147483648", "1073741824")

	// Nothing moved, nothing is marked.
	for _, v := range []string{vm, lvm, bvm} {
		if s := suite.VMWhere(r, v); s.On != hosts[0] || s.Power != "Running" || len(s.Ops) != 0 {
			t.Fatalf("a refused VM: %+v", s)
		}
	}
	// A host that is not live.
	p.Kill(1)
	if err := p.WaitNotLive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	suite.WantRefusal(t, "to a dead host", try(vm, hosts[1], map[string]string{}), xerr.HostNotLive)
}

// slowVM is a VM whose migration stream is capped at 40 bytes a second:
// the simulator's few hundred bytes take seconds.
func slowVM(r suite.RPC, sr string) string {
	return suite.SharedVM(r, sr, "slow", map[string]string{"migration_bandwidth": "40"})
}

// startMigration runs Async.VM.pool_migrate from host from to host to
// and waits until the destination has built the incoming domain and
// says it is receiving (the memory then takes seconds to go).
func startMigration(t *testing.T, p *pooltest.Pool, r suite.RPC, vm string, hosts map[int]string, to int) string {
	t.Helper()
	uuid := r.Str("VM.get_uuid", vm)
	task := r.Str("Async.VM.pool_migrate", vm, hosts[to], map[string]string{})
	suite.WaitUntil(t, 30*time.Second, "the incoming domain", func() bool {
		if st := r.Str("task.get_status", task); st != "pending" {
			t.Fatalf("the migration ended early: %s %s", st, r.Call("task.get_error_info", task))
		}
		return strings.Contains(p.Hosts[to].Log(), `msg="receiving a migrating VM" component=xenops vm=`+uuid)
	})
	return task
}

// Cancelling the task half-way through the memory leaves the VM running
// on its host and nothing on the destination, whether the VM runs on a
// member (the coordinator's task reaches it) or on the coordinator
// (where the task's progress shows the memory going); the same VM then
// moves.
func TestPoolMigrateCancel(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	cancelled := func(task string, from, to int) {
		t.Helper()
		r.Call("task.cancel", task)
		if st, info := suite.WaitTask(t, r, task); st != "cancelled" {
			t.Fatalf("a cancelled migration: %s %v", st, info)
		}
		// The coordinator's task ends at once; a member undoes the move
		// meanwhile.
		suite.WaitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(suite.VMWhere(r, vm).Ops) == 0 })
		if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[from] {
			t.Fatalf("after the cancel: %+v", s)
		}
		if !suite.SimDomainIn(t, p.Hosts[from].DataDir, uuid) {
			t.Fatal("the VM's domain is gone from its host")
		}
		suite.WaitUntil(t, 30*time.Second, "the destination to drop the incoming domain", func() bool {
			return !suite.SimDomainIn(t, p.Hosts[to].DataDir, uuid)
		})
	}
	r.Call("VM.start_on", vm, hosts[1], false, false)
	cancelled(startMigration(t, p, r, vm, hosts, 0), 1, 0)
	// Nothing was left in the way: the move now goes through.
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.Call("VM.pool_migrate", vm, hosts[0], map[string]string{})
	if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("after the second move: %+v", s)
	}
	// On the coordinator, cancelled once a third of the memory is sent.
	r.Call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	task := startMigration(t, p, r, vm, hosts, 1)
	suite.WaitUntil(t, 30*time.Second, "the memory to be going", func() bool {
		var prog float64
		_ = json.Unmarshal(r.Call("task.get_progress", task), &prog)
		return prog > 0.3
	})
	cancelled(task, 0, 1)
}

// The destination killed (SIGKILL) while the memory is sent: the VM keeps
// running on its host, and the call fails.
func TestPoolMigrateDestinationKilled(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	task := startMigration(t, p, r, vm, hosts, 1)
	p.Kill(1)
	if st, info := suite.WaitTask(t, r, task); st != "failure" {
		t.Fatalf("a migration whose destination died: %s %v", st, info)
	}
	if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[0] || len(s.Ops) != 0 {
		t.Fatalf("after the destination died: %+v", s)
	}
	if !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatal("the VM's domain is gone from its host")
	}
	// The guest runs: a pause and unpause go through.
	r.Call("VM.pause", vm)
	r.Call("VM.unpause", vm)
}

// A running VM on real QEMU (TCG), its disk on the shared SR, moves to
// the other host and back: one QEMU process runs it at the end of each
// move, with its state in the destination's directory only, and the
// record follows it.
func TestPoolMigrateQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	vm := suite.SharedVM(r, sr, "qemu-mover", nil)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	t.Cleanup(func() { _, _ = r.C.Call(context.Background(), p.Addr(0), "VM.hard_shutdown", r.S, vm) })
	var wall []time.Duration
	for _, to := range []int{1, 0} {
		t0 := time.Now()
		r.Call("VM.pool_migrate", vm, hosts[to], map[string]string{})
		wall = append(wall, time.Since(t0))
		if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[to] || len(s.Ops) != 0 {
			t.Fatalf("after the move to host %d: %+v", to, s)
		}
		// The source's QEMU is gone by the time the call returns.
		if pids := suite.QEMUOf(uuid); len(pids) != 1 {
			t.Fatalf("QEMU processes of the VM after the move to host %d: %v", to, pids)
		}
		if !suite.IsDir(filepath.Join(p.Hosts[to].DataDir, "xenops", "qemu", uuid)) || suite.IsDir(filepath.Join(p.Hosts[1-to].DataDir, "xenops", "qemu", uuid)) {
			t.Fatalf("the VM's QEMU state should be on host %d only", to)
		}
	}
	logMigrationFigures(t, "qemu", p, uuid, wall)
}

// logMigrationFigures logs, for docs/performance.md, the calls' wall
// time against what the sources logged: their whole orchestration, the
// destination's preparation and the backend's own SendLive.
func logMigrationFigures(t *testing.T, backend string, p *pooltest.Pool, uuid string, wall []time.Duration) {
	t.Helper()
	var total, send, prep []time.Duration
	for i := range p.Hosts {
		a, b, c := migrationTimes(p.Hosts[i], uuid)
		total, send, prep = append(total, a...), append(send, b...), append(prep, c...)
	}
	sum := func(ds []time.Duration) time.Duration {
		var s time.Duration
		for _, d := range ds {
			s += d
		}
		return s
	}
	if sum(send) > 0 {
		t.Logf("%s: %d moves: wall %v, source total %v, preparation %v, SendLive %v: wall/SendLive %.1f, (wall-preparation)/SendLive %.1f",
			backend, len(wall), sum(wall), sum(total), sum(prep), sum(send),
			float64(sum(wall))/float64(sum(send)), float64(sum(wall)-sum(prep))/float64(sum(send)))
	}
}

// The source's daemon killed (SIGKILL) while the memory is sent, then
// started again: the VM runs on the source, as the database says, the
// destination has dropped the incoming domain, and the VM's mark is gone.
func TestPoolMigrateSourceRestarted(t *testing.T) {
	ctx := suite.Ctx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[1], false, false)
	task := startMigration(t, p, r, vm, hosts, 0)
	p.Kill(1)
	if st, info := suite.WaitTask(t, r, task); st == "success" {
		t.Fatalf("a migration whose source died: %s %v", st, info)
	}
	suite.WaitUntil(t, 30*time.Second, "the destination to drop the incoming domain", func() bool {
		return !suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid)
	})
	p.Restart(1)
	if err := p.WaitLive(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var last suite.VMState
	defer func() {
		if t.Failed() {
			t.Logf("the VM: %+v", last)
		}
	}()
	suite.WaitUntil(t, 30*time.Second, "the VM running on its host, unmarked", func() bool {
		last = suite.VMWhere(r, vm)
		return last.Power == "Running" && last.On == hosts[1] && len(last.Ops) == 0
	})
	_ = last
	if !suite.SimDomainIn(t, p.Hosts[1].DataDir, uuid) || suite.SimDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatal("the VM's domain should be on its host only")
	}
	r.Call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.Call("VM.pool_migrate", vm, hosts[0], map[string]string{})
	if s := suite.VMWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("the move after the restart: %+v", s)
	}
}

// Between hosts that speak TLS to each other (--listen-https), the
// migration stream takes the pool's TLS connection like every
// intra-pool request.
func TestPoolMigrateTLS(t *testing.T) {
	ctx := suite.Ctx(t)
	p, _ := suite.TLSPool(t, ctx, 2)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(0), S: s}
	hosts := suite.HostRefs(t, ctx, c, p, 0, s)
	vm := suite.SharedVM(r, sharedSR(t, r, hosts), "over TLS", nil)
	uuid := r.Str("VM.get_uuid", vm)
	r.Call("VM.start_on", vm, hosts[0], false, false)
	for _, to := range []int{1, 0} {
		r.Call("VM.pool_migrate", vm, hosts[to], map[string]string{})
		if st := suite.VMWhere(r, vm); st.Power != "Running" || st.On != hosts[to] {
			t.Fatalf("after the move to host %d: %+v", to, st)
		}
		if !suite.SimDomainIn(t, p.Hosts[to].DataDir, uuid) || suite.SimDomainIn(t, p.Hosts[1-to].DataDir, uuid) {
			t.Fatalf("the VM's domain should be on host %d only", to)
		}
	}
}
