package storage

import (
	"context"
	"sync"
	"time"

	"toolstackd/internal/nbd"
	"toolstackd/internal/storage/imageformat"
)

// A Driver implements one SR type, as an SM plugin does for xapi. The
// storage mux looks drivers up by SR type and talks to each attached SR
// through the SR handle Attach returns. Drivers never touch the database:
// the mux turns what they report into SR and VDI records, and their errors
// (normally *xerr.Error, see BackendError) into XenAPI errors.
//
// The shape follows SMAPIv3: SR.create/attach/detach/destroy/stat/ls and
// Volume.create/destroy/stat/resize/snapshot/clone, plus a datapath
// (attach/activate/deactivate/detach) that hands a volume to a VM.
type Driver interface {
	// Info describes the driver for its SM record.
	Info() DriverInfo
	// Probe reports the SRs that a device configuration reaches.
	Probe(ctx context.Context, cfg map[string]string) ([]ProbeResult, error)
	// Create initialises new storage for an SR and returns the device
	// configuration its PBDs will use (normally cfg itself).
	Create(ctx context.Context, sr SRSpec) (map[string]string, error)
	// Attach connects this host to an SR (PBD.plug) and returns its handle.
	Attach(ctx context.Context, sr SRSpec) (SR, error)
}

// SR is an attached SR. Every method may be called from several
// goroutines at once; the mux never calls two methods for the same volume
// at once, except VolumeStat.
type SR interface {
	// Detach disconnects the SR from this host (PBD.unplug).
	Detach(ctx context.Context) error
	// Destroy deletes the SR's storage and every volume in it, and
	// detaches it (SR.destroy).
	Destroy(ctx context.Context) error
	// Stat reports the SR's size and use.
	Stat(ctx context.Context) (SRStat, error)
	// Scan lists the volumes the SR holds (SR.ls).
	Scan(ctx context.Context) ([]Volume, error)
	// SetName records the SR's name and description with the storage,
	// for drivers that keep them.
	SetName(ctx context.Context, name, description string) error

	VolumeCreate(ctx context.Context, v VolumeSpec) (Volume, error)
	VolumeStat(ctx context.Context, key string) (Volume, error)
	VolumeDestroy(ctx context.Context, key string) error
	// VolumeResize grows a volume to at least size bytes.
	VolumeResize(ctx context.Context, key string, size int64) (Volume, error)
	// VolumeSnapshot makes a read-only point-in-time copy; VolumeClone a
	// writable one. Both should take constant time. live, when not nil, is
	// called once the volume's current image is frozen and a fresh one is
	// in place at the same datapath, so that a running VM switches to it.
	VolumeSnapshot(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error)
	VolumeClone(ctx context.Context, key string, meta VolumeSpec, live LiveSwitch) (Volume, error)
	VolumeSetName(ctx context.Context, key, name, description string) error

	// The datapath. Attach makes the volume reachable on this host and
	// says how; Activate and Deactivate bracket I/O; Detach undoes Attach.
	// The mux calls these only when the VDI's combined state changes.
	VolumeAttach(ctx context.Context, key string, readonly bool) (Datapath, error)
	VolumeActivate(ctx context.Context, key string, readonly bool) error
	VolumeDeactivate(ctx context.Context, key string) error
	VolumeDetach(ctx context.Context, key string) error
}

// Optional SR capabilities, found by type assertion.
type (
	// Differ reports where a volume differs from an older one it shares
	// history with (a snapshot of it), from metadata alone.
	Differ interface {
		ChangedExtents(ctx context.Context, key, baseKey string) ([]Extent, error)
	}
	// Resetter implements VDI.on_boot=reset: SetResetOnBoot marks the
	// volume's current content as the one every activation starts from.
	Resetter interface {
		SetResetOnBoot(ctx context.Context, key string, reset bool) error
	}
	// Collector runs the SR's garbage collection (coalescing chains left
	// by deleted snapshots) and reports when it is idle.
	Collector interface {
		Collect(ctx context.Context) error
	}
	// Introducer checks that a volume exists under a key given by a
	// client (VDI.introduce).
	Introducer interface {
		VolumeIntroduce(ctx context.Context, key string) (Volume, error)
	}
)

// LiveSwitch is called during a snapshot or clone of a volume that a
// running VM has open read-write: the file at dp.Path is now an empty
// overlay on top of what the VM has open, and the VM must make it its
// active image (QMP blockdev-snapshot) before the call returns.
type LiveSwitch func(ctx context.Context, dp Datapath) error

// Extent is a byte range of a volume.
type Extent = imageformat.Extent

