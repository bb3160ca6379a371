// Package mixed is a VM backend that runs each domain on one of two
// others: the real hypervisor (QEMU) by default, the simulator for a VM
// whose platform says so (SimulatedKey). It is `--backend
// qemu+simulator`: a host that runs real guests beside simulated ones,
// for tests and figures that need both on one host (evacuating a host
// with a few real guests among many simulated), and for load on a real
// host without the memory real guests take.
//
// A domain stays on the backend it was created on: Create chooses from
// the spec and remembers; every other call goes to the backend that
// holds the domain (after a daemon restart, the one whose Info knows
// it). The optional capabilities (migration, mirrors, disk exports,
// live snapshots, statistics, acceleration) are offered when either
// backend has them and fail, naming the backend, for a domain whose
// backend lacks one. Both backends keep their own state directories.
package mixed

import (
	"context"
	"fmt"
	"io"
	"sync"

	"toolstackd/internal/rrdd/stats"
	"toolstackd/internal/xenops/backend"
)

// SimulatedKey is the VM.platform key that puts a VM on the simulator
// ("true"); without it the VM runs on the real backend.
const SimulatedKey = "toolstackd-simulated"

// Name is what Backend.Name reports.
const Name = "qemu+simulator"

// Backend runs each domain on real or sim.
type Backend struct {
	real, sim backend.Backend

	mu    sync.Mutex
	owner map[string]backend.Backend // domain uuid -> its backend
}

var (
	_ backend.Backend         = (*Backend)(nil)
	_ backend.Accelerated     = (*Backend)(nil)
	_ backend.LiveSnapshotter = (*Backend)(nil)
	_ backend.StatsReporter   = (*Backend)(nil)
	_ backend.Migrator        = (*Backend)(nil)
	_ backend.DiskMirrorer    = (*Backend)(nil)
	_ backend.DiskExporter    = (*Backend)(nil)
)

// New combines the real backend and the simulator.
func New(real, sim backend.Backend) *Backend {
	return &Backend{real: real, sim: sim, owner: map[string]backend.Backend{}}
}

// simulated says whether a spec asks for the simulator.
func simulated(spec *backend.Spec) bool { return spec != nil && spec.Platform[SimulatedKey] == "true" }

func (b *Backend) pick(spec *backend.Spec) backend.Backend {
	if simulated(spec) {
		return b.sim
	}
	return b.real
}

// of is the backend holding domain uuid: the one that made it, or after
// a restart the one that knows it (the real one when neither does, so
// that its errors are the ones a caller sees).
func (b *Backend) of(uuid string) backend.Backend {
	b.mu.Lock()
	be, ok := b.owner[uuid]
	b.mu.Unlock()
	if ok {
		return be
	}
	if _, ok := b.sim.Info(uuid); ok {
		be = b.sim
	} else if _, ok := b.real.Info(uuid); ok {
		be = b.real
	} else {
		return b.real
	}
	b.mu.Lock()
	b.owner[uuid] = be
	b.mu.Unlock()
	return be
}

func (b *Backend) forget(uuid string) {
	b.mu.Lock()
	delete(b.owner, uuid)
	b.mu.Unlock()
}

// Name is "qemu+simulator".
func (b *Backend) Name() string { return Name }

// Check asks the backend the spec would run on.
func (b *Backend) Check(spec *backend.Spec) error { return b.pick(spec).Check(spec) }

// Create makes the domain on the backend its spec chooses.
func (b *Backend) Create(ctx context.Context, spec *backend.Spec) (int64, error) {
	be := b.pick(spec)
	b.mu.Lock()
	b.owner[spec.UUID] = be
	b.mu.Unlock()
	domid, err := be.Create(ctx, spec)
	if err != nil {
		if _, ok := be.Info(spec.UUID); !ok {
			b.forget(spec.UUID)
		}
	}
	return domid, err
}

func (b *Backend) Build(ctx context.Context, uuid string) error { return b.of(uuid).Build(ctx, uuid) }
func (b *Backend) AddDisk(ctx context.Context, uuid string, d backend.Disk) error {
	return b.of(uuid).AddDisk(ctx, uuid, d)
}
func (b *Backend) AddNIC(ctx context.Context, uuid string, n backend.NIC) error {
	return b.of(uuid).AddNIC(ctx, uuid, n)
}
func (b *Backend) StartDeviceModel(ctx context.Context, uuid string) error {
	return b.of(uuid).StartDeviceModel(ctx, uuid)
}
func (b *Backend) MarkComplete(uuid string) error               { return b.of(uuid).MarkComplete(uuid) }
func (b *Backend) Pause(ctx context.Context, uuid string) error { return b.of(uuid).Pause(ctx, uuid) }
func (b *Backend) Unpause(ctx context.Context, uuid string) error {
	return b.of(uuid).Unpause(ctx, uuid)
}
func (b *Backend) RequestShutdown(ctx context.Context, uuid string) error {
	return b.of(uuid).RequestShutdown(ctx, uuid)
}
func (b *Backend) Suspend(ctx context.Context, uuid, path string, progress func(float64)) error {
	return b.of(uuid).Suspend(ctx, uuid, path, progress)
}

// Destroy removes the domain and forgets where it was.
func (b *Backend) Destroy(ctx context.Context, uuid string) error {
	be := b.of(uuid)
	err := be.Destroy(ctx, uuid)
	if _, ok := be.Info(uuid); !ok {
		b.forget(uuid)
	}
	return err
}

