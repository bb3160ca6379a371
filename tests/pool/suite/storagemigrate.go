package suite

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/internal/xerr"
)

// StoragePool starts a pool of two hosts (o may add flags): calls
// through host 0, the hosts' refs by index.
func StoragePool(t *testing.T, ctx context.Context, o pooltest.Options) (*pooltest.Pool, RPC, map[int]string) {
	t.Helper()
	o.Hosts = 2
	p, r, hosts := Joined(t, ctx, o)
	// A member plugs its SRs again as it joins: wait for its local SR.
	sr := r.LocalSR(hosts[1])
	WaitUntil(t, 60*time.Second, "host 1's local SR to be plugged", func() bool {
		v, err := r.C.Call(ctx, r.At, "VDI.create", r.S, map[string]any{"name_label": "probe", "name_description": "", "SR": sr,
			"virtual_size": 1 << 20, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
			"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
		if err != nil {
			return false
		}
		var ref string
		_ = json.Unmarshal(v, &ref)
		r.Call("VDI.destroy", ref)
		return true
	})
	return p, r, hosts
}

// DestMap is host.migrate_receive for host over its management network.
func DestMap(r RPC, host string) map[string]string {
	r.T.Helper()
	var pifs map[string]map[string]any
	if err := json.Unmarshal(r.Call("PIF.get_all_records"), &pifs); err != nil {
		r.T.Fatal(err)
	}
	network := ""
	for _, p := range pifs {
		if p["host"] == host && p["management"] == true {
			network = p["network"].(string)
		}
	}
	if network == "" {
		r.T.Fatalf("host %s has no management PIF", host)
	}
	var dest map[string]string
	if err := json.Unmarshal(r.Call("host.migrate_receive", host, network, map[string]string{}), &dest); err != nil {
		r.T.Fatal(err)
	}
	for _, k := range []string{"SM", "host", "xenops", "session_id", "master"} {
		if dest[k] == "" {
			r.T.Fatalf("host.migrate_receive: no %q in %v", k, dest)
		}
	}
	if dest["host"] != host || dest["session_id"] != r.S || !strings.HasPrefix(dest["xenops"], "http://") {
		r.T.Fatalf("host.migrate_receive: %v", dest)
	}
	return dest
}

// VMDisk is a VM's one VBD and its VDI.
func VMDisk(r RPC, vm string) (vbd, vdi string) {
	r.T.Helper()
	var vbds []string
	if err := json.Unmarshal(r.Call("VM.get_VBDs", vm), &vbds); err != nil || len(vbds) != 1 {
		r.T.Fatalf("VM.get_VBDs: %v %v", vbds, err)
	}
	return vbds[0], r.Str("VBD.get_VDI", vbds[0])
}

// SRVDIs counts the VDIs of an SR.
func SRVDIs(r RPC, sr string) int {
	r.T.Helper()
	var vdis []string
	if err := json.Unmarshal(r.Call("SR.get_VDIs", sr), &vdis); err != nil {
		r.T.Fatal(err)
	}
	return len(vdis)
}

// MigrateSendArgs are VM.migrate_send's arguments after the session.
func MigrateSendArgs(vm string, dest map[string]string, vdiMap, vifMap, options map[string]string) []any {
	return []any{vm, dest, true, vdiMap, vifMap, options, map[string]string{}, map[string]string{}}
}

// WritePattern fills a VDI with a known pattern through /import_raw_vdi
// and returns its checksum.
func WritePattern(t *testing.T, r RPC, addr, vdi string, size int) [32]byte {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data[:1<<20]); err != nil {
		t.Fatal(err)
	}
	for off := 1 << 20; off+1<<20 <= size; off += 1 << 20 {
		copy(data[off:], data[:1<<20]) // no run of zeroes: every block is copied
	}
	q := url.Values{"session_id": {r.S}, "vdi": {vdi}, "format": {"raw"}}
	if st, msg := Transfer(t, http.MethodPut, addr, "/import_raw_vdi", q, data); st != http.StatusOK {
		t.Fatalf("import: %d %s", st, msg)
	}
	return sha256.Sum256(data)
}

// ReadDisk reads a VDI whole through /export_raw_vdi.
func ReadDisk(t *testing.T, r RPC, addr, vdi string) []byte {
	t.Helper()
	q := url.Values{"session_id": {r.S}, "vdi": {vdi}, "format": {"raw"}}
	st, got := Transfer(t, http.MethodGet, addr, "/export_raw_vdi", q, nil)
	if st != http.StatusOK {
		t.Fatalf("export: %d %s", st, got)
	}
	return got
}

// VMDiskVDI is the VDI of the VM's disk.
func VMDiskVDI(r RPC, vm string) string { _, v := VMDisk(r, vm); return v }

// DaemonCLI runs xe (the thin CLI, as a process) against the first
// host as root, failing the test on an error; it returns the output.
func DaemonCLI(t *testing.T, r RPC, pw string) func(args ...string) string {
	t.Helper()
	xe := testdaemon.BuildCommand(t, "xe", "XE_BIN")
	host, port, _ := net.SplitHostPort(r.At)
	return func(args ...string) string {
		t.Helper()
		cctx, cancel := context.WithTimeout(r.Ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cctx, xe, append([]string{"-s", host, "-p", port, "-u", "root", "-pw", pw}, args...)...)
		cmd.Env = os.Environ()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("xe %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
}

// FileNamed is the path of the one file under dir whose name contains
// part.
func FileNamed(t *testing.T, dir, part string) string {
	t.Helper()
	var found []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(d.Name(), part) {
			found = append(found, path)
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("files named %s under %s: %v", part, dir, found)
	}
	return found[0]
}

// CheckMoved checks a VM that moved to host to with its disk: running
// there, its VBD on a new VDI of sr, the old VDI gone.
func CheckMoved(t *testing.T, r RPC, vm, oldVDI, sr, host string) string {
	t.Helper()
	s := VMWhere(r, vm)
	if s.Power != "Running" || s.On != host || len(s.Ops) != 0 {
		t.Fatalf("after the move: %+v", s)
	}
	vbd, vdi := VMDisk(r, vm)
	if vdi == oldVDI || r.Str("VDI.get_SR", vdi) != sr {
		t.Fatalf("the VBD is on %s (SR %s), want a new VDI on %s", vdi, r.Str("VDI.get_SR", vdi), sr)
	}
	if string(r.Call("VBD.get_currently_attached", vbd)) != "true" {
		t.Fatal("the VBD is not attached after the move")
	}
	if _, err := r.C.Call(r.Ctx, r.At, "VDI.get_uuid", r.S, oldVDI); pooltest.Code(err) != xerr.HandleInvalid {
		t.Fatalf("the old VDI after the move: %v", err)
	}
	return vdi
}

// VMWithDisk makes a VM with one disk of size bytes on sr.
func VMWithDisk(r RPC, name, disk, sr string, size int64) (vm, vdi string) {
	r.T.Helper()
	vm = r.Str("VM.create", testdaemon.VMRecord(name))
	vdi = r.Str("VDI.create", map[string]any{"name_label": disk, "name_description": "", "SR": sr,
		"virtual_size": size, "type": "user", "sharable": false, "read_only": false, "other_config": map[string]string{},
		"xenstore_data": map[string]string{}, "sm_config": map[string]string{}, "tags": []string{}})
	r.Call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW", "type": "Disk",
		"empty": false, "other_config": map[string]string{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]string{}})
	return vm, vdi
}

// StartTicking starts the tick guest vm on hosts[at] and waits for its
// first ticks: its uuid and the log of its ticks.
func StartTicking(t *testing.T, g TickGuestFiles, p *pooltest.Pool, r RPC, vm string, hosts map[int]string, at int) (string, *TickLog) {
	t.Helper()
	uuid := r.Str("VM.get_uuid", vm)
	g.SetOn(r, vm)
	t.Cleanup(func() { KillQEMUs(uuid) })
	r.Call("VM.start_on", vm, hosts[at], false, false)
	ticks := &TickLog{}
	t.Cleanup(ticks.Close)
	if _, err := ticks.Follow(p.Hosts[at].DataDir, uuid, at); err != nil {
		t.Fatal(err)
	}
	ticks.Wait(t, at, 3, 2*time.Minute)
	return uuid, ticks
}
