// Package storage is toolstackd's storage layer: the storage mux that
// routes every SR to its driver, the XenAPI calls of the SR, PBD, VDI and
// SM classes, the VDI attach state machine and the datapaths that hand
// VDIs to the VM backend, and disk transfer over HTTP (/import_raw_vdi,
// /export_raw_vdi).
//
// Drivers (see Driver) are in-process; three come with it: "file" (qcow2
// images in a local directory), "sharedfs" (the same on a directory every
// host mounts) and plugin drivers (executables per operation, JSON in and
// out, documented in PLUGINS.md), found in Config.PluginDirs.
//
// Two jobs live in packages of their own: the image formats toolstackd
// reads and writes without QEMU (qcow2 headers, creation and filling,
// streamed qcow2 and VHD export, VHD import) in
// internal/storage/imageformat, and NBD (export URIs and the protocol
// client that reads and writes qemu-nbd and plugin exports) in
// internal/nbd. Where the files of this package stand:
//
//	service.go, ops.go, errors.go, guard.go   the mux, operation marks, errors, disk reserve
//	sr_api.go, vdi_api.go                     the XenAPI handlers (VDI.copy in vdi_api.go)
//	driver.go, filesr.go, plugin.go, gc.go    the driver interface and the drivers
//	automaton.go, datapath.go                 VDI attach states and datapaths
//	device.go, qemunbd.go, qemuimg.go         attached VDIs opened for a transfer
//	http.go, transfer.go                      /import_raw_vdi, /export_raw_vdi and copying
//	export.go                                 a VDI as a mirror target, and the source's relay
package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
)

// Config is what the daemon tells the storage layer.
type Config struct {
	// DataDir is the daemon's state directory; the first-boot SR lives in
	// DataDir/storage/local and the datapath state in DataDir/storage.
	DataDir string
	// HostRef is this host.
	HostRef string
	// FirstBoot is true when the database was just made: the "Local
	// storage" SR is created and made the pool's default.
	FirstBoot bool
	Log       *slog.Logger
	// PluginDirs are searched for plugin drivers (volume/<type>/ and
	// datapath/<scheme>/ subdirectories). Default: DataDir/storage-plugins
	// and /usr/libexec/toolstackd/storage.
	PluginDirs []string
	// RunDir holds Unix sockets (short paths). Default: DataDir/run; a
	// path too long for a socket is replaced by one in the system
	// temporary directory.
	RunDir string
	// OpWait is how long an operation waits for a conflicting one on the
	// same object before OTHER_OPERATION_IN_PROGRESS. Default 30s.
	OpWait time.Duration
	// PluginTimeout bounds one plugin call. Default 10 minutes.
	PluginTimeout time.Duration
	// LocalSRPath overrides where the first-boot SR lives.
	LocalSRPath string
	// ProtectedDirs are more of the daemon's state directories (outside
	// DataDir) that no file SR may be in or contain. DataDir, the plugin
	// directories and RunDir are always protected; the first-boot SR's
	// own directory is the one exception.
	ProtectedDirs []string
	// ReserveBytes and ReservePercent are the disk reserve: an import
	// (and the spool it may use) or a VDI.copy stops with SR_FULL before the file
	// system holding DataDir has less than max(ReserveBytes,
	// ReservePercent% of its size) free, so that the database can still
	// be written. 0 means the default (DefaultReserveBytes,
	// DefaultReservePercent); a negative value holds nothing back.
	ReserveBytes   int64
	ReservePercent float64
}

// Service is the storage layer of one host.
type Service struct {
	srv  *api.Server
	db   *db.DB
	cfg  Config
	log  *slog.Logger
	host string
	run  string

	mu       sync.Mutex
	bound    map[string]*boundSR // SR ref -> attached SR (the mux)
	inflight map[string]int      // SR ref + "/" + key: volumes being made
	vdis     map[string]*vdiDPs  // VDI ref -> its datapaths
	hooks    map[string]LiveSwitch
	locks    map[string]*keyLock // per-object mutexes
	drivers  map[string]Driver   // SR type -> driver
	policy   *locationPolicy     // where file SRs may live
	reserve  *reserve            // space kept free while importing

	bg sync.WaitGroup
}

