package redolog

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkWriteDB15MiB writes a 15 MiB database record (xapi's redo log
// took 1.68 s for one) to a file opened O_DSYNC, alternating halves.
func BenchmarkWriteDB15MiB(b *testing.B) {
	d, err := OpenDevice(filepath.Join(b.TempDir(), "redo"), DeviceOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	data := dbBytes(1, 15<<20)
	b.SetBytes(int64(len(data)))
	var gen uint64
	for b.Loop() {
		gen++
		if err := d.WriteDB(gen, newMarker(), bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteDelta appends one delta record (a typical field write) per
// operation, O_DSYNC.
func BenchmarkWriteDelta(b *testing.B) {
	d, err := OpenDevice(filepath.Join(b.TempDir(), "redo"), DeviceOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	delta, _ := Delta{Kind: WriteField, Table: "VM", Ref: "OpaqueRef:8a3c2f9e-56b1-4f7e-9d0a-1b2c3d4e5f60",
		Field: "name__description", Value: "a description of moderate length"}.Encode()
	m := newMarker()
	gen := uint64(1)
	mustWriteDB(b, d, gen, m, dbBytes(1, 1<<20))
	b.SetBytes(int64(len(delta)))
	for b.Loop() {
		gen++
		err := d.WriteDelta(gen, m, delta)
		if errors.Is(err, ErrNoSpace) {
			b.StopTimer()
			m = newMarker()
			mustWriteDB(b, d, gen, m, dbBytes(1, 1<<20))
			b.StartTimer()
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead15MiB reads back a 15 MiB database and 1000 deltas.
func BenchmarkRead15MiB(b *testing.B) {
	path := filepath.Join(b.TempDir(), "redo")
	d, err := OpenDevice(path, DeviceOptions{})
	if err != nil {
		b.Fatal(err)
	}
	m := newMarker()
	mustWriteDB(b, d, 1, m, dbBytes(1, 15<<20))
	delta, _ := sampleDeltas[3].Encode()
	for g := uint64(2); g < 1002; g++ {
		mustWriteDelta(b, d, g, m, delta)
	}
	d.Close()
	for b.Loop() {
		r, err := Recover(path, RecoverOptions{})
		if err != nil || len(r.Deltas) != 1000 {
			b.Fatal(err)
		}
	}
}

// BenchmarkLogDelta is what a commit pays: encoding and queueing.
func BenchmarkLogDelta(b *testing.B) {
	db := newToyDB()
	l, err := Open(filepath.Join(b.TempDir(), "redo"), Options{Snapshot: db.snapshot, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ds := []Delta{{Kind: WriteField, Table: "VM", Ref: "OpaqueRef:8a3c2f9e-56b1-4f7e-9d0a-1b2c3d4e5f60",
		Field: "name__description", Value: "a description of moderate length"}}
	var gen uint64
	for b.Loop() {
		gen++
		l.Delta(gen, ds)
	}
}

// BenchmarkLogWriteDB15MiB is a whole-database write through the Log: the
// dump streamed over a pipe to the device goroutine.
func BenchmarkLogWriteDB15MiB(b *testing.B) {
	data := dbBytes(1, 15<<20)
	var gen uint64
	snap := func() (uint64, func(io.Writer) error) {
		g := gen
		return g, func(w io.Writer) error { _, err := w.Write(data); return err }
	}
	l, err := Open(filepath.Join(b.TempDir(), "redo"), Options{Snapshot: snap, Logger: discardLogger()})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		gen++
		_, dump := snap()
		l.WriteDB(gen, dump)
		if err := l.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if st := l.Stats(); st.Failures != 0 {
		b.Fatalf("stats %+v", st)
	}
}
