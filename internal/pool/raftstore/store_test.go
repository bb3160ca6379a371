package raftstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

func openT(t testing.TB, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mkLog(i uint64) *raft.Log {
	l := &raft.Log{
		Index: i,
		Term:  i/10 + 1,
		Type:  raft.LogCommand,
		Data:  []byte(fmt.Sprintf("data-%d", i)),
	}
	if i%2 == 0 {
		l.Extensions = []byte{0, 1, 2, byte(i)}
		l.AppendedAt = time.Unix(1700000000+int64(i), int64(i)*7919).UTC()
	}
	return l
}

func sameLog(a, b *raft.Log) bool {
	return a.Index == b.Index && a.Term == b.Term && a.Type == b.Type &&
		bytes.Equal(a.Data, b.Data) && bytes.Equal(a.Extensions, b.Extensions) &&
		a.AppendedAt.Equal(b.AppendedAt)
}

func mustIndexes(t *testing.T, s *Store, first, last uint64) {
	t.Helper()
	f, err := s.FirstIndex()
	if err != nil || f != first {
		t.Fatalf("FirstIndex = %d, %v; want %d", f, err, first)
	}
	l, err := s.LastIndex()
	if err != nil || l != last {
		t.Fatalf("LastIndex = %d, %v; want %d", l, err, last)
	}
}

func TestEmptyStore(t *testing.T) {
	s := openT(t, t.TempDir())
	mustIndexes(t, s, 0, 0)
	var l raft.Log
	if err := s.GetLog(1, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog on empty store: %v, want ErrLogNotFound", err)
	}
	if _, err := s.Get([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("Get of a missing key: %v, want \"not found\"", err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("GetUint64 of a missing key: %v, want \"not found\"", err)
	}
}

func TestStoreAndGetLogs(t *testing.T) {
	s := openT(t, t.TempDir())
	if err := s.StoreLog(mkLog(1)); err != nil {
		t.Fatal(err)
	}
	var batch []*raft.Log
	for i := uint64(2); i <= 20; i++ {
		batch = append(batch, mkLog(i))
	}
	if err := s.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	mustIndexes(t, s, 1, 20)
	for i := uint64(1); i <= 20; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
		if want := mkLog(i); !sameLog(&got, want) {
			t.Fatalf("GetLog(%d) = %+v, want %+v", i, got, *want)
		}
	}
	// Overwrite an entry (a follower replacing a conflicting suffix).
	repl := mkLog(20)
	repl.Term = 99
	repl.Data = []byte("replaced")
	if err := s.StoreLog(repl); err != nil {
		t.Fatal(err)
	}
	var got raft.Log
	if err := s.GetLog(20, &got); err != nil || !sameLog(&got, repl) {
		t.Fatalf("after overwrite GetLog(20) = %+v, %v", got, err)
	}
	if err := s.StoreLogs(nil); err != nil {
		t.Fatalf("StoreLogs(nil): %v", err)
	}
	if err := s.StoreLogs([]*raft.Log{mkLog(21), nil}); err == nil {
		t.Fatal("StoreLogs with a nil entry succeeded")
	}
	mustIndexes(t, s, 1, 20) // the refused batch left nothing behind
}

func TestAllLogTypesAndFields(t *testing.T) {
	s := openT(t, t.TempDir())
	types := []raft.LogType{raft.LogCommand, raft.LogNoop, raft.LogAddPeerDeprecated,
		raft.LogRemovePeerDeprecated, raft.LogBarrier, raft.LogConfiguration}
	var logs []*raft.Log
	for i, ty := range types {
		logs = append(logs, &raft.Log{
			Index: uint64(i) + 1, Term: 1 << 40, Type: ty,
			Data:       bytes.Repeat([]byte{byte(i)}, 1000*i),
			Extensions: []byte("ext"),
			AppendedAt: time.Date(1969, 7, 20, 20, 17, 40, 123456789, time.UTC),
		})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	for _, want := range logs {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil || !sameLog(&got, want) {
			t.Fatalf("GetLog(%d) = %+v, %v; want %+v", want.Index, got, err, *want)
		}
	}
}

func TestDeleteRange(t *testing.T) {
	s := openT(t, t.TempDir())
	var batch []*raft.Log
	for i := uint64(1); i <= 100; i++ {
		batch = append(batch, mkLog(i))
	}
	if err := s.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	// Compaction from the front.
	if err := s.DeleteRange(1, 30); err != nil {
		t.Fatal(err)
	}
	mustIndexes(t, s, 31, 100)
	var l raft.Log
	if err := s.GetLog(30, &l); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("GetLog(30) after delete: %v", err)
	}
	// Truncation of a suffix.
	if err := s.DeleteRange(91, 1000); err != nil {
		t.Fatal(err)
	}
	mustIndexes(t, s, 31, 90)
	// A range with nothing in it, and an inverted range.
	if err := s.DeleteRange(500, 600); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(60, 50); err != nil {
		t.Fatal(err)
	}
	mustIndexes(t, s, 31, 90)
	// Everything.
	if err := s.DeleteRange(0, ^uint64(0)); err != nil {
		t.Fatal(err)
	}
	mustIndexes(t, s, 0, 0)
}

func TestStable(t *testing.T) {
	s := openT(t, t.TempDir())
	if err := s.Set([]byte("LastVoteCand"), []byte("node-1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("empty"), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 1<<50+3); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-1" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if v, err := s.Get([]byte("empty")); err != nil || len(v) != 0 {
		t.Fatalf("Get(empty) = %q, %v", v, err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 1<<50+3 {
		t.Fatalf("GetUint64 = %d, %v", v, err)
	}
	if _, err := s.GetUint64([]byte("LastVoteCand")); err == nil {
		t.Fatal("GetUint64 of a 6-byte value succeeded")
	}
	if err := s.Set(nil, []byte("x")); err == nil {
		t.Fatal("Set with an empty key succeeded")
	}
	// The returned value is the caller's to keep.
	v, _ := s.Get([]byte("LastVoteCand"))
	v[0] = 'X'
	if v2, _ := s.Get([]byte("LastVoteCand")); string(v2) != "node-1" {
		t.Fatalf("modifying a returned value changed the store: %q", v2)
	}
}

func TestReopenKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var batch []*raft.Log
	for i := uint64(5); i <= 50; i++ {
		batch = append(batch, mkLog(i))
	}
	if err := s.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(5, 9); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("n2")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLog(mkLog(51)); err == nil {
		t.Fatal("StoreLog after Close succeeded")
	}

	s = openT(t, dir)
	mustIndexes(t, s, 10, 50)
	for i := uint64(10); i <= 50; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil || !sameLog(&got, mkLog(i)) {
			t.Fatalf("after reopen GetLog(%d) = %+v, %v", i, got, err)
		}
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("after reopen CurrentTerm = %d, %v", v, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "n2" {
		t.Fatalf("after reopen LastVoteCand = %q, %v", v, err)
	}
}

func TestSecondOpenTimesOut(t *testing.T) {
	dir := t.TempDir()
	openT(t, dir)
	start := time.Now()
	s2, err := Open(dir, Options{LockTimeout: 200 * time.Millisecond})
	if err == nil {
		s2.Close()
		t.Fatal("a second Open of a file in use succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("second Open took %v", d)
	}
}

func TestOpenRefusesBadDir(t *testing.T) {
	f := t.TempDir() + "/file"
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := Open(f, Options{LockTimeout: 100 * time.Millisecond}); err == nil {
		s.Close()
		t.Fatal("Open in a regular file's place succeeded")
	}
}

// TestCorruptEntryIsAnError damages stored values behind the store's back
// and checks that GetLog reports them instead of panicking or returning
// garbage.
func TestCorruptEntryIsAnError(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{mkLog(1), mkLog(2), mkLog(3), mkLog(4)}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	db, err := bolt.Open(dir+"/"+FileName, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		v := bytes.Clone(b.Get(indexKey(1)))
		v[len(v)/2] ^= 0xff // a flipped byte: checksum mismatch
		if err := b.Put(indexKey(1), v); err != nil {
			return err
		}
		if err := b.Put(indexKey(2), []byte{1}); err != nil { // truncated
			return err
		}
		// A valid entry of index 4 stored under key 3.
		return b.Put(indexKey(3), encodeLog(nil, mkLog(4)))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s = openT(t, dir)
	for _, i := range []uint64{1, 2, 3} {
		var l raft.Log
		if err := s.GetLog(i, &l); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("GetLog(%d) of a damaged entry: %v, want ErrCorrupt", i, err)
		}
	}
	var l raft.Log
	if err := s.GetLog(4, &l); err != nil || !sameLog(&l, mkLog(4)) {
		t.Fatalf("GetLog(4) = %+v, %v", l, err)
	}
}

func TestCodecRoundTrip(t *testing.T) {
	cases := []*raft.Log{
		{},
		{Index: ^uint64(0), Term: ^uint64(0), Type: raft.LogType(255)},
		{Index: 1, AppendedAt: time.Unix(-62135596800, 0)}, // year 1
		{Index: 2, AppendedAt: time.Unix(1<<40, 999999999)},
		mkLog(2), mkLog(3),
	}
	for _, want := range cases {
		var got raft.Log
		if err := decodeLog(encodeLog(nil, want), &got); err != nil || !sameLog(&got, want) {
			t.Fatalf("round trip of %+v = %+v, %v", *want, got, err)
		}
	}
}

func TestCodecRejectsEveryTruncation(t *testing.T) {
	b := encodeLog(nil, mkLog(42))
	for n := 0; n < len(b); n++ {
		var l raft.Log
		if err := decodeLog(b[:n], &l); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("decode of %d/%d bytes: %v", n, len(b), err)
		}
	}
	var l raft.Log
	if err := decodeLog(append(bytes.Clone(b), 0), &l); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decode with a trailing byte: %v", err)
	}
}

func FuzzDecodeLog(f *testing.F) {
	f.Add(encodeLog(nil, mkLog(1)))
	f.Add(encodeLog(nil, mkLog(2)))
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var l raft.Log
		if err := decodeLog(b, &l); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not wrapping ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes must survive a round trip unchanged.
		var again raft.Log
		if err := decodeLog(encodeLog(nil, &l), &again); err != nil || !sameLog(&l, &again) {
			t.Fatalf("round trip of a decoded entry: %+v, %v", again, err)
		}
	})
}

// The crash test: a child process appends batches in a loop and reports
// each StoreLogs that returned; the parent kills it with SIGKILL mid-loop
// and checks the file.

const crashEnv = "RAFTSTORE_CRASH_CHILD_DIR"

func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("helper process for TestCrashMidStoreLogs")
	}
	s, err := Open(dir, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	next := uint64(1)
	for batch := 1; ; batch++ {
		n := batch%7 + 1
		logs := make([]*raft.Log, n)
		for i := range logs {
			logs[i] = &raft.Log{Index: next, Term: 1, Type: raft.LogCommand,
				Data: bytes.Repeat([]byte{byte(next)}, 512)}
			next++
		}
		if err := s.StoreLogs(logs); err != nil {
			fmt.Println("store:", err)
			os.Exit(2)
		}
		fmt.Fprintf(w, "stored %d\n", next-1)
		w.Flush()
	}
}

func TestCrashMidStoreLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for round := 0; round < 3; round++ {
		dir := t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashEnv+"="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The reader records every StoreLogs the child reports as returned,
		// up to its death; the kill comes at an arbitrary moment, most
		// likely in the middle of a transaction's writes or sync.
		ackedCh := make(chan uint64, 1)
		started := make(chan struct{})
		go func() {
			var acked uint64
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "stored "); ok {
					if n, err := strconv.ParseUint(v, 10, 64); err == nil {
						if acked == 0 {
							close(started)
						}
						acked = n
					}
				}
			}
			ackedCh <- acked
		}()
		// The kill comes once the child is storing (its start takes a
		// while on a loaded machine), after a delay of its own each round.
		select {
		case <-started:
		case <-time.After(30 * time.Second):
		}
		time.Sleep(time.Duration(50+round*70) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		acked := <-ackedCh
		cmd.Wait()
		if acked == 0 {
			t.Fatal("child stored nothing before it was killed")
		}

		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatalf("reopen after SIGKILL: %v", err)
		}
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first != 1 || last < acked {
			s.Close()
			t.Fatalf("round %d: after SIGKILL log is %d..%d, but %d entries were acknowledged", round, first, last, acked)
		}
		for i := uint64(1); i <= last; i++ {
			var l raft.Log
			if err := s.GetLog(i, &l); err != nil {
				s.Close()
				t.Fatalf("round %d: hole or damage at %d of %d: %v", round, i, last, err)
			}
			if l.Index != i || len(l.Data) != 512 || l.Data[0] != byte(i) {
				s.Close()
				t.Fatalf("round %d: entry %d has wrong content", round, i)
			}
		}
		s.Close()
		t.Logf("round %d: %d acknowledged, %d on disk after SIGKILL", round, acked, last)
	}
}

func benchStoreLogs(b *testing.B, per int, noSync bool) {
	s, err := Open(b.TempDir(), Options{NoSync: noSync})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	payload := bytes.Repeat([]byte{0xab}, 512)
	next := uint64(1)
	logs := make([]*raft.Log, per)
	b.SetBytes(int64(per * len(payload)))
	b.ResetTimer()
	for b.Loop() {
		for i := range logs {
			logs[i] = &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: payload, AppendedAt: time.Now()}
			next++
		}
		if err := s.StoreLogs(logs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*per)/b.Elapsed().Seconds(), "entries/s")
}

func BenchmarkStoreLogs1(b *testing.B)  { benchStoreLogs(b, 1, false) }
func BenchmarkStoreLogs16(b *testing.B) { benchStoreLogs(b, 16, false) }

func BenchmarkGetLog(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var logs []*raft.Log
	for i := uint64(1); i <= 1000; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Data: bytes.Repeat([]byte{1}, 512)})
	}
	if err := s.StoreLogs(logs); err != nil {
		b.Fatal(err)
	}
	var l raft.Log
	i := uint64(0)
	for b.Loop() {
		if err := s.GetLog(i%1000+1, &l); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
