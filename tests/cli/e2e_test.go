// Package cli runs the real xe binary against the real toolstackd daemon
// (simulator backend): listing and filters, param get/set/add/remove on
// maps and sets, create and destroy, errors and exit statuses, a bad
// password, the local superuser socket, file transfers and completion.
//
// The binaries are built from this checkout into a temporary directory;
// XE_BIN and TOOLSTACKD_BIN use prebuilt ones instead (for example
// bin/xe and bin/toolstackd after make build).
package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

const password = "e2e-secret"

// daemon is a running toolstackd.
type daemon struct {
	*testdaemon.Daemon
	t     *testing.T
	dir   string
	port  string
	xeBin string // the xe client
}

func startDaemon(t *testing.T) *daemon {
	t.Helper()
	d := &daemon{t: t, dir: t.TempDir(), xeBin: testdaemon.BuildCommand(t, "xe", "XE_BIN")}
	d.Daemon = testdaemon.Start(t, testdaemon.Options{DataDir: filepath.Join(d.dir, "data"), Backend: "simulator", LogLevel: "warn",
		Password: password, StartTimeout: 20 * time.Second, Ready: func(*testdaemon.Daemon) bool {
			_, err := os.Stat(d.socket())
			return err == nil
		}})
	_, d.port, _ = net.SplitHostPort(d.Addr)
	return d
}

func (d *daemon) socket() string { return filepath.Join(d.dir, "data", "xapi.sock") }

// run is one xe run.
type run struct {
	out, err string
	code     int
}

