package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	"toolstackd/internal/certs"
	"toolstackd/internal/cli"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/db/persist"
	"toolstackd/internal/ha"
	"toolstackd/internal/ha/lease"
	"toolstackd/internal/ha/watchdog"
	"toolstackd/internal/metrics"
	"toolstackd/internal/network"
	"toolstackd/internal/pool"
	"toolstackd/internal/pool/dbraft"
	"toolstackd/internal/rrdd"
	"toolstackd/internal/storage"
	"toolstackd/internal/sysstatus"
	"toolstackd/internal/xenops"
	"toolstackd/internal/xva"
)

// host is this toolstackd as a XenAPI host, without its listeners: the
// database and its file, the API server, the modules registered on it and
// the router that serves them all. Building one does not listen; serving
// it is listen's job, so that the host can be replaced in place (a pool
// join) while the same listeners keep serving.
type host struct {
	log    *slog.Logger
	store  *persist.Store
	repl   *dbraft.Replicator
	pool   *pool.Pool
	db     *db.DB
	srv    *api.Server
	xm     *xenops.Manager
	rrdd   *rrdd.Service
	net    *network.Manager
	router *mux.Router
	// metrics is /metrics' registry (serveMetrics); HA adds its own
	// once it is up.
	metrics *metrics.Registry
	// closers run when the host closes, last added first.
	closers  []func() error
	stopOnce sync.Once
}

// openHost opens (or, on first boot, initialises) the database in the data
// dir and brings the API server and every module up on a new router.
func openHost(o options, log *slog.Logger) (_ *host, err error) {
	h := &host{log: log}
	defer func() {
		if err != nil {
			_ = h.close() // the error that stopped the start is the one to report
		}
	}()
	cfg := api.DefaultConfig()
	first, err := h.openDatabase(o, &cfg)
	if err != nil {
		return nil, err
	}
	h.srv = api.New(h.db, cfg, log)
	h.srv.OnRestore = func(host *db.Row) {
		if err := writeInventory(o.dataDir, host.UUID()); err != nil {
			log.Error("inventory after restore", "err", err)
		}
		log.Info("database restored; this host is now", "host", host.UUID())
	}
	h.srv.Start()
	if err := h.registerModules(o, cfg.HostRef, first); err != nil {
		return nil, err
	}
	if err := h.openPool(o); err != nil {
		return nil, err
	}
	if err := h.openHA(o); err != nil {
		return nil, err
	}
	return h, nil
}

// openHA brings up HA: its calls, the lease endpoint and its loops, idle
// until pool.enable_ha.
func (h *host) openHA(o options) error {
	row, _ := h.db.Snapshot().Get(dm.Host.Class, h.srv.Cfg.HostRef)
	timing, err := lease.ParseTiming(o.haTiming)
	if err != nil {
		return fmt.Errorf("--ha-timing: %w", err)
	}
	cfg := ha.Config{Server: h.srv, Pool: h.pool, Fencer: h.xm, HostRef: h.srv.Cfg.HostRef, HostUUID: row.UUID(),
		Timing: timing, Log: h.log}
	if o.watchdog != "" {
		var args []string
		if o.journal != "" {
			args = []string{"--journal", o.journal, "--host", h.srv.Cfg.HostRef}
		}
		cfg.Watchdog = func() (watchdog.Watchdog, error) { return watchdog.Open(o.watchdog, timing.Watchdog, args...) }
	}
	svc, err := ha.New(cfg)
	if err != nil {
		return err
	}
	svc.Routes(h.router)
	svc.Register(h.srv)
	if reg := h.metrics; reg != nil {
		reg.Counter("ha_lease_renewals_total", "This host's HA lease renewals granted.",
			func() float64 { ok, _, _ := svc.Renewals(); return float64(ok) })
		reg.Counter("ha_lease_renewal_failures_total", "This host's HA lease renewals not granted (refused, or no answer in a renewal period).",
			func() float64 { _, failed, _ := svc.Renewals(); return float64(failed) })
		reg.Counter("ha_lease_renewal_seconds_total", "The time this host's granted renewals took, in all (over ha_lease_renewals_total: the mean).",
			func() float64 { _, _, took := svc.Renewals(); return took.Seconds() })
		reg.Gauge("ha_lease_remaining_seconds", "How long this host's HA lease still holds (0: none held).",
			func() float64 { return svc.LeaseLeft().Seconds() })
	}
	svc.Start()
	h.closers = append(h.closers, func() error { svc.Close(); return nil })
	return nil
}

