package ha

import (
	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/ha/planner"
)

// Overcommit protection (issue 13, item 2): with HA on, operations that
// would leave no failover plan for the failures the pool is set to
// tolerate are refused with HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN
// (unless pool.ha_allow_overcommit), checked where the call enters the
// pool (api.Guard). HA's own restarts are not checked: they carry out the
// plan.

// originator names the session HA's restarts run as.
const originator = "HA"

// guards adds the checks to the server.
func (s *Service) guards(srv *api.Server) {
	for _, m := range []string{"VM.start", "VM.resume"} {
		srv.AddGuard(m, s.guardVM("vm", "", ""))
	}
	for _, m := range []string{"VM.start_on", "VM.resume_on"} {
		srv.AddGuard(m, s.guardVM("vm", "host", ""))
	}
	srv.AddGuard("VM.pool_migrate", s.guardVM("vm", "host", ""))
	srv.AddGuard("VM.set_memory_static_max", s.guardVM("self", "", "value"))
	srv.AddGuard("VM.set_memory", s.guardVM("self", "", "value"))
	srv.AddGuard("VM.set_memory_limits", s.guardVM("self", "", "static_max"))
	srv.AddGuard("VM.set_memory_static_range", s.guardVM("self", "", "max"))
	// host.evacuate leaves the host without VMs, as disabling it does
	// (xapi's assert_host_disable_preserves_ha_plan).
	for _, m := range []string{"host.disable", "host.evacuate"} {
		srv.AddGuard(m, func(c *api.Call) error {
			host, _ := arg(c, "host").(string)
			return s.guard(c, planner.Change{DisableHosts: []string{host}})
		})
	}
}

// arg is a call's argument by parameter name (nil if absent).
func arg(c *api.Call, name string) any {
	first := 0
	if c.Msg.TakesSession {
		first = 1
	}
	for i := first; i < len(c.Msg.Params); i++ {
		if c.Msg.Params[i].Name == name && i-first < len(c.Args) {
			return c.Args[i-first]
		}
	}
	return nil
}

// guardVM checks a change to one protected VM: where it will run (the
// host parameter, else where placement puts it) and its memory (the
// memory parameter, when the call changes it).
func (s *Service) guardVM(vmParam, hostParam, memParam string) api.Guard {
	return func(c *api.Call) error {
		snap := c.Snapshot()
		ref, _ := arg(c, vmParam).(string)
		vm, ok := snap.Get(dm.VM.Class, ref)
		if !ok || !protected(vm) {
			return nil
		}
		pv := planner.VM{ID: vm.Ref, Priority: planner.Priority(vm.String(dm.VM.HARestartPriority))}
		pv.Memory, _ = vm.Get(dm.VM.MemoryStaticMax).(int64)
		pv.Order, _ = vm.Get(dm.VM.Order).(int64)
		if ps := vm.String(dm.VM.PowerState); ps == string(dm.VMPowerStateRunning) || ps == string(dm.VMPowerStatePaused) {
			pv.Host = vm.String(dm.VM.ResidentOn)
		}
		if hostParam != "" {
			pv.Host, _ = arg(c, hostParam).(string)
		}
		if memParam != "" {
			if n, ok := arg(c, memParam).(int64); ok && n > pv.Memory {
				pv.Memory = n
			}
		}
		return s.guard(c, planner.Change{SetVMs: []planner.VM{pv}})
	}
}

// guard refuses change when it would break the plan, except for HA's own
// calls.
func (s *Service) guard(c *api.Call, change planner.Change) error {
	if c.Session != nil && c.Session.Originator == originator {
		return nil
	}
	return s.checkPlan(c.Ctx, db.Reader(c.Snapshot()), change)
}
