package persist_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"toolstackd/internal/testkit/testfs"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
)

// On a real full file system the commit loop survives: failed commits
// are refused and undone, the disk is tried at most once per back-off
// interval however hard clients push, writes resume by themselves when
// space returns, and after a restart the file holds exactly the
// acknowledged writes.
func TestFullDiskRecoversWithoutRestart(t *testing.T) {
	mnt := testfs.MountTmpfs(t, "4m")
	path := filepath.Join(mnt, "state.db")
	st, d := open(t, path, persist.Options{})

	var mu sync.Mutex
	acked := map[string]string{} // name -> ref
	refused := map[string]bool{}
	var ackedAfter int
	freed := false
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("w%d-%d", w, i)
				var ref string
				_, err := d.Update(func(tx *db.Tx) (err error) {
					ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name, NameDescription: string(make([]byte, 500))}).Row())
					return err
				})
				mu.Lock()
				switch {
				case err == nil:
					acked[name] = ref
					if freed {
						ackedAfter++
					}
				case errors.Is(err, db.ErrNotDurable) && errors.Is(err, syscall.ENOSPC):
					refused[name] = true
				default:
					t.Errorf("write %s: %v", name, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	stopWriters := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopWriters()

	time.Sleep(100 * time.Millisecond)
	filler := filepath.Join(mnt, "filler")
	testfs.Fill(t, filler)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(refused)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no write failed on a full disk")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Clients keep pushing; the disk is tried a bounded number of times.
	mu.Lock()
	r0 := len(refused)
	mu.Unlock()
	f0 := st.Failures()
	time.Sleep(time.Second)
	mu.Lock()
	r1 := len(refused)
	mu.Unlock()
	attempts := st.Failures() - f0
	t.Logf("in 1s on a full disk: %d writes refused, %d attempts to write the file", r1-r0, attempts)
	if attempts > 30 {
		t.Errorf("%d attempts to write the file in 1s: the commit loop is not backing off", attempts)
	}
	if r1-r0 < 50 {
		t.Errorf("only %d writes refused in 1s: refused writes are not answered promptly", r1-r0)
	}
	// A session needs no disk.
	if _, err := d.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.Session.Class, "", (&dm.SessionRecord{}).Row())
		return err
	}); err != nil {
		t.Errorf("a session on a full disk: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freedAt := time.Now()
	mu.Lock()
	freed = true
	mu.Unlock()
	for {
		mu.Lock()
		n := ackedAfter
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Since(freedAt) > 5*time.Second {
			t.Fatal("writes did not resume within 5s of space returning")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("first write acknowledged %v after space returned", time.Since(freedAt).Round(time.Millisecond))
	time.Sleep(50 * time.Millisecond)
	stopWriters()

	check := func(when string, snap *db.Snapshot) {
		t.Helper()
		byName := map[string]string{}
		for _, r := range snap.All(dm.VM.Class) {
			byName[r.String(dm.VM.NameLabel)] = r.Ref
		}
		for name, ref := range acked {
			if byName[name] != ref {
				t.Errorf("%s: acknowledged %s (%s) is missing", when, name, ref)
				return
			}
		}
		for name := range refused {
			if _, ok := byName[name]; ok {
				t.Errorf("%s: refused %s is visible", when, name)
				return
			}
		}
		if len(byName) != len(acked) {
			t.Errorf("%s: %d VMs, %d acknowledged", when, len(byName), len(acked))
		}
	}
	check("live", d.Snapshot())
	t.Logf("%d writes acknowledged, %d refused", len(acked), len(refused))
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st2, d2 := open(t, path, persist.Options{})
	defer st2.Close()
	check("after reopening", d2.Snapshot())
}
