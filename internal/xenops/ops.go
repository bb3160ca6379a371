package xenops

import (
	"context"
	"log/slog"
	"time"

	"toolstackd/internal/api"
	dm "toolstackd/internal/datamodel"
	"toolstackd/internal/db"
	"toolstackd/internal/schema"
	"toolstackd/internal/xerr"
)

// opCtx is one operation as it runs on a VM's queue.
type opCtx struct {
	m    *Manager
	ctx  context.Context
	task string // the XenAPI task, or ""
	key  string // its key in the VM's current_operations, or ""
	vm   string // VM ref
	uuid string // VM uuid
	op   string
	prog *api.Task // the task to report progress to, or nil

	// Progress: steps done out of total, mapped into [lo, hi].
	lo, hi float64
	total  int
	done   int
}

// window makes the following steps fill [lo, hi] of the task's progress.
func (o *opCtx) window(lo, hi float64, steps int) {
	o.lo, o.hi, o.total, o.done = lo, hi, max(steps, 1), 0
}

// run is one step: the test hook, a cancellation point, the work, and
// progress.
func (o *opCtx) run(name string, fn func(ctx context.Context) error) error {
	if hook := o.m.cfg.OnStep; hook != nil {
		hook(o.uuid, o.op, name)
	}
	if o.ctx.Err() != nil {
		return cancelledErr(o.task)
	}
	start := time.Now()
	err := fn(o.ctx)
	o.m.log.Debug("step", "vm", o.uuid, "op", o.op, "step", name, "took", time.Since(start), "err", err)
	if err != nil {
		if isCancel(err) && o.ctx.Err() != nil {
			return cancelledErr(o.task)
		}
		return err
	}
	o.done++
	o.prog.Progress(o.lo + (o.hi-o.lo)*float64(min(o.done, o.total))/float64(o.total))
	return nil
}

// release drops the operation from the VM's current_operations in the
// transaction that records its outcome, so that nobody sees the final
// state with the operation still marked (and one durable write is saved).
func (o *opCtx) release(tx *db.Tx) error {
	if o.key == "" || o.op == "" {
		return nil
	}
	if _, ok := tx.Get(dm.VM.Class, o.vm); !ok {
		return nil
	}
	return tx.RemoveFromMap(dm.VM.CurrentOperations, o.vm, o.key)
}

// withVMOp runs a VM operation as xapi's with_vm_operation does: check it
// may run, mark it in current_operations, run it on the VM's queue, and
// unmark it, keeping allowed_operations right all along.
func (m *Manager) withVMOp(c *api.Call, ref string, o op, body func(o *opCtx) error) error {
	return m.withVMOpQ(c, ref, o, true, body)
}

// withVMOpQ is withVMOp; queued false runs the body at once instead of on
// the VM's queue, for operations that leave the domain alone (clone,
// copy, snapshot) and that xapi lets run side by side.
func (m *Manager) withVMOpQ(c *api.Call, ref string, o op, queued bool, body func(o *opCtx) error) error {
	key := c.Task
	if key == "" {
		key = db.NewRef() // calls without a task still need a key
	}
	t0 := time.Now()
	var tMark, tRun time.Duration
	var vmUUID string
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(dm.VM.Class, ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, "VM", ref)
		}
		vmUUID = row.UUID()
		v := vmCheckOf(tx, row)
		if err := v.checkOp(o, false); err != nil {
			return err
		}
		if err := tx.AddToMap(dm.VM.CurrentOperations, ref, key, string(o)); err != nil {
			return err
		}
		return refreshVM(tx, ref)
	}); err != nil {
		return err
	}
	tMark = time.Since(t0)
	// Calls made without a task cannot be cancelled, and must not stop
	// half-way because the client went away.
	base := c.Ctx
	if c.Task == "" {
		base = context.WithoutCancel(c.Ctx)
	}
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	if o == dm.VMOperationsHardShutdown || o == dm.VMOperationsHardReboot {
		m.cancelOps(ref, key) // as xapi, hard operations cancel what is in their way
	}
	m.trackOp(ref, key, string(o), cancel)
	defer m.untrackOp(ref, key)
	defer func() {
		t1 := time.Now()
		m.unmarkVMOp(ref, key, o)
		m.log.Debug("operation", "vm", vmUUID, "op", o, "mark", tMark, "run", tRun, "unmark", time.Since(t1), "total", time.Since(t0))
	}()
	oc := &opCtx{m: m, ctx: ctx, task: c.Task, key: key, vm: ref, uuid: vmUUID, op: string(o), prog: c.ProgressTask(), hi: 1, total: 1}
	t2 := time.Now()
	defer func() { tRun = time.Since(t2) }()
	var err error
	if queued {
		j := &job{ctx: ctx, name: "VM." + string(o), run: func(ctx context.Context) error { return body(oc) }}
		m.q.submit(ref, j)
		err = j.wait()
	} else {
		err = m.q.w.do(ctx, func() error { return body(oc) })
	}
	if err != nil && isCancel(err) {
		err = cancelledErr(c.Task)
	}
	return err
}