// xeEnv runs bin/xe with an environment (HOME is the test's directory).
func (d *daemon) xeEnv(env []string, args ...string) run {
	d.t.Helper()
	cmd := exec.Command(d.xeBin, args...)
	cmd.Dir = d.dir
	cmd.Env = append([]string{"HOME=" + d.dir, "PATH=" + os.Getenv("PATH")}, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return run{out.String(), errb.String(), code}
}

// xe runs bin/xe against the daemon's TCP port as root.
func (d *daemon) xe(args ...string) run {
	d.t.Helper()
	return d.xeEnv(nil, append([]string{"-s", "127.0.0.1", "-p", d.port, "-pw", password}, args...)...)
}

// ok runs xe, insists on success, and returns stdout without the final
// newline.
func (d *daemon) ok(args ...string) string {
	d.t.Helper()
	r := d.xe(args...)
	if r.code != 0 {
		d.t.Fatalf("xe %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.out, r.err)
	}
	return strings.TrimSuffix(r.out, "\n")
}

// fails runs xe, insists on exit status 1, and returns stderr.
func (d *daemon) fails(args ...string) string {
	d.t.Helper()
	r := d.xe(args...)
	if r.code != 1 {
		d.t.Fatalf("xe %s: exit %d, want 1\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.out, r.err)
	}
	return r.err
}

// rpc makes a JSON-RPC call (for what xe cannot do yet, such as making
// a plain VM).
func (d *daemon) rpc(method string, params ...any) any {
	d.t.Helper()
	r, err := d.Client().Call(method, params...)
	if err != nil {
		d.t.Fatalf("%s: %v", method, err)
	}
	var out any
	if err := json.Unmarshal(r, &out); err != nil {
		d.t.Fatal(err)
	}
	return out
}

func (d *daemon) login() string {
	return d.rpc("session.login_with_password", "root", password, "", "e2e").(string)
}

// makeVMs creates n halted VMs from a template's record and returns
// their uuids.
func (d *daemon) makeVMs(n int, prefix string) []string {
	s := d.login()
	tmpl := d.rpc("VM.get_by_name_label", s, "Debian Bookworm 12").([]any)[0].(string)
	rec := d.rpc("VM.get_record", s, tmpl).(map[string]any)
	var uuids []string
	for i := range n {
		rec["name_label"] = fmt.Sprintf("%s%d", prefix, i)
		rec["is_a_template"] = false
		rec["is_default_template"] = false
		ref := d.rpc("VM.create", s, rec).(string)
		uuids = append(uuids, d.rpc("VM.get_uuid", s, ref).(string))
	}
	return uuids
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func TestListAndFilters(t *testing.T) {
	d := startDaemon(t)
	out := d.ok("host-list")
	if !strings.HasPrefix(out, "uuid ( RO)") || !strings.Contains(out, "name-label ( RW): ") {
		t.Fatalf("host-list:\n%s", out)
	}
	if n := len(split(d.ok("template-list", "--minimal"))); n != 4 {
		t.Fatalf("%d templates", n)
	}
	deb := d.ok("template-list", "name-label=Debian Bookworm 12", "--minimal")
	if len(split(deb)) != 1 {
		t.Fatalf("name filter: %q", deb)
	}
	linux := split(d.ok("template-list", "other-config:linux_template=true", "--minimal"))
	if len(linux) != 2 {
		t.Fatalf("map filter: %q", linux)
	}
	dom0 := d.ok("vm-list", "is-control-domain=true", "params=uuid", "--minimal")
	if got := d.ok("vm-list", "--minimal"); got != dom0 {
		t.Fatalf("vm-list %q, control domain %q", got, dom0)
	}
	if got := d.ok("vm-list", "power-state=Running", "params=power-state", "--minimal"); got != "running" {
		t.Fatalf("enum filter: %q", got)
	}
	vms := d.makeVMs(3, "e2e-vm-")
	got := split(d.ok("vm-list", "power-state=halted", "--minimal"))
	if len(got) != 3 {
		t.Fatalf("halted VMs: %q (made %q)", got, vms)
	}
	if got := d.ok("vm-list", "name-label=e2e-vm-1", "params=uuid", "--minimal"); got != vms[1] {
		t.Fatalf("by name: %q, want %q", got, vms[1])
	}
	rec := d.ok("vm-list", "uuid="+vms[0])
	want := fmt.Sprintf("uuid ( RO)           : %s\n     name-label ( RW): e2e-vm-0\n    power-state ( RO): halted\n\n", vms[0])
	if rec != want {
		t.Fatalf("record:\n%q\nwant\n%q", rec, want)
	}
	if out := d.ok("vm-list", "params=all", "uuid="+vms[0]); !strings.Contains(out, "other-config (MRW): ") ||
		!strings.Contains(out, "VBD-uuids (SRO): ") {
		t.Fatalf("params=all:\n%s", out)
	}
	if got := d.ok("vm-list", "tags:contains=nothing", "--minimal"); got != "" {
		t.Fatalf("set filter: %q", got)
	}
}

func TestParamsOnMapsAndSets(t *testing.T) {
	d := startDaemon(t)
	net := d.ok("network-create", "name-label=e2e-net", "MTU=9000")
	if got := d.ok("network-param-get", "uuid="+net, "param-name=MTU"); got != "9000" {
		t.Fatalf("MTU %q", got)
	}
	d.ok("network-param-set", "uuid="+net, "name-description=for tests", "other-config:a=1")
	d.ok("network-param-add", "uuid="+net, "param-name=other-config", "b=2", "c=3")
	if got := d.ok("network-param-get", "uuid="+net, "param-name=other-config"); got != "a: 1; b: 2; c: 3" {
		t.Fatalf("map %q", got)
	}
	d.ok("network-param-set", "uuid="+net, "other-config:a=one")
	if got := d.ok("network-param-get", "uuid="+net, "param-name=other-config", "param-key=a"); got != "one" {
		t.Fatalf("map key %q", got)
	}
	d.ok("network-param-remove", "uuid="+net, "param-name=other-config", "param-key=b")
	if got := d.ok("network-param-get", "uuid="+net, "param-name=other-config"); got != "a: one; c: 3" {
		t.Fatalf("after remove %q", got)
	}
	if e := d.fails("network-param-remove", "uuid="+net, "param-name=other-config", "param-key=b"); e != "Error: Key b is not in map\n" {
		t.Fatalf("remove again: %q", e)
	}
	d.ok("network-param-add", "uuid="+net, "param-name=tags", "param-key=blue")
	d.ok("network-param-add", "uuid="+net, "param-name=tags", "param-key=green")
	if got := d.ok("network-list", "tags:contains=green", "--minimal"); got != net {
		t.Fatalf("set filter %q", got)
	}
	d.ok("network-param-remove", "uuid="+net, "param-name=tags", "param-key=blue")
	if got := d.ok("network-param-get", "uuid="+net, "param-name=tags"); got != "green" {
		t.Fatalf("tags %q", got)
	}
	d.ok("network-param-clear", "uuid="+net, "param-name=other-config")
	d.ok("network-param-clear", "uuid="+net, "param-name=tags")
	if got := d.ok("network-param-list", "uuid="+net); !strings.Contains(got, "other-config (MRW): \n") || !strings.Contains(got, "tags (SRW): \n") ||
		!strings.Contains(got, "name-description ( RW): for tests\n") {
		t.Fatalf("param-list:\n%s", got)
	}
	if e := d.fails("network-param-set", "uuid="+net, "tags=x"); e != "Error: Cannot param-set on set fields\n" {
		t.Fatalf("set on a set: %q", e)
	}
	if e := d.fails("network-param-set", "uuid="+net, "bridge=x"); e != "Error: Field 'bridge' is read-only.\n" {
		t.Fatalf("read-only: %q", e)
	}
	if e := d.fails("network-param-set", "uuid="+net, "MTU=big"); e != "Error: Parameter MTU must be an integer\n" {
		t.Fatalf("bad int: %q", e)
	}
	d.ok("network-destroy", "uuid="+net)
	if e := d.fails("network-param-list", "uuid="+net); e != "Error code: UUID_INVALID\nError parameters: network, "+net+"\n" {
		t.Fatalf("after destroy: %q", e)
	}
}

func TestCreateDestroy(t *testing.T) {
	d := startDaemon(t)
	vm := d.makeVMs(1, "doomed-")[0]
	d.ok("vm-param-set", "uuid="+vm, "other-config:note=x", "VCPUs-at-startup=1")
	if got := d.ok("vm-param-get", "uuid="+vm, "param-name=VCPUs-at-startup"); got != "1" {
		t.Fatalf("VCPUs-at-startup %q", got)
	}
	net := d.ok("network-list", "params=uuid", "--minimal")
	vif := d.ok("vif-create", "vm-uuid="+vm, "network-uuid="+net, "device=0")
	if got := d.ok("vif-list", "vm-uuid="+vm, "params=uuid", "--minimal"); got != vif {
		t.Fatalf("vif-list %q want %q", got, vif)
	}
	vbd := d.ok("vbd-create", "vm-uuid="+vm, "device=3", "type=CD", "mode=RO")
	if got := d.ok("vbd-param-get", "uuid="+vbd, "param-name=empty"); got != "true" {
		t.Fatalf("empty CD: %q", got)
	}
	if got := d.ok("vm-param-get", "uuid="+vm, "param-name=VBD-uuids"); got != vbd {
		t.Fatalf("VBD-uuids %q", got)
	}
	d.ok("vm-uninstall", "uuid="+vm, "--force")
	if got := d.ok("vm-list", "uuid="+vm, "--minimal"); got != "" {
		t.Fatalf("VM still listed: %q", got)
	}
	vm2 := d.makeVMs(1, "destroyed-")[0]
	d.ok("vm-destroy", "uuid="+vm2)
	if e := d.fails("vm-destroy", "uuid="+vm2); !strings.Contains(e, "UUID_INVALID") {
		t.Fatalf("destroy twice: %q", e)
	}
}

func TestErrorsAndExitCodes(t *testing.T) {
	d := startDaemon(t)
	vm := d.makeVMs(1, "err-")[0]
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"no-such-command"}, "Unknown command: no-such-command\nFor usage run: 'xe help'\n"},
		{[]string{"vm-param-get", "uuid=" + vm}, "Required parameter not found: param-name\nFor usage run: 'xe help'\n"},
		{[]string{"network-create", "name-label=x", "colour=red"}, "Unknown parameter: colour\nFor usage run: 'xe help'\n"},
		{[]string{"vm-list", "stray"}, "Syntax error: malformed argument 'stray': expected name=value\nFor usage run: 'xe help'\n"},
		{[]string{"vm-list", "colour=red"}, "Error: Unknown field 'colour'\n"},
		{[]string{"vm-start", "vm=nothing"}, "Error: No matching VMs found\n"},
		{[]string{"vdi-import", "uuid=nope", "filename=/etc/hostname"}, "Error code: UUID_INVALID\nError parameters: VDI, nope\n"},
		{[]string{"pool-disable-external-auth"}, "Error code: NOT_IMPLEMENTED\nError parameters: pool-disable-external-auth\n"},
		{[]string{"vm-list", "-pw", "wrong"}, "Authentication failed\nFor usage run: 'xe help'\n"},
	} {
		if got := d.fails(c.args...); got != c.want {
			t.Errorf("xe %s:\n got %q\nwant %q", strings.Join(c.args, " "), got, c.want)
		}
	}
	// Two VMs match: --multiple is needed, and then each failure is
	// reported on its own line (halted VMs cannot be unpaused).
	d.makeVMs(1, "err-")
	r := d.xe("vm-unpause", "name-label=err-0")
	if r.code != 1 || r.err != "Error: Multiple matches VMs found. --multiple required to complete the operation\n" {
		t.Fatalf("multiple: %d %q", r.code, r.err)
	}
	r = d.xe("vm-unpause", "name-label=err-0", "--multiple")
	if r.code != 1 || strings.Count(r.out, "operation failed on ") != 2 {
		t.Fatalf("--multiple: %d %q %q", r.code, r.out, r.err)
	}
	// A server that is not there, and one that is not a CLI server.
	r = d.xeEnv(nil, "vm-list", "-s", "127.0.0.1", "-p", "1")
	if r.code != 1 || !strings.Contains(r.err, "Unable to contact server") {
		t.Fatalf("no server: %d %q", r.code, r.err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	r = d.xeEnv(nil, "vm-list", "-s", "127.0.0.1", "-p", port)
	if r.code != 1 || r.err != "Server internal error.\n" {
		t.Fatalf("HTTP server: %d %q", r.code, r.err)
	}
}

func TestLocalSocketAndFiles(t *testing.T) {
	d := startDaemon(t)
	env := []string{"TOOLSTACKD_SOCKET=" + d.socket()}
	// No server named: the local socket, as the superuser, no password.
	r := d.xeEnv(env, "host-list", "params=uuid", "--minimal")
	if r.code != 0 || len(r.out) != 37 {
		t.Fatalf("local: %d %q %q", r.code, r.out, r.err)
	}
	r = d.xeEnv(env, "pool-dump-database", "file-name=pool.db")
	if r.code != 0 {
		t.Fatalf("dump: %d %q", r.code, r.err)
	}
	b, err := os.ReadFile(filepath.Join(d.dir, "pool.db"))
	if err != nil || !bytes.Contains(b, []byte("<database>")) {
		t.Fatalf("dump file: %v %.100q", err, b)
	}
	r = d.xeEnv(env, "pool-dump-database", "file-name=pool.db")
	if r.code != 1 || !strings.Contains(r.err, "Operation failed. Error:") {
		t.Fatalf("dump over an existing file: %d %q", r.code, r.err)
	}
	r = d.xeEnv(env, "pool-restore-database", "file-name=pool.db")
	if r.code != 0 {
		t.Fatalf("restore: %d %q", r.code, r.err)
	}
	r = d.xeEnv(env, "vdi-import", "uuid=x", "filename=pool.db")
	if r.code != 1 || r.err != "Error code: UUID_INVALID\nError parameters: VDI, x\n" {
		t.Fatalf("vdi-import of no VDI: %d %q", r.code, r.err)
	}
	// XE_EXTRA_ARGS and ~/.xe.
	os.WriteFile(filepath.Join(d.dir, ".xe"), []byte("server=127.0.0.1\nport="+d.port+"\n"), 0o600)
	r = d.xeEnv([]string{"XE_EXTRA_ARGS=password=" + password + ",params=uuid"}, "host-list", "--minimal")
	if r.code != 0 || len(r.out) != 37 {
		t.Fatalf("rc and XE_EXTRA_ARGS: %d %q %q", r.code, r.out, r.err)
	}
	r = d.xeEnv(nil, "host-list")
	if r.code != 1 || !strings.Contains(r.err, "Authentication failed") {
		t.Fatalf("rc without a password: %d %q", r.code, r.err)
	}
}

// TestVMLifecycle drives the VM calls through xe (the simulator backend
// runs them).
func TestVMLifecycle(t *testing.T) {
	d := startDaemon(t)
	vm := d.makeVMs(1, "life-")[0]
	d.ok("vm-start", "uuid="+vm)
	if got := d.ok("vm-list", "uuid="+vm, "params=power-state", "--minimal"); got != "running" {
		t.Fatalf("after vm-start: %q", got)
	}
	if e := d.fails("vm-start", "uuid="+vm); !strings.HasPrefix(e, "Error code: ") {
		t.Fatalf("second start: %q", e)
	}
	d.ok("vm-pause", "vm=life-0")
	d.ok("vm-unpause", "vm=life-0")
	d.ok("vm-shutdown", "vm=life-0", "--force")
	if got := d.ok("vm-param-get", "uuid="+vm, "param-name=power-state"); got != "halted" {
		t.Fatalf("after vm-shutdown: %q", got)
	}
	clone := d.ok("vm-clone", "vm=life-0", "new-name-label=life-clone", "new-name-description=a clone")
	if got := d.ok("vm-param-get", "uuid="+clone, "param-name=name-description"); got != "a clone" {
		t.Fatalf("clone: %q", got)
	}
	inst := d.ok("vm-install", "template=Other install media", "new-name-label=installed")
	if got := d.ok("vm-list", "uuid="+inst, "params=name-label,is-a-template", "--minimal"); got != "installed" {
		t.Fatalf("vm-install: %q", got)
	}
	if got := d.ok("vm-param-get", "uuid="+inst, "param-name=is-a-template"); got != "false" {
		t.Fatalf("installed VM is a template: %q", got)
	}
}

// TestDiskTransfer uploads a file into a new disk with vdi-import and
// reads it back with vdi-export.
func TestDiskTransfer(t *testing.T) {
	d := startDaemon(t)
	sr := d.ok("pool-param-get", "uuid="+d.ok("pool-list", "--minimal"), "param-name=default-SR")
	vdi := d.ok("vdi-create", "sr-uuid="+sr, "name-label=e2e-disk", "virtual-size=8MiB")
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7 / 5)
	}
	os.WriteFile(filepath.Join(d.dir, "in.raw"), data, 0o644)
	d.ok("vdi-import", "uuid="+vdi, "filename=in.raw")
	d.ok("vdi-export", "uuid="+vdi, "filename=out.raw")
	got, err := os.ReadFile(filepath.Join(d.dir, "out.raw"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("exported %d bytes (%v), differ from the imported ones", len(got), err)
	}
	// A file not named on the command line is refused by the client, so
	// the server can only use the one given.
	if e := d.fails("vdi-export", "uuid="+vdi, "filename=out.raw"); !strings.Contains(e, "Operation failed. Error:") {
		t.Fatalf("export over an existing file: %q", e)
	}
	d.ok("vdi-destroy", "uuid="+vdi)
}

func TestEventWait(t *testing.T) {
	d := startDaemon(t)
	net := d.ok("network-list", "params=uuid", "--minimal")
	done := make(chan run, 1)
	go func() { done <- d.xe("event-wait", "class=network", "other-config:ready=yes") }()
	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("returned early: %+v", r)
	default:
	}
	d.ok("network-param-set", "uuid="+net, "other-config:ready=yes")
	select {
	case r := <-done:
		if r.code != 0 {
			t.Fatalf("event-wait: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("event-wait did not return")
	}
	d.ok("event-wait", "class=network", "MTU=/=1")
}

func TestHelpAndCompletion(t *testing.T) {
	d := startDaemon(t)
	if out := d.ok("help"); !strings.Contains(out, "vm-list") || !strings.HasPrefix(out, "Usage: xe") {
		t.Fatalf("help:\n%s", out)
	}
	all := split(d.ok("help", "--all", "--minimal"))
	if len(all) < 300 || !contains(all, "host-param-set") || !contains(all, "vm-install") {
		t.Fatalf("help --all: %d commands", len(all))
	}
	if out := d.ok("help", "vm-param-get"); !strings.Contains(out, "reqd params: uuid, param-name") {
		t.Fatalf("help vm-param-get:\n%s", out)
	}
	r := d.xeEnv(nil, "completion", "bash")
	if r.code != 0 || !strings.Contains(r.out, "__start_xe") {
		t.Fatalf("completion script: %d %.200q %q", r.code, r.out, r.err)
	}
	r = d.xeEnv(nil, "__complete", "-s", "127.0.0.1", "-p", d.port, "-pw", password, "network-param-l")
	if r.code != 0 || !strings.HasPrefix(r.out, "network-param-list\n") {
		t.Fatalf("__complete: %d %q %q", r.code, r.out, r.err)
	}
	net := d.ok("network-list", "params=uuid", "--minimal")
	r = d.xeEnv(nil, "__complete", "-s", "127.0.0.1", "-p", d.port, "-pw", password, "network-param-list", "uuid=")
	if r.code != 0 || !strings.HasPrefix(r.out, "uuid="+net+"\n") {
		t.Fatalf("__complete uuid: %d %q %q", r.code, r.out, r.err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
