package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"toolstackd/internal/safepath"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xerr"
)

// Config tunes the simulator.
type Config struct {
	// StepDelay is how long every micro-op takes unless Delays names it.
	StepDelay time.Duration
	// Delays by micro-op: create, build, disk, nic, device-model,
	// unpause, pause, suspend, destroy, plug, unplug, and guest-shutdown
	// (how long a guest takes to power off after an ACPI request).
	Delays map[string]time.Duration
	// NoACPI makes guests ignore shutdown requests.
	NoACPI bool
	// StateDir, when set, keeps each started domain in a file there, so
	// that simulated domains outlive a daemon restart as processes would
	// (a start cut short by a restart leaves nothing behind).
	StateDir string
}

// Simulator is a backend with no processes: the same state machine, with
// configurable delays and failure injection, for tests and large
// simulated pools.
type Simulator struct {
	cfg Config

	mu        sync.Mutex
	doms      map[string]*simDomain
	nextDomid int64
	fail      map[string]error
	notifier  backend.Notifier
	delays    map[string]time.Duration
	signals   signalLog                // what each domain was sent (signals.go)
	mirrors   map[mirrorKey]*simMirror // disk mirrors (mirror.go)
}

type simDomain struct {
	Info      backend.DomainInfo
	Spec      backend.Spec
	ShutdownT *time.Timer `json:"-"`
}

var _ backend.Backend = (*Simulator)(nil)

// New makes a simulator, loading the domains kept in
// cfg.StateDir.
func New(cfg Config) (*Simulator, error) {
	s := &Simulator{cfg: cfg, doms: map[string]*simDomain{}, nextDomid: 1, fail: map[string]error{}, delays: map[string]time.Duration{}}
	for k, v := range cfg.Delays {
		s.delays[k] = v
	}
	if cfg.StateDir != "" {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, err
		}
		ents, _ := os.ReadDir(cfg.StateDir)
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(cfg.StateDir, e.Name()))
			if err != nil {
				continue
			}
			var d simDomain
			if json.Unmarshal(b, &d) != nil || d.Info.UUID == "" || d.Info.UUID+".json" != e.Name() || safepath.Name(d.Info.UUID) != nil {
				continue
			}
			if d.Spec.Incoming {
				// An incoming migration that never completed (migrate.go).
				_ = os.Remove(filepath.Join(cfg.StateDir, e.Name()))
				continue
			}
			s.doms[d.Info.UUID] = &d
			if d.Info.Domid >= s.nextDomid {
				s.nextDomid = d.Info.Domid + 1
			}
		}
	}
	return s, nil
}

// Name implements Backend.
func (s *Simulator) Name() string { return "simulator" }

// SetFail makes micro-op op (as named in Config.Delays, or "check")
// fail with err from now on; a nil err clears it.
func (s *Simulator) SetFail(op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.fail, op)
	} else {
		s.fail[op] = err
	}
}

// SetDelay changes how long micro-op op takes.
func (s *Simulator) SetDelay(op string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delays[op] = d
}

func (s *Simulator) step(ctx context.Context, op string) error {
	s.mu.Lock()
	d, ok := s.delays[op]
	if !ok {
		d = s.cfg.StepDelay
	}
	err := s.fail[op]
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return err
}

// SetNotify implements Backend.
func (s *Simulator) SetNotify(f func(string)) { s.notifier.Set(f) }

// snapshotFile returns what save writes for a domain (under s.mu).
func (s *Simulator) snapshotFile(d *simDomain) []byte {
	if s.cfg.StateDir == "" {
		return nil
	}
	b, _ := json.Marshal(d)
	return b
}

// save writes a domain's file, outside s.mu: the manager never runs two
// operations on one domain at once, so writes for a domain do not race.
func (s *Simulator) save(uuid string, b []byte) {
	if b == nil {
		return
	}
	p, err := backend.EntryPath(s.cfg.StateDir, uuid, ".json")
	if err != nil {
		return
	}
	tmp := p + "." + strconv.FormatInt(time.Now().UnixNano(), 36)
	if os.WriteFile(tmp, b, 0o600) == nil {
		if err := os.Rename(tmp, p); err != nil {
			_ = os.Remove(tmp) // the simulator keeps its state in memory too
		}
	}
}

