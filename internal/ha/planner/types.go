package planner

import (
	"errors"
	"fmt"
	"slices"
)

// Priority is a VM's ha_restart_priority as the XenAPI spells it.
type Priority string

// The restart priorities xapi accepts.
const (
	// PriorityRestart marks a protected VM: the planner keeps a failover
	// plan for it and the executor restarts it before anything else.
	PriorityRestart Priority = "restart"
	// PriorityBestEffort marks a VM restarted after the protected ones if
	// capacity allows; the planner never reserves memory for it.
	PriorityBestEffort Priority = "best-effort"
	// PriorityNone marks a VM HA leaves alone.
	PriorityNone Priority = ""
)

// Protected reports whether HA restarts a VM of this priority elsewhere.
func (p Priority) Protected() bool { return p == PriorityRestart || p == PriorityBestEffort }

// Valid reports whether p is one of the three priorities xapi accepts.
func (p Priority) Valid() bool {
	return p == PriorityRestart || p == PriorityBestEffort || p == PriorityNone
}

// Host is one host of the pool as the planner sees it.
type Host struct {
	// ID names the host; hosts are ordered by ID wherever xapi orders
	// them by UUID, so passing the UUID reproduces xapi's tie-breaking.
	ID string
	// FreeMemory is the memory, in bytes, still free for VMs with every
	// VM currently resident on (or scheduled to) this host already
	// subtracted. It may be negative on an overcommitted host.
	FreeMemory int64
	// Live is true for a host that is alive and enabled: one that may
	// receive restarted VMs. Dead, disabled and fenced hosts are not live.
	Live bool
}

// VM is one VM of the pool as the planner sees it.
type VM struct {
	// ID names the VM; VMs are ordered by ID where xapi orders by UUID.
	ID string
	// Memory is what the VM needs to start, in bytes, including its
	// overheads (xapi: main + shadow memory for the start policy).
	Memory int64
	// Host is the ID of the host the VM is resident on (or scheduled to
	// be), or "" for a VM that is not running. A VM whose host is not
	// live counts as failed: it needs a restart.
	Host string
	// Priority is the restart priority; only PriorityRestart VMs are
	// protected. A VM with priority "restart" but ha_always_run false is
	// not protected in xapi: pass it with PriorityNone.
	Priority Priority
	// Order is the VM's start order (VM.order): lower first; a negative
	// order sorts after every non-negative one, as in xapi.
	Order int64
	// Hosts is the set of hosts the VM may run on, reduced by the caller
	// from its SRs, networks, affinity and the like; nil means every
	// host. A VM is agile when it may run on every host of the pool other
	// than its own; agile VMs are packed freely, the others are pinned
	// to their first allowed host (see the package documentation).
	Hosts []string
}

// Pool is the whole planning input: every host of the pool (live or
// not, since the total number decides the search) and the VMs that
// matter to HA. Unprotected VMs may be listed (Change and Hypothetical
// can protect them); their memory is already in their host's FreeMemory.
type Pool struct {
	Hosts []Host
	VMs   []VM
}

// Status is the answer of PlanExists, xapi's plan_status.
type Status int

// The three plan statuses of xapi_ha_vm_failover.ml.
const (
	// NoPlanExists: some failure of r hosts (or the present state, with
	// protected VMs that cannot even be started) leaves protected VMs
	// without a place.
	NoPlanExists Status = iota
	// PlanExistsExcludingNonAgileVMs: the agile protected VMs can always
	// be restarted, but protected VMs exist that cannot run everywhere.
	PlanExistsExcludingNonAgileVMs
	// PlanExistsForAllVMs: every protected VM survives any r failures.
	PlanExistsForAllVMs
)

