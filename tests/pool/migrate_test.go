package pool

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

	"toolstackd/internal/pooltest"
	"toolstackd/internal/testdaemon"
	"toolstackd/internal/xerr"
)

// VM.pool_migrate between the hosts of a pool (issue 18): simulated
// hosts, the VMs' disks on a sharedfs SR both hosts have plugged.

// migratePool starts a pool of two simulated hosts (o may add flags),
// with a sharedfs SR plugged on both: calls through host 0, the hosts'
// refs by index, and the SR.
func migratePool(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, rpc, map[int]string, string) {
	t.Helper()
	o.Hosts = 2
	p, r, hosts := joined(t, ctx, o)
	return p, r, hosts, sharedSR(t, r, hosts)
}

// sharedSR makes a sharedfs SR plugged on hosts 0 and 1.
func sharedSR(t *testing.T, r rpc, hosts map[int]string) string {
	t.Helper()
	sr := r.str("SR.create", hosts[0], map[string]string{"location": t.TempDir()}, 0, "shared", "", "sharedfs", "user", true,
		map[string]string{})
	var pbds []string
	if err := json.Unmarshal(r.call("SR.get_PBDs", sr), &pbds); err != nil {
		t.Fatal(err)
	}
	for _, pbd := range pbds {
		if r.str("PBD.get_host", pbd) == hosts[1] {
			r.call("PBD.plug", pbd)
		}
	}
	return sr
}