// boundSR is one entry of the mux: an SR attached on this host.
type boundSR struct {
	ref, uuid, typ string
	driver         Driver
	sr             SR
}

// Register installs the storage layer into a server: drivers, SM records,
// XenAPI handlers and HTTP routes. On first boot it creates the "Local
// storage" SR; on later starts it plugs again the PBDs of this host that
// were plugged and re-attaches the datapaths that were attached. Spool and
// temporary files a killed daemon left are removed first.
func Register(srv *api.Server, router *mux.Router, cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = srv.Log
	}
	if cfg.OpWait == 0 {
		cfg.OpWait = 30 * time.Second
	}
	if cfg.PluginTimeout == 0 {
		cfg.PluginTimeout = 10 * time.Minute
	}
	if cfg.HostRef == "" {
		cfg.HostRef = srv.Cfg.HostRef
	}
	if cfg.DataDir != "" {
		if abs, err := filepath.Abs(cfg.DataDir); err == nil {
			cfg.DataDir = abs
		}
	}
	if cfg.PluginDirs == nil {
		if cfg.DataDir != "" {
			cfg.PluginDirs = append(cfg.PluginDirs, filepath.Join(cfg.DataDir, "storage-plugins"))
		}
		cfg.PluginDirs = append(cfg.PluginDirs, "/usr/libexec/toolstackd/storage")
	}
	preferred := cfg.RunDir
	if preferred == "" && cfg.DataDir != "" {
		preferred = filepath.Join(cfg.DataDir, "run")
	}
	run, err := runDir(preferred)
	if err != nil {
		return nil, fmt.Errorf("storage: run directory: %w", err)
	}
	s := &Service{srv: srv, db: srv.DB, cfg: cfg, log: cfg.Log, host: cfg.HostRef, run: run,
		bound: map[string]*boundSR{}, inflight: map[string]int{}, vdis: map[string]*vdiDPs{},
		hooks: map[string]LiveSwitch{}, locks: map[string]*keyLock{}, reserve: newReserve(cfg)}
	s.policy = &locationPolicy{protected: append([]string{cfg.DataDir, run}, cfg.PluginDirs...)}
	s.policy.protected = append(s.policy.protected, cfg.ProtectedDirs...)
	s.policy.homes = []string{s.localSRPath()}
	s.cleanLeftovers()
	s.drivers = discoverPlugins(cfg.PluginDirs, cfg.PluginTimeout, cfg.Log)
	for _, d := range s.drivers {
		if p, ok := d.(*pluginDriver); ok {
			p.policy = s.policy
		}
	}
	driversMu.RLock()
	for t, d := range drivers {
		s.drivers[t] = d
	}
	driversMu.RUnlock()
	s.drivers["file"] = &fileDriver{typ: "file", log: orDefault(cfg.Log), policy: s.policy}
	s.drivers["sharedfs"] = &fileDriver{typ: "sharedfs", shared: true, log: orDefault(cfg.Log), policy: s.policy}
	if err := s.syncSMRecords(); err != nil {
		return nil, fmt.Errorf("storage: SM records: %w", err)
	}
	s.registerHandlers()
	s.routes(router)
	ctx := context.Background()
	if cfg.FirstBoot {
		if err := s.firstBoot(ctx); err != nil {
			return nil, fmt.Errorf("storage: first boot: %w", err)
		}
	} else {
		s.restart(ctx)
	}
	return s, nil
}

// Close detaches every SR this service attached (tests; the daemon just
// exits, and its helper processes die with it).
func (s *Service) Close() {
	s.bg.Wait()
	s.mu.Lock()
	bound := s.bound
	s.bound = map[string]*boundSR{}
	s.mu.Unlock()
	for _, b := range bound {
		_ = b.sr.Detach(context.Background())
	}
}

