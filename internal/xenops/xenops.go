// Package xenops runs VMs: the XenAPI VM lifecycle (start, shutdown,
// reboot, pause, suspend, resume, snapshot, clone, ...) and device
// hotplug, and live migration between the hosts of a pool
// (VM.pool_migrate, see migrate.go), in-process, on a backend that is
// either QEMU/KVM (one qemu-system-x86_64 process per running VM, driven
// over QMP) or a simulator.
//
// Each XenAPI operation is marked in the VM's current_operations under
// xapi's locking rules, queued on the VM's own queue (operations on one VM
// run one at a time; different VMs run in parallel, up to Workers at
// once), and run as small steps (hooks, create, build, disks, NICs, device
// model, unpause) with progress on the call's task. Cancelling the task
// stops at the next step and unwinds to a valid state. The backend tells
// the manager when a domain changes behind its back (guest power-off,
// reboot, crash, emulator death); a check then runs on the VM's queue and
// applies actions_after_shutdown, _reboot and _crash.
//
// Settings the daemon does not pass explicitly come from the environment:
// TOOLSTACKD_QEMU_ACCEL (auto, kvm, tcg), TOOLSTACKD_QEMU_BINARY,
// TOOLSTACKD_XENOPS_WORKERS, TOOLSTACKD_GUEST_KERNEL_DIRS (colon
// separated) and TOOLSTACKD_HOOKS_DIR.
package xenops

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/journal"
	"toolstackd/internal/schema"
	"toolstackd/internal/xenops/backend"
	"toolstackd/internal/xenops/mixed"
	"toolstackd/internal/xenops/qemu"
	"toolstackd/internal/xenops/sim"
	"toolstackd/internal/xerr"
)

// Config sets up the manager.
type Config struct {
	// ClientTLS, when set, is the TLS configuration for connections to
	// another pool's hosts (cross-pool migration over https): the
	// roots their certificates are checked by. Nil: the system's roots.
	ClientTLS func() *tls.Config
	// Backend is "qemu", "simulator" or "qemu+simulator" (mixed: a VM
	// whose platform has toolstackd-simulated=true on the simulator).
	Backend string
	// DataDir is the daemon's data directory; xenops keeps its state in
	// DataDir/xenops.
	DataDir string
	// HostRef is this host.
	HostRef string
	Log     *slog.Logger
	// Disks gives VDIs' data to VMs. Default: LocationResolver (a VDI's
	// location is an image path).
	Disks DiskResolver
	// Networks, when set, makes a VIF's network real on this host before
	// its NIC is attached (the network module: the bridge, and the PIF
	// that carries it) and lets it go after.
	Networks Networks
	// Workers bounds how many operations run at once across VMs
	// (default 64).
	Workers int
	// HooksDir holds the hook scripts (default DATA_DIR/hooks; xapi's is
	// /etc/xapi.d). HookTimeout bounds each script (default 2 min).
	HooksDir    string
	HookTimeout time.Duration
	// ShutdownTimeout bounds how long clean_shutdown and clean_reboot
	// wait for the guest (default 60 s; per VM:
	// other_config:clean_shutdown_timeout in seconds). On timeout the
	// call fails with VM_SHUTDOWN_TIMEOUT, unless the fallback policy is
	// "hard" (per VM: other_config:clean_shutdown_fallback=hard), when
	// the VM is shut down hard instead. VM.shutdown always falls back.
	ShutdownTimeout  time.Duration
	ShutdownFallback string
	// ConsoleBase prefixes console locations (default from ListenAddr,
	// else https://HOST-ADDRESS).
	ConsoleBase string
	ListenAddr  string
	// KernelDirs are where PV_kernel and PV_ramdisk may come from
	// (default /boot/guest and DATA_DIR/guest, as xapi allows only
	// /boot/guest).
	KernelDirs []string
	// Journal, when set, is a file where every domain's start and stop
	// are appended (internal/ha/journal), for tests that prove a VM never
	// runs twice.
	Journal string
	// HostMemory caps the memory VMs may use (0: the host's available
	// memory for qemu, unlimited for the simulator).
	HostMemory int64
	QEMU       qemu.Config
	Sim        sim.Config
	// Impl, when set, is used as the backend instead of making one.
	Impl backend.Backend
	// OnStep, when set, is called before every step of every operation
	// (for tests that cancel at each step).
	OnStep func(vmUUID, op, step string)
}

