package xenops

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// DiskResolver is what xenops needs from storage: a VDI's data as a file
// or block device on this host, for as long as a VM uses it. Storage
// provides it; xenops never looks inside an SR itself.
type DiskResolver interface {
	// Attach makes a VDI usable on this host for a VM (by uuid: storage
	// names the datapath after it) and says where its data is. Errors
	// should be XenAPI errors (VDI_MISSING, SR_BACKEND_FAILURE_*).
	Attach(ctx context.Context, vm, vdi string, readonly bool) (DiskSource, error)
	// Detach undoes Attach. Detaching what is not attached is not an
	// error.
	Detach(ctx context.Context, vm, vdi string) error
}

// Kinds of VDI copy that VM.clone, snapshot and copy ask for.
const (
	CopyClone    = "clone"    // a copy-on-write clone (VDI.clone)
	CopySnapshot = "snapshot" // a read-only snapshot (VDI.snapshot)
	CopyFull     = "copy"     // a full copy into an SR (VDI.copy)
)

// DiskKind says how a disk's data is reached.
type DiskKind string

// Disk kinds.
const (
	DiskFile DiskKind = "file" // a file or block device on this host
	DiskNBD  DiskKind = "nbd"  // an NBD export
)

// DiskSource is where a VDI's data is for a VM, as storage hands it to
// xenops.
type DiskSource struct {
	Kind DiskKind
	// Path is the file or block device (DiskFile).
	Path string
	// NBDURI is the export (DiskNBD): nbd://host:port/export or
	// nbd+unix:///export?socket=PATH.
	NBDURI string
	// Format is the image format there: "raw", "qcow2", "vpc".
	Format string
}

// Target is what the emulator opens: the NBD URI of an export, else the
// path.
func (s DiskSource) Target() string {
	if s.Kind == DiskNBD {
		return s.NBDURI
	}
	return s.Path
}

// VDICopier is implemented by a DiskResolver that can copy VDIs itself.
// Without it, xenops asks for VDI.clone, VDI.snapshot and VDI.copy
// through the XenAPI, as the calling session.
type VDICopier interface {
	// CopyVDI makes a new VDI from vdi and returns its ref. sr is the
	// destination for CopyFull (the null ref: the VDI's own SR).
	CopyVDI(ctx context.Context, vdi, kind, sr string) (string, error)
}

// SuspendStore is implemented by a DiskResolver that can hold suspend
// images in VDIs on the suspend SR. Without it, images are files under
// DATA_DIR/xenops/suspend and VM.suspend_VDI stays null. The backend
// writes and reads an image as a plain file (a staging file under
// DATA_DIR/xenops/suspend); the store copies it into and out of the VDI.
type SuspendStore interface {
	// CreateSuspendVDI makes an empty suspend VDI of at least size bytes
	// for VM vm's (ref) memory image on sr (the null ref: the pool's or
	// host's suspend image SR) and returns its ref. forUUID is the VM the
	// image will belong to: vm itself, or the snapshot a checkpoint makes.
	CreateSuspendVDI(ctx context.Context, vm, forUUID, sr string, size int64) (string, error)
	// DestroySuspendVDI deletes it; it refuses a VDI that is not a
	// suspend image.
	DestroySuspendVDI(ctx context.Context, vdi string) error
	// SaveSuspendImage copies the image file at path into the VDI.
	SaveSuspendImage(ctx context.Context, vdi, path string) error
	// LoadSuspendImage checks that vdi is VM vm's (ref) suspend VDI and
	// copies its image into a new file at path.
	LoadSuspendImage(ctx context.Context, vm, vdi, path string) error
	// CopySuspendVDI copies a suspend VDI for the VM with uuid vmUUID (a
	// clone or snapshot) onto sr (the null ref: the same SR).
	CopySuspendVDI(ctx context.Context, vdi, vmUUID, sr string) (string, error)
}

// LocationResolver is the DiskResolver used until storage provides one:
// a VDI's location is taken as the path of an image file or block device
// on this host, its format from sm_config:type or from qemu-img.
type LocationResolver struct{ DB *db.DB }

// Attach implements DiskResolver.
func (l LocationResolver) Attach(ctx context.Context, vm, vdi string, readonly bool) (DiskSource, error) {
	row, ok := l.DB.Snapshot().Get(dm.VDI.Class, vdi)
	if !ok {
		return DiskSource{}, xerr.New(xerr.VDIMissing, schema.NullRef, vdi)
	}
	path := row.String(dm.VDI.Location)
	if !filepath.IsAbs(path) {
		return DiskSource{}, xerr.New(xerr.VDIMissing, row.String(dm.VDI.SR), vdi)
	}
	if _, err := os.Stat(path); err != nil {
		return DiskSource{}, xerr.New(xerr.VDIMissing, row.String(dm.VDI.SR), vdi)
	}
	smc, _ := row.Get(dm.VDI.SMConfig).(map[string]string)
	switch f := smc["type"]; f {
	case "raw", "qcow2", "vhd", "vpc":
		if f == "vhd" {
			f = "vpc"
		}
		return DiskSource{Kind: DiskFile, Path: path, Format: f}, nil
	}
	return DiskSource{Kind: DiskFile, Path: path, Format: probeFormat(ctx, path)}, nil
}

// Detach implements DiskResolver.
func (LocationResolver) Detach(context.Context, string, string) error { return nil }

// probeFormat asks qemu-img for an image's format (raw when unsure).
func probeFormat(ctx context.Context, path string) string {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", "-U", path).Output() //nolint:gosec // a fixed program with an argv, no shell
	if err != nil {
		return "raw"
	}
	var info struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(out, &info) != nil || info.Format == "" {
		return "raw"
	}
	return strings.TrimSpace(info.Format)
}
