package xenops

import (
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xenops/sim"
)

// xapi's memory model, worked by hand from memory.ml: a 1 GiB HVM guest
// with one VCPU has 256+1024+1024 pages of shadow (9 MiB), 1+1 MiB of
// extras and 1 MiB for its VCPU: 12 MiB; a PV guest has no internal
// extra: 11 MiB.
func TestMemoryOverheadModel(t *testing.T) {
	if got := hvmModel.overheadMiB(1024, 1, 1); got != 12 {
		t.Errorf("HVM overhead = %d MiB, want 12", got)
	}
	if got := linuxModel.overheadMiB(1024, 1, 1); got != 11 {
		t.Errorf("PV overhead = %d MiB, want 11", got)
	}
	// 64 VCPUs: 16384 pages more shadow (64 MiB), 2432 pages for the
	// VCPUs (10 MiB).
	if got := hvmModel.overheadMiB(1024, 64, 1); got != 1+1+(256*64+2048)/256+10 {
		t.Errorf("HVM overhead with 64 VCPUs = %d MiB", got)
	}
	if got := shadowMiB(0, 0, 0); got != 1 {
		t.Errorf("shadow floor = %d, want 1", got)
	}
	if got := hvmModel.overheadMiB(1024, 1, 2); got != 1+1+18+1 {
		t.Errorf("HVM overhead with multiplier 2 = %d MiB", got)
	}
}

func TestMaximiseMemory(t *testing.T) {
	fit := func(total int64) func(int64) bool {
		return func(sm int64) bool { return fitsIn(startMiB(hvmModel, sm, 1, 1), total) }
	}
	for _, total := range []int64{0, 1, 10 << 20, 1 << 30, 3<<30 + 12345, 1 << 40, math.MaxInt64} {
		got := maximiseMemory(total, fit(total))
		if got%mib != 0 || got < 0 {
			t.Errorf("total %d: %d is not whole MiB", total, got)
		}
		if got > 0 && !fit(total)(got) {
			t.Errorf("total %d: %d does not fit", total, got)
		}
		if got <= total-mib && fit(total)(got+mib) {
			t.Errorf("total %d: %d is not the largest (%d fits)", total, got, got+mib)
		}
	}
	if got := maximiseMemory(-5, fit(-5)); got != 0 {
		t.Errorf("negative total: %d", got)
	}
}

func TestSysrqKey(t *testing.T) {
	for in, want := range map[string]byte{"h": 'h', "B": 'b', "0": '0', "z": 'z'} {
		if got, err := sysrqKey(in); err != nil || got != want {
			t.Errorf("sysrqKey(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "hh", " ", "\x00", "é", "/", "\n"} {
		if _, err := sysrqKey(in); err == nil {
			t.Errorf("sysrqKey(%q) accepted", in)
		}
	}
}

// FuzzSysrqKey: any key is either refused with INVALID_VALUE or is one
// letter or digit.
func FuzzSysrqKey(f *testing.F) {
	for _, s := range []string{"h", "", "ab", "\xff", "Z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := sysrqKey(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "INVALID_VALUE") {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if len(s) != 1 || !((k >= 'a' && k <= 'z') || (k >= '0' && k <= '9')) {
			t.Fatalf("%q accepted as %q", s, k)
		}
	})
}

// simEnv is an API server with xenops on the simulator, spoken to over
// JSON-RPC on loopback.
type simEnv struct {
	t    *testing.T
	m    *Manager
	sim  *sim.Simulator
	d    *db.DB
	c    *testdaemon.Client
	sess string
	host string
}

