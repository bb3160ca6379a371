// Package integration runs the real daemon with the real QEMU backend and
// checks how the layers meet: a VM started through the API gets its disk
// from the storage layer's datapath.
package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

type daemon struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
	log  bytes.Buffer
	sess string
}

func startDaemon(t *testing.T, backend string) *daemon {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(t.TempDir(), "toolstackd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/toolstackd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d := &daemon{t: t, addr: addr}
	d.cmd = exec.Command(bin, "--data-dir", t.TempDir(), "--listen", addr, "--backend", backend)
	d.cmd.Env = append(os.Environ(), "TOOLSTACKD_ROOT_PASSWORD=pw", "TOOLSTACKD_QEMU_ACCEL=tcg")
	d.cmd.Stdout, d.cmd.Stderr = &d.log, &d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.cmd.Process.Signal(os.Interrupt)
		d.cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not start:\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.sess = d.str(d.call("session.login_with_password", "root", "pw"))
	return d
}

func (d *daemon) call(method string, params ...any) json.RawMessage {
	d.t.Helper()
	if method != "session.login_with_password" {
		params = append([]any{d.sess}, params...)
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	resp, err := http.Post("http://"+d.addr+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Result json.RawMessage
		Error  *struct {
			Message string
			Data    []string
		}
	}
	json.NewDecoder(resp.Body).Decode(&out)
	if out.Error != nil {
		d.t.Fatalf("%s: %s %v", method, out.Error.Message, out.Error.Data)
	}
	return out.Result
}

func (d *daemon) str(raw json.RawMessage) string {
	var s string
	json.Unmarshal(raw, &s)
	return s
}

// qemuCmdline finds the QEMU process of a VM by its uuid.
func qemuCmdline(uuid string) string {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, "qemu-system") && strings.Contains(cmd, uuid) {
			return cmd
		}
	}
	return ""
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
	cmd := qemuCmdline(uuid)
	if cmd == "" {
		t.Fatal("no QEMU process for the VM")
	}
	// The disk QEMU opens is the file SR's image of this VDI, handed over
	// by the storage layer's datapath.
	if !strings.Contains(cmd, vdiUUID) {
		t.Errorf("QEMU does not open the VDI %s:\n%s", vdiUUID, cmd)
	}
	var attached bool
	json.Unmarshal(d.call("VBD.get_currently_attached", vbd), &attached)
	if !attached || d.str(d.call("VM.get_power_state", vm)) != "Running" {
		t.Error("VM not running with its disk attached")
	}
	// While the VM holds the disk read-write, destroying it is refused.
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "VDI.destroy", "params": []any{d.sess, vdi}})
	resp, err := http.Post("http://"+d.addr+"/jsonrpc", "application/json", bytes.NewReader(body))
	if err == nil {
		var out struct{ Error *struct{ Message string } }
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if out.Error == nil {
			t.Error("VDI.destroy of a disk in use succeeded")
		}
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
