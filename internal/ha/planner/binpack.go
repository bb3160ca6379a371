package planner

import (
	"context"
	"math"
	"math/bits"
	"slices"
)

// ExhaustiveMaxHosts and ExhaustiveMaxOrderings are xapi's thresholds for
// choosing the exhaustive search: a pool of at most 32 hosts where
// C(n,r)·r! (the number of ordered failure sequences) is below 3,500.
const (
	ExhaustiveMaxHosts     = 32
	ExhaustiveMaxOrderings = 3500
)

// ChooseHeuristic returns the heuristic xapi's choose_heuristic picks for
// a pool of totalHosts hosts (live or not) asked to tolerate r failures.
func ChooseHeuristic(totalHosts, r int) Heuristic {
	if totalHosts > ExhaustiveMaxHosts || r < 0 || r > totalHosts {
		return Approximate
	}
	c := binomial(totalHosts, r)
	f, ok := factorial(r)
	if !ok {
		return Approximate
	}
	hi, lo := bits.Mul64(c, f)
	if hi != 0 || lo > math.MaxInt64 {
		return Approximate
	}
	if lo < ExhaustiveMaxOrderings {
		return Exhaustive
	}
	return Approximate
}

// binomial returns C(n,r) for 0 <= r <= n <= 64 (C(64,32) < 2^63).
func binomial(n, r int) uint64 {
	if r > n-r {
		r = n - r
	}
	c := uint64(1)
	for i := 0; i < r; i++ {
		// c·(n-i) is divisible by (i+1); c <= C(64,32), so no overflow.
		c = c * uint64(n-i) / uint64(i+1)
	}
	return c
}

// factorial returns r! and false when it does not fit an int64.
func factorial(r int) (uint64, bool) {
	f := uint64(1)
	for i := 2; i <= r; i++ {
		hi, lo := bits.Mul64(f, uint64(i))
		if hi != 0 || lo > math.MaxInt64 {
			return 0, false
		}
		f = lo
	}
	return f, true
}

// item is one VM to pack: its identity for the caller, its size, and
// (after packing) the bin position it went to, -1 when it did not fit.
type item struct {
	vm   int
	size int64
	to   int
}

// bin is a host in the packer's order: larger free memory first, and
// among equals the most recently re-inserted first (then ID order), the
// order xapi's sorted-list insertion keeps.
type bin struct {
	pos   int
	free  int64
	stamp int64
}

// packer holds the scratch space of biggest-fit-decreasing so that a
// search does not allocate per simulated failure.
type packer struct {
	bins []bin
}

// pack is biggest-fit-decreasing: items by size, largest first (ties by
// VM index, i.e. ID order), each into the bin with the most free memory
// among those the VM may use; a VM that does not fit there is skipped
// (the plan is partial) and packing goes on with the next. free is
// indexed by bin position and updated; usable(pos) selects the bins;
// allowed(vm, pos) restricts a VM to some bins. It returns the number of
// skipped items.
func (p *packer) pack(items []item, free []int64, usable func(pos int) bool, allowed func(vm, pos int) bool) int {
	slices.SortFunc(items, func(a, b item) int {
		if a.size != b.size {
			if a.size > b.size {
				return -1
			}
			return 1
		}
		return a.vm - b.vm
	})
	p.bins = p.bins[:0]
	for pos, f := range free {
		if usable(pos) {
			p.bins = append(p.bins, bin{pos: pos, free: f, stamp: -int64(pos)})
		}
	}
	slices.SortFunc(p.bins, cmpBin)
	stamp := int64(0)
	skipped := 0
	for i := range items {
		it := &items[i]
		it.to = -1
		k := -1
		for j := range p.bins {
			if allowed == nil || allowed(it.vm, p.bins[j].pos) {
				k = j
				break
			}
		}
		if k < 0 || p.bins[k].free-it.size < 0 {
			skipped++
			continue
		}
		b := p.bins[k]
		b.free -= it.size
		stamp++
		b.stamp = stamp
		it.to = b.pos
		free[b.pos] = b.free
		p.bins = slices.Delete(p.bins, k, k+1)
		at, _ := slices.BinarySearchFunc(p.bins, b, cmpBin)
		p.bins = slices.Insert(p.bins, at, b)
	}
	return skipped
}

func cmpBin(a, b bin) int {
	if a.free != b.free {
		if a.free > b.free {
			return -1
		}
		return 1
	}
	if a.stamp != b.stamp {
		if a.stamp > b.stamp {
			return -1
		}
		return 1
	}
	return 0
}

// config is xapi's Binpack configuration over the agile protected VMs:
// the live hosts with their free memory after every offline protected VM
// has been placed, the VMs with their sizes and where they now run.
type config struct {
	ix    *index
	total int     // hosts in the pool, live or not ('n')
	hosts []int   // host indices of the live hosts, ID order
	free  []int64 // per position in hosts
	vms   []int   // VM indices, ID order
	size  []int64 // per position in vms
	place []int   // per position in vms: host position, or -1
}

