// Package ha restarts protected VMs of hosts that die, and makes sure a
// VM never runs twice: the leases, fencing and restarts of docs/ha.md.
//
// Every host runs a Service once HA is enabled on the pool
// (pool.enable_ha):
//
//   - It renews its lease with the coordinator every Timing.Renew
//     (POST /pool/lease, intra-pool, with the pool secret); the
//     coordinator renews its own in memory.
//   - When its lease runs out it kills the domains of the protected VMs
//     running on it (xenops' Fence) without waiting for anyone.
//   - On the coordinator it keeps the ledger of renewals (lease.Ledger,
//     started afresh whenever this host becomes coordinator), declares
//     dead every host whose last renewal is older than
//     Timing.FenceAfter, commits that host's VMs as Halted and the host
//     not live, and restarts its protected VMs (ha_restart_priority
//     "restart", then "best-effort") elsewhere, in ha_restart_priority and
//     order, through VM.start and placement, retrying a failed start with
//     back-off.
//
// The API calls it serves: pool.enable_ha, pool.disable_ha,
// pool.set_ha_host_failures_to_tolerate and VM.set_ha_restart_priority
// (a VM with a disk on an SR that is not shared cannot be protected:
// HA_CONSTRAINT_VIOLATION_SR_NOT_SHARED [SR]).
package ha

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/mux"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/ha/lease"
	"toolstackd/internal/ha/planner"
	"toolstackd/internal/ha/watchdog"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// ClusterStack is what pool.ha_cluster_stack says HA runs on: the raft
// pool's leases, not xhad.
const ClusterStack = "toolstackd-raft"

// leasePath takes a host's renewal on the coordinator.
const leasePath = "/pool/lease"

// Pool is what HA needs of the pool layer.
type Pool interface {
	// Member reports whether this host is a member, not the coordinator.
	Member() bool
	// NotifyCoordinator sends v as JSON to path on the coordinator.
	NotifyCoordinator(ctx context.Context, path string, v any) error
	// PeerOnly serves h to hosts of the pool only.
	PeerOnly(h http.HandlerFunc) http.HandlerFunc
	// Voters counts raft's voting and non-voting members.
	Voters() (voters, nonVoters int)
}

// Fencer kills protected VMs' domains on this host and records VMs whose
// host died (xenops).
type Fencer interface {
	// Fence kills the domains on this host of the VMs protect names (by
	// uuid) and returns how many are left.
	Fence(ctx context.Context, protect func(uuid string) bool) int
	// SetHalted records in tx a VM that stopped with its host.
	SetHalted(tx *db.Tx, vm string) error
}

// Config is a Service's setting.
type Config struct {
	Server *api.Server
	Pool   Pool
	Fencer Fencer
	// HostRef and HostUUID are this host.
	HostRef, HostUUID string
	Timing            lease.Timing
	Log               *slog.Logger
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
	// Watchdog arms the host's watchdog when HA is enabled (nil: none).
	Watchdog func() (watchdog.Watchdog, error)
}

// Service is one host's HA.
type Service struct {
	cfg    Config
	log    *slog.Logger
	holder *lease.Holder

	mu           sync.Mutex
	ledger       *lease.Ledger   // while this host coordinates (under mu)
	declared     map[string]bool // hosts declared dead, until they renew (under mu)
	restarting   map[string]bool // VMs HA is starting now (under mu)
	preventUntil time.Time       // no restarts before this (pool.ha_prevent_restarts_for; under mu)
	emergencyOff bool            // host.emergency_ha_disable: HA off on this host (under mu)

	wd     watchdog.Watchdog // armed while HA is on (the loop's own)
	killed bool              // the lease is over and the last look found no protected VM here (the loop's own)

	// This host's renewals: granted, not granted, and the time the
	// granted ones took (Renewals).
	renewed, renewFailed, renewNanos atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup
}

// Renewals reports this host's lease renewals since it started: how many
// were granted, how many were not (refused, or unanswered within a
// renewal period), and the time the granted ones took in all.
func (s *Service) Renewals() (granted, failed int64, took time.Duration) {
	return s.renewed.Load(), s.renewFailed.Load(), time.Duration(s.renewNanos.Load())
}

