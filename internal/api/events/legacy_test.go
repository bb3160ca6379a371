package events_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"toolstackd/internal/api/events"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/xerr"
)

// next calls Registry.Next with a deadline, so that a missing event fails
// the test instead of hanging it.
func next(t *testing.T, r *events.Registry, session string) ([]events.LegacyEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.Next(ctx, session)
}

func legacyEvs(es []events.LegacyEvent) []ev {
	out := make([]ev, len(es))
	for i, e := range es {
		out[i] = ev{e.Op.String(), e.Class.Lower, e.Ref}
	}
	return out
}

func wantLegacy(t *testing.T, es []events.LegacyEvent, err error, want ...ev) {
	t.Helper()
	if err != nil {
		t.Fatalf("next: %v", err)
	}
	got := legacyEvs(es)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

func TestLegacyRegisterNext(t *testing.T) {
	d := newDB(t)
	early := createVM(t, d, "before registration")
	r := events.NewRegistry(d)

	_, err := next(t, r, "s1")
	wantCode(t, err, xerr.SessionNotRegistered, "s1")

	if err := r.Register("s1", []string{"VM"}); err != nil {
		t.Fatal(err)
	}
	id0 := r.CurrentID()
	v := createVM(t, d, "a")
	es, err := next(t, r, "s1")
	wantLegacy(t, es, err, ev{"add", "vm", v})
	if es[0].ID != id0 || es[0].Row.Get(dm.VM.NameLabel) != "a" || es[0].Snap == nil {
		t.Errorf("add event %+v, want id %d", es[0], id0)
	}
	if time.Since(es[0].Timestamp) > time.Minute || es[0].Timestamp.IsZero() {
		t.Errorf("timestamp %v", es[0].Timestamp)
	}

	// Every change is its own event (no coalescing), in commit order.
	setName(t, d, dm.VM.NameLabel, v, "b")
	setName(t, d, dm.VM.NameLabel, v, "c")
	deleteRow(t, d, dm.VM.Class, early)
	es, err = next(t, r, "s1")
	wantLegacy(t, es, err, ev{"mod", "vm", v}, ev{"mod", "vm", v}, ev{"del", "vm", early})
	if es[0].Row.Get(dm.VM.NameLabel) != "b" || es[1].Row.Get(dm.VM.NameLabel) != "c" {
		t.Errorf("mod rows %v, %v", es[0].Row, es[1].Row)
	}
	if es[2].Row == nil || es[2].Row.Get(dm.VM.NameLabel) != "before registration" {
		t.Errorf("del event carries %v, want the row before the delete", es[2].Row)
	}
	for i := 1; i < len(es); i++ {
		if es[i].ID != es[i-1].ID+1 {
			t.Errorf("ids %d then %d", es[i-1].ID, es[i].ID)
		}
	}
	if cur := r.CurrentID(); cur != es[2].ID+1 {
		t.Errorf("CurrentID %d, want %d", cur, es[2].ID+1)
	}

	// Changes nobody registered for are not queued and take no id.
	cur := r.CurrentID()
	createHost(t, d, "h")
	if r.CurrentID() != cur {
		t.Errorf("a host change took an id: %d -> %d", cur, r.CurrentID())
	}

	// Relations: a VBD gives add vbd and mod vm, when both are registered.
	if err := r.Register("s1", []string{"vbd"}); err != nil {
		t.Fatal(err)
	}
	var vbd string
	update(t, d, func(tx *db.Tx) (err error) {
		vbd, err = tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(v), VDI: "OpaqueRef:NULL"}).Row())
		return err
	})
	es, err = next(t, r, "s1")
	wantLegacy(t, es, err, ev{"add", "vbd", vbd}, ev{"mod", "vm", v})
}

func TestLegacyNextBlocksUntilARelevantEvent(t *testing.T) {
	d := newDB(t)
	h := createHost(t, d, "h")
	v := createVM(t, d, "v")
	r := events.NewRegistry(d)
	r.Register("s", []string{"host"})
	r.Register("other", []string{"vm"}) // makes VM events queued, not relevant to s

	type result struct {
		es  []events.LegacyEvent
		err error
	}
	done := make(chan result)
	go func() {
		es, err := next(t, r, "s")
		done <- result{es, err}
	}()
	setName(t, d, dm.VM.NameLabel, v, "x")
	select {
	case res := <-done:
		t.Fatalf("returned for a VM change: %v %v", legacyEvs(res.es), res.err)
	case <-time.After(50 * time.Millisecond):
	}
	start := time.Now()
	setName(t, d, dm.Host.NameLabel, h, "y")
	res := <-done
	wantLegacy(t, res.es, res.err, ev{"mod", "host", h})
	if el := time.Since(start); el > time.Second {
		t.Errorf("woke %v after the write", el)
	}
	// The other session still sees its VM event.
	es, err := next(t, r, "other")
	wantLegacy(t, es, err, ev{"mod", "vm", v})
}

