package xenops

import (
	"cmp"
	"slices"
	"strings"

	"toolstackd/internal/xerr"
)

// Evacuation planning: which host each VM resident on a host goes to when
// the host is evacuated, or why it cannot go anywhere. The rules are
// xapi's (compute_evacuation_plan_no_wlb in xapi_host.ml, read for
// facts), in this order, a later rule overriding an earlier one for the
// same VM:
//
//  1. No target host (every other host disabled): every VM gets
//     NO_HOSTS_AVAILABLE [vm].
//  2. With HA on, a VM HA does not protect gets
//     HOST_EVACUATE_VM_NOT_HA_PROTECTED [vm]: evacuating must leave the
//     pool as a host failure followed by HA's restarts would.
//  3. A protected VM (every VM when HA is off) must be able to run on
//     every target host, memory aside (its SRs plugged there, its
//     networks reachable, the host live): the first host that cannot
//     run it gives the VM that host's error (VM_REQUIRES_SR [vm, sr],
//     VM_REQUIRES_NETWORK [vm, network], HOST_NOT_LIVE). A VM with a
//     disk on one host's local storage is therefore never evacuated.
//  4. A VM whose pool_migrate operation is refused (its power state,
//     another operation in progress, a PCI device passed through) gets
//     that error.
//  5. The VMs that passed rule 3 are packed by memory, biggest first,
//     each onto the target with the most free memory (xapi's
//     biggest-fit-decreasing); one that fits nowhere gets
//     HOST_NOT_ENOUGH_FREE_MEMORY [vm]. toolstackd first gives a VM its
//     affinity host when that is a target with room for it, as VM.start's
//     placement does; xapi's evacuation ignores affinity.
//
// A VM ends with either a destination or an error, never both. xapi's
// VM-group anti-affinity spreading is not done.

// evacHost is a target host as the planner sees it.
type evacHost struct {
	Ref  string
	Free int64 // memory free for new VMs, bytes
}

// evacVM is a VM resident on the host being evacuated.
type evacVM struct {
	Ref      string
	Memory   int64  // what it needs on its destination, bytes
	Affinity string // its affinity host, or ""
	// Unprotected is set when HA is on and does not protect the VM.
	Unprotected bool
	// Cannot is the first target host's reason it cannot run the VM
	// there, memory aside (nil when every target can).
	Cannot *xerr.Error
	// OpErr is why pool_migrate may not start on the VM now, or nil.
	OpErr *xerr.Error
}

// evacPlan is where each VM goes, or why it cannot.
type evacPlan struct {
	Dest map[string]string      // VM -> host
	Errs map[string]*xerr.Error // VM -> why not
}

// prevents lists the VMs with an error, in ref order.
func (p evacPlan) prevents() []string {
	out := make([]string, 0, len(p.Errs))
	for vm := range p.Errs {
		out = append(out, vm)
	}
	slices.Sort(out)
	return out
}

// cannotEvacuate is assert_can_evacuate's error: CANNOT_EVACUATE_HOST
// with every VM's error as "code,param,..." joined by "|" (the old
// encoding xapi keeps for this call), nil when the plan has none.
func (p evacPlan) cannotEvacuate() *xerr.Error {
	vms := p.prevents()
	if len(vms) == 0 {
		return nil
	}
	parts := make([]string, len(vms))
	for i, vm := range vms {
		e := p.Errs[vm]
		parts[i] = strings.Join(append([]string{e.Code}, e.Params...), ",")
	}
	return xerr.New(xerr.CannotEvacuateHost, strings.Join(parts, "|"))
}

// planEvacuation applies the rules above to targets (in the order their
// errors are looked for, and ties in free memory are broken) and vms.
func planEvacuation(targets []evacHost, vms []evacVM) evacPlan {
	p := evacPlan{Dest: map[string]string{}, Errs: map[string]*xerr.Error{}}
	if len(targets) == 0 {
		for _, vm := range vms {
			p.Errs[vm.Ref] = xerr.New(xerr.NoHostsAvailable, vm.Ref)
		}
		return p
	}
	var movable []evacVM
	for _, vm := range vms {
		switch {
		case vm.Unprotected:
			p.Errs[vm.Ref] = xerr.New(xerr.HostEvacuateVMNotHAProtected, vm.Ref)
		case vm.Cannot != nil:
			p.Errs[vm.Ref] = vm.Cannot
		default:
			movable = append(movable, vm)
		}
	}
	for _, vm := range vms {
		if vm.OpErr != nil {
			p.Errs[vm.Ref] = vm.OpErr
		}
	}
	placed := evacPack(targets, movable)
	for _, vm := range movable {
		h, ok := placed[vm.Ref]
		if !ok {
			p.Errs[vm.Ref] = xerr.New(xerr.HostNotEnoughFreeMemory, vm.Ref)
			continue
		}
		if _, bad := p.Errs[vm.Ref]; !bad {
			p.Dest[vm.Ref] = h
		}
	}
	return p
}

// evacPack places vms on hosts by memory: affinity hosts first where they
// have room, then biggest-fit-decreasing (the biggest VM onto the host
// with the most free memory). VMs that fit nowhere are left out.
func evacPack(hosts []evacHost, vms []evacVM) map[string]string {
	free := make([]evacHost, len(hosts))
	copy(free, hosts)
	pos := map[string]int{}
	for i, h := range free {
		pos[h.Ref] = i
	}
	order := slices.Clone(vms)
	slices.SortStableFunc(order, func(a, b evacVM) int {
		if c := cmp.Compare(b.Memory, a.Memory); c != 0 {
			return c
		}
		return cmp.Compare(a.Ref, b.Ref)
	})
	out := map[string]string{}
	for _, vm := range order {
		if i, ok := pos[vm.Affinity]; ok && free[i].Free >= vm.Memory {
			free[i].Free -= vm.Memory
			out[vm.Ref] = free[i].Ref
		}
	}
	for _, vm := range order {
		if _, done := out[vm.Ref]; done {
			continue
		}
		best := -1
		for i, h := range free {
			if best < 0 || h.Free > free[best].Free {
				best = i
			}
		}
		if best < 0 || free[best].Free < vm.Memory {
			continue
		}
		free[best].Free -= vm.Memory
		out[vm.Ref] = free[best].Ref
	}
	return out
}
