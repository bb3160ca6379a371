package mixed_test

import (
	"context"
	"testing"

	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/mixed"
	"toolstackd/internal/xenops/sim"
)

// Two simulators stand for the real backend and the simulator: what is
// tested is the routing, not either backend.
func newPair(t *testing.T, dirA, dirB string) (*mixed.Backend, *sim.Simulator, *sim.Simulator) {
	t.Helper()
	a, err := sim.New(sim.Config{StateDir: dirA})
	if err != nil {
		t.Fatal(err)
	}
	b, err := sim.New(sim.Config{StateDir: dirB})
	if err != nil {
		t.Fatal(err)
	}
	return mixed.New(a, b), a, b
}

func start(t *testing.T, be backend.Backend, uuid string, simulated bool) {
	t.Helper()
	ctx := context.Background()
	spec := &backend.Spec{UUID: uuid, Name: uuid, Memory: 64 << 20, Target: 64 << 20, VCPUs: 1, MaxCPU: 1, HVM: true,
		Firmware: "bios", Platform: map[string]string{}}
	if simulated {
		spec.Platform[mixed.SimulatedKey] = "true"
	}
	if err := be.Check(spec); err != nil {
		t.Fatal(err)
	}
	if _, err := be.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func() error{
		func() error { return be.Build(ctx, uuid) },
		func() error { return be.StartDeviceModel(ctx, uuid) },
		func() error { return be.MarkComplete(uuid) },
		func() error { return be.Unpause(ctx, uuid) },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRouting(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	m, real, simu := newPair(t, dirA, dirB)
	start(t, m, "real-1", false)
	start(t, m, "sim-1", true)
	if _, ok := real.Info("real-1"); !ok {
		t.Fatal("a VM without the platform key is not on the real backend")
	}
	if _, ok := simu.Info("sim-1"); !ok {
		t.Fatal("a VM with platform:toolstackd-simulated=true is not on the simulator")
	}
	if _, ok := real.Info("sim-1"); ok {
		t.Fatal("the simulated VM is on the real backend too")
	}
	if n := len(m.List()); n != 2 {
		t.Fatalf("List has %d domains, want 2", n)
	}
	ctx := context.Background()
	if err := m.Pause(ctx, "sim-1"); err != nil {
		t.Fatal(err)
	}
	if d, _ := simu.Info("sim-1"); d.State != backend.DomainPaused {
		t.Fatalf("sim-1 is %s after Pause through the mixed backend", d.State)
	}

	// After a restart the domains are found where they are.
	m.Close()
	m2, real2, simu2 := newPair(t, dirA, dirB)
	defer m2.Close()
	if d, ok := m2.Info("sim-1"); !ok || d.State != backend.DomainPaused {
		t.Fatalf("sim-1 after a restart: %+v %v", d, ok)
	}
	if err := m2.Destroy(ctx, "real-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := real2.Info("real-1"); ok {
		t.Fatal("real-1 still on the real backend after Destroy")
	}
	if _, ok := simu2.Info("sim-1"); !ok {
		t.Fatal("Destroy of real-1 touched sim-1")
	}
	if _, ok := m2.Info("nothing"); ok {
		t.Fatal("Info of an unknown domain")
	}
}
