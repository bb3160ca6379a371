package persist_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/testfs"
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
func openFollowing(t *testing.T, path string) (*persist.Store, *db.DB) {
	t.Helper()
	st, err := persist.Open(path, dm.Model, persist.Options{})
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
	st, d := openFollowing(t, path)
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
	flushed := make(chan struct{})
	go func() { st.Flush(); close(flushed) }()
	select {
	case <-flushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the file did not catch up within 10s of space returning")
	}
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