// LeaseLeft is how long this host's lease still holds (0 when it holds
// none).
func (s *Service) LeaseLeft() time.Duration {
	return max(0, s.holder.Until().Sub(s.cfg.Now()))
}

// New makes a host's HA service; Start runs it.
func New(cfg Config) (*Service, error) {
	if cfg.Timing == (lease.Timing{}) {
		cfg.Timing = lease.Defaults()
	}
	if err := cfg.Timing.Check(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{cfg: cfg, log: cfg.Log.With("component", "ha"), holder: lease.NewHolder(cfg.Timing),
		declared: map[string]bool{}, restarting: map[string]bool{}, stop: make(chan struct{})}, nil
}

// Routes adds the lease endpoint.
func (s *Service) Routes(r *mux.Router) {
	r.HandleFunc(leasePath, s.cfg.Pool.PeerOnly(s.serveRenew)).Methods(http.MethodPost)
}

// Register installs the HA calls.
func (s *Service) Register(srv *api.Server) {
	api.Register(srv, s.enable)
	api.Register(srv, s.disable)
	api.Register(srv, s.setFailuresToTolerate)
	api.Register(srv, s.setRestartPriority)
	api.Register(srv, s.maxFailures)
	api.Register(srv, s.hypotheticalMaxFailures)
	api.Register(srv, s.planExists)
	api.Register(srv, s.failoverPlan)
	api.Register(srv, s.declareDeadCall)
	api.Register(srv, s.preventRestarts)
	api.Register(srv, s.emergencyDisable)
	s.guards(srv)
}

func (s *Service) off() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.emergencyOff
}

// prevented reports whether restarts are held back now.
func (s *Service) prevented() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Now().Before(s.preventUntil)
}

// declareDeadCall is host.declare_dead: an operator who knows a host is
// gone (powered off, reinstalled) has its VMs marked Halted at once and,
// with HA on, its protected VMs restarted elsewhere. The coordinator
// cannot declare itself dead.
func (s *Service) declareDeadCall(c *api.Call, a dm.HostDeclareDeadArgs) (dm.Void, error) {
	h, ok := c.Snapshot().Get(dm.Host.Class, string(a.Host))
	if !ok {
		return dm.Void{}, xerr.New(xerr.HandleInvalid, dm.Host.Class.Name, string(a.Host))
	}
	if h.Ref == s.cfg.HostRef {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "the coordinator cannot declare itself dead")
	}
	s.log.Warn("HA: a host was declared dead by an operator", "host", h.UUID())
	s.mu.Lock()
	s.declared[h.UUID()] = true
	s.mu.Unlock()
	return dm.Void{}, s.declareDead(h)
}

// preventRestarts is pool.ha_prevent_restarts_for: no VM is restarted by
// HA for that many seconds (0 ends it); hosts are still declared dead,
// and their VMs restarted once the time is up.
func (s *Service) preventRestarts(c *api.Call, a dm.PoolHAPreventRestartsForArgs) (dm.Void, error) {
	if a.Seconds < 0 {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "seconds", strconv.FormatInt(a.Seconds, 10))
	}
	s.mu.Lock()
	s.preventUntil = s.cfg.Now().Add(time.Duration(min(a.Seconds, 7*24*3600)) * time.Second)
	s.mu.Unlock()
	return dm.Void{}, nil
}

// emergencyDisable is host.emergency_ha_disable, answered by the host that
// receives it even without a coordinator: HA stops on this host (no
// renewals, no fencing, the watchdog disarmed) until the daemon restarts;
// unless soft, the pool's HA is also turned off if the database can be
// written.
func (s *Service) emergencyDisable(c *api.Call, a dm.HostEmergencyHADisableArgs) (dm.Void, error) {
	s.mu.Lock()
	s.emergencyOff = true
	s.mu.Unlock()
	s.log.Warn("HA: disabled on this host by host.emergency_ha_disable", "soft", a.Soft)
	if !a.Soft {
		if _, err := s.disable(c, dm.PoolDisableHAArgs{}); err != nil && !xerr.HasCode(err, xerr.HANotEnabled) {
			s.log.Warn("HA: could not turn the pool's HA off", "err", err)
		}
	}
	return dm.Void{}, nil
}