// firstBoot makes the "Local storage" SR as a XenServer install does and
// makes it the pool's default, suspend-image and crash-dump SR.
func (s *Service) firstBoot(ctx context.Context) error {
	path := s.localSRPath()
	if path == "" {
		return errors.New("no data directory")
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	srRef, err := s.createSR(ctx, s.host, map[string]string{"location": path}, 0, "Local storage", "", "file", "user", false,
		map[string]string{}, map[string]string{"i18n-key": "local-storage", "i18n-original-value-name_label": "Local storage"})
	if err != nil {
		return err
	}
	_, err = s.db.Update(func(tx *db.Tx) error {
		for _, p := range tx.All(dm.Pool.Class) {
			for _, f := range []*schema.Field{dm.Pool.DefaultSR, dm.Pool.SuspendImageSR, dm.Pool.CrashDumpSR} {
				if err := tx.Set(f, p.Ref, srRef); err != nil {
					return err
				}
			}
		}
		if err := tx.Set(dm.Host.SuspendImageSR, s.host, srRef); err != nil {
			return err
		}
		return tx.Set(dm.Host.CrashDumpSR, s.host, srRef)
	})
	return err
}

// localSRPath is where the first-boot SR lives ("" if nowhere).
func (s *Service) localSRPath() string {
	if s.cfg.LocalSRPath != "" {
		return s.cfg.LocalSRPath
	}
	if s.cfg.DataDir == "" {
		return ""
	}
	return LocalSRDir(s.cfg.DataDir)
}

// LocalSRDir is where the first-boot SR of a host with data dir dataDir
// lives, unless Config.LocalSRPath says otherwise.
func LocalSRDir(dataDir string) string { return filepath.Join(dataDir, "storage", "local") }

// restart plugs again, after a daemon restart, the PBDs of this host that
// were plugged, and re-attaches the recorded datapaths.
func (s *Service) restart(ctx context.Context) {
	snap := s.db.Snapshot()
	for _, pbd := range snap.All(dm.PBD.Class) {
		if pbd.String(dm.PBD.Host) != s.host || !boolField(pbd, dm.PBD.CurrentlyAttached) {
			continue
		}
		if err := s.plugPBD(ctx, pbd.Ref); err != nil {
			s.log.Error("re-plugging PBD after restart", "pbd", pbd.UUID(), "err", err)
			if _, err := s.db.Update(func(tx *db.Tx) error { return tx.Set(dm.PBD.CurrentlyAttached, pbd.Ref, false) }); err != nil {
				s.log.Error("marking PBD unplugged", "pbd", pbd.UUID(), "err", err)
			}
		}
	}
	s.restoreDatapaths(ctx)
	// Start-up goes on; allowed_operations are recomputed for every SR
	// and its VDIs (a database from an older version may hold values
	// that are no longer published).
	if _, err := s.db.Update(func(tx *db.Tx) error {
		for _, sr := range tx.All(dm.SR.Class) {
			if err := s.refreshSRAll(tx, sr.Ref); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		s.log.Error("recomputing SRs' allowed operations", "err", err)
	}
}

// bind records an attached SR in the mux.
func (s *Service) bind(ref, uuid, typ string, d Driver, h SR) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bound[ref] = &boundSR{ref: ref, uuid: uuid, typ: typ, driver: d, sr: h}
}

func (s *Service) unbind(ref string) *boundSR {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bound[ref]
	delete(s.bound, ref)
	return b
}

func (s *Service) boundSR(ref string) *boundSR {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bound[ref]
}

// driver returns the driver of an SR type, or nil.
func (s *Service) driver(typ string) Driver { return s.drivers[typ] }

// driverTypes lists the SR types this host serves.
func (s *Service) driverTypes() []string {
	out := make([]string, 0, len(s.drivers))
	for t := range s.drivers {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// keyLock is a mutex per object (VDI or SR ref), reference counted.
type keyLock struct {
	mu sync.Mutex
	n  int
}

func (s *Service) lock(key string) func() {
	s.mu.Lock()
	l := s.locks[key]
	if l == nil {
		l = &keyLock{}
		s.locks[key] = l
	}
	l.n++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.n--; l.n == 0 {
			delete(s.locks, key)
		}
		s.mu.Unlock()
	}
}

// CollectGarbage runs an SR's garbage collection (coalescing the chains
// deleted snapshots left) now, for drivers that have one, and waits for
// it.
func (s *Service) CollectGarbage(ctx context.Context, srRef string) error {
	b, err := s.attached(srRef)
	if err != nil {
		return err
	}
	if c, ok := b.sr.(Collector); ok {
		return asBackend(c.Collect(ctx), smGeneral)
	}
	return nil
}
