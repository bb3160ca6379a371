// Package integration runs the real daemon with the real QEMU backend and
// checks how the layers meet: a VM started through the API gets its disk
// from the storage layer's datapath.
package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// daemon is a running toolstackd with a root session.
type daemon struct {
	*testdaemon.Daemon
	t    *testing.T
	sess string
}

func startDaemon(t *testing.T, backend string) *daemon {
	t.Helper()
	d := &daemon{t: t}
	d.Daemon = testdaemon.Start(t, testdaemon.Options{Backend: backend, Password: "pw", Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"},
		StartTimeout: 20 * time.Second})
	d.sess = d.str(d.call("session.login_with_password", "root", "pw"))
	return d
}

// call makes a JSON-RPC call with the session that must succeed.
func (d *daemon) call(method string, params ...any) json.RawMessage {
	d.t.Helper()
	if method != "session.login_with_password" {
		params = append([]any{d.sess}, params...)
	}
	r, err := d.Client().Call(method, params...)
	if err != nil {
		d.t.Fatalf("%s: %v", method, err)
	}
	return r
}

func (d *daemon) str(raw json.RawMessage) string {
	s, _ := testdaemon.String(raw)
	return s
}

// qemuCmdline finds the QEMU process of a VM by its uuid.
func qemuCmdline(uuid string) string {
	cmd, _ := qemuProcess(uuid)
	return cmd
}

// qemuProcess is the command line and the open files (their paths, one
// per line) of the QEMU process of the VM with uuid.
func qemuProcess(uuid string) (cmd, files string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if !strings.Contains(cmd, "qemu-system") || !strings.Contains(cmd, uuid) {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		var open []string
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); err == nil {
				open = append(open, l)
			}
		}
		return cmd, strings.Join(open, "\n")
	}
	return "", ""
}

func TestVMGetsItsDiskFromTheDatapath(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	d := startDaemon(t, "qemu")
	var pools map[string]map[string]any
	json.Unmarshal(d.call("pool.get_all_records"), &pools)
	var sr string
	for _, p := range pools {
		sr = p["default_SR"].(string)
	}
	vdi := d.str(d.call("VDI.create", map[string]any{"name_label": "root disk", "SR": sr, "virtual_size": fmt.Sprint(32 << 20),
		"type": "user", "sharable": false, "read_only": false, "other_config": map[string]any{}}))
	vdiUUID := d.str(d.call("VDI.get_uuid", vdi))
	var tmpls []string
	json.Unmarshal(d.call("VM.get_by_name_label", "Other install media"), &tmpls)
	vm := d.str(d.call("VM.clone", tmpls[0], "datapath-test"))
	d.call("VM.provision", vm)
	mem := fmt.Sprint(128 << 20)
	d.call("VM.set_memory_limits", vm, mem, mem, mem, mem)
	vbd := d.str(d.call("VBD.create", map[string]any{"VM": vm, "VDI": vdi, "userdevice": "0", "bootable": true, "mode": "RW",
		"type": "Disk", "empty": false, "other_config": map[string]any{}, "qos_algorithm_type": "", "qos_algorithm_params": map[string]any{}}))
	d.call("VM.start", vm, false, false)
	uuid := d.str(d.call("VM.get_uuid", vm))
	cmd, files := qemuProcess(uuid)
	if cmd == "" {
		t.Fatal("no QEMU process for the VM")
	}
	// The disk QEMU opens is the file SR's image of this VDI, handed over
	// by the storage layer's datapath (and, QEMU jailed, opened for it).
	if !strings.Contains(files, vdiUUID) {
		t.Errorf("QEMU does not hold the VDI %s:\n%s\n%s", vdiUUID, cmd, files)
	}
	var attached bool
	json.Unmarshal(d.call("VBD.get_currently_attached", vbd), &attached)
	if !attached || d.str(d.call("VM.get_power_state", vm)) != "Running" {
		t.Error("VM not running with its disk attached")
	}
	// While the VM holds the disk read-write, destroying it is refused.
	if _, err := d.Client().Call("VDI.destroy", d.sess, vdi); err == nil {
		t.Error("VDI.destroy of a disk in use succeeded")
	}
	d.call("VM.hard_shutdown", vm)
	if qemuCmdline(uuid) != "" {
		t.Error("QEMU still running after hard_shutdown")
	}
	json.Unmarshal(d.call("VBD.get_currently_attached", vbd), &attached)
	if attached {
		t.Error("VBD still attached after shutdown")
	}
	// Released by the datapath, the disk can go.
	d.call("VBD.destroy", vbd)
	d.call("VDI.destroy", vdi)
}
