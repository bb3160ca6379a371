package main

import (
	"context"

	"toolstackd/internal/storage"
	"toolstackd/internal/xenops"
)

var _ xenops.DiskMover = (*storageDisks)(nil)

// ExportVDI serves a VDI of this host as a writable NBD export for a
// storage migration's copy (xenops.DiskMover): storage.Export.
func (d *storageDisks) ExportVDI(ctx context.Context, vdi string) (*storage.Export, error) {
	return d.s.Export(ctx, vdi)
}

// ExportVDIReadOnly serves a VDI read-only, shared with a guest that
// has it open (xenops.DiskMover): storage.ExportReadOnly.
func (d *storageDisks) ExportVDIReadOnly(ctx context.Context, vdi string) (*storage.Export, error) {
	return d.s.ExportReadOnly(ctx, vdi)
}

// DiffExtents lists where a VDI differs from an older snapshot of it
// (xenops.DiskMover): storage.DiffExtents.
func (d *storageDisks) DiffExtents(ctx context.Context, vdi, base string) ([]storage.Extent, error) {
	return d.s.DiffExtents(ctx, vdi, base)
}

// IsOverlayOf reports whether a VDI reads as its snapshot base with its
// own top image over it (xenops.DiskMover): storage.IsOverlayOf.
func (d *storageDisks) IsOverlayOf(ctx context.Context, vdi, base string) (bool, error) {
	return d.s.IsOverlayOf(ctx, vdi, base)
}
