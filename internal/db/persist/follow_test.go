package persist_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/schema"
	"toolstackd/internal/testkit/testfs"
)

// early is the pool's way of using a store whose file follows raft's log:
// every batch is released as soon as it is queued (raft has it), and the
// file catches up behind.
type early struct {
	st *persist.Store
	d  *db.DB
}

func (e *early) Append(b *db.Batch) {
	e.st.Append(b)
	go e.d.Durable(b.To)
}

// openFollowing opens a store at path whose writers are released before
// the file is written, with fsync off (persist.Store.SetSync(false)).
func openFollowing(t *testing.T, path string, opts persist.Options) (*persist.Store, *db.DB) {
	t.Helper()
	st, err := persist.Open(path, dm.Model, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &early{st: st}
	d := db.New(dm.Model, db.Options{Persister: e})
	e.d = d
	if err := st.Load(d); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSync(false); err != nil {
		t.Fatal(err)
	}
	return st, d
}

// A file that follows another durable record refuses nothing when the
// disk is full: the writes were acknowledged already, so the store tries
// them again, at most once per back-off interval, and once space returns
// the file catches up with every one of them (Flush waits for that).
func TestFollowingFileRetriesInsteadOfRefusing(t *testing.T) {
	mnt := testfs.MountTmpfs(t, "4m")
	path := filepath.Join(mnt, "state.db")
	st, d := openFollowing(t, path, persist.Options{})
	filler := filepath.Join(mnt, "filler")
	testfs.Fill(t, filler)

	var names []string
	var mu sync.Mutex
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; st.Failures() == 0; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no write of the file failed on a full disk")
		}
		name := fmt.Sprint("vm-", i)
		if _, err := d.Update(func(tx *db.Tx) error {
			_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name, NameDescription: string(make([]byte, 2000))}).Row())
			return err
		}); err != nil {
			t.Fatalf("write %d refused on a following file: %v", i, err)
		}
		mu.Lock()
		names = append(names, name)
		mu.Unlock()
	}
	// The loop backs off while the disk stays full, and writes go on
	// being accepted.
	f0 := st.Failures()
	for i := range 50 {
		if _, err := d.Update(func(tx *db.Tx) error {
			_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint("more-", i)}).Row())
			return err
		}); err != nil {
			t.Fatalf("write refused on a following file: %v", err)
		}
		names = append(names, fmt.Sprint("more-", i))
	}
	time.Sleep(time.Second)
	if n := st.Failures() - f0; n > 30 {
		t.Errorf("%d attempts to write the file in 1s: the loop does not back off", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	flushWithin(t, st, 10*time.Second, "the file did not catch up within 10s of space returning")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2, d2 := open(t, path, persist.Options{})
	defer func() { _ = st2.Close() }()
	have := map[string]bool{}
	d2.Snapshot().Ascend(dm.VM.Class, func(r *db.Row) bool {
		have[r.String(dm.VM.NameLabel)] = true
		return true
	})
	for _, n := range names {
		if !have[n] {
			t.Fatalf("VM %s, acknowledged, is not in the file after it caught up", n)
		}
	}
	if len(have) != len(names) {
		t.Errorf("%d VMs in the file, %d written", len(have), len(names))
	}
}

// Flush returns at once on a store with nothing queued, and after the
// loop stopped.
func TestFlushDoesNotHang(t *testing.T) {
	st, d := open(t, filepath.Join(t.TempDir(), "state.db"), persist.Options{})
	st.Flush()
	if _, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "x"}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	st.Flush()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st.Flush()
}

// A following file gathers the changes of its linger into one write:
// 200 writes of one VM, 1 ms apart, take a handful of transactions (each
// encoding the row once), where a file that is the durable record takes
// one sync per group of waiting writers.
func TestFollowingFileGathersWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, d := openFollowing(t, path, persist.Options{})
	ref := insertVM(t, d)
	st.Flush()
	before := st.Syncs()
	start := time.Now()
	const writes = 200
	for i := range writes {
		setVM(t, d, dm.VM.NameDescription, ref, fmt.Sprint(i))
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	st.Flush()
	n := st.Syncs() - before
	// One write per linger at the most, and one for the Flush.
	if limit := int(elapsed/persist.DefaultFollowLinger) + 2; n > limit {
		t.Errorf("%d writes of the file for %d changes in %v: more than one per %v", n, writes, elapsed, persist.DefaultFollowLinger)
	}
	t.Logf("%d changes in %v: %d writes of the file", writes, elapsed, n)
}

// Flush, SetSync(true) and Close each end a linger at once: with a linger
// of a minute, each brings the file up to date within seconds.
func TestLingerCutShort(t *testing.T) {
	caughtUp := func(t *testing.T, st *persist.Store) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for q, h := st.Progress(); h < q; q, h = st.Progress() {
			if time.Now().After(deadline) {
				t.Fatalf("the file is %d batches behind after 5s", q-h)
			}
			time.Sleep(time.Millisecond)
		}
	}
	long := persist.Options{FollowLinger: time.Minute}
	t.Run("Flush", func(t *testing.T) {
		st, d := openFollowing(t, filepath.Join(t.TempDir(), "state.db"), long)
		defer func() { _ = st.Close() }()
		ref := insertVM(t, d) // the first write: no linger before it
		caughtUp(t, st)
		for i := range 3 {
			setVM(t, d, dm.VM.NameLabel, ref, fmt.Sprint(i))
			flushWithin(t, st, 5*time.Second, "Flush waited out the linger")
		}
	})
	t.Run("SetSync", func(t *testing.T) {
		st, d := openFollowing(t, filepath.Join(t.TempDir(), "state.db"), long)
		defer func() { _ = st.Close() }()
		ref := insertVM(t, d)
		caughtUp(t, st)
		setVM(t, d, dm.VM.NameLabel, ref, "lingering")
		time.Sleep(10 * time.Millisecond) // the loop is in its linger
		if err := st.SetSync(true); err != nil {
			t.Fatal(err)
		}
		caughtUp(t, st)
	})
	t.Run("Close", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		st, d := openFollowing(t, path, long)
		ref := insertVM(t, d)
		caughtUp(t, st)
		setVM(t, d, dm.VM.NameLabel, ref, "last")
		time.Sleep(10 * time.Millisecond)
		t0 := time.Now()
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(t0); el > 5*time.Second {
			t.Errorf("Close took %v", el)
		}
		st2, d2 := open(t, path, persist.Options{})
		defer func() { _ = st2.Close() }()
		if row, ok := d2.Snapshot().Get(dm.VM.Class, ref); !ok || row.String(dm.VM.NameLabel) != "last" {
			t.Fatalf("the file after Close lacks the last change (%v)", ok)
		}
	})
}

// flushWithin fails the test with msg when st.Flush takes longer than d.
func flushWithin(t *testing.T, st *persist.Store, d time.Duration, msg string) {
	t.Helper()
	done := make(chan struct{})
	go func() { st.Flush(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatal(msg)
	}
}

func insertVM(t *testing.T, d *db.DB) string {
	t.Helper()
	var ref string
	if _, err := d.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "vm"}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ref
}

func setVM(t *testing.T, d *db.DB, f *schema.Field, ref string, v any) {
	t.Helper()
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(f, ref, v) }); err != nil {
		t.Fatal(err)
	}
}
