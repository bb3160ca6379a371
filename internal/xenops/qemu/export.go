package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"toolstackd/internal/nbd"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/qemu/qmp"
)

// Disk exports of an incoming domain (backend.DiskExporter): the
// destination end of a storage migration. The incoming QEMU (started
// with "-incoming defer") runs QEMU's own NBD server on a Unix socket
// beside its monitor (nbd-server-start) and exports the disk's format
// node writable (block-export-add), which activates the node ahead of
// the migration as QEMU does for this purpose. One process holds the
// image throughout, so QEMU's image locking has nothing to refuse: a
// qemu-nbd of its own on the same file would hold the write lock the
// incoming QEMU needs once its state has arrived.
//
// Names: export "mig-vbd<device>"; the server is the domain's only one
// and stops with its last export.

var _ backend.DiskExporter = (*QEMU)(nil)

// exportID names a disk's export.
func exportID(device string) string { return "mig-" + devID(device) }

// exportSock is the NBD server's socket of domain d.
func exportSock(d *qemuDomain) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return filepath.Join(filepath.Dir(d.j.QMPPath), "export.sock")
}

// ExportDisk implements backend.DiskExporter.
func (q *QEMU) ExportDisk(ctx context.Context, uuid, device, name string) (string, error) {
	d, mon, err := q.live(uuid)
	if err != nil {
		return "", err
	}
	d.mu.Lock()
	incoming := d.j.Spec.Incoming
	d.mu.Unlock()
	if !incoming {
		return "", fmt.Errorf("qemu: domain %s is not waiting for a migration", uuid)
	}
	disk, ok := d.disk(device)
	if !ok || disk.CD || disk.Path == "" {
		return "", fmt.Errorf("qemu: VM %s has no disk image at %s", uuid, device)
	}
	sock := exportSock(d)
	if _, err := os.Stat(sock); errors.Is(err, os.ErrNotExist) {
		// nbd-server-start takes the legacy form of a socket address.
		d.mu.Lock()
		addr := qmp.SocketAddressLegacy{Type: "unix", Data: qmp.UnixSocketAddress{Path: jailPath(&d.j, sock)}}
		d.mu.Unlock()
		if err := qmp.Do(ctx, mon, qmp.NBDServerStart{Addr: addr, MaxConnections: 4}); err != nil {
			return "", fmt.Errorf("qemu: nbd-server-start: %w", err)
		}
		if err := os.Chmod(sock, 0o600); err != nil {
			return "", err
		}
	}
	export := qmp.BlockExportAdd{Type: "nbd", ID: exportID(device), NodeName: topNode(disk), Writable: true, Export: name}
	if err := qmp.Do(ctx, mon, export); err != nil {
		return "", fmt.Errorf("qemu: block-export-add: %w", err)
	}
	q.log.Info("qemu: exporting an incoming domain's disk", "vm", uuid, "device", device)
	return nbd.URI{Network: "unix", Socket: sock, Export: name}.String(), nil
}

// UnexportDisk implements backend.DiskExporter.
func (q *QEMU) UnexportDisk(ctx context.Context, uuid, device string) error {
	d, mon, err := q.live(uuid)
	if err != nil {
		return nil // no domain, no export
	}
	exports, err := qmp.Run(ctx, mon, qmp.QueryBlockExports{})
	if err != nil {
		return err
	}
	left := 0
	for _, e := range exports {
		if e.ID != exportID(device) {
			left++
			continue
		}
		if err := qmp.Do(ctx, mon, qmp.BlockExportDel{ID: e.ID, Mode: "hard"}); err != nil {
			return fmt.Errorf("qemu: block-export-del: %w", err)
		}
	}
	if left == 0 {
		if _, err := os.Stat(exportSock(d)); err == nil {
			if err := qmp.Do(ctx, mon, qmp.NBDServerStop{}); err != nil {
				return fmt.Errorf("qemu: nbd-server-stop: %w", err)
			}
			_ = os.Remove(exportSock(d))
		}
	}
	return nil
}
