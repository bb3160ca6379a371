package ha

import (
	"context"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"toolstackd/internal/ha/journal"
	"toolstackd/internal/testkit/pooltest"
	"toolstackd/internal/testkit/testdaemon"
	"toolstackd/tests/pool/suite"
)

// haRounds is how many randomized fault rounds TestHANeverRunsAVMTwice
// runs: a few in make test, 100 with TOOLSTACKD_LONG=1, or
// TOOLSTACKD_HA_ROUNDS.
func haRounds() int {
	if n, err := strconv.Atoi(os.Getenv("TOOLSTACKD_HA_ROUNDS")); err == nil && n > 0 {
		return n
	}
	if os.Getenv("TOOLSTACKD_LONG") == "1" {
		return 100
	}
	return 4
}

// Randomized faults on a pool of three with HA, a fake watchdog and
// protected VMs: each round kills (kill -9) or stops (SIGSTOP, for a
// random time around the lease) a random host, the coordinator included,
// brings it back, and waits until every protected VM runs again. Every
// domain's start and stop, and every watchdog reset, go to one journal on
// the machine's monotonic clock; at the end no VM may have had two
// instances at once.
func TestHANeverRunsAVMTwice(t *testing.T) {
	haRoundsRun(t, testdaemon.Options{}, 4, haRounds())
}

// The same with real QEMU (TCG): a fake watchdog's reset takes the host's
// QEMUs with it, as a real reset does.
func TestHANeverRunsAVMTwiceQEMU(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64")
	}
	rounds := 2
	if os.Getenv("TOOLSTACKD_LONG") == "1" {
		rounds = 20
	}
	haRoundsRun(t, testdaemon.Options{Backend: "qemu", Env: []string{"TOOLSTACKD_QEMU_ACCEL=tcg"}}, 2, rounds)
}

// haRoundsRun runs rounds randomized fault rounds on a pool of three
// hosts run as o says, with n protected VMs.
func haRoundsRun(t *testing.T, o testdaemon.Options, n, rounds int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(rounds)*30*time.Second)
	defer cancel()
	jpath := filepath.Join(t.TempDir(), "instances")
	o.ExtraArgs = []string{"--ha-timing", suite.HATiming, "--watchdog", "fake", "--instance-journal", jpath}
	p := pooltest.Start(t, pooltest.Options{Hosts: 3, Daemon: o})
	p.Join(t)
	c := pooltest.NewClient(netip.Addr{})
	login := func() suite.RPC {
		t.Helper()
		i, _, err := p.FindCoordinator(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		s, err := p.Login(ctx, c, i)
		if err != nil {
			t.Fatal(err)
		}
		return suite.RPC{T: t, Ctx: ctx, C: c, At: p.Addr(i), S: s}
	}
	r := login()
	r.Call("pool.enable_ha", []string{}, map[string]string{})
	var vms []string
	for i := range n {
		vm := r.Str("VM.create", testdaemon.VMRecord("protected-"+strconv.Itoa(i)))
		r.Call("VM.set_ha_restart_priority", vm, "restart")
		r.Call("VM.start", vm, false, false)
		vms = append(vms, vm)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d, timing %s", seed, suite.HATiming)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := range rounds {
		victim := rng.IntN(p.Len())
		alive := func() bool { return processAlive(p.Hosts[victim].PID) }
		switch rng.IntN(2) {
		case 0:
			t.Logf("round %d: kill -9 host %d", round, victim)
			p.Kill(victim)
		default:
			pause := time.Duration(500+rng.IntN(7500)) * time.Millisecond
			t.Logf("round %d: SIGSTOP host %d for %v", round, victim, pause)
			if err := p.Stop(victim); err != nil {
				t.Fatal(err)
			}
			time.Sleep(pause)
			if alive() {
				if err := p.Cont(victim); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A host the watchdog reset (or that was killed) comes back.
		time.Sleep(2500 * time.Millisecond) // past the watchdog's timeout
		if !alive() {
			p.Restart(victim)
		}
		// Every protected VM runs again, somewhere.
		deadline := time.Now().Add(60 * time.Second)
		for _, vm := range vms {
			for {
				r = login()
				ps, err := c.CallString(ctx, r.At, "VM.get_power_state", r.S, vm)
				if err == nil && ps == "Running" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: VM %s is %q (%v) a minute after the fault", round, vm, ps, err)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	events, err := journal.Read(jpath)
	if err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, e := range events {
		if e.Kind == journal.Start {
			starts++
		}
	}
	if starts < len(vms) {
		t.Fatalf("the journal holds %d starts for %d VMs", starts, len(vms))
	}
	if overlaps := journal.Check(events); len(overlaps) > 0 {
		for _, o := range overlaps {
			t.Error(o)
		}
		t.Fatalf("%d overlapping instances in %d events", len(overlaps), len(events))
	}
	t.Logf("%d rounds, %d journal events, %d starts: no VM ran twice", rounds, len(events), starts)
}
