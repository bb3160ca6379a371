package persist

import (
	"path/filepath"
	"strconv"
	"testing"

	bolt "go.etcd.io/bbolt"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
)

// A commit can reach the file although bbolt reports it failed (the meta
// page written, then its sync failing). The database has undone it and
// its writer was told it failed, so before the next write the store must
// notice the file is ahead and rewrite it from memory.
func TestReopenRewritesACommitReportedFailed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := Open(path, dm.Model, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := db.New(dm.Model, db.Options{Persister: st})
	if err := st.Load(d); err != nil {
		t.Fatal(err)
	}
	insert := func(name string) string {
		var ref string
		if _, err := d.Update(func(tx *db.Tx) (err error) {
			ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name}).Row())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ref
	}
	kept := insert("kept")

	// What the failed commit left: a row nobody was told about, and the
	// file's generation moved on.
	st.fileMu.Lock()
	if err := st.bolt.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(dm.VM.Class.Name))
		if err := b.Put([]byte("OpaqueRef:ghost"), append([]byte(nil), b.Get([]byte(kept))...)); err != nil {
			return err
		}
		return tx.Bucket(metaBucket).Put(keyGen, []byte(strconv.FormatUint(st.fileGen+1, 10)))
	}); err != nil {
		t.Fatal(err)
	}
	st.suspect = true
	st.fileMu.Unlock()

	after := insert("after")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st2, err := Open(path, dm.Model, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	d2 := db.New(dm.Model, db.Options{Persister: st2})
	if err := st2.Load(d2); err != nil {
		t.Fatalf("loading the rewritten file: %v", err)
	}
	snap := d2.Snapshot()
	if _, ok := snap.Get(dm.VM.Class, "OpaqueRef:ghost"); ok {
		t.Error("the commit reported failed is still in the file")
	}
	for _, ref := range []string{kept, after} {
		if _, ok := snap.Get(dm.VM.Class, ref); !ok {
			t.Errorf("acknowledged VM %s is missing", ref)
		}
	}
	if n := snap.Count(dm.VM.Class); n != 2 {
		t.Errorf("%d VMs in the file, want 2", n)
	}
}
