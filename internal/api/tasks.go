package api

import (
	"context"
	"sync"
	"time"

	"toolstackd/internal/api/wire"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

type finishedTask struct {
	ref string
	at  time.Time
}

// taskInfo is what the server remembers of a task created for a session.
type taskInfo struct {
	session string
	pending bool // not yet completed (pending or cancelling)
}

// taskTable tracks running Async calls, finished tasks awaiting
// collection, and which session each task belongs to, so that a session's
// pending tasks can be counted and its tasks destroyed when it ends.
type taskTable struct {
	mu        sync.Mutex
	running   map[string]context.CancelFunc
	finished  []finishedTask // oldest first
	info      map[string]*taskInfo
	bySession map[string]map[string]struct{}
	pending   map[string]int // session -> tasks not completed
}

func newTaskTable() *taskTable {
	return &taskTable{running: map[string]context.CancelFunc{}, info: map[string]*taskInfo{},
		bySession: map[string]map[string]struct{}{}, pending: map[string]int{}}
}

func (t *taskTable) cancelAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cancel := range t.running {
		cancel()
	}
}

// completed marks a task no longer pending. Called with t.mu held.
func (t *taskTable) completed(ref string) {
	ti := t.info[ref]
	if ti == nil || !ti.pending {
		return
	}
	ti.pending = false
	if t.pending[ti.session]--; t.pending[ti.session] <= 0 {
		delete(t.pending, ti.session)
	}
}

// forget drops a task from the table. Called with t.mu held.
func (t *taskTable) forget(ref string) {
	t.completed(ref)
	ti := t.info[ref]
	if ti == nil {
		return
	}
	delete(t.info, ref)
	if set := t.bySession[ti.session]; set != nil {
		delete(set, ref)
		if len(set) == 0 {
			delete(t.bySession, ti.session)
		}
	}
}

// tooMany reports whether a session is at its pending-task cap. Called
// with t.mu held.
func (s *Server) tooMany(session string) bool {
	return s.Cfg.MaxPendingTasksPerSession > 0 && s.tasks.pending[session] >= s.Cfg.MaxPendingTasksPerSession
}

// CreateTask makes a pending task owned by a session. A session may have
// at most Config.MaxPendingTasksPerSession tasks not yet completed; past
// that it gets TOO_MANY_PENDING_TASKS.
func (s *Server) CreateTask(sess *Session, label, description string) (string, error) {
	return s.newTask(sess, label, description, nil)
}

// newTask makes a task; cancel, when given, is what task.cancel calls
// while the task runs.
func (s *Server) newTask(sess *Session, label, description string, cancel context.CancelFunc) (string, error) {
	rec := &dm.TaskRecord{
		NameLabel: label, NameDescription: description,
		AllowedOperations: []dm.TaskAllowedOperations{dm.TaskAllowedOperationsCancel},
		Created:           time.Now().UTC(), Status: dm.TaskStatusTypePending,
		ResidentOn: dm.HostRef(s.Cfg.HostRef), OtherConfig: map[string]string{}, ErrorInfo: []string{},
	}
	ref := db.NewRef()
	// An HTTP request authenticated with basic auth or over the local
	// socket has a session of its own that is not in the table (no ref):
	// its tasks belong to no session, as tasks made inside the server do;
	// so do those of a session this host only borrows from the
	// coordinator (a forwarded request), which is not in its table.
	if sess != nil && (sess.Ref == "" || sess.remote) {
		sess = nil
	}
	if sess != nil {
		rec.Session = dm.SessionRef(sess.Ref)
		// Reserve the task's place first: the count, and the session's
		// list that sessionEndedTasks empties.
		t := s.tasks
		t.mu.Lock()
		switch {
		case s.sessions.get(sess.Ref) != sess:
			t.mu.Unlock()
			return "", xerr.New(xerr.SessionInvalid, sess.Ref)
		case s.tooMany(sess.Ref):
			t.mu.Unlock()
			return "", xerr.New(xerr.TooManyPendingTasks)
		}
		t.info[ref] = &taskInfo{session: sess.Ref, pending: true}
		t.pending[sess.Ref]++
		if t.bySession[sess.Ref] == nil {
			t.bySession[sess.Ref] = map[string]struct{}{}
		}
		t.bySession[sess.Ref][ref] = struct{}{}
		if cancel != nil {
			t.running[ref] = cancel
		}
		t.mu.Unlock()
	} else if cancel != nil {
		s.tasks.mu.Lock()
		s.tasks.running[ref] = cancel
		s.tasks.mu.Unlock()
	}
	_, err := s.DB.Update(func(tx *db.Tx) error {
		_, err := tx.Insert(dm.Task.Class, ref, rec.Row())
		return err
	})
	s.tasks.mu.Lock()
	_, kept := s.tasks.info[ref]
	if err != nil || (sess != nil && !kept) {
		s.tasks.forget(ref)
		delete(s.tasks.running, ref)
	}
	s.tasks.mu.Unlock()
	if err != nil {
		return "", err
	}
	if sess != nil && !kept {
		// The session ended while the task was being made.
		s.dropTasks([]string{ref})
		return "", xerr.New(xerr.SessionInvalid, sess.Ref)
	}
	return ref, nil
}