// triviallyNeverPossible is xapi's plan_trivially_never_possible: fewer
// live hosts than failures, or exactly as many and VMs to protect.
func (c *config) triviallyNeverPossible(r int) bool {
	return len(c.hosts) < r || (len(c.hosts) == r && len(c.vms) > 0)
}

// approximate is xapi's approximate_bin_pack: assume every VM is as large
// as the largest, that the r hosts with the most room fail, and that
// they were the r hosts running the most VMs.
func (c *config) approximate(r int) bool {
	if c.triviallyNeverPossible(r) {
		return false
	}
	if len(c.vms) == 0 {
		return true
	}
	var largest int64
	for _, s := range c.size {
		largest = max(largest, s)
	}
	capacity := make([]int64, len(c.hosts))
	for i, f := range c.free {
		switch {
		case largest > 0:
			capacity[i] = f / largest
		case f >= 0:
			// Every VM needs nothing: a host not overcommitted holds
			// all of them (xapi divides by zero here).
			capacity[i] = int64(len(c.vms))
		}
	}
	slices.SortFunc(capacity, func(a, b int64) int { return cmpDesc(a, b) })
	var left int64
	for _, k := range capacity[min(r, len(capacity)):] {
		left = satAdd(left, k)
	}
	count := make([]int64, len(c.hosts))
	for _, h := range c.place {
		if h >= 0 {
			count[h]++
		}
	}
	slices.SortFunc(count, func(a, b int64) int { return cmpDesc(a, b) })
	var moving int64
	for _, k := range count[:min(r, len(count))] {
		moving += k
	}
	return moving <= left
}

func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// search is the exhaustive planner's state: one scratch level per
// simulated failure, so the depth-first walk over ordered failure
// sequences shares the work of common prefixes.
type search struct {
	c       *config
	ctx     context.Context
	budget  int64 // negative: unbounded
	steps   int64
	failed  []bool
	free    [][]int64
	place   [][]int
	items   [][]item
	packer  packer
	stopped error // context error or errBudget
}

type budgetError struct{}

func (budgetError) Error() string { return "planner: search budget exceeded" }

var errBudget error = budgetError{}

// exhaustive is xapi's bin_pack_every_combination: for every choice of r
// live hosts and every order in which they fail, each failure's VMs are
// repacked onto the hosts still alive with biggest-fit-decreasing; a
// partial packing anywhere means a plan is not always possible. Ordered
// sequences of distinct hosts are exactly every permutation of every
// combination; walking them depth-first checks each prefix once.
func (c *config) exhaustive(ctx context.Context, r int, budget int64) (ok bool, steps int64, err error) {
	if c.triviallyNeverPossible(r) {
		return false, 0, nil
	}
	s := &search{
		c:      c,
		ctx:    ctx,
		budget: budget,
		failed: make([]bool, len(c.hosts)),
		free:   make([][]int64, r),
		place:  make([][]int, r),
		items:  make([][]item, r),
	}
	for d := 0; d < r; d++ {
		s.free[d] = make([]int64, len(c.free))
		s.place[d] = make([]int, len(c.place))
	}
	ok = s.walk(0, c.free, c.place)
	return ok, s.steps, s.stopped
}

func (s *search) step(n int64) bool {
	s.steps += n
	if s.budget >= 0 && s.steps > s.budget {
		s.stopped = errBudget
		return false
	}
	if s.steps&0xfff < n || n > 0xfff {
		if err := s.ctx.Err(); err != nil {
			s.stopped = err
			return false
		}
	}
	return true
}

func (s *search) walk(depth int, free []int64, place []int) bool {
	if depth == len(s.free) {
		return true
	}
	c := s.c
	usable := func(pos int) bool { return !s.failed[pos] }
	allowed := func(vm, pos int) bool { return c.ix.mayRun(c.vms[vm], c.hosts[pos]) }
	for dead := range c.hosts {
		if s.failed[dead] {
			continue
		}
		nf, np := s.free[depth], s.place[depth]
		copy(nf, free)
		copy(np, place)
		items := s.items[depth][:0]
		for j, h := range np {
			if h == dead {
				items = append(items, item{vm: j, size: c.size[j]})
			}
		}
		s.items[depth] = items
		// A node costs its copies and scan too, not only its packing.
		if !s.step(int64(1 + len(items) + len(np)/32)) {
			return false
		}
		s.failed[dead] = true
		skipped := s.packer.pack(items, nf, usable, allowed)
		if skipped > 0 {
			s.failed[dead] = false
			return false
		}
		for _, it := range items {
			np[it.vm] = it.to
		}
		ok := s.walk(depth+1, nf, np)
		s.failed[dead] = false
		if !ok {
			return false
		}
	}
	return true
}