// Manager is the VM lifecycle service.
type Manager struct {
	// fenced holds, by VM uuid, when HA fenced the VM's domain here
	// (fence.go): its record is the coordinator's to move for a while.
	fenced sync.Map
	srv    *api.Server
	db     *db.DB
	cfg    Config
	log    *slog.Logger
	be     backend.Backend
	disks  DiskResolver
	q      *queues
	host   string

	bg     context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	ops      map[string]map[string]*runningOp // VM ref -> op key -> op
	changed  map[string]chan struct{}         // VM uuid -> closed on change
	restarts map[string][]time.Time           // VM ref -> recent automatic restarts
	reserved atomic.Int64                     // memory promised to starts in progress
	mig      migrateState                     // live migration's wiring (migrate.go)
	stor     storageState                     // storage migrations (storagemigrate.go)
	xpool    crossState                       // migrations between pools (crosspool.go)
}

type runningOp struct {
	op     string
	cancel context.CancelFunc
}

// Register makes the manager, re-attaches to the domains left by an
// earlier run, registers the XenAPI handlers and the /console endpoint.
func Register(srv *api.Server, router *mux.Router, cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	applyEnv(&cfg)
	if cfg.Workers <= 0 {
		cfg.Workers = 64
	}
	if cfg.HookTimeout <= 0 {
		cfg.HookTimeout = 2 * time.Minute
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 60 * time.Second
	}
	if cfg.HooksDir == "" && cfg.DataDir != "" {
		cfg.HooksDir = filepath.Join(cfg.DataDir, "hooks")
	}
	if cfg.KernelDirs == nil {
		cfg.KernelDirs = []string{"/boot/guest"}
		if cfg.DataDir != "" {
			cfg.KernelDirs = append(cfg.KernelDirs, filepath.Join(cfg.DataDir, "guest"))
		}
	}
	m := &Manager{srv: srv, db: srv.DB, cfg: cfg, log: cfg.Log.With("component", "xenops"), host: cfg.HostRef,
		ops: map[string]map[string]*runningOp{}, changed: map[string]chan struct{}{}, restarts: map[string][]time.Time{}}
	m.disks = cfg.Disks
	if m.disks == nil {
		m.disks = LocationResolver{DB: srv.DB}
	}
	m.q = newQueues(cfg.Workers)
	m.bg, m.cancel = context.WithCancel(context.Background())
	be, err := m.makeBackend()
	if err != nil {
		return nil, err
	}
	m.be = be
	if a, ok := be.(backend.Accelerated); ok {
		m.recordAccelerator(a.Accelerator())
	}
	if m.cfg.ConsoleBase == "" {
		m.cfg.ConsoleBase = m.consoleBase()
	}
	if cfg.DataDir != "" {
		if err := os.MkdirAll(m.suspendDir(), 0o700); err != nil {
			return nil, err
		}
	}
	// Events that come while reconciling are held, then acted on.
	var held sync.Map
	reconciling := true
	var rmu sync.Mutex
	be.SetNotify(func(uuid string) {
		rmu.Lock()
		defer rmu.Unlock()
		if reconciling {
			held.Store(uuid, true)
			return
		}
		m.notify(uuid)
	})
	m.reconcile()
	rmu.Lock()
	reconciling = false
	rmu.Unlock()
	held.Range(func(k, _ any) bool { m.notify(k.(string)); return true })
	be.SetNotify(m.notify)
	m.registerHandlers()
	if router != nil {
		router.HandleFunc("/console", m.serveConsole).Methods("CONNECT", "GET")
		m.registerCrossPool(router)
	}
	m.wg.Add(1)
	go m.watchDB()
	m.log.Info("VM lifecycle ready", "backend", be.Name(), "workers", cfg.Workers, "hooks", cfg.HooksDir)
	return m, nil
}