// sessionEndedTasks destroys the tasks of a session that has ended
// (logout, expiry, eviction, revocation), cancelling those still running.
// The session must already be out of the session table.
func (s *Server) sessionEndedTasks(session string) {
	t := s.tasks
	t.mu.Lock()
	var refs []string
	for ref := range t.bySession[session] {
		refs = append(refs, ref)
		if cancel := t.running[ref]; cancel != nil {
			cancel()
			delete(t.running, ref)
		}
		t.forget(ref)
	}
	delete(t.bySession, session)
	delete(t.pending, session)
	t.mu.Unlock()
	s.dropTasks(refs)
}

// dropTasks deletes task rows that may already be gone.
func (s *Server) dropTasks(refs []string) {
	if len(refs) == 0 {
		return
	}
	_, err := s.DB.Update(func(tx *db.Tx) error {
		for _, ref := range refs {
			if _, ok := tx.Get(dm.Task.Class, ref); ok {
				if err := tx.Delete(dm.Task.Class, ref); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		s.Log.Error("destroying tasks", "tasks", len(refs), "err", err)
	}
}

// FinishTask records a task's outcome: its result as an XML-RPC value
// fragment (as xapi stores it, whatever the transport), or its error.
func (s *Server) FinishTask(ref string, resultType *schema.Type, v any, err error, cancelled bool) {
	s.tasks.mu.Lock()
	delete(s.tasks.running, ref)
	s.tasks.completed(ref)
	s.tasks.finished = append(s.tasks.finished, finishedTask{ref, time.Now()})
	s.tasks.mu.Unlock()
	_, uerr := s.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Task.Class, ref); !ok {
			return nil // destroyed while running
		}
		set := func(f *schema.Field, v any) {
			if e := tx.Set(f, ref, v); e != nil {
				s.Log.Error("task update", s.uuidAttr("task", dm.Task.Class, ref), "field", f.Name, "err", e)
			}
		}
		switch {
		case err == nil:
			set(dm.Task.Result, wire.XMLValueFragment(s.wireResult(resultType, v)))
			set(dm.Task.Progress, 1.0)
			set(dm.Task.Status, string(dm.TaskStatusTypeSuccess))
		case cancelled || xerr.HasCode(err, xerr.TaskCancelled):
			set(dm.Task.ErrorInfo, []string{xerr.TaskCancelled, ref})
			set(dm.Task.Status, string(dm.TaskStatusTypeCancelled))
		default:
			xe := xerr.From(err)
			set(dm.Task.ErrorInfo, append([]string{xe.Code}, xe.Params...))
			set(dm.Task.Status, string(dm.TaskStatusTypeFailure))
		}
		set(dm.Task.AllowedOperations, []string{})
		set(dm.Task.Finished, time.Now().UTC())
		return nil
	})
	if uerr != nil {
		s.Log.Error("finishing task", s.uuidAttr("task", dm.Task.Class, ref), "err", uerr)
	}
}

