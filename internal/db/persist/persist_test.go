package persist_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/schema"
)

func open(t testing.TB, path string, opts persist.Options) (*persist.Store, *db.DB) {
	t.Helper()
	st, err := persist.Open(path, dm.Model, opts)
	if err != nil {
		t.Fatal(err)
	}
	d := db.New(dm.Model, db.Options{Persister: st})
	if err := st.Load(d); err != nil {
		t.Fatal(err)
	}
	return st, d
}

func TestRoundTripThroughTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, d := open(t, path, persist.Options{})
	if !st.Empty() {
		t.Fatal("new file not empty")
	}
	var vm, vbd, sess string
	_, err := d.Update(func(tx *db.Tx) (err error) {
		rec := &dm.VMRecord{NameLabel: "a vm\twith\nwhitespace %", OtherConfig: map[string]string{"k": "it's"}, Tags: []string{"x", "y"},
			MemoryStaticMax: 1 << 30, VCPUsParams: map[string]string{}}
		if vm, err = tx.Insert(dm.VM.Class, "", rec.Row()); err != nil {
			return
		}
		if vbd, err = tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(vm), Userdevice: "0", Mode: dm.VBDModeRW, Type: dm.VBDTypeDisk}).Row()); err != nil {
			return
		}
		sess, err = tx.Insert(dm.Session.Class, "", (&dm.SessionRecord{}).Row())
		return
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, vm, "described") }); err != nil {
		t.Fatal(err)
	}
	before := d.Snapshot()
	st.Close()

	st2, d2 := open(t, path, persist.Options{})
	defer st2.Close()
	after := d2.Snapshot()
	if after.Generation() < before.Generation() {
		t.Errorf("generation went back: %d -> %d", before.Generation(), after.Generation())
	}
	for _, ref := range []string{vm, vbd} {
		a, _ := before.Lookup(ref)
		b, ok := after.Lookup(ref)
		if !ok {
			t.Fatalf("%s lost", ref)
		}
		if a.Created != b.Created || a.Modified != b.Modified {
			t.Errorf("%s generations %d/%d -> %d/%d", ref, a.Created, a.Modified, b.Created, b.Modified)
		}
		av, bv := before.Values(a), after.Values(b)
		for i, f := range a.Class.Fields {
			if f.Persist && !schema.Equal(av[i], bv[i]) {
				t.Errorf("%s.%s: %v -> %v", a.Class.Name, f.Name, av[i], bv[i])
			}
		}
	}
	// Derived sets are rebuilt; non-persistent tables are not restored.
	v, _ := after.Get(dm.VM.Class, vm)
	if got := after.Value(v, dm.VM.VBDs).([]string); len(got) != 1 || got[0] != vbd {
		t.Errorf("VM.VBDs after load: %v", got)
	}
	if _, ok := after.Get(dm.Session.Class, sess); ok {
		t.Error("a session survived a restart")
	}
	// Deletes persist too.
	if _, err := d2.Update(func(tx *db.Tx) error { return tx.Delete(dm.VBD.Class, vbd) }); err != nil {
		t.Fatal(err)
	}
	st2.Close()
	st3, d3 := open(t, path, persist.Options{})
	defer st3.Close()
	if _, ok := d3.Snapshot().Get(dm.VBD.Class, vbd); ok {
		t.Error("deleted row came back")
	}
}

func TestGroupCommit(t *testing.T) {
	st, d := open(t, filepath.Join(t.TempDir(), "state.db"), persist.Options{})
	defer st.Close()
	const writers, each = 32, 20
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := d.Update(func(tx *db.Tx) error {
					_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint(w, "-", i)}).Row())
					return err
				}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := d.Snapshot().Count(dm.VM.Class); n != writers*each {
		t.Fatalf("%d VMs", n)
	}
	if st.Syncs() >= writers*each {
		t.Errorf("%d syncs for %d commits: no grouping", st.Syncs(), writers*each)
	}
	t.Logf("%d commits in %d syncs", writers*each, st.Syncs())
}

// A file that reaches its size limit refuses writes as a full disk would:
// each failed commit is undone and reported, the store does not give up,
// commits that need no disk go on, and every acknowledged write survives.
func TestFullFileRefusesWritesWithoutStopping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, d := open(t, path, persist.Options{MaxSize: 1 << 20})
	var lastOK int
	var err error
	for i := 0; i < 100000; i++ {
		_, err = d.Update(func(tx *db.Tx) error {
			_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: strings.Repeat("x", 2000) + fmt.Sprint(i)}).Row())
			return err
		})
		if err != nil {
			break
		}
		lastOK = i
	}
	if !errors.Is(err, db.ErrNotDurable) || !strings.Contains(err.Error(), "size limit") {
		t.Fatalf("no clear failure when the file is full: %v", err)
	}
	if errors.Is(err, db.ErrFailed) {
		t.Fatalf("a full file stopped the database for good: %v", err)
	}
	visible := d.Snapshot().Count(dm.VM.Class)
	if visible != lastOK+1 {
		t.Errorf("%d VMs visible, %d acknowledged", visible, lastOK+1)
	}
	// The next big write fails too, and changes nothing; a session (no
	// disk needed) is created.
	if _, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: strings.Repeat("y", 100000)}).Row())
		return err
	}); !errors.Is(err, db.ErrNotDurable) {
		t.Errorf("write on a full file: %v", err)
	}
	if d.Snapshot().Count(dm.VM.Class) != visible {
		t.Error("a refused write is visible")
	}
	if _, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.Session.Class, "", (&dm.SessionRecord{}).Row())
		return err
	}); err != nil {
		t.Errorf("a session on a full file: %v", err)
	}
	st.Close()
	// After a restart every acknowledged write is there, and nothing else.
	st2, d2 := open(t, path, persist.Options{})
	defer st2.Close()
	if n := d2.Snapshot().Count(dm.VM.Class); n != lastOK+1 {
		t.Errorf("after restart %d VMs, %d acknowledged", n, lastOK+1)
	}
}