// Start runs the loops: renewing, watching the lease, and (on the
// coordinator) the ledger.
func (s *Service) Start() {
	s.wg.Add(1)
	go s.run()
}

// Close stops the loops. With HA on, the protected VMs here are killed
// first (the lease ends with the process), then the watchdog is disarmed.
func (s *Service) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.wg.Wait()
	s.stopping()
}

// enabled reports whether HA is on for the pool.
func enabled(snap db.Reader) (*db.Row, bool) {
	for _, p := range snap.All(dm.Pool.Class) {
		on, _ := p.Get(dm.Pool.HAEnabled).(bool)
		return p, on
	}
	return nil, false
}

// run is the service's one loop: a tick every 100 ms (the lease is
// watched at that grain), a renewal every Timing.Renew.
func (s *Service) run() {
	defer s.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastRenew, lastPlan time.Time
	renewing := make(chan struct{}, 1)
	renewing <- struct{}{}
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		now := s.cfg.Now()
		if _, on := enabled(s.cfg.Server.DB.Snapshot()); !on || s.off() {
			s.holder.Drop()
			s.setLedger(false, now)
			s.disarm()
			continue
		}
		s.arm()
		s.setLedger(!s.cfg.Pool.Member(), now)
		if now.Sub(lastRenew) >= s.cfg.Timing.Renew {
			select {
			case <-renewing:
				lastRenew = now
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					defer func() { renewing <- struct{}{} }()
					s.renew()
				}()
			default: // the last renewal is still out
			}
		}
		if phase := s.watchLease(now); s.wd != nil && phase != lease.Fenced {
			if err := s.wd.Pet(); err != nil {
				s.log.Error("HA: cannot pet the watchdog", "err", err)
			}
		}
		s.coordinate(now)
		if s.coordinating() && now.Sub(lastPlan) >= replanEvery {
			lastPlan = now
			s.replan(context.Background())
			s.restartStopped()
		}
	}
}

// replanEvery is how often the coordinator refreshes the failover plan.
const replanEvery = 2 * time.Second

func (s *Service) coordinating() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ledger != nil
}

// arm opens the watchdog if there is one and it is not armed yet.
func (s *Service) arm() {
	if s.wd != nil || s.cfg.Watchdog == nil {
		return
	}
	wd, err := s.cfg.Watchdog()
	if err != nil {
		s.log.Error("HA: cannot arm the watchdog", "err", err)
		return
	}
	s.log.Info("HA: the watchdog is armed", "timeout", s.cfg.Timing.Watchdog)
	s.wd = wd
}

// disarm stops the watchdog without a reset.
func (s *Service) disarm() {
	if s.wd == nil {
		return
	}
	if err := s.wd.Disarm(); err != nil {
		s.log.Error("HA: cannot disarm the watchdog", "err", err)
	}
	s.wd = nil
}

// stopping, when the daemon stops with HA on, kills the protected VMs
// here (their domains would outlive the daemon, and its lease with them)
// and then disarms the watchdog.
func (s *Service) stopping() {
	if _, on := enabled(s.cfg.Server.DB.Snapshot()); on {
		if left := s.fence(); left > 0 {
			s.log.Error("HA: stopping with protected VMs that could not be killed: the watchdog stays armed", "left", left)
			return
		}
	}
	s.disarm()
}

// setLedger starts a ledger when this host becomes coordinator and drops
// it when it stops.
func (s *Service) setLedger(coordinating bool, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case coordinating && s.ledger == nil:
		s.log.Info("HA: this host coordinates: no host is declared dead before the fence interval", "fence_after", s.cfg.Timing.FenceAfter())
		s.ledger = lease.NewLedger(s.cfg.Timing, now)
		s.declared = map[string]bool{}
	case !coordinating:
		s.ledger = nil
	}
}