// openPool brings up the pool layer: the intra-pool endpoints, pool.join
// and its siblings, and raft if this host is in a pool.
func (h *host) openPool(o options) error {
	row, _ := h.db.Snapshot().Get(dm.Host.Class, h.srv.Cfg.HostRef)
	tlsCfg, err := o.poolTLS()
	if err != nil {
		return err
	}
	cfg := pool.Config{DataDir: o.dataDir, Advertise: o.advertiseAddr(), Port: o.port(), LocalIP: o.localIP(),
		TLS: tlsCfg, HostUUID: row.UUID(), Server: h.srv, Repl: h.repl, Log: h.log, Eject: o.onEject, Dial: o.poolDial()}
	if tlsCfg != nil && o.certStore != nil {
		cfg.OwnCert = o.certStore.PoolCertificate
	}
	p, err := pool.Open(cfg)
	if err != nil {
		return err
	}
	h.pool = p
	h.closers = append(h.closers, p.Close)
	p.Routes(h.router)
	p.Register(h.srv)
	h.wireMigration(p)
	return nil
}

// openDatabase loads the database file, or makes a new single-host pool
// on first boot, attaches the redo log if one is asked for, and sets
// cfg.HostRef. It reports whether this was the first boot.
func (h *host) openDatabase(o options, cfg *api.Config) (first bool, err error) {
	log := h.log
	// The replicator sits between the database and its file: it passes
	// batches straight through until the host is in a pool.
	h.repl = dbraft.New(dbraft.Options{Model: dm.Model, Log: log,
		Forward:   func(ctx context.Context, entry []byte) (uint64, error) { return h.pool.SendDelta(ctx, entry) },
		OnLeader:  func() { h.pool.OnLeader() },
		OnDeposed: func() { h.srv.Deposed() },
	})
	h.store, err = h.repl.OpenStore(filepath.Join(o.dataDir, "toolstackd.db"), persist.Options{Log: log})
	if err != nil {
		return false, err
	}
	h.closers = append(h.closers, h.store.Close)
	first = h.store.Empty()
	h.db = db.New(dm.Model, db.Options{Persister: h.repl})
	if err := h.store.Load(h.db); err != nil {
		return false, err
	}
	h.repl.Attach(h.db)
	h.closers = append(h.closers, h.repl.Close)
	facts := o.hostFacts()
	if first {
		cfg.HostRef, err = firstBoot(h.db, o.dataDir, cfg.PasswordIterations, facts, log)
		if err == nil && o.witness {
			err = makeWitness(h.db, cfg.HostRef)
		}
	} else {
		cfg.HostRef, err = loadHost(h.db, o.dataDir, facts, pool.HasState(o.dataDir), log)
	}
	if err != nil {
		return false, err
	}
	if o.redoLog != "" {
		rl, err := persist.AttachRedoLog(h.store, h.db, o.redoLog, log)
		if err != nil {
			return false, fmt.Errorf("redo log: %w", err)
		}
		h.closers = append(h.closers, rl.Close)
		log.Info("mirroring the database into a redo log", "path", o.redoLog)
	}
	return first, nil
}

// firstBoot makes a new single-host pool with the root account and
// writes the inventory that names this host.
func firstBoot(d *db.DB, dataDir string, iterations int, facts api.HostFacts, log *slog.Logger) (string, error) {
	hash, kept, err := rootHash(dataDir, iterations, log)
	if err != nil {
		return "", err
	}
	ref, err := api.FirstBoot(d, facts, api.BootOptions{RootPasswordHash: hash})
	if err != nil {
		return "", fmt.Errorf("first boot: %w", err)
	}
	if kept {
		_ = os.Remove(filepath.Join(dataDir, rootHashFile)) // used: the database holds it now
	}
	host, _ := d.Snapshot().Get(dm.Host.Class, ref)
	if err := writeInventory(dataDir, host.UUID()); err != nil {
		return "", err
	}
	log.Info("initialised a new pool", "host", host.UUID())
	return ref, nil
}

// makeWitness makes this host a witness: disabled, so that placement
// never puts a VM on it, and marked as such for operators. It joins a pool
// as any host does and votes in raft.
func makeWitness(d *db.DB, hostRef string) error {
	_, err := d.Update(func(tx *db.Tx) error {
		if err := tx.Set(dm.Host.Enabled, hostRef, false); err != nil {
			return err
		}
		return tx.AddToMap(dm.Host.OtherConfig, hostRef, "witness", "true")
	})
	return err
}

// rootHashFile holds root's password hash across a pool.eject: the host
// starts afresh as a pool of its own and keeps the pool's root password.
const rootHashFile = "root-password-hash"

// rootHash is root's password hash for a first boot: the one kept by an
// eject (kept is then true), or that of rootPassword.
func rootHash(dataDir string, iterations int, log *slog.Logger) (hash string, kept bool, err error) {
	if b, err := os.ReadFile(filepath.Join(dataDir, rootHashFile)); err == nil { //nolint:gosec // the operator's data dir and a fixed name
		return strings.TrimSpace(string(b)), true, nil
	}
	pw, err := rootPassword(dataDir, log)
	if err != nil {
		return "", false, err
	}
	hash, err = api.HashPassword(pw, iterations)
	return hash, false, err
}

