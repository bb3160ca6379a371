package replica

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// replicate ships the leader's batches since gen to the follower through
// an encoded entry, as the pool will through raft.
func replicate(t *testing.T, encode func([]*db.Batch) ([]byte, bool), leader, follower *db.DB, gen uint64) uint64 {
	t.Helper()
	batches, err := leader.ChangesSince(gen)
	if err != nil {
		t.Fatal(err)
	}
	if entry, ok := encode(batches); ok {
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

// Whole rows (the coordinator's entries) and deltas (a member's changes
// sent to the coordinator) both leave a member in sync in the same state.
func TestReplicatedStateMatches(t *testing.T) {
	t.Run("rows", func(t *testing.T) { testReplicatedState(t, Encode) })
	t.Run("delta", func(t *testing.T) { testReplicatedState(t, EncodeDelta) })
}

func testReplicatedState(t *testing.T, encode func([]*db.Batch) ([]byte, bool)) {
	leader := db.New(dm.Model, db.Options{})
	if _, err := api.FirstBoot(leader, api.ProbeHost(), api.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	follower := db.New(dm.Model, db.Options{})
	gen := replicate(t, encode, leader, follower, 0)
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
			gen = replicate(t, encode, leader, follower, gen)
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
	replicate(t, encode, leader, follower, gen)
	sameState(t, leader, follower)
	if n := follower.Snapshot().Count(dm.Session.Class); n != 0 {
		t.Errorf("%d sessions replicated", n)
	}
	// Applying the same entry twice leaves the state as it is.
	batches, _ := leader.ChangesSince(0)
	entry, _ := encode(batches)
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
	return encodeSince(tb, leader, 0, Encode)
}

// encodeSince is the entry encode makes of d's batches since gen.
func encodeSince(tb testing.TB, d *db.DB, gen uint64, encode func([]*db.Batch) ([]byte, bool)) []byte {
	tb.Helper()
	batches, err := d.ChangesSince(gen)
	if err != nil {
		tb.Fatal(err)
	}
	entry, ok := encode(batches)
	if !ok {
		tb.Fatal("nothing encoded")
	}
	return entry
}

func TestDecodeRejectsDamage(t *testing.T) {
	for _, entry := range [][]byte{firstBootEntry(t), patchEntry(t)} {
		if _, err := Decode(dm.Model, entry); err != nil {
			t.Fatal(err)
		}
		for cut := range len(entry) {
			if _, err := Decode(dm.Model, entry[:cut]); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("cut at %d: %v", cut, err)
			}
		}
		if _, err := Decode(dm.Model, append(entry, 0)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("trailing byte: %v", err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(firstBootEntry(f))
	f.Add([]byte{1, 1, 1, 2, 'V', 'M', 3, 'x', 'y', 'z'})
	f.Add(patchEntry(f))
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

// A member's patch sets only what the member changed: a change the
// coordinator made meanwhile to another field of the row survives.
func TestPatchKeepsOtherFields(t *testing.T) {
	coord := db.New(dm.Model, db.Options{})
	ref, err := insertVM(coord, "vm")
	if err != nil {
		t.Fatal(err)
	}
	member := db.New(dm.Model, db.Options{})
	gen := replicate(t, Encode, coord, member, 0)
	if _, err := coord.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameDescription, ref, "by the coordinator") }); err != nil {
		t.Fatal(err)
	}
	mgen := member.Generation()
	if _, err := member.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, ref, "by the member") }); err != nil {
		t.Fatal(err)
	}
	replicate(t, EncodeDelta, member, coord, mgen)
	row, _ := coord.Snapshot().Get(dm.VM.Class, ref)
	if row.String(dm.VM.NameLabel) != "by the member" || row.String(dm.VM.NameDescription) != "by the coordinator" {
		t.Fatalf("after the patch: %q, %q", row.String(dm.VM.NameLabel), row.String(dm.VM.NameDescription))
	}
	// A patch of a row the coordinator deleted meanwhile is a no-op.
	if _, err := coord.Update(func(tx *db.Tx) error { return tx.Delete(dm.VM.Class, ref) }); err != nil {
		t.Fatal(err)
	}
	mgen = member.Generation()
	if _, err := member.Update(func(tx *db.Tx) error { return tx.Set(dm.VM.NameLabel, ref, "again") }); err != nil {
		t.Fatal(err)
	}
	replicate(t, EncodeDelta, member, coord, mgen)
	if _, ok := coord.Snapshot().Get(dm.VM.Class, ref); ok {
		t.Fatal("a patch brought a deleted row back")
	}
	_ = gen
}