func (s *Server) registerTasks() {
	Register(s, s.createTask)
	Register(s, s.cancelTask)
	Register(s, s.destroyTask)
	Register(s, func(c *Call, a dm.TaskSetStatusArgs) (dm.Void, error) {
		return s.setTaskField(c, a.Self, dm.Task.Status, string(a.Value))
	})
	Register(s, func(c *Call, a dm.TaskSetProgressArgs) (dm.Void, error) {
		return s.setTaskField(c, a.Self, dm.Task.Progress, a.Value)
	})
	Register(s, func(c *Call, a dm.TaskSetResultArgs) (dm.Void, error) {
		return s.setTaskField(c, a.Self, dm.Task.Result, a.Value)
	})
	Register(s, func(c *Call, a dm.TaskSetErrorInfoArgs) (dm.Void, error) {
		return s.setTaskField(c, a.Self, dm.Task.ErrorInfo, a.Value)
	})
	Register(s, func(c *Call, a dm.TaskSetOtherConfigArgs) (dm.Void, error) {
		return s.setTaskField(c, a.Self, dm.Task.OtherConfig, a.Value)
	})
	Register(s, func(c *Call, a dm.TaskAddToOtherConfigArgs) (dm.Void, error) {
		return s.changeTask(c, a.Self, func(tx *db.Tx, ref string) error {
			return tx.AddToMap(dm.Task.OtherConfig, ref, a.Key, a.Value)
		})
	})
	Register(s, func(c *Call, a dm.TaskRemoveFromOtherConfigArgs) (dm.Void, error) {
		return s.changeTask(c, a.Self, func(tx *db.Tx, ref string) error {
			return tx.RemoveFromMap(dm.Task.OtherConfig, ref, a.Key)
		})
	})
}

// taskRow returns the task a task message names, once the caller has
// been found allowed to change it.
func (s *Server) taskRow(c *Call, ref dm.TaskRef) (*db.Row, error) {
	row, err := c.Lookup(dm.Task.Class, string(ref))
	if err != nil {
		return nil, err
	}
	if err := s.mayActOnTask(c.Session, row.String(dm.Task.Session)); err != nil {
		return nil, err
	}
	return row, nil
}

func (s *Server) cancelTask(c *Call, a dm.TaskCancelArgs) (dm.Void, error) {
	row, err := s.taskRow(c, a.Task)
	if err != nil {
		return dm.Void{}, err
	}
	if row.String(dm.Task.Status) != string(dm.TaskStatusTypePending) {
		return dm.Void{}, nil // finished, or already being cancelled
	}
	ops, _ := row.Get(dm.Task.AllowedOperations).([]string)
	if !containsString(ops, string(dm.TaskAllowedOperationsCancel)) {
		return dm.Void{}, xerr.New(xerr.OperationNotAllowed, "task cannot be cancelled")
	}
	if err := c.Update(func(tx *db.Tx) error {
		return tx.Set(dm.Task.Status, row.Ref, string(dm.TaskStatusTypeCancelling))
	}); err != nil {
		return dm.Void{}, err
	}
	s.tasks.mu.Lock()
	cancel := s.tasks.running[row.Ref]
	s.tasks.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return dm.Void{}, nil
}

func (s *Server) destroyTask(c *Call, a dm.TaskDestroyArgs) (dm.Void, error) {
	row, err := s.taskRow(c, a.Self)
	if err != nil {
		return dm.Void{}, err
	}
	s.tasks.mu.Lock()
	if cancel := s.tasks.running[row.Ref]; cancel != nil {
		cancel()
		delete(s.tasks.running, row.Ref)
	}
	s.tasks.forget(row.Ref)
	s.tasks.mu.Unlock()
	return dm.Void{}, c.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Task.Class, row.Ref); !ok {
			return nil // gone meanwhile
		}
		return tx.Delete(dm.Task.Class, row.Ref)
	})
}