// renewal is a host's request to renew its lease.
type renewal struct {
	Host string `json:"host"` // its uuid
}

// renew asks for this host's lease to be renewed.
func (s *Service) renew() {
	a := s.holder.Attempt(s.cfg.Now())
	if !s.cfg.Pool.Member() {
		s.mu.Lock()
		l := s.ledger
		s.mu.Unlock()
		if l != nil {
			s.recordRenewal(l, s.cfg.HostUUID, s.cfg.Now())
			s.renewed.Add(1) // the coordinator's own: no time on the wire
			s.holder.Granted(a)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timing.Renew)
	defer cancel()
	start := time.Now()
	if err := s.cfg.Pool.NotifyCoordinator(ctx, leasePath, renewal{Host: s.cfg.HostUUID}); err != nil {
		s.renewFailed.Add(1)
		s.log.Debug("HA: lease renewal failed", "err", err)
		return
	}
	s.renewNanos.Add(int64(time.Since(start)))
	s.renewed.Add(1)
	s.holder.Granted(a)
}

func (s *Service) recordRenewal(l *lease.Ledger, host string, now time.Time) {
	l.Renew(host, now)
	s.mu.Lock()
	delete(s.declared, host)
	s.mu.Unlock()
}

// serveRenew records a host's renewal on the coordinator; another host
// answers 409 (the renewal is not granted).
func (s *Service) serveRenew(w http.ResponseWriter, r *http.Request) {
	var req renewal
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.Host == "" {
		http.Error(w, "a renewal names its host", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	l := s.ledger
	s.mu.Unlock()
	if l == nil || s.cfg.Pool.Member() {
		http.Error(w, "this host does not coordinate the pool's HA", http.StatusConflict)
		return
	}
	if _, ok := s.cfg.Server.DB.Snapshot().ByUUID(dm.Host.Class, req.Host); !ok {
		http.Error(w, "no such host in the pool", http.StatusNotFound)
		return
	}
	s.recordRenewal(l, req.Host, s.cfg.Now())
	w.WriteHeader(http.StatusOK)
}

// watchLease kills this host's protected VMs once its lease has run out
// (docs/ha.md, rule 3) and returns the lease's phase. While the lease is
// over it looks at every tick: a protected VM may have started between
// the last look and a lease granted and lost unseen (a host stopped just
// after a renewal), and it must not outlive the lease either.
func (s *Service) watchLease(now time.Time) lease.Phase {
	until := s.holder.Until()
	if now.Before(until) {
		s.killed = false
		return lease.Held
	}
	killed := s.fence() == 0
	if killed && !s.killed {
		s.log.Info("HA: no lease: no protected VM runs here")
	}
	s.killed = killed
	return s.cfg.Timing.PhaseAt(until, now, killed)
}

// fence kills the protected VMs' domains on this host and returns how
// many are left.
func (s *Service) fence() int {
	snap := s.cfg.Server.DB.Snapshot()
	return s.cfg.Fencer.Fence(context.Background(), func(uuid string) bool {
		vm, ok := snap.ByUUID(dm.VM.Class, uuid)
		return !ok || protected(vm) // a domain of a VM the records lost is killed too
	})
}

// protected reports whether HA restarts a VM elsewhere.
func protected(vm *db.Row) bool {
	return planner.Priority(vm.String(dm.VM.HARestartPriority)).Protected()
}

// coordinate, on the coordinator, declares dead the hosts whose leases
// are certainly over and restarts their protected VMs.
func (s *Service) coordinate(now time.Time) {
	s.mu.Lock()
	l := s.ledger
	s.mu.Unlock()
	if l == nil {
		return
	}
	snap := s.cfg.Server.DB.Snapshot()
	var hosts []string
	for _, h := range snap.All(dm.Host.Class) {
		if h.Ref != s.cfg.HostRef {
			hosts = append(hosts, h.UUID())
		}
	}
	for _, uuid := range l.DeadAmong(hosts, now) {
		s.mu.Lock()
		done := s.declared[uuid]
		s.declared[uuid] = true
		s.mu.Unlock()
		if done {
			continue
		}
		h, ok := snap.ByUUID(dm.Host.Class, uuid)
		if !ok {
			continue
		}
		_ = s.declareDead(h) // logged; tried again when the host renews and dies again
	}
}

// declareDead commits a dead host's VMs as Halted and the host as not
// live, then restarts its protected VMs elsewhere.
func (s *Service) declareDead(host *db.Row) error {
	var restart []*db.Row
	_, err := s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		h, ok := tx.Get(dm.Host.Class, host.Ref)
		if !ok {
			return nil
		}
		if m, ok := tx.Get(dm.HostMetrics.Class, h.String(dm.Host.Metrics)); ok {
			if err := tx.Set(dm.HostMetrics.Live, m.Ref, false); err != nil {
				return err
			}
		}
		refs, _ := tx.Value(h, dm.Host.ResidentVMs).([]string)
		for _, ref := range slices.Clone(refs) {
			vm, ok := tx.Get(dm.VM.Class, ref)
			if !ok || vm.Get(dm.VM.IsControlDomain) == true {
				continue
			}
			// Operations it had in flight died with the host.
			if err := tx.Set(dm.VM.CurrentOperations, ref, map[string]string{}); err != nil {
				return err
			}
			if err := s.cfg.Fencer.SetHalted(tx, ref); err != nil {
				return err
			}
			if protected(vm) {
				restart = append(restart, vm)
			}
		}
		return nil
	})
	if err != nil {
		s.log.Error("HA: cannot declare a host dead", "host", host.UUID(), "err", err)
		s.mu.Lock()
		delete(s.declared, host.UUID())
		s.mu.Unlock()
		return err
	}
	if _, on := enabled(s.cfg.Server.DB.Snapshot()); !on || s.prevented() {
		s.log.Warn("HA: declared a host dead; its VMs are Halted, none restarted now", "host", host.UUID())
		return nil
	}
	s.log.Warn("HA: declared a host dead", "host", host.UUID(), "restarting", len(restart))
	sortForRestart(restart)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.restart(restart)
	}()
	return nil
}