func applyEnv(cfg *Config) {
	if v := os.Getenv("TOOLSTACKD_QEMU_ACCEL"); v != "" && cfg.QEMU.Accel == "" {
		cfg.QEMU.Accel = v
	}
	if v := os.Getenv("TOOLSTACKD_QEMU_BINARY"); v != "" && cfg.QEMU.Binary == "" {
		cfg.QEMU.Binary = v
	}
	if v, err := strconv.Atoi(os.Getenv("TOOLSTACKD_XENOPS_WORKERS")); err == nil && v > 0 && cfg.Workers == 0 {
		cfg.Workers = v
	}
	if v := os.Getenv("TOOLSTACKD_GUEST_KERNEL_DIRS"); v != "" && cfg.KernelDirs == nil {
		cfg.KernelDirs = filepath.SplitList(v)
	}
	if v := os.Getenv("TOOLSTACKD_HOOKS_DIR"); v != "" && cfg.HooksDir == "" {
		cfg.HooksDir = v
	}
	// The simulator's delays by micro-op, for tests of the daemon as a
	// process: "mirror-copy=20s,export=1s".
	for _, kv := range strings.Split(os.Getenv("TOOLSTACKD_SIM_DELAYS"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		d, err := time.ParseDuration(v)
		if !ok || err != nil || d < 0 {
			continue
		}
		if cfg.Sim.Delays == nil {
			cfg.Sim.Delays = map[string]time.Duration{}
		}
		if _, set := cfg.Sim.Delays[k]; !set {
			cfg.Sim.Delays[k] = d
		}
	}
}

func (m *Manager) makeBackend() (backend.Backend, error) {
	if m.cfg.Impl != nil {
		return m.cfg.Impl, nil
	}
	state := ""
	if m.cfg.DataDir != "" {
		state = filepath.Join(m.cfg.DataDir, "xenops")
	}
	newQEMU := func() (backend.Backend, error) {
		qc := m.cfg.QEMU
		if qc.StateDir == "" {
			if state == "" {
				return nil, errors.New("xenops: the qemu backend needs a data directory")
			}
			qc.StateDir = filepath.Join(state, "qemu")
		}
		return qemu.New(qc, m.log)
	}
	newSim := func() (backend.Backend, error) {
		sc := m.cfg.Sim
		if sc.StateDir == "" && state != "" {
			sc.StateDir = filepath.Join(state, "sim")
		}
		return sim.New(sc)
	}
	switch m.cfg.Backend {
	case "qemu":
		return newQEMU()
	case "simulator", "":
		return newSim()
	case mixed.Name:
		q, err := newQEMU()
		if err != nil {
			return nil, err
		}
		s, err := newSim()
		if err != nil {
			q.Close()
			return nil, err
		}
		return mixed.New(q, s), nil
	}
	return nil, fmt.Errorf("xenops: unknown backend %q", m.cfg.Backend)
}

// LiveSnapshot switches a running VM's disk on a VDI to a new active
// image (an empty overlay at path whose backing is the image the VM has
// open), for storage's snapshots and clones of disks in use. It is a
// no-op for VMs that do not use the VDI, and for backends with nothing
// to switch (the simulator).
func (m *Manager) LiveSnapshot(ctx context.Context, vmUUID, vdi, path, format string) error {
	ls, ok := m.be.(backend.LiveSnapshotter)
	info, found := m.be.Info(vmUUID)
	if !ok || !found {
		return nil
	}
	for _, d := range info.Disks {
		if d.VDI == vdi && !d.ReadOnly {
			return ls.LiveSnapshot(ctx, vmUUID, d.Device, path, format)
		}
	}
	return nil
}

// Backend returns the backend (tests reach the simulator through it).
func (m *Manager) Backend() backend.Backend { return m.be }

// SetWorkers changes how many operations may run at once.
func (m *Manager) SetWorkers(n int) { m.q.w.setLimit(n) }

// Close stops the manager's background work; domains keep running.
func (m *Manager) Close() {
	m.cancel()
	m.wg.Wait()
	m.be.Close()
}

func (m *Manager) consoleBase() string {
	addr := ""
	if h, ok := m.db.Snapshot().Get(dm.Host.Class, m.host); ok {
		addr = h.String(dm.Host.Address)
	}
	if m.cfg.ListenAddr != "" {
		host, port, err := net.SplitHostPort(m.cfg.ListenAddr)
		if err == nil {
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = addr
			}
			return "http://" + net.JoinHostPort(host, port)
		}
	}
	return "https://" + addr
}

func (m *Manager) suspendDir() string { return filepath.Join(m.cfg.DataDir, "xenops", "suspend") }

// suspendPath is where a VM's memory image lives when storage does not
// hold suspend images.
// A uuid that is not a plain file name is refused (INVALID_VALUE).
func (m *Manager) suspendPath(uuid string) (string, error) {
	return backend.EntryPath(m.suspendDir(), uuid, ".img")
}

// notify is the backend's "this domain needs attention".
func (m *Manager) notify(uuid string) {
	m.mu.Lock()
	if ch := m.changed[uuid]; ch != nil {
		close(ch)
		delete(m.changed, uuid)
	}
	m.mu.Unlock()
	row, ok := m.db.Snapshot().ByUUID(dm.VM.Class, uuid)
	if !ok {
		m.log.Warn("event for a domain whose VM is not in the database", "vm", uuid)
		return
	}
	ref := row.Ref
	m.q.submit(ref, &job{ctx: m.bg, name: "check", check: true, run: func(ctx context.Context) error {
		if err := m.checkState(ctx, ref); err != nil {
			m.log.Warn("acting on a domain change", "vm", uuid, "err", err)
		}
		return nil
	}})
}

// changes returns a channel closed at the next backend event for a VM.
func (m *Manager) changes(uuid string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.changed[uuid]
	if ch == nil {
		ch = make(chan struct{})
		m.changed[uuid] = ch
	}
	return ch
}

// availableMemory is what a new domain may still take: the configured
// HostMemory less what domains have, or (QEMU) the host's available
// memory; less what starts in progress have reserved.
func (m *Manager) availableMemory() int64 {
	limit := m.cfg.HostMemory
	if limit > 0 {
		for _, d := range m.be.List() {
			if d.Complete { // domains still starting are in m.reserved
				limit -= d.Memory
			}
		}
	} else if m.be.Name() == "qemu" {
		limit = memAvailable()
	}
	if limit == 0 && m.cfg.HostMemory == 0 {
		return 1 << 62
	}
	return limit - m.reserved.Load()
}