// A state entry replaces a member's persistent rows wholesale and leaves
// its in-memory rows alone.
func TestStateReplaces(t *testing.T) {
	coord := db.New(dm.Model, db.Options{})
	if _, err := api.FirstBoot(coord, api.ProbeHost(), api.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	member := db.New(dm.Model, db.Options{})
	if _, err := api.FirstBoot(member, api.ProbeHost(), api.BootOptions{}); err != nil {
		t.Fatal(err)
	}
	stale, err := insertVM(member, "only on the member")
	if err != nil {
		t.Fatal(err)
	}
	var session string
	if _, err := member.Update(func(tx *db.Tx) error {
		session, err = tx.Insert(dm.Session.Class, "", (&dm.SessionRecord{}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rows, err := Decode(dm.Model, EncodeState(dm.Model, coord.Snapshot()))
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(member, rows); err != nil {
		t.Fatal(err)
	}
	sameState(t, coord, member)
	if _, ok := member.Snapshot().Get(dm.VM.Class, stale); ok {
		t.Error("a row the state lacks survived")
	}
	if _, ok := member.Snapshot().Get(dm.Session.Class, session); !ok {
		t.Error("an in-memory row was dropped")
	}
}

func insertVM(d *db.DB, name string) (ref string, err error) {
	_, err = d.Update(func(tx *db.Tx) error {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: name}).Row())
		return err
	})
	return ref, err
}

// A member's change to a set or a map, made on a copy that lagged behind
// the coordinator's, is merged into the coordinator's value: what the
// coordinator added or removed meanwhile survives, as xapi's add_to_ and
// remove_from_ calls on the coordinator keep it.
func TestPatchMergesSetsAndMaps(t *testing.T) {
	coord := db.New(dm.Model, db.Options{})
	var ref string
	if _, err := coord.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.VM.Class, "", (&dm.VMRecord{NameLabel: "vm",
			OtherConfig: map[string]string{"k": "v", "shared": "old"}, Tags: []string{"a"}}).Row())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	member := db.New(dm.Model, db.Options{})
	replicate(t, Encode, coord, member, 0)
	// The coordinator changes both; the member has not seen it.
	if _, err := coord.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.OtherConfig, ref, map[string]string{"k": "v", "shared": "theirs", "c": "1"}); err != nil {
			return err
		}
		return tx.Set(dm.VM.Tags, ref, []string{"a", "c"})
	}); err != nil {
		t.Fatal(err)
	}
	mgen := member.Generation()
	if _, err := member.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.OtherConfig, ref, map[string]string{"shared": "old", "m": "2"}); err != nil {
			return err
		}
		return tx.Set(dm.VM.Tags, ref, []string{"m"})
	}); err != nil {
		t.Fatal(err)
	}
	replicate(t, EncodeDelta, member, coord, mgen)
	row, _ := coord.Snapshot().Get(dm.VM.Class, ref)
	wantOC := map[string]string{"shared": "theirs", "c": "1", "m": "2"}
	if oc := row.Get(dm.VM.OtherConfig); !schema.Equal(oc, wantOC) {
		t.Errorf("other_config %v, want %v (k removed by the member, c kept, shared left as the coordinator set it)", oc, wantOC)
	}
	if tags := row.Get(dm.VM.Tags); !schema.Equal(tags, []string{"c", "m"}) {
		t.Errorf("tags %v, want [c m]", tags)
	}
	// A key both changed: the member's write, the later one, wins.
	replicate(t, Encode, coord, member, 0)
	mgen = member.Generation()
	if _, err := coord.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.OtherConfig, ref, map[string]string{"shared": "coordinator"})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := member.Update(func(tx *db.Tx) error {
		return tx.Set(dm.VM.OtherConfig, ref, map[string]string{"shared": "member", "c": "1", "m": "2"})
	}); err != nil {
		t.Fatal(err)
	}
	replicate(t, EncodeDelta, member, coord, mgen)
	row, _ = coord.Snapshot().Get(dm.VM.Class, ref)
	if oc := row.Get(dm.VM.OtherConfig); !schema.Equal(oc, map[string]string{"shared": "member"}) {
		t.Errorf("other_config %v, want only shared=member (c and m were removed by the coordinator)", oc)
	}
}

// patchEntry is a member's delta that changes a VM's name and its
// other_config (a patch with a value before for the map).
func patchEntry(tb testing.TB) []byte {
	tb.Helper()
	d := db.New(dm.Model, db.Options{})
	ref, err := insertVM(d, "vm")
	if err != nil {
		tb.Fatal(err)
	}
	gen := d.Generation()
	if _, err := d.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.VM.NameLabel, ref, "renamed"); err != nil {
			return err
		}
		return tx.Set(dm.VM.OtherConfig, ref, map[string]string{"k": "v"})
	}); err != nil {
		tb.Fatal(err)
	}
	return encodeSince(tb, d, gen, EncodeDelta)
}