// sortForRestart orders VMs as HA restarts them: "restart" before
// "best-effort", then by order (lower first), then by name for a stable
// order.
func sortForRestart(vms []*db.Row) {
	rank := func(vm *db.Row) int {
		if vm.String(dm.VM.HARestartPriority) == "restart" {
			return 0
		}
		return 1
	}
	sort.SliceStable(vms, func(i, j int) bool {
		a, b := vms[i], vms[j]
		if rank(a) != rank(b) {
			return rank(a) < rank(b)
		}
		oa, _ := a.Get(dm.VM.Order).(int64)
		ob, _ := b.Get(dm.VM.Order).(int64)
		if oa != ob {
			return oa < ob
		}
		return a.String(dm.VM.NameLabel) < b.String(dm.VM.NameLabel)
	})
}

// restartStopped, on the coordinator, restarts the protected VMs that
// should run (ha_always_run) but are Halted: those a host killed when its
// lease ran out without the host being declared dead, and those that
// stopped on their own.
func (s *Service) restartStopped() {
	if s.prevented() {
		return
	}
	snap := s.cfg.Server.DB.Snapshot()
	var stopped []*db.Row
	s.mu.Lock()
	for _, vm := range snap.All(dm.VM.Class) {
		if !protected(vm) || vm.Get(dm.VM.HAAlwaysRun) != true || vm.Get(dm.VM.IsATemplate) == true ||
			vm.String(dm.VM.PowerState) != string(dm.VMPowerStateHalted) || s.restarting[vm.Ref] {
			continue
		}
		if ops, _ := vm.Get(dm.VM.CurrentOperations).(map[string]string); len(ops) > 0 {
			continue
		}
		stopped = append(stopped, vm)
	}
	s.mu.Unlock()
	if len(stopped) == 0 {
		return
	}
	s.log.Warn("HA: protected VMs that should run are Halted: restarting them", "vms", len(stopped))
	sortForRestart(stopped)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.restart(stopped)
	}()
}

// restartTries bounds the starts tried for one VM.
const restartTries = 5