func TestLegacyUnregisterAndObjects(t *testing.T) {
	d := newDB(t)
	h := createHost(t, d, "h")
	v1 := createVM(t, d, "v1")
	v2 := createVM(t, d, "v2")
	r := events.NewRegistry(d)
	r.Register("s", []string{"vm", "HOST"})
	r.Unregister("s", []string{"VM"})
	setName(t, d, dm.VM.NameLabel, v1, "x")
	setName(t, d, dm.Host.NameLabel, h, "x")
	es, err := next(t, r, "s")
	wantLegacy(t, es, err, ev{"mod", "host", h})

	r.Register("s", []string{"vm/" + v2})
	setName(t, d, dm.VM.NameLabel, v1, "y")
	setName(t, d, dm.VM.NameLabel, v2, "y")
	es, err = next(t, r, "s")
	wantLegacy(t, es, err, ev{"mod", "vm", v2})

	// Unregistering from a session that never registered makes an empty
	// registration, as in xapi: next then waits instead of failing.
	r.Unregister("fresh", []string{"vm"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := r.Next(ctx, "fresh"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("next on an empty registration: %v", err)
	}
}

func TestLegacyEventsLostWhenTheQueueOverflows(t *testing.T) {
	d := newDB(t)
	v := createVM(t, d, "v")
	r := events.NewRegistryWithLimit(d, 5)
	r.Register("slow", []string{"vm"})
	r.Register("fast", []string{"vm"})
	for i := range 3 {
		setName(t, d, dm.VM.NameLabel, v, fmt.Sprint(i))
	}
	es, err := next(t, r, "fast")
	if err != nil || len(es) != 3 {
		t.Fatalf("fast: %v %v", legacyEvs(es), err)
	}
	for i := range 10 {
		setName(t, d, dm.VM.NameLabel, v, fmt.Sprint("more", i))
	}
	_, err = next(t, r, "slow")
	wantCode(t, err, xerr.EventsLost)
	_, err = next(t, r, "fast")
	wantCode(t, err, xerr.EventsLost)

	// EVENTS_LOST is said once; the client resyncs and carries on.
	setName(t, d, dm.VM.NameLabel, v, "after")
	es, err = next(t, r, "slow")
	wantLegacy(t, es, err, ev{"mod", "vm", v})
	if es[0].Row.Get(dm.VM.NameLabel) != "after" {
		t.Errorf("row %v", es[0].Row)
	}
}

func TestLegacyEventsLostWhenTheFeedIsTruncated(t *testing.T) {
	d := db.New(dm.Model, db.Options{FeedLength: 4})
	v := createVM(t, d, "v")
	r := events.NewRegistry(d)
	r.Register("s", []string{"vm"})
	for i := range 20 {
		setName(t, d, dm.VM.NameLabel, v, fmt.Sprint(i))
	}
	_, err := next(t, r, "s")
	wantCode(t, err, xerr.EventsLost)
	setName(t, d, dm.VM.NameLabel, v, "after")
	es, err := next(t, r, "s")
	wantLegacy(t, es, err, ev{"mod", "vm", v})

	// A session registered after the loss is not told about it.
	r.Register("late", []string{"vm"})
	setName(t, d, dm.VM.NameLabel, v, "later")
	es, err = next(t, r, "late")
	wantLegacy(t, es, err, ev{"mod", "vm", v})
}

func TestLegacyForgetAndCancel(t *testing.T) {
	d := newDB(t)
	r := events.NewRegistry(d)
	r.Register("s", []string{"*"})
	done := make(chan error)
	go func() {
		_, err := r.Next(context.Background(), "s")
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	r.Forget("s")
	select {
	case err := <-done:
		wantCode(t, err, xerr.SessionInvalid, "s")
	case <-time.After(5 * time.Second):
		t.Fatal("next did not return after Forget")
	}
	_, err := next(t, r, "s")
	wantCode(t, err, xerr.SessionNotRegistered, "s")

	r.Register("s2", []string{"*"})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := r.Next(ctx, "s2")
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("next did not return after the cancel")
	}
}

func TestLegacyConcurrentNextSplitsEvents(t *testing.T) {
	d := newDB(t)
	v := createVM(t, d, "v")
	r := events.NewRegistry(d)
	r.Register("s", []string{"vm"})
	const writes = 200
	got := make(chan []events.LegacyEvent, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 4 {
		go func() {
			for {
				es, err := r.Next(ctx, "s")
				if err != nil {
					return
				}
				got <- es
			}
		}()
	}
	for i := range writes {
		setName(t, d, dm.VM.NameLabel, v, fmt.Sprint(i))
	}
	seen := map[uint64]bool{}
	deadline := time.After(10 * time.Second)
	for len(seen) < writes {
		select {
		case es := <-got:
			for _, e := range es {
				if seen[e.ID] {
					t.Fatalf("event %d delivered twice", e.ID)
				}
				seen[e.ID] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d events delivered", len(seen), writes)
		}
	}
}