func (m *Manager) trackOp(ref, key, o string, cancel context.CancelFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ops[ref] == nil {
		m.ops[ref] = map[string]*runningOp{}
	}
	m.ops[ref][key] = &runningOp{op: o, cancel: cancel}
}

func (m *Manager) untrackOp(ref, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ops[ref], key)
	if len(m.ops[ref]) == 0 {
		delete(m.ops, ref)
	}
}

// cancelOps cancels every operation on a VM but one.
func (m *Manager) cancelOps(ref, except string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, r := range m.ops[ref] {
		if k != except {
			m.log.Info("cancelling an operation in the way of a hard one", m.logRef("vm", dm.VM.Class, ref), "op", r.op, m.logRef("task", dm.Task.Class, k))
			r.cancel()
		}
	}
}

// busy reports whether an operation is running or queued on a VM.
func (m *Manager) busy(ref string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ops[ref]) > 0
}

// withDevOp runs a VBD or VIF operation: marked in the device's
// current_operations, run on its VM's queue. A ref that names no device
// is HANDLE_INVALID, so callers need not look the device up first.
func (m *Manager) withDevOp(c *api.Call, cls *schema.Class, ref, o string, body func(o *opCtx, dev *db.Row) error) error {
	key := c.Task
	if key == "" {
		key = db.NewRef()
	}
	curF, vmF := dm.VBD.CurrentOperations, dm.VBD.VM
	if cls == dm.VIF.Class {
		curF, vmF = dm.VIF.CurrentOperations, dm.VIF.VM
	}
	var vmRef, vmUUID string
	if _, err := m.db.Update(func(tx *db.Tx) error {
		row, ok := tx.Get(cls, ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, cls.Name, ref)
		}
		vmRef = row.String(vmF)
		if vm, ok := tx.Get(dm.VM.Class, vmRef); ok {
			vmUUID = vm.UUID()
		}
		d := devCheckOf(tx, row)
		if err := d.checkOp(o); err != nil {
			return err
		}
		if err := tx.AddToMap(curF, ref, key, o); err != nil {
			return err
		}
		return refreshDev(tx, cls, ref)
	}); err != nil {
		return err
	}
	base := c.Ctx
	if c.Task == "" {
		base = context.WithoutCancel(c.Ctx)
	}
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	defer func() {
		// As in withVMOpQ: the outcome is the operation's, a failed
		// unmark is logged.
		if _, err := m.db.Update(func(tx *db.Tx) error {
			if _, ok := tx.Get(cls, ref); !ok {
				return nil
			}
			if err := tx.RemoveFromMap(curF, ref, key); err != nil {
				return err
			}
			return refreshVM(tx, vmRef)
		}); err != nil {
			m.log.Error("cannot unmark a device operation", "class", cls.Name, "ref", ref, "vm", vmUUID, "op", o, m.logRef("task", dm.Task.Class, key), "err", err)
		}
	}()
	oc := &opCtx{m: m, ctx: ctx, task: c.Task, vm: vmRef, uuid: vmUUID, op: cls.Name + "." + o, prog: c.ProgressTask(), hi: 1, total: 1}
	j := &job{ctx: ctx, name: cls.Name + "." + o, run: func(ctx context.Context) error {
		row, ok := m.db.Snapshot().Get(cls, ref)
		if !ok {
			return xerr.New(xerr.HandleInvalid, cls.Name, ref)
		}
		// Re-check now that the VM's queue is ours: the VM may have
		// stopped while this waited.
		d := devCheckOf(m.db.Snapshot(), row)
		d.current = nil
		if err := d.checkOp(o); err != nil {
			return err
		}
		return body(oc, row)
	}}
	queueKey := vmRef
	if queueKey == "" || queueKey == schema.NullRef {
		queueKey = ref
	}
	m.q.submit(queueKey, j)
	err := j.wait()
	if err != nil && isCancel(err) {
		err = cancelledErr(c.Task)
	}
	return err
}

// unmarkVMOp takes an operation's mark off a VM (gone VMs need none).
// logRef names an object in the log by its uuid under key ("vm": the
// journal's VM_UUID), or by its ref under key_ref once it has no record.
func (m *Manager) logRef(key string, cls *schema.Class, ref string) slog.Attr {
	if row, ok := m.db.Snapshot().Get(cls, ref); ok {
		return slog.String(key, row.UUID())
	}
	return slog.String(key+"_ref", ref)
}

// The caller hears the operation's own outcome; a failed unmark can only
// be logged (start-up clears stale marks).
func (m *Manager) unmarkVMOp(ref, key string, o dm.VMOperations) {
	if _, err := m.db.Update(func(tx *db.Tx) error {
		if _, ok := tx.Get(dm.VM.Class, ref); !ok {
			return nil
		}
		if err := tx.RemoveFromMap(dm.VM.CurrentOperations, ref, key); err != nil {
			return err
		}
		return refreshVM(tx, ref)
	}); err != nil {
		m.log.Error("cannot unmark a VM operation", m.logRef("vm", dm.VM.Class, ref), "op", o, m.logRef("task", dm.Task.Class, key), "err", err)
	}
}
