package backend

import "context"

// DiskExporter is the optional interface of a backend whose incoming
// domain (Spec.Incoming, waiting for ReceiveLive) can serve one of its
// own disks as a writable NBD export: the destination end of a storage
// migration's mirror. The domain's emulator holds the image itself, so
// that no second process needs it open while the mirror writes (QEMU's
// image locking would refuse one), as libvirt has the destination QEMU
// export its disks with nbd-server-start and block-export-add.
//
// The export listens on a Unix socket private to this host; the caller
// carries connections to it from the source host. UnexportDisk ends it
// (ReceiveLive completing does not), and destroying the domain ends
// every export.
type DiskExporter interface {
	// ExportDisk serves the disk at device of the incoming domain uuid
	// and returns its NBD URI (nbd+unix, export name as the caller
	// gives it). The export presents the disk's virtual size.
	ExportDisk(ctx context.Context, uuid, device, name string) (string, error)
	// UnexportDisk stops serving the disk (idempotent). Writes that
	// reached the export before are the disk's.
	UnexportDisk(ctx context.Context, uuid, device string) error
}
