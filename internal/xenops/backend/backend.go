package backend

import (
	"context"
	"strings"
	"sync"
	"time"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xerr"
)

// Backend is what runs domains: QEMU processes, or a simulation of them.
// The manager drives it one micro-op at a time, always for one VM from
// that VM's queue, so a backend never sees two calls for the same domain
// at once (calls for different domains do run in parallel).
//
// Domains are named by VM uuid. A domain exists from Create until
// Destroy; Destroy is idempotent and removes everything Create and the
// later steps made (processes, taps, sockets, files). Every call that
// waits honours its context.
type Backend interface {
	// Name is "qemu" or "simulator".
	Name() string

	// Check says, as a XenAPI error, why a domain with this spec cannot
	// be built here at all (emulator missing, hardware acceleration
	// required but unusable). It does nothing lasting.
	Check(spec *Spec) error

	// Create makes an empty, paused domain shell and journals it, so
	// that a restart in the middle of a start finds and removes it.
	Create(ctx context.Context, spec *Spec) (domid int64, err error)
	// Build prepares the boot: firmware, kernel and initrd.
	Build(ctx context.Context, uuid string) error
	// AddDisk and AddNIC add devices before the device model starts.
	AddDisk(ctx context.Context, uuid string, d Disk) error
	AddNIC(ctx context.Context, uuid string, n NIC) error
	// StartDeviceModel launches the emulator, paused (or restoring the
	// memory image named in the spec), and connects to it.
	StartDeviceModel(ctx context.Context, uuid string) error
	// MarkComplete records that the start finished: from now on a
	// restart re-attaches to the domain instead of removing it.
	MarkComplete(uuid string) error

	Pause(ctx context.Context, uuid string) error
	Unpause(ctx context.Context, uuid string) error
	// RequestShutdown asks the guest to power off (ACPI power button).
	// It does not wait.
	RequestShutdown(ctx context.Context, uuid string) error
	// Suspend writes the domain's memory and device state to path,
	// reporting progress from 0 to 1. The domain is left paused; a
	// cancelled suspend resumes it as it was.
	Suspend(ctx context.Context, uuid, path string, progress func(float64)) error
	// Destroy stops the domain and removes all its resources.
	Destroy(ctx context.Context, uuid string) error

	// Hotplug.
	PlugDisk(ctx context.Context, uuid string, d Disk) error
	UnplugDisk(ctx context.Context, uuid, device string, force bool) error
	// ChangeMedium puts a medium into a removable drive, or ejects it
	// when d.Path is "".
	ChangeMedium(ctx context.Context, uuid string, d Disk) error
	PlugNIC(ctx context.Context, uuid string, n NIC) error
	UnplugNIC(ctx context.Context, uuid, device string) error

	SetVCPUs(ctx context.Context, uuid string, n int) error
	SetMemoryTarget(ctx context.Context, uuid string, bytes int64) error

	// Info is the domain as it is now; ok is false when there is none.
	Info(uuid string) (info DomainInfo, ok bool)
	// List is every domain this backend manages, including journalled
	// ones whose process vanished (state Gone).
	List() []DomainInfo
	// ConsolePath is the Unix socket of a domain's console ("rfb" or
	// "vt100").
	ConsolePath(uuid, protocol string) (string, error)

	// SetNotify installs the callback told "this domain needs
	// attention" whenever its state changes other than at the manager's
	// request (guest power-off, reboot, crash, process death).
	SetNotify(func(uuid string))
	// Close stops watching domains. It leaves them running.
	Close()
}

// Optional capabilities: a backend implements these when it can, and the
// manager asks for them with a type assertion.

// Accelerated is a backend that chooses how guests are accelerated and
// can say what it chose ("kvm" or "tcg") and why; the manager records it
// in the host's other_config.
type Accelerated interface {
	Accelerator() (accel, reason string)
}

// LiveSnapshotter is a backend that can switch a running domain's disk
// (named by userdevice) to a new active image at path: an empty overlay
// whose backing file is the image the domain has open. Storage uses it
// to snapshot or clone a disk in use.
type LiveSnapshotter interface {
	LiveSnapshot(ctx context.Context, uuid, device, path, format string) error
}

// StatsReporter is a backend that can read a running domain's counters.
type StatsReporter interface {
	// Stats reads the domain's counters now. Disk devices are userdevices ("0", "1", ...) and NIC devices VIF device numbers, as the backend knows them.
	Stats(ctx context.Context, uuid string) (stats.VM, error)
}

// DomainState is what a domain is doing.
type DomainState string

// Domain states.
const (
	DomainBuilding DomainState = "building" // Create done, start not finished
	DomainRunning  DomainState = "running"
	DomainPaused   DomainState = "paused"
	DomainShutdown DomainState = "shutdown" // the guest powered itself off
	DomainReboot   DomainState = "reboot"   // the guest asked for a reboot
	DomainCrashed  DomainState = "crashed"  // the guest panicked or the emulator died
	DomainGone     DomainState = "gone"     // journalled, but nothing is left running
)

