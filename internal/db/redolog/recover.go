package redolog

import (
	"errors"
	"fmt"
	"time"
)

// ErrEmpty means the log holds no database: it was never written or was
// emptied (validity byte '0').
var ErrEmpty = errors.New("redolog: log holds no database")

// Entry is one delta record: the deltas of one commit and the generation
// after it.
type Entry struct {
	Gen    uint64
	Deltas []Delta
}

// Recovered is the latest consistent state of a log: a database dump and
// the deltas to apply to it, in order.
type Recovered struct {
	Half   int    // the half it came from (1 or 2)
	Marker string // the database record's marker
	Gen    uint64 // the database's generation
	DB     []byte // the database dump as written
	Deltas []Entry
	// BadDelta is set when a complete delta record failed to decode: that
	// record and those after it are left out, so Deltas stays a prefix.
	BadDelta error
}

// LastGen returns the generation of the last record recovered.
func (r *Recovered) LastGen() uint64 {
	if n := len(r.Deltas); n > 0 {
		return r.Deltas[n-1].Gen
	}
	return r.Gen
}

// ReadState reads the latest consistent state from dev. It returns ErrEmpty
// if the log holds no database.
func ReadState(dev Device) (*Recovered, error) {
	var r *Recovered
	err := dev.Read(func(rec Record) error {
		switch rec.Kind {
		case RecordDB:
			r = &Recovered{Half: rec.Half, Marker: rec.Marker, Gen: rec.Gen, DB: rec.Data}
		case RecordDelta:
			if r == nil {
				return errors.New("redolog: delta record before the database record")
			}
			if r.BadDelta != nil {
				return nil
			}
			ds, err := DecodeAll(rec.Data)
			if err == nil && len(ds) == 0 {
				err = errors.New("no deltas in record")
			}
			if err != nil {
				r.BadDelta = fmt.Errorf("delta record %d: %w", rec.Gen, err)
				return nil
			}
			r.Deltas = append(r.Deltas, Entry{Gen: rec.Gen, Deltas: ds})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, ErrEmpty
	}
	return r, nil
}

// RecoverOptions tune Recover.
type RecoverOptions struct {
	HalfSize int64         // 0: DefaultHalfSize
	Timeout  time.Duration // for opening and reading; 0: DefaultReadTimeout
}

// Recover opens the log at path read-only and returns its latest consistent
// state, for another host to rebuild the database from. If the device does
// not answer within the timeout it returns ErrTimeout; the reading
// goroutine is then abandoned and closes the device whenever it returns.
func Recover(path string, opts RecoverOptions) (*Recovered, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultReadTimeout
	}
	type result struct {
		r   *Recovered
		err error
	}
	ch := make(chan result, 1)
	go func() {
		dev, err := OpenDevice(path, DeviceOptions{HalfSize: opts.HalfSize, ReadOnly: true})
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer func(c func() error) { _ = c() }(dev.Close)
		r, err := ReadState(dev)
		ch <- result{r, err}
	}()
	t := time.NewTimer(opts.Timeout)
	defer t.Stop()
	select {
	case res := <-ch:
		return res.r, res.err
	case <-t.C:
		return nil, fmt.Errorf("%w: reading %s", ErrTimeout, path)
	}
}