func (s *Simulator) get(uuid string) (*simDomain, error) {
	d := s.doms[uuid]
	if d == nil {
		return nil, fmt.Errorf("simulator: no domain %s", uuid)
	}
	return d, nil
}

// Check implements Backend.
func (s *Simulator) Check(spec *backend.Spec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fail["check"]
}

// Create implements Backend.
func (s *Simulator) Create(ctx context.Context, spec *backend.Spec) (int64, error) {
	if err := s.step(ctx, "create"); err != nil {
		return 0, err
	}
	if safepath.Name(spec.UUID) != nil {
		return 0, xerr.New(xerr.InvalidValue, "uuid", spec.UUID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.doms[spec.UUID]; d != nil {
		return 0, xerr.New(xerr.DomainExists, spec.VMRef, fmt.Sprint(d.Info.Domid))
	}
	domid := s.nextDomid
	s.nextDomid++
	d := &simDomain{Spec: *spec, Info: backend.DomainInfo{UUID: spec.UUID, Domid: domid, State: backend.DomainBuilding, VCPUs: spec.VCPUs, Memory: spec.Target}}
	s.doms[spec.UUID] = d // journalled only once complete: see MarkComplete
	return domid, nil
}

// modify runs one micro-op on a domain. Only changes a restart must see
// (persist) are written to the domain's file.
func (s *Simulator) modify(ctx context.Context, op, uuid string, fn func(d *simDomain) error, persist ...bool) error {
	if err := s.step(ctx, op); err != nil {
		return err
	}
	s.mu.Lock()
	d, err := s.get(uuid)
	if err == nil {
		err = fn(d)
	}
	var b []byte
	if err == nil && len(persist) > 0 && persist[0] && d.Info.Complete {
		b = s.snapshotFile(d)
	}
	s.mu.Unlock()
	s.save(uuid, b)
	return err
}

// Build implements Backend.
func (s *Simulator) Build(ctx context.Context, uuid string) error {
	return s.modify(ctx, "build", uuid, func(*simDomain) error { return nil })
}

// AddDisk implements Backend.
func (s *Simulator) AddDisk(ctx context.Context, uuid string, disk backend.Disk) error {
	return s.modify(ctx, "disk", uuid, func(d *simDomain) error {
		d.Info.Disks = append(d.Info.Disks, disk)
		return nil
	})
}

// AddNIC implements Backend.
func (s *Simulator) AddNIC(ctx context.Context, uuid string, n backend.NIC) error {
	return s.modify(ctx, "nic", uuid, func(d *simDomain) error {
		n.Mode = "none"
		d.Info.NICs = append(d.Info.NICs, n)
		return nil
	})
}

// StartDeviceModel implements Backend.
func (s *Simulator) StartDeviceModel(ctx context.Context, uuid string) error {
	return s.modify(ctx, "device-model", uuid, func(d *simDomain) error {
		if p := d.Spec.RestoreFrom; p != "" {
			if _, err := backend.ReadImageMeta(p); err != nil {
				return xerr.New(xerr.SuspendImageNotAccessible, p)
			}
		}
		d.Info.State = backend.DomainPaused
		d.Info.StartTime = time.Now().UTC()
		return nil
	})
}

// MarkComplete implements Backend.
func (s *Simulator) MarkComplete(uuid string) error {
	s.mu.Lock()
	d, err := s.get(uuid)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	d.Info.Complete = true
	b := s.snapshotFile(d)
	s.mu.Unlock()
	s.save(uuid, b)
	return nil
}

// setRunState moves a domain whose guest has not stopped to state to
// (backend.RefuseStopped otherwise).
func setRunState(to backend.DomainState) func(d *simDomain) error {
	return func(d *simDomain) error {
		if err := backend.RefuseStopped(d.Info.State, d.Spec.VMRef); err != nil {
			return err
		}
		d.Info.State = to
		if to == backend.DomainRunning {
			d.Info.Migrated = false // running here again (migrate.go)
		}
		return nil
	}
}

// Pause implements Backend.
func (s *Simulator) Pause(ctx context.Context, uuid string) error {
	return s.modify(ctx, "pause", uuid, setRunState(backend.DomainPaused), true)
}

// Unpause implements Backend.
func (s *Simulator) Unpause(ctx context.Context, uuid string) error {
	return s.modify(ctx, "unpause", uuid, setRunState(backend.DomainRunning), true)
}

// RequestShutdown implements Backend: unless NoACPI, the guest powers
// off after the guest-shutdown delay.
func (s *Simulator) RequestShutdown(ctx context.Context, uuid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, err := s.get(uuid)
	if err != nil {
		return err
	}
	if s.cfg.NoACPI || d.Info.State != backend.DomainRunning || d.ShutdownT != nil {
		return nil
	}
	delay := s.delays["guest-shutdown"]
	d.ShutdownT = time.AfterFunc(delay, func() { s.GuestPowerOff(uuid) })
	return nil
}

// Suspend implements Backend: it writes a small image to path.
func (s *Simulator) Suspend(ctx context.Context, uuid, path string, progress func(float64)) error {
	s.mu.Lock()
	d, err := s.get(uuid)
	var spec backend.Spec
	if err == nil {
		spec = d.Spec
		d.Info.State = backend.DomainPaused
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for i := 1; i <= 4; i++ {
		if err := s.step(ctx, "suspend"); err != nil {
			s.mu.Lock()
			if d := s.doms[uuid]; d != nil {
				d.Info.State = backend.DomainRunning
			}
			s.mu.Unlock()
			return err
		}
		if progress != nil {
			progress(float64(i) / 4)
		}
	}
	s.mu.Lock()
	meta := &backend.ImageMeta{Spec: spec, Backend: "simulator"}
	if d := s.doms[uuid]; d != nil {
		meta.Disks, meta.NICs = append([]backend.Disk(nil), d.Info.Disks...), append([]backend.NIC(nil), d.Info.NICs...)
	}
	s.mu.Unlock()
	meta.Spec.RestoreFrom = ""
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600) //nolint:gosec // os.O_RDWR|os.O_TRUNC, 0o600)|a suspend image path in the suspend dir
	if err != nil {
		return err
	}
	defer func(c func() error) { _ = c() }(f.Close)
	at, err := backend.WriteImageHeader(f, meta, backend.RecSim)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(map[string]any{"simulated-memory": spec.Target})
	if _, err := f.Write(b); err != nil {
		return err
	}
	return backend.FinishImage(f, at)
}

// Destroy implements Backend.
func (s *Simulator) Destroy(ctx context.Context, uuid string) error {
	if err := s.step(ctx, "destroy"); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.doms[uuid]; d != nil && d.ShutdownT != nil {
		d.ShutdownT.Stop()
	}
	delete(s.doms, uuid)
	if s.cfg.StateDir != "" {
		if p, err := backend.EntryPath(s.cfg.StateDir, uuid, ".json"); err == nil {
			_ = os.Remove(p)
		}
	}
	return nil
}

// PlugDisk implements Backend.
func (s *Simulator) PlugDisk(ctx context.Context, uuid string, disk backend.Disk) error {
	return s.modify(ctx, "plug", uuid, func(d *simDomain) error {
		for _, x := range d.Info.Disks {
			if x.Device == disk.Device {
				return xerr.New(xerr.DeviceAlreadyAttached, disk.VBD)
			}
		}
		d.Info.Disks = append(d.Info.Disks, disk)
		return nil
	})
}

// UnplugDisk implements Backend.
func (s *Simulator) UnplugDisk(ctx context.Context, uuid, device string, force bool) error {
	return s.modify(ctx, "unplug", uuid, func(d *simDomain) error {
		d.Info.Disks = slices.DeleteFunc(d.Info.Disks, func(x backend.Disk) bool { return x.Device == device })
		return nil
	})
}

// ChangeMedium implements Backend.
func (s *Simulator) ChangeMedium(ctx context.Context, uuid string, disk backend.Disk) error {
	return s.modify(ctx, "plug", uuid, func(d *simDomain) error {
		for i, x := range d.Info.Disks {
			if x.Device == disk.Device {
				d.Info.Disks[i] = disk
				return nil
			}
		}
		return fmt.Errorf("simulator: no drive %s", disk.Device)
	})
}

// PlugNIC implements Backend.
func (s *Simulator) PlugNIC(ctx context.Context, uuid string, n backend.NIC) error {
	return s.modify(ctx, "plug", uuid, func(d *simDomain) error {
		n.Mode = "none"
		d.Info.NICs = append(d.Info.NICs, n)
		return nil
	})
}

// UnplugNIC implements Backend.
func (s *Simulator) UnplugNIC(ctx context.Context, uuid, device string) error {
	return s.modify(ctx, "unplug", uuid, func(d *simDomain) error {
		d.Info.NICs = slices.DeleteFunc(d.Info.NICs, func(x backend.NIC) bool { return x.Device == device })
		return nil
	})
}

// SetVCPUs implements Backend.
func (s *Simulator) SetVCPUs(ctx context.Context, uuid string, n int) error {
	return s.modify(ctx, "vcpus", uuid, func(d *simDomain) error {
		d.Info.VCPUs = n
		return nil
	})
}

// SetMemoryTarget implements Backend.
func (s *Simulator) SetMemoryTarget(ctx context.Context, uuid string, bytes int64) error {
	return s.modify(ctx, "memory", uuid, func(d *simDomain) error {
		d.Info.Memory = bytes
		return nil
	})
}

// Info implements Backend.
func (s *Simulator) Info(uuid string) (backend.DomainInfo, bool) {
	return readDomain(s, uuid, func(d *simDomain) backend.DomainInfo { return cloneInfo(d.Info) })
}

// DomainSpec is the spec a simulated domain was built from (for tests:
// what a real backend would have turned into a command line).
func (s *Simulator) DomainSpec(uuid string) (backend.Spec, bool) {
	return readDomain(s, uuid, func(d *simDomain) backend.Spec { return d.Spec })
}

// readDomain returns what read takes from domain uuid under the lock, and
// false if there is no such domain.
func readDomain[T any](s *Simulator, uuid string, read func(*simDomain) T) (T, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.doms[uuid]
	if d == nil {
		var none T
		return none, false
	}
	return read(d), true
}

func cloneInfo(i backend.DomainInfo) backend.DomainInfo {
	i.Disks = append([]backend.Disk(nil), i.Disks...)
	i.NICs = append([]backend.NIC(nil), i.NICs...)
	return i
}

// List implements Backend.
func (s *Simulator) List() []backend.DomainInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]backend.DomainInfo, 0, len(s.doms))
	for _, d := range s.doms {
		out = append(out, cloneInfo(d.Info))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Domid < out[j].Domid })
	return out
}