// loadHost finds this host's row (named by the inventory) in a loaded
// database and resets what a restart makes stale. A pool member leaves
// its replica alone: the pool's database changes through the coordinator
// only, once raft runs.
func loadHost(d *db.DB, dataDir string, facts api.HostFacts, member bool, log *slog.Logger) (string, error) {
	id, err := readInventory(dataDir)
	if err != nil {
		return "", err
	}
	host, ok := d.Snapshot().ByUUID(dm.Host.Class, id)
	if !ok {
		return "", fmt.Errorf("this host (%s in %s) is not in the database", id, filepath.Join(dataDir, "inventory"))
	}
	if !member {
		if err := api.StartupReset(d, host.Ref, facts); err != nil {
			return "", err
		}
	}
	log.Info("loaded database", "generation", d.Generation(), "host", id)
	return host.Ref, nil
}

// registerModules puts the RPC endpoints, storage, xenops and the xe CLI
// server on a new router.
func (h *host) registerModules(o options, hostRef string, first bool) error {
	h.router = mux.NewRouter()
	h.srv.Routes(h.router)
	// Storage: SR drivers, the SR/PBD/VDI/SM calls, /import_raw_vdi and
	// /export_raw_vdi.
	var protected []string
	if o.redoLog != "" {
		// A file SR must not be made where the redo log lives.
		protected = append(protected, filepath.Dir(o.redoLog))
	}
	stor, err := storage.Register(h.srv, h.router, storage.Config{DataDir: o.dataDir, HostRef: hostRef, FirstBoot: first, Log: h.log,
		ProtectedDirs: protected, RunDir: o.runDir, PluginDirs: o.storagePluginDirs()})
	if err != nil {
		return err
	}
	// The storage service is not closed at exit: detaching its SRs would
	// pull the disks from under running VMs.
	// Networking: bridges, PIFs, VLANs, bonds, tunnels (--network-backend).
	if err := h.openNetwork(o, hostRef); err != nil {
		return err
	}
	// xenops: VM lifecycle, hotplug and /console, with disks from the
	// storage layer's datapaths.
	disks := &storageDisks{s: stor}
	h.xm, err = xenops.Register(h.srv, h.router, xenops.Config{Backend: o.backend, DataDir: o.dataDir, HostRef: hostRef, Log: h.log,
		ListenAddr: o.listen, Disks: disks, HostMemory: int64(o.hostMemory), Journal: o.journal,
		QEMU: h.withTaps(o, qemuConfig(o)), HooksDir: o.hooksDir, Networks: h.networks(), ClientTLS: o.clientTLS})
	if err != nil {
		return fmt.Errorf("xenops: %w", err)
	}
	disks.vm.Store(h.xm)
	// XVA: /export, /export_metadata, /import and VM.import.
	xva.Register(h.srv, h.router, stor, xva.Config{HostRef: hostRef, Log: h.log})
	// Bug reports: GET /system-status, host.get_system_status_capabilities,
	// host.bugreport_upload.
	sysstatus.Register(h.srv, h.router, sysstatus.Config{DataDir: o.dataDir, ConfigFile: o.config, HostRef: hostRef,
		Log: h.log, Settings: o.settings})
	// The xe CLI: POST /cli, the thin-CLI protocol.
	cli.New(h.srv, cli.Options{Log: h.log, ClientTLS: o.clientTLS}).Routes(h.router)
	// Server certificates and the pool's CA certificates.
	certs.Register(h.srv, certs.Config{Store: o.certStore, HostRef: hostRef, Log: h.log})
	// rrdd: data sources, round-robin archives, /rrd_updates.
	if err := h.openRRDD(o, hostRef); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	h.serveMetrics(o)
	return nil
}

// networks is the network module for the VM lifecycle, or nil.
func (h *host) networks() xenops.Networks {
	if h.net == nil {
		return nil
	}
	return h.net
}

// stopCalls ends long polls (event.from, event.next) and stops xenops'
// watching (the VMs keep running), so that the listeners can shut down
// without waiting for them. It may be called more than once.
func (h *host) stopCalls() {
	h.stopOnce.Do(func() {
		if h.srv != nil {
			h.srv.Close()
		}
		if h.xm != nil {
			h.xm.Close()
		}
	})
}

// close stops the calls and releases everything the host opened, last
// opened first, and returns the first error (the database file's,
// normally).
func (h *host) close() error {
	h.stopCalls()
	var first error
	for i := len(h.closers) - 1; i >= 0; i-- {
		if err := h.closers[i](); err != nil && first == nil {
			first = err
		}
	}
	h.closers = nil
	return first
}