// reserve promises memory to a start, or says why there is not enough
// (HOST_NOT_ENOUGH_FREE_MEMORY [needed, available]).
func (m *Manager) reserve(need int64) error {
	avail := m.availableMemory()
	if need > avail {
		return xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(avail, 0), 10))
	}
	m.reserved.Add(need)
	if m.availableMemory() < 0 { // a concurrent start took it first
		m.reserved.Add(-need)
		return xerr.New(xerr.HostNotEnoughFreeMemory, strconv.FormatInt(need, 10), strconv.FormatInt(max(avail-need, 0), 10))
	}
	return nil
}

func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer func(c func() error) { _ = c() }(f.Close)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			n, _ := strconv.ParseInt(fields[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

func hostCPUs(r db.Reader, host string) int {
	if h, ok := r.Get(dm.Host.Class, host); ok {
		if ci, ok := h.Get(dm.Host.CPUInfo).(map[string]string); ok {
			if n, err := strconv.Atoi(ci["cpu_count"]); err == nil && n > 0 {
				return n
			}
		}
	}
	return runtime.NumCPU()
}

// --- Database state -------------------------------------------------

func strs(v any) []string { s, _ := v.([]string); return s }

// refreshVM recomputes allowed_operations for a VM and its devices.
func refreshVM(tx *db.Tx, ref string) error {
	row, ok := tx.Get(dm.VM.Class, ref)
	if !ok {
		return nil
	}
	if err := tx.Set(dm.VM.AllowedOperations, ref, allowedVMOps(vmCheckOf(tx, row))); err != nil {
		return err
	}
	// A VM without a domain has domid -1 (VM.create leaves 0).
	if p := row.String(dm.VM.PowerState); (p == psHalted || p == psSuspended) && row.Get(dm.VM.Domid) != int64(-1) {
		if err := tx.Set(dm.VM.Domid, ref, int64(-1)); err != nil {
			return err
		}
	}
	for _, vbd := range strs(tx.Value(row, dm.VM.VBDs)) {
		if err := refreshDev(tx, dm.VBD.Class, vbd); err != nil {
			return err
		}
	}
	for _, vif := range strs(tx.Value(row, dm.VM.VIFs)) {
		if err := refreshDev(tx, dm.VIF.Class, vif); err != nil {
			return err
		}
	}
	return nil
}

func refreshDev(tx *db.Tx, cls *schema.Class, ref string) error {
	row, ok := tx.Get(cls, ref)
	if !ok {
		return nil
	}
	d := devCheckOf(tx, row)
	f := dm.VBD.AllowedOperations
	if cls == dm.VIF.Class {
		f = dm.VIF.AllowedOperations
	}
	return tx.Set(f, ref, d.allowed())
}

// vmStale says whether a VM's (or its devices') allowed_operations
// differ from what the rules give now.
//
// It reads the VM fields in vmOpsInputs, and the VM's devices.
func vmStale(r db.Reader, row *db.Row) bool {
	if !schema.Equal(row.Get(dm.VM.AllowedOperations), allowedVMOps(vmCheckOf(r, row))) {
		return true
	}
	if p := row.String(dm.VM.PowerState); (p == psHalted || p == psSuspended) && row.Get(dm.VM.Domid) != int64(-1) {
		return true
	}
	for _, vbd := range strs(r.Value(row, dm.VM.VBDs)) {
		if d, ok := r.Get(dm.VBD.Class, vbd); ok {
			c := devCheckOf(r, d)
			if !schema.Equal(d.Get(dm.VBD.AllowedOperations), c.allowed()) {
				return true
			}
		}
	}
	for _, vif := range strs(r.Value(row, dm.VM.VIFs)) {
		if d, ok := r.Get(dm.VIF.Class, vif); ok {
			c := devCheckOf(r, d)
			if !schema.Equal(d.Get(dm.VIF.AllowedOperations), c.allowed()) {
				return true
			}
		}
	}
	return false
}

// setHalted records a VM without a domain, as xapi's force_state_reset.
func (m *Manager) setHalted(tx *db.Tx, ref string) error {
	row, ok := tx.Get(dm.VM.Class, ref)
	if !ok {
		return nil
	}
	if err := m.setDomainless(tx, row, psHalted, dm.VM.RequiresReboot, false); err != nil {
		return err
	}
	if _, err := setMetrics(tx, row.String(dm.VM.Metrics), map[*schema.Field]any{
		dm.VMMetrics.State: []string{}, dm.VMMetrics.LastUpdated: time.Now().UTC(),
	}); err != nil {
		return err
	}
	return refreshVM(tx, ref)
}

// setSuspended records a VM whose memory is in an image.
func (m *Manager) setSuspended(tx *db.Tx, ref, suspendVDI string) error {
	row, ok := tx.Get(dm.VM.Class, ref)
	if !ok {
		return nil
	}
	if err := m.setDomainless(tx, row, psSuspended, dm.VM.SuspendVDI, suspendVDI); err != nil {
		return err
	}
	return refreshVM(tx, ref)
}

// setDomainless records what every VM without a domain shares: its
// devices unplugged, resident nowhere, no domid, in power state power;
// and one more field, f, set to v (what Halted and Suspended differ in).
func (m *Manager) setDomainless(tx *db.Tx, row *db.Row, power string, f *schema.Field, v any) error {
	if err := m.detachedDevices(tx, row); err != nil {
		return err
	}
	for f, v := range map[*schema.Field]any{
		dm.VM.PowerState: power, dm.VM.ResidentOn: schema.NullRef, dm.VM.ScheduledToBeResidentOn: schema.NullRef,
		dm.VM.Domid: int64(-1), f: v,
	} {
		if err := tx.Set(f, row.Ref, v); err != nil {
			return err
		}
	}
	return m.noteFreeMemory(tx)
}

// noteFreeMemory keeps this host's host_metrics current in a transaction
// that starts or ends a domain here: memory_total is the memory VMs may
// use (Config.HostMemory, else what the host reported at first boot) and
// memory_free that less the memory of the VMs resident here. Placement
// reads it (forwarding), so a start elsewhere in the pool sees this one.
func (m *Manager) noteFreeMemory(tx *db.Tx) error {
	host, ok := tx.Get(dm.Host.Class, m.host)
	if !ok {
		return nil
	}
	ref := host.String(dm.Host.Metrics)
	metrics, ok := tx.Get(dm.HostMetrics.Class, ref)
	if !ok {
		return nil
	}
	total, _ := metrics.Get(dm.HostMetrics.MemoryTotal).(int64)
	if m.cfg.HostMemory > 0 && total != m.cfg.HostMemory {
		total = m.cfg.HostMemory
		if err := tx.Set(dm.HostMetrics.MemoryTotal, ref, total); err != nil {
			return err
		}
	}
	free := total
	for _, vm := range strs(tx.Value(host, dm.Host.ResidentVMs)) {
		row, ok := tx.Get(dm.VM.Class, vm)
		if !ok || row.Get(dm.VM.IsControlDomain) == true {
			continue
		}
		n, _ := row.Get(dm.VM.MemoryTarget).(int64)
		if sm, _ := row.Get(dm.VM.MemoryStaticMax).(int64); n <= 0 {
			n = sm
		}
		free -= n
	}
	free = max(free, 0)
	if cur, _ := metrics.Get(dm.HostMetrics.MemoryFree).(int64); cur != free {
		return tx.Set(dm.HostMetrics.MemoryFree, ref, free)
	}
	return nil
}

// detachedDevices marks a VM's devices unplugged and drops its consoles.
func (m *Manager) detachedDevices(tx *db.Tx, row *db.Row) error {
	for _, vbd := range strs(tx.Value(row, dm.VM.VBDs)) {
		if _, ok := tx.Get(dm.VBD.Class, vbd); ok {
			if err := tx.Set(dm.VBD.CurrentlyAttached, vbd, false); err != nil {
				return err
			}
		}
	}
	for _, vif := range strs(tx.Value(row, dm.VM.VIFs)) {
		if _, ok := tx.Get(dm.VIF.Class, vif); ok {
			if err := tx.Set(dm.VIF.CurrentlyAttached, vif, false); err != nil {
				return err
			}
		}
	}
	for _, c := range strs(tx.Value(row, dm.VM.Consoles)) {
		if _, ok := tx.Get(dm.Console.Class, c); ok {
			if err := tx.Delete(dm.Console.Class, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// Networks is what the VM lifecycle asks of the network module. Neither
// call may be made inside a database transaction (both write).
type Networks interface {
	// EnsureVIF makes the VIF's network real here and returns its bridge.
	EnsureVIF(ctx context.Context, vif string) (bridge string, err error)
	// Release says the VIF no longer needs its network here.
	Release(ctx context.Context, vif string) error
	// MoveVIF makes network real for a plugged VIF moving to it and
	// returns its bridge.
	MoveVIF(ctx context.Context, vif, network string) (bridge string, err error)
	// LockVIF applies the VIF's locking rules to the tap the backend put
	// on the bridge.
	LockVIF(ctx context.Context, vif, tap string) error
}

// lockNIC applies the locking rules of the VIF's tap, if the backend
// made one for it (a NIC on QEMU's user networking has no port to lock).
func (m *Manager) lockNIC(ctx context.Context, uuid, vif string) error {
	if m.cfg.Networks == nil {
		return nil
	}
	info, _ := m.be.Info(uuid)
	for _, n := range info.NICs {
		if n.VIF == vif && n.Mode == "tap" && n.Tap != "" {
			return m.cfg.Networks.LockVIF(ctx, vif, n.Tap)
		}
	}
	return nil
}

// ensureNIC makes n's network real through Config.Networks and sets its
// bridge; without Networks it leaves n as the database says.
func (m *Manager) ensureNIC(ctx context.Context, n *backend.NIC) error {
	if m.cfg.Networks == nil {
		return nil
	}
	bridge, err := m.cfg.Networks.EnsureVIF(ctx, n.VIF)
	if err != nil {
		return err
	}
	n.Bridge = bridge
	return nil
}

// releaseNICs lets the networks of a VM's NICs go (best effort: the
// network module's watch removes what no running VM needs anyway).
func (m *Manager) releaseNICs(ctx context.Context, vifs []string) {
	if m.cfg.Networks == nil {
		return
	}
	for _, vif := range vifs {
		if err := m.cfg.Networks.Release(ctx, vif); err != nil {
			m.log.Warn("releasing a VIF's network", "vif", vif, "err", err)
		}
	}
}

// setLive records a VM with a domain (Running or Paused): where, which
// domain, its devices, consoles and metrics.
func (m *Manager) setLive(tx *db.Tx, ref string, info backend.DomainInfo, power string) error {
	row, ok := tx.Get(dm.VM.Class, ref)
	if !ok {
		return nil
	}
	now := time.Now().UTC()
	for f, v := range map[*schema.Field]any{
		dm.VM.PowerState: power, dm.VM.ResidentOn: m.host, dm.VM.ScheduledToBeResidentOn: schema.NullRef,
		dm.VM.Domid: info.Domid,
	} {
		if err := tx.Set(f, ref, v); err != nil {
			return err
		}
	}
	if info.Memory > 0 {
		if err := tx.Set(dm.VM.MemoryTarget, ref, info.Memory); err != nil {
			return err
		}
	}
	disks := map[string]backend.Disk{}
	for _, d := range info.Disks {
		disks[d.VBD] = d
	}
	for _, vbd := range strs(tx.Value(row, dm.VM.VBDs)) {
		if _, ok := tx.Get(dm.VBD.Class, vbd); !ok {
			continue
		}
		d, attached := disks[vbd]
		if err := tx.Set(dm.VBD.CurrentlyAttached, vbd, attached); err != nil {
			return err
		}
		if attached {
			if err := tx.Set(dm.VBD.Device, vbd, guestDeviceName(d, row)); err != nil {
				return err
			}
		}
	}
	nics := map[string]bool{}
	for _, n := range info.NICs {
		nics[n.VIF] = true
	}
	for _, vif := range strs(tx.Value(row, dm.VM.VIFs)) {
		if _, ok := tx.Get(dm.VIF.Class, vif); ok {
			if err := tx.Set(dm.VIF.CurrentlyAttached, vif, nics[vif]); err != nil {
				return err
			}
		}
	}
	if err := m.ensureConsoles(tx, row); err != nil {
		return err
	}
	if err := m.updateMetrics(tx, row, info, now); err != nil {
		return err
	}
	if err := m.noteFreeMemory(tx); err != nil {
		return err
	}
	return refreshVM(tx, ref)
}

// guestDeviceName is the name the guest sees a disk under.
func guestDeviceName(d backend.Disk, vm *db.Row) string {
	n, err := strconv.Atoi(d.Device)
	if err != nil || n < 0 || n > 25 {
		return ""
	}
	plat, _ := vm.Get(dm.VM.Platform).(map[string]string)
	letter := string(rune('a' + n))
	if d.CD || plat["disk-bus"] == "ide" {
		return "hd" + letter
	}
	return "vd" + letter
}

func (m *Manager) ensureConsoles(tx *db.Tx, vm *db.Row) error {
	have := map[string]bool{}
	for _, c := range strs(tx.Value(vm, dm.VM.Consoles)) {
		if r, ok := tx.Get(dm.Console.Class, c); ok {
			have[r.String(dm.Console.Protocol)] = true
		}
	}
	for _, proto := range []dm.ConsoleProtocol{dm.ConsoleProtocolRfb, dm.ConsoleProtocolVt100} {
		if have[string(proto)] {
			continue
		}
		id := uuid.NewString()
		rec := &dm.ConsoleRecord{UUID: id, Protocol: proto, Location: m.cfg.ConsoleBase + "/console?uuid=" + id,
			VM: dm.VMRef(vm.Ref), OtherConfig: map[string]string{"vm-uuid": vm.UUID()}}
		if _, err := tx.Insert(dm.Console.Class, "", rec.Row()); err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) updateMetrics(tx *db.Tx, vm *db.Row, info backend.DomainInfo, now time.Time) error {
	mr := vm.String(dm.VM.Metrics)
	if _, ok := tx.Get(dm.VMMetrics.Class, mr); !ok {
		var err error
		if mr, err = m.newMetrics(tx, now); err != nil {
			return err
		}
		if err := tx.Set(dm.VM.Metrics, vm.Ref, mr); err != nil {
			return err
		}
	}
	state := "running"
	if vm.String(dm.VM.PowerState) == psPaused {
		state = "paused"
	}
	start := info.StartTime
	if start.IsZero() {
		start = now
	}
	dt := vm.String(dm.VM.DomainType)
	if dt == "" || dt == string(dm.DomainTypeUnspecified) {
		dt = string(dm.DomainTypeHVM)
	}
	for f, v := range map[*schema.Field]any{
		dm.VMMetrics.MemoryActual: info.Memory, dm.VMMetrics.VCPUsNumber: int64(info.VCPUs),
		dm.VMMetrics.StartTime: start.UTC(), dm.VMMetrics.LastUpdated: now, dm.VMMetrics.State: []string{state},
		dm.VMMetrics.HVM: true, dm.VMMetrics.CurrentDomainType: dt,
	} {
		if err := tx.Set(f, mr, v); err != nil {
			return err
		}
	}
	return nil
}

// setMetrics sets fields of the VM_metrics record mr, when there is one
// ("" or a dangling ref is none); ok says whether there was.
func setMetrics(tx *db.Tx, mr string, vals map[*schema.Field]any) (ok bool, err error) {
	if mr == "" {
		return false, nil
	}
	if _, ok := tx.Get(dm.VMMetrics.Class, mr); !ok {
		return false, nil
	}
	for f, v := range vals {
		if err := tx.Set(f, mr, v); err != nil {
			return true, err
		}
	}
	return true, nil
}

func (m *Manager) newMetrics(tx *db.Tx, now time.Time) (string, error) {
	rec := &dm.VMMetricsRecord{InstallTime: now, LastUpdated: now, OtherConfig: map[string]string{},
		VCPUsParams: map[string]string{}, State: []string{}}
	return tx.Insert(dm.VMMetrics.Class, "", rec.Row())
}

// --- Reconciliation -------------------------------------------------

// reconcile brings the database and the backend together at start-up:
// domains that still run are managed again (and the database follows
// them); VMs whose domain vanished while toolstackd was down are Halted;
// starts interrupted by the restart are undone.
func (m *Manager) reconcile() {
	ctx := m.bg
	snap := m.db.Snapshot()
	doms := map[string]backend.DomainInfo{}
	for _, d := range m.be.List() {
		doms[d.UUID] = d
	}
	var halt []string
	for _, row := range snap.All(dm.VM.Class) {
		if row.Get(dm.VM.IsControlDomain) == true {
			continue
		}
		power := row.String(dm.VM.PowerState)
		if (power != psRunning && power != psPaused) || row.String(dm.VM.ResidentOn) != m.host {
			continue
		}
		info, ok := doms[row.UUID()]
		if ok && info.Received && m.adoptReceived(ctx, row.Ref) {
			// A migration here committed before the daemon stopped
			// (migrate_recover.go).
			delete(doms, row.UUID())
			continue
		}
		if !ok || info.State == backend.DomainGone || !info.Complete {
			if ok && info.Received {
				m.log.Warn("VM migrated here, but its domain did not keep the guest's state across the restart: marking it Halted", "vm", row.UUID())
			} else {
				m.log.Warn("VM's domain vanished while toolstackd was down: marking it Halted", "vm", row.UUID())
			}
			if ok {
				m.cleanupDomain(ctx, info)
				delete(doms, row.UUID())
			}
			halt = append(halt, row.Ref)
		}
	}
	if len(halt) > 0 {
		// reconcile goes on with the domains that run; the VMs keep their
		// recorded state until the next start-up tries again.
		if _, err := m.db.Update(func(tx *db.Tx) error {
			for _, ref := range halt {
				if err := m.setHalted(tx, ref); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			m.log.Error("cannot mark VMs whose domain vanished Halted", "vms", len(halt), "err", err)
		}
	}
	for uuid, info := range doms {
		row, ok := snap.ByUUID(dm.VM.Class, uuid)
		switch {
		case !ok && info.State == backend.DomainGone:
			m.cleanupDomain(ctx, info)
		case !ok:
			m.log.Warn("domain of a VM the database does not know: left alone", "vm", uuid, "domid", info.Domid, "pid", info.Pid)
		case !info.Complete && info.Received && info.State == backend.DomainPaused:
			m.settleReceivedLater(row.Ref, uuid) // migrate_recover.go
		case !info.Complete:
			m.log.Info("removing a domain whose start was interrupted", "vm", uuid)
			m.cleanupDomain(ctx, info)
		default:
			if err := m.checkState(ctx, row.Ref); err != nil {
				m.log.Warn("reconciling domain", "vm", uuid, "err", err)
			}
			m.relockNICs(ctx, info)
		}
	}
	m.refreshAll()
	if _, err := m.db.Update(m.noteFreeMemory); err != nil {
		m.log.Warn("cannot record the host's free memory", "err", err)
	}
	m.wg.Add(1)
	go m.watchLateCommits() // migrate_recover.go
}

// relockNICs hands the taps of a domain found running at start-up back
// to the network module, which applies their locking rules again and
// follows them from now on (a failure is logged: the rules the kernel
// kept stay in force).
func (m *Manager) relockNICs(ctx context.Context, info backend.DomainInfo) {
	if m.cfg.Networks == nil {
		return
	}
	for _, n := range info.NICs {
		if n.Mode != "tap" || n.Tap == "" || n.VIF == "" {
			continue
		}
		if err := m.cfg.Networks.LockVIF(ctx, n.VIF, n.Tap); err != nil {
			m.log.Warn("locking rules of a running VIF", "vm", info.UUID, "tap", n.Tap, "err", err)
		}
	}
}

// cleanupDomain removes what is left of a domain: its process (if any),
// taps and files, and the VDIs it had attached.
func (m *Manager) cleanupDomain(ctx context.Context, info backend.DomainInfo) {
	if err := m.be.Destroy(context.WithoutCancel(ctx), info.UUID); err != nil {
		m.log.Warn("removing domain", "vm", info.UUID, "err", err)
	} else {
		m.journal(journal.Stop, info.UUID)
	}
	m.detachAll(ctx, info.UUID, info.Disks)
}

func (m *Manager) detachAll(ctx context.Context, vm string, disks []backend.Disk) {
	seen := map[string]bool{}
	for _, d := range disks {
		if d.VDI == "" || seen[d.VDI] {
			continue
		}
		seen[d.VDI] = true
		if err := m.disks.Detach(context.WithoutCancel(ctx), vm, d.VDI); err != nil {
			m.log.Warn("detaching VDI", "vdi", d.VDI, "err", err)
		}
	}
}

// refreshAll recomputes allowed_operations wherever it is stale.
func (m *Manager) refreshAll() {
	snap := m.db.Snapshot()
	var stale []string
	snap.Ascend(dm.VM.Class, func(r *db.Row) bool {
		if vmStale(snap, r) {
			stale = append(stale, r.Ref)
		}
		return true
	})
	m.refresh(stale)
}

func (m *Manager) refresh(refs []string) {
	for len(refs) > 0 {
		n := min(len(refs), 500)
		batch := refs[:n]
		refs = refs[n:]
		if _, err := m.db.Update(func(tx *db.Tx) error {
			for _, ref := range batch {
				if err := refreshVM(tx, ref); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			m.log.Warn("refreshing allowed operations", "err", err)
		}
	}
}

// watchDB keeps allowed_operations right when VMs and their devices are
// changed by other parts of the API (VM.create, set_is_a_template,
// VBD.create, ...).
func (m *Manager) watchDB() {
	defer m.wg.Done()
	gen := m.db.Generation()
	for {
		snap := m.db.Snapshot()
		if snap.Generation() == gen {
			select {
			case <-m.bg.Done():
				return
			case <-snap.Done():
			}
		}
		batches, err := m.db.ChangesSince(gen)
		now := m.db.Snapshot()
		gen = now.Generation()
		if err != nil {
			m.refreshAll()
			continue
		}
		touched := map[string]bool{}
		for _, b := range batches {
			for _, ch := range b.Changes {
				switch ch.Class {
				case dm.VM.Class:
					if ch.Op == db.OpDelete || !vmOpsInputChanged(&ch) {
						continue
					}
					touched[ch.Ref] = true
				case dm.VBD.Class, dm.VIF.Class:
					if ch.Field == dm.VBD.AllowedOperations || ch.Field == dm.VIF.AllowedOperations {
						continue
					}
					row := ch.Row
					if row == nil {
						row = ch.Old
					}
					vmf := dm.VBD.VM
					if ch.Class == dm.VIF.Class {
						vmf = dm.VIF.VM
					}
					touched[row.String(vmf)] = true
				}
			}
		}
		var stale []string
		for ref := range touched {
			if row, ok := now.Get(dm.VM.Class, ref); ok && vmStale(now, row) {
				stale = append(stale, ref)
			}
		}
		m.refresh(stale)
	}
}

// --- helpers --------------------------------------------------------

func cancelledErr(task string) error { return xerr.New(xerr.TaskCancelled, task) }

// isCancel reports whether err is a context cancellation.
func isCancel(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
