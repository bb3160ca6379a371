package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Result is the answer to one planning question.
type Result struct {
	Status Status
	// Heuristic is how the question was answered.
	Heuristic Heuristic
	// Steps is the work the exhaustive search did (0 otherwise).
	Steps int64
	// BudgetExceeded is set when the exhaustive search ran out of its
	// step budget and the approximate planner answered instead.
	BudgetExceeded bool
}

// prepared is the state of the world after every offline protected VM
// has been (hypothetically) started, xapi's compute_restart_plan.
type prepared struct {
	ix  *index
	cfg *config
	// target is the restart host of each offline protected VM (host
	// index), -1 when it has none; absent for VMs already running.
	target map[int]int
	// notRestarted counts offline protected VMs with no place (in xapi
	// this includes every offline non-agile VM).
	notRestarted int
	nonAgile     bool // some protected VM is not agile
}

// prepare places the offline protected VMs: non-agile ones on the host
// they are pinned to (their first allowed host in ID order, live or not,
// so that the pin does not move as hosts come and go), agile ones with
// biggest-fit-decreasing over the live hosts. What remains is the
// configuration future failures are planned against.
func prepare(ix *index) *prepared {
	p := &prepared{ix: ix, target: map[int]int{}}
	c := &config{ix: ix, total: len(ix.hosts)}
	livePos := make([]int, len(ix.hosts))
	for h, host := range ix.hosts {
		livePos[h] = -1
		if host.Live {
			livePos[h] = len(c.hosts)
			c.hosts = append(c.hosts, h)
			c.free = append(c.free, host.FreeMemory)
		}
	}
	p.cfg = c
	var offline []item
	for v, vm := range ix.vms {
		if vm.Priority != PriorityRestart {
			continue
		}
		running := ix.vmHost[v] >= 0 && livePos[ix.vmHost[v]] >= 0
		if !ix.agile[v] {
			p.nonAgile = true
			if running {
				continue // its memory is already on its host
			}
			p.notRestarted++
			p.target[v] = -1
			for h := range ix.hosts {
				if ix.mayRun(v, h) {
					if pos := livePos[h]; pos >= 0 {
						// Charged as overhead either way; a restart
						// target only if it fits.
						if c.free[pos] >= vm.Memory {
							p.target[v] = h
						}
						c.free[pos] = satAdd(c.free[pos], -vm.Memory)
					}
					break
				}
			}
			continue
		}
		j := len(c.vms)
		c.vms = append(c.vms, v)
		c.size = append(c.size, vm.Memory)
		if running {
			c.place = append(c.place, livePos[ix.vmHost[v]])
			continue
		}
		c.place = append(c.place, -1)
		offline = append(offline, item{vm: j, size: vm.Memory})
	}
	if len(offline) > 0 {
		var pk packer
		pk.pack(offline, c.free, func(int) bool { return true },
			func(vm, pos int) bool { return ix.mayRun(c.vms[vm], c.hosts[pos]) })
		for _, it := range offline {
			v := c.vms[it.vm]
			c.place[it.vm] = it.to
			if it.to < 0 {
				p.notRestarted++
				p.target[v] = -1
				continue
			}
			p.target[v] = c.hosts[it.to]
		}
	}
	return p
}