// sharedVM makes a VM with a 4 MiB disk on sr; oc goes into its
// other_config.
func sharedVM(r rpc, sr, name string, oc map[string]string) string {
	r.t.Helper()
	rec := testdaemon.VMRecord(name)
	if oc != nil {
		rec["other_config"] = oc
	}
	vm := r.str("VM.create", rec)
	vdi := r.str("VDI.create", map[string]any{"name_label": name, "name_description": "", "SR": sr,
		"virtual_size": 4 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	return vm
}

// wantCode fails the test unless err is the XenAPI error code with
// params (nil params: not checked).
func wantRefusal(t *testing.T, what string, err error, code string, params ...string) {
	t.Helper()
	var e *testdaemon.Error
	if pooltest.Code(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	if params != nil && asXenError(err, &e) && !slices.Equal(e.Params, params) {
		t.Fatalf("%s: %s %v, want %v", what, code, e.Params, params)
	}
}

func asXenError(err error, e **testdaemon.Error) bool {
	x, ok := err.(*testdaemon.Error) //nolint:errorlint // the client returns it bare
	if ok {
		*e = x
	}
	return ok
}

// vmState is where the database says a VM is.
type vmState struct {
	Power, On string
	Domid     int64
	Ops       map[string]string
}

func vmWhere(r rpc, vm string) vmState {
	r.t.Helper()
	var rec struct {
		PowerState string            `json:"power_state"`
		ResidentOn string            `json:"resident_on"`
		Domid      int64             `json:"domid"`
		CurOps     map[string]string `json:"current_operations"`
	}
	if err := json.Unmarshal(r.call("VM.get_record", vm), &rec); err != nil {
		r.t.Fatal(err)
	}
	return vmState{rec.PowerState, rec.ResidentOn, rec.Domid, rec.CurOps}
}

// waitFor polls cond until it holds, failing the test after bound.
func waitUntil(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", bound, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := sharedVM(r, sr, "mover", nil)
	uuid := r.str("VM.get_uuid", vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	// The VM's RRD on its host, with two readings at least (a host makes
	// a new RRD with one reading at its first tick).
	waitUntil(t, 40*time.Second, "two readings in the VM's RRD", func() bool {
		st, body := vmRRD(t, p.Addr(0), r.s, uuid)
		return st == http.StatusOK && rrdReadings(body) >= 2
	})
	check := func(at, away int) {
		t.Helper()
		s := vmWhere(r, vm)
		if s.Power != "Running" || s.On != hosts[at] || s.Domid < 0 || len(s.Ops) != 0 {
			t.Fatalf("after the move to host %d: %+v", at, s)
		}
		if !simDomainIn(t, p.Hosts[at].DataDir, uuid) {
			t.Fatalf("no domain on host %d", at)
		}
		// The source removes its stopped domain as it finishes.
		if simDomainIn(t, p.Hosts[away].DataDir, uuid) {
			t.Fatalf("a domain left on host %d", away)
		}
		var vbds []string
		_ = json.Unmarshal(r.call("VM.get_VBDs", vm), &vbds)
		for _, vbd := range vbds {
			if string(r.call("VBD.get_currently_attached", vbd)) != "true" {
				t.Fatalf("VBD %s not attached after the move", vbd)
			}
		}
		var consoles []string
		_ = json.Unmarshal(r.call("VM.get_consoles", vm), &consoles)
		if len(consoles) == 0 {
			t.Fatal("no consoles after the move")
		}
		for _, c := range consoles {
			if loc := r.str("console.get_location", c); !strings.Contains(loc, pooltest.HostIP(at).String()) {
				t.Fatalf("a console at %s after the move to host %d", loc, at)
			}
		}
		metrics := r.str("VM.get_metrics", vm)
		var state []string
		_ = json.Unmarshal(r.call("VM_metrics.get_state", metrics), &state)
		if !slices.Equal(state, []string{"running"}) {
			t.Fatalf("VM_metrics.state %v", state)
		}
		// The RRD came along: the destination's has the readings taken
		// on the source (its own would have one at most by now).
		if st, body := vmRRD(t, p.Addr(at), r.s, uuid); st != http.StatusOK || rrdReadings(body) < 2 {
			t.Fatalf("the VM's RRD on host %d: %d, %d readings", at, st, rrdReadings(body))
		}
	}
	var wall []time.Duration
	for _, to := range []int{1, 0, 1, 0} {
		t0 := time.Now()
		r.call("VM.pool_migrate", vm, hosts[to], map[string]string{"live": "true"})
		wall = append(wall, time.Since(t0))
		check(to, 1-to)
	}
	// For docs/performance.md: the call's wall time against the
	// backend's own send time, as the source logged it.
	// Each move left xapi's message about it, on the source (messages
	// are each host's own: a member's stay on it).
	n := 0
	for i := range 2 {
		ls, err := p.LocalLogin(ctx, r.c, i)
		if err != nil {
			t.Fatal(err)
		}
		var msgs map[string]map[string]any
		raw, err := r.c.Call(ctx, p.Addr(i), "message.get_all_records", ls)
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
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{HostArgs: map[int][]string{1: {"--host-memory", "1GiB"}}})
	vm := sharedVM(r, sr, "refused", nil)
	try := func(params ...any) error {
		_, err := r.c.Call(ctx, r.at, "VM.pool_migrate", append([]any{r.s}, params...)...)
		return err
	}
	can := func(v, host string) error {
		_, err := r.c.Call(ctx, r.at, "VM.assert_can_migrate", r.s, v, map[string]string{"host": host}, true,
			map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{})
		return err
	}
	wantRefusal(t, "a halted VM", try(vm, hosts[1], map[string]string{}), xerr.VMBadPowerState, vm, "running", "halted")
	wantRefusal(t, "assert_can_migrate of a halted VM", can(vm, hosts[1]), xerr.VMBadPowerState, vm, "running", "halted")
	r.call("VM.start_on", vm, hosts[0], false, false)
	wantRefusal(t, "to its own host", try(vm, hosts[0], map[string]string{}), xerr.OperationNotAllowed)
	r.call("host.disable", hosts[1])
	wantRefusal(t, "to a disabled host", try(vm, hosts[1], map[string]string{}), xerr.HostDisabled, hosts[1])
	wantRefusal(t, "assert_can_migrate to a disabled host", can(vm, hosts[1]), xerr.HostDisabled, hosts[1])
	r.call("host.enable", hosts[1])
	if err := can(vm, hosts[1]); err != nil {
		t.Fatalf("assert_can_migrate of a VM that can move: %v", err)
	}

	// A disk on host 0's local SR.
	local := r.localSR(hosts[0])
	lvm := sharedVM(r, local, "local disk", nil)
	r.call("VM.start_on", lvm, hosts[0], false, false)
	wantRefusal(t, "a disk the destination cannot see", try(lvm, hosts[1], map[string]string{}), xerr.VMRequiresSR, lvm, local)
	wantRefusal(t, "assert_can_migrate of it", can(lvm, hosts[1]), xerr.VMRequiresSR, lvm, local)

	// 2 GiB into a host of 1 GiB.
	big := testdaemon.VMRecord("big")
	for _, f := range []string{"memory_static_max", "memory_dynamic_max", "memory_dynamic_min", "memory_target"} {
		big[f] = 2 << 30
	}
	bvm := r.str("VM.create", big)
	r.call("VM.start_on", bvm, hosts[0], false, false)
	wantRefusal(t, "too little memory", try(bvm, hosts[1], map[string]string{}), xerr.HostNotEnoughFreeMemory, "2147483648", "1073741824")

	// Nothing moved, nothing is marked.
	for _, v := range []string{vm, lvm, bvm} {
		if s := vmWhere(r, v); s.On != hosts[0] || s.Power != "Running" || len(s.Ops) != 0 {
			t.Fatalf("a refused VM: %+v", s)
		}
	}
	// A host that is not live.
	p.Kill(1)
	if err := p.WaitNotLive(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, "to a dead host", try(vm, hosts[1], map[string]string{}), xerr.HostNotLive)
}

// slowVM is a VM whose migration stream is capped at 40 bytes a second:
// the simulator's few hundred bytes take seconds.
func slowVM(r rpc, sr string) string {
	return sharedVM(r, sr, "slow", map[string]string{"migration_bandwidth": "40"})
}

// startMigration runs Async.VM.pool_migrate from host from to host to
// and waits until the destination has built the incoming domain and
// says it is receiving (the memory then takes seconds to go).
func startMigration(t *testing.T, p *pooltest.Pool, r rpc, vm string, hosts map[int]string, to int) string {
	t.Helper()
	uuid := r.str("VM.get_uuid", vm)
	task := r.str("Async.VM.pool_migrate", vm, hosts[to], map[string]string{})
	waitUntil(t, 30*time.Second, "the incoming domain", func() bool {
		if st := r.str("task.get_status", task); st != "pending" {
			t.Fatalf("the migration ended early: %s %s", st, r.call("task.get_error_info", task))
		}
		return strings.Contains(p.Hosts[to].Log(), `msg="receiving a migrating VM" component=xenops vm=`+uuid)
	})
	return task
}

// waitTask waits for a task to end and returns its status and error.
func waitTask(t *testing.T, r rpc, task string) (string, []string) {
	t.Helper()
	var st string
	waitUntil(t, 60*time.Second, "the task to end", func() bool {
		st = r.str("task.get_status", task)
		return st != "pending" && st != "cancelling"
	})
	var info []string
	_ = json.Unmarshal(r.call("task.get_error_info", task), &info)
	return st, info
}

// Cancelling the task half-way through the memory leaves the VM running
// on its host and nothing on the destination, whether the VM runs on a
// member (the coordinator's task reaches it) or on the coordinator
// (where the task's progress shows the memory going); the same VM then
// moves.
func TestPoolMigrateCancel(t *testing.T) {
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.str("VM.get_uuid", vm)
	cancelled := func(task string, from, to int) {
		t.Helper()
		r.call("task.cancel", task)
		if st, info := waitTask(t, r, task); st != "cancelled" {
			t.Fatalf("a cancelled migration: %s %v", st, info)
		}
		// The coordinator's task ends at once; a member undoes the move
		// meanwhile.
		waitUntil(t, 30*time.Second, "the migration to be undone", func() bool { return len(vmWhere(r, vm).Ops) == 0 })
		if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[from] {
			t.Fatalf("after the cancel: %+v", s)
		}
		if !simDomainIn(t, p.Hosts[from].DataDir, uuid) {
			t.Fatal("the VM's domain is gone from its host")
		}
		waitUntil(t, 30*time.Second, "the destination to drop the incoming domain", func() bool {
			return !simDomainIn(t, p.Hosts[to].DataDir, uuid)
		})
	}
	r.call("VM.start_on", vm, hosts[1], false, false)
	cancelled(startMigration(t, p, r, vm, hosts, 0), 1, 0)
	// Nothing was left in the way: the move now goes through.
	r.call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.call("VM.pool_migrate", vm, hosts[0], map[string]string{})
	if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("after the second move: %+v", s)
	}
	// On the coordinator, cancelled once a third of the memory is sent.
	r.call("VM.add_to_other_config", vm, "migration_bandwidth", "40")
	task := startMigration(t, p, r, vm, hosts, 1)
	waitUntil(t, 30*time.Second, "the memory to be going", func() bool {
		var prog float64
		_ = json.Unmarshal(r.call("task.get_progress", task), &prog)
		return prog > 0.3
	})
	cancelled(task, 0, 1)
}

// The destination killed (SIGKILL) while the memory is sent: the VM keeps
// running on its host, and the call fails.
func TestPoolMigrateDestinationKilled(t *testing.T) {
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.str("VM.get_uuid", vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	task := startMigration(t, p, r, vm, hosts, 1)
	p.Kill(1)
	if st, info := waitTask(t, r, task); st != "failure" {
		t.Fatalf("a migration whose destination died: %s %v", st, info)
	}
	if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[0] || len(s.Ops) != 0 {
		t.Fatalf("after the destination died: %+v", s)
	}
	if !simDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatal("the VM's domain is gone from its host")
	}
	// The guest runs: a pause and unpause go through.
	r.call("VM.pause", vm)
	r.call("VM.unpause", vm)
}

// A running VM on real QEMU (TCG), its disk on the shared SR, moves to
// the other host and back: one QEMU process runs it at the end of each
// move, with its state in the destination's directory only, and the
// record follows it.
func TestPoolMigrateQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{Daemon: testdaemon.Options{Backend: "qemu",
		Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}})
	vm := sharedVM(r, sr, "qemu-mover", nil)
	uuid := r.str("VM.get_uuid", vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	t.Cleanup(func() { _, _ = r.c.Call(context.Background(), p.Addr(0), "VM.hard_shutdown", r.s, vm) })
	var wall []time.Duration
	for _, to := range []int{1, 0} {
		t0 := time.Now()
		r.call("VM.pool_migrate", vm, hosts[to], map[string]string{})
		wall = append(wall, time.Since(t0))
		if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[to] || len(s.Ops) != 0 {
			t.Fatalf("after the move to host %d: %+v", to, s)
		}
		// The source's QEMU is gone by the time the call returns.
		if pids := qemuOf(uuid); len(pids) != 1 {
			t.Fatalf("QEMU processes of the VM after the move to host %d: %v", to, pids)
		}
		if !isDir(filepath.Join(p.Hosts[to].DataDir, "xenops", "qemu", uuid)) || isDir(filepath.Join(p.Hosts[1-to].DataDir, "xenops", "qemu", uuid)) {
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
	ctx := testCtx(t)
	p, r, hosts, sr := migratePool(t, ctx, pooltest.Options{})
	vm := slowVM(r, sr)
	uuid := r.str("VM.get_uuid", vm)
	r.call("VM.start_on", vm, hosts[1], false, false)
	task := startMigration(t, p, r, vm, hosts, 0)
	p.Kill(1)
	if st, info := waitTask(t, r, task); st == "success" {
		t.Fatalf("a migration whose source died: %s %v", st, info)
	}
	waitUntil(t, 30*time.Second, "the destination to drop the incoming domain", func() bool {
		return !simDomainIn(t, p.Hosts[0].DataDir, uuid)
	})
	p.Restart(1)
	if err := p.WaitLive(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var last vmState
	defer func() {
		if t.Failed() {
			t.Logf("the VM: %+v", last)
		}
	}()
	waitUntil(t, 30*time.Second, "the VM running on its host, unmarked", func() bool {
		last = vmWhere(r, vm)
		return last.Power == "Running" && last.On == hosts[1] && len(last.Ops) == 0
	})
	_ = last
	if !simDomainIn(t, p.Hosts[1].DataDir, uuid) || simDomainIn(t, p.Hosts[0].DataDir, uuid) {
		t.Fatal("the VM's domain should be on its host only")
	}
	r.call("VM.remove_from_other_config", vm, "migration_bandwidth")
	r.call("VM.pool_migrate", vm, hosts[0], map[string]string{})
	if s := vmWhere(r, vm); s.Power != "Running" || s.On != hosts[0] {
		t.Fatalf("the move after the restart: %+v", s)
	}
}

// Between hosts that speak TLS to each other (--listen-https), the
// migration stream takes the pool's TLS connection like every
// intra-pool request.
func TestPoolMigrateTLS(t *testing.T) {
	ctx := testCtx(t)
	p, _ := tlsPool(t, ctx, 2)
	c := pooltest.NewClient(netip.Addr{})
	s, err := p.Login(ctx, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rpc{t, ctx, c, p.Addr(0), s}
	hosts := hostRefs(t, ctx, c, p, 0, s)
	vm := sharedVM(r, sharedSR(t, r, hosts), "over TLS", nil)
	uuid := r.str("VM.get_uuid", vm)
	r.call("VM.start_on", vm, hosts[0], false, false)
	for _, to := range []int{1, 0} {
		r.call("VM.pool_migrate", vm, hosts[to], map[string]string{})
		if st := vmWhere(r, vm); st.Power != "Running" || st.On != hosts[to] {
			t.Fatalf("after the move to host %d: %+v", to, st)
		}
		if !simDomainIn(t, p.Hosts[to].DataDir, uuid) || simDomainIn(t, p.Hosts[1-to].DataDir, uuid) {
			t.Fatalf("the VM's domain should be on host %d only", to)
		}
	}
}
