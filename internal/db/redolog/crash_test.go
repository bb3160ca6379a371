package redolog

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The crash test re-executes the test binary: the child (TestCrashHelper
// with these variables set) writes to the log in a loop until the parent
// SIGKILLs it.
const (
	crashPathEnv = "REDOLOG_CRASH_PATH"
	crashModeEnv = "REDOLOG_CRASH_MODE"
	crashHalf    = 256 << 10
)

// Deterministic contents, so that the parent can check every byte it
// reads back against its generation.
func crashDB(gen uint64) []byte { return dbBytes(gen, 1000+int(gen%7000)) }

func crashDelta(gen uint64) string {
	return strings.Repeat(fmt.Sprintf("delta %d;", gen), 1+int(gen%40))
}

func TestCrashHelper(t *testing.T) {
	path := os.Getenv(crashPathEnv)
	if path == "" {
		t.Skip("helper process for TestCrashKill")
	}
	var err error
	switch os.Getenv(crashModeEnv) {
	case "device":
		err = crashChildDevice(path)
	case "log":
		err = crashChildLog(path)
	default:
		err = errors.New("bad mode")
	}
	fmt.Fprintln(os.Stderr, "child failed:", err)
	os.Exit(3)
}

// crashChildDevice writes through the Device directly, prints "UP" once it
// has read what is there and "ACK n" once the write of generation n has
// returned.
func crashChildDevice(path string) error {
	d, err := OpenDevice(path, DeviceOptions{HalfSize: crashHalf})
	if err != nil {
		return err
	}
	var gen uint64
	var marker string
	needDB := true
	err = d.Read(func(r Record) error {
		gen, marker, needDB = r.Gen, r.Marker, false
		return nil
	})
	if err != nil {
		return err
	}
	ack := func(g uint64) { fmt.Fprintf(os.Stdout, "ACK %d\n", g) }
	fmt.Fprintln(os.Stdout, "UP")
	for {
		gen++
		if needDB || gen%150 == 0 {
			marker = newMarker()
			if err := d.WriteDB(gen, marker, bytes.NewReader(crashDB(gen))); err != nil {
				return err
			}
			needDB = false
			ack(gen)
			continue
		}
		err := d.WriteDelta(gen, marker, []byte(crashDelta(gen)))
		if errors.Is(err, ErrNoSpace) {
			marker = newMarker()
			err = d.WriteDB(gen, marker, bytes.NewReader(crashDB(gen)))
		}
		if err != nil {
			return err
		}
		ack(gen)
	}
}

// crashChildLog commits to a toy database whose Delta calls go through a
// Log.
func crashChildLog(path string) error {
	var gen uint64
	if r, err := Recover(path, RecoverOptions{HalfSize: crashHalf}); err == nil {
		gen = r.LastGen()
	} else if !errors.Is(err, ErrEmpty) && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, ErrNotRedoLog) {
		return err
	}
	var mu sync.Mutex
	l, err := Open(path, Options{
		HalfSize: crashHalf,
		Snapshot: func() (uint64, func(io.Writer) error) {
			mu.Lock()
			g := gen
			mu.Unlock()
			return g, func(w io.Writer) error { _, err := w.Write(crashDB(g)); return err }
		},
		Logger: discardLogger(),
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stdout, "UP")
	for {
		mu.Lock()
		gen++
		l.Delta(gen, []Delta{{Kind: WriteField, Table: "t", Ref: "r", Field: "f", Value: crashDelta(gen)}})
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
	}
}

// crashCoverage is how many generations the kills must have covered in
// each mode, and crashBound how long the test may go on killing to get
// there: quiet, 30 kills cover it in about 2 s; the bound is for a machine
// so busy that the writer gets a small share of a core.
const (
	crashCoverage = 100
	crashBound    = 3 * time.Minute
)

func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	for _, c := range []struct {
		mode  string
		kills int
	}{{"device", 30}, {"log", 15}} {
		t.Run(c.mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "redo")
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
			var prevLast uint64
			deadline := time.Now().Add(crashBound)
			// At least c.kills kills, and on until the kills have covered
			// crashCoverage generations: coverage is counted in the writes
			// the children made, whatever share of the CPU they got.
			i := 0
			for ; i < c.kills || prevLast < crashCoverage; i++ {
				if time.Now().After(deadline) {
					t.Fatalf("after %d kills in %v the children wrote only %d generations", i, crashBound, prevLast)
				}
				// One kill in four comes at any moment from the start,
				// start-up and recovery included; the others a while after
				// the child is up and writing.
				afterUp := rng.IntN(4) != 0
				acked := runAndKill(t, path, c.mode, time.Duration(5+rng.IntN(150))*time.Millisecond, afterUp)
				last, desc := verifyCrashLog(t, path, c.mode)
				// Everything acknowledged is there, and at most the one
				// write in flight besides (a child killed before its first
				// acknowledgement leaves the previous state).
				maxAck := max(acked, prevLast)
				if c.mode == "device" && (last < maxAck || last > maxAck+1) {
					t.Fatalf("kill %d: recovered up to %d, but %d was acknowledged (%s)", i, last, maxAck, desc)
				}
				if last < prevLast {
					t.Fatalf("kill %d: recovered state went back from %d to %d", i, prevLast, last)
				}
				t.Logf("kill %d: acked %d, recovered %s", i, acked, desc)
				prevLast = last
			}
			t.Logf("%d kills covered %d generations", i, prevLast)
		})
	}
}