// status answers "is a plan always possible for r failures" against the
// prepared configuration: xapi's plan_for_n_failures.
func (p *prepared) status(ctx context.Context, r int, opts Options) (Result, error) {
	if r < 0 {
		return Result{}, fmt.Errorf("%w: %d failures to tolerate", ErrInvalidInput, r)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if r > p.cfg.total || p.notRestarted > 0 {
		return Result{Status: NoPlanExists, Heuristic: Trivial}, nil
	}
	res := Result{Heuristic: ChooseHeuristic(p.cfg.total, r)}
	if opts.ForceApproximate {
		res.Heuristic = Approximate
	}
	var ok bool
	if res.Heuristic == Exhaustive {
		budget := opts.Budget
		if budget == 0 {
			budget = DefaultBudget
		}
		var err error
		ok, res.Steps, err = p.cfg.exhaustive(ctx, r, budget)
		switch {
		case errors.Is(err, errBudget):
			res.BudgetExceeded = true
			res.Heuristic = Approximate
		case err != nil:
			return Result{}, err
		}
	}
	if res.Heuristic == Approximate {
		ok = p.cfg.approximate(r)
	}
	switch {
	case !ok:
		res.Status = NoPlanExists
	case p.nonAgile:
		res.Status = PlanExistsExcludingNonAgileVMs
	default:
		res.Status = PlanExistsForAllVMs
	}
	return res, nil
}

// PlanExists says whether the protected VMs of pool can be restarted
// after any r host failures (pool.ha_failover_plan_exists returns true
// only for PlanExistsForAllVMs). Offline protected VMs are first placed
// on the live hosts; if some cannot be, the answer is NoPlanExists.
func PlanExists(ctx context.Context, pool Pool, r int, opts Options) (Result, error) {
	ix, err := validate(pool)
	if err != nil {
		return Result{}, err
	}
	return prepare(ix).status(ctx, r, opts)
}

// QuorumLimit is the most host failures a raft pool survives with its
// coordinator: fewer than half of the voters, plus every non-voting
// host (xapi's corosync rule, (n-disabled-1)/2 + disabled).
func QuorumLimit(voters, nonVoters int) int {
	return max(0, (voters-1)/2) + max(0, nonVoters)
}

// MaxFailuresTolerated is pool.ha_compute_max_host_failures_to_tolerate:
// the largest r, at most the number of hosts and at most limit (pass
// QuorumLimit; a negative limit means none), for which PlanExists
// reports PlanExistsForAllVMs. Like xapi it bisects, assuming that a
// pool that cannot survive r failures cannot survive more; 0 is
// returned when no r works.
func MaxFailuresTolerated(ctx context.Context, pool Pool, limit int, opts Options) (int, error) {
	ix, err := validate(pool)
	if err != nil {
		return 0, err
	}
	return maxFailures(ctx, prepare(ix), limit, opts)
}

func maxFailures(ctx context.Context, p *prepared, limit int, opts Options) (int, error) {
	hi := p.cfg.total
	if limit >= 0 {
		hi = min(hi, limit)
	}
	works := func(r int) (bool, error) {
		res, err := p.status(ctx, r, opts)
		return res.Status == PlanExistsForAllVMs, err
	}
	lo := 0
	for hi-lo >= 2 {
		mid := lo + (hi-lo)/2
		ok, err := works(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	ok, err := works(hi)
	if err != nil {
		return 0, err
	}
	if ok {
		return hi, nil
	}
	return lo, nil
}

// HypotheticalMaxFailures is
// pool.ha_compute_hypothetical_max_host_failures_to_tolerate: as
// MaxFailuresTolerated, but with the protected VMs being exactly those
// given the priority "restart" in configuration (VM ID -> priority);
// every other VM is treated as unprotected. An invalid priority gives
// ErrInvalidPriority (xapi's INVALID_VALUE), an unknown VM ErrUnknownVM.
func HypotheticalMaxFailures(ctx context.Context, pool Pool, configuration map[string]Priority, limit int, opts Options) (int, error) {
	ix, err := validate(pool)
	if err != nil {
		return 0, err
	}
	for id, pri := range configuration {
		if !pri.Valid() {
			return 0, fmt.Errorf("%w: %q for VM %q", ErrInvalidPriority, string(pri), id)
		}
		if _, ok := ix.vmIdx[id]; !ok {
			return 0, fmt.Errorf("%w: %q", ErrUnknownVM, id)
		}
	}
	for v := range ix.vms {
		ix.vms[v].Priority = configuration[ix.vms[v].ID]
	}
	return maxFailures(ctx, prepare(ix), limit, opts)
}

// Change is a proposed operation, for CheckChange: xapi's
// configuration_change. Memory moves with the VMs: a VM that leaves a
// host gives its Memory back to that host's FreeMemory, a VM that
// arrives on a host takes its (new) Memory from it.
type Change struct {
	// DisableHosts are hosts to treat as not live (host.disable,
	// host.shutdown, an evacuation).
	DisableHosts []string
	// SetVMs adds VMs or replaces those with the same ID: VM.start or
	// resume of a protected VM (Host "" lets the planner place it,
	// Host set pins it there), a migration (same VM, new Host), a
	// memory increase (same VM, larger Memory), a new restart priority.
	SetVMs []VM
	// RemoveVMs are VMs that stop running and leave the plan.
	RemoveVMs []string
	// Failures, when not nil, is the failure count to plan for after the
	// change (pool.set_ha_host_failures_to_tolerate).
	Failures *int
}

// Verdict is the answer of CheckChange.
type Verdict struct {
	Before, After Result
	// WouldBreak is set when a plan for every protected VM exists now
	// but not after the change. An operation is never refused for a pool
	// that is already without a full plan (it cannot get worse), as in
	// xapi's assert_configuration_change_preserves_ha_plan.
	WouldBreak bool
}

// Err returns nil, or an error wrapping ErrWouldBreakPlan for the caller
// to report as HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN.
func (v Verdict) Err() error {
	if !v.WouldBreak {
		return nil
	}
	return fmt.Errorf("%w: %s before the change, %s after", ErrWouldBreakPlan, v.Before.Status, v.After.Status)
}

// CheckChange answers whether change keeps a failover plan for r
// failures (xapi plans against pool.ha_plan_exists_for). The caller
// skips the check when HA is off or ha_allow_overcommit is set.
func CheckChange(ctx context.Context, pool Pool, change Change, r int, opts Options) (Verdict, error) {
	ix, err := validate(pool)
	if err != nil {
		return Verdict{}, err
	}
	next, err := applyChange(ix, change)
	if err != nil {
		return Verdict{}, err
	}
	nix, err := validate(next)
	if err != nil {
		return Verdict{}, err
	}
	var v Verdict
	if v.Before, err = prepare(ix).status(ctx, r, opts); err != nil {
		return Verdict{}, err
	}
	after := r
	if change.Failures != nil {
		after = *change.Failures
	}
	if v.After, err = prepare(nix).status(ctx, after, opts); err != nil {
		return Verdict{}, err
	}
	v.WouldBreak = v.Before.Status == PlanExistsForAllVMs && v.After.Status != PlanExistsForAllVMs
	return v, nil
}

func applyChange(ix *index, ch Change) (Pool, error) {
	if len(ch.DisableHosts) > MaxHosts || len(ch.SetVMs) > MaxVMs || len(ch.RemoveVMs) > MaxVMs {
		return Pool{}, fmt.Errorf("%w: change too large", ErrInvalidInput)
	}
	hosts := slices.Clone(ix.hosts)
	vms := slices.Clone(ix.vms)
	give := func(hostID string, mem int64) {
		if h, ok := ix.hostIdx[hostID]; ok {
			hosts[h].FreeMemory = min(MaxMemory, max(-MaxMemory, satAdd(hosts[h].FreeMemory, mem)))
		}
	}
	for _, id := range ch.DisableHosts {
		h, ok := ix.hostIdx[id]
		if !ok {
			return Pool{}, fmt.Errorf("%w: %q", ErrUnknownHost, id)
		}
		hosts[h].Live = false
	}
	removed := make(map[string]bool, len(ch.RemoveVMs))
	for _, id := range ch.RemoveVMs {
		v, ok := ix.vmIdx[id]
		if !ok {
			return Pool{}, fmt.Errorf("%w: %q", ErrUnknownVM, id)
		}
		if !removed[id] {
			removed[id] = true
			give(vms[v].Host, vms[v].Memory)
		}
	}
	set := make(map[string]bool, len(ch.SetVMs))
	for _, nv := range ch.SetVMs {
		if removed[nv.ID] || set[nv.ID] {
			return Pool{}, fmt.Errorf("%w: VM %q changed twice", ErrInvalidInput, nv.ID)
		}
		set[nv.ID] = true
		if nv.Memory < 0 || nv.Memory > MaxMemory {
			return Pool{}, fmt.Errorf("%w: VM %q memory %d out of range", ErrInvalidInput, nv.ID, nv.Memory)
		}
		if nv.Host != "" {
			if _, ok := ix.hostIdx[nv.Host]; !ok {
				return Pool{}, fmt.Errorf("%w: VM %q arrives on %q", ErrUnknownHost, nv.ID, nv.Host)
			}
		}
		if v, ok := ix.vmIdx[nv.ID]; ok {
			give(vms[v].Host, vms[v].Memory)
			vms[v] = nv
		} else {
			vms = append(vms, nv)
		}
		give(nv.Host, -nv.Memory)
	}
	out := vms[:0]
	for _, vm := range vms {
		if !removed[vm.ID] {
			out = append(out, vm)
		}
	}
	return Pool{Hosts: hosts, VMs: out}, nil
}

// Reason says why FailoverPlan found no host for a VM.
type Reason int

const (
	// Placed: the VM has a host.
	Placed Reason = iota
	// NotAgile: the VM may not run on every host (xapi reports the
	// agility error: SR or network not shared, and so on).
	NotAgile
	// NoMemory: no live host has room (HOST_NOT_ENOUGH_FREE_MEMORY).
	NoMemory
)

// String names the reason.
func (r Reason) String() string {
	switch r {
	case Placed:
		return "placed"
	case NotAgile:
		return "not agile"
	case NoMemory:
		return "no room"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Placement is one VM of a failover plan.
type Placement struct {
	VM     string
	Host   string // "" when Reason is not Placed
	Reason Reason
}

// FailoverPlan is pool.ha_compute_vm_failover_plan: where failedVMs
// would restart if failedHosts failed. The live hosts other than
// failedHosts are packed with biggest-fit-decreasing; a VM goes only to
// a host it may run on. The result follows the order of failedVMs.
func FailoverPlan(pool Pool, failedHosts, failedVMs []string) ([]Placement, error) {
	ix, err := validate(pool)
	if err != nil {
		return nil, err
	}
	if len(failedHosts) > MaxHosts || len(failedVMs) > MaxVMs {
		return nil, fmt.Errorf("%w: too many failed hosts or VMs", ErrInvalidInput)
	}
	if err := markFailed(ix, failedHosts); err != nil {
		return nil, err
	}
	free := make([]int64, len(ix.hosts))
	for h, host := range ix.hosts {
		free[h] = host.FreeMemory
	}
	items := make([]item, 0, len(failedVMs))
	seen := make(map[int]bool, len(failedVMs))
	for _, id := range failedVMs {
		v, ok := ix.vmIdx[id]
		if !ok {
			return nil, fmt.Errorf("%w: %q", ErrUnknownVM, id)
		}
		if seen[v] {
			return nil, fmt.Errorf("%w: VM %q listed twice", ErrInvalidInput, id)
		}
		seen[v] = true
		items = append(items, item{vm: v, size: ix.vms[v].Memory})
	}
	var pk packer
	pk.pack(items, free, func(h int) bool { return ix.hosts[h].Live }, ix.mayRun)
	to := make(map[int]int, len(items))
	for _, it := range items {
		to[it.vm] = it.to
	}
	out := make([]Placement, 0, len(failedVMs))
	for _, id := range failedVMs {
		v := ix.vmIdx[id]
		pl := Placement{VM: id}
		switch h := to[v]; {
		case h >= 0:
			pl.Host = ix.hosts[h].ID
		case !ix.agile[v]:
			pl.Reason = NotAgile
		default:
			pl.Reason = NoMemory
		}
		out = append(out, pl)
	}
	return out, nil
}

func markFailed(ix *index, failedHosts []string) error {
	for _, id := range failedHosts {
		h, ok := ix.hostIdx[id]
		if !ok {
			return fmt.Errorf("%w: %q", ErrUnknownHost, id)
		}
		ix.hosts[h].Live = false
	}
	return nil
}

// Restart is one VM for the restart executor.
type Restart struct {
	VM string
	// Host is the planned host, "" when the plan has none (xapi then
	// tries a plain VM.start, letting placement choose).
	Host     string
	Priority Priority
	Order    int64
	// Wave groups restarts: those of one wave may run in parallel, and a
	// wave starts after the one before it has finished. Protected VMs
	// come first, grouped by Order; best-effort VMs follow.
	Wave int
}

// RestartPlan is the executor's list, in start order.
type RestartPlan struct {
	Restarts []Restart
	// Complete is set when every protected VM in Restarts has a Host.
	Complete bool
}

// RestartOrder computes what to restart after failedHosts have failed
// (hosts already not live count as failed too): every protected VM that
// is not running on a live host, with its host from the specific plan
// (non-agile VMs on their pinned host when it is live, agile ones by
// biggest-fit-decreasing over the live hosts), then the best-effort VMs
// that were resident on a failed host, packed into what memory is left.
// Within each class VMs go by Order (negative last), then ID. When 2 to 8
// hosts failed together and packing their VMs at once leaves an agile
// protected VM out, the failures are replayed one host at a time, as the
// exhaustive planner simulated them (see the package documentation).
func RestartOrder(pool Pool, failedHosts []string) (RestartPlan, error) {
	ix, err := validate(pool)
	if err != nil {
		return RestartPlan{}, err
	}
	if len(failedHosts) > MaxHosts {
		return RestartPlan{}, fmt.Errorf("%w: too many failed hosts", ErrInvalidInput)
	}
	wasLive := make([]bool, len(ix.hosts))
	for h := range ix.hosts {
		wasLive[h] = ix.hosts[h].Live
	}
	if err := markFailed(ix, failedHosts); err != nil {
		return RestartPlan{}, err
	}
	p := prepare(ix)
	// What is left for best-effort VMs: free memory of the live hosts.
	binHosts, binFree := p.cfg.hosts, p.cfg.free
	var newlyFailed []int
	for h := range ix.hosts {
		if wasLive[h] && !ix.hosts[h].Live {
			newlyFailed = append(newlyFailed, h)
		}
	}
	if len(newlyFailed) >= 2 && len(newlyFailed) <= maxSequentialFailures && p.agileUnplaced() {
		if seq, hosts, free, ok := sequentialTargets(pool, newlyFailed); ok {
			for v, h := range seq {
				if _, offline := p.target[v]; offline {
					p.target[v] = h
				}
			}
			binHosts, binFree = hosts, free
		}
	}
	plan := RestartPlan{Complete: true}
	for v, h := range p.target {
		r := Restart{VM: ix.vms[v].ID, Priority: PriorityRestart, Order: ix.vms[v].Order}
		if h >= 0 && ix.hosts[h].Live {
			r.Host = ix.hosts[h].ID
		} else {
			plan.Complete = false
		}
		plan.Restarts = append(plan.Restarts, r)
	}
	// Best-effort VMs of failed hosts, into the memory the protected
	// restarts leave.
	var items []item
	for v, vm := range ix.vms {
		if vm.Priority == PriorityBestEffort && ix.vmHost[v] >= 0 && !ix.hosts[ix.vmHost[v]].Live {
			items = append(items, item{vm: v, size: vm.Memory})
		}
	}
	if len(items) > 0 {
		var pk packer
		pk.pack(items, binFree, func(int) bool { return true },
			func(v, pos int) bool { return ix.mayRun(v, binHosts[pos]) })
		for _, it := range items {
			r := Restart{VM: ix.vms[it.vm].ID, Priority: PriorityBestEffort, Order: ix.vms[it.vm].Order}
			if it.to >= 0 {
				r.Host = ix.hosts[binHosts[it.to]].ID
			}
			plan.Restarts = append(plan.Restarts, r)
		}
	}
	slices.SortFunc(plan.Restarts, func(a, b Restart) int {
		if ca, cb := class(a.Priority), class(b.Priority); ca != cb {
			return ca - cb
		}
		if oa, ob := orderKey(a.Order), orderKey(b.Order); oa != ob {
			if oa < ob {
				return -1
			}
			return 1
		}
		return cmpString(a.VM, b.VM)
	})
	for i := range plan.Restarts {
		if i > 0 {
			a, b := plan.Restarts[i-1], plan.Restarts[i]
			plan.Restarts[i].Wave = a.Wave
			if class(a.Priority) != class(b.Priority) || orderKey(a.Order) != orderKey(b.Order) {
				plan.Restarts[i].Wave++
			}
		}
	}
	return plan, nil
}

func class(p Priority) int {
	if p == PriorityRestart {
		return 0
	}
	return 1
}

// orderKey is xapi's order_f: a negative order sorts last.
func orderKey(o int64) int64 {
	if o < 0 {
		return 1<<63 - 1
	}
	return o
}

// maxSequentialFailures bounds the hosts RestartOrder replays one by one.
const maxSequentialFailures = 8

func (p *prepared) agileUnplaced() bool {
	for v, h := range p.target {
		if h < 0 && p.ix.agile[v] {
			return true
		}
	}
	return false
}

// sequentialTargets replays the failure of several hosts one at a time,
// in ID order, as the exhaustive planner simulated it: each failed host's
// VMs are repacked onto the hosts still alive, including those that fail
// next. Biggest-fit-decreasing over all lost VMs at once can fail where
// this succeeds (the planner promised the sequential outcome), so
// RestartOrder falls back to it. It returns the final host of every agile
// protected VM, and the live hosts with the memory left on them.
func sequentialTargets(pool Pool, failed []int) (target map[int]int, hosts []int, free []int64, ok bool) {
	ix, err := validate(pool)
	if err != nil {
		return nil, nil, nil, false
	}
	dead := make([]bool, len(ix.hosts))
	for _, h := range failed {
		dead[h] = true
	}
	// Non-agile VMs of the failed hosts are offline from the start, so
	// that their pins are charged as in the real outcome.
	for v := range ix.vms {
		if !ix.agile[v] && ix.vmHost[v] >= 0 && dead[ix.vmHost[v]] {
			ix.vmHost[v] = -1
		}
	}
	c := prepare(ix).cfg
	if slices.Contains(c.place, -1) {
		return nil, nil, nil, false
	}
	gone := make([]bool, len(c.hosts))
	var pk packer
	for pos, h := range c.hosts {
		if !dead[h] {
			continue
		}
		var items []item
		for j, at := range c.place {
			if at == pos {
				items = append(items, item{vm: j, size: c.size[j]})
			}
		}
		gone[pos] = true
		if pk.pack(items, c.free, func(q int) bool { return !gone[q] },
			func(j, q int) bool { return ix.mayRun(c.vms[j], c.hosts[q]) }) > 0 {
			return nil, nil, nil, false
		}
		for _, it := range items {
			c.place[it.vm] = it.to
		}
	}
	target = make(map[int]int, len(c.vms))
	for j, v := range c.vms {
		target[v] = c.hosts[c.place[j]]
	}
	for pos, h := range c.hosts {
		if !gone[pos] {
			hosts = append(hosts, h)
			free = append(free, c.free[pos])
		}
	}
	return target, hosts, free, true
}