func newSimEnv(t *testing.T) *simEnv {
	t.Helper()
	d := db.New(dm.Model, db.Options{})
	acfg := api.DefaultConfig()
	acfg.PasswordIterations = 1000
	hash, _ := api.HashPassword("pw", acfg.PasswordIterations)
	host, err := api.FirstBoot(d, api.ProbeHost(), api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		t.Fatal(err)
	}
	acfg.HostRef = host
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := api.New(d, acfg, quiet)
	srv.Start()
	router := mux.NewRouter()
	srv.Routes(router)
	m, err := Register(srv, router, Config{Backend: "simulator", DataDir: t.TempDir(), HostRef: host, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(router)
	t.Cleanup(func() { hs.Close(); srv.Close(); m.Close() })
	e := &simEnv{t: t, m: m, sim: m.Backend().(*sim.Simulator), d: d, c: &testdaemon.Client{URL: hs.URL}, host: host}
	sess, err := e.c.Login("root", "pw")
	if err != nil {
		t.Fatal(err)
	}
	e.sess = sess
	return e
}

func (e *simEnv) try(method string, params ...any) (json.RawMessage, *testdaemon.Error) {
	e.t.Helper()
	r, err := e.c.Call(method, append([]any{e.sess}, params...)...)
	if x, ok := testdaemon.AsError(err); ok {
		return nil, x
	}
	if err != nil {
		e.t.Fatalf("%s: %v", method, err)
	}
	return r, nil
}

func (e *simEnv) call(method string, params ...any) json.RawMessage {
	e.t.Helper()
	r, x := e.try(method, params...)
	if x != nil {
		e.t.Fatalf("%s: %s %v", method, x.Code, x.Params)
	}
	return r
}

func (e *simEnv) str(method string, params ...any) string {
	e.t.Helper()
	var s string
	if err := json.Unmarshal(e.call(method, params...), &s); err != nil {
		e.t.Fatalf("%s: not a string", method)
	}
	return s
}

// fails checks a call fails with code and, when params is not nil, those
// parameters.
func (e *simEnv) fails(code string, params []string, method string, args ...any) {
	e.t.Helper()
	_, x := e.try(method, args...)
	if x == nil || x.Code != code || (params != nil && !slices.Equal(x.Params, params)) {
		e.t.Fatalf("%s: %v, want %s %v", method, x, code, params)
	}
}

// num reads an int result, sent as a JSON number or string.
func (e *simEnv) num(method string, params ...any) int64 {
	e.t.Helper()
	raw := strings.Trim(string(e.call(method, params...)), `"`)
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		e.t.Fatalf("%s: not an int: %s", method, raw)
	}
	return n
}

func (e *simEnv) network() string {
	var refs []string
	_ = json.Unmarshal(e.call("network.get_all"), &refs)
	return refs[0]
}

func TestMessages14OnSimulator(t *testing.T) {
	e := newSimEnv(t)
	vm := e.str("VM.create", testdaemon.VMRecord("m14"))
	vif := e.str("VIF.create", map[string]any{"device": "0", "network": e.network(), "VM": vm, "MAC": "", "MTU": 1500,
		"other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{},
		"locking_mode": "network_default", "ipv4_allowed": []string{}, "ipv6_allowed": []string{}})
	cd := e.str("VBD.create", map[string]any{"VM": vm, "VDI": "OpaqueRef:NULL", "userdevice": "3", "bootable": false, "mode": "RO",
		"type": "CD", "unpluggable": true, "empty": true, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{}})

	// Halted: the live calls are refused with xapi's parameters.
	e.fails("VM_BAD_POWER_STATE", []string{vm, "running", "halted"}, "VM.send_sysrq", vm, "h")
	e.fails("VM_BAD_POWER_STATE", []string{vm, "running", "halted"}, "VM.send_trigger", vm, "nmi")
	e.fails("VM_BAD_POWER_STATE", []string{vm, "running", "halted"}, "VM.set_memory_target_live", vm, "134217728")
	e.fails("INVALID_VALUE", []string{"key", "hh"}, "VM.send_sysrq", vm, "hh")
	e.fails("INVALID_VALUE", []string{"trigger", "bogus"}, "VM.send_trigger", vm, "bogus")
	e.fails("OPERATION_NOT_ALLOWED", nil, "VM.send_trigger", vm, "reset")
	e.fails("HANDLE_INVALID", []string{"VM", "OpaqueRef:nope"}, "VM.send_sysrq", "OpaqueRef:nope", "h")

	// Placement and memory questions. The VM's only device is on the
	// management network, on which the host has its PIF: it is agile.
	e.call("VM.assert_agile", vm)
	var hosts []string
	_ = json.Unmarshal(e.call("VM.get_possible_hosts", vm), &hosts)
	if !slices.Equal(hosts, []string{e.host}) {
		t.Errorf("get_possible_hosts = %v, want [%s]", hosts, e.host)
	}
	overhead := e.num("VM.compute_memory_overhead", vm)
	if overhead != (1+1+2+1)*mib { // 128 MiB, 1 VCPU: (256+256) pages of shadow = 2 MiB
		t.Errorf("compute_memory_overhead = %d", overhead)
	}
	most := e.num("VM.maximise_memory", vm, "1073741824", false)
	if most <= 0 || most%mib != 0 || most > 1<<30 {
		t.Errorf("maximise_memory = %d", most)
	}
	approx := e.num("VM.maximise_memory", vm, "1073741824", true)
	if approx >= most {
		t.Errorf("maximise_memory approximate %d, not below exact %d", approx, most)
	}
	e.call("host.compute_memory_overhead", e.host)

	e.call("VM.start", vm, false, false)
	uuid := e.str("VM.get_uuid", vm)
	e.call("VM.send_sysrq", vm, "h")
	e.call("VM.send_trigger", vm, "nmi")
	e.call("VM.set_memory_target_live", vm, "134217728")
	if got := e.sim.Signals(uuid); !slices.Equal(got, []string{"sysrq:h", "trigger:nmi"}) {
		t.Errorf("signals = %v", got)
	}

	// Attached devices are not destroyed.
	e.fails("OPERATION_NOT_ALLOWED", []string{"VIF currently attached to a running VM"}, "VIF.destroy", vif)
	attached, _ := e.try("VBD.get_currently_attached", cd)
	if string(attached) == "true" {
		e.fails("OPERATION_NOT_ALLOWED", nil, "VBD.destroy", cd)
	}

	// VIF.move while plugged: the NIC follows.
	other := e.str("network.create", map[string]any{"name_label": "other", "name_description": "", "MTU": 1500,
		"other_config": map[string]string{}, "tags": []string{}})
	e.call("VIF.move", vif, other)
	if got := e.str("VIF.get_network", vif); got != other {
		t.Errorf("VIF network after move: %s", got)
	}
	info, _ := e.sim.Info(uuid)
	bridge := e.str("network.get_bridge", other)
	if len(info.NICs) != 1 || info.NICs[0].Bridge != bridge {
		t.Errorf("NIC after move: %+v, want bridge %s", info.NICs, bridge)
	}
	e.fails("HANDLE_INVALID", nil, "VIF.move", vif, "OpaqueRef:nope")
	// A network no host has a PIF on is not shared: the VM is not agile.
	e.fails("HA_CONSTRAINT_VIOLATION_NETWORK_NOT_SHARED", []string{other}, "VM.assert_agile", vm)

	// The power trigger is the power button: the guest powers off.
	e.call("VM.send_trigger", vm, "power")
	deadline := 0
	for e.str("VM.get_power_state", vm) != "Halted" {
		if deadline++; deadline > 500 {
			t.Fatal("the power trigger did not halt the guest")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.call("VIF.destroy", vif)
	e.call("VBD.destroy", cd)
	e.fails("HANDLE_INVALID", nil, "VIF.destroy", vif)
}

// A VBD attached in the database is refused whatever the VM's state
// (xapi checks only currently_attached).
func TestVBDDestroyAttached(t *testing.T) {
	e := newSimEnv(t)
	vm := e.str("VM.create", testdaemon.VMRecord("vbd"))
	vbd := e.str("VBD.create", map[string]any{"VM": vm, "VDI": "OpaqueRef:NULL", "userdevice": "1", "bootable": false, "mode": "RO",
		"type": "CD", "unpluggable": true, "empty": true, "other_config": map[string]string{}, "qos_algorithm_type": "",
		"qos_algorithm_params": map[string]string{}})
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VBD.CurrentlyAttached, vbd, true) }); err != nil {
		t.Fatal(err)
	}
	uuid := e.str("VBD.get_uuid", vbd)
	vmUUID := e.str("VM.get_uuid", vm)
	e.fails("OPERATION_NOT_ALLOWED", []string{"VBD '" + uuid + "' still attached to '" + vmUUID + "'"}, "VBD.destroy", vbd)
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VBD.CurrentlyAttached, vbd, false) }); err != nil {
		t.Fatal(err)
	}
	e.call("VBD.destroy", vbd)
}

