package raftwal

import "sync"

// worker is a goroutine of the log's own that takes a step each time it
// is kicked, until halted: the syncer (syncStep) and the preparer of
// spares (prepareStep).
type worker struct {
	kicks chan struct{} // one kick waits while a step runs; more are one
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// startWorker runs step at each kick. step is given the stop channel, so
// that a long step can give up when the worker is halted.
func startWorker(step func(stop <-chan struct{})) *worker {
	wk := &worker{kicks: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(wk.done)
		for {
			select {
			case <-wk.kicks:
			case <-wk.stop:
				return
			}
			step(wk.stop)
		}
	}()
	return wk
}

// kick asks for a step; it never blocks (a kick already waiting is
// enough), and does nothing once the worker is halted, or on no worker.
func (wk *worker) kick() {
	if wk == nil {
		return
	}
	select {
	case wk.kicks <- struct{}{}:
	default:
	}
}

// halt ends the worker and waits until its step is over; halting again
// does nothing.
func (wk *worker) halt() {
	wk.once.Do(func() { close(wk.stop) })
	<-wk.done
}
