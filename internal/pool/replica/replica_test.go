package replica

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// replicate ships the leader's batches since gen to the follower through
// an encoded entry, as the pool will through raft.
func replicate(t *testing.T, leader, follower *db.DB, gen uint64) uint64 {
	t.Helper()
	batches, err := leader.ChangesSince(gen)
	if err != nil {
		t.Fatal(err)
	}
	if entry, ok := Encode(batches); ok {
		rows, err := Decode(dm.Model, entry)
		if err != nil {
			t.Fatal(err)
		}
		if err := Apply(follower, rows); err != nil {
			t.Fatal(err)
		}
	}
	return leader.Generation()
}

// sameState compares every persistent row's stored fields, and the
// derived sets whose members are persistent.
func sameState(t *testing.T, a, b *db.DB) {
	t.Helper()
	sa, sb := a.Snapshot(), b.Snapshot()
	for _, c := range dm.Model.Classes {
		if !c.Persist || !c.InDB {
			continue
		}
		if na, nb := sa.Count(c), sb.Count(c); na != nb {
			t.Fatalf("%s: %d rows on the leader, %d on the member", c.Name, na, nb)
		}
		sa.Ascend(c, func(ra *db.Row) bool {
			rb, ok := sb.Get(c, ra.Ref)
			if !ok {
				t.Fatalf("%s %s missing on the member", c.Name, ra.Ref)
			}
			for _, f := range c.Fields {
				if f.Derived && !f.Inverse.Class.Persist || !f.Derived && !f.Persist {
					continue
				}
				if va, vb := sa.Value(ra, f), sb.Value(rb, f); !schema.Equal(va, vb) {
					t.Fatalf("%s %s .%s: leader %v, member %v", c.Name, ra.Ref, f.Name, va, vb)
				}
			}
			return true
		})
	}
}

func TestReplicatedStateMatches(t *testing.T) {
	leader := db.New(dm.Model, db.Options{})
	if _, err := api.FirstBoot(leader, api.ProbeHost(), api.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	follower := db.New(dm.Model, db.Options{})
	gen := replicate(t, leader, follower, 0)
	sameState(t, leader, follower)

	rng := rand.New(rand.NewPCG(1, 2))
	var vms, vbds []string
	for round := range 300 {
		_, err := leader.Update(func(tx *db.Tx) error {
			switch k := rng.IntN(8); {
			case k < 2 || len(vms) == 0:
				ref, err := tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: fmt.Sprint("vm", round),
					OtherConfig: map[string]string{"n": fmt.Sprint(round)}}).Row())
				vms = append(vms, ref)
				return err
			case k == 2:
				vm := vms[rng.IntN(len(vms))]
				ref, err := tx.Insert(dm.VBD.Class, "", (&dm.VBDRecord{VM: dm.VMRef(vm), VDI: schema.NullRef, Userdevice: fmt.Sprint(round)}).Row())
				vbds = append(vbds, ref)
				return err
			case k == 3 && len(vbds) > 0:
				i := rng.IntN(len(vbds))
				ref := vbds[i]
				vbds = append(vbds[:i], vbds[i+1:]...)
				return tx.Delete(dm.VBD.Class, ref)
			case k == 4:
				// Never replicated: sessions stay on the coordinator.
				_, err := tx.Insert(dm.Session.Class, "", (&dm.SessionRecord{}).Row())
				return err
			case k == 5:
				return tx.AddToMap(dm.VM.OtherConfig, vms[rng.IntN(len(vms))], fmt.Sprint("k", round), "v")
			case k == 6:
				// Back to the default value: must travel too.
				return tx.Set(dm.VM.NameDescription, vms[rng.IntN(len(vms))], "")
			default:
				return tx.Set(dm.VM.NameLabel, vms[rng.IntN(len(vms))], fmt.Sprint("renamed", round))
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		// Ship one batch at a time or several together.
		if rng.IntN(3) == 0 {
			gen = replicate(t, leader, follower, gen)
			sameState(t, leader, follower)
		}
	}
	// A VM with devices deleted at the end.
	if _, err := leader.Update(func(tx *db.Tx) error {
		for _, ref := range vbds {
			if err := tx.Delete(dm.VBD.Class, ref); err != nil {
				return err
			}
		}
		return tx.Delete(dm.VM.Class, vms[0])
	}); err != nil {
		t.Fatal(err)
	}
	replicate(t, leader, follower, gen)
	sameState(t, leader, follower)
	if n := follower.Snapshot().Count(dm.Session.Class); n != 0 {
		t.Errorf("%d sessions replicated", n)
	}
	// Applying the same entry twice leaves the state as it is.
	batches, _ := leader.ChangesSince(0)
	entry, _ := Encode(batches)
	rows, err := Decode(dm.Model, entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := Apply(follower, rows); err != nil {
		t.Fatal(err)
	}
	sameState(t, leader, follower)
}

// firstBootEntry is the entry of a freshly booted host's database.
func firstBootEntry(tb testing.TB) []byte {
	tb.Helper()
	leader := db.New(dm.Model, db.Options{})
	if _, err := api.FirstBoot(leader, api.ProbeHost(), api.BootOptions{}); err != nil {
		tb.Fatal(err)
	}
	batches, err := leader.ChangesSince(0)
	if err != nil {
		tb.Fatal(err)
	}
	entry, ok := Encode(batches)
	if !ok {
		tb.Fatal("nothing encoded")
	}
	return entry
}

func TestDecodeRejectsDamage(t *testing.T) {
	entry := firstBootEntry(t)
	for cut := range len(entry) {
		if _, err := Decode(dm.Model, entry[:cut]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	if _, err := Decode(dm.Model, append(entry, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("trailing byte: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(firstBootEntry(f))
	f.Add([]byte{1, 1, 1, 2, 'V', 'M', 3, 'x', 'y', 'z'})
	member := db.New(dm.Model, db.Options{})
	f.Fuzz(func(t *testing.T, b []byte) {
		rows, err := Decode(dm.Model, b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		// Whatever decodes applies without a panic.
		_ = Apply(member, rows)
	})
}
