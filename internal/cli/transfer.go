package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"toolstackd/internal/cli/proto"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// loadFile asks the client for a file named on its command line and
// returns its contents. A client that cannot read it answers Failed; the
// command then ends with "Failed to read <what>".
func (c *Ctx) loadFile(name, what string, limit int64) ([]byte, error) {
	if err := c.conn.Send(proto.Load(name)); err != nil {
		return nil, err
	}
	m, err := c.recv()
	if err != nil {
		return nil, err
	}
	switch {
	case m.Is(proto.KindResponse, proto.TagOK):
		return c.conn.ReadBlob(limit)
	case m.Is(proto.KindResponse, proto.TagFailed):
		c.conn.Send(proto.PrintStderr("Failed to read " + what + "\n"))
		return nil, &exitError{1}
	}
	return nil, failf("Thin CLI protocol error: expected a response to Load, got %s", m)
}

// transfer has the client move a file over HTTP: upload it with PUT
// (put) or download it with GET, to or from an endpoint of this server.
// It runs as a task, which the endpoint finds through the task_id query
// parameter, marks taken (progress >= 0) and completes; the result is
// the task's result. An endpoint that ignores task_id is taken to have
// succeeded when the client reports success.
func (c *Ctx) transfer(put bool, file, path string, q url.Values, label string) (string, error) {
	method := http.MethodGet
	if put {
		method = http.MethodPut
	}
	if !c.s.hasRoute(method, path) {
		return "", xerr.New(xerr.NotImplemented, method+" "+path)
	}
	sess := c.s.api.SessionFor(c.session)
	if sess == nil {
		return "", xerr.New(xerr.SessionInvalid, c.session)
	}
	task, err := c.s.api.CreateTask(sess, label, "")
	if err != nil {
		return "", err
	}
	defer func() {
		// The transfer's outcome is already decided; a task left behind
		// is collected with the finished ones.
		if _, _, err := c.s.api.Invoke(context.WithoutCancel(c.ctx), c.session, "task.destroy", task); err != nil {
			c.s.log.Warn("cli: task.destroy", "task_ref", task, "err", err)
		}
	}()
	// -1: no handler has the task yet.
	if _, err := c.call("task.set_progress", task, -1.0); err != nil {
		return "", err
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("session_id", c.session)
	q.Set("task_id", task)
	u := path + "?" + q.Encode()
	if put {
		err = c.conn.Send(proto.HTTPPut(file, u))
	} else {
		err = c.conn.Send(proto.HTTPGet(file, u))
	}
	if err != nil {
		return "", err
	}
	resp, err := c.recv()
	if err != nil {
		return "", err
	}
	ok := resp.Is(proto.KindResponse, proto.TagOK)
	if !ok && !resp.Is(proto.KindResponse, proto.TagFailed) {
		return "", failf("Thin CLI protocol error: expected a response to the transfer, got %s", resp)
	}
	row, err := c.waitTask(task, ok)
	if err != nil {
		return "", err
	}
	switch row.String(dm.Task.Status) {
	case string(dm.TaskStatusTypeSuccess):
		if !ok {
			return "", xerr.New(xerr.ClientError)
		}
		return row.String(dm.Task.Result), nil
	case string(dm.TaskStatusTypeCancelled), string(dm.TaskStatusTypeCancelling):
		return "", xerr.New(xerr.TaskCancelled, task)
	}
	info, _ := row.Get(dm.Task.ErrorInfo).([]string)
	if len(info) == 0 {
		if !ok {
			return "", xerr.New(xerr.ClientError)
		}
		return "", xerr.New(xerr.InternalError, label+" failed without an error")
	}
	return "", xerr.New(info[0], info[1:]...)
}

// waitTask waits for a transfer's task to finish once the client has
// answered. A task no handler took (progress still below 0) will never
// finish by itself: it is settled here from the client's answer, after
// a grace second in which a late handler may still take it.
func (c *Ctx) waitTask(task string, clientOK bool) (*db.Row, error) {
	grace := time.Now().Add(time.Second)
	if clientOK {
		grace = time.Now()
	}
	for {
		snap := c.s.api.DB.Snapshot()
		row, found := snap.Get(dm.Task.Class, task)
		if !found {
			return nil, xerr.New(xerr.HandleInvalid, "task", task)
		}
		if row.String(dm.Task.Status) != string(dm.TaskStatusTypePending) {
			return row, nil
		}
		progress, _ := row.Get(dm.Task.Progress).(float64)
		if progress < 0 && !time.Now().Before(grace) {
			var failed error
			if !clientOK {
				failed = xerr.New(xerr.ClientError)
			}
			c.s.api.FinishTask(task, schema.Void, nil, failed, false)
			row, found = c.s.api.DB.Snapshot().Get(dm.Task.Class, task)
			if !found {
				return nil, xerr.New(xerr.HandleInvalid, "task", task)
			}
			return row, nil
		}
		wait := time.NewTimer(100 * time.Millisecond)
		select {
		case <-snap.Done():
		case <-wait.C:
		case <-c.ctx.Done():
			wait.Stop()
			return nil, c.ctx.Err()
		}
		wait.Stop()
	}
}

// recorder is a ResponseWriter that keeps the reply of a request made
// in-process.
type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header {
	if r.h == nil {
		r.h = http.Header{}
	}
	return r.h
}

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	if r.body.Len() < 64<<10 {
		r.body.Write(p[:min(len(p), 64<<10-r.body.Len())])
	}
	return len(p), nil
}

// serveLocal sends a request to one of this server's HTTP endpoints
// in-process, as the command's session, and returns the status and the
// start of the body.
func (c *Ctx) serveLocal(method, path string, q url.Values, body io.Reader) (int, string, error) {
	if !c.s.hasRoute(method, path) {
		return 0, "", xerr.New(xerr.NotImplemented, method+" "+path)
	}
	if q == nil {
		q = url.Values{}
	}
	q.Set("session_id", c.session)
	req, err := http.NewRequestWithContext(c.ctx, method, path+"?"+q.Encode(), body)
	if err != nil {
		return 0, "", err
	}
	req.RemoteAddr = "cli"
	var rec recorder
	c.s.router.ServeHTTP(&rec, req)
	if rec.code == 0 {
		rec.code = http.StatusOK
	}
	return rec.code, strings.TrimSpace(rec.body.String()), nil
}