// restart starts VMs one after the other, each through VM.start and
// placement, waiting its start_delay after it, retrying a failed start
// with back-off.
func (s *Service) restart(vms []*db.Row) {
	if len(vms) == 0 {
		return
	}
	caller, end, err := s.cfg.Server.InternalCaller(originator)
	if err != nil {
		s.log.Error("HA: cannot restart VMs", "err", err)
		return
	}
	defer end()
	s.mu.Lock()
	for _, vm := range vms {
		s.restarting[vm.Ref] = true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, vm := range vms {
			delete(s.restarting, vm.Ref)
		}
		s.mu.Unlock()
	}()
	for _, vm := range vms {
		backoff := time.Second
		for try := 1; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			_, err := caller.InvokeArgs(ctx, "VM.start", []any{vm.Ref, false, false})
			cancel()
			if err == nil {
				s.log.Info("HA: restarted a protected VM", "vm", vm.UUID(), "try", try)
				break
			}
			if xerr.HasCode(err, xerr.HandleInvalid) || xerr.HasCode(err, xerr.VMBadPowerState) || try == restartTries {
				s.log.Error("HA: could not restart a protected VM", "vm", vm.UUID(), "try", try, "err", err)
				break
			}
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff *= 2
		}
		if d, _ := vm.Get(dm.VM.StartDelay).(int64); d > 0 {
			select {
			case <-s.stop:
				return
			case <-time.After(time.Duration(min(d, 3600)) * time.Second):
			}
		}
	}
}

// enable is pool.enable_ha.
func (s *Service) enable(c *api.Call, a dm.PoolEnableHAArgs) (dm.Void, error) {
	for _, sr := range a.HeartbeatSRs {
		if _, ok := c.Snapshot().Get(dm.SR.Class, string(sr)); !ok {
			return dm.Void{}, xerr.New(xerr.HandleInvalid, dm.SR.Class.Name, string(sr))
		}
	}
	_, err := s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		p, on := enabled(tx)
		switch {
		case p == nil:
			return xerr.New(xerr.InternalError, "no pool record")
		case on:
			return xerr.New(xerr.HAIsEnabled)
		}
		conf := a.Configuration
		if conf == nil {
			conf = map[string]string{}
		}
		for f, v := range map[*schema.Field]any{dm.Pool.HAEnabled: true, dm.Pool.HAClusterStack: ClusterStack,
			dm.Pool.HAConfiguration: conf, dm.Pool.HAStatefiles: []string{}} {
			if err := tx.Set(f, p.Ref, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return dm.Void{}, err
	}
	// Armed: every live host holds a lease before the call returns, as
	// xapi's enable arms every host; otherwise HA goes off again.
	if err := s.waitArmed(c.Ctx); err != nil {
		if _, derr := s.disable(c, dm.PoolDisableHAArgs{}); derr != nil {
			s.log.Error("HA: cannot turn HA off after a failed enable", "err", derr)
		}
		return dm.Void{}, err
	}
	return dm.Void{}, nil
}

// waitArmed waits until every live host has renewed its lease with this
// host's ledger: HA_FAILED_TO_FORM_LIVESET after two leases without.
func (s *Service) waitArmed(ctx context.Context) error {
	deadline := time.Now().Add(2 * s.cfg.Timing.Lease)
	for {
		s.mu.Lock()
		l := s.ledger
		s.mu.Unlock()
		missing := ""
		snap := s.cfg.Server.DB.Snapshot()
		for _, h := range snap.All(dm.Host.Class) {
			if live, known := forwarding.MetricsLive(snap, h); known && !live {
				continue // not live: nothing runs there to protect
			}
			if l == nil || !l.Renewed(h.UUID()) {
				missing = h.UUID()
				break
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			s.log.Warn("HA: a live host did not take a lease: HA stays off", "host", missing)
			return xerr.New(xerr.HAFailedToFormLiveset)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// disable is pool.disable_ha.
func (s *Service) disable(c *api.Call, _ dm.PoolDisableHAArgs) (dm.Void, error) {
	_, err := s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		p, on := enabled(tx)
		if p == nil || !on {
			return xerr.New(xerr.HANotEnabled)
		}
		for f, v := range map[*schema.Field]any{dm.Pool.HAEnabled: false, dm.Pool.HAConfiguration: map[string]string{},
			dm.Pool.HAStatefiles: []string{}} {
			if err := tx.Set(f, p.Ref, v); err != nil {
				return err
			}
		}
		return nil
	})
	return dm.Void{}, err
}

// setFailuresToTolerate is pool.set_ha_host_failures_to_tolerate.
func (s *Service) setFailuresToTolerate(c *api.Call, a dm.PoolSetHAHostFailuresToTolerateArgs) (dm.Void, error) {
	if a.Value < 0 {
		return dm.Void{}, xerr.New(xerr.InvalidValue, "value", "negative")
	}
	n := int(min(a.Value, 1<<20))
	if _, on := enabled(c.Snapshot()); on && n > s.quorumLimit() {
		// More failures than the raft pool itself survives.
		return dm.Void{}, xerr.New(xerr.HAOperationWouldBreakFailoverPlan)
	}
	if err := s.checkPlan(c.Ctx, c.Snapshot(), planner.Change{Failures: &n}); err != nil {
		return dm.Void{}, err
	}
	_, err := s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Pool.Class, string(a.Self)); !ok {
			return xerr.New(xerr.HandleInvalid, dm.Pool.Class.Name, string(a.Self))
		}
		return tx.Set(dm.Pool.HAHostFailuresToTolerate, string(a.Self), a.Value)
	})
	return dm.Void{}, err
}

