package api

import (
	"context"
	"strings"
	"sync"
	"time"

	dm "toolstackd/internal/api/datamodel"
	"toolstackd/internal/api/wire"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// TaskCancelled is xapi's error for a cancelled task: [task ref].
const TaskCancelled = "TASK_CANCELLED"

type finishedTask struct {
	ref string
	at  time.Time
}

type taskTable struct {
	mu       sync.Mutex
	running  map[string]context.CancelFunc
	finished []finishedTask // oldest first
}

func newTaskTable() *taskTable { return &taskTable{running: map[string]context.CancelFunc{}} }

func (t *taskTable) cancelAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cancel := range t.running {
		cancel()
	}
}

// CreateTask makes a pending task owned by a session.
func (s *Server) CreateTask(sess *Session, label, description string) (string, error) {
	rec := &dm.TaskRecord{
		NameLabel: label, NameDescription: description,
		AllowedOperations: []dm.TaskAllowedOperations{dm.TaskAllowedOperationsCancel},
		Created:           time.Now().UTC(), Status: dm.TaskStatusTypePending,
		ResidentOn: dm.HostRef(s.Cfg.HostRef), OtherConfig: map[string]string{}, ErrorInfo: []string{},
	}
	if sess != nil {
		rec.Session = dm.SessionRef(sess.Ref)
	}
	var ref string
	_, err := s.DB.Update(func(tx *db.Tx) (err error) {
		ref, err = tx.Insert(dm.Task.Class, "", rec.Row())
		return err
	})
	return ref, err
}

// startTask runs an Async call: it returns the task at once and runs the
// handler in the background with a context that task.cancel cancels.
func (s *Server) startTask(c *Call, h Handler) (string, error) {
	ref, err := s.CreateTask(c.Session, "Async."+c.Msg.Wire, "")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.tasks.mu.Lock()
	s.tasks.running[ref] = cancel
	s.tasks.mu.Unlock()
	tc := *c
	tc.Ctx, tc.Task = ctx, ref
	go func() {
		defer cancel()
		v, err := s.run(&tc, h)
		s.FinishTask(ref, c.Msg.Result, v, err, ctx.Err() != nil)
	}()
	return ref, nil
}

// FinishTask records a task's outcome: its result as an XML-RPC value
// fragment (as xapi stores it, whatever the transport), or its error.
func (s *Server) FinishTask(ref string, resultType *schema.Type, v any, err error, cancelled bool) {
	s.tasks.mu.Lock()
	delete(s.tasks.running, ref)
	s.tasks.finished = append(s.tasks.finished, finishedTask{ref, time.Now()})
	s.tasks.mu.Unlock()
	_, uerr := s.DB.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.Task.Class, ref); !ok {
			return nil // destroyed while running
		}
		set := func(f *schema.Field, v any) {
			if e := tx.Set(f, ref, v); e != nil {
				s.Log.Error("task update", "task", ref, "field", f.Name, "err", e)
			}
		}
		switch {
		case err == nil:
			set(dm.Task.Result, wire.XMLValueFragment(s.wireResult(resultType, v)))
			set(dm.Task.Progress, 1.0)
			set(dm.Task.Status, string(dm.TaskStatusTypeSuccess))
		case cancelled || xerr.HasCode(err, TaskCancelled):
			set(dm.Task.ErrorInfo, []string{TaskCancelled, ref})
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
		s.Log.Error("finishing task", "task", ref, "err", uerr)
	}
}

// SetProgress records a running task's progress (0 to 1).
func (c *Call) SetProgress(p float64) {
	if c.Task == "" {
		return
	}
	c.Server.DB.Update(func(tx *db.Tx) error { return tx.Set(dm.Task.Progress, c.Task, p) })
}

func (s *Server) cancelTask(c *Call) (any, error) {
	row, err := c.Row(0, dm.Task.Class)
	if err != nil {
		return nil, err
	}
	if row.String(dm.Task.Status) != string(dm.TaskStatusTypePending) {
		return nil, nil // finished, or already being cancelled
	}
	ops, _ := row.Get(dm.Task.AllowedOperations).([]string)
	if !containsString(ops, string(dm.TaskAllowedOperationsCancel)) {
		return nil, xerr.New("OPERATION_NOT_ALLOWED", "task cannot be cancelled")
	}
	if err := c.Update(func(tx *db.Tx) error {
		return tx.Set(dm.Task.Status, row.Ref, string(dm.TaskStatusTypeCancelling))
	}); err != nil {
		return nil, err
	}
	s.tasks.mu.Lock()
	cancel := s.tasks.running[row.Ref]
	s.tasks.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return nil, nil
}

func (s *Server) destroyTask(c *Call) (any, error) {
	row, err := c.Row(0, dm.Task.Class)
	if err != nil {
		return nil, err
	}
	s.tasks.mu.Lock()
	if cancel := s.tasks.running[row.Ref]; cancel != nil {
		cancel()
		delete(s.tasks.running, row.Ref)
	}
	s.tasks.mu.Unlock()
	return nil, c.Update(func(tx *db.Tx) error { return tx.Delete(dm.Task.Class, row.Ref) })
}

func (s *Server) createTask(c *Call) (any, error) {
	return s.CreateTask(c.Session, c.String(0), c.String(1))
}

// taskSetter serves task.set_X, add_to_/remove_from_other_config: explicit
// messages in the datamodel that write one field.
func (s *Server) taskSetter(c *Call) (any, error) {
	row, err := c.Row(0, dm.Task.Class)
	if err != nil {
		return nil, err
	}
	name := c.Msg.Name
	return nil, c.Update(func(tx *db.Tx) error {
		switch {
		case name == "add_to_other_config":
			return tx.AddToMap(dm.Task.OtherConfig, row.Ref, c.String(1), c.Args[2])
		case name == "remove_from_other_config":
			return tx.RemoveFromMap(dm.Task.OtherConfig, row.Ref, c.String(1))
		default:
			f := dm.Task.Class.Field(strings.TrimPrefix(name, "set_"))
			if f == nil {
				return xerr.New(xerr.NotImplemented, c.Msg.Wire)
			}
			if f == dm.Task.Status && c.Args[1] != string(dm.TaskStatusTypePending) {
				if err := tx.Set(dm.Task.Finished, row.Ref, time.Now().UTC()); err != nil {
					return err
				}
			}
			return tx.Set(f, row.Ref, c.Args[1])
		}
	})
}

// collectTasks destroys finished tasks past their time or over the bound.
func (s *Server) collectTasks(now time.Time) {
	s.tasks.mu.Lock()
	var doomed []string
	cut := now.Add(-s.Cfg.FinishedTaskTTL)
	for len(s.tasks.finished) > 0 && (s.tasks.finished[0].at.Before(cut) || len(s.tasks.finished) > s.Cfg.MaxFinishedTasks) {
		doomed = append(doomed, s.tasks.finished[0].ref)
		s.tasks.finished = s.tasks.finished[1:]
	}
	s.tasks.mu.Unlock()
	if len(doomed) == 0 {
		return
	}
	s.DB.Update(func(tx *db.Tx) error {
		for _, ref := range doomed {
			if _, ok := tx.Get(dm.Task.Class, ref); ok {
				tx.Delete(dm.Task.Class, ref)
			}
		}
		return nil
	})
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
