package xenops_test

import (
	"fmt"
	"regexp"
	"testing"
	"time"
)

// The test guest's PID 1 is busybox init (guest_test.go): it reaps
// whatever is orphaned under it, and the console's shell is its child,
// started again when it ends. The old guest ran the console's shell as
// PID 1, which left orphans that died while it sat at its prompt as
// zombies, and took the kernel down with it when it exited.
func TestGuestInitReapsOrphans(t *testing.T) {
	g := testGuest(t)
	t.Logf("guest accelerator: %s", g.accel)
	e := qemuEnv(t, g, nil)
	vm := e.guestVM(g, "guest-init", nil)
	e.call("VM.start", vm, false, false)
	defer e.call("VM.hard_shutdown", vm)
	con := e.console(vm, "vt100")
	defer con.Close()
	con.waitFor(t, "GUEST-READY", 3*time.Minute)

	// answer sends a command line and returns what its output line holds
	// between tag- and -END. The console echoes the command, whose text
	// has the tag followed by "$(", which the pattern does not take.
	answer := func(tag, cmd string, timeout time.Duration) string {
		t.Helper()
		re := regexp.MustCompile(tag + `-([A-Za-z0-9]*)-END`)
		fmt.Fprintf(con, "%s\n", cmd)
		line := con.waitForLine(t, re.MatchString, timeout)
		return re.FindStringSubmatch(line)[1]
	}

	if got := answer("PIDONE", "echo PIDONE-$(cat /proc/1/comm)-END", time.Minute); got != "init" {
		t.Fatalf("the guest's PID 1 is %q, want init", got)
	}
	// An orphan: a sleep whose parent shell has ended, so PID 1 adopts
	// it. It ends while the console's shell waits for nothing (a shell
	// that waits for its own commands reaps any child by the way, which
	// would hide a PID 1 that does not).
	const life = 4
	if got := answer("ADOPTED", fmt.Sprintf("sh -c 'sleep %d </dev/null >/dev/null 2>&1 & echo $! >/tmp/orphan'; o=$(cat /tmp/orphan); "+
		"echo ADOPTED-$(cut -d' ' -f4 /proc/$o/stat)-END", life), time.Minute); got != "1" {
		t.Fatalf("the orphan's parent is %q, want PID 1", got)
	}
	// Reaped, it is gone a moment after it ends; a zombie stays. A TCG
	// guest on a busy machine may be slow to end it and to answer: asked
	// again until a minute after its end.
	ends := time.Now().Add(life * time.Second)
	time.Sleep(life * time.Second)
	for {
		got := answer("STATE", "echo STATE-$(cut -d' ' -f3 /proc/$o/stat 2>/dev/null)-END", time.Minute)
		if got == "" {
			break
		}
		if time.Since(ends) > time.Minute {
			t.Fatalf("the orphan ended %v ago and is still there in state %q (a zombie nobody reaps)", time.Since(ends).Round(time.Second), got)
		}
		time.Sleep(time.Second)
	}
	// The console's shell ends; init starts another on the serial port.
	// What is typed before the new shell reads may be lost: the question
	// is asked again until it answers, for two minutes at the most.
	fmt.Fprintf(con, "exit\n")
	again := regexp.MustCompile(`AGAIN-([A-Za-z0-9]*)-END`)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		fmt.Fprintf(con, "echo AGAIN-$((40+2))-END\n")
		line, err := tryLine(con, again.MatchString, 5*time.Second)
		if err == nil {
			if got := again.FindStringSubmatch(line)[1]; got != "42" {
				t.Fatalf("the new console shell answered %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no console shell after the first one exited: %v", err)
		}
	}
}
