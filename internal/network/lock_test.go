package network

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
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
	defer watch(ctx, e.m)()
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

// lockedBuffer is a log destination that tests read while the module
// writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A locked VIF whose allowed addresses hold text that is not an address
// (as a database written before the API checked them may) is not locked
// with rules made from it: LockVIF fails and nothing is applied. A tap
// already locked keeps its rules when such text arrives later, and the
// log says so once.
func TestLockVIFRefusesUncheckedAddresses(t *testing.T) {
	e := newEnv(t)
	var logged lockedBuffer
	e.m.log = slog.New(slog.NewTextHandler(&logged, nil))
	n := e.network("guests")
	_, vif := e.vmWithVIF(n, dm.VMPowerStateRunning, true)
	ctx := context.Background()
	set := func(v4 ...string) {
		t.Helper()
		if _, err := e.d.Update(func(tx *db.Tx) error {
			if err := tx.Set(dm.VIF.LockingMode, vif, "locked"); err != nil {
				return err
			}
			return tx.Set(dm.VIF.IPV4Allowed, vif, v4)
		}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeLocker{last: map[string]locking.Rules{}}
	e.m.cfg.Locker = f
	set("10.0.0.1", "1.2.3.4; flush ruleset")
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err == nil || !strings.Contains(err.Error(), "is not an address") {
		t.Fatalf("LockVIF with text in ipv4_allowed: %v", err)
	}
	if got := f.took(); len(got) != 0 {
		t.Fatalf("rules applied from unchecked text: %v", got)
	}

	set("10.0.0.1")
	if err := e.m.LockVIF(ctx, vif, "tsvif1.0"); err != nil {
		t.Fatal(err)
	}
	defer watch(ctx, e.m)()
	set("10.0.0.1", "999.1.1.1")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logged.String(), "keeping a VIF's locking rules") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line for rules that cannot be made; log: %s", logged.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// More changes to the database, the bad entry still there: no new
	// rules and no new line.
	for i := range 3 {
		if _, err := e.d.Update(func(tx *db.Tx) error { return tx.Set(dm.VIF.OtherConfig, vif, map[string]string{"n": itoa(i)}) }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := strings.Count(logged.String(), "keeping a VIF's locking rules"); n != 1 {
		t.Errorf("%d log lines for the same bad entry, want 1", n)
	}
	f.mu.Lock()
	r := f.last["tsvif1.0"]
	f.mu.Unlock()
	if got := f.took(); len(got) != 1 || len(r.IPv4) != 1 || r.IPv4[0].String() != "10.0.0.1" {
		t.Fatalf("calls %v, rules %+v: want the first rules kept", got, r)
	}
}

// watch runs m's watcher until the returned stop is called.
func watch(ctx context.Context, m *Manager) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Watch(wctx, 20*time.Millisecond) }()
	return func() { cancel(); <-done }
}