// ConsolePath implements Backend: simulated domains have no consoles to
// connect to.
func (s *Simulator) ConsolePath(uuid, protocol string) (string, error) {
	return "", fmt.Errorf("simulated domains have no console")
}

// Close implements Backend.
func (s *Simulator) Close() {}

// The methods below change a simulated domain the way a guest or the
// host would, behind the manager's back.

func (s *Simulator) change(uuid string, fn func(d *simDomain)) bool {
	s.mu.Lock()
	d := s.doms[uuid]
	var b []byte
	if d != nil {
		fn(d)
		d.ShutdownT = nil
		b = s.snapshotFile(d)
	}
	s.mu.Unlock()
	s.save(uuid, b)
	if d != nil {
		s.notifier.Tell(uuid)
	}
	return d != nil
}

// GuestPowerOff makes the guest power itself off.
func (s *Simulator) GuestPowerOff(uuid string) bool {
	return s.change(uuid, func(d *simDomain) { d.Info.State = backend.DomainShutdown })
}

// GuestReboot makes the guest ask for a reboot.
func (s *Simulator) GuestReboot(uuid string) bool {
	return s.change(uuid, func(d *simDomain) { d.Info.State = backend.DomainReboot })
}

// Crash makes the guest crash.
func (s *Simulator) Crash(uuid string) bool {
	return s.change(uuid, func(d *simDomain) { d.Info.State = backend.DomainCrashed; d.Info.Reason = "guest panicked" })
}

// Vanish makes the domain disappear as if its process had been killed.
func (s *Simulator) Vanish(uuid string) bool {
	return s.change(uuid, func(d *simDomain) { d.Info.State = backend.DomainGone; d.Info.Reason = "process vanished" })
}
