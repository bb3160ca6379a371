package api

import (
	"context"
	"sync"
	"time"

	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// Tasks as the code doing their work sees them.
//
// Every piece of work that reports through a XenAPI task (an Async call,
// a disk transfer over HTTP, an xe command) holds a *Task:
//
//	t, err := srv.StartTask(ctx, sess, "VDI import", "")   // or AdoptTask for a client's task_id
//	...
//	t.Progress(0.5)       // coalesced: the newest value wins, the worker never waits
//	<-t.Context().Done()  // task.cancel, task.destroy, the session ending, or ctx
//	t.Finish(schema.Void, nil, err)
//
// Cancellation is registered with the server when the task starts, so
// task.cancel reaches the work directly; nobody polls the task row. The
// outcome is written once, by Finish: success with the result encoded as
// xapi stores it, cancelled when the work stopped because the task was
// cancelled, failure with the error's code and parameters otherwise.

// Task is one running task.
type Task struct {
	s      *Server
	Ref    string
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	cancelled bool // by task.cancel or task.destroy, not by ctx
	val       float64
	dirty     bool
	busy      bool
	wg        sync.WaitGroup
	// lastWrite is when progress was last written. Only the writer
	// running (busy) touches it; mu hands it from one writer to the next.
	lastWrite time.Time
	// relay, when set, gets the progress instead of a task row
	// (progress.go), at most every relayInterval.
	relay func(float64)
}

// StartTask makes a pending task owned by sess (nil: owned by no
// session) whose context is ctx's, cancelled also by task.cancel. A
// session may have at most Config.MaxPendingTasksPerSession tasks not yet
// completed; past that it gets TOO_MANY_PENDING_TASKS.
func (s *Server) StartTask(ctx context.Context, sess *Session, label, description string) (*Task, error) {
	t := &Task{s: s}
	t.ctx, t.cancel = context.WithCancel(ctx)
	ref, err := s.newTask(sess, label, description, t.cancelByTask)
	if err != nil {
		t.cancel()
		return nil, err
	}
	t.Ref = ref
	return t, nil
}

// TaskFor is the task of an HTTP request's work: the client's own when it
// named one (task_id: AdoptTask), else a new one (StartTask).
func (s *Server) TaskFor(ctx context.Context, sess *Session, given, label string) (*Task, error) {
	if given != "" {
		return s.AdoptTask(ctx, sess, given)
	}
	return s.StartTask(ctx, sess, label, "")
}

// AdoptTask takes over a pending task a client made (task.create) and
// handed to this work (an HTTP transfer's task_id): only a session that
// may act on the task may adopt it (see CheckTaskOwner). From then on
// task.cancel reaches the work as for a task it started.
func (s *Server) AdoptTask(ctx context.Context, sess *Session, ref string) (*Task, error) {
	if err := s.CheckTaskOwner(sess, ref); err != nil {
		return nil, err
	}
	t := &Task{s: s, Ref: ref}
	t.ctx, t.cancel = context.WithCancel(ctx)
	s.tasks.mu.Lock()
	row, ok := s.DB.Snapshot().Get(dm.Task.Class, ref)
	switch {
	case !ok:
		s.tasks.mu.Unlock()
		t.cancel()
		return nil, xerr.New(xerr.HandleInvalid, dm.Task.Class.Name, ref)
	case row.String(dm.Task.Status) != string(dm.TaskStatusTypePending) || s.tasks.running[ref] != nil:
		s.tasks.mu.Unlock()
		t.cancel()
		return nil, xerr.New(xerr.OperationNotAllowed, "task "+ref+" is not pending")
	}
	s.tasks.running[ref] = t.cancelByTask
	s.tasks.mu.Unlock()
	return t, nil
}

// cancelByTask is what task.cancel and task.destroy call.
func (t *Task) cancelByTask() {
	t.mu.Lock()
	t.cancelled = true
	t.mu.Unlock()
	t.cancel()
}

// Context is cancelled when the task is cancelled or destroyed, its
// session ends, or the context it was started with ends.
func (t *Task) Context() context.Context { return t.ctx }

// Cancelled reports whether task.cancel (or task.destroy) stopped the
// task, as opposed to its caller going away.
func (t *Task) Cancelled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cancelled
}

// Progress records the task's progress (0 to 1) without making the work
// wait for the database: one write is in flight at a time, writes are at
// least progressInterval apart, and the newest value wins.
func (t *Task) Progress(p float64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.val = p
	if t.busy {
		t.dirty = true
		t.mu.Unlock()
		return
	}
	t.busy = true
	t.wg.Add(1)
	t.mu.Unlock()
	go t.writeProgress()
}

// progressInterval is the least time between two progress writes of one
// task: a transfer reporting every block makes ten writes a second, not
// thousands, and watchers get as many events.
const progressInterval = 100 * time.Millisecond

func (t *Task) writeProgress() {
	defer t.wg.Done()
	for {
		// Writes are at least progressInterval apart, across writers
		// too; the task ending writes the newest value at once.
		every := progressInterval
		if t.relay != nil {
			every = relayInterval
		}
		if wait := every - time.Since(t.lastWrite); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-t.ctx.Done(): // ended, or Finish: write now
				timer.Stop()
			}
		}
		t.mu.Lock()
		v := t.val
		t.dirty = false
		t.mu.Unlock()
		t.lastWrite = time.Now()
		if t.relay != nil {
			t.relay(v)
		} else if _, err := t.s.DB.Update(func(tx *db.Tx) error {
			// Progress is advisory and the work goes on: log a failure.
			if _, ok := tx.Get(dm.Task.Class, t.Ref); !ok {
				return nil
			}
			return tx.Set(dm.Task.Progress, t.Ref, v)
		}); err != nil {
			t.s.Log.Warn("cannot record task progress", t.s.uuidAttr("task", dm.Task.Class, t.Ref), "err", err)
		}
		t.mu.Lock()
		if !t.dirty {
			t.busy = false
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
	}
}

// Finish records the task's outcome once the progress written so far is
// in: its result of type resultType, or err. An error after the task was
// cancelled, or TASK_CANCELLED itself, ends it cancelled.
func (t *Task) Finish(resultType *schema.Type, v any, err error) {
	t.cancel() // the work is over; a writer waiting out the interval writes now
	t.wg.Wait()
	t.s.FinishTask(t.Ref, resultType, v, err, err != nil && t.Cancelled())
}

// startTask runs an Async call: it returns the task at once and runs the
// call in the background, its marks taken there.
func (s *Server) startTask(c *Call, r request) (string, error) {
	t, err := s.StartTask(context.Background(), c.Session, "Async."+c.Msg.Wire, "")
	if err != nil {
		return "", err
	}
	tc := *c
	tc.Ctx, tc.Task, tc.task = t.Context(), t.Ref, t
	go func() {
		v, err := s.admitAndRun(&tc, &r)
		t.Finish(c.Msg.Result, v, err)
	}()
	return t.Ref, nil
}

// SetProgress records the progress (0 to 1) of the task running this
// call, or passes it to the caller that follows it (ProgressTask); a
// call that nobody follows has none to record.
func (c *Call) SetProgress(p float64) { c.ProgressTask().Progress(p) }

// RunningTask is the task running this call (an Async call), or nil.
func (c *Call) RunningTask() *Task { return c.task }
