package watchdog

import (
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// victim starts a process in a process group of its own; its channel
// closes when it exits.
func victim(t *testing.T) (int, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	go func() { _ = cmd.Wait(); close(gone) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-gone })
	return cmd.Process.Pid, gone
}

func exited(gone <-chan struct{}, within time.Duration) bool {
	select {
	case <-gone:
		return true
	case <-time.After(within):
		return false
	}
}

// Petted, the group lives; not petted, it is killed after the timeout.
func TestFakeKillsTheGroupWhenNotPetted(t *testing.T) {
	pid, gone := victim(t)
	r, w := io.Pipe()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- RunFake(r, pid, time.Second, nil) }()
	// Petted every 100 ms, a tenth of the timeout (a busy machine may
	// sleep late), for 1.1 s: then it fires a second after the last pet.
	for range 11 {
		time.Sleep(100 * time.Millisecond)
		if _, err := w.Write([]byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("fired while petted: %v", err)
	default:
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2100*time.Millisecond {
		t.Fatalf("fired after %v", took)
	}
	if !exited(gone, 5*time.Second) {
		t.Fatal("the group was not killed")
	}
}

// A host that dies without disarming is reset all the same; one that
// disarms ('V', then the end) is not.
func TestFakeDisarmAndDeath(t *testing.T) {
	pid, gone := victim(t)
	r, w := io.Pipe()
	done := make(chan error, 1)
	// Disarmed, it returns at the end of its input, long before its
	// timeout: a busy machine cannot make the timeout come first.
	go func() { done <- RunFake(r, pid, 10*time.Second, nil) }()
	_, _ = w.Write([]byte("V"))
	_ = w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if exited(gone, 500*time.Millisecond) {
		t.Fatal("a disarmed watchdog killed the group")
	}

	r2, w2 := io.Pipe()
	go func() { done <- RunFake(r2, pid, 200*time.Millisecond, nil) }()
	_, _ = w2.Write([]byte{0})
	_ = w2.Close() // the host died without disarming
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !exited(gone, 5*time.Second) {
		t.Fatal("the group outlived a host that died armed")
	}
	if RunFake(r2, 1, time.Second, nil) == nil {
		t.Fatal("process group 1 accepted")
	}
}

func TestDeviceThatIsNotOne(t *testing.T) {
	if _, err := OpenDevice("/dev/null", time.Second); err == nil {
		t.Fatal("/dev/null taken for a watchdog")
	}
}