// String returns xapi's name for the status.
func (s Status) String() string {
	switch s {
	case NoPlanExists:
		return "No_plan_exists"
	case PlanExistsExcludingNonAgileVMs:
		return "Plan_exists_excluding_non_agile_VMs"
	case PlanExistsForAllVMs:
		return "Plan_exists_for_all_VMs"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Heuristic says how a planning question was answered.
type Heuristic int

const (
	// Trivial: no search was needed (too few live hosts, or the protected
	// VMs cannot be started even before any failure).
	Trivial Heuristic = iota
	// Exhaustive: every ordered failure of r live hosts was simulated with
	// biggest-fit-decreasing repacking (xapi's bin_pack_every_combination).
	Exhaustive
	// Approximate: one conservative worst case (xapi's approximate_bin_pack).
	Approximate
)

// String names the heuristic.
func (h Heuristic) String() string {
	switch h {
	case Trivial:
		return "trivial"
	case Exhaustive:
		return "exhaustive"
	case Approximate:
		return "approximate"
	}
	return fmt.Sprintf("Heuristic(%d)", int(h))
}

// Options tune a planning call; the zero value is xapi's behaviour with
// DefaultBudget.
type Options struct {
	// Budget bounds the exhaustive search of one planning question, in
	// steps (one per simulated host failure, per VM repacked and per 32
	// VMs scanned).
	// When the search would exceed it, the answer of the approximate
	// planner is used instead and Result.BudgetExceeded is set. Zero
	// means DefaultBudget; negative means no bound.
	Budget int64
	// ForceApproximate always uses the approximate planner (xapi's fist
	// point choose_approximate_planner).
	ForceApproximate bool
}

// DefaultBudget is the step budget of an exhaustive search when
// Options.Budget is zero: about a quarter of a second of work.
const DefaultBudget = 2_000_000

// Limits on the input, so that hostile input is refused before any work
// and no sum of memory sizes can overflow an int64.
const (
	MaxHosts  = 4096
	MaxVMs    = 1 << 17
	MaxMemory = int64(1) << 52 // 4 PiB, for a VM's need or a host's free memory
)

// Errors returned for input the planner refuses; they are wrapped with
// the offending value, so test with errors.Is.
var (
	ErrInvalidInput = errors.New("planner: invalid input")
	ErrUnknownHost  = errors.New("planner: unknown host")
	ErrUnknownVM    = errors.New("planner: unknown VM")
	// ErrInvalidPriority is xapi's INVALID_VALUE for ha_restart_priority.
	ErrInvalidPriority = errors.New("planner: invalid restart priority")
	// ErrWouldBreakPlan is HA_OPERATION_WOULD_BREAK_FAILOVER_PLAN.
	ErrWouldBreakPlan = errors.New("planner: operation would break the failover plan")
)

// index is a validated pool in planner form: hosts and VMs sorted by ID,
// referred to by position.
type index struct {
	hosts   []Host
	vms     []VM
	hostIdx map[string]int
	vmIdx   map[string]int
	vmHost  []int      // host index of each VM, -1 when not resident
	allowed [][]uint64 // per VM: bitset of allowed hosts, nil = all
	agile   []bool
}

func validate(p Pool) (*index, error) {
	if len(p.Hosts) > MaxHosts {
		return nil, fmt.Errorf("%w: %d hosts (at most %d)", ErrInvalidInput, len(p.Hosts), MaxHosts)
	}
	if len(p.VMs) > MaxVMs {
		return nil, fmt.Errorf("%w: %d VMs (at most %d)", ErrInvalidInput, len(p.VMs), MaxVMs)
	}
	ix := &index{
		hosts:   slices.Clone(p.Hosts),
		vms:     slices.Clone(p.VMs),
		hostIdx: make(map[string]int, len(p.Hosts)),
		vmIdx:   make(map[string]int, len(p.VMs)),
	}
	slices.SortFunc(ix.hosts, func(a, b Host) int { return cmpString(a.ID, b.ID) })
	slices.SortFunc(ix.vms, func(a, b VM) int { return cmpString(a.ID, b.ID) })
	for i, h := range ix.hosts {
		if h.ID == "" {
			return nil, fmt.Errorf("%w: host with an empty ID", ErrInvalidInput)
		}
		if _, dup := ix.hostIdx[h.ID]; dup {
			return nil, fmt.Errorf("%w: host %q listed twice", ErrInvalidInput, h.ID)
		}
		if h.FreeMemory > MaxMemory || h.FreeMemory < -MaxMemory {
			return nil, fmt.Errorf("%w: host %q free memory %d out of range", ErrInvalidInput, h.ID, h.FreeMemory)
		}
		ix.hostIdx[h.ID] = i
	}
	words := (len(ix.hosts) + 63) / 64
	ix.vmHost = make([]int, len(ix.vms))
	ix.allowed = make([][]uint64, len(ix.vms))
	ix.agile = make([]bool, len(ix.vms))
	for i, v := range ix.vms {
		if v.ID == "" {
			return nil, fmt.Errorf("%w: VM with an empty ID", ErrInvalidInput)
		}
		if _, dup := ix.vmIdx[v.ID]; dup {
			return nil, fmt.Errorf("%w: VM %q listed twice", ErrInvalidInput, v.ID)
		}
		ix.vmIdx[v.ID] = i
		if v.Memory < 0 || v.Memory > MaxMemory {
			return nil, fmt.Errorf("%w: VM %q memory %d out of range", ErrInvalidInput, v.ID, v.Memory)
		}
		if !v.Priority.Valid() {
			return nil, fmt.Errorf("%w: VM %q: %q", ErrInvalidPriority, v.ID, string(v.Priority))
		}
		ix.vmHost[i] = -1
		if v.Host != "" {
			h, ok := ix.hostIdx[v.Host]
			if !ok {
				return nil, fmt.Errorf("%w: VM %q is resident on %q", ErrUnknownHost, v.ID, v.Host)
			}
			ix.vmHost[i] = h
		}
		if v.Hosts == nil {
			ix.agile[i] = true
			continue
		}
		if len(v.Hosts) > MaxHosts {
			return nil, fmt.Errorf("%w: VM %q lists %d allowed hosts", ErrInvalidInput, v.ID, len(v.Hosts))
		}
		set := make([]uint64, words)
		for _, id := range v.Hosts {
			h, ok := ix.hostIdx[id]
			if !ok {
				return nil, fmt.Errorf("%w: VM %q may run on %q", ErrUnknownHost, v.ID, id)
			}
			set[h/64] |= 1 << (h % 64)
		}
		ix.allowed[i] = set
		agile := true
		for h := range ix.hosts {
			if h != ix.vmHost[i] && set[h/64]&(1<<(h%64)) == 0 {
				agile = false
				break
			}
		}
		ix.agile[i] = agile
	}
	return ix, nil
}

// mayRun reports whether VM v may run on host h.
func (ix *index) mayRun(v, h int) bool {
	s := ix.allowed[v]
	return s == nil || s[h/64]&(1<<(h%64)) != 0
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// satAdd adds two memory sizes, saturating instead of overflowing.
func satAdd(a, b int64) int64 {
	s := a + b
	if a > 0 && b > 0 && s < 0 {
		return 1<<63 - 1
	}
	if a < 0 && b < 0 && s >= 0 {
		return -1 << 63
	}
	return s
}
