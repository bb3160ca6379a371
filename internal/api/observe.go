package api

import (
	"errors"
	"sync/atomic"
	"time"

	"toolstackd/internal/xerr"
)

// CallObserver sees every call that comes in over the wire once it has
// its answer: the method as the wire spells the message ("VM.start",
// "Async.VM.start"; "unknown" for a name no message has, so that made-up
// names stay out of metric labels), "success" or the XenAPI error code,
// (or "other" for a code outside the published list), and the time from
// decoding to the result. Implementations must be safe
// for concurrent use and quick.
type CallObserver interface {
	ObserveCall(method, result string, d time.Duration)
}

// observeState is what the server keeps for observers.
type observeState struct {
	observer atomic.Pointer[CallObserver]
	watchers atomic.Int64 // event.from and event.next calls waiting
}

// SetObserver sets the observer of wire calls (nil: none).
func (s *Server) SetObserver(o CallObserver) {
	if o == nil {
		s.obs.observer.Store(nil)
		return
	}
	s.obs.observer.Store(&o)
}

// EventWatchers is how many event.from and event.next calls are waiting.
func (s *Server) EventWatchers() int64 { return s.obs.watchers.Load() }

// Sessions is how many sessions are open on this host.
func (s *Server) Sessions() int { return len(s.sessions.all()) }

// PendingTasks is how many tasks of this host's calls have not finished.
func (s *Server) PendingTasks() int {
	s.tasks.mu.Lock()
	defer s.tasks.mu.Unlock()
	n := 0
	for _, p := range s.tasks.pending {
		n += p
	}
	return n
}

// observe reports a wire call to the observer.
func (s *Server) observe(r *request, start time.Time, err error) {
	p := s.obs.observer.Load()
	if p == nil {
		return
	}
	method := "unknown"
	if r.msg != nil {
		method = r.msg.Wire
		if r.async {
			method = "Async." + method
		}
	}
	result := "success"
	if err != nil {
		result = xerr.InternalError
		var xe *xerr.Error
		if errors.As(err, &xe) {
			// Codes outside the published list (a storage plugin's own)
			// are not labels: a plugin could make up any number.
			result = "other"
			if xerr.Published(xe.Code) {
				result = xe.Code
			}
		}
	}
	(*p).ObserveCall(method, result, time.Since(start))
}
