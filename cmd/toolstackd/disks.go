package main

import (
	"context"

	"toolstackd/internal/storage"
)

// storageDisks gives VMs their disks through the storage layer's
// datapaths: xenops attaches and activates a VDI for a VM's VBD and gets
// back a file path or an NBD URI for QEMU.
type storageDisks struct{ s *storage.Service }

// datapath names one VM's use of one VDI.
func datapath(vm, vdi string) string { return "vbd/" + vm + "/" + vdi }

func (d storageDisks) Attach(ctx context.Context, vm, vdi string, readonly bool) (string, string, error) {
	dp := datapath(vm, vdi)
	p, err := d.s.Attach(ctx, dp, vdi, readonly)
	if err != nil {
		return "", "", err
	}
	if err := d.s.Activate(ctx, dp, vdi); err != nil {
		d.s.Detach(ctx, dp, vdi)
		return "", "", err
	}
	if p.Kind == "nbd" {
		return p.URI, "raw", nil
	}
	return p.Path, p.Format, nil
}

func (d storageDisks) Detach(ctx context.Context, vm, vdi string) error {
	dp := datapath(vm, vdi)
	if err := d.s.Deactivate(ctx, dp, vdi); err != nil {
		return err
	}
	return d.s.Detach(ctx, dp, vdi)
}
