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
