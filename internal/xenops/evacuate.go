package xenops

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/ha/planner"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Host evacuation (host.evacuate, host.assert_can_evacuate,
// host.get_vms_which_prevent_evacuation). The route table sends all
// three to the pool coordinator, which plans from its database (see
// evacplan.go for the rules) and moves each VM with VM.pool_migrate
// through the call pipeline as the caller's session: the same roles,
// guards (HA's overcommit check among them), operation marks and
// forwarding to the VM's host as a client's own call would get.
//
// host.evacuate:
//
//   - refuses at once, with the first VM's error in ref order, when the
//     plan leaves any VM without a destination (as xapi does, nothing
//     moves then);
//   - with network given, checks that every destination has a plugged
//     PIF with an address on it (PIF_NOT_PRESENT, REQUIRED_PIF_IS_UNPLUGGED,
//     INTERFACE_HAS_NO_IP) and passes it to each migration;
//   - runs evacuate_batch_size migrations at a time (xapi's default of
//     10 when it is 0 or less; at most evacMaxBatch), starting the next
//     as one finishes, and sets the task's progress to the share
//     done, a move in flight counting for the part of it done (its
//     VM.pool_migrate's progress, also from the VM's host:
//     evacprogress.go);
//   - on a migration's failure starts no more, lets those in flight
//     finish and fails with that error; a VM halted meanwhile
//     (VM_BAD_POWER_STATE) is not a failure;
//   - on cancellation starts no more; the migrations in flight see the
//     cancellation through their context and finish or roll back as
//     VM.pool_migrate allows; once none of them is still marked
//     pool_migrate (at most evacSettleTimeout) the call fails with
//     TASK_CANCELLED. Every VM is then running on exactly one host,
//     moved or not;
//   - at the end checks that no VM is left resident (INTERNAL_ERROR).
//
// HA's plan: with HA on, host.evacuate is checked by HA's guard as
// host.disable is (HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN when the pool
// without this host would have no failover plan), and the plan requires
// every VM on the host to be protected (rule 2 of evacplan.go).
//
// Halted and suspended VMs have no resident host and stay where they are.

const (
	// evacDefaultBatch is xapi's evacuation_batch_size.
	evacDefaultBatch = 10
	// evacMaxBatch bounds the migrations one evacuation runs at once,
	// whatever the client asks.
	evacMaxBatch = 64
)

func (m *Manager) registerEvacuation() {
	api.Register(m.srv, func(c *api.Call, a dm.HostGetVMsWhichPreventEvacuationArgs) (any, error) {
		p, err := m.evacuationPlan(c, string(a.Self))
		if err != nil {
			return nil, err
		}
		out := map[string][]string{}
		for vm, e := range p.Errs {
			out[vm] = append([]string{e.Code}, e.Params...)
		}
		return out, nil
	})
	api.Register(m.srv, func(c *api.Call, a dm.HostAssertCanEvacuateArgs) (dm.Void, error) {
		p, err := m.evacuationPlan(c, string(a.Host))
		if err != nil {
			return dm.Void{}, err
		}
		if e := p.cannotEvacuate(); e != nil {
			return dm.Void{}, e
		}
		return dm.Void{}, nil
	})
	api.Register(m.srv, m.hostEvacuate)
}

// evacuationPlan reads the pool and plans the evacuation of host.
func (m *Manager) evacuationPlan(c *api.Call, host string) (evacPlan, error) {
	if _, err := c.Lookup(dm.Host.Class, host); err != nil {
		return evacPlan{}, err
	}
	targets, vms := evacuationInput(c.Snapshot(), host, m.host)
	return planEvacuation(targets, vms), nil
}

// evacuationInput is what the planner needs, read from snap: the enabled
// hosts other than host (in ref order) with their free memory, and the
// VMs resident on host with what stops them. self is the host reading
// (always live).
func evacuationInput(snap db.Reader, host, self string) ([]evacHost, []evacVM) {
	var hosts []*db.Row
	var targets []evacHost
	snap.Ascend(dm.Host.Class, func(h *db.Row) bool {
		if on, _ := h.Get(dm.Host.Enabled).(bool); on && h.Ref != host {
			hosts = append(hosts, h)
			eh := evacHost{Ref: h.Ref}
			if mt, ok := snap.Get(dm.HostMetrics.Class, h.String(dm.Host.Metrics)); ok {
				eh.Free, _ = mt.Get(dm.HostMetrics.MemoryFree).(int64)
			}
			targets = append(targets, eh)
		}
		return true
	})
	haOn := false
	snap.Ascend(dm.Pool.Class, func(p *db.Row) bool {
		haOn, _ = p.Get(dm.Pool.HAEnabled).(bool)
		return false
	})
	var vms []evacVM
	for _, row := range evacResidentVMs(snap, host) {
		vm := evacVM{Ref: row.Ref, Affinity: row.String(dm.VM.Affinity)}
		vm.Memory, _ = row.Get(dm.VM.MemoryStaticMax).(int64)
		vm.Unprotected = haOn && !planner.Priority(row.String(dm.VM.HARestartPriority)).Protected()
		for _, h := range hosts {
			if e := evacCannotRun(snap, row, h, self); e != nil {
				vm.Cannot = e
				break
			}
		}
		vm.OpErr = evacOpError(snap, row)
		vms = append(vms, vm)
	}
	return targets, vms
}

