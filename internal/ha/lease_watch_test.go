package ha

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/lease"
)

// domains is a Fencer over a set of running domains by VM uuid.
type domains struct {
	mu  sync.Mutex
	run map[string]bool
}

func (d *domains) Fence(_ context.Context, protect func(uuid string) bool) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uuid := range d.run {
		if protect(uuid) {
			delete(d.run, uuid)
		}
	}
	return 0
}

func (d *domains) SetHalted(*db.Tx, string) error { return nil }

func (d *domains) running(uuid string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.run[uuid]
}

// A protected VM that starts after the host found its lease over, and
// before a renewal granted then was lost without a look in between (the
// host stopped just after it renewed), is killed at the next look: the
// host's earlier "nothing to kill" does not carry over.
func TestLeaseOverKillsVMsStartedSince(t *testing.T) {
	d := db.New(dm.Model, db.Options{})
	var uuid string
	if _, err := d.Update(func(tx *db.Tx) error {
		ref, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "protected", HARestartPriority: "restart"}).Row())
		if err != nil {
			return err
		}
		row, _ := tx.Get(dm.VM.Class, ref)
		uuid = row.String(dm.VM.UUID)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	fencer := &domains{run: map[string]bool{}}
	timing, err := lease.ParseTiming("lease=2s,renew=400ms,grace=1s,watchdog=2s,margin=500ms")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Server: api.New(d, api.Config{}, quiet), Fencer: fencer, Timing: timing, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if ph := s.watchLease(t0); ph != lease.Safe {
		t.Fatalf("no lease, nothing running: %v", ph)
	}
	// Granted, then the VM starts; the lease runs out before the next look.
	s.holder.Granted(s.holder.Attempt(t0.Add(10 * time.Millisecond)))
	fencer.mu.Lock()
	fencer.run[uuid] = true
	fencer.mu.Unlock()
	if ph := s.watchLease(t0.Add(timing.Lease + time.Second)); ph != lease.Safe {
		t.Fatalf("after the lease: %v", ph)
	}
	if fencer.running(uuid) {
		t.Fatal("the protected VM outlived the lease")
	}
}
