package xenops_test

import (
	"sync/atomic"
	"testing"
	"time"

	"toolstackd/internal/xenops"
	"toolstackd/internal/xenops/sim"
)

// TestSimPanicReleasesWorkerSlot makes VM.clone panic more times than
// there are worker slots (64 by default) and checks that every slot came
// back: the VM is unmarked, and a queued operation and a clone still run.
// When the slot was released after the body rather than by a defer, each
// panic leaked one and the 65th operation waited forever.
func TestSimPanicReleasesWorkerSlot(t *testing.T) {
	var panics atomic.Bool
	panics.Store(true)
	e := simEnv(t, sim.Config{}, func(c *xenops.Config) {
		c.OnStep = func(vm, op, step string) {
			if op == "clone" && panics.Load() {
				panic("test: clone step " + step)
			}
		}
	})
	vm := e.newVM("panicky", nil)
	other := e.newVM("other", nil)
	const n = 70 // more than the 64 slots
	for i := range n {
		// As tasks, so that a clone stuck waiting for a slot fails the
		// test in seconds instead of hanging it.
		task := e.async("VM.clone", vm, "never")
		if st, info := e.wait(task, 10*time.Second); st != "failure" || len(info) == 0 || info[0] != "INTERNAL_ERROR" {
			t.Fatalf("clone %d: %s %v, want INTERNAL_ERROR from the panic", i, st, info)
		}
	}
	if ops := e.field("VM", vm, "current_operations").(map[string]any); len(ops) != 0 {
		t.Fatalf("current_operations after the panics: %v", ops)
	}
	// VM.start runs on the VM's queue and needs a slot.
	task := e.async("VM.start", other, false, false)
	if st, info := e.wait(task, 10*time.Second); st != "success" {
		t.Fatalf("VM.start after %d panics: %s %v", n, st, info)
	}
	panics.Store(false)
	task = e.async("VM.clone", vm, "fine")
	if st, info := e.wait(task, 10*time.Second); st != "success" {
		t.Fatalf("VM.clone after %d panics: %s %v", n, st, info)
	}
}
