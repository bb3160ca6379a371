package sim

import (
	"context"
	"fmt"
	"sync"

	"toolstackd/internal/storage"
	"toolstackd/internal/xenops/backend"
)

// Disk exports of an incoming domain (backend.DiskExporter). The
// simulator holds no image open, so a real NBD server (storage's
// qemu-nbd export of the image file) stands in for the emulator's own:
// a mirror that completes into it writes real bytes, as the simulator's
// CompleteMirror does for a raw image.

var _ backend.DiskExporter = (*Simulator)(nil)

// simExports are the exports of every simulator in the process, by
// simulator and disk.
var simExports = struct {
	sync.Mutex
	m map[exportKey]*storage.Export
}{m: map[exportKey]*storage.Export{}}

type exportKey struct {
	s *Simulator
	mirrorKey
}

// ExportDisk implements backend.DiskExporter. The export's name is
// always storage.ExportName.
func (s *Simulator) ExportDisk(ctx context.Context, uuid, device, _ string) (string, error) {
	if err := s.step(ctx, "export"); err != nil {
		return "", err
	}
	s.mu.Lock()
	d, err := s.get(uuid)
	var disk backend.Disk
	found := false
	if err == nil {
		if !d.Spec.Incoming {
			err = fmt.Errorf("simulator: domain %s is not waiting for a migration", uuid)
		}
		for _, x := range d.Info.Disks {
			if x.Device == device && !x.CD && x.Path != "" {
				disk, found = x, true
			}
		}
	}
	s.mu.Unlock()
	if err != nil {
		return "", err
	}
	if !found {
		return "", fmt.Errorf("simulator: VM %s has no disk image at %s", uuid, device)
	}
	k := exportKey{s, mirrorKey{uuid, device}}
	simExports.Lock()
	_, busy := simExports.m[k]
	simExports.Unlock()
	if busy {
		return "", fmt.Errorf("simulator: disk %s of VM %s is exported already", device, uuid)
	}
	e, err := storage.ExportImage(ctx, "", disk.Path, disk.Format)
	if err != nil {
		return "", err
	}
	simExports.Lock()
	simExports.m[k] = e
	simExports.Unlock()
	return e.URI().String(), nil
}

// UnexportDisk implements backend.DiskExporter.
func (s *Simulator) UnexportDisk(_ context.Context, uuid, device string) error {
	k := exportKey{s, mirrorKey{uuid, device}}
	simExports.Lock()
	e := simExports.m[k]
	delete(simExports.m, k)
	simExports.Unlock()
	if e == nil {
		return nil
	}
	return e.Close()
}