// runAndKill runs one child, SIGKILLs it after about d (counted from the
// moment it is up when afterUp is set, from its start otherwise)
// and returns the highest generation it acknowledged.
func runAndKill(t *testing.T, path, mode string, d time.Duration, afterUp bool) uint64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashPathEnv+"="+path, crashModeEnv+"="+mode)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var maxAck uint64
	acks := make(chan struct{})
	first := make(chan struct{})
	go func() {
		defer close(acks)
		seen := false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), "ACK "); ok {
				if n, err := strconv.ParseUint(s, 10, 64); err == nil && n > maxAck {
					maxAck = n
				}
			}
			if !seen {
				seen = true
				close(first)
			}
		}
	}()
	if afterUp {
		// Every child says UP once it has recovered and opened the log;
		// the bound is for one that never does (it is killed anyway, and
		// the checks that follow say what it left).
		select {
		case <-first:
		case <-acks:
		case <-time.After(30 * time.Second):
		}
	}
	time.Sleep(d)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-acks
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v (%s)", err, stderr.String())
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended by itself: %v\n%s", err, stderr.String())
	}
	return maxAck
}

// verifyCrashLog checks the log is a prefix of what the child wrote: the
// database is exactly the one written for its generation, and the deltas
// follow it one generation at a time, each exactly as written.
func verifyCrashLog(t *testing.T, path, mode string) (uint64, string) {
	t.Helper()
	dev, err := OpenDevice(path, DeviceOptions{HalfSize: crashHalf, ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrNotRedoLog) {
		return 0, "nothing"
	}
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var dbGen, last uint64
	n := 0
	half := 0
	err = dev.Read(func(r Record) error {
		switch r.Kind {
		case RecordDB:
			if !bytes.Equal(r.Data, crashDB(r.Gen)) {
				return fmt.Errorf("database %d is not what was written", r.Gen)
			}
			dbGen, last, half = r.Gen, r.Gen, r.Half
		case RecordDelta:
			if r.Gen != last+1 {
				return fmt.Errorf("delta %d follows %d", r.Gen, last)
			}
			want := []byte(crashDelta(r.Gen))
			if mode == "log" {
				want, _ = EncodeAll([]Delta{{Kind: WriteField, Table: "t", Ref: "r", Field: "f", Value: crashDelta(r.Gen)}})
			}
			if !bytes.Equal(r.Data, want) {
				return fmt.Errorf("delta %d is not what was written", r.Gen)
			}
			last = r.Gen
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return last, fmt.Sprintf("db %d in half %d + %d deltas up to %d", dbGen, half, n, last)
}