// DriverInfo is what an SM record says about a driver.
type DriverInfo struct {
	Type          string
	Name          string
	Description   string
	Vendor        string
	Copyright     string
	Version       string
	Configuration map[string]string // device_config keys and what they mean
	// Capabilities are xapi's SM capability names: SR_PROBE, SR_UPDATE,
	// VDI_CREATE, VDI_DELETE, VDI_ATTACH, VDI_DETACH, VDI_ACTIVATE,
	// VDI_DEACTIVATE, VDI_CLONE, VDI_SNAPSHOT, VDI_RESIZE, VDI_INTRODUCE,
	// VDI_UPDATE, VDI_RESET_ON_BOOT/2, THIN_PROVISIONING, SR_METADATA...
	// A name may carry a version as NAME/2.
	Capabilities []string
	// Shared is true for SRs every host of a pool can attach at once.
	Shared bool
	// Formats are the image formats the driver keeps volumes in.
	Formats []string
	// Filename is where the driver lives (the plugin directory).
	Filename string
}

// Has reports whether the driver has a capability (any version).
func (i DriverInfo) Has(cap string) bool {
	for _, c := range i.Capabilities {
		if c == cap || (len(c) > len(cap) && c[:len(cap)] == cap && c[len(cap)] == '/') {
			return true
		}
	}
	return false
}

// SRSpec is an SR as a driver sees it.
type SRSpec struct {
	UUID         string
	Name         string
	Description  string
	DeviceConfig map[string]string
	SMConfig     map[string]string
	PhysicalSize int64 // requested at SR.create, 0 if not given
	Shared       bool
	ContentType  string
}

// SRStat is an SR's size and use, in bytes.
type SRStat struct {
	PhysicalSize        int64
	PhysicalUtilisation int64
	FreeSpace           int64
	Name, Description   string // when the storage keeps them
}

// ProbeResult is one SR a probe found.
type ProbeResult struct {
	UUID         string            `json:"uuid"`
	Name         string            `json:"name,omitempty"`
	Description  string            `json:"description,omitempty"`
	DeviceConfig map[string]string `json:"configuration,omitempty"`
}

// VolumeSpec is what a new volume should be.
type VolumeSpec struct {
	UUID        string // the VDI's uuid, which drivers may use as the key
	Name        string
	Description string
	Size        int64
	Sharable    bool
	Type        string // the VDI type (user, system, suspend...)
	ReadOnly    bool
	SnapshotOf  string // key of the volume a snapshot was taken of
	IsSnapshot  bool
	Time        time.Time
}

// Volume is a volume as a driver reports it.
type Volume struct {
	Key                 string // unique in the SR; the VDI's location
	UUID                string // a uuid the driver keeps for it, if any
	Name                string
	Description         string
	VirtualSize         int64
	PhysicalUtilisation int64
	ReadOnly            bool
	Sharable            bool
	Type                string    // VDI type the driver recorded, if any
	IsSnapshot          bool      // metadata the driver kept, if any
	SnapshotOf          string    // key
	SnapshotTime        time.Time // zero if unknown
	Format              string    // image format (qcow2, raw), informational
}

// Datapath says how to reach an attached VDI on this host.
type Datapath struct {
	// Kind is "file" (a local file or block device at Path) or "nbd" (an
	// NBD export at URI, raw).
	Kind string `json:"kind"`
	// Path is the image's path for Kind "file".
	Path string `json:"path,omitempty"`
	// Format is the image format QEMU must open: "qcow2" or "raw". It is
	// always "raw" for NBD.
	Format string `json:"format"`
	// URI is the NBD export for Kind "nbd": nbd+unix:///name?socket=/path
	// or nbd://host:port/name.
	URI string `json:"uri,omitempty"`
	// ReadOnly is true when the VDI is attached read-only.
	ReadOnly bool `json:"read_only"`

	// Filled in by the mux.
	DP  string `json:"dp,omitempty"`  // the datapath name
	VDI string `json:"vdi,omitempty"` // VDI ref
	SR  string `json:"sr,omitempty"`  // SR ref
}

// QEMUBlockdev returns the QMP/-blockdev options that open the datapath:
// the format node over its protocol node.
func (d Datapath) QEMUBlockdev(nodeName string) map[string]any {
	var file map[string]any
	switch d.Kind {
	case "nbd":
		u, err := nbd.ParseURI(d.URI)
		if err != nil {
			return nil
		}
		file = map[string]any{"driver": "nbd", "server": u.QEMUServer(), "export": u.Export}
	default:
		file = map[string]any{"driver": "file", "filename": d.Path}
	}
	if d.ReadOnly {
		file["read-only"] = true
	}
	out := map[string]any{"node-name": nodeName, "driver": d.Format, "file": file, "read-only": d.ReadOnly}
	return out
}

var (
	driversMu sync.RWMutex
	drivers   = map[string]Driver{}
)

// RegisterDriver makes a Go driver available for SRs of its type, as
// database/sql.Register does for database drivers, to every storage
// service registered afterwards. It panics on a type registered twice.
func RegisterDriver(d Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	t := d.Info().Type
	if _, dup := drivers[t]; dup {
		panic("storage: driver registered twice for type " + t)
	}
	drivers[t] = d
}
