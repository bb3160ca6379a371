package events_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"toolstackd/internal/api/events"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

func newDB(t testing.TB) *db.DB { return db.New(dm.Model, db.Options{}) }

func update(t testing.TB, d *db.DB, fn func(tx *db.Tx) error) uint64 {
	t.Helper()
	g, err := d.Update(fn)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	return g
}

func createVM(t testing.TB, d *db.DB, name string) string {
	t.Helper()
	var ref string
	update(t, d, func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name}).Row())
		return err
	})
	return ref
}

func createHost(t testing.TB, d *db.DB, name string) string {
	t.Helper()
	var ref string
	update(t, d, func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Host.Class, "", (&dm.HostRecord{NameLabel: name}).Row())
		return err
	})
	return ref
}

func setName(t testing.TB, d *db.DB, f *schema.Field, ref, name string) uint64 {
	t.Helper()
	return update(t, d, func(tx *db.Tx) error { return tx.Set(f, ref, name) })
}

func deleteRow(t testing.TB, d *db.DB, c *schema.Class, ref string) uint64 {
	t.Helper()
	return update(t, d, func(tx *db.Tx) error { return tx.Delete(c, ref) })
}

func sub(t testing.TB, classes ...string) events.Subscription {
	t.Helper()
	s, err := events.ParseSubscription(dm.Model, classes)
	if err != nil {
		t.Fatalf("ParseSubscription(%q): %v", classes, err)
	}
	return s
}

// from calls events.From with a background context.
func from(t testing.TB, d *db.DB, s events.Subscription, token string, timeout time.Duration) *events.Batch {
	t.Helper()
	b, err := events.From(context.Background(), d, s, token, timeout)
	if err != nil {
		t.Fatalf("From(%q): %v", token, err)
	}
	return b
}

// ev is an event in a form tests compare.
type ev struct {
	op    string
	class string
	ref   string
}

func evs(b *events.Batch) []ev {
	out := make([]ev, len(b.Events))
	for i, e := range b.Events {
		out[i] = ev{e.Op.String(), e.Class.Lower, e.Ref}
	}
	return out
}

func wantEvents(t *testing.T, b *events.Batch, want ...ev) {
	t.Helper()
	if got := evs(b); !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

func wantCode(t *testing.T, err error, code string, params ...string) {
	t.Helper()
	var xe *xerr.Error
	if !errors.As(err, &xe) {
		t.Fatalf("error %v is not a XenAPI error, want %s", err, code)
	}
	if xe.Code != code {
		t.Fatalf("error %v, want code %s", xe, code)
	}
	if params != nil && !slices.Equal(xe.Params, params) {
		t.Fatalf("error params %q, want %q", xe.Params, params)
	}
}
