package network

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network/locking"
)

// fakePorts records what the module asks of a switch taking VIFs.
type fakePorts struct {
	mu    sync.Mutex
	calls []string
	last  map[string]VIFPort
	fail  error
}

func (f *fakePorts) PlugVIF(_ context.Context, p VIFPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.calls = append(f.calls, "plug "+p.VIF+" "+p.Bridge+" "+p.Mode)
	f.last[p.VIF] = p
	return nil
}

func (f *fakePorts) UnplugVIF(_ context.Context, vif string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "unplug "+vif)
	delete(f.last, vif)
	return nil
}

func (f *fakePorts) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// With Config.VIFPorts, EnsureVIF hands the VIF (uuids, MAC, MTU,
// resolved locking, allowed addresses) to the switch on its bridge,
// Watch hands it again when its locking changes, MoveVIF moves it and
// Release removes it; a switch that fails makes EnsureVIF fail and
// leaves no hold on the network.
func TestVIFPorts(t *testing.T) {
	e := newEnv(t)
	f := &fakePorts{last: map[string]VIFPort{}}
	e.m.cfg.VIFPorts = f
	n := e.network("guests")
	br := e.bridgeOf(n)
	vm, vif := e.vmWithVIF(n, dm.VMPowerStateHalted, false)
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.IPV4Allowed, vif, []string{"192.0.2.9", "bogus"}) }); err != nil {
		t.Fatal(err)
	}
	snap := e.d.Snapshot()
	vifRow, _ := snap.Get(dm.VIF.Class, vif)
	vmRow, _ := snap.Get(dm.VM.Class, vm)
	nRow, _ := snap.Get(dm.Network.Class, n)
	uuid := vifRow.UUID()
	ctx := context.Background()

	if got, err := e.m.EnsureVIF(ctx, vif); err != nil || got != br {
		t.Fatalf("EnsureVIF = %q, %v", got, err)
	}
	p := f.last[uuid]
	if p.VM != vmRow.UUID() || p.Network != nRow.UUID() || p.Bridge != br || p.MAC.String() != "02:00:00:00:00:01" ||
		p.MTU != 1500 || p.Mode != locking.ModeUnlocked || len(p.IPv4) != 1 || p.IPv4[0].String() != "192.0.2.9" {
		t.Fatalf("port handed to the switch: %+v", p)
	}

	// The VM backend's tap, handed over through LockVIF, carries the VIF
	// from now on.
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	if got := f.last[uuid]; got.Tap != "tsvif1.0" || got.Bridge != br {
		t.Fatalf("after LockVIF the switch has %+v", got)
	}
	n0 := len(f.took())
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	if len(f.took()) != n0 {
		t.Fatalf("LockVIF again replugged: %v", f.took())
	}

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.m.Watch(wctx, 10*time.Millisecond) }()
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.LockingMode, vif, "disabled") }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(f.took(), "plug "+uuid+" "+br+" disabled") {
		if time.Now().After(deadline) {
			t.Fatalf("the new locking mode did not reach the switch: %v", f.took())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done

	other := e.network("other")
	obr := e.bridgeOf(other)
	if got, err := e.m.MoveVIF(ctx, vif, other); err != nil || got != obr {
		t.Fatalf("MoveVIF = %q, %v", got, err)
	}
	oRow, _ := e.d.Snapshot().Get(dm.Network.Class, other)
	if got := f.last[uuid]; got.Bridge != obr || got.Network != oRow.UUID() || got.Tap != "tsvif1.0" {
		t.Fatalf("after MoveVIF the port is on %q of network %s, want %s of %s", got.Bridge, got.Network, obr, oRow.UUID())
	}
	if err := e.m.Release(ctx, vif); err != nil {
		t.Fatal(err)
	}
	if got := f.took(); got[len(got)-1] != "unplug "+uuid {
		t.Fatalf("calls %v", got)
	}

	// A switch that fails: EnsureVIF fails, and the network is not held.
	f.fail = errors.New("switch down")
	e.rec.Reset()
	if _, err := e.m.EnsureVIF(ctx, vif); err == nil {
		t.Fatal("EnsureVIF succeeded with a failing switch")
	}
	if held := e.m.plan(); len(held.Bridges) != 0 {
		t.Fatalf("bridges still wanted after a failed EnsureVIF: %+v", held.Bridges)
	}
}
