package xenops

import "sync"

// evacProgress is host.evacuate's progress: each move counts for an
// equal share, and a move in flight for the share of it done so far, as
// VM.pool_migrate reports it (here, or from the VM's host when the move
// is forwarded there: api.WithProgress). A move's share never goes back.
type evacProgress struct {
	report func(float64)

	mu    sync.Mutex
	n     int
	share map[string]float64
}

func newEvacProgress(n int, report func(float64)) *evacProgress {
	return &evacProgress{report: report, n: max(n, 1), share: map[string]float64{}}
}

// set records that move vm is f (0 to 1) done and reports the total.
func (e *evacProgress) set(vm string, f float64) {
	e.mu.Lock()
	if f <= e.share[vm] {
		e.mu.Unlock()
		return
	}
	e.share[vm] = min(f, 1)
	sum := 0.0
	for _, v := range e.share {
		sum += v
	}
	e.mu.Unlock()
	e.report(min(sum/float64(e.n), 1))
}
