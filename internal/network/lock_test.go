package network

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/network/locking"
)

// fakeLocker records what the module asks of the locking rules.
type fakeLocker struct {
	mu    sync.Mutex
	calls []string
	last  map[string]locking.Rules
}

func (f *fakeLocker) Apply(r locking.Rules) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "apply "+r.Port+" "+r.Mode)
	f.last[r.Port] = r
	return nil
}

func (f *fakeLocker) Remove(port string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "remove "+port)
	delete(f.last, port)
	return nil
}

func (f *fakeLocker) took() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// A plugged VIF's tap gets its rules; a change of its locking fields in
// the database reaches the rules through Watch; Release removes them.
// Without a Locker, a VIF that must be locked is refused.
func TestLockVIF(t *testing.T) {
	e := newEnv(t)
	n := e.network("guests")
	_, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	ctx := context.Background()

	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatalf("unlocked VIF without a Locker: %v", err)
	}
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.LockingMode, vif, "locked") }); err != nil {
		t.Fatal(err)
	}
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err == nil {
		t.Fatal("a locked VIF was plugged with no way to lock it")
	}

	f := &fakeLocker{last: map[string]locking.Rules{}}
	e.m.cfg.Locker = f
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.m.Watch(wctx, 20*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.LockingMode, vif, "disabled") }); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Contains(f.took(), "apply tsvif1.0 disabled") {
		if time.Now().After(deadline) {
			t.Fatalf("the new locking mode was not applied: %v", f.took())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.m.Release(ctx, vif); err != nil {
		t.Fatal(err)
	}
	if got := f.took(); got[len(got)-1] != "remove tsvif1.0" {
		t.Fatalf("calls %v", got)
	}
}

// Start-up with 1,000 running VMs' VIFs on 50 networks: the first Apply
// makes the 50 bridges, the next (a restart finding them) makes no call.
// Logs the figures docs/performance.md keeps.
func TestApply1000VIFs(t *testing.T) {
	e := newEnv(t)
	var nets []string
	for i := range 50 {
		nets = append(nets, e.network("n"+itoa(i)))
	}
	for i := range 1000 {
		e.vmWithVIF(nets[i%50], dm.VMPowerStateRunning, true)
	}
	ctx := context.Background()
	e.rec.Reset()
	start := time.Now()
	if err := e.m.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	bridges := 0
	for _, c := range e.rec.Calls() {
		if len(c) > 7 && c[:7] == "bridge " {
			bridges++
		}
	}
	if bridges != 50 {
		t.Fatalf("%d bridges made for 50 networks", bridges)
	}
	e.rec.Reset()
	start = time.Now()
	if err := e.m.Apply(ctx); err != nil {
		t.Fatal(err)
	}
	again := time.Since(start)
	if calls := e.rec.Calls(); len(calls) != 0 {
		t.Fatalf("a second Apply made %d calls: %v", len(calls), calls[:min(5, len(calls))])
	}
	t.Logf("figure: 1,000 VIFs on 50 networks: first Apply (plan, 50 bridges, recorded) %v; Apply that finds everything in place %v", first, again)
}