// Stopped says whether the guest has stopped for good (it powered off,
// asked for a reboot or crashed) or its domain is gone: nothing runs any
// more that could be paused or resumed.
func (s DomainState) Stopped() bool {
	switch s {
	case DomainShutdown, DomainReboot, DomainCrashed, DomainGone:
		return true
	}
	return false
}

// RefuseStopped is what Pause and Unpause answer for a domain in state s:
// VM_BAD_POWER_STATE when its guest has stopped (the manager's pending
// check must see a stopped guest, not a paused domain), else nil.
func RefuseStopped(s DomainState, vmRef string) error {
	if s.Stopped() {
		return xerr.New(xerr.VMBadPowerState, vmRef, "running", "halted")
	}
	return nil
}

// Notifier keeps the callback a backend's SetNotify installs and calls it
// when a domain needs attention. Its zero value has no callback; it is
// safe for concurrent use.
type Notifier struct {
	mu sync.Mutex
	f  func(uuid string)
}

// Set installs f (nil removes the callback).
func (n *Notifier) Set(f func(uuid string)) {
	n.mu.Lock()
	n.f = f
	n.mu.Unlock()
}

// Tell calls the callback, if there is one, for the domain uuid. The
// callback runs without any lock held.
func (n *Notifier) Tell(uuid string) {
	n.mu.Lock()
	f := n.f
	n.mu.Unlock()
	if f != nil {
		f(uuid)
	}
}

// DomainInfo describes a domain.
type DomainInfo struct {
	UUID      string
	Domid     int64
	State     DomainState
	Complete  bool // the start that made it finished
	StartTime time.Time
	VCPUs     int
	Memory    int64 // bytes the guest has (the balloon target)
	Pid       int   // emulator process, 0 when there is none
	Disks     []Disk
	NICs      []NIC
	Reason    string // for Crashed: what happened
	// Migrated says the guest's state has been sent to another host
	// (Migrator.SendLive completed, possibly before a daemon restart):
	// the domain is paused and must not run here again unless the
	// destination is known never to have run it.
	Migrated bool `json:",omitempty"`
	// Received says the domain was made for an incoming migration and
	// holds the guest's state (Migrator.ReceiveLive completed, possibly
	// before a daemon restart), paused and not yet complete: the manager
	// decides whether the move committed (adopt it: MarkComplete, then
	// Unpause) or not (destroy it).
	Received bool `json:",omitempty"`
}

// Spec is everything needed to build a domain, taken from the VM's
// record and its devices when the start begins.
type Spec struct {
	UUID   string
	Name   string
	VMRef  string
	Memory int64 // static max, bytes
	Target int64 // initial balloon target, bytes
	VCPUs  int   // at startup
	MaxCPU int   // VCPUs_max
	HVM    bool
	// Firmware is "bios" or "uefi".
	Firmware  string
	BootOrder string // HVM_boot_params order: c disk, d cdrom, n network
	Kernel    string // direct kernel boot when set
	Ramdisk   string
	Cmdline   string
	Platform  map[string]string
	// RestoreFrom names a suspend image to resume from instead of
	// booting; HotCPUs are the VCPUs the domain had added while it ran,
	// which its device state includes.
	RestoreFrom string
	HotCPUs     []CPUDevice
	// AutoStart lets a backend start the guest as soon as its device
	// model runs, when nothing is to happen in between (VM.start without
	// start_paused); Unpause then only confirms it.
	AutoStart bool
	// Incoming makes the domain wait, once its device model runs, for
	// its memory and device state from another host (Migrator's
	// ReceiveLive) instead of booting.
	Incoming bool `json:",omitempty"`
}

// Disk is a block device as the backend attaches it.
type Disk struct {
	VBD      string // VBD ref
	VDI      string // VDI ref, "" for an empty drive
	Device   string // userdevice: "0", "1", ...
	Path     string // "" for an empty drive
	Format   string // raw, qcow2, ...
	ReadOnly bool
	CD       bool
	Bootable bool
	// Overlays are the nodes live snapshots stacked on the disk, oldest
	// first (QEMU backend).
	Overlays []string `json:",omitempty"`
}

// NIC is a network interface as the backend attaches it.
type NIC struct {
	VIF    string // VIF ref
	Device string // "0", "1", ...
	MAC    string
	MTU    int64
	Bridge string // the network's Linux bridge, "" for none
	Tap    string // set by the backend when it made a tap
	Mode   string // "tap", "user" or "none": the backend's decision
}

// PlatformTrue reads a platform flag the way xapi does.
func PlatformTrue(p map[string]string, key string, def bool) bool {
	v, ok := p[key]
	if !ok {
		return def
	}
	switch strings.ToLower(v) {
	case "1", "true", "on", "yes":
		return true
	case "0", "false", "off", "no":
		return false
	}
	return def
}

// MaxVCPUs is the most VCPUs a domain may have.
const MaxVCPUs = 255
