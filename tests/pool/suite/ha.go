package suite

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"toolstackd/internal/testkit/testdaemon"
)

// HATiming are short HA timing values for tests: the fence interval is
// 2 s·1.01 + 1 s + 2 s + 0.5 s = 5.52 s.
const HATiming = "lease=2s,renew=400ms,grace=1s,watchdog=2s,margin=500ms"

// Bounds on what HA does under HATiming, for a machine busy with other
// work. HAActBound: a host's own lease or watchdog acts (its instance of a
// VM killed, the host reset), 2-3 s on a quiet machine. HARestartBound: a
// dead host's protected VM runs elsewhere, the fence interval and a start
// later, 6-9 s quiet. HAPlanBound: the coordinator's plan reflects a
// change (it replans every 2 s).
const (
	HAActBound     = 60 * time.Second
	HARestartBound = 90 * time.Second
	HAPlanBound    = 60 * time.Second
)

// SimDomainIn reports whether the simulator under a host's data dir has a
// domain for the VM.
func SimDomainIn(t *testing.T, dataDir, uuid string) bool {
	t.Helper()
	found := false
	_ = filepath.WalkDir(filepath.Join(dataDir, "xenops"), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == uuid+".json" {
			found = true
		}
		return nil
	})
	return found
}

// SizedVM makes a VM whose memory fields are all size.
func SizedVM(r RPC, name string, size int64) string {
	r.T.Helper()
	rec := testdaemon.VMRecord(name)
	for _, f := range []string{"memory_static_max", "memory_dynamic_max", "memory_dynamic_min", "memory_target"} {
		rec[f] = size
	}
	return r.Str("VM.create", rec)
}

// WaitPlanFor waits until the pool's ha_plan_exists_for and
// ha_overcommitted read as wanted (the coordinator replans every 2 s).
func WaitPlanFor(r RPC, pool, wantFor, over string) {
	r.T.Helper()
	deadline := time.Now().Add(HAPlanBound)
	for {
		got := string(r.Call("pool.get_ha_plan_exists_for", pool))
		o := string(r.Call("pool.get_ha_overcommitted", pool))
		if got == wantFor && o == over {
			return
		}
		if time.Now().After(deadline) {
			r.T.Fatalf("ha_plan_exists_for %s overcommitted %s, want %s %s", got, o, wantFor, over)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
