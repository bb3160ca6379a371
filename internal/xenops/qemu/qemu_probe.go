package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// What "auto" acceleration means is decided once, when the backend
// starts: KVM only if /dev/kvm is usable AND a QEMU with the CPU model
// guests will get actually runs a VCPU under it. A usable /dev/kvm is
// not enough: under nested KVM, `-cpu host` makes QEMU abort at start
// with "failed to set MSR ...", and every VM.start would fail. When the
// probe fails, guests run under TCG, a warning is logged and the host
// record says so (other_config:accelerator and accelerator_reason).

// probeTimeout bounds the whole probe.
const probeTimeout = 15 * time.Second

// cpuModel is the -cpu a domain gets under accel.
func (q *QEMU) cpuModel(accel string) string {
	if q.cfg.CPUModel != "" {
		return q.cfg.CPUModel
	}
	if accel == "kvm" {
		return "host"
	}
	return "max"
}

func (q *QEMU) machine() string {
	if q.cfg.Machine != "" {
		return q.cfg.Machine
	}
	return "pc"
}

// detectAccel settles q.auto for "auto" (and records why).
func (q *QEMU) detectAccel() {
	switch q.cfg.Accel {
	case "tcg", "kvm":
		q.auto, q.autoReason = q.cfg.Accel, "configured"
		return
	}
	if ok, why := q.cfg.KVMCheck(q.cfg.KVMDevice); !ok {
		q.auto, q.autoReason = "tcg", "KVM unusable: "+why
		return
	}
	cpu := q.cpuModel("kvm")
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	start := time.Now()
	if err := probeAccel(ctx, q.cfg.Binary, "kvm", cpu, q.machine()); err != nil {
		q.auto = "tcg"
		q.autoReason = truncate(fmt.Sprintf("QEMU cannot run -cpu %s under KVM: %v", cpu, err), 500)
		q.log.Warn("qemu: KVM is present but unusable with this CPU model; guests run under TCG (slow)",
			"cpu", cpu, "err", err)
		return
	}
	q.auto, q.autoReason = "kvm", "probed: a VCPU ran with -cpu "+cpu
	q.log.Info("qemu: KVM works", "cpu", cpu, "probe", time.Since(start).Round(time.Millisecond))
}

// Accelerator is what "auto" chose and why.
func (q *QEMU) Accelerator() (accel, reason string) { return q.auto, q.autoReason }

// probeAccel starts binary under accel with one VCPU of the cpu model,
// no devices and no display, monitored over QMP on stdin/stdout, lets
// the VCPU run briefly and checks it still runs; then quits it. A QEMU
// that aborts while setting up the VCPU (nested KVM's "failed to set
// MSR") never answers, and its stderr is the error.
func probeAccel(ctx context.Context, binary, accel, cpu, machine string) error {
	cmd := exec.CommandContext(ctx, binary, //nolint:gosec // the configured QEMU binary; no shell
		"-machine", machine+",accel="+accel, "-cpu", cpu, "-m", "32", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-S", "-qmp", "stdio")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	waited := false
	defer func() {
		_ = in.Close()
		if !waited {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}()
	fail := func(err error) error {
		_ = in.Close()
		_ = cmd.Wait()
		waited = true
		if msg := lastLines(stderr.String(), 3); msg != "" {
			return errors.New(msg)
		}
		return err
	}
	if err := probeVCPU(ctx, &stdioQMP{in: in, sc: bufio.NewScanner(io.LimitReader(out, 1<<20))}, accel); err != nil {
		return fail(err)
	}
	_ = in.Close()
	_ = cmd.Wait()
	waited = true
	return nil
}

// probeVCPU is the probe's conversation with the emulator: it checks that
// KVM is enabled (under kvm), lets the VCPU run for a moment and checks it
// still runs, then asks the emulator to quit.
func probeVCPU(ctx context.Context, mon *stdioQMP, accel string) error {
	if _, err := mon.execute("qmp_capabilities"); err != nil {
		return err
	}
	if accel == "kvm" {
		r, err := mon.execute("query-kvm")
		if err != nil {
			return err
		}
		var k struct{ Enabled, Present bool }
		if json.Unmarshal(r, &k) != nil || !k.Enabled {
			return errors.New("KVM not enabled in the emulator")
		}
	}
	if _, err := mon.execute("cont"); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(300 * time.Millisecond):
	}
	r, err := mon.execute("query-status")
	if err != nil {
		return err
	}
	var st struct{ Status string }
	_ = json.Unmarshal(r, &st) // an unreadable status is not "running": the check below fails
	if st.Status != "running" {
		return fmt.Errorf("the VCPU stopped: status %q", st.Status)
	}
	_, _ = mon.execute("quit")
	return nil
}

// stdioQMP is a QMP conversation over an emulator's stdin and stdout
// (-qmp stdio), one command at a time, for the probe.
type stdioQMP struct {
	in io.Writer
	sc *bufio.Scanner
}

// execute sends a command without arguments and returns its reply's
// "return" or its error.
func (q *stdioQMP) execute(cmd string) (json.RawMessage, error) {
	if _, err := fmt.Fprintf(q.in, `{"execute":%q}`+"\n", cmd); err != nil {
		return nil, errors.New("the emulator exited")
	}
	return q.reply()
}

// reply skips the greeting and events and returns the next reply's
// "return" or its error.
func (q *stdioQMP) reply() (json.RawMessage, error) {
	for q.sc.Scan() {
		var m struct {
			QMP    json.RawMessage
			Return json.RawMessage
			Error  *struct{ Desc string }
			Event  string
		}
		if json.Unmarshal(q.sc.Bytes(), &m) != nil || m.Event != "" || m.QMP != nil {
			continue
		}
		if m.Error != nil {
			return nil, errors.New(m.Error.Desc)
		}
		return m.Return, nil
	}
	return nil, errors.New("the emulator exited")
}

// lastLines is the last n non-empty lines of s, joined by "; ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
