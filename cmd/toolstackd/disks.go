package main

import (
	"context"
	"sync/atomic"

	"toolstackd/internal/storage"
	"toolstackd/internal/xenops"
)

// storageDisks gives VMs their disks through the storage layer's
// datapaths: xenops attaches and activates a VDI for a VM's VBD and gets
// back a file path or an NBD URI for QEMU.
// A disk a running VM holds read-write is switched onto the new overlay
// when it is snapshotted or cloned, so that the snapshot is a point in
// time.
type storageDisks struct {
	s  *storage.Service
	vm atomic.Pointer[xenops.Manager] // set once xenops is running
}

// datapath names one VM's use of one VDI.
func datapath(vm, vdi string) string { return "vbd/" + vm + "/" + vdi }

func (d *storageDisks) Attach(ctx context.Context, vm, vdi string, readonly bool) (xenops.DiskSource, error) {
	dp := datapath(vm, vdi)
	p, err := d.s.Attach(ctx, dp, vdi, readonly)
	if err != nil {
		return xenops.DiskSource{}, err
	}
	if err := d.s.Activate(ctx, dp, vdi); err != nil {
		_ = d.s.Detach(ctx, dp, vdi)
		return xenops.DiskSource{}, err
	}
	if m := d.vm.Load(); !readonly && m != nil {
		d.s.SetLiveSnapshotHook(dp, func(ctx context.Context, next storage.Datapath) error {
			return m.LiveSnapshot(ctx, vm, vdi, next.Path, next.Format)
		})
	}
	if p.Kind == "nbd" {
		return xenops.DiskSource{Kind: xenops.DiskNBD, NBDURI: p.URI, Format: "raw"}, nil
	}
	return xenops.DiskSource{Kind: xenops.DiskFile, Path: p.Path, Format: p.Format}, nil
}

func (d *storageDisks) Detach(ctx context.Context, vm, vdi string) error {
	dp := datapath(vm, vdi)
	if err := d.s.Deactivate(ctx, dp, vdi); err != nil {
		return err
	}
	return d.s.Detach(ctx, dp, vdi)
}