func TestSchemaVersions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	st, _ := open(t, path, persist.Options{})
	st.Close()
	setMinor := func(v string) {
		b, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("schema_minor"), []byte(v)) })
		b.Close()
	}
	setMinor(fmt.Sprint(dm.SchemaMinor + 1))
	_, err := persist.Open(path, dm.Model, persist.Options{})
	var pe *persist.Error
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "newer schema") {
		t.Fatalf("newer schema: %v", err)
	}
	setMinor(fmt.Sprint(dm.SchemaMinor - 10))
	var ran []string
	ups := []persist.Upgrade{
		{Major: dm.SchemaMajor, Minor: dm.SchemaMinor - 20, Name: "too old to apply", Apply: func(*bolt.Tx, *schema.Model) error { ran = append(ran, "old"); return nil }},
		{Major: dm.SchemaMajor, Minor: dm.SchemaMinor - 5, Name: "needed", Apply: func(*bolt.Tx, *schema.Model) error { ran = append(ran, "needed"); return nil }},
	}
	st, err = persist.Open(path, dm.Model, persist.Options{Upgrades: ups})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if len(ran) != 1 || ran[0] != "needed" {
		t.Errorf("upgrade steps run: %v", ran)
	}
	// Once upgraded, the steps do not run again.
	ran = nil
	st, _ = persist.Open(path, dm.Model, persist.Options{Upgrades: ups})
	st.Close()
	if len(ran) != 0 {
		t.Errorf("upgrade ran twice: %v", ran)
	}
}

func TestCorruptAndUnusableFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	st, d := open(t, path, persist.Options{})
	d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "x"}).Row())
		return err
	})
	st.Close()
	data, _ := os.ReadFile(path)
	for name, content := range map[string][]byte{
		"truncated": data[:100],
		"garbage":   []byte(strings.Repeat("not a database ", 1000)),
		"zeroed":    make([]byte, len(data)),
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, content, 0o600)
		_, err := persist.Open(p, dm.Model, persist.Options{})
		var pe *persist.Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: %v", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// Corrupt a data page in the middle: Open or Load fails with an error,
	// never a panic.
	bad := append([]byte(nil), data...)
	for i := 4096 * 2; i < len(bad); i++ {
		bad[i] ^= 0x5a
	}
	p := filepath.Join(dir, "pages")
	os.WriteFile(p, bad, 0o600)
	if st, err := persist.Open(p, dm.Model, persist.Options{}); err == nil {
		err = st.Load(db.New(dm.Model, db.Options{Persister: st}))
		if err == nil {
			t.Error("corrupt pages loaded without error")
		}
		t.Logf("corrupt pages: %v", err)
	}
	// A file another process holds is refused with a clear message.
	st, _ = open(t, path, persist.Options{})
	defer st.Close()
	if _, err := persist.Open(path, dm.Model, persist.Options{LockTimeout: 100e6}); err == nil || !strings.Contains(err.Error(), "another toolstackd") {
		t.Errorf("locked file: %v", err)
	}
}

// A data dir on a read-only file system is refused with a clear message.
// Making one needs root (a read-only tmpfs); elsewhere the test skips.
func TestReadOnlyDataDir(t *testing.T) {
	dir := t.TempDir()
	if err := exec.Command("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", dir).Run(); err != nil {
		t.Skipf("cannot mount a read-only tmpfs here: %v", err)
	}
	defer exec.Command("umount", dir).Run()
	_, err := persist.Open(filepath.Join(dir, "state.db"), dm.Model, persist.Options{})
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("read-only data dir: %v", err)
	}
	t.Log(err)
}

// Times keep every digit through the file, and Options.Mark's bytes are
// written with the rows and read back after a reopen.
func TestExactTimesAndMark(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	var gens []uint64
	mark := func(gen uint64) []byte { gens = append(gens, gen); return []byte(fmt.Sprint("at ", gen)) }
	st, d := open(t, path, persist.Options{Mark: mark})
	when := time.Date(2026, 11, 23, 16, 39, 10, 954505943, time.UTC)
	var vm string
	gen, err := d.Update(func(tx *db.Tx) (err error) {
		vm, err = tx.Insert(dm.VMMetrics.Class, "", (&dm.VMMetricsRecord{StartTime: when}).Row())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, d = open(t, path, persist.Options{})
	defer st.Close()
	row, _ := d.Snapshot().Get(dm.VMMetrics.Class, vm)
	if got := row.Get(dm.VMMetrics.StartTime).(time.Time); !got.Equal(when) {
		t.Errorf("start_time %v after a reopen, want %v", got, when)
	}
	m, err := st.Mark()
	if err != nil || string(m) != fmt.Sprint("at ", gen) || len(gens) == 0 {
		t.Errorf("Mark() = %q, %v; Mark was asked for %v", m, err, gens)
	}
}
