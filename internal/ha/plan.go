package ha

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/forwarding"
	"toolstackd/internal/ha/planner"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// The planner's calls (pool.ha_compute_*, pool.ha_failover_plan_exists)
// and the plan the coordinator keeps current (pool.ha_plan_exists_for,
// pool.ha_overcommitted), over internal/ha/planner.

// planTimeout bounds one planning call.
const planTimeout = 30 * time.Second

// planPool reads the pool as the planner sees it: every host with the
// memory its metrics say is free (live only if live and enabled), and
// every protected VM with its static maximum, where it runs, its
// priority and order. VMs may run on any host: one with a disk on a
// host's local storage cannot be protected (setRestartPriority).
func planPool(snap db.Reader) planner.Pool {
	var p planner.Pool
	for _, h := range snap.All(dm.Host.Class) {
		ph := planner.Host{ID: h.Ref}
		if m, ok := snap.Get(dm.HostMetrics.Class, h.String(dm.Host.Metrics)); ok {
			ph.FreeMemory, _ = m.Get(dm.HostMetrics.MemoryFree).(int64)
		}
		live, _ := forwarding.MetricsLive(snap, h)
		enabled, _ := h.Get(dm.Host.Enabled).(bool)
		ph.Live = live && enabled
		p.Hosts = append(p.Hosts, ph)
	}
	for _, vm := range snap.All(dm.VM.Class) {
		if !protected(vm) || vm.Get(dm.VM.IsATemplate) == true || vm.Get(dm.VM.IsASnapshot) == true {
			continue
		}
		p.VMs = append(p.VMs, planVM(vm, planner.Priority(vm.String(dm.VM.HARestartPriority))))
	}
	return p
}

// planVM is a VM as the planner sees it, with the priority given: its
// memory, its order, and its host while it runs.
func planVM(vm *db.Row, prio planner.Priority) planner.VM {
	pv := planner.VM{ID: vm.Ref, Priority: prio}
	pv.Memory, _ = vm.Get(dm.VM.MemoryStaticMax).(int64)
	pv.Order, _ = vm.Get(dm.VM.Order).(int64)
	switch vm.String(dm.VM.PowerState) {
	case string(dm.VMPowerStateRunning), string(dm.VMPowerStatePaused):
		pv.Host = vm.String(dm.VM.ResidentOn)
	}
	return pv
}

// withVMs adds to pool the VMs of refs it lacks (unprotected ones a call
// asks about), with priority prio.
func withVMs(pool *planner.Pool, snap db.Reader, refs []string, prio planner.Priority) {
	have := map[string]bool{}
	for _, v := range pool.VMs {
		have[v.ID] = true
	}
	for _, ref := range refs {
		if row, ok := snap.Get(dm.VM.Class, ref); ok && !have[ref] {
			have[ref] = true
			pool.VMs = append(pool.VMs, planVM(row, prio))
		}
	}
}

// quorumLimit is the most host failures the raft pool itself survives.
func (s *Service) quorumLimit() int {
	return planner.QuorumLimit(s.cfg.Pool.Voters())
}

// planErr turns a planner error into a XenAPI one.
func planErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return xerr.New(xerr.TaskCancelled, "")
	case errors.Is(err, planner.ErrUnknownHost):
		return xerr.New(xerr.HandleInvalid, dm.Host.Class.Name, err.Error())
	case errors.Is(err, planner.ErrUnknownVM):
		return xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, err.Error())
	}
	return xerr.New(xerr.InternalError, "HA planner: "+err.Error())
}

func (s *Service) maxFailures(c *api.Call, _ dm.PoolHAComputeMaxHostFailuresToTolerateArgs) (int64, error) {
	ctx, cancel := context.WithTimeout(c.Ctx, planTimeout)
	defer cancel()
	n, err := planner.MaxFailuresTolerated(ctx, planPool(c.Snapshot()), s.quorumLimit(), planner.Options{})
	return int64(n), planErr(err)
}

func (s *Service) hypotheticalMaxFailures(c *api.Call, a dm.PoolHAComputeHypotheticalMaxHostFailuresToTolerateArgs) (int64, error) {
	conf := map[string]planner.Priority{}
	var refs []string
	for vm, prio := range a.Configuration {
		refs = append(refs, string(vm))
		if _, ok := c.Snapshot().Get(dm.VM.Class, string(vm)); !ok {
			return 0, xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, string(vm))
		}
		if p := planner.Priority(prio); !p.Valid() {
			return 0, xerr.New(xerr.InvalidValue, "ha_restart_priority", prio)
		}
		conf[string(vm)] = planner.Priority(prio)
	}
	ctx, cancel := context.WithTimeout(c.Ctx, planTimeout)
	defer cancel()
	// The configuration may protect VMs that are not protected now.
	pool := planPool(c.Snapshot())
	withVMs(&pool, c.Snapshot(), refs, planner.PriorityNone)
	n, err := planner.HypotheticalMaxFailures(ctx, pool, conf, s.quorumLimit(), planner.Options{})
	return int64(n), planErr(err)
}

func (s *Service) planExists(c *api.Call, a dm.PoolHAFailoverPlanExistsArgs) (bool, error) {
	if a.N < 0 {
		return false, xerr.New(xerr.InvalidValue, "n", strconv.FormatInt(a.N, 10))
	}
	ctx, cancel := context.WithTimeout(c.Ctx, planTimeout)
	defer cancel()
	res, err := planner.PlanExists(ctx, planPool(c.Snapshot()), int(min(a.N, 1<<20)), planner.Options{})
	return err == nil && res.Status == planner.PlanExistsForAllVMs, planErr(err)
}

