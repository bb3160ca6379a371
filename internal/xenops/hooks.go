package xenops

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"toolstackd/internal/safepath"
	"toolstackd/internal/xerr"
)

// Hooks are executables in HooksDir/<hook>/, run in file-name order with
// the arguments xenopsd gives: -vmuuid UUID -reason REASON. As in
// xenopsd, a script that exits 1 fails the operation (XAPI_HOOK_FAILED);
// other exit codes are logged and ignored. A script that outlives the
// hook timeout is killed (with its process group) and fails the
// operation too.
const (
	hookPreStart    = "vm-pre-start"
	hookPreShutdown = "vm-pre-shutdown" // before a domain is destroyed
	hookPostDestroy = "vm-post-destroy" // after a domain is destroyed
	hookPreReboot   = "vm-pre-reboot"
	hookPreResume   = "vm-pre-resume"
	hookPostResume  = "vm-post-resume"
)

// Hook reasons.
const (
	reasonNone          = "none"
	reasonCleanShutdown = "clean-shutdown"
	reasonHardShutdown  = "hard-shutdown"
	reasonCleanReboot   = "clean-reboot"
	reasonHardReboot    = "hard-reboot"
	reasonSuspend       = "suspend"
)

// runHooks runs one hook point's scripts for a VM.
func (m *Manager) runHooks(ctx context.Context, hook, vmUUID, reason string) error {
	if m.cfg.HooksDir == "" {
		return nil
	}
	dir, err := safepath.JoinName(m.cfg.HooksDir, hook)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // no such hook point
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 {
			continue
		}
		path, err := safepath.JoinName(dir, e.Name())
		if err != nil {
			continue
		}
		if err := m.runHook(ctx, path, hook+"/"+e.Name(), vmUUID, reason); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) runHook(ctx context.Context, path, name, vmUUID, reason string) error {
	hctx, cancel := context.WithTimeout(ctx, m.cfg.HookTimeout)
	defer cancel()
	var out, stderr bytes.Buffer
	cmd := exec.CommandContext(hctx, path, "-vmuuid", vmUUID, "-reason", reason) //nolint:gosec // running the operator's hook scripts is the point; argv, no shell
	cmd.Stdout, cmd.Stderr = &out, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	err := cmd.Run()
	m.log.Debug("hook ran", "hook", name, "vm", vmUUID, "reason", reason, "took", time.Since(start), "err", err)
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if hctx.Err() != nil {
		m.log.Warn("hook timed out", "hook", name, "vm", vmUUID, "timeout", m.cfg.HookTimeout)
		return xerr.New(xerr.XapiHookFailed, name, reason, truncate(out.String(), 2000), "timeout after "+m.cfg.HookTimeout.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if code == 1 {
			m.log.Warn("hook failed", "hook", name, "vm", vmUUID, "stderr", truncate(stderr.String(), 500))
			return xerr.New(xerr.XapiHookFailed, name, reason, truncate(out.String(), 2000), strconv.Itoa(code))
		}
		m.log.Info("hook exited non-zero; ignored", "hook", name, "vm", vmUUID, "code", code)
		return nil
	}
	m.log.Warn("hook could not run", "hook", name, "err", err)
	return nil
}

// truncate shortens s to n bytes for an error message or a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
