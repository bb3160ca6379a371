/*
Package planner decides whether a pool's protected VMs can be restarted
after host failures, and where. It answers the XenAPI's HA planning calls
with the semantics of xapi's planner (binpack.ml and
xapi_ha_vm_failover.ml) and gives the restart executor its ordered list.

The package is pure: its inputs are plain Go values, it keeps no state
between calls, does no I/O and, for the same input, always returns the
same answer. The caller reads the database, reduces each VM's SRs,
networks and affinity to the set of hosts it may run on, and turns the
typed results into XenAPI errors and fields.

# Usage

Build a Pool: every host of the pool, live or not, with the memory still
free for VMs (the memory of the VMs resident on it already subtracted),
and the VMs that matter to HA, each with what it needs to start, where it
runs, its restart priority and order, and the hosts it may run on. Then:

	res, err := planner.PlanExists(ctx, pool, r, planner.Options{})
	// pool.ha_failover_plan_exists(r) is res.Status == PlanExistsForAllVMs

	n, err := planner.MaxFailuresTolerated(ctx, pool, planner.QuorumLimit(voters, nonVoters), planner.Options{})
	// pool.ha_compute_max_host_failures_to_tolerate

	n, err = planner.HypotheticalMaxFailures(ctx, pool, map[string]planner.Priority{"vm1": "restart"}, limit, planner.Options{})
	// pool.ha_compute_hypothetical_max_host_failures_to_tolerate

	plan, err := planner.FailoverPlan(pool, failedHosts, failedVMs)
	// pool.ha_compute_vm_failover_plan

	v, err := planner.CheckChange(ctx, pool, planner.Change{SetVMs: []planner.VM{started}}, planExistsFor, planner.Options{})
	err = v.Err() // nil, or HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN

	order, err := planner.RestartOrder(pool, deadHosts)
	// the restart executor's list, wave by wave

Every call validates its input first; hostile input (duplicate or unknown
IDs, negative or absurd sizes, more than MaxHosts hosts or MaxVMs VMs, an
unknown priority) is refused with an error wrapping ErrInvalidInput,
ErrUnknownHost, ErrUnknownVM or ErrInvalidPriority, never a panic.

# The model

A VM is protected when its restart priority is "restart" (xapi also
requires ha_always_run; the caller passes such VMs with PriorityNone when
it is false). A protected VM resident on a live host is running and its
memory is already part of that host's used memory. Any other protected
VM is offline and needs a start: the planner first places every offline
protected VM, as xapi does after a failure or while HA is being enabled,
and plans future failures from the state of the pool after those starts.

A VM is agile when it may run on every host of the pool other than its
own (Hosts nil, or a set that covers them). Agile VMs are what the
planner packs. A protected VM that is not agile is pinned, as in xapi,
to the first host it may run on in ID order (live or not, so the pin
does not move as hosts come and go); its memory is charged to that host
as overhead. Any non-agile protected VM turns a full answer into
PlanExistsExcludingNonAgileVMs, and an offline one into NoPlanExists
(xapi counts it among the VMs it could not restart).

# Biggest-fit-decreasing

All packing is biggest-fit-decreasing: VMs by size, largest first, each
into the host with the most free memory (among those it may run on); a
VM that does not fit there is skipped, leaving a partial plan, and
packing goes on with the smaller VMs. Hosts keep xapi's order: most free
memory first, and among equals the host just packed into first, then ID
order. A specific plan (the restart of offline VMs, FailoverPlan,
RestartOrder) is one such packing over the live hosts.

# Is a plan always possible for r failures?

Two answers, chosen as xapi's choose_heuristic does, from the number n
of hosts in the pool (live or not) and r:

  - Exhaustive (n <= 32 and C(n,r)·r! < 3,500): for every choice of r
    live hosts and every order in which they fail, the failed host's VMs
    are repacked onto the hosts still alive; one partial packing means
    no plan. The search walks ordered failure sequences depth first, so
    a common prefix is simulated once; Options.Budget bounds its steps
    (DefaultBudget when zero) and the context can cancel it. A search
    that runs out of budget answers with the approximation instead and
    says so in Result.BudgetExceeded.
  - Approximate (otherwise): every VM is assumed as large as the
    largest; each host holds floor(free/largest) of them; the r hosts
    holding the most fail, and the r hosts running the most VMs are the
    ones lost; the plan holds when the VMs lost fit the capacity left.

Either way a plan is trivially never possible with fewer live hosts than
r, or exactly r and any agile protected VM to place. Asking for more
failures than there are hosts answers NoPlanExists, as xapi's
configuration check does.

MaxFailuresTolerated bisects r over 0..min(hosts, limit) as xapi's
Helpers.bisect does (assuming monotonicity); the limit is the quorum's:
with a raft pool fewer than half of the voters may fail
(QuorumLimit(voters, nonVoters) = (voters-1)/2 + nonVoters).

# Overcommit protection

CheckChange compares the plan before and after a Change (hosts disabled,
VMs started, moved, resized or protected, VMs stopped, a new failure
count). Memory moves with the VMs: a VM leaving a host gives back its old
Memory, a VM arriving takes its new Memory; a VM set with no Host is
placed by the planner. Only a pool that has a full plan now can lose it:
an already overcommitted pool refuses nothing (xapi's rule), so
Verdict.WouldBreak is Before == PlanExistsForAllVMs && After !=.

# Restart order

RestartOrder lists the protected VMs that are not running on a live host,
each with the host of the specific plan, sorted by Order (xapi's order_f:
ascending, a negative order last) then ID; then the best-effort VMs that
were resident on a failed host, packed into the memory left, in the same
order. Consecutive VMs of one class and order form a Wave, which xapi
starts in parallel. A protected VM with no host leaves Complete false; xapi
then falls back to a plain VM.start in the same order.

The exhaustive planner simulates failures one host at a time, but hosts
can die together, and packing the VMs of several hosts at once can fail
where the one-at-a-time replay succeeds (a pool approved for two failures
can lose one VM when both hosts go). So when the packing at once leaves
an agile protected VM without a host after 2 to 8 hosts failed together,
RestartOrder replays their failures one by one in ID order and uses the
final positions: every pool the exhaustive planner approves for r
failures then restarts all its protected VMs after any r of its hosts
fail (a property the tests check on thousands of random pools).

# Differences from xapi

Where xapi would fail or ignore a constraint the planner is stricter or
total, never looser: VMs are placed only on hosts they may run on (xapi's
ha_compute_vm_failover_plan packs non-agile VMs anywhere); a pool of
VMs that all need no memory has a plan (xapi divides by zero and reports
none); a non-agile VM pinned to a dead host, or one that does not fit
on its pinned host, has no target rather than a host that cannot take
it; RestartOrder replays simultaneous failures as above (xapi packs at
once and falls back to plain VM.start); among equal-sized VMs, ID order
decides who goes where (xapi uses list order; the outcome in sizes is
the same).
*/
package planner