// failoverPlan is pool.ha_compute_vm_failover_plan: for each VM, the host
// it would restart on ({"host": ref}) or why it would not
// ({"error_code": code}).
func (s *Service) failoverPlan(c *api.Call, a dm.PoolHAComputeVMFailoverPlanArgs) (any, error) {
	snap := c.Snapshot()
	var hosts, vms []string
	for _, h := range a.FailedHosts {
		if _, ok := snap.Get(dm.Host.Class, string(h)); !ok {
			return nil, xerr.New(xerr.HandleInvalid, dm.Host.Class.Name, string(h))
		}
		hosts = append(hosts, string(h))
	}
	for _, vm := range a.FailedVMs {
		if _, ok := snap.Get(dm.VM.Class, string(vm)); !ok {
			return nil, xerr.New(xerr.HandleInvalid, dm.VM.Class.Name, string(vm))
		}
		vms = append(vms, string(vm))
	}
	pool := planPool(snap)
	// The VMs asked about are planned whether or not they are protected.
	withVMs(&pool, snap, vms, planner.PriorityRestart)
	plan, err := planner.FailoverPlan(pool, hosts, vms)
	if err != nil {
		return nil, planErr(err)
	}
	out := map[string]any{}
	for _, p := range plan {
		if p.Reason == planner.Placed {
			out[p.VM] = map[string]string{"host": p.Host}
		} else {
			out[p.VM] = map[string]string{"error_code": xerr.HostNotEnoughFreeMemory}
		}
	}
	return out, nil
}

// checkPlan refuses a change that would leave no failover plan for the
// failures the pool is set to tolerate (HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN),
// unless the pool allows overcommitting.
func (s *Service) checkPlan(ctx context.Context, snap db.Reader, change planner.Change) error {
	p, on := enabled(snap)
	if !on {
		return nil
	}
	if allow, _ := p.Get(dm.Pool.HAAllowOvercommit).(bool); allow {
		return nil
	}
	r, _ := p.Get(dm.Pool.HAPlanExistsFor).(int64)
	ctx, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	v, err := planner.CheckChange(ctx, planPool(snap), change, int(r), planner.Options{})
	if err != nil {
		return planErr(err)
	}
	if v.WouldBreak {
		return xerr.New(xerr.HAOperationWouldBreakFailoverPlan)
	}
	return nil
}

// The names of HA's alerts (XenAPI messages on the pool).
const (
	alertOvercommitted = "HA_POOL_OVERCOMMITTED"
	alertPlanDrop      = "HA_POOL_DROP_IN_PLAN_EXISTS_FOR"
)

// replan, on the coordinator, keeps pool.ha_plan_exists_for (the host
// failures a plan exists for, at most ha_host_failures_to_tolerate) and
// pool.ha_overcommitted current.
func (s *Service) replan(ctx context.Context) {
	snap := s.cfg.Server.DB.Snapshot()
	p, on := enabled(snap)
	if !on {
		return
	}
	want, _ := p.Get(dm.Pool.HAHostFailuresToTolerate).(int64)
	ctx, cancel := context.WithTimeout(ctx, planTimeout)
	defer cancel()
	n, err := planner.MaxFailuresTolerated(ctx, planPool(snap), min(s.quorumLimit(), int(min(want, 1<<20))), planner.Options{})
	if err != nil {
		s.log.Warn("HA: cannot compute the failover plan", "err", err)
		return
	}
	exists, over := int64(n), int64(n) < want
	cur, _ := p.Get(dm.Pool.HAPlanExistsFor).(int64)
	was, _ := p.Get(dm.Pool.HAOvercommitted).(bool)
	if cur == exists && was == over {
		return
	}
	if over {
		s.log.Warn("HA: the pool is overcommitted: no plan for the failures it is set to tolerate", "tolerate", want, "plan_for", exists)
	}
	// Alerts, as xapi raises them: a drop in the failures a plan exists
	// for, and the step into overcommitment (once, on the transition).
	var alerts []*dm.MessageRecord
	now := s.cfg.Now().UTC()
	if exists < cur {
		alerts = append(alerts, &dm.MessageRecord{Name: alertPlanDrop, Priority: 3, Cls: dm.ClsPool,
			ObjUUID: p.UUID(), Timestamp: now, Body: strconv.FormatInt(exists, 10)})
	}
	if over && !was {
		alerts = append(alerts, &dm.MessageRecord{Name: alertOvercommitted, Priority: 3, Cls: dm.ClsPool,
			ObjUUID: p.UUID(), Timestamp: now, Body: fmt.Sprintf(
				"Pool '%s' can no longer promise to survive %d host failures: a failover plan exists for %d.",
				p.String(dm.Pool.NameLabel), want, exists)})
	}
	_, err = s.cfg.Server.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Pool.Class, p.Ref); !ok {
			return nil
		}
		for f, v := range map[*schema.Field]any{dm.Pool.HAPlanExistsFor: exists, dm.Pool.HAOvercommitted: over} {
			if err := tx.Set(f, p.Ref, v); err != nil {
				return err
			}
		}
		for _, a := range alerts {
			if _, err := tx.Insert(dm.Message.Class, "", a.Row()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("HA: cannot record the failover plan", "err", err)
	}
}
