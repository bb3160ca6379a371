package main

import (
	"context"

	"toolstackd/internal/xenops"
)

// Suspend images live in VDIs of the suspend SR: storageDisks hands
// xenops the storage layer's suspend store.
var _ xenops.SuspendStore = (*storageDisks)(nil)

func (d *storageDisks) CreateSuspendVDI(ctx context.Context, vm, forUUID, sr string, size int64) (string, error) {
	return d.s.CreateSuspendVDI(ctx, vm, forUUID, sr, size)
}

func (d *storageDisks) DestroySuspendVDI(ctx context.Context, vdi string) error {
	return d.s.DestroySuspendVDI(ctx, vdi)
}

func (d *storageDisks) SaveSuspendImage(ctx context.Context, vdi, path string) error {
	return d.s.SaveSuspendImage(ctx, vdi, path)
}

func (d *storageDisks) LoadSuspendImage(ctx context.Context, vm, vdi, path string) error {
	return d.s.LoadSuspendImage(ctx, vm, vdi, path)
}

func (d *storageDisks) CopySuspendVDI(ctx context.Context, vdi, vmUUID, sr string) (string, error) {
	return d.s.CopySuspendVDI(ctx, vdi, vmUUID, sr)
}
