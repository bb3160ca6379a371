package persist

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"toolstackd/internal/db"
	"toolstackd/internal/db/redolog"
	"toolstackd/internal/db/xmldb"
	"toolstackd/internal/schema"
)

// AttachRedoLog mirrors the database into a redo log (a file or block
// device, e.g. on shared storage), so that another host can rebuild it:
// every durable commit becomes one delta record, and the whole database
// (in xapi's state.db form) is written whenever the log needs it. Writing
// the log never blocks API calls; a hung or failed device is an alert.
func AttachRedoLog(s *Store, d *db.DB, path string, log *slog.Logger) (*redolog.Log, error) {
	m := d.Model()
	// The observer is in place before the log takes its first snapshot,
	// and holds back commits until the log is open: none falls between.
	var mu sync.Mutex
	var rl *redolog.Log
	mu.Lock()
	defer mu.Unlock()
	s.Observe(func(b *db.Batch) {
		mu.Lock()
		defer mu.Unlock()
		if rl == nil {
			return
		}
		if ds := Deltas(b); len(ds) > 0 {
			rl.Delta(b.To, ds)
		}
	})
	var err error
	rl, err = redolog.Open(path, redolog.Options{
		Logger: log,
		Snapshot: func() (uint64, func(io.Writer) error) {
			snap := d.Snapshot()
			return snap.Generation(), func(w io.Writer) error { return xmldb.Encode(w, m, snap) }
		},
		OnAlert: func(a redolog.Alert) { log.Warn("redo log", "alert", fmt.Sprintf("%+v", a)) },
	})
	if err != nil {
		return nil, err
	}
	return rl, nil
}

// Deltas turns a committed batch into redo-log deltas: persistent tables
// and columns only; a row that was only marked modified (the parent side
// of a relation) has nothing to log.
func Deltas(b *db.Batch) []redolog.Delta {
	var out []redolog.Delta
	for _, ch := range b.Changes {
		c := ch.Class
		if !c.Persist {
			continue
		}
		switch {
		case ch.Op == db.OpCreate:
			var fields [][2]string
			for _, f := range c.Fields {
				if f.Persist && !f.Derived {
					fields = append(fields, [2]string{f.Column, schema.FormatDB(f.Type, ch.Row.At(f.Index))})
				}
			}
			out = append(out, redolog.Delta{Kind: redolog.CreateRow, Table: c.Name, Ref: ch.Ref, Fields: fields})
		case ch.Op == db.OpDelete:
			out = append(out, redolog.Delta{Kind: redolog.DeleteRow, Table: c.Name, Ref: ch.Ref})
		case ch.Field != nil && ch.Field.Persist && !ch.Field.Derived:
			f := ch.Field
			out = append(out, redolog.Delta{Kind: redolog.WriteField, Table: c.Name, Ref: ch.Ref, Field: f.Column,
				Value: schema.FormatDB(f.Type, ch.Row.At(f.Index))})
		}
	}
	return out
}

// RecoverFromRedoLog rebuilds a database from a redo log: the last
// complete database record, then every delta after it. It returns the
// database (no persister attached) to be written out by the caller.
func RecoverFromRedoLog(path string, m *schema.Model) (*db.DB, *redolog.Recovered, error) {
	rec, err := redolog.Recover(path, redolog.RecoverOptions{})
	if err != nil {
		return nil, nil, err
	}
	dump, err := xmldb.Decode(bytes.NewReader(rec.DB), m)
	if err != nil {
		return nil, nil, fmt.Errorf("redo log database record: %w", err)
	}
	d := db.New(m, db.Options{})
	if err := d.Load(dump.Generation, func(l *db.Loader) error {
		for c, rows := range dump.Tables {
			if !c.Persist {
				continue
			}
			for _, r := range rows {
				if err := l.Row(c, r.Ref, r.Created, r.Modified, r.Values); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, e := range rec.Deltas {
		if e.Gen <= dump.Generation {
			continue
		}
		if _, err := d.Update(func(tx *db.Tx) error {
			tx.Lenient = true
			for _, dl := range e.Deltas {
				if err := applyDelta(tx, m, dl); err != nil {
					return fmt.Errorf("delta at generation %d: %w", e.Gen, err)
				}
			}
			return nil
		}); err != nil {
			return nil, nil, err
		}
	}
	return d, rec, nil
}

func applyDelta(tx *db.Tx, m *schema.Model, dl redolog.Delta) error {
	c := m.Class(dl.Table)
	if c == nil || !c.InDB {
		return fmt.Errorf("unknown table %q", dl.Table)
	}
	switch dl.Kind {
	case redolog.CreateRow:
		values := make([]any, len(c.Fields))
		for _, kv := range dl.Fields {
			f := c.Field(kv[0])
			if f == nil {
				return fmt.Errorf("unknown column %s.%s", c.Name, kv[0])
			}
			v, err := schema.ParseDB(f.Type, kv[1])
			if err != nil {
				return err
			}
			values[f.Index] = v
		}
		_, err := tx.Insert(c, dl.Ref, values)
		return err
	case redolog.DeleteRow:
		if _, ok := tx.Get(c, dl.Ref); !ok {
			return nil
		}
		return tx.Delete(c, dl.Ref)
	case redolog.WriteField:
		f := c.Field(dl.Field)
		if f == nil {
			return fmt.Errorf("unknown column %s.%s", c.Name, dl.Field)
		}
		v, err := schema.ParseDB(f.Type, dl.Value)
		if err != nil {
			return err
		}
		return tx.Set(f, dl.Ref, v)
	}
	return fmt.Errorf("unknown delta kind %v", dl.Kind)
}