// evacResidentVMs are the guests whose domains run on host: resident there,
// running or paused, not control domains.
func evacResidentVMs(snap db.Reader, host string) []*db.Row {
	h, ok := snap.Get(dm.Host.Class, host)
	if !ok {
		return nil
	}
	refs := slices.Clone(strs(snap.Value(h, dm.Host.ResidentVMs)))
	slices.Sort(refs)
	var out []*db.Row
	for _, ref := range refs {
		row, ok := snap.Get(dm.VM.Class, ref)
		if !ok || row.Get(dm.VM.IsControlDomain) == true {
			continue
		}
		if ps := row.String(dm.VM.PowerState); ps != psRunning && ps != psPaused {
			continue
		}
		out = append(out, row)
	}
	return out
}

// evacCannotRun is why vm cannot run on host, memory aside (xapi's
// assert_can_boot_here without the memory check, for what the database
// knows): the host live, the VM's SRs plugged there, its networks
// reachable from it.
func evacCannotRun(snap db.Reader, vm, host *db.Row, self string) *xerr.Error {
	if host.Ref != self {
		if live, known := forwarding.MetricsLive(snap, host); !live || !known {
			return xerr.New(xerr.HostNotLive)
		}
	}
	return whyNotOn(snap, vm, host.Ref)
}

// evacHostPIF is the first of pifs on host, or nil.
func evacHostPIF(snap db.Reader, pifs []string, host string) *db.Row {
	for _, ref := range pifs {
		if pif, ok := snap.Get(dm.PIF.Class, ref); ok && pif.String(dm.PIF.Host) == host {
			return pif
		}
	}
	return nil
}

// evacOpError is why VM.pool_migrate may not start on vm now: the
// lifecycle rules (power state, operations in progress, blocked
// operations), then passed-through devices, as xapi's operation check
// orders them.
func evacOpError(snap db.Reader, vm *db.Row) *xerr.Error {
	v := vmCheckOf(snap, vm)
	if e := v.checkOp(dm.VMOperationsPoolMigrate, true); e != nil {
		return e
	}
	switch {
	case len(strs(snap.Value(vm, dm.VM.AttachedPCIs))) > 0:
		return xerr.New(xerr.VMHasPCIAttached, vm.Ref)
	case len(strs(snap.Value(vm, dm.VM.VGPUs))) > 0:
		return xerr.New(xerr.VMHasVGPU, vm.Ref)
	case len(strs(snap.Value(vm, dm.VM.VUSBs))) > 0:
		return xerr.New(xerr.VMHasVUSBs, vm.Ref)
	}
	return nil
}

// evacMove is one planned migration.
type evacMove struct{ vm, host string }

