package xenops

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/storage"
	"toolstackd/internal/xerr"
)

// chainDisks is a DiskMover whose answers the test gives: the diffs it
// knows (vdi/base -> extents) and the overlays.
type chainDisks struct {
	DiskResolver
	diffs    map[[2]string][]storage.Extent
	overlays map[[2]string]bool
}

func (*chainDisks) ExportVDI(context.Context, string) (*storage.Export, error) { return nil, nil }
func (*chainDisks) ExportVDIReadOnly(context.Context, string) (*storage.Export, error) {
	return nil, nil
}
func (c *chainDisks) DiffExtents(_ context.Context, vdi, base string) ([]storage.Extent, error) {
	if e, ok := c.diffs[[2]string{vdi, base}]; ok {
		return e, nil
	}
	return nil, storage.ErrNoSharedHistory
}
func (c *chainDisks) IsOverlayOf(_ context.Context, vdi, base string) (bool, error) {
	return c.overlays[[2]string{vdi, base}], nil
}

// A disk with three snapshots (given out of order) going to one SR: the
// snapshots go oldest first, each based on the one before where the SR
// can tell the difference (s3 cannot be measured against s2, so it goes
// whole), and the running disk on the newest, which it overlays; a disk
// without snapshots keeps no base.
func TestChainMovesOrdersAndBases(t *testing.T) {
	d := db.New(dm.Model, db.Options{})
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	const mib = int64(1) << 20
	if _, err := d.Update(func(tx *db.Tx) error {
		vdi := func(ref string, size int64, of string, at time.Duration) {
			f := map[string]any{"virtual_size": size}
			if of != "" {
				f["is_a_snapshot"], f["snapshot_of"], f["snapshot_time"] = true, of, t0.Add(at)
			}
			insertFields(t, tx, dm.VDI.Class, ref, f)
		}
		vdi("OpaqueRef:disk", 64*mib, "", 0)
		vdi("OpaqueRef:s1", 32*mib, "OpaqueRef:disk", time.Hour)
		vdi("OpaqueRef:s2", 64*mib, "OpaqueRef:disk", 2*time.Hour)
		vdi("OpaqueRef:s3", 64*mib, "OpaqueRef:disk", 3*time.Hour)
		vdi("OpaqueRef:other", 8*mib, "", 0)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e := []storage.Extent{{Offset: 0, Length: mib}}
	cd := &chainDisks{
		diffs: map[[2]string][]storage.Extent{
			{"OpaqueRef:s2", "OpaqueRef:s1"}: e,
		},
		overlays: map[[2]string]bool{{"OpaqueRef:disk", "OpaqueRef:s3"}: true},
	}
	m := &Manager{disks: cd, log: slog.New(slog.DiscardHandler)}
	moves := []diskMove{
		{VBD: "vbd-disk", VDI: "OpaqueRef:disk", SR: "sr-b"},
		{VBD: "vbd-other", VDI: "OpaqueRef:other", SR: "sr-b"},
		{VBD: "vbd-s3", VDI: "OpaqueRef:s3", SR: "sr-b", Copy: true},
		{VBD: "vbd-s1", VDI: "OpaqueRef:s1", SR: "sr-b", Copy: true},
		{VBD: "vbd-s2", VDI: "OpaqueRef:s2", SR: "sr-b", Copy: true},
	}
	got := m.chainMoves(context.Background(), d.Snapshot(), moves)
	bases := map[string]string{}
	for _, mv := range got {
		bases[mv.VBD] = mv.Base
	}
	want := map[string]string{"vbd-s1": "", "vbd-s2": "vbd-s1", "vbd-s3": "", "vbd-disk": "vbd-s3", "vbd-other": ""}
	if !maps.Equal(bases, want) {
		t.Fatalf("bases %v, want %v", bases, want)
	}
	if !slices.Equal(got[4].diff, e) || got[2].diff != nil {
		t.Fatalf("diffs %v %v", got[4].diff, got[2].diff)
	}
	// The copies go oldest first, each after its base, whatever the
	// order of the moves.
	order, err := copyOrder(got)
	if err != nil {
		t.Fatal(err)
	}
	var vbds []string
	for _, i := range order {
		vbds = append(vbds, got[i].VBD)
	}
	if i1, i2 := slices.Index(vbds, "vbd-s1"), slices.Index(vbds, "vbd-s2"); len(vbds) != 3 || i1 < 0 || i2 < i1 {
		t.Fatalf("copy order %v", vbds)
	}
	// A base that is missing, itself, a circle, not a copy, or on
	// another SR is refused on the destination.
	for _, bad := range [][]diskMove{
		{{VBD: "a", Copy: true, Base: "z", SR: "x"}},
		{{VBD: "a", Copy: true, Base: "a", SR: "x"}},
		{{VBD: "a", Copy: true, Base: "b", SR: "x"}, {VBD: "b", Copy: true, Base: "a", SR: "x"}},
		{{VBD: "a", SR: "x"}, {VBD: "b", Copy: true, Base: "a", SR: "x"}},
		{{VBD: "a", Copy: true, SR: "x"}, {VBD: "b", Copy: true, Base: "a", SR: "y"}},
	} {
		if err := checkBases(bad); !xerr.HasCode(err, xerr.InternalError) {
			t.Errorf("checkBases(%v) = %v", bad, err)
		}
	}
}

// FuzzCopyOrder: the Bases of a migration header's disks come from the
// other host and are hostile until checked. copyOrder never panics, and
// what it accepts puts every copy once, each after its base, which is
// another copy to the same SR.
func FuzzCopyOrder(f *testing.F) {
	f.Add([]byte(`[{"vbd":"a","copy":true,"sr":"s"},{"vbd":"b","copy":true,"sr":"s","base":"a"},{"vbd":"c","sr":"s","base":"b"}]`))
	f.Add([]byte(`[{"vbd":"a","copy":true,"base":"b"},{"vbd":"b","copy":true,"base":"a"}]`))
	f.Add([]byte(`[{"vbd":"a","copy":true,"base":"a"},{"vbd":"a","copy":true}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var moves []diskMove
		if json.Unmarshal(b, &moves) != nil || len(moves) > 256 {
			return
		}
		order, err := copyOrder(moves)
		if err != nil {
			return
		}
		at := map[int]int{}
		for k, i := range order {
			if _, dup := at[i]; dup || !moves[i].Copy {
				t.Fatalf("order %v of %+v", order, moves)
			}
			at[i] = k
		}
		for i, mv := range moves {
			if !mv.Copy {
				continue
			}
			k, ok := at[i]
			if !ok {
				t.Fatalf("copy %d left out of %v", i, order)
			}
			if j := baseOf(moves, mv); j >= 0 && (at[j] >= k || !moves[j].Copy || moves[j].SR != mv.SR) {
				t.Fatalf("copy %d before its base %d in %v", i, j, order)
			}
		}
	})
}