func (b *Backend) PlugDisk(ctx context.Context, uuid string, d backend.Disk) error {
	return b.of(uuid).PlugDisk(ctx, uuid, d)
}
func (b *Backend) UnplugDisk(ctx context.Context, uuid, device string, force bool) error {
	return b.of(uuid).UnplugDisk(ctx, uuid, device, force)
}
func (b *Backend) ChangeMedium(ctx context.Context, uuid string, d backend.Disk) error {
	return b.of(uuid).ChangeMedium(ctx, uuid, d)
}
func (b *Backend) PlugNIC(ctx context.Context, uuid string, n backend.NIC) error {
	return b.of(uuid).PlugNIC(ctx, uuid, n)
}
func (b *Backend) UnplugNIC(ctx context.Context, uuid, device string) error {
	return b.of(uuid).UnplugNIC(ctx, uuid, device)
}
func (b *Backend) SetVCPUs(ctx context.Context, uuid string, n int) error {
	return b.of(uuid).SetVCPUs(ctx, uuid, n)
}
func (b *Backend) SetMemoryTarget(ctx context.Context, uuid string, bytes int64) error {
	return b.of(uuid).SetMemoryTarget(ctx, uuid, bytes)
}
func (b *Backend) Info(uuid string) (backend.DomainInfo, bool) { return b.of(uuid).Info(uuid) }

// List is both backends' domains.
func (b *Backend) List() []backend.DomainInfo { return append(b.real.List(), b.sim.List()...) }

func (b *Backend) ConsolePath(uuid, protocol string) (string, error) {
	return b.of(uuid).ConsolePath(uuid, protocol)
}

// SetNotify installs the callback on both.
func (b *Backend) SetNotify(f func(uuid string)) {
	b.real.SetNotify(f)
	b.sim.SetNotify(f)
}

// Close closes both.
func (b *Backend) Close() {
	b.real.Close()
	b.sim.Close()
}

// lacks is the error for a capability the domain's backend does not
// have.
func lacks(be backend.Backend, what string) error {
	return fmt.Errorf("mixed: the %s backend cannot %s", be.Name(), what)
}

// Accelerator is the real backend's.
func (b *Backend) Accelerator() (accel, reason string) {
	if a, ok := b.real.(backend.Accelerated); ok {
		return a.Accelerator()
	}
	return "", "the real backend chooses no acceleration"
}

func (b *Backend) LiveSnapshot(ctx context.Context, uuid, device, path, format string) error {
	be := b.of(uuid)
	if ls, ok := be.(backend.LiveSnapshotter); ok {
		return ls.LiveSnapshot(ctx, uuid, device, path, format)
	}
	return nil // nothing to switch, as the manager treats a backend without it
}

func (b *Backend) Stats(ctx context.Context, uuid string) (stats.VM, error) {
	be := b.of(uuid)
	if sr, ok := be.(backend.StatsReporter); ok {
		return sr.Stats(ctx, uuid)
	}
	return stats.VM{}, lacks(be, "report statistics")
}

func (b *Backend) migrator(uuid string) (backend.Migrator, error) {
	be := b.of(uuid)
	if m, ok := be.(backend.Migrator); ok {
		return m, nil
	}
	return nil, lacks(be, "migrate")
}

func (b *Backend) SendLive(ctx context.Context, uuid string, to io.Writer, o backend.MigrateOptions, progress func(float64)) error {
	m, err := b.migrator(uuid)
	if err != nil {
		return err
	}
	return m.SendLive(ctx, uuid, to, o, progress)
}

func (b *Backend) ReceiveLive(ctx context.Context, uuid string, from io.Reader) error {
	m, err := b.migrator(uuid)
	if err != nil {
		return err
	}
	return m.ReceiveLive(ctx, uuid, from)
}

func (b *Backend) mirrorer(uuid string) (backend.DiskMirrorer, error) {
	be := b.of(uuid)
	if m, ok := be.(backend.DiskMirrorer); ok {
		return m, nil
	}
	return nil, lacks(be, "mirror disks")
}

func (b *Backend) StartMirror(ctx context.Context, uuid, device string, t backend.MirrorTarget) error {
	m, err := b.mirrorer(uuid)
	if err != nil {
		return err
	}
	return m.StartMirror(ctx, uuid, device, t)
}

func (b *Backend) MirrorStatus(ctx context.Context, uuid, device string) (backend.MirrorStatus, error) {
	m, err := b.mirrorer(uuid)
	if err != nil {
		return backend.MirrorStatus{}, err
	}
	return m.MirrorStatus(ctx, uuid, device)
}

func (b *Backend) WaitMirrorReady(ctx context.Context, uuid, device string, progress func(float64)) error {
	m, err := b.mirrorer(uuid)
	if err != nil {
		return err
	}
	return m.WaitMirrorReady(ctx, uuid, device, progress)
}

func (b *Backend) CompleteMirror(ctx context.Context, uuid, device string, pivot bool) error {
	m, err := b.mirrorer(uuid)
	if err != nil {
		return err
	}
	return m.CompleteMirror(ctx, uuid, device, pivot)
}

func (b *Backend) CancelMirror(ctx context.Context, uuid, device string) error {
	m, err := b.mirrorer(uuid)
	if err != nil {
		return err
	}
	return m.CancelMirror(ctx, uuid, device)
}

func (b *Backend) exporter(uuid string) (backend.DiskExporter, error) {
	be := b.of(uuid)
	if e, ok := be.(backend.DiskExporter); ok {
		return e, nil
	}
	return nil, lacks(be, "export disks")
}

func (b *Backend) ExportDisk(ctx context.Context, uuid, device, name string) (string, error) {
	e, err := b.exporter(uuid)
	if err != nil {
		return "", err
	}
	return e.ExportDisk(ctx, uuid, device, name)
}

func (b *Backend) UnexportDisk(ctx context.Context, uuid, device string) error {
	e, err := b.exporter(uuid)
	if err != nil {
		return err
	}
	return e.UnexportDisk(ctx, uuid, device)
}