func (m *Manager) hostEvacuate(c *api.Call, a dm.HostEvacuateArgs) (dm.Void, error) {
	host := string(a.Host)
	p, err := m.evacuationPlan(c, host)
	if err != nil {
		return dm.Void{}, err
	}
	if vms := p.prevents(); len(vms) > 0 {
		return dm.Void{}, p.Errs[vms[0]]
	}
	opts := map[string]string{"live": "true"}
	if n := string(a.Network); n != "" && n != schema.NullRef {
		if err := evacAssertNetwork(c, n, p.Dest); err != nil {
			return dm.Void{}, err
		}
		opts["network"] = n
	}
	moves := make([]evacMove, 0, len(p.Dest))
	for vm, h := range p.Dest {
		moves = append(moves, evacMove{vm, h})
	}
	slices.SortFunc(moves, func(x, y evacMove) int { return cmp.Compare(x.vm, y.vm) })
	batch := evacDefaultBatch
	if a.EvacuateBatchSize > 0 {
		batch = int(min(a.EvacuateBatchSize, evacMaxBatch))
	}
	m.log.Info("host.evacuate", "host", host, "vms", len(moves), "batch", batch)
	var mu sync.Mutex
	var started []string
	prog := newEvacProgress(len(moves), c.SetProgress) // evacprogress.go
	err = runEvacMoves(c.Ctx, moves, batch, func(float64) {}, func(ctx context.Context, mv evacMove) error {
		mu.Lock()
		started = append(started, mv.vm)
		mu.Unlock()
		ctx = api.WithProgress(ctx, func(f float64) { prog.set(mv.vm, f) })
		_, err := (&dm.VMPoolMigrateArgs{VM: dm.VMRef(mv.vm), Host: dm.HostRef(mv.host), Options: opts}).Call(ctx, c.Caller())
		prog.set(mv.vm, 1)
		return err
	})
	if c.Ctx.Err() != nil {
		// A move forwarded to the VM's host stops being waited for when
		// the call is cancelled, while that host finishes or rolls it
		// back: wait (bounded) until none is still marked pool_migrate,
		// so that the task ends with every VM settled on one host.
		m.settleMoves(started)
		return dm.Void{}, cancelledErr(c.Task)
	}
	if err != nil {
		return dm.Void{}, err
	}
	if left := len(evacResidentVMs(c.Snapshot(), host)); left > 0 {
		return dm.Void{}, xerr.New(xerr.InternalError, "evacuate: "+strconv.Itoa(left)+" VMs are still resident on "+host)
	}
	return dm.Void{}, nil
}

// evacSettleTimeout bounds the wait for cancelled moves to settle.
const evacSettleTimeout = time.Minute

// settleMoves waits until no VM of vms has pool_migrate in its
// current_operations, or evacSettleTimeout passes (then it logs).
func (m *Manager) settleMoves(vms []string) {
	moving := func() []string {
		snap := m.db.Snapshot()
		var out []string
		for _, ref := range vms {
			if row, ok := snap.Get(dm.VM.Class, ref); ok {
				cur, _ := row.Get(dm.VM.CurrentOperations).(map[string]string)
				for _, o := range cur {
					if o == string(dm.VMOperationsPoolMigrate) {
						out = append(out, ref)
						break
					}
				}
			}
		}
		return out
	}
	deadline := time.NewTimer(evacSettleTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		left := moving()
		if len(left) == 0 {
			return
		}
		select {
		case <-deadline.C:
			m.log.Warn("host.evacuate: cancelled moves still in progress", "vms", left)
			return
		case <-m.bg.Done():
			return
		case <-tick.C:
		}
	}
}

// runEvacMoves runs move for each of moves, at most batch at once, starting
// the next as one finishes, and reports the share finished to progress.
// After the first failure (other than VM_BAD_POWER_STATE: the VM stopped
// meanwhile) or ctx's cancellation it starts no more, waits for those
// running and returns the failure (ctx's error when cancelled first).
func runEvacMoves(ctx context.Context, moves []evacMove, batch int, progress func(float64), move func(context.Context, evacMove) error) error {
	results := make(chan error, len(moves))
	next, running, done := 0, 0, 0
	var first error
	for {
		for running < batch && next < len(moves) && first == nil && ctx.Err() == nil {
			mv := moves[next]
			next++
			running++
			go func() { results <- move(ctx, mv) }()
		}
		if running == 0 {
			break
		}
		err := <-results
		running--
		done++
		progress(float64(done) / float64(len(moves)))
		if err != nil && !xerr.HasCode(err, xerr.VMBadPowerState) && first == nil {
			first = err
		}
	}
	if first == nil && next < len(moves) {
		first = ctx.Err()
	}
	return first
}

// evacAssertNetwork checks that every destination can take migrations
// on network: a PIF there, plugged, with an address (xapi's
// assert_valid_ip_configuration_on_network_for_host).
func evacAssertNetwork(c *api.Call, network string, dest map[string]string) error {
	n, err := c.Lookup(dm.Network.Class, network)
	if err != nil {
		return err
	}
	snap := c.Snapshot()
	var hosts []string
	for _, h := range dest {
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	pifs := strs(snap.Value(n, dm.Network.PIFs))
	for _, h := range hosts {
		pif := evacHostPIF(snap, pifs, h)
		switch {
		case pif == nil:
			return xerr.New(xerr.PIFNotPresent, h, network)
		case pif.Get(dm.PIF.CurrentlyAttached) != true:
			return xerr.New(xerr.RequiredPIFIsUnplugged, pif.Ref)
		case pif.String(dm.PIF.IP) == "" && len(strs(pif.Get(dm.PIF.IPV6))) == 0:
			return xerr.New(xerr.InterfaceHasNoIP, pif.Ref)
		}
	}
	return nil
}
