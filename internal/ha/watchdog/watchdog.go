// Package watchdog owns a host's watchdog for HA (docs/ha.md, "The
// watchdog"): HA pets it while the host may still run protected VMs, and
// when the petting stops the machine is reset within the watchdog's
// timeout. Nothing else in the process touches the device.
//
// Two kinds:
//
//   - A device (/dev/watchdog: softdog or a hardware watchdog), opened
//     with its timeout set; any byte written pets it, and Disarm writes
//     the magic 'V' before closing, so that a clean stop (HA disabled)
//     does not reset the machine. systemd's runtime watchdog must not use
//     the same device.
//   - A fake, for tests on machines where resetting is not an option: a
//     separate process (toolstackd fake-watchdog) fed pets through a
//     pipe, which kills the host's whole process group when it is not
//     petted in time: what a reset looks like from outside. It outlives
//     a daemon that dies, as a real watchdog does, and fires then too
//     unless it was disarmed.
package watchdog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Watchdog is a armed watchdog.
type Watchdog interface {
	// Pet postpones the reset by the watchdog's timeout.
	Pet() error
	// Disarm stops the watchdog without a reset and releases it.
	Disarm() error
}

// Open arms the watchdog spec names: "fake" (the fake process, started
// with extra arguments args) or a device path, with timeout.
func Open(spec string, timeout time.Duration, args ...string) (Watchdog, error) {
	if spec == "fake" {
		return StartFake(timeout, args...)
	}
	return OpenDevice(spec, timeout)
}

// writer is an armed watchdog of either kind: a device, or the pipe to
// the fake. Any byte pets it; 'V' before the close disarms it.
type writer struct {
	mu sync.Mutex
	f  *os.File
}

func (w *writer) Pet() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return os.ErrClosed
	}
	_, err := w.f.Write([]byte{0})
	return err
}

func (w *writer) Disarm() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	_, err := w.f.Write([]byte("V"))
	err = errors.Join(err, w.f.Close())
	w.f = nil
	return err
}

// OpenDevice opens a watchdog device and sets its timeout (whole
// seconds, at least one).
func OpenDevice(path string, timeout time.Duration) (Watchdog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0) //nolint:gosec // the operator's --watchdog device
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	secs := max(int(timeout/time.Second), 1)
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.WDIOC_SETTIMEOUT, secs); err != nil {
		_, _ = f.Write([]byte("V")) // a device we cannot set up is not left armed
		_ = f.Close()
		return nil, fmt.Errorf("watchdog: setting the timeout of %s to %d s: %w", path, secs, err)
	}
	return &writer{f: f}, nil
}

// FakeCommand is the toolstackd subcommand the fake runs as.
const FakeCommand = "fake-watchdog"

// StartFake starts the fake watchdog process for this process's group,
// with extra arguments args for its command. This process must lead its
// own process group (syscall.Setpgid(0, 0) at start), or the fake would
// kill whatever group it was started in.
func StartFake(timeout time.Duration, args ...string) (Watchdog, error) {
	if syscall.Getpgrp() != os.Getpid() {
		return nil, errors.New("watchdog: the fake needs this process to lead its own process group")
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, append([]string{FakeCommand, "--timeout", timeout.String(), "--pgid", strconv.Itoa(os.Getpid())}, args...)...) //nolint:gosec // this very binary
	cmd.ExtraFiles = []*os.File{r}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // outside the group it kills
	if err := cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		return nil, err
	}
	_ = r.Close()
	go func() { _ = cmd.Wait() }() // reaped whenever it ends
	return &writer{f: w}, nil
}

// RunFake is the fake watchdog's process: it reads pets from in and,
// when none comes for timeout, calls fired (if not nil) and kills process
// group pgid with SIGKILL, and returns. A 'V' followed by the end of in
// disarms it; the end of in without one (the host died) leaves it
// counting, as a device would.
func RunFake(in io.Reader, pgid int, timeout time.Duration, fired func()) error {
	if pgid <= 1 {
		return fmt.Errorf("watchdog: refusing process group %d", pgid)
	}
	pets := make(chan byte, 16)
	go func() {
		defer close(pets)
		b := make([]byte, 64)
		for {
			n, err := in.Read(b)
			for _, c := range b[:n] {
				pets <- c
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	disarming := false
	for {
		select {
		case c, ok := <-pets:
			if !ok {
				if disarming {
					return nil
				}
				pets = nil // the host is gone: keep counting
				continue
			}
			disarming = c == 'V'
			timer.Reset(timeout)
		case <-timer.C:
			fmt.Fprintf(os.Stderr, "fake watchdog: not petted for %v: killing process group %d\n", timeout, pgid)
			err := syscall.Kill(-pgid, syscall.SIGKILL)
			if fired != nil {
				fired()
			}
			return err
		}
	}
}