// setRestartPriority is VM.set_ha_restart_priority: "", "restart" or
// "best-effort"; a VM to be restarted elsewhere must have its disks on
// shared SRs.
func (s *Service) setRestartPriority(c *api.Call, a dm.VMSetHARestartPriorityArgs) (dm.Void, error) {
	switch a.Value {
	case "", "restart", "best-effort":
	default:
		return dm.Void{}, xerr.New(xerr.InvalidValue, "ha_restart_priority", a.Value)
	}
	// A VM newly protected must leave a plan for the failures tolerated
	// (checked on a snapshot: planning is too slow to hold a write).
	snap := c.Snapshot()
	if vm, ok := snap.Get(dm.VM.Class, string(a.Self)); ok && a.Value != "" && !protected(vm) {
		pv := planner.VM{ID: vm.Ref, Priority: planner.Priority(a.Value)}
		pv.Memory, _ = vm.Get(dm.VM.MemoryStaticMax).(int64)
		if ps := vm.String(dm.VM.PowerState); ps == string(dm.VMPowerStateRunning) || ps == string(dm.VMPowerStatePaused) {
			pv.Host = vm.String(dm.VM.ResidentOn)
		}
		if err := s.checkPlan(c.Ctx, snap, planner.Change{SetVMs: []planner.VM{pv}}); err != nil {
			return dm.Void{}, err
		}
	}
	_, err := s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		vm, ok := tx.Get(dm.VM.Class, string(a.Self))
		if !ok {
			return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, string(a.Self))
		}
		if a.Value != "" {
			if sr := localSR(tx, vm); sr != "" {
				return xerr.New(xerr.HAConstraintViolationSRNotShared, sr)
			}
		}
		return tx.Set(dm.VM.HARestartPriority, vm.Ref, a.Value)
	})
	return dm.Void{}, err
}

// localSR is an SR holding one of vm's disks that is not shared, or "".
func localSR(r db.Reader, vm *db.Row) string {
	vbds, _ := r.Value(vm, dm.VM.VBDs).([]string)
	for _, ref := range vbds {
		vbd, ok := r.Get(dm.VBD.Class, ref)
		if !ok {
			continue
		}
		vdi, ok := r.Get(dm.VDI.Class, vbd.String(dm.VBD.VDI))
		if !ok {
			continue
		}
		sr, ok := r.Get(dm.SR.Class, vdi.String(dm.VDI.SR))
		if ok && sr.Get(dm.SR.Shared) != true {
			return sr.Ref
		}
	}
	return ""
}