func (s *Server) createTask(c *Call, a dm.TaskCreateArgs) (dm.TaskRef, error) {
	ref, err := s.CreateTask(c.Session, a.Label, a.Description)
	return dm.TaskRef(ref), err
}

// changeTask applies a change to a task the caller may change.
func (s *Server) changeTask(c *Call, ref dm.TaskRef, change func(tx *db.Tx, ref string) error) (dm.Void, error) {
	row, err := s.taskRow(c, ref)
	if err != nil {
		return dm.Void{}, err
	}
	return dm.Void{}, c.Update(func(tx *db.Tx) error { return change(tx, row.Ref) })
}

// setTaskField serves task.set_X. Setting the status keeps the pending
// count in step and stamps the finish time of a completed status.
func (s *Server) setTaskField(c *Call, ref dm.TaskRef, f *schema.Field, v any) (dm.Void, error) {
	if f == dm.Task.Status {
		row, err := s.taskRow(c, ref)
		if err != nil {
			return dm.Void{}, err
		}
		if err := s.taskStatusChange(row.Ref, v.(string)); err != nil {
			return dm.Void{}, err
		}
	}
	return s.changeTask(c, ref, func(tx *db.Tx, ref string) error {
		if f == dm.Task.Status && v != string(dm.TaskStatusTypePending) {
			if err := tx.Set(dm.Task.Finished, ref, time.Now().UTC()); err != nil {
				return err
			}
		}
		return tx.Set(f, ref, v)
	})
}

// taskStatusChange keeps the pending count in step when a client sets a
// task's status: a completed status (success, failure, cancelled) frees
// the task's place and queues it for collection; going back to pending or
// cancelling takes a place again, within the cap. A task whose Async call
// still runs keeps its place until the call ends.
func (s *Server) taskStatusChange(ref, status string) error {
	t := s.tasks
	t.mu.Lock()
	defer t.mu.Unlock()
	switch dm.TaskStatusType(status) {
	case dm.TaskStatusTypeSuccess, dm.TaskStatusTypeFailure, dm.TaskStatusTypeCancelled:
		if t.running[ref] == nil {
			t.completed(ref)
			t.finished = append(t.finished, finishedTask{ref, time.Now()})
		}
	default:
		if ti := t.info[ref]; ti != nil && !ti.pending {
			if s.tooMany(ti.session) {
				return xerr.New(xerr.TooManyPendingTasks)
			}
			ti.pending = true
			t.pending[ti.session]++
		}
	}
	return nil
}

// collectTasks destroys finished tasks past their time or over the bound.
func (s *Server) collectTasks(now time.Time) {
	s.tasks.mu.Lock()
	var doomed []string
	cut := now.Add(-s.Cfg.FinishedTaskTTL)
	for len(s.tasks.finished) > 0 && (s.tasks.finished[0].at.Before(cut) || len(s.tasks.finished) > s.Cfg.MaxFinishedTasks) {
		doomed = append(doomed, s.tasks.finished[0].ref)
		s.tasks.forget(s.tasks.finished[0].ref)
		s.tasks.finished = s.tasks.finished[1:]
	}
	s.tasks.mu.Unlock()
	if len(doomed) == 0 {
		return
	}
	// A background sweep with nobody to report to: log a failure.
	if _, err := s.DB.Update(func(tx *db.Tx) error {
		for _, ref := range doomed {
			if _, ok := tx.Get(dm.Task.Class, ref); ok {
				if err := tx.Delete(dm.Task.Class, ref); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		s.Log.Error("cannot delete expired tasks", "tasks", len(doomed), "err", err)
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
