package storage

import (
	"context"
	"errors"
	"slices"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/xerr"
)

// Chains for storage migration: a disk and its snapshots share history
// on an SR that keeps snapshots as backing chains, and a migration that
// moves them together sends that history once (the oldest snapshot in
// full, each later one as what changed since the one before, the disk
// itself as its own top image), as xapi's storage migration does with
// its "similar" VDIs. These two calls tell a migration what it may skip.

// ErrNoSharedHistory is DiffExtents' answer when the SR cannot say,
// from its metadata alone, where two VDIs differ (not one SR, not one
// chain, or a driver that keeps no chains): the caller copies in full.
var ErrNoSharedHistory = errors.New("the VDIs share no history the SR can read")

// Overlayer is an optional SR capability: IsOverlayOf reports whether
// volume key reads as baseKey does with key's own top image over it
// (both on the same backing chain, and baseKey's top image holding no
// data), so that what key adds to baseKey is exactly its top image.
type Overlayer interface {
	IsOverlayOf(ctx context.Context, key, baseKey string) (bool, error)
}

// chainPair finds two VDIs of one SR attached on this host.
func (s *Service) chainPair(vdiRef, baseRef string) (*boundSR, string, string, error) {
	snap := s.db.Snapshot()
	vdi, ok := snap.Get(dm.VDI.Class, vdiRef)
	if !ok {
		return nil, "", "", xerr.New(xerr.HandleInvalid, "VDI", vdiRef)
	}
	base, ok := snap.Get(dm.VDI.Class, baseRef)
	if !ok {
		return nil, "", "", xerr.New(xerr.HandleInvalid, "VDI", baseRef)
	}
	if vdi.String(dm.VDI.SR) != base.String(dm.VDI.SR) {
		return nil, "", "", ErrNoSharedHistory
	}
	b, err := s.attached(vdi.String(dm.VDI.SR))
	if err != nil {
		return nil, "", "", err
	}
	return b, vdi.String(dm.VDI.Location), base.String(dm.VDI.Location), nil
}

// DiffExtents lists where VDI vdiRef differs from VDI baseRef (an older
// snapshot in its history), from the SR's metadata: ErrNoSharedHistory
// when the SR cannot tell so.
func (s *Service) DiffExtents(ctx context.Context, vdiRef, baseRef string) ([]Extent, error) {
	b, key, baseKey, err := s.chainPair(vdiRef, baseRef)
	if err != nil {
		return nil, err
	}
	d, ok := b.sr.(Differ)
	if !ok {
		return nil, ErrNoSharedHistory
	}
	ext, err := d.ChangedExtents(ctx, key, baseKey)
	if errors.Is(err, errNoCommonHistory) {
		return nil, ErrNoSharedHistory
	}
	return ext, err
}

// IsOverlayOf reports whether VDI vdiRef reads as VDI baseRef with its
// own top image over it (Overlayer): a mirror of only that top image
// onto a copy of baseRef then makes a copy of vdiRef. False where the
// SR cannot tell.
func (s *Service) IsOverlayOf(ctx context.Context, vdiRef, baseRef string) (bool, error) {
	b, key, baseKey, err := s.chainPair(vdiRef, baseRef)
	if errors.Is(err, ErrNoSharedHistory) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	o, ok := b.sr.(Overlayer)
	if !ok {
		return false, nil
	}
	return o.IsOverlayOf(ctx, key, baseKey)
}

// IsOverlayOf implements Overlayer: key and baseKey have the same
// backing images below their tops, and baseKey's top holds no data (a
// snapshot's, as branch leaves it, never written since).
func (s *fileSR) IsOverlayOf(ctx context.Context, key, baseKey string) (bool, error) {
	k, b, err := s.imagePair(key, baseKey)
	if err != nil {
		return false, err
	}
	if len(k.chain) < 2 || !slices.Equal(k.chain[1:], b.chain[1:]) {
		return false, nil
	}
	size, err := imageSize(b.path, b.format)
	if err != nil {
		return false, err
	}
	m, err := imageMap(ctx, b.path, b.format, size)
	if err != nil {
		return false, err
	}
	for _, e := range m {
		if e.Present && e.Depth == 0 {
			return false, nil
		}
	}
	return true, nil
}