func TestRevertRefusals(t *testing.T) {
	e := newSimEnv(t)
	vm := e.str("VM.create", testdaemon.VMRecord("rv"))
	e.fails("REVERT_ONLY_ALLOWED_ON_SNAPSHOT", []string{}, "VM.revert", vm)
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.GenerationID, vm, "1:2") }); err != nil {
		t.Fatal(err)
	}
	snap := e.str("VM.snapshot", vm, "s1")
	e.call("VM.set_name_description", vm, "changed")
	e.call("VM.set_VCPUs_max", vm, "2")
	e.call("VM.start", vm, false, false)
	e.call("VM.revert", snap)
	if p := e.str("VM.get_power_state", vm); p != "Halted" {
		t.Errorf("after revert: %s", p)
	}
	if d := e.str("VM.get_name_description", vm); d != "" {
		t.Errorf("name_description after revert: %q", d)
	}
	if g := e.str("VM.get_generation_id", vm); g == "" || g == "1:2" || g == "0:0" || !strings.Contains(g, ":") {
		t.Errorf("generation_id after revert: %q", g)
	}
	if n := e.str("VM.get_name_label", vm); n != "rv" {
		t.Errorf("name_label after revert: %q", n)
	}
	if vcpus := e.num("VM.get_VCPUs_max", vm); vcpus != 1 {
		t.Errorf("VCPUs_max after revert: %d", vcpus)
	}
	if p := e.str("VM.get_parent", vm); p != snap {
		t.Errorf("parent after revert: %s, want %s", p, snap)
	}
	if got := e.str("VM.get_power_state", snap); got != "Halted" {
		t.Errorf("snapshot power after revert: %s", got)
	}
	// As a task: the snapshot and the VM are marked while it runs, and
	// free again after.
	task := e.str("Async.VM.revert", snap)
	for i := 0; e.str("task.get_status", task) == "pending"; i++ {
		if i > 500 {
			t.Fatal("Async.VM.revert did not finish")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := e.str("task.get_status", task); st != "success" {
		t.Fatalf("Async.VM.revert: %s %s", st, e.call("task.get_error_info", task))
	}
	for _, ref := range []string{vm, snap} {
		if ops := string(e.call("VM.get_current_operations", ref)); ops != "{}" {
			t.Errorf("current_operations of %s after revert: %s", ref, ops)
		}
	}

	// The VM destroyed: revert makes it again from the snapshot.
	e.call("VM.destroy", vm)
	e.call("VM.revert", snap)
	again := e.str("VM.get_snapshot_of", snap)
	if again == vm || again == "OpaqueRef:NULL" {
		t.Fatalf("snapshot_of after revert of a destroyed VM: %s", again)
	}
	if tpl := string(e.call("VM.get_is_a_template", again)); tpl != "false" {
		t.Errorf("recreated VM is a template: %s", tpl)
	}
	if got := string(e.call("VM.get_is_a_snapshot", again)); got != "false" {
		t.Errorf("recreated VM is a snapshot: %s", got)
	}
}
